//! The names of a lock's Redis keys (laid out in the module documentation's table), the limits
//! on keys and prefixes, and the Redis Cluster hash slot they share.

use redis::{Script, ScriptInvocation};

use super::RedisBackend;
use crate::{LockError, Owner};

/// The longest rendered key a Redis lock takes, in bytes (16 KiB). Each call names the key three
/// times (the lock, its counter and its queue) and the scripts build two more names from it, so
/// a call carries about five times the key; a longer key fails at once with
/// [`LockError::InvalidKey`] rather than costing the client and the server that much per call.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
/// use dlock::{backend::REDIS_MAX_KEY_BYTES, LockError, LockOptions, Locker};
///
/// let locker = Locker::connect("redis://127.0.0.1:6379").await?;
/// let too_long = "k".repeat(REDIS_MAX_KEY_BYTES + 1);
/// let refused = locker.lock(too_long, LockOptions::new()).await;
/// assert!(matches!(refused, Err(LockError::InvalidKey { .. })));
/// # Ok(()) }
/// ```
pub const MAX_KEY_BYTES: usize = 16 * 1024;

/// The suffixes that name a lock's other keys after its own. The scripts name the waiter keys
/// (`:w:<owner>`), the cancel markers (`:x:<owner>`) and the per-key channel an older dlock's
/// waiters listen on (`:ch`) themselves (see
/// common.lua).
const COUNTER_SUFFIX: &str = ":fences";
const QUEUE_SUFFIX: &str = ":q";
const CHANNEL_SUFFIX: &str = ":ch";

impl RedisBackend {
    /// The Redis key that holds the lock on the rendered key `key`: the owner's token, with the
    /// lease's ttl as its PTTL.
    ///
    /// ```
    /// let backend = dlock::backend::RedisBackend::builder("redis://127.0.0.1")?.build()?;
    /// assert_eq!(backend.lock_key("acct:42"), "dlock:{acct:42}");
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn lock_key(&self, key: &str) -> String {
        self.inner.layout.name(key, "")
    }

    /// The Redis key that counts the fences of `key`: an integer, the last fence handed out. It
    /// expires an hour after the last grant (fences go on rising from the server's clock).
    ///
    /// ```
    /// let backend = dlock::backend::RedisBackend::builder("redis://127.0.0.1")?.build()?;
    /// assert_eq!(backend.fence_key("acct:42"), "dlock:{acct:42}:fences");
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn fence_key(&self, key: &str) -> String {
        self.inner.layout.name(key, COUNTER_SUFFIX)
    }

    /// The Redis key that queues the waiters of `key`, in arrival order.
    ///
    /// ```
    /// let backend = dlock::backend::RedisBackend::builder("redis://127.0.0.1")?.build()?;
    /// assert_eq!(backend.queue_key("acct:42"), "dlock:{acct:42}:q");
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn queue_key(&self, key: &str) -> String {
        self.inner.layout.name(key, QUEUE_SUFFIX)
    }
}

/// How one backend names the Redis keys of its locks: `P{K}` and suffixes, for the prefix `P`.
pub(super) struct KeyLayout {
    prefix: String,
    /// Whether the prefix holds a `{`: the hash tag of every name then starts in the prefix.
    prefix_has_tag_open: bool,
}

impl KeyLayout {
    /// The layout under `prefix`. A prefix holding an empty hash tag (`{}`) is refused: Redis
    /// Cluster would hash each name of a lock to a slot of its own.
    pub(super) fn new(prefix: String) -> Result<Self, LockError> {
        if let Some(open) = prefix.find('{') {
            if prefix[open + 1..].starts_with('}') {
                return Err(LockError::InvalidOptions {
                    reason: format!(
                        "key prefix `{prefix}` holds an empty hash tag `{{}}`, with which Redis \
                         Cluster would hash each name of a lock to a slot of its own"
                    ),
                });
            }
        }
        Ok(KeyLayout {
            prefix_has_tag_open: prefix.contains('{'),
            prefix,
        })
    }

