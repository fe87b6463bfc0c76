//! The end of a lease without renewal whose ttl the store shortened (see
//! [`LeaseState::ending_after`]): such a store does not expire the key when the ttl asked runs
//! out either (ZooKeeper keeps a lock node as long as its session), so the `Locker` releases it
//! then, as the expiry of a store that keeps any ttl would, whether or not its holder still
//! keeps the [`Lease`](super::Lease) or still runs a body under it.
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
    /// Releases `state` on the store at `at`, unless it was released before. Holds neither the
    /// lease nor the locker meanwhile: a lease released sooner is dropped as usual, and a locker
    /// dropped sooner takes its leases with it.
    pub(super) fn expire_at(&self, state: &Arc<LeaseState>, at: Instant) {
        let inner = Arc::downgrade(&self.inner);
        let lease = Arc::downgrade(state);
        background::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            let (Some(inner), Some(state)) = (inner.upgrade(), Weak::upgrade(&lease)) else {
                return;
            };
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
    }
}
