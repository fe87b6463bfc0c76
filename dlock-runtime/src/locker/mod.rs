//! `Locker`: a handle to one store that hands out leases; the [`Lease`] guard it hands out; and
//! the default locker.

use std::sync::Arc;
use std::time::Instant;

use crate::backend::{AcquireRequest, Backend, DynBackend};
use crate::lease::LeaseState;
use crate::metrics;
use crate::url::{self, Scheme};
use crate::watchdog::Watchdog;
use crate::{LockError, LockOptions, Mode, Owner};

mod default;
mod expiry;
mod guard;
mod holdings;
mod operator;
mod pending;
mod release;
mod semaphore;
pub(crate) use semaphore::permit_number;
mod shutdown;

pub(crate) use default::default_locker;
pub use default::{init_from_env, set_default_locker};
pub use guard::Lease;
use holdings::Holdings;
use pending::PendingAcquire;

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
    /// The `store` label of its metrics.
    store: &'static str,
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
        let type_name = std::any::type_name::<B>();
        let name = type_name.rsplit("::").next().unwrap_or("backend");
        let store = metrics::store_of(type_name);
        Self::from_parts(Arc::new(backend), name.to_owned(), store)
    }

    fn from_parts(
        backend: Arc<dyn DynBackend>,
        description: String,
        store: &'static str,
    ) -> Locker {
        crate::clock::start();
        let holdings: Arc<Holdings> = Arc::default();
        let holds = Box::new(release::HoldEndingsOf {
            backend: backend.clone(),
            holdings: holdings.clone(),
        });
        Locker {
            inner: Arc::new(Inner {
                watchdog: Watchdog::new(backend.clone(), holds),
                holdings,
                backend,
                description,
                store,
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
    /// | etcd | `etcd://[user:password@]host:port[,host:port]` (feature `etcd`) |
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
            #[cfg(feature = "etcd")]
            Some(Scheme::Etcd) => Ok(Locker::with_backend(
                crate::backend::EtcdBackend::connect(url).await?,
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
    /// [`connect`](Self::connect) for the URLs). Each call connects a new locker, apart from the
    /// default one (with `memory://`, on a store of its own). To connect the default locker
    /// instead, call [`init_from_env`](crate::init_from_env).
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

    /// Whether [`shutdown`](Self::shutdown) was called on this locker or a clone.
    pub(crate) fn is_shut_down(&self) -> bool {
        self.inner.holdings.is_closed()
    }

    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// The `store` label of this locker's metrics: `memory`, `redis`, … or `custom`.
    pub(crate) fn store_kind(&self) -> &'static str {
        self.inner.store
    }

    /// Acquires `key`, waiting up to `options.wait` for it, and keeps the lease renewed while it
    /// is held if `options.renew`.
    ///
    /// # Errors
    ///
    /// [`LockError::Busy`] when the key stayed taken for the whole wait;
    /// [`LockError::InvalidKey`] or [`LockError::InvalidOptions`] before any I/O;
    /// [`LockError::Unsupported`] before any I/O for a [read mode](LockOptions::mode) on a
    /// store without readers;
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
        // In the caller's hands: its hold, if any, applies. Not to a grant that came too late
        // to be used (the caller is handed a lease that is not held, and skips its work): like
        // a body's call that never ran, it must leave the key to the next caller at once.
        if state.may_run() {
            state.put_to_use();
        }
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
        if options.permits > 1 {
            // Boxed: a mutex's acquisition keeps the size it has without a semaphore's.
            return Box::pin(self.acquire_permit(key, options)).await;
        }
        self.acquire_key(key, options, Part::Whole).await
    }

    /// Acquires `key` as a mutex: the whole of an acquisition, or a `part` of a semaphore's.
    async fn acquire_key(
        &self,
        key: String,
        options: LockOptions,
        part: Part,
    ) -> Result<Arc<LeaseState>, LockError> {
        let mut options = options.checked()?;
        check_key_length(&key)?;
        if options.mode == Mode::Read && !self.inner.backend.shares_reads() {
            return Err(LockError::Unsupported {
                what: "take a key for readers (read mode): only the in-process store has \
                       read-write locks yet; take the key without a mode"
                    .into(),
            });
        }
        if !options.hold_at_least.is_zero() && !self.inner.backend.expires_at_a_set_time() {
            return Err(LockError::Unsupported {
                what: "keep a key held until a set time after its release (hold_at_least): \
                       its keys do not expire by themselves"
                    .into(),
            });
        }
        let Ok(_acquiring) = self.inner.holdings.acquisition() else {
            return Err(LockError::ShutDown);
        };
        // A ttl the store cannot vouch for with one confirmation is shortened to what it can.
        // A renewed lease is then only renewed more often. One without renewal would end sooner
        // than its holder was told: it is confirmed at the shorter ttl's pace instead, up to its
        // own ttl and no further, which is what that holder counts on. Such a store does not
        // expire a key at its ttl either: every lease without renewal on it, shortened or not,
        // is released when its ttl runs out, which is what the next holder counts on; and every
        // renewed lease on it is released a ttl after its last confirmed renewal once it is lost
        // for want of one, as a store that expires keys would let it go.
        let mut full_ttl = None;
        let mut expires_after = None;
        let mut expires_when_lost = false;
        if let Some(limit) = self.inner.backend.ttl_limit() {
            if !options.renew {
                expires_after = Some(options.ttl);
            }
            expires_when_lost = options.renew;
            if options.ttl > limit {
                tracing::debug!(%key, asked = ?options.ttl, kept = ?limit, "distributed_lock: ttl shortened to the store's limit");
                if !options.renew {
                    full_ttl = Some(options.ttl);
                }
                options.ttl = limit;
            }
        }
        let watched = options.renew || full_ttl.is_some();
        let owner = Owner::random();
        let started = match part {
            Part::Whole => metrics::started(),
            Part::Permit { started, .. } => started,
            Part::Quiet => None,
        };
        // Exists before the acquisition is awaited, so a dropped future still releases.
        let acquired = {
            let mut pending = PendingAcquire {
                locker: self,
                key: &key,
                owner,
                ttl: options.ttl,
                armed: true,
            };
            let request = AcquireRequest::new(&key, owner, options.ttl, options.wait)
                .renewed(watched)
                .label(options.label)
                .mode(options.mode);
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
                // A semaphore reports its own caller's wait as one, whatever its parts found.
                if let Part::Whole = part {
                    tracing::debug!(%key, waited = ?started.map(|at| at.elapsed()), "distributed_lock: busy");
                    metrics::busy(options.label, self.inner.store, started);
                }
                return Err(LockError::Busy { key });
            }
        };
        tracing::debug!(%key, fence = acquired.fence, waited = ?started.map(|at| at.elapsed()), "distributed_lock: acquired");
        let mut state = LeaseState::new(
            key,
            owner,
            acquired.fence,
            options.ttl,
            acquired.valid_from,
            self.id(),
        );
        state.mode = options.mode;
        if let Some(full_ttl) = full_ttl {
            state = state.ending_after(acquired.valid_from, full_ttl);
        }
        if !options.hold_at_least.is_zero() {
            // Counted from now, when the grant is known: `valid_from` may be an instant made up
            // to schedule the first renewal (a Redis hand-off), long before the grant.
            state.hold = Instant::now().checked_add(options.hold_at_least);
        }
        match part {
            Part::Whole => {
                state.held = metrics::Held::granted(options.label, self.inner.store, started);
            }
            Part::Permit { shown_len, .. } => {
                state.shown_len = shown_len;
                state.held = metrics::Held::granted(options.label, self.inner.store, started);
            }
            Part::Quiet => {}
        }
        let state = Arc::new(state);
        if self.inner.holdings.register(&state).is_err() {
            // Shut down while the acquisition was in flight: give the key back at once, whatever
            // its hold (nothing ran under it).
            state.mark_released();
            self.queue_ending(state.key.clone(), state.owner, release::Ending::Release);
            return Err(LockError::ShutDown);
        }
        if expires_when_lost {
            // Before the watchdog can find it lost.
            self.expire_when_lost(&state);
        }
        if watched {
            self.inner.watchdog.watch(&state, acquired.valid_from);
        }
        if let Some(ttl) = expires_after {
            // Nothing on the store ends it when its ttl runs out: the locker does.
            self.expire_at(&state, acquired.valid_from + ttl);
        }
        Ok(state)
    }
}

/// What one acquisition of a key is to its caller. A semaphore is made of several acquisitions
/// of keys of its own (`semaphore`), which its caller must see as one.
#[derive(Clone, Copy)]
enum Part {
    /// A lease as its caller asked for it: a mutex's, counted in the metrics.
    Whole,
    /// A semaphore's turnstile: the metrics count it nowhere, as its caller asked for a permit.
    Quiet,
    /// A try for one of a semaphore's permits, whose caller began at `started` (the metrics'
    /// clock reading) and knows the lease by the first `shown_len` bytes of its key. Counted
    /// as that caller's acquisition if granted; a busy try is not the caller's answer.
    Permit {
        shown_len: usize,
        started: Option<Instant>,
    },
}

fn check_key_length(key: &str) -> Result<(), LockError> {
    if key.len() <= Locker::MAX_KEY_BYTES {
        return Ok(());
    }
    Err(LockError::InvalidKey {
        key: key_start(key),
        reason: format!(
            "{} bytes long; keys may be at most {} bytes",
            key.len(),
            Locker::MAX_KEY_BYTES
        ),
    })
}

/// The start of a runaway `key`, for an error that names it: repeating the whole key would only
/// move the problem into the logs.
fn key_start(key: &str) -> String {
    let mut shown = 64.min(key.len());
    while !key.is_char_boundary(shown) {
        shown -= 1;
    }
    format!("{}…", &key[..shown])
}

impl std::fmt::Debug for Locker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Locker")
            .field(&self.inner.description)
            .finish()
    }
}
