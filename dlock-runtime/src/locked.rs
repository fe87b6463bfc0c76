//! The one runtime call that `#[distributed_lock]` expands to: acquire (or re-enter), run the
//! body under the lease, watch for its loss, release on every exit path.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use crate::lease::LeaseState;
use crate::locker::{default_locker, Lease, Locker};
use crate::metrics;
use crate::{reentry, FromLockError, LockError, LockOptions};

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
    pub const fn new(
        name: &'static str,
        ttl: Duration,
        wait: Duration,
        renew: bool,
        on_lost: OnLost,
    ) -> Self {
        LockSpec {
            name,
            options: LockOptions::new().ttl(ttl).wait(wait).renew(renew),
            on_lost,
        }
    }

    /// The same spec under `label` (the attribute's `label`, or the function's path).
    pub const fn label(mut self, label: &'static str) -> Self {
        self.options = self.options.label(label);
        self
    }

    /// The same spec holding the key at least `hold` after its grant (the attribute's
    /// `hold_at_least`).
    pub const fn hold_at_least(mut self, hold: Duration) -> Self {
        self.options = self.options.hold_at_least(hold);
        self
    }

    /// The same spec taking the key as a reader or a writer (the attribute's `mode`).
    pub const fn mode(mut self, mode: crate::Mode) -> Self {
        self.options = self.options.mode(mode);
        self
    }

    /// The same spec admitting `permits` holders of the key at once (the attribute's
    /// `permits`).
    pub const fn permits(mut self, permits: u32) -> Self {
        self.options = self.options.permits(permits);
        self
    }
}

/// Takes the `&Locker` of `locker = EXPR`, ends its borrow at once so the body may move what it
/// borrowed from. (The generated code coerces `EXPR` to `&Locker` in a typed `let` of the
/// caller's, so that a wrong type is reported on `EXPR` and not here.)
pub fn locker(locker: &Locker) -> Locker {
    locker.clone()
}

/// How a call that cannot have (or keep) its lock returns instead of running its body.
///
/// The generated code picks one from the function's declared return type (one of the
/// `LockSpec` functions below, or [`FromLockError::from_lock_error`] for any other type) and
/// names it spanned on that type: a return type that cannot carry a lock failure is then
/// reported on it, with a message that says which types can.
pub type OnFailure<R> = fn(&LockSpec, LockError) -> R;

impl LockSpec {
    /// A declared `Result<T, E>`: `Err(error.into())`. Asking `E: ErrorFromLockError` of the
    /// error type on its own makes the compiler report a missing conversion with that trait's
    /// message, on `E`, rather than as a list of `E`'s unrelated `From` impls.
    pub fn returns_err<T, E: ErrorFromLockError>(&self, error: LockError) -> Result<T, E> {
        Err(error.into())
    }

    /// A declared `impl Trait`: the hidden type must implement [`FromLockError`], and saying so
    /// in a message of its own keeps the compiler from naming a type the user never wrote.
    pub fn returns_opaque<R: OpaqueFromLockError>(&self, error: LockError) -> R {
        R::from_lock_error(error)
    }

    /// A declared `()`: the call is skipped, and a warning names the function and says why.
    pub fn skips(&self, error: LockError) {
        tracing::warn!(function = self.name, %error, "distributed_lock: call skipped");
    }
}

