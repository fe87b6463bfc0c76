//! `Locker`: a handle to one store that hands out leases; and the default locker.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use tokio::sync::watch;

use crate::backend::{AcquireRequest, Backend, DynBackend};
use crate::background;
use crate::lease::{Lease, LeaseState};
use crate::watchdog::Watchdog;
use crate::{LockError, LockOptions, Owner};

/// A handle to one lock store. Cheap to clone (clones share the store's connections and one
/// watchdog), `Send + Sync`, and usable from any tokio runtime: its background work runs on a
/// runtime of dlock's own, so a `Locker` in a `static` serves every `#[tokio::test]` of a binary.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// use dlock::{LockError, LockOptions, Locker};
///
/// let locker = Locker::connect("memory://").await?;
/// let first = locker.lock("acct:42", LockOptions::new()).await?;
/// // A second owner is turned away while the first holds the key.
/// let second = locker.lock("acct:42", LockOptions::new()).await;
/// assert!(matches!(second, Err(LockError::Busy { .. })));
/// first.release().await?;
/// assert!(locker.lock("acct:42", LockOptions::new()).await.is_ok());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Locker {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Arc<dyn DynBackend>,
    watchdog: Watchdog,
    description: String,
}

impl Locker {
    /// The longest key, in bytes, that any store is asked to hold: 1 MiB. Longer keys fail with
    /// [`LockError::InvalidKey`] before any I/O. A key is usually rendered from request data; a
    /// runaway one (a whole payload in a placeholder) would cost the store memory and every
    /// call a transfer of that size, and never names a resource anyone meant to lock. Most
    /// stores allow less, each checked by its backend: Redis 16 KiB, ZooKeeper a node path of
    /// 1,000,000 bytes, MySQL 255 bytes.
    pub const MAX_KEY_BYTES: usize = 1 << 20;

    /// A locker on a fresh in-process store (see [`MemoryBackend`](crate::backend::MemoryBackend)).
    #[cfg(feature = "memory")]
    pub fn memory() -> Locker {
        Locker::with_backend(crate::backend::MemoryBackend::new())
    }

    /// A locker on the Redis server (or, with the `redis-cluster` feature, the cluster) that `url`
    /// names, connected: `redis://[[user]:password@]host[:port][/db]`, `rediss://…` with the
    /// `redis-tls` feature, `redis+cluster://host:port,host:port`; `?min_replicas=n` makes a
    /// grant and each renewal count only once `n` replicas acknowledged them (see
    /// [`RedisBackendBuilder::min_replicas`](crate::backend::RedisBackendBuilder::min_replicas)).
    /// For other options (key prefix, timeouts), build a
    /// [`RedisBackend`](crate::backend::RedisBackend) and use [`Locker::with_backend`].
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let locker = dlock::Locker::redis("redis://:secret@127.0.0.1:6379").await?;
    /// let lease = locker.lock("acct:42", dlock::LockOptions::new()).await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis")]
    pub async fn redis(url: &str) -> Result<Locker, LockError> {
        let backend = crate::backend::RedisBackend::connect(url).await?;
        Ok(Locker::with_backend(backend).described(url))
    }

    /// A locker on any [`Backend`].
    pub fn with_backend<B: Backend>(backend: B) -> Locker {
        let name = std::any::type_name::<B>()
            .rsplit("::")
            .next()
            .unwrap_or("backend");
        Self::from_parts(Arc::new(backend), name.to_owned())
    }

    fn from_parts(backend: Arc<dyn DynBackend>, description: String) -> Locker {
        Locker {
            inner: Arc::new(Inner {
                watchdog: Watchdog::new(backend.clone()),
                backend,
                description,
            }),
        }
    }

