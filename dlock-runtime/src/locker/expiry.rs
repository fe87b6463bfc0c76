//! The end of a lease without renewal on a store with a ttl limit (see
//! [`Backend::ttl_limit`](crate::backend::Backend::ttl_limit)), whether the `Locker` shortened
//! its ttl (see [`LeaseState::ending_after`]) or not: such a store does not expire the key when
//! the ttl asked runs out (ZooKeeper keeps a lock node as long as its session), so the `Locker`
//! releases it then, as the expiry of a store that keeps any ttl would, whether or not its
//! holder still keeps the [`Lease`](super::Lease) or still runs a body under it. A lease
//! released sooner aborts its timer, so nothing of it stays behind.
//!
//! A renewed lease on such a store is released the same way once it is lost for want of a
//! confirmation (its renewals went unanswered, or were answered too late): a ttl after the
//! request behind its last confirmation was sent, when a store that keeps any ttl would have
//! expired it. Its session may well outlive the loss (a stall shorter than the session's
//! timeout), and its holder keep the `Lease` or run a body on under `on_lost = "continue"`
//! for long after it: without this, waiters in other processes would wait all that time for a
//! key held by nobody. Its timer is started by the loss, not at the acquisition, so a lease
//! that stays held costs no task.
//!
//! The release comes at the end of the whole ttl, not of the validity the client reckons (the
//! ttl less its safety margin): a body under `on_lost = "cancel"` still inside a poll keeps the
//! margin, as it would where the store expires the key. A body under `"continue"` runs on
//! without the key, as after any loss, and its release at the end, owner-checked, changes
//! nothing.

use std::sync::{Arc, Weak};
use std::time::Instant;

use super::Locker;
use crate::background;
use crate::lease::{LeaseState, LossCause};

impl Locker {
    /// Releases `state` on the store at `at`, unless it was released before: then the timer is
    /// aborted, so that a lease released long before its ttl leaves nothing behind. Holds
    /// neither the lease nor the locker meanwhile: a lease released sooner is dropped as usual,
    /// and a locker dropped sooner takes its leases with it.
    pub(super) fn expire_at(&self, state: &Arc<LeaseState>, at: Instant) {
        let inner = Arc::downgrade(&self.inner);
        let lease = Arc::downgrade(state);
        #[cfg(test)]
        let live = tests::Live::new();
        let timer = background::spawn_abortable(async move {
            #[cfg(test)]
            let _live = live;
            tokio::time::sleep_until(at.into()).await;
            let (Some(inner), Some(state)) = (inner.upgrade(), Weak::upgrade(&lease)) else {
                return;
            };
            // Not to be aborted by the release it makes.
            state.expiry_fired();
            if state.is_released() {
                return;
            }
            // Lost first: a released lease is never marked lost, and its holder is told.
            state.mark_lost(LossCause::Unconfirmed);
            let locker = Locker { inner };
            if locker.queue_release_of(&state) {
                tracing::debug!(key = %state.key, fence = state.fence, "distributed_lock: released as its ttl ran out");
            }
        });
        state.set_expiry(timer);
    }

    /// Has `state`, a renewed lease, released as [`expire_at`](Self::expire_at) does once it is
    /// lost for want of a confirmation, a ttl after its last confirmed request was sent. Holds
    /// neither the lease nor the locker until then.
    pub(super) fn expire_when_lost(&self, state: &Arc<LeaseState>) {
        let inner = Arc::downgrade(&self.inner);
        let lease = Arc::downgrade(state);
        state.release_when_lost(Box::new(move |at| {
            let (Some(inner), Some(state)) = (inner.upgrade(), lease.upgrade()) else {
                return;
            };
            Locker { inner }.expire_at(&state, at);
        }));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use crate::backend::{AcquireRequest, Acquired, Backend, MemoryBackend, Renewal};
    use crate::{LockError, LockOptions, Locker, Owner};

    /// How many expiry timers exist: spawned and not yet ended or dropped.
    static LIVE: AtomicUsize = AtomicUsize::new(0);

    /// Counts one expiry timer while it exists.
    pub(super) struct Live;

    impl Live {
        pub(super) fn new() -> Self {
            LIVE.fetch_add(1, Ordering::SeqCst);
            Live
        }
    }

    impl Drop for Live {
        fn drop(&mut self) {
            LIVE.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// The in-memory store, taking no ttl above a second, as ZooKeeper takes none above its
    /// session's limit.
    struct Limited(MemoryBackend);

    impl Backend for Limited {
        async fn acquire(
            &self,
            request: &AcquireRequest<'_>,
        ) -> Result<Option<Acquired>, LockError> {
            self.0.acquire(request).await
        }

        async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
            self.0.release(key, owner).await
        }

        async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
            self.0.renew(leases).await
        }

        fn ttl_limit(&self) -> Option<Duration> {
            Some(Duration::from_secs(1))
        }

        fn release_now(&self, key: &str, owner: Owner) -> bool {
            self.0.release_now(key, owner)
        }
    }

    /// A lease released before its ttl runs out leaves no timer behind: an hour-long ttl taken
    /// and given back a thousand times a second must not pile up timers for an hour. Nor does a
    /// renewed lease while it is held.
    #[tokio::test]
    async fn a_released_lease_leaves_no_timer() {
        let locker = Locker::with_backend(Limited(MemoryBackend::new()));
        let options = LockOptions::new()
            .ttl(Duration::from_secs(3600))
            .renew(false);
        for i in 0..200 {
            let lease = locker.lock(&format!("k{i}"), options).await.unwrap();
            lease.release().await.unwrap();
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while LIVE.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            LIVE.load(Ordering::SeqCst),
            0,
            "expiry timers alive after every lease was released"
        );

        // A renewed lease starts its timer only when it is lost for want of a confirmation:
        // renewed leases held on such a store cost no task each. (In the same test, as the
        // count of timers is the process's.)
        let options = LockOptions::new().ttl(Duration::from_secs(1));
        let mut leases = Vec::new();
        for i in 0..200 {
            leases.push(locker.lock(&format!("r{i}"), options).await.unwrap());
        }
        assert_eq!(
            LIVE.load(Ordering::SeqCst),
            0,
            "expiry timers started for renewed leases still held"
        );
        for lease in leases {
            assert!(lease.is_held());
            lease.release().await.unwrap();
        }
        assert_eq!(LIVE.load(Ordering::SeqCst), 0);
    }
}
