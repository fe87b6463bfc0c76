//! The small trait a store implements, and the stores.
//!
//! A backend knows nothing of macros, re-entrancy or watchdogs: it acquires a key for an owner
//! with a ttl (waiting for it when asked), releases and renews where the stored owner matches,
//! and says which fence each acquisition got. Everything else is the runtime's.
//!
//! | store | type | cargo feature | URL for [`Locker::connect`](crate::Locker::connect) |
//! | --- | --- | --- | --- |
//! | in-process | `MemoryBackend` | `memory` (default) | `memory://` |
//! | Redis, Redis Cluster | `RedisBackend` | `redis` (default), `redis-cluster`, `redis-tls` | `redis://`, `rediss://`, `redis+cluster://` |
//! | MySQL / MariaDB | `MysqlBackend` | `mysql` | `mysql://` |
//! | PostgreSQL | `PostgresBackend` | `postgres` | `postgres://`, `postgresql://` |
//! | ZooKeeper | `ZookeeperBackend` | `zookeeper` | `zk://` |
//! | etcd | `EtcdBackend` | `etcd` | `etcd://` |
//!
//! Each store but memory has a builder for the options a URL does not carry, from
//! `XBackend::builder(url)?`; the backend it builds goes to
//! [`Locker::with_backend`](crate::Locker::with_backend):
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
//! use std::time::Duration;
//! use dlock::{backend::RedisBackend, Locker};
//!
//! let backend = RedisBackend::builder("redis://:secret@10.0.0.7:6379")?
//!     .key_prefix("orders:")
//!     .connect_timeout(Duration::from_secs(1))
//!     .connect()
//!     .await?;
//! let locker = Locker::with_backend(backend);
//! # Ok(()) }
//! ```

use std::future::Future;
use std::time::Duration;

use crate::{KeyState, LockError, Owner};

#[cfg(any(
    feature = "zookeeper",
    feature = "mysql",
    feature = "postgres",
    feature = "etcd"
))]
mod claim;
#[cfg(any(
    feature = "zookeeper",
    feature = "mysql",
    feature = "postgres",
    feature = "etcd"
))]
mod description;
#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "etcd")]
pub use etcd::{
    EtcdBackend, EtcdBuilder, DEFAULT_CLAIM_WINDOW as ETCD_DEFAULT_CLAIM_WINDOW,
    DEFAULT_LEASE_TTL as ETCD_DEFAULT_LEASE_TTL, DEFAULT_ROOT as ETCD_DEFAULT_ROOT,
};
mod dyn_backend;
#[cfg(feature = "memory")]
mod memory;
#[cfg(feature = "memory")]
pub use memory::MemoryBackend;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "postgres")]
pub use postgres::{PostgresBackend, PostgresBuilder, MAX_KEY_BYTES as POSTGRES_MAX_KEY_BYTES};
#[cfg(any(feature = "mysql", feature = "postgres"))]
mod sql;
#[cfg(feature = "mysql")]
pub use mysql::{MysqlBackend, MysqlBuilder, MAX_KEY_BYTES as MYSQL_MAX_KEY_BYTES};
#[cfg(feature = "zookeeper")]
mod zookeeper;
#[cfg(feature = "zookeeper")]
pub use zookeeper::{
    ZookeeperBackend, ZookeeperBuilder, DEFAULT_CLAIM_WINDOW as ZOOKEEPER_DEFAULT_CLAIM_WINDOW,
    DEFAULT_ROOT as ZOOKEEPER_DEFAULT_ROOT,
    DEFAULT_SESSION_TIMEOUT as ZOOKEEPER_DEFAULT_SESSION_TIMEOUT,
    DEFAULT_TICK_TIME as ZOOKEEPER_DEFAULT_TICK_TIME, MAX_PATH_BYTES as ZOOKEEPER_MAX_PATH_BYTES,
};

#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redis")]
pub use self::redis::{RedisBackend, RedisBuilder, MAX_KEY_BYTES as REDIS_MAX_KEY_BYTES};

mod request;
pub(crate) use dyn_backend::DynBackend;
#[cfg(any(
    feature = "memory",
    feature = "redis",
    feature = "mysql",
    feature = "postgres"
))]
pub(crate) use request::wait_deadline;
pub use request::{AcquireRequest, Acquired, Renewal};

