//! Releasing a lease: from the holder's task when it awaits the release, from the background
//! when a `Drop` or a dropped future leaves it there or when a ttl the store does not expire ran
//! out (`expiry`), and again from a shutdown for a release still in flight. Every way is
//! owner-checked on the store, so a second release of one lease answers that it was not held
//! and changes nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::holdings::{Holdings, QueuedRelease};
use super::pending::PendingRelease;
use super::Locker;
use crate::backend::DynBackend;
use crate::background;
use crate::lease::LeaseState;
use crate::watchdog::HoldEndings;
use crate::{LockError, Owner};

impl Locker {
    /// Releases `state` and waits for the store's answer.
    pub(crate) async fn release(&self, state: &Arc<LeaseState>) -> Result<(), LockError> {
        if !state.mark_released() {
            return Ok(());
        }
        self.inner.watchdog.forget(state);
        // Sent from this task, the fast way (no hop to the background runtime and back). The
        // lease stays among the held ones until the store answered: a shutdown meanwhile sends
        // the release again from the background, counted, so that neither a parked caller nor
        // one that is slow holds it up; the owner check makes the second release harmless.
        let mut pending = PendingRelease {
            locker: self,
            state,
            armed: true,
        };
        let ending = Ending::of(state);
        let result = tokio::time::timeout(
            RELEASE_PATIENCE,
            ending.send(&*self.inner.backend, &state.key, state.owner),
        )
        .await
        .unwrap_or_else(|_| Err(release_timed_out()));
        pending.armed = false;
        self.inner.holdings.forget(state);
        if result.is_err() && matches!(ending, Ending::ExpireAt(_)) {
            // The hold must not end with this failure: tried again from the background until
            // it lands, or the hold is over.
            self.queue_ending(state.key.clone(), state.owner, ending);
        }
        let held = result?;
        tracing::debug!(key = %state.key, fence = state.fence, held, "distributed_lock: released");
        Ok(())
    }

    /// Releases `state` for a shutdown, and waits for the store's answer. A body that finished
    /// meanwhile may be releasing it too, from its own task, which a shutdown does not wait for:
    /// the release is sent from here anyway (the owner check makes the second harmless), and
    /// only the first reports an error.
    pub(super) async fn release_at_shutdown(
        &self,
        state: &Arc<LeaseState>,
    ) -> Result<(), LockError> {
        let first = state.mark_released();
        self.inner.watchdog.forget(state);
        self.inner.holdings.forget(state);
        let result = tokio::time::timeout(
            RELEASE_PATIENCE,
            Ending::of(state).send(&*self.inner.backend, &state.key, state.owner),
        )
        .await
        .unwrap_or_else(|_| Err(release_timed_out()));
        match result {
            Err(error) if first => Err(error),
            _ => Ok(()),
        }
    }

    /// Releases `state` without waiting: at once where the store is in-process, else queued on
    /// the background runtime. For `Drop`, which must not block.
    pub(crate) fn release_in_background(&self, state: &Arc<LeaseState>) {
        if self.queue_release_of(state) {
            tracing::debug!(key = %state.key, fence = state.fence, "distributed_lock: released on drop");
        }
    }

    /// Releases `state` without waiting, as [`release_in_background`](Self::release_in_background)
    /// does; `false`, sending nothing, if it was released already.
    pub(super) fn queue_release_of(&self, state: &Arc<LeaseState>) -> bool {
        let queued = self.inner.holdings.queued_release();
        if !state.mark_released() {
            return false;
        }
        self.inner.watchdog.forget(state);
        self.inner.holdings.forget(state);
        self.send_release(state.key.clone(), state.owner, queued, Ending::of(state));
        true
    }

    /// Ends `owner`'s hold of `key` as `ending` says without waiting, counted by a fresh
    /// queued-release guard.
    pub(super) fn queue_ending(&self, key: String, owner: Owner, ending: Ending) {
        let queued = self.inner.holdings.queued_release();
        self.send_release(key, owner, queued, ending);
    }

    /// Undoes an acquisition of `key` for `owner` with time to live `ttl` that went unanswered,
    /// without waiting, counted by a fresh queued-release guard: a release that also keeps a copy
    /// of the acquisition still on its way from taking effect
    /// ([`Backend::undo_acquire`](crate::backend::Backend::undo_acquire)). Tried again until it
    /// lands (see [`retry_undo`]).
    pub(super) fn queue_undo(&self, key: String, owner: Owner, ttl: Duration) {
        let queued = self.inner.holdings.queued_release();
        self.send_release(key, owner, queued, Ending::Undo { ttl });
    }