    pub(super) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `P{key}` followed by `suffix`, the name of one of `key`'s Redis keys. Built by hand, in one
    /// allocation of the right size: every call of a script names its keys anew.
    ///
    /// A key that is empty or starts with `}` would make an empty hash tag, which Redis Cluster
    /// ignores (it hashes the whole name, so the lock's names would fall in different slots):
    /// such a key is named `P}{=key}` instead, whose hash tag is `=`. No other key's names begin
    /// with `P}`, so two locks still never share a name.
    fn name(&self, key: &str, suffix: &str) -> String {
        let prefix = &self.prefix;
        let empty_tag = (key.is_empty() || key.starts_with('}')) && !self.prefix_has_tag_open;
        let mut name = String::with_capacity(prefix.len() + key.len() + 4 + suffix.len());
        name.push_str(prefix);
        name.push_str(if empty_tag { "}{=" } else { "{" });
        name.push_str(key);
        name.push('}');
        name.push_str(suffix);
        name
    }

    /// The rendered key whose lock is named `name`, where `name` names a lock of this layout
    /// (the inverse of [`name`](Self::name) with no suffix); `None` for any other name. Only a
    /// lock's name ends in `}`: the names of its other keys end in their suffix.
    pub(super) fn key_of<'n>(&self, name: &'n str) -> Option<&'n str> {
        let rest = name.strip_prefix(self.prefix.as_str())?.strip_suffix('}')?;
        if !self.prefix_has_tag_open {
            if let Some(key) = rest.strip_prefix("}{=") {
                return Some(key);
            }
        }
        rest.strip_prefix('{')
    }

    /// A `SCAN … MATCH` pattern that matches the names of every lock of this layout whose key
    /// starts with `key_prefix` (and may match other names, which [`key_of`](Self::key_of) and
    /// the caller's check of the key turn away).
    pub(super) fn lock_pattern(&self, key_prefix: &str) -> String {
        let mut pattern = glob_escaped(&self.prefix);
        if key_prefix.is_empty() || (key_prefix.starts_with('}') && !self.prefix_has_tag_open) {
            // Such keys may be named `P}{=K}`, without the `{` a pattern would start them with.
            pattern.push_str("*}");
        } else {
            pattern.push('{');
            pattern.push_str(&glob_escaped(key_prefix));
            pattern.push_str("*}");
        }
        pattern
    }

    /// The names the scripts need for `owner`'s calls on `key`.
    pub(super) fn lock_keys(&self, key: &str, owner: Owner) -> LockKeys {
        LockKeys {
            lock: self.name(key, ""),
            counter: self.name(key, COUNTER_SUFFIX),
            queue: self.name(key, QUEUE_SUFFIX),
            owner: owner.hex(),
        }
    }
}

/// The Redis names one call of the scripts needs, for one owner. The per-key channel (an older
/// dlock's; here it only names the key among a backend's waiters) is named on demand.
pub(super) struct LockKeys {
    lock: String,
    counter: String,
    queue: String,
    owner: [u8; 32],
}

impl LockKeys {
    pub(super) fn owner(&self) -> &str {
        std::str::from_utf8(&self.owner).expect("hex digits are ASCII")
    }

    /// A call of `script`, the acquire or the release script, for these names: its `KEYS`, and
    /// the owner as its first `ARGV` (see common.lua).
    pub(super) fn call<'a>(&self, script: &'a Script) -> ScriptInvocation<'a> {
        let mut call = script.key(&[&self.lock, &self.counter, &self.queue]);
        call.arg(self.owner());
        call
    }

    /// This owner's acquisition of this lock, among a backend's: its lock key and owner.
    pub(super) fn acquisition(&self) -> (String, [u8; 32]) {
        (self.lock.clone(), self.owner)
    }

    pub(super) fn channel(&self) -> String {
        format!("{}{CHANNEL_SUFFIX}", self.lock)
    }
}

