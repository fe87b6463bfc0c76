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

mod listener;
mod offer;
mod place;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::AbortHandle;

use offer::Offer;
pub(super) use offer::{Handed, Offered, Start};
use place::enqueue;
pub(super) use place::Place;

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
    /// Owners whose acquisition failed as a hand-over to them was lost (see
    /// [`Waiting::hand_over_lost`]), or failed or was dropped while one was on its way (see
    /// `Place::leave`), until the release of what they may hold: only owners whose release is
    /// to come (the locker undoes an acquisition that failed or was dropped, not one that ended
    /// without the key), so that each entry is taken.
    lost_owners: HashSet<Arc<str>>,
}

/// One waiter in its key's queue.
struct Waiter {
    wake: Arc<Notify>,
    /// See [`Place::hand_over_lost`].
    lost: Arc<AtomicBool>,
    /// See [`Place::withdrawn`]: the place's, shared by each entry it queues as.
    withdrawn: Arc<AtomicU64>,
    /// Who waits, for a release to hand the key to.
    owner: Arc<str>,
    ttl_us: i64,
    /// Its acquisition's label, for a release to write with the row it hands over.
    label: Arc<str>,
    /// Where a release is handing the key to this waiter.
    offer: Offer,
    /// While it is the head: when it is due to start its next try (it was woken, or its own
    /// pause runs out then). `None` while a try is under way and nothing woke it meanwhile.
    due: Option<Instant>,
    /// While a try of this head is under way: when it started.
    trying_since: Option<Instant>,
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

    /// How many of this backend's acquisitions wait for `key` (a head passed over included,
    /// until it leaves or queues again), for `inspect`.
    pub(super) fn waiters(&self, key: &[u8]) -> usize {
        self.shared.state().queues.get(key).map_or(0, VecDeque::len)
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

    /// Queues `owner`, waiting for `key` with a lease of `ttl_us` under `label`, last. Dropping
    /// the place leaves the queue.
    pub(super) fn join(&self, key: &[u8], owner: &str, ttl_us: i64, label: &str) -> Place {
        let place = Place {
            shared: self.shared.clone(),
            key: key.to_vec(),
            wake: Arc::new(Notify::new()),
            lost: Arc::default(),
            withdrawn: Arc::default(),
            owner: Arc::from(owner),
            ttl_us,
            label: Arc::from(label),
        };
        enqueue(&mut self.shared.state(), &place);
        place
    }
}

#[cfg(test)]
mod tests {
    use super::{Place, Turn, Waiting};

    fn is_head(place: &Place) -> bool {
        matches!(place.turn(), Turn::Head)
    }

