//! One acquisition's shared state: its key, owner and fence, and its validity as the client
//! reckons it. The guard that releases it, [`Lease`](crate::Lease), lives beside the `Locker`
//! that hands it out.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::AbortHandle;

use crate::clock;
use crate::metrics;
use crate::notified;
use crate::reentry::Turns;
use crate::{Mode, Owner};

/// The shared state of one held lease: read by its holder, `current_lease()` and the watchdog.
pub(crate) struct LeaseState {
    pub(crate) id: u64,
    /// The key the store holds the lease under, which renewals and the release name.
    pub(crate) key: String,
    /// How much of `key` its holder sees as the lease's key ([`shown_key`](Self::shown_key)):
    /// all of it, but for a permit of a semaphore, which the store holds under the semaphore's
    /// key followed by the permit's own suffix, while its holder, `current_lease`, re-entry
    /// and errors know it by the semaphore's key. A length rather than a second string: no
    /// allocation, and a mutex's lease pays one `usize`.
    pub(crate) shown_len: usize,
    pub(crate) owner: Owner,
    /// Whether the lease is a reader's, which a nested write call may not re-enter.
    pub(crate) mode: Mode,
    pub(crate) fence: u64,
    pub(crate) ttl: Duration,
    pub(crate) locker_id: usize,
    /// Until when the lease is ours by the client's reckoning: the last confirmation's send time
    /// plus ttl less the safety margin, and never past `ends_at`. Nanoseconds on the `clock`
    /// origin.
    valid_until: AtomicU64,
    /// When the request behind the last confirmation the lease took was sent: its acquisition's
    /// at first, then its last renewal's. Nanoseconds on the `clock` origin. A store that expires
    /// keys would expire this lease a ttl after it.
    confirmed_at: AtomicU64,
    /// Where no confirmation takes the lease: set for a lease without renewal whose ttl the
    /// store shortened, which is confirmed at the shorter ttl's pace only up to its own ttl.
    /// `None` for every other lease.
    ends_at: Option<Instant>,
    lost: AtomicBool,
    released: AtomicBool,
    lost_wake: Notify,
    /// How many polls of bodies under `on_lost = "cancel"` are in progress: a stopped lease is
    /// at rest when none is (and no body under "continue" runs), and then no body under it ever
    /// works again. Shutdown releases a key only then.
    polls: AtomicUsize,
    /// How many bodies under `on_lost = "continue"` run under the lease now, each from its start
    /// to its end (a re-entered call's included, counted on the outer call's lease). Counted
    /// apart from `polls`: shutdown waits for these only until a deadline.
    running_on: AtomicUsize,
    rested: Notify,
    /// Set by a shutdown: no body may start another poll under the lease, which is still held,
    /// and renewed, until its bodies rest and shutdown releases it.
    stopping: AtomicBool,
    /// Which of the bodies re-entering this lease may run now (`reentry`).
    pub(crate) turns: Turns,
    /// The timer that releases the lease when its ttl runs out on a store that does not expire
    /// it then (`locker::expiry`): aborted when the lease is released sooner, so that a lease
    /// leaves nothing behind once released, however long its ttl.
    expiry: Mutex<Option<AbortHandle>>,
    /// For a renewed lease on a store that does not expire it (`locker::expiry`): what releases
    /// it, at the instant given, once it is lost for want of a confirmation. Taken by the loss,
    /// or dropped by the release.
    release_at_loss: Mutex<Option<ReleaseAt>>,
    /// Its labels and grant time, for the metrics; set by the acquisition that granted it.
    pub(crate) held: metrics::Held,
    /// Until when the key stays held however soon the lease is released
    /// ([`LockOptions::hold_at_least`](crate::LockOptions::hold_at_least)): a release before
    /// then sets the store to expire the key then instead. Read through
    /// [`hold_until`](Self::hold_until), which leaves it out until the lease was put to use.
    pub(crate) hold: Option<Instant>,
    /// Set when the lease is put to use: its body first polled, or the lease handed to a
    /// caller of [`Locker::lock`](crate::Locker::lock). The hold is its body's: a lease given back
    /// unused (a grant too late to run its body, a permit whose caller stopped waiting, a lease
    /// a shutdown ended before its body's first poll) frees the key rather than keep it for
    /// nobody until the hold's end. Opt-in, so that no ending sent before a give-back was
    /// noticed can carry the hold.
    in_use: AtomicBool,
}

