//! The default locker: the one `#[distributed_lock]` uses where it names none. Set by
//! [`set_default_locker`] or [`init_from_env`], else built on first use from `DLOCK_URL`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::watch;

use super::Locker;
use crate::background;
use crate::LockError;

/// The environment variable a default locker is built from.
pub(crate) const URL_VARIABLE: &str = "DLOCK_URL";

static DEFAULT: RwLock<Option<Locker>> = RwLock::new(None);
static FROM_ENV: Mutex<FromEnv> = Mutex::new(FromEnv::Unset);
static NEXT_ATTEMPT: AtomicU64 = AtomicU64::new(0);

type Outcome = watch::Receiver<Option<Result<Locker, Arc<LockError>>>>;

/// The locker built from `DLOCK_URL`: one per process, shared by [`init_from_env`] and the
/// default built on first use, whichever builds it first. Two lockers from one URL would not
/// exclude each other in-process (a nested call on the held key would be a second owner, and two
/// `memory://` stores two separate worlds).
enum FromEnv {
    /// Not built, or the last attempt failed: the next caller tries again.
    Unset,
    /// An attempt is under way; callers arriving now wait for its outcome instead of queueing
    /// attempts of their own behind it.
    Connecting {
        url: String,
        attempt: u64,
        outcome: Outcome,
    },
    Ready {
        url: String,
        locker: Locker,
    },
}

/// Sets the locker that `#[distributed_lock]` uses where it names none. A later call replaces
/// the locker for calls that start after it, whether the one before was set here, by
/// [`init_from_env`], or built from `DLOCK_URL` on first use.
///
/// Set it at start-up, before the first locked call: a call keeps the locker it started with,
/// and a call on the replacement is kept out of its key only through the store, if the two
/// lockers share one (a call nested in the body on the same key is then a second owner, turned
/// away as busy, not a re-entry). Two in-process stores ([`Locker::memory`]) do not exclude each
/// other at all.
///
/// ```
/// dlock::set_default_locker(dlock::Locker::memory());
/// ```
pub fn set_default_locker(locker: Locker) {
    *DEFAULT.write().unwrap_or_else(|p| p.into_inner()) = Some(locker);
}

/// Connects to the store `DLOCK_URL` names now, and makes it the default locker. Call it at
/// start-up: a missing or malformed URL, or a store that cannot be reached, then fails the
/// service's boot instead of its first locked request (the default locker is otherwise built on
/// first use). Returns the locker, to [`shut down`](Locker::shutdown) before the program exits.
///
/// There is one locker from the environment per process: where the default was already built
/// from the same `DLOCK_URL` on first use (or is being built), this returns that locker rather
/// than a second one, so that calls made before and after it exclude each other (with
/// `memory://`, on one store). A new locker is connected where none was built yet, where
/// `DLOCK_URL` now names another store, or where the one built was shut down.
///
/// # Errors
///
/// [`LockError::NoLocker`] where `DLOCK_URL` is unset or empty, [`LockError::InvalidUrl`] where
/// it cannot be used, [`LockError::Backend`] where the store cannot be reached.
///
/// # Cancel safety
///
/// The default locker is set only once the connection succeeded: if this future is dropped
/// before, it is not set. The connection attempt goes on in the background, shared with the
/// default built on first use: if it succeeds, a call that names no locker uses it where no
/// default was set before (one set by an earlier call of this function stays the default until
/// this function completes).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// # std::env::set_var("DLOCK_URL", "memory://");
/// let locker = dlock::init_from_env().await?;
/// // … serve; every `#[distributed_lock]` without `locker = …` uses this locker …
/// locker.shutdown().await?;
/// # Ok(()) }
/// ```
pub async fn init_from_env() -> Result<Locker, LockError> {
    // A locker from `DLOCK_URL` that was shut down may still have bodies at work under its
    // leases (a shutdown waits for them to rest): its successor connects once they are done and
    // their keys released, so that a `memory://` store of its own never lets a key in beside
    // them. A second `shutdown` waits for the first one's releases.
    let shut_down = match &*FROM_ENV.lock().unwrap_or_else(|p| p.into_inner()) {
        FromEnv::Ready { locker, .. } if locker.is_shut_down() => Some(locker.clone()),
        _ => None,
    };
    if let Some(shut_down) = shut_down {
        let _ = shut_down.shutdown().await;
    }
    let locker = locker_from_env(Reuse::SameUrlNotShutDown).await?;
    set_default_locker(locker.clone());
    Ok(locker)
}