/// `From<LockError>`, asked of the error type of a declared `Result<T, E>`.
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` returns a lock failure as `Err(dlock::LockError.into())`, but `{Self}` has no `From<dlock::LockError>`",
    label = "`{Self}` cannot hold a lock failure",
    note = "the return types that work: `Result<T, E>` where `E: From<dlock::LockError>`, `Option<T>`, and `()`",
    note = "to make this one work, give `{Self}` the conversion if it is a type of yours: `impl From<dlock::LockError> for {Self}` (e.g. into a variant `Lock(dlock::LockError)`); or return an error type that has it: `dlock::LockError`, `Box<dyn std::error::Error + Send + Sync>`, `anyhow::Error`"
)]
pub trait ErrorFromLockError: From<LockError> {}

// Reported as `E: ErrorFromLockError`, with the message above, not as `E: From<LockError>` with
// a list of `E`'s other `From` impls.
#[diagnostic::do_not_recommend]
impl<E: From<LockError>> ErrorFromLockError for E {}

/// [`FromLockError`], asked of the type hidden behind a declared `impl Trait`.
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` cannot return a lock failure through this `impl Trait`",
    label = "the type behind this `impl Trait` cannot carry a `dlock::LockError`",
    note = "the return types that work: `Result<T, E>` where `E: From<dlock::LockError>`, `Option<T>`, and `()`",
    note = "to make this one work, put the `impl Trait` inside one of them and return `Ok(…)` or `Some(…)` from the body: `Result<impl Trait, E>` with `E: From<dlock::LockError>` (an axum handler: `Result<impl IntoResponse, AppError>`), or `Option<impl Trait>`"
)]
pub trait OpaqueFromLockError: FromLockError {}

#[diagnostic::do_not_recommend]
impl<R: FromLockError> OpaqueFromLockError for R {}

/// Runs `body` under a lease on `key`. On any failure to get or keep the lease, returns
/// `on_failure(spec, error)` instead of (the rest of) the body (see `OnFailure`).
///
/// The body is boxed before anything else. A future stored inline makes the type of every
/// enclosing future nest it; with each annotated call wrapping its body in a few layers of its
/// own, two or three nested annotated calls would exceed the compiler's recursion limit for
/// layouts. One allocation per call keeps any depth of nesting compiling.
pub fn locked<R, F>(
    spec: LockSpec,
    locker: Option<Locker>,
    key: String,
    on_failure: OnFailure<R>,
    body: F,
) -> impl Future<Output = R>
where
    F: Future<Output = R>,
{
    run_locked(spec, locker, key, on_failure, Box::pin(body))
}

async fn run_locked<R, F>(
    spec: LockSpec,
    locker: Option<Locker>,
    key: String,
    on_failure: OnFailure<R>,
    body: Pin<Box<F>>,
) -> R
where
    F: Future<Output = R>,
{
    let locker = match locker {
        Some(locker) => locker,
        None => match default_locker().await {
            Ok(locker) => locker,
            Err(error) => return on_failure(&spec, error),
        },
    };

    if let Some(parent) = reentry::holder(locker.id(), &key) {
        if !parent.takes(spec.options.permits) {
            let reason = match parent.permit_number() {
                Some(number) if spec.options.permits > 1 => format!(
                    "`{key}` is held by the calling body as permit {number} of a semaphore, and \
                     this call admits {} at once, of the first {} permits: it cannot run under \
                     that one (give every call on the key the same `permits`)",
                    spec.options.permits, spec.options.permits
                ),
                _ => format!(
                    "`{}` is held by the calling body as {}, and this call asks for {}: a key is \
                 locked one way everywhere (give every call on it the same `permits`)",
                    key,
                    if spec.options.permits > 1 {
                        "a mutex"
                    } else {
                        "a permit of a semaphore"
                    },
                    if spec.options.permits > 1 {
                        "a permit of a semaphore"
                    } else {
                        "the mutex"
                    },
                ),
            };
            return on_failure(&spec, LockError::InvalidOptions { reason });
        }
        if parent.is_read() && spec.options.mode == crate::Mode::Write {
            // An upgrade: two readers upgrading at once would each wait for the other to leave.
            let reason = format!(
                "`{key}` is held by the calling body as a reader, and this call asks to write: \
                 a reader never becomes a writer (two doing so at once would wait for each \
                 other for ever); take the key with mode = \"write\" in the outer call"
            );
            return on_failure(&spec, LockError::InvalidOptions { reason });
        }
        // Siblings joined inside the body take turns under the lease, each waiting for the one
        // before it at most its own `wait` or `ttl`, whichever is longer.
        let turn = match reentry::Turn::take(&parent, turn_patience(&spec.options)).await {
            Ok(turn) => turn,
            Err(error) => return on_failure(&spec, error),
        };
        tracing::trace!(%key, function = spec.name, "distributed_lock: re-entered");
        metrics::reentered(spec.options.label, locker.store_kind());
        // `None` as well when the call was moved out of the body (see `Turn::scope`).
        let output = run_body(spec.on_lost, turn.lease(), turn.scope(body))
            .await
            .flatten();
        return output.unwrap_or_else(|| on_failure(&spec, LockError::Lost { key }));
    }

    let lease = match locker.acquire(key, spec.options).await {
        Ok(state) => Lease { state, locker },
        Err(error) => return on_failure(&spec, error),
    };
    // From here `lease` releases on every exit: its `Drop` queues the release when the body
    // panics or this future is dropped, and the release below awaits it on a normal return.
    // The lease's hold, if any, is its body's: it applies from the body's first poll, so a
    // grant too late to run the body (or a shutdown before it ran) frees the key.
    let in_use = lease.state.clone();
    let body = reentry::scope(lease.state.clone(), async move {
        in_use.put_to_use();
        body.await
    });
    let Some(output) = run_body(spec.on_lost, &lease.state, body).await else {
        // Returns at once; dropping the lease queues its release.
        return on_failure(
            &spec,
            LockError::Lost {
                key: lease.state.shown_key().to_owned(),
            },
        );
    };
    if let Err(error) = lease.locker.release(&lease.state).await {
        // The body's work is done and must be reported as it ended; the lease will expire.
        tracing::warn!(key = %lease.state.shown_key(), %error, function = spec.name, "distributed_lock: release failed");
    }
    output
}