/// A store that can hold leases.
///
/// Implementations must make `release` and `renew` take effect only where the stored owner equals
/// the given one, atomically on the store, and judge expiry by the store's clock.
///
/// Written as `fn … -> impl Future + Send`, so an implementation may write `async fn` (its
/// future must then be `Send`). Implement it to add a store, or to wrap one — to count, log or
/// time its calls. A wrapper forwards every method, the provided ones too: left to their
/// defaults, `undo_acquire` would lose what a store does beyond a release (Redis's guard against
/// a late copy of the acquisition), `renew_each` would lose a cluster's per-node answers, `ttl_limit` would lift the
/// store's cap on the ttl, `close` would leave connections open at shutdown, `release_now`
/// would queue releases an in-process store makes at once, `inspect` and `list` would
/// answer that the store cannot tell its holders, `force_release` that it cannot evict one, and `shares_reads` that it has no readers.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use std::time::Duration;
/// use dlock::backend::{AcquireRequest, Acquired, Backend, MemoryBackend, Renewal};
/// use dlock::{KeyState, LockError, LockOptions, Locker, Owner};
///
/// /// Counts the acquisitions that found their key busy, for a metrics endpoint.
/// struct CountBusy<B> {
///     store: B,
///     busy: Arc<AtomicU64>,
/// }
///
/// impl<B: Backend> Backend for CountBusy<B> {
///     async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Option<Acquired>, LockError> {
///         let acquired = self.store.acquire(request).await?;
///         if acquired.is_none() {
///             self.busy.fetch_add(1, Ordering::Relaxed);
///         }
///         Ok(acquired)
///     }
///
///     async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
///         self.store.release(key, owner).await
///     }
///
///     async fn undo_acquire(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
///         self.store.undo_acquire(key, owner).await
///     }
///
///     async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
///         self.store.renew(leases).await
///     }
///
///     async fn renew_each(&self, leases: &[Renewal<'_>]) -> Result<Vec<Option<bool>>, LockError> {
///         self.store.renew_each(leases).await
///     }
///
///     fn ttl_limit(&self) -> Option<Duration> {
///         self.store.ttl_limit()
///     }
///
///     async fn close(&self) {
///         self.store.close().await
///     }
///
///     fn release_now(&self, key: &str, owner: Owner) -> bool {
///         self.store.release_now(key, owner)
///     }
///
///     async fn inspect(&self, key: &str) -> Result<KeyState, LockError> {
///         self.store.inspect(key).await
///     }
///
///     async fn list(&self, prefix: &str) -> Result<Vec<String>, LockError> {
///         self.store.list(prefix).await
///     }
///
///     async fn force_release(&self, key: &str, owner: Owner) -> Result<Option<u64>, LockError> {
///         self.store.force_release(key, owner).await
///     }
///
///     fn shares_reads(&self) -> bool {
///         self.store.shares_reads()
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// let busy = Arc::new(AtomicU64::new(0));
/// let locker = Locker::with_backend(CountBusy { store: MemoryBackend::new(), busy: busy.clone() });
/// let _held = locker.lock("acct:42", LockOptions::new()).await?;
/// assert!(locker.lock("acct:42", LockOptions::new()).await.is_err());
/// assert_eq!(busy.load(Ordering::Relaxed), 1);
/// # Ok(()) }
/// ```
pub trait Backend: Send + Sync + 'static {
    /// Acquires `request.key` for `request.owner`, waiting up to `request.wait` for it to be
    /// released. Waiting is the backend's: it is woken by the release where the store can say so
    /// (a notification, a watch), and polls with back-off only where it cannot. `Ok(None)` means
    /// the key was still busy when the wait ran out.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidKey`] for a key the store cannot hold (too long for it, say);
    /// [`LockError::InvalidOptions`] for a ttl beyond [`ttl_limit`](Self::ttl_limit); with
    /// either, nothing of the request may be left on the store, as the runtime undoes nothing.
    /// [`LockError::Backend`] where the store failed, or cannot say whether it
    /// granted the key (a lost reply): the runtime then undoes the acquisition with
    /// [`undo_acquire`](Self::undo_acquire) for the owner, which the owner check makes harmless
    /// if it was not granted. A busy key is `Ok(None)`, not an error.
    ///
    /// # Cancel safety
    ///
    /// The runtime drops this future when its caller gives up (a time-out, a `select!`). The
    /// backend must then leave no waiting state behind that blocks others (a place in a queue).
    /// A key granted to the dropped call is given back by the runtime, with
    /// [`undo_acquire`](Self::undo_acquire) for the same owner, and that undo may reach the
    /// store before the grant: a store that can apply the two out of order must make the late
    /// grant take no effect, or undo it itself.
    fn acquire(
        &self,
        request: &AcquireRequest<'_>,
    ) -> impl Future<Output = Result<Option<Acquired>, LockError>> + Send;

    /// Releases `key` where `owner` holds it; `Ok(false)` where it does not (any more). Wakes the
    /// key's waiters.
    ///
    /// # Errors
    ///
    /// [`LockError::Backend`] where the store failed: the runtime reports it to the caller of
    /// [`Lease::release`](crate::Lease::release), and the key stays held until its ttl runs
    /// out. A key `owner` does not hold is `Ok(false)`, not an error.
    ///
    /// # Cancel safety
    ///
    /// A release whose caller stops waiting is sent again from the runtime's background, and a
    /// shutdown sends again a release still in flight, so a key may be released twice for one
    /// owner: the second answers `Ok(false)` and changes nothing. Given up after 10 s. Sent from
    /// the background it runs on the one thread that also renews every lease: it must never
    /// block that thread.
    fn release(
        &self,
        key: &str,
        owner: Owner,
    ) -> impl Future<Output = Result<bool, LockError>> + Send;

    /// Undoes an acquisition of `key` for `owner` that went unanswered: its future was dropped,
    /// or it failed without saying whether the store granted the key (a lost reply, a time-out).
    /// Releases `key` where `owner` holds it, as [`release`](Self::release) does, and answers
    /// the same; besides, a copy of that acquisition still on its way to the store (sent again
    /// after a lost reply, held up on a connection this undo overtook) is to take no effect when
    /// it arrives, whether or not this undo found the key granted. The default calls `release`,
    /// which is enough for a store that applies an owner's calls in the order they were sent.
    ///
    /// # Errors
    ///
    /// As [`release`](Self::release): the key, if it was granted, then stays held until its ttl
    /// runs out.
    ///
    /// # Cancel safety
    ///
    /// As [`release`](Self::release).
    fn undo_acquire(
        &self,
        key: &str,
        owner: Owner,
    ) -> impl Future<Output = Result<bool, LockError>> + Send {
        self.release(key, owner)
    }

    /// Renews every lease of `leases` in as few round trips as the store allows (ideally one),
    /// answering for each whether its owner still held it: `true` extends the lease to its ttl
    /// from now, `false` means it was lost.
    ///
    /// # Errors
    ///
    /// [`LockError::Backend`] where the store could answer for no lease: the runtime then
    /// judges each lease by its own deadline on the client's clock, and tries again soon.
    ///
    /// # Cancel safety
    ///
    /// The watchdog drops a renewal not answered while some lease of it is still valid, and
    /// sends another. A dropped renewal may still reach the store, which is harmless where
    /// renewal is owner-checked: it extends nobody else's lease.
    fn renew(
        &self,
        leases: &[Renewal<'_>],
    ) -> impl Future<Output = Result<Vec<bool>, LockError>> + Send;

    /// Renews like [`renew`](Self::renew), answering for each lease on its own: `Some(held)`
    /// where the store answered for that lease, `None` where it could not confirm it this round
    /// (the part of the store that holds it failed: the lease is judged by its deadline, as
    /// after a failed call, and renewed again soon). A store made of parts (a cluster's nodes)
    /// implements it so that one part down does not cost the leases on the others; the default,
    /// for stores that answer all or nothing, calls `renew`. The watchdog calls this one.
    ///
    /// # Errors
    ///
    /// [`LockError::Backend`] where it could answer for no lease, as [`renew`](Self::renew).
    ///
    /// # Cancel safety
    ///
    /// As [`renew`](Self::renew).
    fn renew_each(
        &self,
        leases: &[Renewal<'_>],
    ) -> impl Future<Output = Result<Vec<Option<bool>>, LockError>> + Send {
        async move { Ok(self.renew(leases).await?.into_iter().map(Some).collect()) }
    }

    /// The longest ttl the store can keep its promise for, if it has such a limit: the runtime
    /// shortens a longer ttl to it before acquiring (a shorter lease is only renewed more
    /// often), and `acquire` may refuse a longer one with [`LockError::InvalidOptions`]. A
    /// lease whose caller asked for no renewal and a longer ttl is still renewed by the runtime
    /// (its request says [`renewed`](AcquireRequest::renewed)), at the shorter ttl's pace,
    /// until its own ttl runs out and no longer, so that it is held as long as asked. A store
    /// with a limit is taken not to expire a key at its ttl either: every lease without
    /// renewal on it, whatever its ttl, is released by the runtime when that ttl runs out, as a
    /// store that keeps its ttl would expire it. `None` (the default) where any ttl is kept.
    fn ttl_limit(&self) -> Option<Duration> {
        None
    }

    /// Asks the store for one answer, for readiness probes
    /// ([`Locker::health`](crate::Locker::health)). The default releases a key for an owner that
    /// holds nothing, which is one owner-checked round trip that changes nothing; a store whose
    /// release can answer without I/O overrides it.
    fn health(&self) -> impl Future<Output = Result<(), LockError>> + Send {
        async {
            let probe = Owner::random();
            self.release("dlock:health-probe", probe).await.map(drop)
        }
    }

    /// Closes the store's connections, once the runtime has released every lease it held:
    /// [`Locker::shutdown`](crate::Locker::shutdown) calls it last. It may be called more than
    /// once. The default does nothing, for stores whose connections close when dropped.
    ///
    /// # Errors
    ///
    /// None: the output is `()`. A store that fails to close has nothing left to lose.
    ///
    /// # Cancel safety
    ///
    /// Dropped with the future of a `shutdown` whose caller stopped waiting: the connections
    /// then close when the backend itself is dropped, if not before.
    fn close(&self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Describes `key`: its holders (label, host, process id, owner, fence, when it was granted
    /// and how long it has left) and how many wait for it, for
    /// [`Locker::inspect`](crate::Locker::inspect). Reads only: it changes nothing and waits for
    /// nothing on the store.
    ///
    /// # Errors
    ///
    /// The default answers [`LockError::Unsupported`] ("this store cannot list its holders"), so
    /// that a store written before this method keeps compiling. [`LockError::Backend`] where
    /// the store failed.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// use std::time::Duration;
    /// use dlock::backend::{AcquireRequest, Backend, MemoryBackend};
    /// use dlock::Owner;
    ///
    /// let store = MemoryBackend::new();
    /// let owner = Owner::random();
    /// let request = AcquireRequest::new("acct:42", owner, Duration::from_secs(5), Duration::ZERO).label("billing");
    /// let fence = store.acquire(&request).await?.expect("free").fence;
    /// let state = store.inspect("acct:42").await?;
    /// assert_eq!((state.holders()[0].owner(), state.holders()[0].fence()), (owner, fence));
    /// assert_eq!(state.holders()[0].label(), "billing");
    /// # Ok(()) }
    /// ```
    fn inspect(&self, key: &str) -> impl Future<Output = Result<KeyState, LockError>> + Send {
        let _ = key;
        async {
            Err(LockError::Unsupported {
                what: "list its holders".into(),
            })
        }
    }

    /// The keys held now whose name starts with `prefix` (every held key for `""`), for
    /// [`Locker::list`](crate::Locker::list). Never blocks the store: a server walks its keys a
    /// batch at a time, so a key taken or released meanwhile may or may not be listed.
    ///
    /// # Errors
    ///
    /// The default answers [`LockError::Unsupported`] ("this store cannot list its held keys").
    /// [`LockError::Backend`] where the store failed.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// use std::time::Duration;
    /// use dlock::backend::{AcquireRequest, Backend, MemoryBackend};
    /// use dlock::Owner;
    ///
    /// let store = MemoryBackend::new();
    /// for key in ["acct:1", "job:1"] {
    ///     store.acquire(&AcquireRequest::new(key, Owner::random(), Duration::from_secs(5), Duration::ZERO)).await?;
    /// }
    /// assert_eq!(store.list("acct:").await?, ["acct:1"]);
    /// # Ok(()) }
    /// ```
    fn list(&self, prefix: &str) -> impl Future<Output = Result<Vec<String>, LockError>> + Send {
        let _ = prefix;
        async {
            Err(LockError::Unsupported {
                what: "list its held keys".into(),
            })
        }
    }

    /// Releases `key` where `owner` holds it, for operators (`dlock release --force`, through
    /// [`Locker::force_release`](crate::Locker::force_release)): the holder's owner is not
    /// asked for its consent, but it must be the one given, as an operator read it with
    /// [`inspect`](Self::inspect). The key goes to its first live waiter, as on a release, or is
    /// freed where nobody waits. Answers the evicted holder's fence, or `None` where `owner`
    /// does not hold the key (nobody does, or someone else does: nothing is changed then).
    ///
    /// The owner check is what makes the call safe to send again (after a timeout or a dropped
    /// connection): a second copy finds the key no longer `owner`'s (it went to a waiter, or is
    /// free) and changes nothing. Without it, the copy would evict the waiter the first one
    /// handed the key to; and an operator's confirmation would evict whoever holds the key by
    /// then, not the holder it was shown.
    ///
    /// The evicted holder is not told: its next renewal is refused, so its lease is lost (a
    /// lease that does not renew has no renewal to tell it, and may learn of it only at its own
    /// ttl). A store implementing this
    /// must make the next grant's fence greater than the evicted one, so that the evicted
    /// holder's fenced writes are rejected.
    ///
    /// # Errors
    ///
    /// The default answers [`LockError::Unsupported`] ("this store cannot release a key whoever
    /// holds it"), so that a store written before this method keeps compiling.
    /// [`LockError::Backend`] where the store failed.
    fn force_release(
        &self,
        key: &str,
        owner: Owner,
    ) -> impl Future<Output = Result<Option<u64>, LockError>> + Send {
        let _ = (key, owner);
        async {
            Err(LockError::Unsupported {
                what: "release a key whoever holds it".into(),
            })
        }
    }

    /// Whether the store takes a key for readers ([`AcquireRequest::mode`] is
    /// [`Mode::Read`](crate::Mode::Read)): any number of readers at once, each with a lease of
    /// its own, while no writer holds the key; a writer (every request without a mode) alone.
    /// Waiters are served in arrival order, a reader behind a waiting writer included, and
    /// `release`, `renew`, `undo_acquire`, `expire_after` and `force_release` act on the lease
    /// of the owner named, whichever the others. `false` (the default) makes a read acquisition
    /// fail with [`LockError::Unsupported`] before it asks the store anything.
    ///
    /// ```
    /// use dlock::backend::{Backend, MemoryBackend};
    /// assert!(MemoryBackend::new().shares_reads());
    /// ```
    fn shares_reads(&self) -> bool {
        false
    }

    /// Whether [`expire_after`](Self::expire_after) keeps its promise: the store expires a key by
    /// itself at the time it sets, whatever becomes of this process. `false` (the default)
    /// makes a [`LockOptions::hold_at_least`](crate::LockOptions::hold_at_least) acquisition
    /// fail with [`LockError::Unsupported`] before it asks the store anything.
    fn expires_at_a_set_time(&self) -> bool {
        false
    }

    /// Makes `owner`'s lease of `key` expire `after` from now by the store's clock, exactly:
    /// sooner or later than it would have. It is not renewed again: this is how a lease held
    /// [`at least`](crate::LockOptions::hold_at_least) some time after its grant ends, when its
    /// holder is done sooner. `false` where `owner` no longer holds the key (nothing is changed
    /// then).
    ///
    /// # Errors
    ///
    /// The default answers [`LockError::Unsupported`]; a store that implements it says so with
    /// [`expires_at_a_set_time`](Self::expires_at_a_set_time). [`LockError::Backend`] where the
    /// store failed.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// use std::time::Duration;
    /// use dlock::backend::{AcquireRequest, Backend, MemoryBackend};
    /// use dlock::Owner;
    ///
    /// let store = MemoryBackend::new();
    /// let owner = Owner::random();
    /// let request = AcquireRequest::new("job", owner, Duration::from_secs(30), Duration::ZERO);
    /// store.acquire(&request).await?.expect("free");
    /// assert!(store.expire_after("job", owner, Duration::from_millis(20)).await?);
    /// tokio::time::sleep(Duration::from_millis(30)).await;
    /// assert!(!store.inspect("job").await?.is_held());
    /// # Ok(()) }
    /// ```
    fn expire_after(
        &self,
        key: &str,
        owner: Owner,
        after: Duration,
    ) -> impl Future<Output = Result<bool, LockError>> + Send {
        let _ = (key, owner, after);
        async {
            Err(LockError::Unsupported {
                what: "expire a key by itself at a set time".into(),
            })
        }
    }

    /// Releases at once without awaiting, where the store lives in this process. Returns `false`
    /// where a release needs I/O; the runtime then queues an async `release` instead. `Drop`
    /// calls this, so it must never block.
    fn release_now(&self, key: &str, owner: Owner) -> bool {
        let _ = (key, owner);
        false
    }
}