/// `text` with the characters a glob pattern gives a meaning (`*?[]\\`) escaped, to match itself.
fn glob_escaped(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// Refuses a key longer than [`MAX_KEY_BYTES`], whole: never cut, since two keys cut alike would
/// be one lock.
pub(super) fn check_key(key: &str) -> Result<(), LockError> {
    if key.len() > MAX_KEY_BYTES {
        return Err(LockError::InvalidKey {
            // The reason says why; the key itself may be megabytes.
            key: format!(
                "{}…",
                &key[..(0..=64)
                    .rev()
                    .find(|&i| key.is_char_boundary(i))
                    .unwrap_or(0)]
            ),
            reason: format!(
                "{} bytes is longer than the {MAX_KEY_BYTES} a Redis lock key may be",
                key.len()
            ),
        });
    }
    Ok(())
}

/// The cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag, or of the whole key.
#[cfg(feature = "redis-cluster")]
pub(super) fn cluster_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            key[open + 1..]
                .iter()
                .position(|&b| b == b'}')
                .map(|len| &key[open + 1..open + 1 + len])
        })
        .filter(|tag| !tag.is_empty())
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in tagged {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_one_lock_share_the_hash_tag() {
        let backend = RedisBackend::builder("redis://127.0.0.1")
            .unwrap()
            .build()
            .unwrap();
        let keys = backend.inner.layout.lock_keys("acct:42", Owner::random());
        for name in [&keys.lock, &keys.counter, &keys.queue, &keys.channel()] {
            assert!(name.starts_with("dlock:{acct:42}"), "{name}");
        }
    }

    #[test]
    fn lock_names_give_their_key_back() {
        for prefix in ["dlock:", "a}", "x{", "{app}:", "*[?"] {
            let layout = KeyLayout::new(prefix.to_owned()).unwrap();
            for key in ["", "}", "}abc", "{", "{}", "a}b", "acct:42", "}{=x"] {
                let keys = layout.lock_keys(key, Owner::random());
                assert_eq!(layout.key_of(&keys.lock), Some(key), "{prefix:?} {key:?}");
                for other in [&keys.counter, &keys.queue] {
                    assert_eq!(layout.key_of(other), None, "{prefix:?} {other}");
                }
            }
        }
    }

    #[cfg(feature = "redis-cluster")]
    #[test]
    fn every_key_keeps_its_names_in_one_slot() {
        for prefix in ["dlock:", "a}", "x{", "{app}:"] {
            let backend = RedisBackend::builder("redis://127.0.0.1")
                .unwrap()
                .key_prefix(prefix)
                .build()
                .unwrap();
            for key in ["", "}", "}abc", "{", "{}", "a}b", "acct:42"] {
                let keys = backend.inner.layout.lock_keys(key, Owner::random());
                let slot = cluster_slot(keys.lock.as_bytes());
                for name in [&keys.counter, &keys.queue, &keys.channel()] {
                    assert_eq!(
                        cluster_slot(name.as_bytes()),
                        slot,
                        "{prefix:?} {key:?}: {name}"
                    );
                }
            }
        }
        assert!(RedisBackend::builder("redis://127.0.0.1")
            .unwrap()
            .key_prefix("locks{}:")
            .build()
            .is_err());
    }

    #[cfg(feature = "redis-cluster")]
    #[test]
    fn slots_follow_the_hash_tag() {
        // Reference values from CLUSTER KEYSLOT.
        assert_eq!(cluster_slot(b"foo"), 12182);
        assert_eq!(
            cluster_slot(b"{user1000}.following"),
            cluster_slot(b"user1000")
        );
        assert_eq!(
            cluster_slot(b"dlock:{acct:42}:fence"),
            cluster_slot(b"acct:42")
        );
    }
}