    #[tokio::test]
    async fn waiters_take_turns_in_arrival_order() {
        let waiting = Waiting::new("w".to_owned());
        let first = waiting.join(b"k", "1", 1, "");
        let second = waiting.join(b"k", "2", 1, "");
        let third = waiting.join(b"k", "3", 1, "");
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

    #[tokio::test]
    async fn the_next_head_rests_until_the_lease_of_the_waiter_that_left_holding_the_key() {
        use std::time::{Duration, Instant};

        use super::Start;

        let waiting = Waiting::new("w".to_owned());
        let first = waiting.join(b"k", "1", 1, "");
        let second = waiting.join(b"k", "2", 1, "");
        assert!(matches!(first.start_try(), Start::Try));
        let expires = Instant::now() + Duration::from_secs(60);
        first.holds_until(expires);
        // Told at once, not when the time it read as a waiter behind comes.
        tokio::time::timeout(Duration::from_secs(1), second.woken())
            .await
            .expect("the new head was not woken");
        assert!(is_head(&second));
        assert!(matches!(second.start_try(), Start::Rest(at) if at == expires));
        // Resting, not lapsed: a caller that does not wait still finds it in line.
        assert!(waiting.has_waiters(b"k"));
        // A release announced makes it due now.
        waiting.wake(b"k");
        assert!(matches!(second.start_try(), Start::Try));
    }

    /// A grant handed to a head that is passed over before it claims it is withdrawn with it;
    /// its fence is the acquisition's to record before the waiter, polled again, tries again
    /// (the grant's undo deletes by that fence). A grant claimed records nothing.
    #[tokio::test]
    async fn a_head_passed_over_with_a_grant_handed_to_it_records_the_grants_fence() {
        use std::time::{Duration, Instant};

        use super::{Handed, Start, HEAD_TURN};
        use crate::backend::claim::Caller;

        let waiting = Waiting::new("w".to_owned());
        let head = waiting.join(b"k", "1", 1, "");
        let behind = waiting.join(b"k", "2", 1, "");
        let hand = |fence| {
            assert!(matches!(head.start_try(), Start::Try));
            head.resting_until(Instant::now() + Duration::from_secs(60));
            let offered = waiting
                .offer(b"k")
                .expect("a head at rest is offered the key");
            let (caller, claim) = Caller::new();
            let handed = Handed {
                fence,
                valid_from: Instant::now(),
                caller,
                withdrawn: offered.withdrawn.clone(),
            };
            assert!(waiting.settle(b"k", &offered, Some(handed)).is_ok());
            claim
        };
        // Claimed: nothing withdrawn.
        let _claimed = hand(7);
        let Start::Handed(handed) = head.start_try() else {
            panic!("the head was not handed the key");
        };
        assert!(handed.caller.claim());
        drop(handed);
        assert_eq!(head.withdrawn(), 0);
        // Not claimed, and the head not polled: the waiter behind passes it over.
        let claim = hand(42);
        std::thread::sleep(HEAD_TURN + Duration::from_millis(50));
        assert!(is_head(&behind));
        assert!(
            claim.withdraw(),
            "the grant of a passed-over head was not withdrawn"
        );
        assert_eq!(head.withdrawn(), 42);
        // Fences only grow; a smaller one recorded later changes nothing.
        head.withdrew(5);
        assert_eq!(head.withdrawn(), 42);
    }

    /// A waiter whose wait ran out (`Ok(None)`: no release of its owner comes) while a release
    /// was handing it the key, and whose hand-over was then lost: its owner is not kept for a
    /// release that never comes. An owner whose release is to come is kept until it comes: one
    /// whose acquisition fails as the hand-over was lost first, or that failed or was dropped
    /// while the hand-over was on its way.
    #[tokio::test]
    async fn a_lost_hand_over_keeps_an_owner_only_until_its_release() {
        let waiting = Waiting::new("w".to_owned());
        let lost_owners = || waiting.shared.state().lost_owners.len();

        let place = waiting.join(b"k", "gave up", 1_000_000, "");
        let offered = waiting
            .offer(b"k")
            .expect("the head at rest is offered the key");
        assert!(!place.gives_up(false), "no hand-over was lost yet");
        drop(place);
        waiting.hand_over_lost(b"k", &offered);
        assert_eq!(
            lost_owners(),
            0,
            "the owner of a waiter that gave up is kept"
        );

        // Lost first: the waiter's acquisition fails, and its release finds the owner.
        let place = waiting.join(b"k", "failed", 1_000_000, "");
        let offered = waiting
            .offer(b"k")
            .expect("the head at rest is offered the key");
        waiting.hand_over_lost(b"k", &offered);
        assert!(place.hand_over_lost());
        assert!(
            place.gives_up(false),
            "the wait ran out after the loss: it fails"
        );
        drop(place);
        assert!(waiting.take_lost_owner("failed") && lost_owners() == 0);

        // Dropped (or failed) with the hand-over on its way: its undo finds the owner.
        let place = waiting.join(b"k", "dropped", 1_000_000, "");
        let offered = waiting
            .offer(b"k")
            .expect("the head at rest is offered the key");
        drop(place);
        waiting.hand_over_lost(b"k", &offered);
        assert!(waiting.take_lost_owner("dropped") && lost_owners() == 0);
    }
}