    /// Releases `key` for `owner` without waiting: at once where the store is in-process (it
    /// applies calls in order, so no copy of an acquisition can come after), else on the
    /// background runtime, counted by `queued` until it is done (an undo, tried again until it
    /// lands: for as long as a release is at most, [`RELEASE_PATIENCE`], then uncounted, so that
    /// a shutdown waits no longer for it than for any queued release).
    pub(super) fn send_release(
        &self,
        key: String,
        owner: Owner,
        queued: QueuedRelease,
        ending: Ending,
    ) {
        send_ending(
            &self.inner.backend,
            &self.inner.holdings,
            key,
            owner,
            queued,
            ending,
        );
    }
}

/// The endings of leases with a hold, for the watchdog (see [`HoldEndings`]). Holds the store
/// and the holdings, not the locker, so that a locker dropped while a renewal is on its way does
/// not leave the key stretched.
pub(super) struct HoldEndingsOf {
    pub(super) backend: Arc<dyn DynBackend>,
    pub(super) holdings: Arc<Holdings>,
}

impl HoldEndings for HoldEndingsOf {
    /// Counted as a queued release, and for no longer than one may take ([`RELEASE_PATIENCE`]):
    /// a renewal the store leaves unanswered is waited for until the validity of the batch's
    /// longest lease, which must not hold a shutdown up that long.
    fn renewal_on_its_way(&self) -> Box<dyn Send> {
        let queued = self.holdings.queued_release();
        let (answered, on_its_way) = tokio::sync::oneshot::channel::<()>();
        background::spawn(async move {
            let _queued = queued;
            // Ends when the guard below is dropped (the renewal was answered or given up).
            let _ = tokio::time::timeout(RELEASE_PATIENCE, on_its_way).await;
        });
        Box::new(answered)
    }

    /// The hold's expiry, whose sending becomes a release once the hold is over and is retried
    /// past its end as one (as [`Ending::ExpireAt`] always is), counted as a queued release.
    fn end_again(&self, state: &LeaseState) {
        let Some(hold_until) = state.hold_until() else {
            return;
        };
        send_ending(
            &self.backend,
            &self.holdings,
            state.key.clone(),
            state.owner,
            self.holdings.queued_release(),
            Ending::ExpireAt(hold_until),
        );
    }
}

/// [`Locker::send_release`], on `backend` and counted among `holdings`.
fn send_ending(
    backend: &Arc<dyn DynBackend>,
    holdings: &Arc<Holdings>,
    key: String,
    owner: Owner,
    queued: QueuedRelease,
    ending: Ending,
) {
    if ending == Ending::Release && backend.release_now(&key, owner) {
        return;
    }
    let backend = backend.clone();
    let started = Instant::now();
    let Some(give_up_at) = ending.retried_until(started) else {
        background::spawn(async move {
            let _queued = queued;
            let ending = ending.send(&*backend, &key, owner);
            // Bounded, so a store that never answers cannot hold a shutdown up for good.
            let result = tokio::time::timeout(RELEASE_PATIENCE, ending)
                .await
                .unwrap_or_else(|_| Err(release_timed_out()));
            if let Err(error) = result {
                tracing::warn!(%key, %error, "distributed_lock: queued release failed; the lease will expire");
            }
        });
        return;
    };
    let holdings = holdings.clone();
    background::spawn(async move {
        let retries = retry(&backend, &key, owner, ending, give_up_at, &holdings);
        tokio::pin!(retries);
        // A shutdown waits for it as long as for any queued release, and no longer.
        tokio::select! {
            () = &mut retries => return,
            () = tokio::time::sleep_until((started + RELEASE_PATIENCE).into()) => {}
        }
        drop(queued);
        retries.await;
    });
}

