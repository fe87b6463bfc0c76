//! Waiting for a busy key without polling: one `LISTEN` connection per backend, on which every
//! release of the table is announced, and a first-come first-served queue per key of this
//! backend's waiters, whose head alone asks the database.
//!
//! A head's turn lapses: a head woken (or due to look again) that has not started its try within
//! [`HEAD_TURN`], or whose try has not come back within [`TRY_TURN`], is taken to be a waiter
//! whose future is no longer polled (parked in a `select!`, its runtime stalled). The next
//! waiter passes it over and asks the database itself, a try-once acquisition no longer counts
//! it as a waiter, and this backend stops keeping its place in the line across processes
//! (see `line`); the passed-over waiter, polled again, queues again at the back.
//!
//! A release's statement `NOTIFY`s the table's channel with the key (hex-encoded) as payload;
//! the listener wakes the head of that key's queue, which tries again. A release made through
//! this backend first offers the key to its own head at rest (see [`Waiting::offer`]): the
//! release's statement then hands the row over to that waiter, unless another process's waiter
//! is ahead in the line across processes, and the waiter takes the grant without a statement of
//! its own. That hand-off is announced too (its payload names this backend, whose listener
//! passes it by), so other processes' heads try, are refused, and take their places in line.
//! When the
//! listening connection drops, every head is woken (a notification may have been missed), the
//! heads poll with jittered back-off meanwhile, and the listener connects again by itself.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use crate::backend::claim::Caller;
use crate::backend::sql::Backoff;
use crate::background;
use crate::Owner;

/// How long a head may take to start its try after it was woken (or its own pause ran out)
/// before the next waiter passes it over. A polled head starts at once: only a future nobody
/// polls takes this long.
pub(super) const HEAD_TURN: Duration = Duration::from_secs(1);

/// How long a head's try may take before the next waiter passes it over: a try whose caller is
/// parked is answered, but nobody comes for the answer, so the head would keep its turn for as
/// long as its future is kept. A statement stuck behind another transaction's row lock gives up
/// after `lock_timeout` (2 s on the backend's own connections); a second more covers the round
/// trips. A live head passed over this way only queues again: the database decides who holds.
pub(super) const TRY_TURN: Duration =
    Duration::from_secs(crate::backend::sql::ROW_LOCK_PATIENCE_S + 1);

/// The longest pause between two tries of a listener that cannot connect.
const MAX_RECONNECT_PAUSE: Duration = Duration::from_secs(2);

/// The waiters of one backend, and its listener.
#[derive(Clone)]
pub(super) struct Waiting {
    shared: Arc<Shared>,
}

struct Shared {
    /// This backend's name in the waiters table, which its own hand-offs' notifications carry.
    name: String,
    state: Mutex<State>,
    listener: Mutex<Option<AbortHandle>>,
    /// Signalled each time the listener starts listening.
    listening_changed: Notify,
    /// Signalled when this backend has a place in the line across processes to give up.
    places_left: Notify,
}

#[derive(Default)]
struct State {
    /// Each key's waiters of this backend, in arrival order; the first is the head.
    queues: HashMap<Vec<u8>, VecDeque<Waiter>>,
    /// The generation of the listening connection while it listens; `None` while it does not.
    listening: Option<u64>,
    generation: u64,
    /// The keys for which this backend holds a place in the waiters table (as far as it knows:
    /// a place it did not keep in time lapses there, and its next try takes a new one).
    in_line: HashSet<Vec<u8>>,
    /// Places in line this backend's last waiter for the key left without the key: to give up.
    leaving: HashSet<Vec<u8>>,
}

/// One waiter in its key's queue.
struct Waiter {
    wake: Arc<Notify>,
    /// See [`Place::hand_over_lost`].
    lost: Arc<AtomicBool>,
    /// Who waits, for a release to hand the key to.
    owner: Arc<str>,
    ttl_us: i64,
    /// Where a release is handing the key to this waiter.
    offer: Offer,
    /// While it is the head: when it is due to start its next try (it was woken, or its own
    /// pause runs out then). `None` while a try is under way and nothing woke it meanwhile.
    due: Option<Instant>,
    /// While a try of this head is under way: when it started.
    trying_since: Option<Instant>,
}

/// A release's hand-off of the key to a waiter at rest.
enum Offer {
    None,
    /// The release's statement is on its way: the waiter starts no try of its own meanwhile (a
    /// try's grant and the hand-off's could cross).
    InFlight,
    /// The waiter holds the key, once it claims the grant.
    Handed(Handed),
}

