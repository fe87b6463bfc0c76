//! The small trait a store implements, and the stores.
//!
//! A backend knows nothing of macros, re-entrancy or watchdogs: it acquires a key for an owner
//! with a ttl (waiting for it when asked), releases and renews where the stored owner matches,
//! and says which fence each acquisition got. Everything else is the runtime's.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use crate::{LockError, Owner};

#[cfg(feature = "memory")]
mod memory;
#[cfg(feature = "memory")]
pub use memory::MemoryBackend;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "mysql")]
pub use mysql::{MysqlBackend, MysqlBuilder, MAX_KEY_BYTES as MYSQL_MAX_KEY_BYTES};
#[cfg(feature = "zookeeper")]
mod zookeeper;
#[cfg(feature = "zookeeper")]
pub use zookeeper::{
    ZookeeperBackend, ZookeeperBuilder, DEFAULT_ROOT as ZOOKEEPER_DEFAULT_ROOT,
    DEFAULT_SESSION_TIMEOUT as ZOOKEEPER_DEFAULT_SESSION_TIMEOUT,
    DEFAULT_TICK_TIME as ZOOKEEPER_DEFAULT_TICK_TIME, MAX_PATH_BYTES as ZOOKEEPER_MAX_PATH_BYTES,
};

#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redis")]
pub use self::redis::{RedisBackend, RedisBuilder, MAX_KEY_BYTES as REDIS_MAX_KEY_BYTES};

/// One acquisition asked of a backend.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct AcquireRequest<'a> {
    /// The rendered key.
    pub key: &'a str,
    /// The token the key is to be stored under.
    pub owner: Owner,
    /// Lease length, judged by the store's clock.
    pub ttl: Duration,
    /// How long to wait for a busy key; zero tries once.
    pub wait: Duration,
}

/// A granted acquisition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    /// A fencing token greater than every earlier one of this key.
    pub fence: u64,
    /// A client instant no later than the moment the store started the lease's ttl: the client
    /// counts the lease's validity from here, which can only err on the safe side.
    pub valid_from: Instant,
}

/// One lease to renew.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Renewal<'a> {
    /// The rendered key.
    pub key: &'a str,
    /// The owner the lease was acquired with.
    pub owner: Owner,
    /// The lease length to extend to, from now by the store's clock.
    pub ttl: Duration,
}

impl<'a> Renewal<'a> {
    /// A renewal of `key` for `owner` by `ttl`.
    pub fn new(key: &'a str, owner: Owner, ttl: Duration) -> Self {
        Renewal { key, owner, ttl }
    }
}

impl<'a> AcquireRequest<'a> {
    /// A request for `key` by `owner`.
    pub fn new(key: &'a str, owner: Owner, ttl: Duration, wait: Duration) -> Self {
        AcquireRequest {
            key,
            owner,
            ttl,
            wait,
        }
    }
}

/// A store that can hold leases.
///
/// Implementations must make `release` and `renew` take effect only where the stored owner equals
/// the given one, atomically on the store, and judge expiry by the store's clock.
pub trait Backend: Send + Sync + 'static {
    /// Acquires `request.key` for `request.owner`, waiting up to `request.wait` for it to be
    /// released. Waiting is the backend's: it is woken by the release where the store can say so
    /// (a notification, a watch), and polls with back-off only where it cannot. `Ok(None)` means
    /// the key was still busy when the wait ran out. If the returned future is dropped, the
    /// backend must leave no waiting state behind that blocks others.
    fn acquire(
        &self,
        request: &AcquireRequest<'_>,
    ) -> impl Future<Output = Result<Option<Acquired>, LockError>> + Send;

    /// Releases `key` where `owner` holds it; `Ok(false)` where it does not (any more). Wakes the
    /// key's waiters.
    fn release(
        &self,
        key: &str,
        owner: Owner,
    ) -> impl Future<Output = Result<bool, LockError>> + Send;

    /// Renews every lease of `leases` in as few round trips as the store allows (ideally one),
    /// answering for each whether its owner still held it.
    fn renew(
        &self,
        leases: &[Renewal<'_>],
    ) -> impl Future<Output = Result<Vec<bool>, LockError>> + Send;

    /// Renews like [`renew`](Self::renew), answering for each lease on its own: `Some(held)`
    /// where the store answered for that lease, `None` where it could not confirm it this round
    /// (the part of the store that holds it failed: the lease is judged by its deadline, as
    /// after a failed call, and renewed again soon). `Err` where it could answer for none. A
    /// store made of parts (a cluster's nodes) implements it so that one part down does not
    /// cost the leases on the others; the default, for stores that answer all or nothing, calls
    /// `renew`.
    fn renew_each(
        &self,
        leases: &[Renewal<'_>],
    ) -> impl Future<Output = Result<Vec<Option<bool>>, LockError>> + Send {
        async move { Ok(self.renew(leases).await?.into_iter().map(Some).collect()) }
    }

    /// The longest ttl the store can keep its promise for, if it has such a limit: the runtime
    /// shortens a longer ttl to it before acquiring (a shorter lease is only renewed more
    /// often), and `acquire` may refuse a longer one with [`LockError::InvalidOptions`]. `None`
    /// (the default) where any ttl is kept.
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
    fn close(&self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Releases at once without awaiting, where the store lives in this process. Returns `false`
    /// where a release needs I/O; the runtime then queues an async `release` instead. `Drop`
    /// calls this, so it must never block.
    fn release_now(&self, key: &str, owner: Owner) -> bool {
        let _ = (key, owner);
        false
    }
}

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// [`Backend`] made object-safe, so one `Locker` type serves every store.
pub(crate) trait DynBackend: Send + Sync + 'static {
    fn acquire<'a>(
        &'a self,
        request: &'a AcquireRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<Acquired>, LockError>>;
    fn release<'a>(&'a self, key: &'a str, owner: Owner) -> BoxFuture<'a, Result<bool, LockError>>;
    fn renew_each<'a>(
        &'a self,
        leases: &'a [Renewal<'a>],
    ) -> BoxFuture<'a, Result<Vec<Option<bool>>, LockError>>;
    fn release_now(&self, key: &str, owner: Owner) -> bool;
    fn ttl_limit(&self) -> Option<Duration>;
    fn close(&self) -> BoxFuture<'_, ()>;
    fn health(&self) -> BoxFuture<'_, Result<(), LockError>>;
}

impl<B: Backend> DynBackend for B {
    fn acquire<'a>(
        &'a self,
        request: &'a AcquireRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<Acquired>, LockError>> {
        Box::pin(Backend::acquire(self, request))
    }

    fn release<'a>(&'a self, key: &'a str, owner: Owner) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(Backend::release(self, key, owner))
    }

    fn renew_each<'a>(
        &'a self,
        leases: &'a [Renewal<'a>],
    ) -> BoxFuture<'a, Result<Vec<Option<bool>>, LockError>> {
        Box::pin(Backend::renew_each(self, leases))
    }

    fn release_now(&self, key: &str, owner: Owner) -> bool {
        Backend::release_now(self, key, owner)
    }

    fn ttl_limit(&self) -> Option<Duration> {
        Backend::ttl_limit(self)
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(Backend::close(self))
    }

    fn health(&self) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(Backend::health(self))
    }
}
