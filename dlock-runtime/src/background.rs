//! A small runtime of dlock's own, for the work no caller waits on: the watchdogs, releases
//! (so that a release goes on whether or not its caller still polls it), and the clean-ups a
//! dropped acquisition leaves to a store (`cleanups`).
//!
//! A `Locker` kept in a `static` outlives the runtime of whichever `#[tokio::test]` first used it;
//! a task spawned on that runtime would die with it and silently stop renewing. Tasks spawned
//! here live as long as the process.

use std::future::Future;
use std::sync::LazyLock;

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

/// Runs `task` on dlock's background runtime, and gives a handle to abort it.
pub(crate) fn spawn_abortable<F>(task: F) -> tokio::task::AbortHandle
where
    F: Future<Output = ()> + Send + 'static,
{
    RUNTIME.spawn(task).abort_handle()
}

/// Sleeps until `deadline` by the background runtime's timer, whose clock is real time: for a
/// caller whose own runtime's clock may be paused (a test's `start_paused`), which skips ahead to
/// its next timer whenever it is idle. Dropping the future cancels the timer.
pub(crate) async fn sleep_until(deadline: std::time::Instant) {
    // Made inside the task: a timer belongs to the runtime it is made on.
    let mut sleep = RUNTIME.spawn(async move { tokio::time::sleep_until(deadline.into()).await });
    let _cancel = AbortOnDrop(sleep.abort_handle());
    let _ = (&mut sleep).await;
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A handle to the background runtime, for backends whose connections must outlive the caller's
/// runtime (their driver tasks are spawned there).
#[cfg(any(
    feature = "redis",
    feature = "mysql",
    feature = "postgres",
    feature = "zookeeper",
    feature = "etcd"
))]
pub(crate) fn handle() -> &'static tokio::runtime::Handle {
    RUNTIME.handle()
}
