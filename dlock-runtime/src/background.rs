//! A small runtime of dlock's own, for the work no caller waits on: the watchdogs, releases
//! queued by `Drop`, and the clean-ups a dropped acquisition leaves to the stores, which
//! [`Locker::shutdown`](crate::Locker::shutdown) waits for.
//!
//! A `Locker` kept in a `static` outlives the runtime of whichever `#[tokio::test]` first used it;
//! a task spawned on that runtime would die with it and silently stop renewing. Tasks spawned
//! here live as long as the process.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::LazyLock;

use tokio::sync::Notify;

use crate::notified;

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("dlock-background")
        .enable_all()
        .build()
        .expect("dlock could not start its background thread")
});

/// Runs `task` on dlock's background runtime.
pub(crate) fn spawn<F>(task: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    drop(RUNTIME.spawn(task));
}

/// A handle to the background runtime, for backends whose connections must outlive the caller's
/// runtime (their driver tasks are spawned there).
#[cfg(any(
    feature = "redis",
    feature = "mysql",
    feature = "postgres",
    feature = "zookeeper"
))]
pub(crate) fn handle() -> &'static tokio::runtime::Handle {
    RUNTIME.handle()
}

/// Clean-ups in flight: tasks spawned by [`spawn_cleanup`] that have not finished.
static CLEANUPS: AtomicUsize = AtomicUsize::new(0);
static CLEANUPS_DONE: Notify = Notify::const_new();

/// Runs `task` on dlock's background runtime as a clean-up: work a store needs to see before the
/// process exits (undoing an acquisition nobody waits for, leaving a queue), which
/// [`cleanups_done`] waits for. Stores call it where a dropped future leaves such work behind.
pub(crate) fn spawn_cleanup<F>(task: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    /// Counts the clean-up until its task ends, finished or not (a panic drops it too).
    struct InFlight;
    impl Drop for InFlight {
        fn drop(&mut self) {
            if CLEANUPS.fetch_sub(1, Ordering::SeqCst) == 1 {
                CLEANUPS_DONE.notify_waiters();
            }
        }
    }
    CLEANUPS.fetch_add(1, Ordering::SeqCst);
    let in_flight = InFlight;
    spawn(async move {
        let _in_flight = in_flight;
        task.await;
    });
}

/// Resolves once no clean-up is in flight, or after `patience`, whichever comes first; whether
/// they all finished. Clean-ups of every locker count: shutdown waits a moment longer for
/// another's, never less for its own.
pub(crate) async fn cleanups_done(patience: std::time::Duration) -> bool {
    let wait = notified::until(&CLEANUPS_DONE, || CLEANUPS.load(Ordering::SeqCst) == 0);
    tokio::time::timeout(patience, wait).await.is_ok()
}