/// Runs `body` under `lease` as `on_lost` says; `None` when the lease was lost and the body
/// dropped, or never started.
///
/// The body is never started on a lease the client knows is invalid: a grant can reach a
/// caller whose runtime was stalled after the lease ran out. With `Cancel` the same check comes
/// before every later poll, so a body whose lease ran out while its runtime was busy elsewhere
/// is dropped instead of resumed, even before any timer reports the loss.
///
/// The body counts as at work under the lease during each poll (under `Continue`, as running for
/// its whole run, which a shutdown waits for only until a deadline), so that a shutdown gives
/// its key to the next holder only once it rests.
async fn run_body<F: Future>(on_lost: OnLost, lease: &LeaseState, body: F) -> Option<F::Output> {
    match on_lost {
        OnLost::Cancel => until_lost(body, lease).await,
        OnLost::Continue => {
            // Uncounted when this call ends, however: a re-entered call runs under the outer
            // call's lease, whose body may be one that shutdown must wait for however long.
            let _running = lease.start_running_on();
            if !lease.may_run() {
                return None;
            }
            Some(body.await)
        }
    }
}

/// Polls `body` while the lease may run it, until it finishes (`Some`) or the lease is lost
/// (`None`, and `body` is dropped). The loss watcher with its timer is only set up once the body
/// has to wait: a body that finishes in its first poll pays nothing for it.
pub(crate) async fn until_lost<F: Future>(body: F, lease: &LeaseState) -> Option<F::Output> {
    let mut body = std::pin::pin!(body);
    let mut watcher = None;
    std::future::poll_fn(|cx| {
        let polling = lease.start_poll();
        if !lease.may_run() {
            return Poll::Ready(None);
        }
        if let Poll::Ready(output) = body.as_mut().poll(cx) {
            return Poll::Ready(Some(output));
        }
        drop(polling);
        let watcher = watcher.get_or_insert_with(|| Box::pin(lease.wait_lost()));
        watcher.as_mut().poll(cx).map(|()| None)
    })
    .await
}

/// How long a re-entered call waits for its turn among the calls joined beside it inside the
/// body: its own `wait` or its own `ttl`, whichever is longer. Siblings joined with the default
/// `wait = "0s"` still take turns (a `join!` of two calls on the body's key runs both); the
/// bound is for a turn that is never handed back, held by a future its caller stops polling
/// until this call ends (one arm of a `select!` loop whose other arm awaits this call), which
/// would otherwise keep the key, renewed, for ever.
fn turn_patience(options: &crate::LockOptions) -> std::time::Duration {
    options.wait.max(options.ttl)
}
