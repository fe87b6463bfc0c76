//! What a `Locker` holds and has in flight, so that [`Locker::shutdown`](super::Locker::shutdown)
//! can release all of it before the program exits.
//!
//! A `Lease` dropped on the way out of `main` queues its release on dlock's background runtime,
//! and the process can end before that release reaches the store: the key would stay held for
//! the rest of its ttl. Shutdown therefore releases what is still held and then waits for every
//! queued release to finish.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::lease::LeaseState;

#[derive(Default)]
pub(super) struct Holdings {
    /// Set once by shutdown: no acquisition is kept after it.
    closed: AtomicBool,
    held: Mutex<HashMap<u64, Arc<LeaseState>>>,
    queued_releases: AtomicUsize,
    all_released: Notify,
}

/// Refused: the locker was shut down.
pub(super) struct Closed;

impl Holdings {
    fn held(&self) -> MutexGuard<'_, HashMap<u64, Arc<LeaseState>>> {
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records a new lease; refused once the locker is shut down. An acquisition that finishes
    /// while shutdown runs is either seen by shutdown (registered first) or sees `closed` (set
    /// first): both check after their own write, so it is never missed by both.
    pub(super) fn register(&self, state: &Arc<LeaseState>) -> Result<(), Closed> {
        self.held().insert(state.id, state.clone());
        if self.closed.load(Ordering::SeqCst) {
            self.held().remove(&state.id);
            return Err(Closed);
        }
        Ok(())
    }

    pub(super) fn forget(&self, state: &LeaseState) {
        self.held().remove(&state.id);
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Closes for new leases and takes every lease still held.
    pub(super) fn close(&self) -> Vec<Arc<LeaseState>> {
        self.closed.store(true, Ordering::SeqCst);
        self.held().drain().map(|(_, state)| state).collect()
    }

    /// Counts a release queued on the background runtime until the returned guard drops.
    pub(super) fn queued_release(self: &Arc<Self>) -> QueuedRelease {
        self.queued_releases.fetch_add(1, Ordering::SeqCst);
        QueuedRelease(self.clone())
    }

    /// Resolves once no queued release is in flight.
    pub(super) async fn queued_releases_done(&self) {
        loop {
            let done = self.all_released.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if self.queued_releases.load(Ordering::SeqCst) == 0 {
                return;
            }
            done.await;
        }
    }
}

/// One queued release in flight; dropped when it finished (or its task panicked).
pub(super) struct QueuedRelease(Arc<Holdings>);

impl Drop for QueuedRelease {
    fn drop(&mut self) {
        if self.0.queued_releases.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.all_released.notify_waiters();
        }
    }
}
