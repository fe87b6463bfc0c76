//! `Locker`: a handle to one store that hands out leases; the [`Lease`] guard it hands out; and
//! the default locker.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::backend::{AcquireRequest, Backend, DynBackend};
use tokio::sync::oneshot;

use crate::background;
use crate::lease::{LeaseState, LossCause};
use crate::reentry;
use crate::url::{self, Scheme};
use crate::watchdog::Watchdog;
use crate::{LockError, LockOptions, Owner};

mod default;
mod guard;
mod holdings;
mod pending;

pub(crate) use default::default_locker;
pub use default::{init_from_env, set_default_locker};
pub use guard::Lease;
use holdings::{Holdings, QueuedRelease};
use pending::{PendingAcquire, PendingRelease};

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
    holdings: Arc<Holdings>,
    description: String,
}

impl Locker {
    /// The longest key, in bytes, that any store is asked to hold: 1 MiB. Longer keys fail with
    /// [`LockError::InvalidKey`] before any I/O. A key is usually rendered from request data; a
    /// runaway one (a whole payload in a placeholder) would cost the store memory and every
    /// call a transfer of that size, and never names a resource anyone meant to lock. Most
    /// stores allow less, each checked by its backend: Redis 16 KiB, ZooKeeper a node path of
    /// 1,000,000 bytes, MySQL 255 bytes.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use dlock::{LockError, LockOptions, Locker};
    ///
    /// let locker = Locker::memory();
    /// let runaway = "x".repeat(Locker::MAX_KEY_BYTES + 1);
    /// let refused = locker.lock(runaway, LockOptions::new()).await;
    /// assert!(matches!(refused, Err(LockError::InvalidKey { .. })));
    /// # }
    /// ```
    pub const MAX_KEY_BYTES: usize = 1 << 20;

    /// A locker on a fresh in-process store (see [`MemoryBackend`](crate::backend::MemoryBackend)):
    /// for a program that runs as one process, and for tests. Each call makes a new store, so
    /// two lockers from two calls never exclude each other; share one by cloning it, or keep it
    /// in a `static`.
    ///
    /// ```
    /// use std::sync::LazyLock;
    /// use dlock::{distributed_lock, Locker};
    ///
    /// static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);
    ///
    /// #[distributed_lock(key = "cache-refresh", locker = &LOCKS)]
    /// async fn refresh_cache() -> Option<()> {
    ///     Some(())
    /// }
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # assert_eq!(refresh_cache().await, Some(()));
    /// # }
    /// ```
    #[cfg(feature = "memory")]
    pub fn memory() -> Locker {
        Locker::with_backend(crate::backend::MemoryBackend::new())
    }