    /// Connects to the store a URL names: `memory://`, `redis://`, `rediss://`, `mysql://` or
    /// `zk://host:port[,host:port][/chroot]`, each where its cargo feature is enabled.
    pub async fn connect(url: &str) -> Result<Locker, LockError> {
        let scheme = url
            .split_once("://")
            .map(|(scheme, _)| scheme)
            .unwrap_or("");
        let invalid = |reason: String| LockError::invalid_url(url, reason);
        match scheme {
            #[cfg(feature = "memory")]
            "memory" => Ok(Locker::memory().described(url)),
            #[cfg(feature = "mysql")]
            "mysql" => Ok(
                Locker::with_backend(crate::backend::MysqlBackend::connect(url).await?)
                    .described(url),
            ),
            #[cfg(feature = "redis")]
            "redis" | "rediss" | "redis+cluster" | "rediss+cluster" => Locker::redis(url).await,
            #[cfg(feature = "zookeeper")]
            "zk" => Ok(
                Locker::with_backend(crate::backend::ZookeeperBackend::connect(url).await?)
                    .described(url),
            ),
            known
                if [
                    "memory",
                    "redis",
                    "rediss",
                    "redis+cluster",
                    "rediss+cluster",
                    "mysql",
                    "zk",
                ]
                .contains(&known) =>
            {
                Err(invalid(format!(
                    "this build of dlock lacks the `{}` feature; enable it in Cargo.toml",
                    feature_of(scheme)
                )))
            }
            _ => Err(invalid(
                "unknown scheme; use memory://, redis://, rediss://, mysql:// or zk://".into(),
            )),
        }
    }

    fn described(mut self, url: &str) -> Locker {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.description = mask_password(url);
        }
        self
    }

    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// Acquires `key`, waiting up to `options.wait` for it, and keeps the lease renewed while it
    /// is held if `options.renew`. Fails with [`LockError::Busy`] when the key stayed taken.
    ///
    /// If this future is dropped while the acquisition is in flight, the key is released if the
    /// store granted it.
    pub async fn lock(
        &self,
        key: impl Into<String>,
        options: LockOptions,
    ) -> Result<Lease, LockError> {
        let state = self.acquire(key.into(), options).await?;
        Ok(Lease {
            state,
            locker: self.clone(),
        })
    }

    /// [`lock`](Self::lock) without the `Lease` around the state, for callers that own a
    /// `Locker` to put in it.
    pub(crate) async fn acquire(
        &self,
        key: String,
        options: LockOptions,
    ) -> Result<Arc<LeaseState>, LockError> {
        let mut options = options.checked()?;
        check_key_length(&key)?;
        if let Some(limit) = self.inner.backend.ttl_limit() {
            if options.ttl > limit {
                tracing::debug!(%key, asked = ?options.ttl, kept = ?limit, "distributed_lock: ttl shortened to the store's limit");
                options.ttl = limit;
            }
        }
        let owner = Owner::random();
        let started = Instant::now();
        // Exists before the acquisition is awaited, so a dropped future still releases.
        let acquired = {
            let mut pending = PendingAcquire {
                locker: self,
                key: &key,
                owner,
                armed: true,
            };
            let request = AcquireRequest::new(&key, owner, options.ttl, options.wait);
            let acquired = self.inner.backend.acquire(&request).await;
            // A store error leaves it unknown whether the key was granted (a lost reply): the
            // guard then releases it, which an owner check makes harmless if it was not.
            pending.armed = acquired.is_err();
            acquired
        };
        let acquired = match acquired? {
            Some(acquired) => acquired,
            None => {
                tracing::debug!(%key, waited = ?started.elapsed(), "distributed_lock: busy");
                return Err(LockError::Busy { key });
            }
        };
        tracing::debug!(%key, fence = acquired.fence, waited = ?started.elapsed(), "distributed_lock: acquired");
        let state = Arc::new(LeaseState::new(
            key,
            owner,
            acquired.fence,
            options.ttl,
            acquired.valid_from,
            self.id(),
        ));
        if options.renew {
            self.inner.watchdog.watch(&state, acquired.valid_from);
        }
        Ok(state)
    }

    /// Releases `state` and waits for the store's answer.
    pub(crate) async fn release(&self, state: &Arc<LeaseState>) -> Result<(), LockError> {
        if !state.mark_released() {
            return Ok(());
        }
        self.inner.watchdog.forget(state);
        let mut pending = PendingRelease {
            locker: self,
            state,
            armed: true,
        };
        let result = self.inner.backend.release(&state.key, state.owner).await;
        pending.armed = false;
        match result {
            Ok(held) => {
                tracing::debug!(key = %state.key, fence = state.fence, held, "distributed_lock: released");
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// Releases `state` without waiting: at once where the store is in-process, else queued on
    /// the background runtime. For `Drop`, which must not block.
    pub(crate) fn release_in_background(&self, state: &Arc<LeaseState>) {
        if !state.mark_released() {
            return;
        }
        self.inner.watchdog.forget(state);
        self.queue_release(state.key.clone(), state.owner);
        tracing::debug!(key = %state.key, fence = state.fence, "distributed_lock: released on drop");
    }

    fn queue_release(&self, key: String, owner: Owner) {
        if self.inner.backend.release_now(&key, owner) {
            return;
        }
        let backend = self.inner.backend.clone();
        background::spawn(async move {
            if let Err(error) = backend.release(&key, owner).await {
                tracing::warn!(%key, %error, "distributed_lock: queued release failed; the lease will expire");
            }
        });
    }
}

fn check_key_length(key: &str) -> Result<(), LockError> {
    if key.len() <= Locker::MAX_KEY_BYTES {
        return Ok(());
    }
    // The error names the key by its start: repeating a runaway key would only move the problem
    // into the logs.
    let mut shown = 64;
    while !key.is_char_boundary(shown) {
        shown -= 1;
    }
    Err(LockError::InvalidKey {
        key: format!("{}…", &key[..shown]),
        reason: format!(
            "{} bytes long; keys may be at most {} bytes",
            key.len(),
            Locker::MAX_KEY_BYTES
        ),
    })
}

/// Releases a key whose acquisition was abandoned mid-flight: the store may have granted it.
struct PendingAcquire<'a> {
    locker: &'a Locker,
    key: &'a str,
    owner: Owner,
    armed: bool,
}

impl Drop for PendingAcquire<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.locker.queue_release(self.key.to_owned(), self.owner);
        }
    }
}

