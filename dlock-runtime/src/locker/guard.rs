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
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// # let locker = dlock::Locker::memory();
    /// let lease = locker.lock("acct:42", dlock::LockOptions::new()).await?;
    /// assert_eq!(lease.key(), "acct:42");
    /// # Ok(()) }
    /// ```
    pub fn key(&self) -> &str {
        self.state.shown_key()
    }

    /// The fencing token of this acquisition: greater than that of every earlier acquisition of
    /// the key. Pass it with each write the lock protects, and let the store reject a write whose
    /// fence is lower than one it has seen.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// # let locker = dlock::Locker::memory();
    /// use dlock::LockOptions;
    ///
    /// let first = locker.lock("stock:sku-1", LockOptions::new()).await?;
    /// let first_fence = first.fence();
    /// first.release().await?;
    /// let next = locker.lock("stock:sku-1", LockOptions::new()).await?;
    /// assert!(next.fence() > first_fence);
    /// // UPDATE stock SET units = ?, fence = ? WHERE sku = ? AND fence < ?  -- with next.fence()
    /// # Ok(()) }
    /// ```
    pub fn fence(&self) -> u64 {
        self.state.fence
    }

    /// The owner token this lease is stored under: what the store shows as the key's holder (in
    /// Redis, the value of the lock's key), handy when reading the store by hand.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// # let locker = dlock::Locker::memory();
    /// let lease = locker.lock("acct:42", dlock::LockOptions::new()).await?;
    /// println!("acct:42 is held by {}", lease.owner()); // 32 hex digits
    /// # Ok(()) }
    /// ```
    pub fn owner(&self) -> Owner {
        self.state.owner
    }

    /// Whether the lease is still held by the client's reckoning: not released, not lost, and
    /// within its validity. Check it before a step that must not run on a lost lease.
    ///
    /// The validity is reckoned on the monotonic clock ([`Instant`](std::time::Instant)), which
    /// does not count time the host spends suspended (a laptop asleep, a virtual machine
    /// paused): just after a resume, a lease the store let expire meanwhile can still read as
    /// held here, until its next renewal is refused. Pass [`fence`](Self::fence) with the writes
    /// the lock protects: the store of those writes refuses a stale holder's.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// # let locker = dlock::Locker::memory();
    /// let lease = locker.lock("report:2026-11", dlock::LockOptions::new()).await?;
    /// if lease.is_held() {
    ///     // … commit the report …
    /// }
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        self.state.is_held()
    }

    /// Resolves when the lease is lost (a renewal refused or not confirmed in time, or the ttl
    /// run out without renewal). Never resolves for a lease that stays held. Race it against the
    /// work the lease protects, to stop that work when the lease goes.
    ///
    /// # Errors
    ///
    /// None: the future's output is `()`. Loss is judged on the client's clock, so it resolves
    /// even while the store cannot be reached (that clock stops while the host is suspended:
    /// see [`is_held`](Self::is_held)).
    ///
    /// # Cancel safety
    ///
    /// Dropping it does nothing to the lease. Calling it again, in each turn of a `select!` loop
    /// say, misses nothing: a lease lost already resolves the new future at once.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// # let locker = dlock::Locker::memory();
    /// use std::time::Duration;
    ///
    /// let lease = locker.lock("rebuild-index", dlock::LockOptions::new()).await?;
    /// let rebuild = tokio::time::sleep(Duration::from_millis(10)); // the real work here
    /// tokio::select! {
    ///     () = rebuild => lease.release().await?,
    ///     () = lease.lost() => eprintln!("lease lost: the index rebuild stopped halfway"),
    /// }
    /// # Ok(()) }
    /// ```
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
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// # let locker = dlock::Locker::memory();
    /// let lease = locker.lock("acct:42", dlock::LockOptions::new()).await?;
    /// // … the work the lock protects …
    /// lease.release().await?; // the key is free once this returns
    /// assert!(locker.lock("acct:42", dlock::LockOptions::new()).await.is_ok());
    /// # Ok(()) }
    /// ```
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
            .field("key", &self.state.shown_key())
            .field("fence", &self.state.fence)
            .field("held", &self.is_held())
            .finish()
    }
}
