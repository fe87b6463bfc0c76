//! What a `Locker` holds and has in flight, so that [`Locker::shutdown`](super::Locker::shutdown)
//! can release all of it before the program exits.
//!
//! A `Lease` dropped on the way out of `main` queues its release on dlock's background runtime,
//! and the process can end before that release reaches the store: the key would stay held for
//! the rest of its ttl. Shutdown therefore releases what is still held and then waits for every
//! queued release to finish. An acquisition in flight could be granted after that: shutdown
//! stops it, and waits until it has returned, its undo queued.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::lease::LeaseState;
use crate::notified;

#[derive(Default)]
pub(super) struct Holdings {
    /// Set once by shutdown: no acquisition is kept after it.
    closed: AtomicBool,
    held: Mutex<HashMap<u64, Arc<LeaseState>>>,
    queued_releases: AtomicUsize,
    all_released: Notify,
    /// Acquisitions between their start and their return.
    acquiring: AtomicUsize,
    /// Wakes the acquisitions in flight when shutdown starts, and shutdown when the last ends.
    closing: Notify,
    all_acquired: Notify,
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

    /// Closes for new leases, stops the acquisitions in flight, and takes every lease still held.
    pub(super) fn close(&self) -> Vec<Arc<LeaseState>> {
        self.closed.store(true, Ordering::SeqCst);
        self.closing.notify_waiters();
        self.held().drain().map(|(_, state)| state).collect()
    }

    /// Counts an acquisition until the returned guard drops; refused once the locker is shut
    /// down. Counted first and checked after, as [`register`](Self::register) is, so shutdown
    /// either waits for it or it sees the locker closed.
    pub(super) fn acquisition(self: &Arc<Self>) -> Result<Acquiring, Closed> {
        self.acquiring.fetch_add(1, Ordering::SeqCst);
        let acquiring = Acquiring(self.clone());
        if self.closed.load(Ordering::SeqCst) {
            return Err(Closed);
        }
        Ok(acquiring)
    }

    /// Resolves once the locker is shut down.
    pub(super) async fn closed(&self) {
        notified::until(&self.closing, || self.closed.load(Ordering::SeqCst)).await;
    }

    /// Resolves once no acquisition is in flight.
    pub(super) async fn acquisitions_done(&self) {
        notified::until(&self.all_acquired, || {
            self.acquiring.load(Ordering::SeqCst) == 0
        })
        .await;
    }

    /// Counts a release queued on the background runtime until the returned guard drops.
    pub(super) fn queued_release(self: &Arc<Self>) -> QueuedRelease {
        self.queued_releases.fetch_add(1, Ordering::SeqCst);
        QueuedRelease(self.clone())
    }

    /// Resolves once no queued release is in flight.
    pub(super) async fn queued_releases_done(&self) {
        notified::until(&self.all_released, || {
            self.queued_releases.load(Ordering::SeqCst) == 0
        })
        .await;
    }
}

/// One acquisition in flight; dropped when it returned (or its future was dropped).
pub(super) struct Acquiring(Arc<Holdings>);

impl Drop for Acquiring {
    fn drop(&mut self) {
        if self.0.acquiring.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.all_acquired.notify_waiters();
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