/// Sends `ending` for `owner`'s hold of `key` until the store answers it. One that fails (the
/// store unreachable, a connection that cannot be made) is tried again, backing off, until
/// `give_up_at` (see [`Ending::retried_until`]). A shutdown ends the retries: the ending is
/// tried once more at once, and given up if that fails too, as a release is (the shutdown
/// closes the store).
async fn retry(
    backend: &Arc<dyn DynBackend>,
    key: &str,
    owner: Owner,
    ending: Ending,
    give_up_at: Instant,
    holdings: &Holdings,
) {
    let mut pause = FIRST_RETRY;
    loop {
        let result = tokio::time::timeout(RELEASE_PATIENCE, ending.send(&**backend, key, owner))
            .await
            .unwrap_or_else(|_| Err(release_timed_out()));
        let Err(error) = result else { return };
        if holdings.is_closed() || Instant::now() + pause >= give_up_at {
            tracing::warn!(%key, %error, ?ending, "distributed_lock: giving up on a lease's ending; the key is held until its lease expires");
            return;
        }
        tracing::debug!(%key, %error, ?ending, retry_in = ?pause, "distributed_lock: a lease's ending failed; trying again");
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = holdings.closed() => {}
        }
        pause = (pause * 2).min(LAST_RETRY);
    }
}

/// How a lease's hold of its key ends on the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    /// A lease, whose acquisition was answered: released.
    Release,
    /// An acquisition dropped or failed unanswered, asked for `ttl`, a copy of which may still
    /// reach the store: undone ([`Backend::undo_acquire`](crate::backend::Backend::undo_acquire)),
    /// and tried again until it lands (see [`retry`]).
    Undo { ttl: Duration },
    /// A lease released before the end of its hold
    /// ([`LockOptions::hold_at_least`](crate::LockOptions::hold_at_least)): left to expire by
    /// itself at that instant (released, where it has passed by the time this is sent), and
    /// tried again until it lands: a hold that ended with a failure would let the next replica
    /// in as soon as the lease's last renewal ran out.
    ExpireAt(Instant),
}

impl Ending {
    /// How `state`, released now, ends: released, or left to expire at the end of its hold.
    pub(super) fn of(state: &LeaseState) -> Ending {
        match state.hold_until() {
            Some(until) if until > Instant::now() => Ending::ExpireAt(until),
            _ => Ending::Release,
        }
    }

    /// Until when an ending that fails is tried again, counted from `started`, when it was first
    /// sent; `None` for a release, which is sent once (a lease not released expires by itself).
    /// An undo, for as long as a copy of the acquisition could still take effect or a grant it
    /// got could still hold the key: its ttl, and the minute a store's cancel marker lasts
    /// (Redis). A hold, until its end, and a while longer: past its end, a try releases the key
    /// instead (see [`send`](Self::send)), rather than leave it to the lease's last renewal.
    fn retried_until(self, started: Instant) -> Option<Instant> {
        match self {
            Ending::Release => None,
            Ending::Undo { ttl } => started.checked_add(ttl.saturating_add(UNDO_AFTERLIFE)),
            Ending::ExpireAt(until) => Some(until.checked_add(UNDO_AFTERLIFE).unwrap_or(until)),
        }
    }

    /// Sends the ending for `owner`'s lease of `key` to `backend`; whether `owner` held it.
    async fn send(
        self,
        backend: &dyn DynBackend,
        key: &str,
        owner: Owner,
    ) -> Result<bool, LockError> {
        match self {
            Ending::Release => backend.release(key, owner).await,
            Ending::Undo { .. } => backend.undo_acquire(key, owner).await,
            Ending::ExpireAt(until) => match until.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => backend.expire_after(key, owner, left).await,
                _ => backend.release(key, owner).await,
            },
        }
    }
}

/// How long a release may take before it is given up (the lease then expires with its ttl): a
/// store's own time-outs end it sooner, this bounds one that has none.
const RELEASE_PATIENCE: Duration = Duration::from_secs(10);

/// The first pause before an ending that failed (an undo, a hold's expiry) is tried again; it
/// doubles up to [`LAST_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(200);

/// The longest pause between two tries of an ending.
const LAST_RETRY: Duration = Duration::from_secs(5);

/// How long past an acquisition's ttl its undo is still tried: as long as the cancel marker an
/// undo leaves on Redis lives, which turns away a copy of the acquisition landing meanwhile.
const UNDO_AFTERLIFE: Duration = Duration::from_secs(60);

fn release_timed_out() -> LockError {
    LockError::backend(format!(
        "the store did not answer a release within {RELEASE_PATIENCE:?}"
    ))
}
