//! Guards that finish what a dropped future started: an acquisition the store may have granted,
//! a release the caller stopped waiting for. Either is queued on the background runtime.

use std::time::Duration;

use super::release::Ending;
use super::Locker;
use crate::lease::LeaseState;
use crate::Owner;

/// Undoes an acquisition abandoned mid-flight or failed unanswered: the store may have granted
/// the key, and a copy of the call may still be on its way to it.
pub(super) struct PendingAcquire<'a> {
    pub(super) locker: &'a Locker,
    pub(super) key: &'a str,
    pub(super) owner: Owner,
    /// The ttl the acquisition asked for: how long a grant it got may hold the key.
    pub(super) ttl: Duration,
    pub(super) armed: bool,
}

impl Drop for PendingAcquire<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.locker
                .queue_undo(self.key.to_owned(), self.owner, self.ttl);
        }
    }
}

/// Finishes a release whose caller stopped waiting for it.
pub(super) struct PendingRelease<'a> {
    pub(super) locker: &'a Locker,
    pub(super) state: &'a LeaseState,
    pub(super) armed: bool,
}

impl Drop for PendingRelease<'_> {
    fn drop(&mut self) {
        if self.armed {
            // As the release would have ended it: a lease within its hold is left to expire.
            let ending = Ending::of(self.state);
            self.locker
                .queue_ending(self.state.key.clone(), self.state.owner, ending);
            self.locker.inner.holdings.forget(self.state);
        }
    }
}
