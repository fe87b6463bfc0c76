//! [`Lease`]: the guard of one held acquisition, which releases it on drop.

use std::future::Future;
use std::sync::Arc;

use super::Locker;
use crate::lease::LeaseState;
use crate::{LockError, Owner};

/// A held lease, from [`Locker::lock`]. Dropping it releases it (queued, without blocking);
/// [`release`](Self::release) releases it and waits for the store's answer.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// use std::time::Duration;
/// use dlock::{LockOptions, Locker};
///
/// let locker = Locker::memory();
/// let lease = locker.lock("report:2026-11", LockOptions::new().ttl(Duration::from_secs(5))).await?;
/// assert!(lease.is_held());
/// // … write the report, passing lease.fence() along with each write …
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "a lease is released as soon as it is dropped"]
pub struct Lease {
    pub(crate) state: Arc<LeaseState>,
    pub(crate) locker: Locker,
}

impl Lease {
    /// The key this lease holds.
    pub fn key(&self) -> &str {
        &self.state.key
    }

    /// The fencing token of this acquisition: greater than that of every earlier acquisition of
    /// the key. Pass it with each write the lock protects, and let the store reject a write whose
    /// fence is lower than one it has seen.
    pub fn fence(&self) -> u64 {
        self.state.fence
    }

    /// The owner token this lease is stored under.
    pub fn owner(&self) -> Owner {
        self.state.owner
    }

    /// Whether the lease is still held by the client's reckoning: not released, not lost, and
    /// within its validity.
    pub fn is_held(&self) -> bool {
        self.state.is_held()
    }

    /// Resolves when the lease is lost (a renewal refused or not confirmed in time, or the ttl
    /// run out without renewal). Never resolves for a lease that stays held.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + '_ {
        self.state.wait_lost()
    }

    /// Releases the lease and waits for the store to confirm. Releasing a lease that was lost is
    /// not an error: the key is no longer ours either way.
    ///
    /// # Errors
    ///
    /// [`LockError::Backend`] when the store did not confirm the release: the key then stays
    /// held until its ttl runs out (it is no longer renewed).
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped before the store answered, the release goes on in the
    /// background.
    pub async fn release(self) -> Result<(), LockError> {
        // Marks the state released first, so the `Drop` that follows queues nothing.
        self.locker.release(&self.state).await
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.locker.release_in_background(&self.state);
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.state.key)
            .field("fence", &self.state.fence)
            .field("held", &self.is_held())
            .finish()
    }
}