/// A grant a release handed to a waiter of this backend: the waiter's lease once it claims it;
/// dropped unclaimed (the waiter's future dropped, or passed over), it is withdrawn, and the
/// release's clean-up deletes the row.
pub(super) struct Handed {
    pub(super) fence: u64,
    /// When the release's statement was sent: the lease's validity counts from then.
    pub(super) valid_from: Instant,
    pub(super) caller: Caller,
}

/// The waiter a release offers the key to (see [`Waiting::offer`]).
pub(super) struct Offered {
    wake: Arc<Notify>,
    lost: Arc<AtomicBool>,
    pub(super) owner: Arc<str>,
    pub(super) ttl_us: i64,
    /// Whether other waiters of this backend wait behind it.
    pub(super) others_behind: bool,
}

/// What a head is to do next (see [`Place::start_try`]).
pub(super) enum Start {
    /// Ask the database.
    Try,
    /// Wait: a release is handing the key to this waiter.
    Wait,
    /// Claim the key a release handed over.
    Handed(Handed),
}

impl Waiter {
    fn is(&self, wake: &Arc<Notify>) -> bool {
        Arc::ptr_eq(&self.wake, wake)
    }

    /// When this head's turn lapses: [`HEAD_TURN`] after it was due to try, or [`TRY_TURN`]
    /// after its try started, whichever is first; never while a release hands it the key (see
    /// [`Waiting::offer`]).
    fn lapses_at(&self) -> Option<Instant> {
        let due = self.due.map(|due| due + HEAD_TURN);
        let trying = self.trying_since.map(|since| since + TRY_TURN);
        match (due, trying) {
            (Some(due), Some(trying)) => Some(due.min(trying)),
            (due, trying) => due.or(trying),
        }
    }

    /// Whether this head let its turn lapse by `now`.
    fn lapsed(&self, now: Instant) -> bool {
        self.lapses_at().is_some_and(|lapses| now >= lapses)
    }
}

impl State {
    fn wake_head(&mut self, key: &[u8]) {
        if let Some(queue) = self.queues.get_mut(key) {
            wake_front(queue, Instant::now());
        }
    }

    fn wake_every_head(&mut self) {
        let now = Instant::now();
        for queue in self.queues.values_mut() {
            wake_front(queue, now);
        }
    }
}

/// Wakes `queue`'s head, which is due to try from `now`, and the waiter behind it, which then
/// looks again at when the head's turn lapses.
fn wake_front(queue: &mut VecDeque<Waiter>, now: Instant) {
    let Some(head) = queue.front_mut() else {
        return;
    };
    // A head a release is handing the key to waits for that release, which tells it (its
    // turn does not lapse meanwhile).
    if !matches!(head.offer, Offer::InFlight) {
        head.due = Some(head.due.map_or(now, |due| due.min(now)));
    }
    head.wake.notify_one();
    if let Some(next) = queue.get(1) {
        next.wake.notify_one();
    }
}

/// What the place keeper is to do (see [`Waiting::places`]).
pub(super) struct Places {
    pub(super) keep: Vec<Vec<u8>>,
    pub(super) leave: Vec<Vec<u8>>,
    pub(super) waited: Vec<Vec<u8>>,
}

/// Where a waiter stands.
pub(super) enum Turn {
    /// At the head: it asks the database.
    Head,
    /// Behind another waiter, whose turn lapses at the given time (`None`: the head was not
    /// due to try yet, which the waiter hears of when it is).
    Behind(Option<Instant>),
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while the state is locked; a poisoned lock must not stop every waiter.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(listener) = self.listener.get_mut().ok().and_then(Option::take) {
            listener.abort();
        }
    }
}

impl Waiting {
    /// The waiting of the backend called `name` in the waiters table.
    pub(super) fn new(name: String) -> Waiting {
        Waiting {
            shared: Arc::new(Shared {
                name,
                state: Mutex::default(),
                listener: Mutex::new(None),
                listening_changed: Notify::new(),
                places_left: Notify::new(),
            }),
        }
    }

    /// Whether some waiter of this backend is queued for `key` and its head has not let its
    /// turn lapse: a try-once acquisition then finds the key busy rather than overtake them.
    pub(super) fn has_waiters(&self, key: &[u8]) -> bool {
        let now = Instant::now();
        self.shared
            .state()
            .queues
            .get(key)
            .and_then(VecDeque::front)
            .is_some_and(|head| !head.lapsed(now))
    }

