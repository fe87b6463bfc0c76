//! What a `Locker` tells and does for operators and probes, rather than for the code it locks:
//! a health check, who holds a key, the held keys, and the eviction of a stuck holder.

use super::Locker;
use crate::{KeyState, LockError, Owner};

impl Locker {
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

    /// Who holds `key`, since when, for how long yet, and how many wait for it: the store's
    /// view, whichever process holds it. One read of the store (one round trip on Redis); it
    /// changes nothing and waits for nothing.
    ///
    /// # Errors
    ///
    /// [`LockError::Unsupported`] for a store that cannot tell its holders (a
    /// [`Backend`](crate::backend::Backend) of your own that does not implement
    /// [`inspect`](crate::backend::Backend::inspect); every store of dlock's can);
    /// [`LockError::Backend`] where the store failed; [`LockError::ShutDown`] after
    /// [`shutdown`](Self::shutdown).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::{LockOptions, Locker};
    ///
    /// let locker = Locker::memory();
    /// let lease = locker.lock("import:2026-11-30", LockOptions::new()).await?;
    /// let state = locker.inspect("import:2026-11-30").await?;
    /// for holder in state.holders() {
    ///     println!("{} held by pid {:?} on {:?} since {:?}", state.key(), holder.pid(), holder.host(), holder.acquired_at());
    /// }
    /// assert_eq!(state.holders()[0].fence(), lease.fence());
    /// assert_eq!(state.waiters(), 0);
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, key: &str) -> Result<KeyState, LockError> {
        if self.inner.holdings.is_closed() {
            return Err(LockError::ShutDown);
        }
        self.inner.backend.inspect(key).await
    }

    /// The keys held now that start with `prefix` (`""` for all), sorted, each once: names
    /// only, since a state read for each could be stale before it is printed — call
    /// [`inspect`](Self::inspect) for the keys of interest. Never blocks the store: Redis is
    /// walked with `SCAN`, a batch at a time, and the SQL stores read their table 1,000 keys
    /// to a statement, so a key taken or released during the walk may or may not be listed.
    ///
    /// # Errors
    ///
    /// [`LockError::Unsupported`] for a store that cannot list its keys (a [`Backend`](crate::backend::Backend) of your
    /// own that does not implement [`list`](crate::backend::Backend::list));
    /// [`LockError::Backend`] where the store failed; [`LockError::ShutDown`] after
    /// [`shutdown`](Self::shutdown).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::{LockOptions, Locker};
    ///
    /// let locker = Locker::memory();
    /// let _a = locker.lock("acct:1", LockOptions::new()).await?;
    /// let _b = locker.lock("acct:2", LockOptions::new()).await?;
    /// let _c = locker.lock("job:1", LockOptions::new()).await?;
    /// assert_eq!(locker.list("acct:").await?, ["acct:1", "acct:2"]);
    /// # Ok(()) }
    /// ```
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        if self.inner.holdings.is_closed() {
            return Err(LockError::ShutDown);
        }
        let mut keys = self.inner.backend.list(prefix).await?;
        keys.sort_unstable();
        keys.dedup();
        Ok(keys)
    }

    /// Releases `key` where `owner` holds it, for operators (it is what `dlock release --force`
    /// does): a stuck holder, a process that hangs with its lease renewed. `owner` is the
    /// holder's as [`inspect`](Self::inspect) showed it ([`Holder::owner`](crate::Holder::owner)):
    /// where the key changed hands since (the holder released it, another took it), nothing is
    /// changed and the answer is `None`, so a confirmation never evicts a holder nobody was
    /// shown, and a call the client sends again (after a timeout or a dropped connection) never
    /// evicts the waiter the first copy handed the key to. The key goes to its first waiter, as
    /// on a release. Answers the evicted holder's fence, or `None` where `owner` did not hold the
    /// key.
    ///
    /// The holder is not asked. Its next renewal is refused, so its [`Lease`](crate::Lease) reports the loss
    /// ([`Lease::lost`](crate::Lease::lost) resolves, a body under `on_lost = "cancel"` stops) within a renewal
    /// period; until then it may still be running. A lease that does not renew
    /// ([`LockOptions::renew`](crate::LockOptions::renew) `false`) has no renewal to tell it: it
    /// may learn of the loss only at its own ttl (on ZooKeeper its session's checks notice
    /// sooner). What protects the data meanwhile is the fence: the next
    /// grant's is greater than the evicted one, so a store that checks fences rejects the
    /// evicted holder's writes.
    ///
    /// The evicted fence is what the store recorded for the holder; a holder written into the
    /// store by hand, with no fence that dlock can read, answers `Some(0)`: evicted, fence
    /// unknown.
    ///
    /// # Errors
    ///
    /// [`LockError::Unsupported`] for a store that cannot do it (every store of dlock's can);
    /// [`LockError::Backend`] where the store failed; [`LockError::ShutDown`] after
    /// [`shutdown`](Self::shutdown).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// use std::time::Duration;
    /// use dlock::{LockOptions, Locker};
    ///
    /// let locker = Locker::memory();
    /// let stuck = locker.lock("nightly-report", LockOptions::new().ttl(Duration::from_secs(3))).await?;
    /// let holder = locker.inspect("nightly-report").await?.holders()[0].owner();
    /// assert_eq!(locker.force_release("nightly-report", holder).await?, Some(stuck.fence()));
    /// stuck.lost().await; // at its next renewal
    /// let next = locker.lock("nightly-report", LockOptions::new()).await?;
    /// assert!(next.fence() > stuck.fence());
    /// // Sent again, or confirmed late: `holder` no longer holds the key, and `next` keeps it.
    /// assert_eq!(locker.force_release("nightly-report", holder).await?, None);
    /// assert!(next.is_held());
    /// # Ok(()) }
    /// ```
    pub async fn force_release(&self, key: &str, owner: Owner) -> Result<Option<u64>, LockError> {
        if self.inner.holdings.is_closed() {
            return Err(LockError::ShutDown);
        }
        self.inner.backend.force_release(key, owner).await
    }
}