/// Releases a lease on the store at the instant given, unless it was released before.
pub(crate) type ReleaseAt = Box<dyn FnOnce(Instant) + Send>;

/// Why a lease stopped being held, for the log.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LossCause {
    /// A renewal found another owner (or no owner) on the store.
    Refused,
    /// No renewal was confirmed before the validity ran out (a confirmation that came after it
    /// included).
    Unconfirmed,
    /// Its locker was shut down while the lease was held.
    ShutDown,
}

/// A body at work under a lease: a poll in progress, or a body under `on_lost = "continue"`
/// running. Uncounts it when dropped: when the poll or the run ends, panics or is cancelled.
pub(crate) struct AtWork<'a> {
    lease: &'a LeaseState,
    count: &'a AtomicUsize,
}

impl Drop for AtWork<'_> {
    fn drop(&mut self) {
        let lease = self.lease;
        // Only a stopped or lost lease has anyone waiting for it to rest.
        if self.count.fetch_sub(1, Ordering::SeqCst) == 1
            && (lease.is_stopping() || lease.is_lost())
        {
            lease.rested.notify_waiters();
        }
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

impl LeaseState {
    pub(crate) fn new(
        key: String,
        owner: Owner,
        fence: u64,
        ttl: Duration,
        valid_from: Instant,
        locker_id: usize,
    ) -> Self {
        LeaseState {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            shown_len: key.len(),
            key,
            owner,
            mode: Mode::Write,
            fence,
            ttl,
            locker_id,
            valid_until: AtomicU64::new(clock::to_nanos(Self::validity_from(valid_from, ttl))),
            confirmed_at: AtomicU64::new(clock::to_nanos(valid_from)),
            ends_at: None,
            lost: AtomicBool::new(false),
            released: AtomicBool::new(false),
            lost_wake: Notify::new(),
            polls: AtomicUsize::new(0),
            running_on: AtomicUsize::new(0),
            rested: Notify::new(),
            stopping: AtomicBool::new(false),
            turns: Turns::new(),
            expiry: Mutex::new(None),
            release_at_loss: Mutex::new(None),
            held: metrics::Held::uncounted(),
            hold: None,
            in_use: AtomicBool::new(false),
        }
    }

    /// Until when the key stays held however soon the lease is released; `None` without a hold,
    /// or where the lease was never [put to use](Self::put_to_use).
    pub(crate) fn hold_until(&self) -> Option<Instant> {
        self.hold.filter(|_| self.in_use.load(Ordering::Acquire))
    }

    /// Marks the lease as put to use (its body polled, or handed to a caller): its hold, if any,
    /// applies from now on.
    pub(crate) fn put_to_use(&self) {
        self.in_use.store(true, Ordering::Release);
    }

    /// The same lease, never valid past its full ttl, `full_ttl`, counted from `valid_from`:
    /// for a lease without renewal whose ttl the store shortened to `self.ttl`. Its
    /// confirmations, which come at the shorter ttl's pace, keep it until then and no longer,
    /// as an unrenewed lease of `full_ttl` would be kept; they go on until then once one has
    /// reached it, so that a key taken away meanwhile is noticed as soon as on a renewed lease.
    pub(crate) fn ending_after(mut self, valid_from: Instant, full_ttl: Duration) -> Self {
        let ends_at = Self::validity_from(valid_from, full_ttl);
        self.ends_at = Some(ends_at);
        self.valid_until
            .fetch_min(clock::to_nanos(ends_at), Ordering::AcqRel);
        self
    }

    /// The key as the lease's holder knows it: the key asked for (for a permit, the
    /// semaphore's, not the one the store holds it under).
    pub(crate) fn shown_key(&self) -> &str {
        &self.key[..self.shown_len]
    }

    /// Whether this lease is a permit of a semaphore (held under a key of its own), rather than
    /// the mutex of its key.
    pub(crate) fn is_permit(&self) -> bool {
        self.shown_len != self.key.len()
    }

    /// The number of the semaphore's permit this lease is, where it is one.
    pub(crate) fn permit_number(&self) -> Option<u32> {
        crate::locker::permit_number(&self.key[self.shown_len..])
    }

    fn validity_from(confirmed_at: Instant, ttl: Duration) -> Instant {
        confirmed_at + ttl.saturating_sub(clock::safety_margin(ttl))
    }

    pub(crate) fn valid_until(&self) -> Instant {
        clock::from_nanos(self.valid_until.load(Ordering::Acquire))
    }

    pub(crate) fn is_lost(&self) -> bool {
        // Sequentially consistent with the counts of bodies at work: see `start_poll`.
        self.lost.load(Ordering::SeqCst)
    }

    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// Whether the lease is held: not lost, stopped or released, and within its validity. A
    /// lease found past its validity is marked lost here, so that its loss is reported even when
    /// no timer has fired yet (the runtime was busy, or the grant itself arrived late), and so
    /// that it stays lost: a confirmation that comes later, though sent in time, cannot make a
    /// lease that read as lost read as held again.
    pub(crate) fn is_held(&self) -> bool {
        if self.is_lost() || self.is_stopping() || self.is_released() {
            return false;
        }
        if Instant::now() >= self.valid_until() {
            self.mark_lost(LossCause::Unconfirmed);
            return false;
        }
        true
    }

    /// Whether a shutdown is stopping the bodies under the lease.
    pub(crate) fn is_stopping(&self) -> bool {
        // Sequentially consistent with the counts of bodies at work: see `start_poll`.
        self.stopping.load(Ordering::SeqCst)
    }

    /// Stops the bodies under the lease at their next poll, for a shutdown, and tells whoever
    /// waits for its loss. The lease stays held, and renewed, until it is released: a body
    /// still inside a poll keeps the key until it rests.
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.lost_wake.notify_waiters();
    }

    /// Whether a body may be polled under this lease now: held, and within its validity (see
    /// [`is_held`](Self::is_held), which marks a lease past its validity lost).
    pub(crate) fn may_run(&self) -> bool {
        self.is_held()
    }

    /// Records a renewal the store confirmed for a request sent at `sent_at`. A lease that was
    /// already lost stays lost: its holder has been told, and may have stopped. So does one
    /// whose validity ran out before the answer came, though the request was sent in time:
    /// whoever looked meanwhile was told that it was lost (`is_held` marks it so, which keeps
    /// it lost should this confirmation pass the check below just before the deadline).
    pub(crate) fn confirm(&self, sent_at: Instant) {
        let valid_until = self.valid_until();
        if sent_at >= valid_until || Instant::now() >= valid_until {
            self.mark_lost(LossCause::Unconfirmed);
            return;
        }
        self.confirmed_at
            .fetch_max(clock::to_nanos(sent_at), Ordering::AcqRel);
        let mut until = Self::validity_from(sent_at, self.ttl);
        if let Some(ends_at) = self.ends_at {
            until = until.min(ends_at);
        }
        self.valid_until
            .fetch_max(clock::to_nanos(until), Ordering::AcqRel);
        if self.is_lost() {
            // Lost between the check above and the store: keep it lost.
            return;
        }
        tracing::trace!(key = %self.key, fence = self.fence, "distributed_lock: renewed");
    }

    /// Marks the lease lost and wakes whoever waits on [`wait_lost`](Self::wait_lost). A lease
    /// lost for want of a confirmation on a store that does not expire it is released a ttl
    /// after its last confirmed request was sent (see [`release_when_lost`](Self::release_when_lost)).
    pub(crate) fn mark_lost(&self, cause: LossCause) {
        if self.is_released() || self.lost.swap(true, Ordering::SeqCst) {
            return;
        }
        if let LossCause::Unconfirmed = cause {
            // Only this loss leaves the key held on the store: a refusal says it is not ours,
            // and a shutdown releases it itself.
            // Taken out first: the release locks the expiry timer's slot, never under this one.
            let release = self.release_at_loss().take();
            if let Some(release) = release {
                release(self.store_expires_at());
            }
        }
        match cause {
            LossCause::ShutDown => {
                tracing::debug!(key = %self.key, fence = self.fence, "distributed_lock: lease given up at shutdown");
            }
            // A lease dlock took for itself (a semaphore's turnstile, held a few seconds at
            // most) ends so by design.
            _ if !self.held.asked_for => {
                tracing::debug!(key = %self.key, fence = self.fence, ?cause, "distributed_lock: an internal lease ran out");
            }
            _ => {
                tracing::warn!(key = %self.key, fence = self.fence, ?cause, "distributed_lock: lease lost");
                self.held.lost();
            }
        }
        self.held.end();
        self.lost_wake.notify_waiters();
    }

    /// Marks the lease released; `false` if it was already. Ends its expiry timer, if any, and
    /// wakes whoever waits on [`wait_lost`](Self::wait_lost): marked before the store is asked
    /// to release, so a task told to stop at the loss is told before the key can be the next
    /// holder's, rather than when the lease's validity would have run out.
    pub(crate) fn mark_released(&self) -> bool {
        if self.released.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.held.end();
        if let Some(timer) = self.expiry().take() {
            timer.abort();
        }
        self.release_at_loss().take();
        self.lost_wake.notify_waiters();
        true
    }

    /// Has `release` called when the lease is lost for want of a confirmation, with the instant
    /// a store that expires keys would expire it: a ttl after its last confirmed request was
    /// sent. For a renewed lease on a store that keeps a key as long as its holder's session
    /// (ZooKeeper): its holder may keep the `Lease`, or run a body on under `on_lost =
    /// "continue"`, long after the loss, and the key would stay held by nobody until then. Set
    /// before the lease is watched or handed out, so no such loss comes sooner.
    pub(crate) fn release_when_lost(&self, release: ReleaseAt) {
        *self.release_at_loss() = Some(release);
    }

    /// When a store that expires keys would expire the lease: a ttl after the request behind
    /// its last confirmation was sent.
    fn store_expires_at(&self) -> Instant {
        clock::from_nanos(self.confirmed_at.load(Ordering::Acquire)) + self.ttl
    }

    fn release_at_loss(&self) -> MutexGuard<'_, Option<ReleaseAt>> {
        self.release_at_loss
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Keeps `timer`, the task that ends the lease at its ttl, to abort it when the lease is
    /// released sooner. Stored first and checked after, as `mark_released` sets `released` and
    /// then takes the timer: either that finds the timer here, or this sees the lease released.
    pub(crate) fn set_expiry(&self, timer: AbortHandle) {
        *self.expiry() = Some(timer);
        if self.is_released() {
            if let Some(timer) = self.expiry().take() {
                timer.abort();
            }
        }
    }

    /// Forgets the expiry timer without aborting it: for the timer itself, which goes on to
    /// release the lease.
    pub(crate) fn expiry_fired(&self) {
        self.expiry().take();
    }

    fn expiry(&self) -> MutexGuard<'_, Option<AbortHandle>> {
        self.expiry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts a poll of a body under `on_lost = "cancel"` until the guard drops: call it before
    /// checking [`may_run`](Self::may_run), and poll the body only if that says yes. Counted
    /// first and checked after, both sequentially consistent, as [`stop`](Self::stop) sets
    /// `stopping` and then [`wait_at_rest`](Self::wait_at_rest) reads the count: either the body
    /// sees the stop and does not work, or the waiter sees the body at work and waits for it.
    pub(crate) fn start_poll(&self) -> AtWork<'_> {
        Self::count(self, &self.polls)
    }

    /// Counts a body under `on_lost = "continue"` as running until the guard drops, however it
    /// ends; as [`start_poll`](Self::start_poll), call it before checking `may_run`.
    pub(crate) fn start_running_on(&self) -> AtWork<'_> {
        Self::count(self, &self.running_on)
    }

    fn count<'a>(lease: &'a LeaseState, count: &'a AtomicUsize) -> AtWork<'a> {
        count.fetch_add(1, Ordering::SeqCst);
        AtWork { lease, count }
    }

    /// Resolves once no body works under the lease: no poll in progress, however long that
    /// takes, and no body under `on_lost = "continue"` running, or `continue_deadline` passed
    /// (such a body may be parked for good, and runs on without the key after it, as after any
    /// loss). Once the lease is stopped, a body at rest never works again (`may_run` refuses),
    /// so its key can go to the next holder.
    pub(crate) async fn wait_at_rest(&self, continue_deadline: Instant) {
        let no_poll = || self.polls.load(Ordering::SeqCst) == 0;
        let at_rest = notified::until(&self.rested, || {
            no_poll() && self.running_on.load(Ordering::SeqCst) == 0
        });
        if tokio::time::timeout_at(continue_deadline.into(), at_rest)
            .await
            .is_err()
        {
            notified::until(&self.rested, no_poll).await;
        }
    }

    /// Resolves when the lease is no longer held: lost, stopped by a shutdown, or released.
    /// Lost is marked by the watchdog, or judged here on the client's clock when the lease runs
    /// past its validity with no confirmation, so that it is seen even when the store cannot be
    /// reached. A release counts: whatever waits for the loss (a task the body spawned, a
    /// sibling waiting for its turn) must not work on beside the key's next holder.
    pub(crate) async fn wait_lost(&self) {
        loop {
            let woken = self.lost_wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.is_lost() || self.is_stopping() || self.is_released() {
                return;
            }
            let until = self.valid_until();
            if Instant::now() >= until {
                self.mark_lost(LossCause::Unconfirmed);
                return;
            }
            tokio::select! {
                () = woken => {}
                () = clock::sleep_until(until) => {}
            }
        }
    }
}

