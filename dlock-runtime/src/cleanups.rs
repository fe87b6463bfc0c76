//! The clean-ups a store leaves to the background when a future is dropped (undoing an
//! acquisition nobody waits for any more, leaving a queue), counted so that the store's
//! [`close`](crate::backend::Backend::close), and so [`Locker::shutdown`](crate::Locker::shutdown),
//! can wait for them: a clean exit then leaves nothing behind on the store.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::{background, notified};

/// How long a store's [`close`](crate::backend::Backend::close) waits for its clean-ups (each
/// bounded by the store's own time-outs) before it closes its connections anyway.
pub(crate) const CLEANUP_PATIENCE: Duration = Duration::from_secs(5);

/// One store's clean-ups in flight: work the store needs to see before the process exits
/// (undoing an acquisition nobody waits for any more, leaving a queue), run on the background
/// runtime because the future that started it was dropped. The store's `close` waits for them,
/// so that a clean shutdown leaves nothing behind.
#[derive(Default)]
pub(crate) struct Cleanups {
    in_flight: AtomicUsize,
    all_done: Notify,
}

impl Cleanups {
    /// Runs `task` on the background runtime, counted until it ends (finished or panicked).
    pub(crate) fn spawn<F>(self: &Arc<Self>, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        /// Uncounts the clean-up when its task ends, whichever way.
        struct InFlight(Arc<Cleanups>);
        impl Drop for InFlight {
            fn drop(&mut self) {
                if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
                    self.0.all_done.notify_waiters();
                }
            }
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let in_flight = InFlight(self.clone());
        background::spawn(async move {
            let _in_flight = in_flight;
            task.await;
        });
    }

    /// Resolves once no clean-up is in flight, or after `patience`, whichever comes first; whether
    /// they all finished.
    pub(crate) async fn done(&self, patience: Duration) -> bool {
        let all_done = notified::until(&self.all_done, || {
            self.in_flight.load(Ordering::SeqCst) == 0
        });
        let finished = tokio::time::timeout(patience, all_done).await.is_ok();
        if !finished {
            tracing::warn!("distributed_lock: clean-ups (undos of abandoned acquisitions, deletes of released ZooKeeper nodes) still running as the store closes; their keys expire with their ttl, or on ZooKeeper when the session does");
        }
        finished
    }
}
