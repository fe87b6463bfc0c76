//! The Lua scripts, how they are sent, and what their replies say.
//!
//! Each script runs its uncontended path before it defines the functions the other paths share
//! (common.lua is spliced in after it), and takes only the names it needs: Redis spends about as
//! long on a script's overhead as on a plain `SET`, so every command and argument saved shows.

use std::sync::OnceLock;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisResult, ServerErrorKind, Value};

use super::conn::Conn;

/// How a run of the acquire script treats a busy lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// A first try, in no queue: answer busy.
    FirstTry,
    /// Queue up (or stay queued), refreshing the waiter's liveness.
    Queue,
    /// A waiter's last try: leave the queue.
    Leave,
}

/// What one run of the acquire script said.
#[derive(Debug)]
pub(super) enum Attempt {
    Granted(u64),
    /// Granted on the primary, but acknowledged by fewer replicas than `min_replicas`: it does
    /// not count.
    Unreplicated {
        acknowledged: u64,
    },
    /// Busy; `pttl` is the holder's remaining ttl where it has one, `first` whether this owner
    /// heads the queue.
    Busy {
        pttl: Option<Duration>,
        first: bool,
    },
}

/// What one run of the release script said.
#[derive(Debug)]
pub(super) struct Released {
    /// Whether the owner held the lock.
    pub(super) held: bool,
    /// The owner the lock was handed to, for its claim window.
    pub(super) handed_to: Option<String>,
}

pub(super) fn parse_release(reply: Value) -> Result<Released, redis::RedisError> {
    let held = |held: i64| match held {
        0 | 1 => Ok(held == 1),
        _ => Err(unexpected(&reply)),
    };
    match &reply {
        // Nobody was handed the lock: the common case, a bare integer.
        Value::Int(n) => Ok(Released {
            held: held(*n)?,
            handed_to: None,
        }),
        Value::Array(items) => {
            // {held, head, the hand-off's fence}
            let [Value::Int(n), Value::BulkString(head), Value::Int(_)] = items.as_slice() else {
                return Err(unexpected(&reply));
            };
            let head = std::str::from_utf8(head).map_err(|_| unexpected(&reply))?;
            Ok(Released {
                held: held(*n)?,
                handed_to: Some(head.to_owned()),
            })
        }
        _ => Err(unexpected(&reply)),
    }
}

pub(super) fn parse_attempt(reply: Value) -> Result<Attempt, redis::RedisError> {
    match &reply {
        // Granted: the fence, a bare integer.
        Value::Int(fence) => u64::try_from(*fence)
            .map(Attempt::Granted)
            .map_err(|_| unexpected(&reply)),
        Value::Array(items) => {
            let [Value::Int(pttl), Value::Int(first)] = items.as_slice() else {
                return Err(unexpected(&reply));
            };
            Ok(Attempt::Busy {
                // Negative where the caller does not head the queue (only the head is told), the
                // lock has no ttl (-1), or it is gone (-2).
                pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
                first: *first == 1,
            })
        }
        _ => Err(unexpected(&reply)),
    }
}

pub(super) fn unexpected(value: &Value) -> redis::RedisError {
    redis::RedisError::from((
        ErrorKind::UnexpectedReturnType,
        "unexpected reply from a dlock script",
        format!("{value:?}"),
    ))
}

/// A Lua script, sent by its SHA1 where the server knows it.
pub(super) struct Lua {
    /// The script's file; `--!common` on a line of its own marks where common.lua goes.
    source: &'static str,
    /// The code as sent, and its SHA1.
    code: OnceLock<(String, String)>,
}

/// One `ARGV` of a script call.
#[derive(Clone, Copy)]
pub(super) enum Arg<'a> {
    Text(&'a str),
    Number(u64),
}

impl Lua {
    const fn new(source: &'static str) -> Self {
        Lua {
            source,
            code: OnceLock::new(),
        }
    }

    fn code(&self) -> &(String, String) {
        self.code.get_or_init(|| {
            let code = self
                .source
                .replacen("--!common\n", include_str!("common.lua"), 1);
            let hash = redis::Script::new(&code).get_hash().to_owned();
            (code, hash)
        })
    }