    /// Records whether this backend holds a place in the line across processes for `key`, as a
    /// try's answer says: busy, whether it holds one now; granted, its place was given up by the
    /// statement that granted it.
    pub(super) fn in_line(&self, key: &[u8], in_line: bool) {
        let mut state = self.shared.state();
        if in_line && !state.queues.contains_key(key) {
            // Kept for waiters that have all left since: given up, as their last one would.
            state.in_line.remove(key);
            state.leaving.insert(key.to_vec());
            self.shared.places_left.notify_one();
        } else if in_line {
            state.leaving.remove(key);
            state.in_line.insert(key.to_vec());
        } else {
            state.in_line.remove(key);
        }
    }

    /// This backend's places in line: those to keep (a head waits for the key and has not let
    /// its turn lapse) and those to give up (no waiter of this backend is left for the key);
    /// and the keys its live heads wait for, in line or not.
    pub(super) fn places(&self) -> Places {
        let now = Instant::now();
        let mut state = self.shared.state();
        let leave: Vec<Vec<u8>> = state.leaving.drain().collect();
        let waited: Vec<Vec<u8>> = state
            .queues
            .iter()
            .filter(|(_, queue)| queue.front().is_some_and(|head| !head.lapsed(now)))
            .map(|(key, _)| key.clone())
            .collect();
        let keep = waited
            .iter()
            .filter(|key| state.in_line.contains(*key))
            .cloned()
            .collect();
        Places {
            keep,
            leave,
            waited,
        }
    }

    /// Wakes the head of `key`'s queue, to try again now.
    pub(super) fn wake(&self, key: &[u8]) {
        self.shared.state().wake_head(key);
    }

    /// The places this backend is to give up, and no longer holds as far as it knows: all of
    /// them, at shutdown.
    pub(super) fn leave_every_place(&self) -> Vec<Vec<u8>> {
        let mut state = self.shared.state();
        let mut leave: Vec<Vec<u8>> = state.leaving.drain().collect();
        leave.extend(state.in_line.drain());
        leave
    }

    /// Resolves when a place in line is to be given up (or was, since the last call).
    pub(super) async fn place_left(&self) {
        self.shared.places_left.notified().await;
    }

    /// Queues `owner`, waiting for `key` with a lease of `ttl_us`, last. Dropping the place
    /// leaves the queue.
    pub(super) fn join(&self, key: &[u8], owner: &str, ttl_us: i64) -> Place {
        let place = Place {
            shared: self.shared.clone(),
            key: key.to_vec(),
            wake: Arc::new(Notify::new()),
            lost: Arc::default(),
            owner: Arc::from(owner),
            ttl_us,
        };
        enqueue(&mut self.shared.state(), &place);
        place
    }

    /// The waiter a release of `key` by this backend is to hand the key to: the head of its
    /// queue, at rest (no try of its own under way, which could be granted beside the hand-off)
    /// and its turn not lapsed. Until [`settle`](Self::settle) says how the hand-off went, it
    /// starts no try and is not passed over (the release's statement is bounded in time: see
    /// `HAND_OVER_PATIENCE`).
    pub(super) fn offer(&self, key: &[u8]) -> Option<Offered> {
        let now = Instant::now();
        let mut state = self.shared.state();
        let queue = state.queues.get_mut(key)?;
        let others_behind = queue.len() > 1;
        let head = queue.front_mut()?;
        if head.trying_since.is_some() || !matches!(head.offer, Offer::None) || head.lapsed(now) {
            return None;
        }
        head.offer = Offer::InFlight;
        head.due = None;
        head.trying_since = None;
        Some(Offered {
            wake: head.wake.clone(),
            lost: head.lost.clone(),
            owner: head.owner.clone(),
            ttl_us: head.ttl_us,
            others_behind,
        })
    }

    /// Tells the waiter `offered` that its hand-over ended without a known answer: its
    /// acquisition fails at its next poll (see [`Place::hand_over_lost`]), and its turn is over
    /// (passed over 1 s on if it is not polled), so the waiters behind it go on.
    pub(super) fn hand_over_lost(&self, key: &[u8], offered: &Offered) {
        offered.lost.store(true, Ordering::SeqCst);
        let _ = self.settle(key, offered, None);
        offered.wake.notify_one();
    }