/// Finishes a release whose caller stopped waiting for it.
struct PendingRelease<'a> {
    locker: &'a Locker,
    state: &'a LeaseState,
    armed: bool,
}

impl Drop for PendingRelease<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.locker
                .queue_release(self.state.key.clone(), self.state.owner);
        }
    }
}

impl std::fmt::Debug for Locker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Locker")
            .field(&self.inner.description)
            .finish()
    }
}

fn feature_of(scheme: &str) -> &'static str {
    match scheme {
        "memory" => "memory",
        "redis" | "rediss" => "redis",
        "redis+cluster" | "rediss+cluster" => "redis-cluster",
        "mysql" => "mysql",
        _ => "zookeeper",
    }
}

/// `url` with its secrets replaced by `***`, for errors and logs.
///
/// The secrets are the password of the user information and the values of query parameters
/// that carry one (`password`, `pass`, `auth`, `token`, `secret`). The user information is taken
/// to run from the scheme's `:` (and any slashes after it) to the last `@`, so a password holding
/// `/`, `@`, `:`, `?` or `#` (which users write unescaped), or a URL with a slash too few, is
/// masked whole; without a `:` in it, the whole user information is masked. Where that guess is
/// wrong it masks too much, never too little.
pub(crate) fn mask_password(url: &str) -> String {
    let mut masked = String::with_capacity(url.len());
    let mut from = 0;
    for (start, end) in secrets(url) {
        masked.push_str(&url[from..start]);
        masked.push_str("***");
        from = end;
    }
    masked.push_str(&url[from..]);
    masked
}

/// `text` with every secret of `url` replaced by `***`: for messages of other crates' parsers,
/// which may quote the URL they were given.
pub(crate) fn redact(text: &str, url: &str) -> String {
    secrets(url)
        .into_iter()
        .map(|(start, end)| &url[start..end])
        .fold(text.to_owned(), |text, secret| text.replace(secret, "***"))
}

/// The byte ranges of `url`'s secrets, in order, none empty.
fn secrets(url: &str) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    let Some(scheme_end) = url.find(':') else {
        return found;
    };
    let authority = scheme_end + 1 + url[scheme_end + 1..].len()
        - url[scheme_end + 1..].trim_start_matches('/').len();
    if let Some(at) = url.rfind('@').filter(|&at| at > authority) {
        let userinfo = &url[authority..at];
        let start = userinfo
            .find(':')
            .map_or(authority, |colon| authority + colon + 1);
        if start < at {
            found.push((start, at));
        }
    }
    let query_from = found.last().map_or(authority, |&(_, end)| end);
    if let Some(question) = url[query_from..].find('?') {
        let mut offset = query_from + question + 1;
        for pair in url[offset..].split('&') {
            if let Some((name, value)) = pair.split_once('=') {
                let secret = ["password", "pass", "auth", "token", "secret"]
                    .iter()
                    .any(|n| name.eq_ignore_ascii_case(n));
                if secret && !value.is_empty() {
                    let start = offset + name.len() + 1;
                    found.push((start, start + value.len()));
                }
            }
            offset += pair.len() + 1;
        }
    }
    found
}

static DEFAULT: RwLock<Option<Locker>> = RwLock::new(None);
static FROM_ENV: Mutex<FromEnv> = Mutex::new(FromEnv::Unset);