/// What an annotated body can see of the lease it runs under, from
/// [`current_lease()`](crate::current_lease): its key, its fence, and whether it is still held.
/// Cheap to clone; a clone kept after the lease was released reports it as no longer held.
///
/// ```
/// use std::sync::LazyLock;
/// use dlock::{current_lease, distributed_lock, LockError, Locker};
///
/// static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);
///
/// #[distributed_lock(key = "payout:<batch>", locker = &LOCKS)]
/// async fn pay_out(batch: u32) -> Result<(), LockError> {
///     let lease = current_lease().expect("inside a locked body");
///     tracing::info!(key = lease.key(), fence = lease.fence(), "paying out");
///     Ok(())
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// # pay_out(3).await.unwrap();
/// # }
/// ```
#[derive(Clone)]
pub struct LeaseInfo {
    pub(crate) state: Arc<LeaseState>,
}

impl LeaseInfo {
    /// The key of the lease, as rendered from the attribute's template.
    ///
    /// ```
    /// # use std::sync::LazyLock;
    /// # use dlock::{current_lease, distributed_lock, LockError, Locker};
    /// # static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);
    /// #[distributed_lock(key = "acct:<open_id>", locker = &LOCKS)]
    /// async fn submit(open_id: &str) -> Result<String, LockError> {
    ///     Ok(current_lease().expect("inside a locked body").key().to_owned())
    /// }
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// assert_eq!(submit("a:b").await.unwrap(), "acct:a%3Ab");
    /// # }
    /// ```
    pub fn key(&self) -> &str {
        self.state.shown_key()
    }