    /// Tells the waiter `offered` how its hand-off went: `Some`, it holds the key once it
    /// claims the grant; `None`, it does not, and tries now. `Err` where the waiter is gone
    /// (its future dropped, or passed over), with the grant, for the caller to undo.
    pub(super) fn settle(
        &self,
        key: &[u8],
        offered: &Offered,
        handed: Option<Handed>,
    ) -> Result<(), Option<Handed>> {
        let now = Instant::now();
        let mut state = self.shared.state();
        let Some(waiter) = state
            .queues
            .get_mut(key)
            .and_then(|queue| queue.iter_mut().find(|waiter| waiter.is(&offered.wake)))
        else {
            return Err(handed);
        };
        if !matches!(waiter.offer, Offer::InFlight) {
            // Passed over while the release was on its way, and queued again since: a new
            // entry, which no release offered the key to.
            return Err(handed);
        }
        waiter.offer = handed.map_or(Offer::None, Offer::Handed);
        // Due now: to claim the grant, or to try. A waiter that does not come for its grant
        // within its turn is passed over, which withdraws the grant.
        waiter.trying_since = None;
        waiter.due = Some(now);
        waiter.wake.notify_one();
        Ok(())
    }

    /// The generation of the listening connection, while one listens: a notification sent
    /// while the same generation listens reaches this backend.
    pub(super) fn listening(&self) -> Option<u64> {
        self.shared.state().listening
    }

    /// Starts the listener, connecting with `options`, on `channel`; returns once it listens or
    /// `timeout` passed (it keeps trying in the background then, and waiters poll meanwhile).
    pub(super) async fn start_listener(
        &self,
        options: PgConnectOptions,
        channel: String,
        timeout: Duration,
    ) {
        let listening = self.shared.listening_changed.notified();
        let weak = Arc::downgrade(&self.shared);
        let task = background::handle().spawn(listen(weak, options, channel, timeout));
        if let Some(previous) = self
            .shared
            .listener
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .replace(task.abort_handle())
        {
            previous.abort();
        }
        if tokio::time::timeout(timeout, listening).await.is_err() {
            tracing::warn!(
                "distributed_lock: cannot LISTEN on PostgreSQL yet; waiters poll until it can"
            );
        }
    }

    /// Stops the listener, for shutdown.
    pub(super) fn stop(&self) {
        if let Some(listener) = self
            .shared
            .listener
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
        {
            listener.abort();
        }
        let mut state = self.shared.state();
        state.listening = None;
        state.wake_every_head();
    }
}

/// Queues `place`'s waiter last for its key; at the head at once, it is due to try now.
fn enqueue(state: &mut State, place: &Place) {
    let queue = state.queues.entry(place.key.clone()).or_default();
    let due = queue.is_empty().then(Instant::now);
    queue.push_back(Waiter {
        wake: place.wake.clone(),
        lost: place.lost.clone(),
        owner: place.owner.clone(),
        ttl_us: place.ttl_us,
        offer: Offer::None,
        due,
        trying_since: None,
    });
}

/// A waiter's place in its key's queue.
pub(super) struct Place {
    shared: Arc<Shared>,
    key: Vec<u8>,
    wake: Arc<Notify>,
    lost: Arc<AtomicBool>,
    owner: Arc<str>,
    ttl_us: i64,
}

impl Place {
    /// Where this waiter stands. A waiter right behind a head that let its turn lapse passes
    /// it over and is the head; a waiter that was passed over queues again, last.
    pub(super) fn turn(&self) -> Turn {
        let now = Instant::now();
        let mut state = self.shared.state();
        let queued = state
            .queues
            .get(&self.key)
            .is_some_and(|queue| queue.iter().any(|waiter| waiter.is(&self.wake)));
        if !queued {
            enqueue(&mut state, self);
        }
        let Some(queue) = state.queues.get_mut(&self.key) else {
            return Turn::Head; // Unreachable: it was just queued.
        };
        if queue.front().is_some_and(|head| head.is(&self.wake)) {
            return Turn::Head;
        }
        if queue.front().is_some_and(|head| head.lapsed(now)) {
            tracing::debug!(
                "distributed_lock: a PostgreSQL waiter did not take its turn; passed over"
            );
            // Told, so that polled again it queues again at once, rather than rest (its wake-ups
            // go to the queue's waiters only) until its own pause or deadline runs out.
            if let Some(passed_over) = queue.pop_front() {
                passed_over.wake.notify_one();
            }
            if queue.front().is_some_and(|head| head.is(&self.wake)) {
                return Turn::Head;
            }
            wake_front(queue, now);
        }
        Turn::Behind(queue.front().and_then(Waiter::lapses_at))
    }

