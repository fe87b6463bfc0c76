//! [`Locker::shutdown`]: a clean exit that leaves no key held behind the program, and no body
//! at work under a key another holder already has.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use super::release::Ending;
use super::Locker;
use crate::background;
use crate::lease::LossCause;
use crate::reentry;
use crate::LockError;

impl Locker {
    /// Shuts the locker down for a clean exit: refuses new acquisitions and stops those in
    /// flight (they fail with [`LockError::ShutDown`], undoing whatever reached the store),
    /// releases every lease still held, waits for the releases queued by dropped leases and the
    /// stores' own clean-ups to reach the store, and closes what the store opened for itself
    /// (the MySQL and PostgreSQL pools it made; Redis and ZooKeeper connections close when the
    /// last clone of the locker is dropped). Affects every clone of this locker, and every
    /// locker built on a clone of the same backend shares its pool: shut them down together.
    /// Calling it again does nothing more.
    ///
    /// A body of `#[distributed_lock]` running under a lease is told the lease is lost, and the
    /// lease stays held and renewed until no body works under it. Under `on_lost = "cancel"` the
    /// body is stopped at its next `.await`, and its key released once it rests there (work
    /// inside one poll runs to its end first, however long; work it handed to a spawned task is
    /// not waited for). Under `"continue"` the key is released when the body finishes, or at
    /// the latest when the validity the lease had at the shutdown runs out (a ttl at most),
    /// after which the body runs on without the key, as after any loss. A manual
    /// [`Lease`](super::Lease) is released at once: its holder is told through
    /// [`Lease::lost`](super::Lease::lost) and stops its work when told. A body that calls
    /// `shutdown` itself is not waited for.
    ///
    /// Futures its caller keeps but no longer polls (a `select!` on a termination signal keeps
    /// the others) hold little up: a release in flight is sent again from the background (the
    /// owner check makes the second harmless), a body under `"cancel"` not in
    /// a poll rests, one under `"continue"` is waited for as above, and an acquisition in flight
    /// is waited for 5 s at most (if the store grants it after that, the key stays held until
    /// its ttl runs out).
    ///
    /// A lease dropped just before the program returns from `main` is released on dlock's
    /// background thread, which dies with the process: without this call, such a key stays
    /// held until its ttl runs out. So a service calls it last, after its own work has stopped
    /// (for a web server, after its graceful shutdown returned).
    ///
    /// # Errors
    ///
    /// The first [`LockError::Backend`] of a release made by this call that the store did not
    /// confirm; that key then stays held until its ttl runs out. Every other lease is still
    /// released. (A body's own release on its way out is logged, not reported here.)
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped, the releases it started go on in the background, and the
    /// locker stays shut down.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::{LockError, LockOptions, Locker};
    ///
    /// let locker = Locker::memory();
    /// let lease = locker.lock("report:2026-11", LockOptions::new()).await?;
    /// locker.shutdown().await?;
    /// assert!(!lease.is_held());
    /// assert!(matches!(
    ///     locker.lock("report:2026-12", LockOptions::new()).await,
    ///     Err(LockError::ShutDown)
    /// ));
    /// # Ok(()) }
    /// ```
    pub async fn shutdown(&self) -> Result<(), LockError> {
        // A body that called shutdown itself cannot rest while it waits for shutdown.
        let callers_own = reentry::leases_of_this_task();
        // On the background runtime, so that it finishes (the store closed) even if this future
        // is dropped: by a body under `on_lost = "cancel"` that called it, say, as shutdown
        // stops that body.
        let (done, finished) = oneshot::channel();
        let locker = self.clone();
        background::spawn(async move {
            let _ = done.send(locker.shut_down(callers_own).await);
        });
        finished.await.unwrap_or_else(|_| {
            Err(LockError::backend(
                "the shutdown task ended without an answer",
            ))
        })
    }

    async fn shut_down(&self, callers_own: Vec<u64>) -> Result<(), LockError> {
        let held = self.inner.holdings.close();
        if !held.is_empty() {
            tracing::info!(leases = held.len(), locker = %self.inner.description, "distributed_lock: shutting down; releasing held leases");
        }
        let first_error: Arc<Mutex<Option<LockError>>> = Arc::default();
        for (state, queued) in held {
            if state.is_released() {
                // Its caller is releasing it, and may be parked or slow: again, from here.
                self.send_release(state.key.clone(), state.owner, queued, Ending::of(&state));
                continue;
            }
            state.stop();
            let (locker, first_error) = (self.clone(), first_error.clone());
            let waits_for_rest = !callers_own.contains(&state.id);
            // Counted as a queued release (since `close`), so the wait below covers it.
            background::spawn(async move {
                let _queued = queued;
                if waits_for_rest {
                    // No body works under the key when it goes to the next holder; the lease
                    // is renewed meanwhile. A body under "continue" is waited for until the
                    // validity the lease has now (it may be parked for good): it runs on without
                    // the key after that, as after any loss. A poll in progress is waited for
                    // however long it takes.
                    state.wait_at_rest(state.valid_until()).await;
                }
                state.mark_lost(LossCause::ShutDown);
                if let Err(error) = locker.release_at_shutdown(&state).await {
                    tracing::warn!(key = %state.key, %error, "distributed_lock: release at shutdown failed; the lease will expire");
                    let mut first = first_error.lock().unwrap_or_else(|p| p.into_inner());
                    first.get_or_insert(error);
                }
            });
        }
        // Acquisitions in flight return first, their undos queued: a future its caller no
        // longer polls cannot return, and is waited for a moment only.
        let returned =
            tokio::time::timeout(IN_FLIGHT_PATIENCE, self.inner.holdings.acquisitions_done()).await;
        if returned.is_err() {
            tracing::warn!(locker = %self.inner.description, "distributed_lock: an acquisition in flight was not polled during shutdown; if the store grants it, the key stays held until its ttl runs out");
        }
        self.inner.holdings.queued_releases_done().await;
        self.inner.backend.close().await;
        let first_error = first_error.lock().unwrap_or_else(|p| p.into_inner()).take();
        first_error.map_or(Ok(()), Err)
    }
}

/// How long shutdown waits for the acquisitions in flight to return: each returns at once when
/// polled (it is stopped), so only a future nobody polls any more takes this long.
const IN_FLIGHT_PATIENCE: Duration = Duration::from_secs(5);
