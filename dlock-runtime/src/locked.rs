//! The one runtime call that `#[distributed_lock]` expands to: acquire (or re-enter), run the
//! body under the lease, watch for its loss, release on every exit path.

use std::future::Future;
use std::time::Duration;

use crate::locker::{default_locker, Locker};
use crate::{reentry, LockError, LockOptions};

/// What happens when the lease is lost while the body runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLost {
    /// Drop the body at its next await and return `LockError::Lost`.
    Cancel,
    /// Let the body run on; `current_lease().is_held()` reports the loss.
    Continue,
}

/// The attribute's arguments, checked at compile time.
#[derive(Debug, Clone, Copy)]
pub struct LockSpec {
    name: &'static str,
    options: LockOptions,
    on_lost: OnLost,
}

impl LockSpec {
    /// The spec of function `name`.
    pub const fn new(name: &'static str, ttl_ms: u64, wait_ms: u64, renew: bool, on_lost: OnLost) -> Self {
        LockSpec {
            name,
            options: LockOptions::new()
                .ttl(Duration::from_millis(ttl_ms))
                .wait(Duration::from_millis(wait_ms))
                .renew(renew),
            on_lost,
        }
    }
}

/// Takes the locker expression of `locker = EXPR` where a `&Locker` is expected, so deref
/// coercion applies, and ends its borrow at once so the body may move what it borrowed from.
pub fn locker(locker: &Locker) -> Locker {
    locker.clone()
}

/// Runs `body` under a lease on `key`. On any failure to get or keep the lease, returns
/// `on_failure(error)` instead of (the rest of) the body. `on_failure` is
/// [`FromLockError::from_lock_error`](crate::FromLockError), named by the generated code where the
/// compiler can point a type error at the function's return type.
pub fn locked<R, F>(
    spec: LockSpec,
    locker: Option<Locker>,
    key: String,
    on_failure: fn(LockError) -> R,
    body: F,
) -> impl Future<Output = R> + use<R, F>
where
    F: Future<Output = R>,
{
    async move {
        let locker = match locker {
            Some(locker) => locker,
            None => match default_locker().await {
                Ok(locker) => locker,
                Err(error) => return on_failure(error),
            },
        };

        if let Some(held) = reentry::find(locker.id(), &key) {
            if !held.is_held() {
                return on_failure(LockError::Lost { key });
            }
            tracing::trace!(%key, function = spec.name, "distributed_lock: re-entered");
            return body.await;
        }

        let lease = match locker.lock(key, spec.options).await {
            Ok(lease) => lease,
            Err(error) => return on_failure(error),
        };
        // From here `lease` releases on every exit: its `Drop` queues the release when the body
        // panics or this future is dropped, and `release` below awaits it on a normal return.
        let body = reentry::scope(lease.state.clone(), body);
        let output = match spec.on_lost {
            OnLost::Cancel => {
                tokio::select! {
                    biased;
                    output = body => output,
                    () = lease.lost() => {
                        // Returns at once; dropping the lease queues its release.
                        return on_failure(LockError::Lost { key: lease.key().to_owned() });
                    }
                }
            }
            OnLost::Continue => body.await,
        };
        let key = lease.key().to_owned();
        if let Err(error) = lease.release().await {
            // The body's work is done and must be reported as it ended; the lease will expire.
            tracing::warn!(%key, %error, function = spec.name, "distributed_lock: release failed");
        }
        output
    }
}