/// `DLOCK_URL`, trimmed, where it is set and not empty.
pub(crate) fn url_from_env() -> Option<String> {
    match std::env::var(URL_VARIABLE) {
        Ok(url) if !url.trim().is_empty() => Some(url.trim().to_owned()),
        _ => None,
    }
}

/// The locker set by [`set_default_locker`]; else the one built once from `DLOCK_URL`; else
/// [`LockError::NoLocker`].
pub(crate) async fn default_locker() -> Result<Locker, LockError> {
    if let Some(locker) = DEFAULT.read().unwrap_or_else(|p| p.into_inner()).as_ref() {
        return Ok(locker.clone());
    }
    locker_from_env(Reuse::Any).await
}

/// Which locker from `DLOCK_URL`, built or being built, a caller takes instead of connecting.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reuse {
    /// Whichever there is: the default built on first use reads `DLOCK_URL` once.
    Any,
    /// One from the URL `DLOCK_URL` names now, not shut down: [`init_from_env`].
    SameUrlNotShutDown,
}

/// The locker from `DLOCK_URL`: the one built or being built where `reuse` takes it, else a new
/// connection that replaces it.
async fn locker_from_env(reuse: Reuse) -> Result<Locker, LockError> {
    let mut outcome = {
        let mut from_env = FROM_ENV.lock().unwrap_or_else(|p| p.into_inner());
        // Not read on the way to a locker any caller takes: every locked call comes here.
        let current = match (&*from_env, reuse) {
            (FromEnv::Ready { .. } | FromEnv::Connecting { .. }, Reuse::Any) => None,
            _ => url_from_env(),
        };
        let takes = |built: &str| reuse == Reuse::Any || current.as_deref() == Some(built);
        match &*from_env {
            FromEnv::Ready { url, locker }
                if takes(url) && (reuse == Reuse::Any || !locker.is_shut_down()) =>
            {
                return Ok(locker.clone());
            }
            FromEnv::Connecting { url, outcome, .. } if takes(url) => outcome.clone(),
            _ => {
                let Some(url) = current else {
                    return Err(LockError::NoLocker);
                };
                let attempt = NEXT_ATTEMPT.fetch_add(1, Ordering::Relaxed);
                let outcome = connect_from_env(url.clone(), attempt);
                *from_env = FromEnv::Connecting {
                    url,
                    attempt,
                    outcome: outcome.clone(),
                };
                outcome
            }
        }
    };
    let result = match outcome.wait_for(Option::is_some).await.as_deref() {
        Ok(Some(Ok(locker))) => Ok(locker.clone()),
        Ok(Some(Err(error))) => Err(error.duplicate()),
        _ => Err(LockError::backend(
            "the connection to DLOCK_URL was abandoned",
        )),
    };
    result
}

/// Connects to `url` on the background runtime, so the attempt goes on if the caller that
/// started it is dropped, and publishes the outcome to every caller waiting on it. It becomes
/// the locker from `DLOCK_URL` unless a later attempt replaced it meanwhile.
fn connect_from_env(url: String, attempt: u64) -> Outcome {
    let (publish, outcome) = watch::channel(None);
    background::spawn(async move {
        // Should the attempt end without an outcome (a panic in a store's client), the next call
        // tries again rather than meeting an attempt that never finishes.
        let unset_unless_done = ResetOnDrop(attempt);
        let connected = Locker::connect(&url).await;
        let mut from_env = FROM_ENV.lock().unwrap_or_else(|p| p.into_inner());
        if is_attempt(&from_env, attempt) {
            *from_env = match &connected {
                Ok(locker) => FromEnv::Ready {
                    url,
                    locker: locker.clone(),
                },
                // A failed connection is not kept: the next call tries again.
                Err(_) => FromEnv::Unset,
            };
        }
        drop(from_env);
        std::mem::forget(unset_unless_done);
        let _ = publish.send(Some(connected.map_err(Arc::new)));
    });
    outcome
}

fn is_attempt(from_env: &FromEnv, attempt: u64) -> bool {
    matches!(from_env, FromEnv::Connecting { attempt: current, .. } if *current == attempt)
}

/// Resets the locker from `DLOCK_URL` to "not built" when dropped, if its attempt is still the
/// one under way.
struct ResetOnDrop(u64);

impl Drop for ResetOnDrop {
    fn drop(&mut self) {
        let mut from_env = FROM_ENV.lock().unwrap_or_else(|p| p.into_inner());
        if is_attempt(&from_env, self.0) {
            *from_env = FromEnv::Unset;
        }
    }
}