    /// Whether a release that was handing this waiter the key lost its answer: whether the key
    /// is this waiter's is unknown, and its acquisition fails rather than try again under the
    /// same owner (the release's clean-up deletes by that owner what it may have written, and a
    /// late copy of that delete must find no lease of this owner to take).
    pub(super) fn hand_over_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// What this head is to do: claim a key a release handed it, wait while a release is
    /// handing it over, or else try (and its try starts now).
    pub(super) fn start_try(&self) -> Start {
        let mut start = Start::Try;
        self.change(
            |waiter| match std::mem::replace(&mut waiter.offer, Offer::None) {
                Offer::Handed(handed) => start = Start::Handed(handed),
                Offer::InFlight => {
                    waiter.offer = Offer::InFlight;
                    start = Start::Wait;
                }
                Offer::None => {
                    waiter.due = None;
                    waiter.trying_since = Some(Instant::now());
                }
            },
        );
        start
    }

    /// Whether other waiters of this backend wait for the key behind this one.
    pub(super) fn others_behind(&self) -> bool {
        self.shared
            .state()
            .queues
            .get(&self.key)
            .is_some_and(|queue| queue.iter().any(|waiter| !waiter.is(&self.wake)))
    }

    /// Says this head, its try done, is due to try again at `until` at the latest; the waiter
    /// behind it, which looks again when the head's turn lapses, is told the new time.
    pub(super) fn resting_until(&self, until: Instant) {
        self.change(|waiter| {
            waiter.trying_since = None;
            waiter.due = Some(waiter.due.map_or(until, |due| due.min(until)));
        });
        if let Some(next) = self
            .shared
            .state()
            .queues
            .get(&self.key)
            .and_then(|queue| queue.get(1))
        {
            next.wake.notify_one();
        }
    }

    fn change(&self, change: impl FnOnce(&mut Waiter)) {
        let mut state = self.shared.state();
        if let Some(waiter) = state
            .queues
            .get_mut(&self.key)
            .and_then(|queue| queue.iter_mut().find(|waiter| waiter.is(&self.wake)))
        {
            change(waiter);
        }
    }

    /// Resolves when this waiter should look again: it became the head, the key was released,
    /// or the listener's connection dropped. A wake-up that came before this call is not lost.
    pub(super) async fn woken(&self) {
        self.wake.notified().await;
    }
}

impl Place {
    /// Leaves the queue holding the key, its lease running out at `expires`: the next waiter
    /// rests until then rather than try now, which would only find the key busy (and, mid-try
    /// as the holder releases, miss the key the release would have handed it). A release
    /// announced, or handed to it, wakes it sooner.
    pub(super) fn holds_until(self, expires: Instant) {
        self.leave(Some(expires));
    }

