//! A release's hand-off of the key to this backend's head at rest: offered before the
//! release's statement is sent, settled by its answer.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Notify;

use super::Waiting;
use crate::backend::claim::Caller;

/// A release's hand-off of the key to a waiter at rest.
pub(super) enum Offer {
    None,
    /// The release's statement is on its way: the waiter starts no try of its own meanwhile (a
    /// try's grant and the hand-off's could cross).
    InFlight,
    /// The waiter holds the key, once it claims the grant.
    Handed(Handed),
}

/// A grant a release handed to a waiter of this backend: the waiter's lease once it claims it;
/// dropped unclaimed (the waiter's future dropped, or passed over), it is withdrawn, and the
/// release's clean-up deletes the row, by its fence.
pub(in crate::backend::postgres) struct Handed {
    pub(in crate::backend::postgres) fence: u64,
    /// When the release's statement was sent: the lease's validity counts from then.
    pub(in crate::backend::postgres) valid_from: Instant,
    pub(in crate::backend::postgres) caller: Caller,
    /// The waiter's acquisition's greatest withdrawn fence (see [`Place::withdrawn`](super::Place::withdrawn)).
    pub(in crate::backend::postgres) withdrawn: Arc<AtomicU64>,
}

impl Drop for Handed {
    /// Dropped unclaimed (withdrawn as the waiter was passed over, or found gone, or past the
    /// claim window), the grant's fence is the acquisition's to record before its next try,
    /// whatever dropped it: the undo deletes by that fence, and the next grant must not keep it.
    /// (Dropped as the waiter's future is dropped, nobody reads it.)
    fn drop(&mut self) {
        if !self.caller.claimed() {
            self.withdrawn.fetch_max(self.fence, Ordering::SeqCst);
        }
    }
}

/// The waiter a release offers the key to (see [`Waiting::offer`]).
pub(in crate::backend::postgres) struct Offered {
    wake: Arc<Notify>,
    lost: Arc<AtomicBool>,
    /// The waiter's acquisition's greatest withdrawn fence, for the grant handed to it.
    pub(in crate::backend::postgres) withdrawn: Arc<AtomicU64>,
    pub(in crate::backend::postgres) owner: Arc<str>,
    pub(in crate::backend::postgres) ttl_us: i64,
    /// The label its acquisition asked under, which the hand-over writes with the row.
    pub(in crate::backend::postgres) label: Arc<str>,
    /// Whether other waiters of this backend wait behind it.
    pub(in crate::backend::postgres) others_behind: bool,
}

/// What a head is to do next (see [`Place::start_try`](super::Place::start_try)).
pub(in crate::backend::postgres) enum Start {
    /// Ask the database.
    Try,
    /// Wait: a release is handing the key to this waiter.
    Wait,
    /// Rest until then, when it is due to try (or sooner, woken).
    Rest(Instant),
    /// Claim the key a release handed over.
    Handed(Handed),
}

impl Waiting {
    /// The waiter a release of `key` by this backend is to hand the key to: the head of its
    /// queue, at rest (no try of its own under way, which could be granted beside the hand-off)
    /// and its turn not lapsed. Until [`settle`](Self::settle) says how the hand-off went, it
    /// starts no try and is not passed over (the release's statement is bounded in time: see
    /// `HAND_OVER_PATIENCE`).
    pub(in crate::backend::postgres) fn offer(&self, key: &[u8]) -> Option<Offered> {
        let now = Instant::now();
        let mut state = self.shared.state();
        let queue = state.queues.get_mut(key)?;
        let others_behind = queue.len() > 1;
        let head = queue.front_mut()?;
        if head.trying_since.is_some()
            || !matches!(head.offer, Offer::None)
            || head.lapsed(now)
            || head.lost.load(Ordering::SeqCst)
        {
            return None;
        }
        head.offer = Offer::InFlight;
        head.due = None;
        head.trying_since = None;
        Some(Offered {
            wake: head.wake.clone(),
            lost: head.lost.clone(),
            withdrawn: head.withdrawn.clone(),
            owner: head.owner.clone(),
            ttl_us: head.ttl_us,
            label: head.label.clone(),
            others_behind,
        })
    }

    /// Tells the waiter `offered` that its hand-over ended without a known answer: its
    /// acquisition fails at its next poll (see [`Place::hand_over_lost`](super::Place::hand_over_lost)), and its turn is over
    /// (passed over 1 s on if it is not polled), so the waiters behind it go on.
    ///
    /// Its owner is kept for the release of the failed acquisition (see
    /// [`take_lost_owner`](Self::take_lost_owner)) only while the waiter is still in its queue:
    /// one that left already either ended without the key, and no release of its owner comes
    /// (kept, the owner would stay for good), or was dropped or failed, and its place kept the
    /// owner as it left (see `Place::leave`). What the hand-over may have written is deleted by
    /// the releaser's clean-up either way.
    pub(in crate::backend::postgres) fn hand_over_lost(&self, key: &[u8], offered: &Offered) {
        {
            let mut state = self.shared.state();
            let waiting = state.queues.get(key).is_some_and(|queue| {
                queue.iter().any(|waiter| {
                    waiter.is(&offered.wake) && matches!(waiter.offer, Offer::InFlight)
                })
            });
            if waiting {
                // Recorded before the waiter can see it failed, under the lock its place leaves
                // under: its acquisition's release must find it.
                state.lost_owners.insert(offered.owner.clone());
                offered.lost.store(true, Ordering::SeqCst);
            }
        }
        let _ = self.settle(key, offered, None);
        offered.wake.notify_one();
    }

    /// Whether `owner`'s acquisition failed (or was dropped) as a hand-over to it was lost or
    /// on its way; forgets it. Its release (the locker's, of the failed acquisition) is a plain
    /// delete: handed on to the next waiter, a row a lost hand-over's clean-up is to delete
    /// could leave its reach.
    pub(in crate::backend::postgres) fn take_lost_owner(&self, owner: &str) -> bool {
        self.shared.state().lost_owners.remove(owner)
    }

    /// Tells the waiter `offered` how its hand-off went: `Some`, it holds the key once it
    /// claims the grant; `None`, it does not, and tries now. `Err` where the waiter is gone
    /// (its future dropped, or passed over), with the grant, for the caller to undo.
    pub(in crate::backend::postgres) fn settle(
        &self,
        key: &[u8],
        offered: &Offered,
        handed: Option<Handed>,
    ) -> Result<(), Option<Handed>> {
        let now = Instant::now();
        let mut state = self.shared.state();
        let Some(queue) = state.queues.get_mut(key) else {
            return Err(handed);
        };
        let Some(at) = queue.iter().position(|waiter| waiter.is(&offered.wake)) else {
            return Err(handed);
        };
        // The waiter behind it, told while the hand-over was on its way that the head's turn
        // does not lapse, looks again: it lapses now from the time set below.
        if let Some(behind) = queue.get(at + 1) {
            behind.wake.notify_one();
        }
        let waiter = &mut queue[at];
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
}