    /// The fencing token of the acquisition (see [`Lease::fence`](crate::Lease::fence)): pass
    /// it with each write the lock protects.
    ///
    /// ```
    /// # use std::sync::LazyLock;
    /// # use dlock::{current_lease, distributed_lock, LockError, Locker};
    /// # static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);
    /// # struct Db;
    /// # impl Db { async fn set_stock(&self, _sku: &str, _units: u32, _fence: u64) -> Result<(), LockError> { Ok(()) } }
    /// #[distributed_lock(key = "stock:<sku>", locker = &LOCKS)]
    /// async fn set_stock(db: &Db, sku: &str, units: u32) -> Result<(), LockError> {
    ///     let fence = current_lease().expect("inside a locked body").fence();
    ///     db.set_stock(sku, units, fence).await // refused by the database if a newer fence wrote
    /// }
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # set_stock(&Db, "sku-1", 3).await.unwrap();
    /// # }
    /// ```
    pub fn fence(&self) -> u64 {
        self.state.fence
    }

    /// Whether the lease is still held (see [`Lease::is_held`](crate::Lease::is_held)). A body
    /// under `on_lost = "continue"` checks it before a step that must not run on a lost lease.
    ///
    /// ```
    /// # use std::sync::LazyLock;
    /// # use dlock::{current_lease, distributed_lock, LockError, Locker};
    /// # static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);
    /// #[distributed_lock(key = "export:<day>", on_lost = "continue", locker = &LOCKS)]
    /// async fn export(day: &str) -> Result<(), LockError> {
    ///     // … write the export to a temporary file …
    ///     if !current_lease().expect("inside a locked body").is_held() {
    ///         return Err(LockError::Lost { key: format!("export:{day}") });
    ///     }
    ///     // … move it into place …
    ///     Ok(())
    /// }
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # export("2026-11-30").await.unwrap();
    /// # }
    /// ```
    pub fn is_held(&self) -> bool {
        self.state.is_held()
    }