    /// A locker on any [`Backend`]: a store built with its options, or one of your own.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dlock::{backend::RedisBackend, Locker};
    ///
    /// // Building connects nothing: the first lock does.
    /// let backend = RedisBackend::builder("redis://127.0.0.1:6379")?
    ///     .key_prefix("billing:")
    ///     .response_timeout(Duration::from_secs(1))
    ///     .build()?;
    /// let locker = Locker::with_backend(backend);
    /// # Ok::<(), dlock::LockError>(())
    /// ```
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
                holdings: Arc::default(),
                backend,
                description,
            }),
        }
    }

    /// Connects to the store a URL names, each where its cargo feature is enabled:
    ///
    /// | store | URL |
    /// | --- | --- |
    /// | in-process | `memory://` |
    /// | Redis | `redis://[[user]:password@]host[:port][/db]`, `rediss://…` (feature `redis-tls`) |
    /// | Redis Cluster | `redis+cluster://host:port,host:port` (feature `redis-cluster`) |
    /// | MySQL / MariaDB | `mysql://user:password@host[:port]/database` |
    /// | PostgreSQL | `postgres://user:password@host[:port]/database`, `postgresql://…` |
    /// | ZooKeeper | `zk://host:port[,host:port][/chroot]` |
    ///
    /// Redis URLs take `?min_replicas=n`: a grant and each renewal then count only once `n`
    /// replicas acknowledged them. For the other settings of a store (key prefix, table, time-outs)
    /// use its builder, such as [`RedisBackend::builder`](crate::backend::RedisBackend::builder),
    /// and [`Locker::with_backend`].
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidUrl`] where the URL cannot be used (an unknown scheme, a feature this
    /// build lacks), [`LockError::Backend`] where the store cannot be reached or refuses the
    /// credentials.
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped, the connection attempt is abandoned: no locker exists, nothing
    /// is held, and connections already opened are dropped. (A MySQL pool whose opening is under
    /// way finishes opening on dlock's background runtime, and is dropped then.)
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let locker = dlock::Locker::connect("redis://:secret@127.0.0.1:6379").await?;
    /// let lease = locker.lock("acct:42", dlock::LockOptions::new()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Locker, LockError> {
        let invalid = |reason: String| LockError::invalid_url(url, reason);
        match Scheme::of(url) {
            #[cfg(feature = "memory")]
            Some(Scheme::Memory) => Ok(Locker::memory().described(url)),
            #[cfg(feature = "mysql")]
            Some(Scheme::Mysql) => Ok(Locker::with_backend(
                crate::backend::MysqlBackend::connect(url).await?,
            )
            .described(url)),
            #[cfg(feature = "postgres")]
            Some(Scheme::Postgres) => Ok(Locker::with_backend(
                crate::backend::PostgresBackend::connect(url).await?,
            )
            .described(url)),
            #[cfg(feature = "redis")]
            Some(Scheme::Redis | Scheme::RedisCluster) => Ok(Locker::with_backend(
                crate::backend::RedisBackend::connect(url).await?,
            )
            .described(url)),
            #[cfg(feature = "zookeeper")]
            Some(Scheme::Zookeeper) => Ok(Locker::with_backend(
                crate::backend::ZookeeperBackend::connect(url).await?,
            )
            .described(url)),
            #[allow(unreachable_patterns)]
            Some(scheme) => Err(invalid(format!(
                "this build of dlock lacks the `{}` feature; enable it in Cargo.toml",
                scheme.feature()
            ))),
            None => Err(invalid(format!("unknown scheme; use {}", url::KNOWN))),
        }
    }

    /// Connects to the store the `DLOCK_URL` environment variable names (see
    /// [`connect`](Self::connect) for the URLs). To make it the default locker too, call
    /// [`init_from_env`](crate::init_from_env).
    ///
    /// # Errors
    ///
    /// [`LockError::NoLocker`] where `DLOCK_URL` is unset or empty; else as
    /// [`connect`](Self::connect).
    ///
    /// # Cancel safety
    ///
    /// As [`connect`](Self::connect): a dropped future leaves no locker behind.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// # std::env::set_var("DLOCK_URL", "memory://");
    /// // DLOCK_URL=redis://127.0.0.1:6379, say
    /// let locker = dlock::Locker::from_env().await?;
    /// let lease = locker.lock("migrations", dlock::LockOptions::new()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn from_env() -> Result<Locker, LockError> {
        let url = default::url_from_env().ok_or(LockError::NoLocker)?;
        Locker::connect(&url).await
    }

    fn described(mut self, url: &str) -> Locker {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.description = url::mask_password(url);
        }
        self
    }

    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// Acquires `key`, waiting up to `options.wait` for it, and keeps the lease renewed while it
    /// is held if `options.renew`.
    ///
    /// # Errors
    ///
    /// [`LockError::Busy`] when the key stayed taken for the whole wait;
    /// [`LockError::InvalidKey`] or [`LockError::InvalidOptions`] before any I/O;
    /// [`LockError::ShutDown`] after [`shutdown`](Self::shutdown); [`LockError::Backend`] when
    /// the store failed.
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped while the acquisition is in flight, the key is released if the
    /// store granted it, and a caller waiting for the key leaves its place in the queue: nothing
    /// stays held or queued for an abandoned call.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// use std::time::Duration;
    /// use dlock::{LockError, LockOptions, Locker};
    ///
    /// let locker = Locker::memory();
    /// let options = LockOptions::new().ttl(Duration::from_secs(10)).wait(Duration::from_millis(100));
    /// match locker.lock("import:2026-11-30", options).await {
    ///     Ok(lease) => {
    ///         // … run the import, passing lease.fence() with its writes …
    ///         lease.release().await?;
    ///     }
    ///     Err(LockError::Busy { .. }) => println!("another worker runs the import"),
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(()) }
    /// ```
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

    /// Checks that the store answers: one round trip that changes nothing, for a service's
    /// readiness probe.
    ///
    /// # Errors
    ///
    /// [`LockError::Backend`] when the store did not answer (within the store's response
    /// time-out), [`LockError::ShutDown`] after [`shutdown`](Self::shutdown).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future abandons the probe; it holds nothing.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let locker = dlock::Locker::memory();
    /// locker.health().await?;
    /// # Ok(()) }
    /// ```
    pub async fn health(&self) -> Result<(), LockError> {
        if self.inner.holdings.is_closed() {
            return Err(LockError::ShutDown);
        }
        self.inner.backend.health().await
    }

    /// Shuts the locker down for a clean exit: refuses new acquisitions and stops those in
    /// flight (they fail with [`LockError::ShutDown`], undoing whatever reached the store),
    /// releases every lease still held, waits for the releases queued by dropped leases and the
    /// stores' own clean-ups to reach the store, and closes what the store opened for itself
    /// (the MySQL and PostgreSQL pools it made; Redis and ZooKeeper connections close when the
    /// last clone of the locker is dropped). Affects every clone of this locker, and every
    /// locker built on a clone of the same backend shares its pool: shut them down together.
    /// Calling it again does nothing more.
    ///
    /// A body of `#[distributed_lock]` running under a lease is told the lease is lost, and the
    /// lease stays held and renewed until no body works under it. Under `on_lost = "cancel"` the
    /// body is stopped at its next `.await`, and its key released once it rests there (work
    /// inside one poll runs to its end first, however long; work it handed to a spawned task is
    /// not waited for). Under `"continue"` the key is released when the body finishes, or at
    /// the latest when the validity the lease had at the shutdown runs out (a ttl at most),
    /// after which the body runs on without the key, as after any loss. A manual [`Lease`] is
    /// released at once: its holder is told through [`Lease::lost`] and stops its work when
    /// told. A body that calls `shutdown` itself is not waited for.
    ///
    /// Futures its caller keeps but no longer polls (a `select!` on a termination signal keeps
    /// the others) hold little up: a release in flight is sent again from the background (the
    /// owner check makes the second harmless), a body under `"cancel"` not in
    /// a poll rests, one under `"continue"` is waited for as above, and an acquisition in flight
    /// is waited for 5 s at most (if the store grants it after that, the key stays held until
    /// its ttl runs out).
    ///
    /// A lease dropped just before the program returns from `main` is released on dlock's
    /// background thread, which dies with the process: without this call, such a key stays
    /// held until its ttl runs out. So a service calls it last, after its own work has stopped
    /// (for a web server, after its graceful shutdown returned).
    ///
    /// # Errors
    ///
    /// The first [`LockError::Backend`] of a release made by this call that the store did not
    /// confirm; that key then stays held until its ttl runs out. Every other lease is still
    /// released. (A body's own release on its way out is logged, not reported here.)
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped, the releases it started go on in the background, and the
    /// locker stays shut down.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::{LockError, LockOptions, Locker};
    ///
    /// let locker = Locker::memory();
    /// let lease = locker.lock("report:2026-11", LockOptions::new()).await?;
    /// locker.shutdown().await?;
    /// assert!(!lease.is_held());
    /// assert!(matches!(
    ///     locker.lock("report:2026-12", LockOptions::new()).await,
    ///     Err(LockError::ShutDown)
    /// ));
    /// # Ok(()) }
    /// ```
    pub async fn shutdown(&self) -> Result<(), LockError> {
        // A body that called shutdown itself cannot rest while it waits for shutdown.
        let callers_own = reentry::leases_of_this_task();
        // On the background runtime, so that it finishes (the store closed) even if this future
        // is dropped: by a body under `on_lost = "cancel"` that called it, say, as shutdown
        // stops that body.
        let (done, finished) = oneshot::channel();
        let locker = self.clone();
        background::spawn(async move {
            let _ = done.send(locker.shut_down(callers_own).await);
        });
        finished.await.unwrap_or_else(|_| {
            Err(LockError::backend(
                "the shutdown task ended without an answer",
            ))
        })
    }

    async fn shut_down(&self, callers_own: Vec<u64>) -> Result<(), LockError> {
        let held = self.inner.holdings.close();
        if !held.is_empty() {
            tracing::info!(leases = held.len(), locker = %self.inner.description, "distributed_lock: shutting down; releasing held leases");
        }
        let first_error: Arc<Mutex<Option<LockError>>> = Arc::default();
        for (state, queued) in held {
            if state.is_released() {
                // Its caller is releasing it, and may be parked or slow: again, from here.
                self.send_release(state.key.clone(), state.owner, queued);
                continue;
            }
            state.stop();
            let (locker, first_error) = (self.clone(), first_error.clone());
            let waits_for_rest = !callers_own.contains(&state.id);
            // Counted as a queued release (since `close`), so the wait below covers it.
            background::spawn(async move {
                let _queued = queued;
                if waits_for_rest {
                    // No body works under the key when it goes to the next holder; the lease
                    // is renewed meanwhile. A body under "continue" is waited for until the
                    // validity it has now (it may be parked for good): it runs on without the
                    // key after that, as after any loss.
                    let deadline = state.runs_on_after_loss().then(|| state.valid_until());
                    state.wait_at_rest(deadline).await;
                }
                state.mark_lost(LossCause::ShutDown);
                if let Err(error) = locker.release_at_shutdown(&state).await {
                    tracing::warn!(key = %state.key, %error, "distributed_lock: release at shutdown failed; the lease will expire");
                    let mut first = first_error.lock().unwrap_or_else(|p| p.into_inner());
                    first.get_or_insert(error);
                }
            });
        }
        // Acquisitions in flight return first, their undos queued: a future its caller no
        // longer polls cannot return, and is waited for a moment only.
        let returned =
            tokio::time::timeout(IN_FLIGHT_PATIENCE, self.inner.holdings.acquisitions_done()).await;
        if returned.is_err() {
            tracing::warn!(locker = %self.inner.description, "distributed_lock: an acquisition in flight was not polled during shutdown; if the store grants it, the key stays held until its ttl runs out");
        }
        self.inner.holdings.queued_releases_done().await;
        self.inner.backend.close().await;
        let first_error = first_error.lock().unwrap_or_else(|p| p.into_inner()).take();
        first_error.map_or(Ok(()), Err)
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
        let Ok(_acquiring) = self.inner.holdings.acquisition() else {
            return Err(LockError::ShutDown);
        };
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
            // A shutdown stops the acquisition: dropped here, the store's guards undo what
            // reached it, and the guard above releases a grant that may have.
            let acquired = tokio::select! {
                biased;
                acquired = self.inner.backend.acquire(&request) => acquired,
                () = self.inner.holdings.closed() => Err(LockError::ShutDown),
            };
            // A store error leaves it unknown whether the key was granted (a lost reply): the
            // guard then releases it, which an owner check makes harmless if it was not. A
            // request the store refused to send (a key or option it cannot take) left nothing.
            pending.armed = match &acquired {
                Ok(_) => false,
                Err(LockError::InvalidKey { .. } | LockError::InvalidOptions { .. }) => false,
                Err(_) => true,
            };
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
        if self.inner.holdings.register(&state).is_err() {
            // Shut down while the acquisition was in flight: give the key back at once.
            self.release_in_background(&state);
            return Err(LockError::ShutDown);
        }
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
        // Sent from this task, the fast way (no hop to the background runtime and back). The
        // lease stays among the held ones until the store answered: a shutdown meanwhile sends
        // the release again from the background, counted, so that neither a parked caller nor
        // one that is slow holds it up; the owner check makes the second release harmless.
        let mut pending = PendingRelease {
            locker: self,
            state,
            armed: true,
        };
        let result = tokio::time::timeout(
            RELEASE_PATIENCE,
            self.inner.backend.release(&state.key, state.owner),
        )
        .await
        .unwrap_or_else(|_| Err(release_timed_out()));
        pending.armed = false;
        self.inner.holdings.forget(state);
        let held = result?;
        tracing::debug!(key = %state.key, fence = state.fence, held, "distributed_lock: released");
        Ok(())
    }

    /// Releases `state` for a shutdown, and waits for the store's answer. A body that finished
    /// meanwhile may be releasing it too, from its own task, which a shutdown does not wait for:
    /// the release is sent from here anyway (the owner check makes the second harmless), and
    /// only the first reports an error.
    async fn release_at_shutdown(&self, state: &Arc<LeaseState>) -> Result<(), LockError> {
        let first = state.mark_released();
        self.inner.watchdog.forget(state);
        self.inner.holdings.forget(state);
        let result = tokio::time::timeout(
            RELEASE_PATIENCE,
            self.inner.backend.release(&state.key, state.owner),
        )
        .await
        .unwrap_or_else(|_| Err(release_timed_out()));
        match result {
            Err(error) if first => Err(error),
            _ => Ok(()),
        }
    }

    /// Releases `state` without waiting: at once where the store is in-process, else queued on
    /// the background runtime. For `Drop`, which must not block.
    pub(crate) fn release_in_background(&self, state: &Arc<LeaseState>) {
        let queued = self.inner.holdings.queued_release();
        if !state.mark_released() {
            return;
        }
        self.inner.watchdog.forget(state);
        self.inner.holdings.forget(state);
        self.send_release(state.key.clone(), state.owner, queued);
        tracing::debug!(key = %state.key, fence = state.fence, "distributed_lock: released on drop");
    }

    /// Releases `key` for `owner` without waiting, counted by a fresh queued-release guard.
    fn queue_release(&self, key: String, owner: Owner) {
        let queued = self.inner.holdings.queued_release();
        self.send_release(key, owner, queued);
    }

    /// Releases `key` for `owner` without waiting: at once where the store is in-process, else
    /// on the background runtime, counted by `queued` until it is done.
    fn send_release(&self, key: String, owner: Owner, queued: QueuedRelease) {
        if self.inner.backend.release_now(&key, owner) {
            return;
        }
        let backend = self.inner.backend.clone();
        background::spawn(async move {
            let _queued = queued;
            // Bounded, so a store that never answers cannot hold a shutdown up for good.
            let result = tokio::time::timeout(RELEASE_PATIENCE, backend.release(&key, owner))
                .await
                .unwrap_or_else(|_| Err(release_timed_out()));
            if let Err(error) = result {
                tracing::warn!(%key, %error, "distributed_lock: queued release failed; the lease will expire");
            }
        });
    }
}

/// How long a release may take before it is given up (the lease then expires with its ttl): a
/// store's own time-outs end it sooner, this bounds one that has none.
const RELEASE_PATIENCE: Duration = Duration::from_secs(10);

/// How long shutdown waits for the acquisitions in flight to return: each returns at once when
/// polled (it is stopped), so only a future nobody polls any more takes this long.
const IN_FLIGHT_PATIENCE: Duration = Duration::from_secs(5);

fn release_timed_out() -> LockError {
    LockError::backend(format!(
        "the store did not answer a release within {RELEASE_PATIENCE:?}"
    ))
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

impl std::fmt::Debug for Locker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Locker")
            .field(&self.inner.description)
            .finish()
    }
}