/// The locker built from `DLOCK_URL`.
enum FromEnv {
    /// Not built, or the last attempt failed: the next caller tries again.
    Unset,
    /// An attempt is under way; callers arriving now wait for its outcome instead of queueing
    /// attempts of their own behind it.
    Connecting(watch::Receiver<Option<Result<Locker, Arc<LockError>>>>),
    Ready(Locker),
}

/// Sets the locker that `#[distributed_lock]` uses where it names none. A later call replaces
/// the locker for calls that start after it.
///
/// ```
/// dlock::set_default_locker(dlock::Locker::memory());
/// ```
pub fn set_default_locker(locker: Locker) {
    *DEFAULT.write().unwrap_or_else(|p| p.into_inner()) = Some(locker);
}

/// The locker set by [`set_default_locker`]; else one built once from `DLOCK_URL`; else
/// [`LockError::NoLocker`].
pub(crate) async fn default_locker() -> Result<Locker, LockError> {
    if let Some(locker) = DEFAULT.read().unwrap_or_else(|p| p.into_inner()).as_ref() {
        return Ok(locker.clone());
    }
    let mut outcome = {
        let mut from_env = FROM_ENV.lock().unwrap_or_else(|p| p.into_inner());
        match &*from_env {
            FromEnv::Ready(locker) => return Ok(locker.clone()),
            FromEnv::Connecting(outcome) => outcome.clone(),
            FromEnv::Unset => {
                let url = match std::env::var("DLOCK_URL") {
                    Ok(url) if !url.trim().is_empty() => url.trim().to_owned(),
                    _ => return Err(LockError::NoLocker),
                };
                let outcome = connect_from_env(url);
                *from_env = FromEnv::Connecting(outcome.clone());
                outcome
            }
        }
    };
    let result = match outcome.wait_for(Option::is_some).await.as_deref() {
        Ok(Some(Ok(locker))) => Ok(locker.clone()),
        Ok(Some(Err(error))) => Err(error.duplicate()),
        _ => Err(LockError::backend(
            "the connection to DLOCK_URL was abandoned",
        )),
    };
    result
}

/// Connects to `url` on the background runtime, so the attempt goes on if the caller that
/// started it is dropped, and publishes the outcome to every caller waiting on it.
fn connect_from_env(url: String) -> watch::Receiver<Option<Result<Locker, Arc<LockError>>>> {
    let (publish, outcome) = watch::channel(None);
    background::spawn(async move {
        // Should the attempt end without an outcome (a panic in a store's client), the next call
        // tries again rather than finding an attempt that never finishes.
        let unset_unless_done = ResetOnDrop;
        let connected = Locker::connect(&url).await;
        *FROM_ENV.lock().unwrap_or_else(|p| p.into_inner()) = match &connected {
            Ok(locker) => FromEnv::Ready(locker.clone()),
            // A failed connection is not kept: the next call tries again.
            Err(_) => FromEnv::Unset,
        };
        std::mem::forget(unset_unless_done);
        let _ = publish.send(Some(connected.map_err(Arc::new)));
    });
    outcome
}

/// Resets the locker from `DLOCK_URL` to "not built" when dropped.
struct ResetOnDrop;

impl Drop for ResetOnDrop {
    fn drop(&mut self) {
        *FROM_ENV.lock().unwrap_or_else(|p| p.into_inner()) = FromEnv::Unset;
    }
}

#[cfg(test)]
mod tests {
    use super::{mask_password, redact};

    #[test]
    fn masks_only_the_password() {
        assert_eq!(
            mask_password("redis://:secret@host:6379/0"),
            "redis://:***@host:6379/0"
        );
        assert_eq!(
            mask_password("mysql://root:pw@127.0.0.1/test"),
            "mysql://root:***@127.0.0.1/test"
        );
        assert_eq!(mask_password("redis://host:6379"), "redis://host:6379");
        assert_eq!(mask_password("memory://"), "memory://");
        assert_eq!(
            mask_password("redis://:p@ss:w/rd@host:6379/0"),
            "redis://:***@host:6379/0"
        );
        assert_eq!(
            mask_password("mysql://root:a/b?c#d@db/test"),
            "mysql://root:***@db/test"
        );
        assert_eq!(
            redact(
                "invalid port in mysql://root:a/b@db:x",
                "mysql://root:a/b@db:x"
            ),
            "invalid port in mysql://root:***@db:x"
        );
    }
}