    /// Resolves when the lease is lost (see [`Lease::lost`](crate::Lease::lost)), or released:
    /// a task the body spawned that stops at it stops when the body ends, too. A body under
    /// `on_lost = "continue"` races it against its work, to stop at a point of its own choosing.
    ///
    /// # Errors
    ///
    /// None: the future's output is `()`.
    ///
    /// # Cancel safety
    ///
    /// Dropping it does nothing to the lease; a new call resolves at once for a lease lost
    /// already.
    ///
    /// ```
    /// # use std::sync::LazyLock;
    /// # use dlock::{current_lease, distributed_lock, LockError, Locker};
    /// # static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);
    /// # async fn copy_next_chunk() -> bool { false }
    /// #[distributed_lock(key = "backfill", on_lost = "continue", locker = &LOCKS)]
    /// async fn backfill() -> Result<(), LockError> {
    ///     let lease = current_lease().expect("inside a locked body");
    ///     loop {
    ///         tokio::select! {
    ///             more = copy_next_chunk() => if !more { return Ok(()) },
    ///             () = lease.lost() => return Err(LockError::Lost { key: lease.key().to_owned() }),
    ///         }
    ///     }
    /// }
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # backfill().await.unwrap();
    /// # }
    /// ```
    pub fn lost(&self) -> impl Future<Output = ()> + Send + '_ {
        self.state.wait_lost()
    }
}

impl std::fmt::Debug for LeaseInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseInfo")
            .field("key", &self.state.shown_key())
            .field("fence", &self.state.fence)
            .field("held", &self.is_held())
            .finish()
    }
}
