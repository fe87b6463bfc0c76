//! The default locker: the one `#[distributed_lock]` uses where it names none. Set by
//! [`set_default_locker`] or [`init_from_env`], else built on first use from `DLOCK_URL`.

use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::watch;

use super::Locker;
use crate::background;
use crate::LockError;

/// The environment variable a default locker is built from.
pub(crate) const URL_VARIABLE: &str = "DLOCK_URL";

static DEFAULT: RwLock<Option<Locker>> = RwLock::new(None);
static FROM_ENV: Mutex<FromEnv> = Mutex::new(FromEnv::Unset);

/// The locker built from `DLOCK_URL`.
enum FromEnv {
    /// Not built, or the last attempt failed: the next caller tries again.
    Unset,
    /// An attempt is under way; callers arriving now wait for its outcome instead of queueing
    /// attempts of their own behind it.
    Connecting(watch::Receiver<Option<Result<Locker, Arc<LockError>>>>),
    Ready(Locker),
}

/// Sets the locker that `#[distributed_lock]` uses where it names none. A later call replaces
/// the locker for calls that start after it.
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
/// # Errors
///
/// [`LockError::NoLocker`] where `DLOCK_URL` is unset or empty, [`LockError::InvalidUrl`] where
/// it cannot be used, [`LockError::Backend`] where the store cannot be reached.
///
/// # Cancel safety
///
/// The default locker is set only once the connection succeeded: if this future is dropped
/// before, nothing changes (see [`Locker::connect`] for the abandoned connection).
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
    let locker = Locker::from_env().await?;
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

/// The locker set by [`set_default_locker`]; else one built once from `DLOCK_URL`; else
/// [`LockError::NoLocker`].
pub(crate) async fn default_locker() -> Result<Locker, LockError> {
    if let Some(locker) = DEFAULT.read().unwrap_or_else(|p| p.into_inner()).as_ref() {
        return Ok(locker.clone());
    }
    let mut outcome = {
        let mut from_env = FROM_ENV.lock().unwrap_or_else(|p| p.into_inner());
        match &*from_env {
            FromEnv::Ready(locker) => return Ok(locker.clone()),
            FromEnv::Connecting(outcome) => outcome.clone(),
            FromEnv::Unset => {
                let Some(url) = url_from_env() else {
                    return Err(LockError::NoLocker);
                };
                let outcome = connect_from_env(url);
                *from_env = FromEnv::Connecting(outcome.clone());
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
/// started it is dropped, and publishes the outcome to every caller waiting on it.
fn connect_from_env(url: String) -> watch::Receiver<Option<Result<Locker, Arc<LockError>>>> {
    let (publish, outcome) = watch::channel(None);
    background::spawn(async move {
        // Should the attempt end without an outcome (a panic in a store's client), the next call
        // tries again rather than meeting an attempt that never finishes.
        let unset_unless_done = ResetOnDrop;
        let connected = Locker::connect(&url).await;
        *FROM_ENV.lock().unwrap_or_else(|p| p.into_inner()) = match &connected {
            Ok(locker) => FromEnv::Ready(locker.clone()),
            // A failed connection is not kept: the next call tries again.
            Err(_) => FromEnv::Unset,
        };
        std::mem::forget(unset_unless_done);
        let _ = publish.send(Some(connected.map_err(Arc::new)));
    });
    outcome
}

/// Resets the locker from `DLOCK_URL` to "not built" when dropped.
struct ResetOnDrop;

impl Drop for ResetOnDrop {
    fn drop(&mut self) {
        *FROM_ENV.lock().unwrap_or_else(|p| p.into_inner()) = FromEnv::Unset;
    }
}
