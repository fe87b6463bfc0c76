//! Re-entrancy: the leases held by the annotated bodies a task is inside of.
//!
//! The stack lives in a `tokio::task_local!` scope around each body, never in a `thread_local!`
//! (a task moves between threads). A scope covers exactly one body's future, so a call awaited
//! inside the body sees the lease and re-enters, while a call joined beside it (`tokio::join!`)
//! or spawned from it does not: those are other owners.

use std::future::Future;
use std::sync::Arc;

use crate::lease::{LeaseInfo, LeaseState};

/// One held lease, linked to the leases held by the bodies around it.
pub(crate) struct Frame {
    state: Arc<LeaseState>,
    outer: Option<Arc<Frame>>,
}

tokio::task_local! {
    static HELD: Arc<Frame>;
}

/// The lease held on `key` by `locker_id` in an enclosing body of this task, if any.
pub(crate) fn find(locker_id: usize, key: &str) -> Option<Arc<LeaseState>> {
    HELD.try_with(|top| {
        let mut frame = Some(top);
        while let Some(f) = frame {
            if f.state.locker_id == locker_id && f.state.key == key {
                return Some(f.state.clone());
            }
            frame = f.outer.as_ref();
        }
        None
    })
    .ok()
    .flatten()
}

/// Runs `body` with `state` on top of the held stack.
pub(crate) fn scope<F: Future>(state: Arc<LeaseState>, body: F) -> impl Future<Output = F::Output> {
    let outer = HELD.try_with(Arc::clone).ok();
    HELD.scope(Arc::new(Frame { state, outer }), body)
}

/// The lease of the innermost `#[distributed_lock]` body this code runs in, or `None` outside
/// any.
///
/// ```
/// use dlock::distributed_lock;
///
/// #[derive(Debug)]
/// struct Stale;
/// impl From<dlock::LockError> for Stale {
///     fn from(_: dlock::LockError) -> Self { Stale }
/// }
///
/// #[distributed_lock(key = "stock:<sku>", locker = &dlock::Locker::memory())]
/// async fn deduct(sku: &str) -> Result<u64, Stale> {
///     let lease = dlock::current_lease().expect("inside a locked body");
///     assert_eq!(lease.key(), "stock:apple");
///     Ok(lease.fence()) // send it along with the write it protects
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// assert!(deduct("apple").await.unwrap() > 0);
/// assert!(dlock::current_lease().is_none());
/// # }
/// ```
pub fn current_lease() -> Option<LeaseInfo> {
    HELD.try_with(|top| LeaseInfo { state: top.state.clone() }).ok()
}