    /// `EVALSHA` (or, with `by_hash` false, `EVAL`) of this script, with `KEYS` `keys` and `ARGV`
    /// `args`. Sized up front, so that building it allocates twice rather than growing its
    /// buffers argument by argument.
    pub(super) fn cmd(&self, by_hash: bool, keys: &[&str], args: &[Arg<'_>]) -> Cmd {
        let (code, hash) = self.code();
        let (name, script) = if by_hash {
            ("EVALSHA", hash.as_str())
        } else {
            ("EVAL", code.as_str())
        };
        // u64::MAX has 20 digits; the key count, far fewer.
        let data = name.len()
            + script.len()
            + 20
            + keys.iter().map(|key| key.len()).sum::<usize>()
            + args
                .iter()
                .map(|arg| match arg {
                    Arg::Text(text) => text.len(),
                    Arg::Number(_) => 20,
                })
                .sum::<usize>();
        let mut cmd = Cmd::with_capacity(3 + keys.len() + args.len(), data);
        cmd.arg(name).arg(script).arg(keys.len()).arg(keys);
        for arg in args {
            match *arg {
                Arg::Text(text) => cmd.arg(text),
                Arg::Number(number) => cmd.arg(number),
            };
        }
        cmd
    }
}

pub(super) static ACQUIRE: Lua = Lua::new(include_str!("acquire.lua"));
pub(super) static RELEASE: Lua = Lua::new(include_str!("release.lua"));
pub(super) static RENEW: Lua = Lua::new(include_str!("renew.lua"));

pub(super) fn is_noscript(error: &redis::RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// Runs `lua`: `EVALSHA`, then `EVAL` where the server does not know the script (which also
/// caches it there).
pub(super) async fn eval(
    mut conn: Conn,
    lua: &Lua,
    keys: &[&str],
    args: &[Arg<'_>],
) -> RedisResult<Value> {
    match conn
        .req_packed_command(&lua.cmd(true, keys, args))
        .await
        .and_then(Value::extract_error)
    {
        Err(error) if is_noscript(&error) => conn
            .req_packed_command(&lua.cmd(false, keys, args))
            .await
            .and_then(Value::extract_error),
        result => result,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_replies_name_the_waiter_handed_the_lock() {
        let reply = |held: i64, head: &str, fence: i64| {
            Value::Array(vec![
                Value::Int(held),
                Value::BulkString(head.as_bytes().to_vec()),
                Value::Int(fence),
            ])
        };
        let released = parse_release(reply(1, "abc", 9)).unwrap();
        assert!(released.held);
        assert_eq!(released.handed_to.as_deref(), Some("abc"));
        let released = parse_release(reply(0, "abc", 3)).unwrap();
        assert!(!released.held);
        assert_eq!(released.handed_to.as_deref(), Some("abc"));
        for (reply, held) in [(Value::Int(1), true), (Value::Int(0), false)] {
            let released = parse_release(reply).unwrap();
            assert_eq!(released.held, held);
            assert_eq!(released.handed_to, None);
        }
        assert!(parse_release(Value::Int(2)).is_err());
        assert!(parse_release(Value::Array(vec![Value::Int(1)])).is_err());
    }

    #[test]
    fn shared_functions_are_spliced_in_after_the_uncontended_path() {
        for lua in [&ACQUIRE, &RELEASE] {
            let (code, hash) = lua.code();
            let (uncontended, rest) = lua.source.split_once("--!common\n").unwrap();
            assert!(uncontended.contains("return"), "{uncontended}");
            assert!(!uncontended.contains("local function"), "{uncontended}");
            let spliced = [uncontended, include_str!("common.lua"), rest].concat();
            assert_eq!(code, &spliced);
            assert_eq!(hash.len(), 40);
        }
        assert_eq!(RENEW.code().0, include_str!("renew.lua"));
    }

    #[test]
    fn acquire_replies_are_a_fence_or_a_busy_answer() {
        assert!(matches!(
            parse_attempt(Value::Int(7)).unwrap(),
            Attempt::Granted(7)
        ));
        let busy = Value::Array(vec![Value::Int(1500), Value::Int(1)]);
        let Attempt::Busy { pttl, first } = parse_attempt(busy).unwrap() else {
            panic!("not busy");
        };
        assert_eq!((pttl, first), (Some(Duration::from_millis(1500)), true));
        let gone = Value::Array(vec![Value::Int(-2), Value::Int(0)]);
        assert!(matches!(
            parse_attempt(gone).unwrap(),
            Attempt::Busy { pttl: None, .. }
        ));
        assert!(parse_attempt(Value::Int(-1)).is_err());
        assert!(parse_attempt(Value::Nil).is_err());
    }
}