    /// Leaves the queue; the next head is due to try at `next_due`, or now.
    fn leave(&self, next_due: Option<Instant>) {
        let mut state = self.shared.state();
        let Some(queue) = state.queues.get_mut(&self.key) else {
            return;
        };
        let was_head = queue.front().is_some_and(|head| head.is(&self.wake));
        queue.retain(|waiter| !waiter.is(&self.wake));
        if queue.is_empty() {
            state.queues.remove(&self.key);
            // The last waiter of this backend for the key: its place in line goes too, or it
            // would keep other processes' waiters from a free key until it lapsed.
            if state.in_line.remove(&self.key) {
                state.leaving.insert(self.key.clone());
                self.shared.places_left.notify_one();
            }
        } else if was_head {
            match (next_due, queue.front_mut()) {
                (Some(due), Some(next)) => {
                    next.due = Some(due);
                    // The waiter behind it looks again when its turn lapses.
                    if let Some(behind) = queue.get(1) {
                        behind.wake.notify_one();
                    }
                }
                // The next waiter's turn to ask the database.
                _ => state.wake_head(&self.key),
            }
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.leave(None);
    }
}

/// The listener's task: connects, listens, wakes the heads the notifications name, and on a
/// lost connection wakes every head and connects again, with back-off, until the backend goes.
async fn listen(weak: Weak<Shared>, options: PgConnectOptions, channel: String, timeout: Duration) {
    // A pool of one connection of the listener's own, which it uses only to (re)connect.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .max_lifetime(None)
        .idle_timeout(None)
        .acquire_timeout(timeout)
        .connect_lazy_with(options);
    let mut backoff = Backoff::new(
        Duration::from_millis(50),
        MAX_RECONNECT_PAUSE,
        Owner::random(),
    );
    loop {
        match connect(&pool, &channel).await {
            Ok(mut listener) => {
                let Some(shared) = weak.upgrade() else { return };
                {
                    let mut state = shared.state();
                    state.generation += 1;
                    state.listening = Some(state.generation);
                    // A release may have gone unannounced while nobody listened.
                    state.wake_every_head();
                }
                shared.listening_changed.notify_waiters();
                drop(shared);
                backoff.reset();
                // `Ok(None)`: the connection was lost; `Err`: it failed otherwise.
                while let Ok(Some(notification)) = listener.try_recv().await {
                    let Some(shared) = weak.upgrade() else { return };
                    if let Some(key) = released_key(notification.payload(), &shared.name) {
                        shared.state().wake_head(&key);
                    }
                }
                tracing::debug!("distributed_lock: PostgreSQL LISTEN connection lost; waiters poll until it is back");
            }
            Err(error) => {
                tracing::debug!(%error, "distributed_lock: cannot LISTEN on PostgreSQL; waiters poll meanwhile");
            }
        }
        let Some(shared) = weak.upgrade() else { return };
        {
            let mut state = shared.state();
            state.listening = None;
            state.wake_every_head();
        }
        drop(shared);
        tokio::time::sleep(backoff.next_pause()).await;
    }
}

async fn connect(pool: &sqlx::PgPool, channel: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.ignore_pool_close_event(true);
    // A lost connection is reported (`Ok(None)`) before it is replaced, so that the heads poll
    // while nobody listens.
    listener.eager_reconnect(false);
    listener.listen(channel).await?;
    Ok(listener)
}

/// The key a notification's payload says was released, or handed over: the key hex-encoded,
/// and after a hand-off a space and the name of the backend that handed it to its own waiter.
/// `None` for a payload this backend is to pass by: its own hand-offs (its queue knows), and
/// what it cannot read.
fn released_key(payload: &str, own_name: &str) -> Option<Vec<u8>> {
    let key = match payload.split_once(' ') {
        Some((_, from)) if from == own_name => return None,
        Some((key, _)) => key,
        None => payload,
    };
    decode_hex(key)
}

/// Reads a hex-encoded key.
fn decode_hex(payload: &str) -> Option<Vec<u8>> {
    let digit = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let bytes = payload.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    bytes
        .chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{decode_hex, released_key, Place, Turn, Waiting};

    fn is_head(place: &Place) -> bool {
        matches!(place.turn(), Turn::Head)
    }

    #[test]
    fn payloads_are_hex_encoded_keys() {
        assert_eq!(decode_hex("6163633a3432"), Some(b"acc:42".to_vec()));
        assert_eq!(decode_hex("6A"), Some(vec![0x6a]));
        assert_eq!(decode_hex(""), Some(vec![]));
        assert_eq!(decode_hex("6"), None);
        assert_eq!(decode_hex("zz"), None);
        assert_eq!(released_key("6a 0123", "4567"), Some(vec![0x6a]));
        assert_eq!(released_key("6a 0123", "0123"), None);
        assert_eq!(released_key("6a", "0123"), Some(vec![0x6a]));
    }

    #[tokio::test]
    async fn waiters_take_turns_in_arrival_order() {
        let waiting = Waiting::new("w".to_owned());
        let first = waiting.join(b"k", "1", 1);
        let second = waiting.join(b"k", "2", 1);
        let third = waiting.join(b"k", "3", 1);
        assert!(is_head(&first) && !is_head(&second) && !is_head(&third));
        assert!(waiting.has_waiters(b"k") && !waiting.has_waiters(b"other"));
        // A waiter that leaves from the middle hands nothing on; the head's leaving does.
        drop(second);
        assert!(is_head(&first) && !is_head(&third));
        drop(first);
        assert!(is_head(&third));
        tokio::time::timeout(std::time::Duration::from_secs(1), third.woken())
            .await
            .expect("the new head was not woken");
        drop(third);
        assert!(!waiting.has_waiters(b"k"));
    }
}
