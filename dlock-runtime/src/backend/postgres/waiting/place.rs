//! A waiter's place in its key's queue: whose turn it is, when a head's turn lapses, and
//! leaving.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Notify;

use super::{wake_front, Offer, Shared, Start, State, Turn, Waiter};

/// Queues `place`'s waiter last for its key; at the head at once, it is due to try now.
pub(super) fn enqueue(state: &mut State, place: &Place) {
    let queue = state.queues.entry(place.key.clone()).or_default();
    let due = queue.is_empty().then(Instant::now);
    queue.push_back(Waiter {
        wake: place.wake.clone(),
        lost: place.lost.clone(),
        withdrawn: place.withdrawn.clone(),
        owner: place.owner.clone(),
        ttl_us: place.ttl_us,
        label: place.label.clone(),
        offer: Offer::None,
        due,
        trying_since: None,
    });
}

/// A waiter's place in its key's queue.
pub(in crate::backend::postgres) struct Place {
    pub(super) shared: Arc<Shared>,
    pub(super) key: Vec<u8>,
    pub(super) wake: Arc<Notify>,
    pub(super) lost: Arc<AtomicBool>,
    /// See [`withdrawn`](Self::withdrawn).
    pub(super) withdrawn: Arc<AtomicU64>,
    pub(super) owner: Arc<str>,
    pub(super) ttl_us: i64,
    pub(super) label: Arc<str>,
}

impl Place {
    /// Where this waiter stands. A waiter right behind a head that let its turn lapse passes
    /// it over and is the head; a waiter that was passed over queues again, last.
    pub(in crate::backend::postgres) fn turn(&self) -> Turn {
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
            // go to the queue's waiters only) until its own pause or deadline runs out. A grant
            // handed to it goes with it, withdrawn: its fence is recorded for the passed-over
            // acquisition here, under the lock, before it can queue again and try (see
            // `Handed`'s drop).
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
    pub(in crate::backend::postgres) fn hand_over_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// The greatest fence of this acquisition's grants that were withdrawn, 0 where none was:
    /// their undos, which delete by fence, may still be on their way, and a try of the
    /// acquisition keeps the fence of a row of its own only where it is greater (see
    /// `sql::withdrawn_bound`). Every path that withdraws a grant of the acquisition records it
    /// before the acquisition's next try: a try's [`Attempt::Abandoned`](crate::backend::postgres::rows::Attempt::Abandoned)
    /// (through [`withdrew`](Self::withdrew)), and a handed grant dropped unclaimed, whoever
    /// drops it (see `Handed`).
    pub(in crate::backend::postgres) fn withdrawn(&self) -> u64 {
        self.withdrawn.load(Ordering::SeqCst)
    }

    /// Records that a grant of this acquisition with `fence` was withdrawn.
    pub(in crate::backend::postgres) fn withdrew(&self, fence: u64) {
        self.withdrawn.fetch_max(fence, Ordering::SeqCst);
    }

    /// What this head is to do: claim a key a release handed it, wait while a release is
    /// handing it over, rest until it is due (it became the head as the waiter ahead of it left
    /// holding the key, whose lease runs until then), or else try (and its try starts now).
    pub(in crate::backend::postgres) fn start_try(&self) -> Start {
        let now = Instant::now();
        let mut start = Start::Try;
        self.change(
            |waiter| match std::mem::replace(&mut waiter.offer, Offer::None) {
                Offer::Handed(handed) => start = Start::Handed(handed),
                Offer::InFlight => {
                    waiter.offer = Offer::InFlight;
                    start = Start::Wait;
                }
                Offer::None => match waiter.due {
                    // Every wake-up that is to make it try sets its due to then (a release
                    // announced, or its own pause run out): anything else finds it resting.
                    Some(due) if due > now => start = Start::Rest(due),
                    _ => {
                        waiter.due = None;
                        waiter.trying_since = Some(now);
                    }
                },
            },
        );
        start
    }

    /// Whether other waiters of this backend wait for the key behind this one.
    pub(in crate::backend::postgres) fn others_behind(&self) -> bool {
        self.shared
            .state()
            .queues
            .get(&self.key)
            .is_some_and(|queue| queue.iter().any(|waiter| !waiter.is(&self.wake)))
    }

    /// Says this head, its try done, is due to try again at `until` at the latest; the waiter
    /// behind it, which looks again when the head's turn lapses, is told the new time.
    pub(in crate::backend::postgres) fn resting_until(&self, until: Instant) {
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
    pub(in crate::backend::postgres) async fn woken(&self) {
        self.wake.notified().await;
    }
}

impl Place {
    /// Leaves the queue holding the key, its lease running out at `expires`: the next waiter
    /// rests until then rather than try now, which would only find the key busy (and, mid-try
    /// as the holder releases, miss the key the release would have handed it). A release
    /// announced, or handed to it, wakes it sooner; at `expires` it tries, and a lease renewed
    /// meanwhile has it rest again until its new expiry (so it keeps its turn while it waits
    /// behind a lease renewed past its first ttl).
    pub(in crate::backend::postgres) fn holds_until(self, expires: Instant) {
        self.leave(Some(expires), true);
    }

    /// Leaves the queue as the acquisition ends without the key (its wait ran out), with no
    /// release of its owner to come if `released` is false (the acquisition answers `Ok(None)`),
    /// or with one (it fails: the locker undoes it). Returns whether a release that was handing
    /// this waiter the key lost its answer before: the acquisition then fails rather than answer
    /// `Ok(None)`, as whether it holds the key is unknown, and its owner was kept for that
    /// release (see [`Waiting::hand_over_lost`](super::Waiting::hand_over_lost)).
    pub(in crate::backend::postgres) fn gives_up(&self, released: bool) -> bool {
        self.leave(None, released)
    }

    /// Leaves the queue; the next head is due to try at `next_due`, or now. `released`: whether
    /// a release of this waiter's owner is to come (the acquisition failed, was dropped, or
    /// holds the key). Returns whether a release that was handing this waiter the key lost its
    /// answer, read under the lock [`Waiting::hand_over_lost`](super::Waiting::hand_over_lost)
    /// records it under: recorded before, the owner is kept for its release; after, this waiter
    /// is gone and nothing is recorded.
    fn leave(&self, next_due: Option<Instant>, released: bool) -> bool {
        let mut state = self.shared.state();
        let lost = self.lost.load(Ordering::SeqCst);
        let handing = state.queues.get(&self.key).is_some_and(|queue| {
            queue
                .iter()
                .any(|waiter| waiter.is(&self.wake) && matches!(waiter.offer, Offer::InFlight))
        });
        if handing && released {
            // Dropped or failed while a release hands it the key, whose answer may yet be lost:
            // its owner's release (the locker's undo) is then a plain delete (see
            // `Waiting::take_lost_owner`), as it would be had the hand-over been lost first;
            // the undo comes in any case, and takes it.
            state.lost_owners.insert(self.owner.clone());
        }
        let Some(queue) = state.queues.get_mut(&self.key) else {
            return lost;
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
                    // The next head, resting as a waiter behind until a time it read before,
                    // rests until `due` now, and tries then; the waiter behind it looks again
                    // when the new head's turn lapses.
                    next.wake.notify_one();
                    if let Some(behind) = queue.get(1) {
                        behind.wake.notify_one();
                    }
                }
                // The next waiter's turn to ask the database.
                _ => state.wake_head(&self.key),
            }
        }
        lost
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        // Dropped without `gives_up` or `holds_until` (which left already): the acquisition
        // failed or its future was dropped, and the locker undoes it.
        self.leave(None, true);
    }
}
