//! [`Backend`] made object-safe, so one `Locker` type serves every store.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::{AcquireRequest, Acquired, Backend, Renewal};
use crate::{KeyState, LockError, Owner};

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// [`Backend`] made object-safe, so one `Locker` type serves every store.
pub(crate) trait DynBackend: Send + Sync + 'static {
    fn acquire<'a>(
        &'a self,
        request: &'a AcquireRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<Acquired>, LockError>>;
    fn release<'a>(&'a self, key: &'a str, owner: Owner) -> BoxFuture<'a, Result<bool, LockError>>;
    fn undo_acquire<'a>(
        &'a self,
        key: &'a str,
        owner: Owner,
    ) -> BoxFuture<'a, Result<bool, LockError>>;
    fn renew_each<'a>(
        &'a self,
        leases: &'a [Renewal<'a>],
    ) -> BoxFuture<'a, Result<Vec<Option<bool>>, LockError>>;
    fn release_now(&self, key: &str, owner: Owner) -> bool;
    fn ttl_limit(&self) -> Option<Duration>;
    fn close(&self) -> BoxFuture<'_, ()>;
    fn health(&self) -> BoxFuture<'_, Result<(), LockError>>;
    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<KeyState, LockError>>;
    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<String>, LockError>>;
    fn force_release<'a>(
        &'a self,
        key: &'a str,
        owner: Owner,
    ) -> BoxFuture<'a, Result<Option<u64>, LockError>>;
    fn expires_at_a_set_time(&self) -> bool;
    fn shares_reads(&self) -> bool;
    fn expire_after<'a>(
        &'a self,
        key: &'a str,
        owner: Owner,
        after: Duration,
    ) -> BoxFuture<'a, Result<bool, LockError>>;
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

    fn undo_acquire<'a>(
        &'a self,
        key: &'a str,
        owner: Owner,
    ) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(Backend::undo_acquire(self, key, owner))
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

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<KeyState, LockError>> {
        Box::pin(Backend::inspect(self, key))
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<String>, LockError>> {
        Box::pin(Backend::list(self, prefix))
    }

    fn force_release<'a>(
        &'a self,
        key: &'a str,
        owner: Owner,
    ) -> BoxFuture<'a, Result<Option<u64>, LockError>> {
        Box::pin(Backend::force_release(self, key, owner))
    }

    fn expires_at_a_set_time(&self) -> bool {
        Backend::expires_at_a_set_time(self)
    }

    fn shares_reads(&self) -> bool {
        Backend::shares_reads(self)
    }

    fn expire_after<'a>(
        &'a self,
        key: &'a str,
        owner: Owner,
        after: Duration,
    ) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(Backend::expire_after(self, key, owner, after))
    }
}
