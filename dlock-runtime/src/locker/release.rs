//! Releasing a lease: from the holder's task when it awaits the release, from the background
//! when a `Drop` or a dropped future leaves it there or when a ttl the store does not expire ran
//! out (`expiry`), and again from a shutdown for a release still in flight. Every way is
//! owner-checked on the store, so a second release of one lease answers that it was not held
//! and changes nothing.

use std::sync::Arc;
use std::time::Duration;

use super::holdings::QueuedRelease;
use super::pending::PendingRelease;
use super::Locker;
use crate::backend::DynBackend;
use crate::background;
use crate::lease::LeaseState;
use crate::{LockError, Owner};

impl Locker {
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
            Ending::of(state).send(&*self.inner.backend, &state.key, state.owner),
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
    pub(super) async fn release_at_shutdown(
        &self,
        state: &Arc<LeaseState>,
    ) -> Result<(), LockError> {
        let first = state.mark_released();
        self.inner.watchdog.forget(state);
        self.inner.holdings.forget(state);
        let result = tokio::time::timeout(
            RELEASE_PATIENCE,
            Ending::of(state).send(&*self.inner.backend, &state.key, state.owner),
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
        if self.queue_release_of(state) {
            tracing::debug!(key = %state.key, fence = state.fence, "distributed_lock: released on drop");
        }
    }

    /// Releases `state` without waiting, as [`release_in_background`](Self::release_in_background)
    /// does; `false`, sending nothing, if it was released already.
    pub(super) fn queue_release_of(&self, state: &Arc<LeaseState>) -> bool {
        let queued = self.inner.holdings.queued_release();
        if !state.mark_released() {
            return false;
        }
        self.inner.watchdog.forget(state);
        self.inner.holdings.forget(state);
        self.send_release(state.key.clone(), state.owner, queued, Ending::of(state));
        true
    }

    /// Releases `key` for `owner` without waiting, counted by a fresh queued-release guard.
    pub(super) fn queue_release(&self, key: String, owner: Owner) {
        let queued = self.inner.holdings.queued_release();
        self.send_release(key, owner, queued, Ending::Release);
    }

    /// Undoes an acquisition of `key` for `owner` that went unanswered, without waiting, counted
    /// by a fresh queued-release guard: a release that also keeps a copy of the acquisition
    /// still on its way from taking effect ([`Backend::undo_acquire`](crate::backend::Backend::undo_acquire)).
    pub(super) fn queue_undo(&self, key: String, owner: Owner) {
        let queued = self.inner.holdings.queued_release();
        self.send_release(key, owner, queued, Ending::Undo);
    }

    /// Releases `key` for `owner` without waiting: at once where the store is in-process (it
    /// applies calls in order, so no copy of an acquisition can come after), else on the
    /// background runtime, counted by `queued` until it is done.
    pub(super) fn send_release(
        &self,
        key: String,
        owner: Owner,
        queued: QueuedRelease,
        ending: Ending,
    ) {
        if ending == Ending::Release && self.inner.backend.release_now(&key, owner) {
            return;
        }
        let backend = self.inner.backend.clone();
        background::spawn(async move {
            let _queued = queued;
            let release = ending.send(&*backend, &key, owner);
            // Bounded, so a store that never answers cannot hold a shutdown up for good.
            let result = tokio::time::timeout(RELEASE_PATIENCE, release)
                .await
                .unwrap_or_else(|_| Err(release_timed_out()));
            if let Err(error) = result {
                tracing::warn!(%key, %error, "distributed_lock: queued release failed; the lease will expire");
            }
        });
    }
}

/// How a lease's hold of its key ends on the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    /// A lease, whose acquisition was answered: released.
    Release,
    /// An acquisition dropped or failed unanswered, a copy of which may still reach the store:
    /// undone ([`Backend::undo_acquire`](crate::backend::Backend::undo_acquire)).
    Undo,
    /// A lease released before the end of its hold
    /// ([`LockOptions::hold_at_least`](crate::LockOptions::hold_at_least)): left to expire by
    /// itself when that much more time has passed.
    ExpireAfter(Duration),
}

impl Ending {
    /// How `state`, released now, ends: released, or left to expire at the end of its hold.
    pub(super) fn of(state: &LeaseState) -> Ending {
        state
            .hold_left()
            .map_or(Ending::Release, Ending::ExpireAfter)
    }

    /// Sends the ending for `owner`'s lease of `key` to `backend`; whether `owner` held it.
    async fn send(
        self,
        backend: &dyn DynBackend,
        key: &str,
        owner: Owner,
    ) -> Result<bool, LockError> {
        match self {
            Ending::Release => backend.release(key, owner).await,
            Ending::Undo => backend.undo_acquire(key, owner).await,
            Ending::ExpireAfter(left) => backend.expire_after(key, owner, left).await,
        }
    }
}

/// How long a release may take before it is given up (the lease then expires with its ttl): a
/// store's own time-outs end it sooner, this bounds one that has none.
const RELEASE_PATIENCE: Duration = Duration::from_secs(10);

fn release_timed_out() -> LockError {
    LockError::backend(format!(
        "the store did not answer a release within {RELEASE_PATIENCE:?}"
    ))
}
