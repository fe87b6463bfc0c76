//! Re-entrancy: the leases held by the annotated bodies a task is inside of.
//!
//! The stack lives in a `tokio::task_local!` scope around each body, never in a `thread_local!`
//! (a task moves between threads). A scope covers exactly one body's future, so a call awaited
//! inside the body sees the lease and re-enters, while a call joined beside it (`tokio::join!`)
//! or spawned from it does not: those are other owners.

use std::future::Future;
use std::sync::Arc;

use crate::lease::{LeaseInfo, LeaseState};

tokio::task_local! {
    /// The lease of the innermost body; each lease links to the one around it
    /// (`LeaseState::outer`), so entering a body allocates nothing beyond the lease itself.
    static HELD: Arc<LeaseState>;
}

/// Where a call on `key` by `locker_id` stands.
pub(crate) enum Entry {
    /// An enclosing body of this task holds the key: re-enter its lease.
    Reenter(Arc<LeaseState>),
    /// The call must acquire; `outer` is the innermost enclosing lease, if any.
    Acquire { outer: Option<Arc<LeaseState>> },
}

/// Looks `key` up among the leases of the enclosing bodies, with one task-local access, as this
/// is on every call's path.
pub(crate) fn enter(locker_id: usize, key: &str) -> Entry {
    HELD.try_with(|top| {
        let mut lease = Some(top);
        while let Some(state) = lease {
            if state.locker_id == locker_id && state.key == key {
                return Entry::Reenter(state.clone());
            }
            lease = state.outer();
        }
        Entry::Acquire {
            outer: Some(top.clone()),
        }
    })
    .unwrap_or(Entry::Acquire { outer: None })
}

/// Runs `body` with `state` on top of the held stack, above `outer`.
pub(crate) fn scope<F: Future>(
    state: Arc<LeaseState>,
    outer: Option<Arc<LeaseState>>,
    body: F,
) -> impl Future<Output = F::Output> {
    if let Some(outer) = outer {
        state.set_outer(outer);
    }
    HELD.scope(state, body)
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
    HELD.try_with(|top| LeaseInfo { state: top.clone() }).ok()
}
