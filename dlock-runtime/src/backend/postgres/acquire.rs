//! Acquiring a key: one try where the caller does not wait; otherwise a place in this
//! backend's queue for the key, whose head alone asks the database, takes a key a release hands
//! it, and rests between tries until a release is announced or the holder's expiry.

use std::time::{Duration, Instant};

use super::rows::{Attempt, Line};
use super::waiting::{Place, Start, Turn};
use super::{check_key, PostgresBackend};
use crate::backend::sql::{not_granted, ttl_micros, Backoff, Limits, UNKNOWN_FENCE};
use crate::backend::{AcquireRequest, Acquired};
use crate::inspect::bounded;
use crate::LockError;

/// Back-off between tries of a waiting head while nobody listens for releases.
const FIRST_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_millis(250);

/// How soon a head looks again when its try could not read the holder's expiry (the row was
/// written by a statement that ran alongside).
const UNKNOWN_EXPIRY_RECHECK: Duration = Duration::from_millis(50);

impl PostgresBackend {
    /// [`Backend::acquire`](crate::backend::Backend::acquire) on this store.
    pub(super) async fn acquire_key(
        &self,
        request: &AcquireRequest<'_>,
    ) -> Result<Option<Acquired>, LockError> {
        check_key(request.key)?;
        let key = request.key.as_bytes();
        let owner = request.owner.to_string();
        let label = bounded(request.label);
        let ttl_us = ttl_micros("PostgreSQL", request.ttl)?;
        let granted = |fence, sent_at| {
            Some(Acquired {
                fence,
                valid_from: sent_at,
            })
        };
        if request.wait.is_zero() {
            // One try; a key this backend's waiters queue for is busy for a newcomer.
            if self.shared.waiting.has_waiters(key) {
                return Ok(None);
            }
            let limits = Limits::new(Some(Instant::now()), request.ttl);
            return match self
                .try_acquire(key, &owner, label, ttl_us, Line::StayOut, false, 0, limits)
                .await?
            {
                Attempt::Granted { fence, sent_at, .. } => Ok(granted(fence, sent_at)),
                Attempt::Busy { unknown, .. } => not_granted("PostgreSQL", unknown),
                Attempt::Abandoned { .. } => Ok(None),
            };
        }
        let deadline = crate::backend::wait_deadline(request.wait);
        let place = self.shared.waiting.join(key, &owner, ttl_us, label);
        let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF, request.owner);
        // Waited before (found the key busy, or waited behind another waiter of this backend
        // while the key went round): a waiter refused now lost a race for the key, and takes its
        // place in line. Only the first try of a waiter at the head of an empty queue does not:
        // a process alone at a key, whose waiters get it handed over at each release, then
        // writes nothing to the waiters table.
        let mut waited_before = false;
        // Whether a try's answer left it unknown whether the key was granted: undone by owner
        // if the acquisition ends without the key (see `not_granted`).
        let mut unknown = false;
        // Each grant of this acquisition that is withdrawn has its fence recorded in the place
        // (`Place::withdrawn`), which every try sends: its undo may still be on its way, and the
        // next grant must not keep its fence.
        loop {
            if place.hand_over_lost() {
                return Err(hand_over_lost());
            }
            if let Turn::Behind(head_lapses) = place.turn() {
                waited_before = true;
                // Woken when the head leaves or is woken itself, and at the time its turn
                // lapses, to pass it over if it has not taken it.
                let until = head_lapses.map_or(deadline, |lapses| lapses.min(deadline));
                tokio::select! {
                    () = place.woken() => continue,
                    () = tokio::time::sleep_until(until.into()) => {
                        if Instant::now() >= deadline {
                            return wait_ran_out(&place, unknown);
                        }
                        continue;
                    }
                }
            }
            match place.start_try() {
                Start::Try => {}
                Start::Wait => {
                    // A release is handing the key over; told how it went, this head claims
                    // the key or tries. Past the deadline, dropping the place gives a late
                    // grant back.
                    tokio::select! {
                        () = place.woken() => continue,
                        () = tokio::time::sleep_until(deadline.into()) => {
                            return wait_ran_out(&place, unknown)
                        }
                    }
                }
                Start::Rest(until) => {
                    // Became the head as the waiter ahead left holding the key: its lease runs
                    // until then, unless a release (announced, or handed here) comes first.
                    let until = until.min(deadline);
                    tokio::select! {
                        () = place.woken() => continue,
                        () = tokio::time::sleep_until(until.into()) => {
                            if Instant::now() >= deadline {
                                return wait_ran_out(&place, unknown);
                            }
                            continue;
                        }
                    }
                }
                Start::Handed(handed) => {
                    if handed.caller.claim() {
                        // The release recorded whether this backend keeps its place in line.
                        place.holds_until(handed.valid_from + request.ttl);
                        return Ok(granted(handed.fence, handed.valid_from));
                    }
                    // Withdrawn: the clean-up gives the key back, by the grant's fence, which
                    // dropping the grant here records (see `Handed`) before the next try.
                    drop(handed);
                    continue;
                }
            }
            let listening = self.shared.waiting.listening();
            let remaining = match self
                .try_acquire(
                    key,
                    &owner,
                    label,
                    ttl_us,
                    if waited_before {
                        Line::Join
                    } else {
                        Line::JoinIfQueued
                    },
                    place.others_behind(),
                    place.withdrawn(),
                    Limits::new(Some(deadline), request.ttl),
                )
                .await?
            {
                Attempt::Granted {
                    fence,
                    sent_at,
                    in_line,
                } => {
                    self.shared.waiting.in_line(key, in_line);
                    place.holds_until(sent_at + request.ttl);
                    return Ok(granted(fence, sent_at));
                }
                Attempt::Busy {
                    remaining,
                    in_line,
                    unknown: unsure,
                } => {
                    unknown |= unsure;
                    if let Some(in_line) = in_line {
                        self.shared.waiting.in_line(key, in_line);
                    }
                    waited_before = true;
                    remaining
                }
                Attempt::Abandoned { withdrawn } => {
                    place.withdrew(withdrawn);
                    if withdrawn == UNKNOWN_FENCE {
                        // A try whose answer did not come may still be on its way, and would
                        // keep the fence of a grant this acquisition claims after it: its
                        // undo (by owner, see `sql::claimed`) is safe only once the acquisition
                        // has ended. In real time the answer's bound ends past the deadline
                        // anyway; under a paused tokio clock it can end at once.
                        return wait_ran_out(&place, unknown);
                    }
                    waited_before = true;
                    None
                }
            };
            let now = Instant::now();
            if now >= deadline {
                return wait_ran_out(&place, unknown);
            }
            let pause = if listening.is_some() && listening == self.shared.waiting.listening() {
                // A release is announced; the holder's expiry is not, nor a place in line
                // ahead lapsing, so look again then.
                remaining.map_or(UNKNOWN_EXPIRY_RECHECK, |left| {
                    left + Duration::from_millis(1)
                })
            } else {
                // Nobody listened for the whole try: a release may go unannounced.
                backoff.next_pause()
            };
            let until = (now + pause).min(deadline);
            place.resting_until(until);
            tokio::select! {
                () = place.woken() => {}
                () = tokio::time::sleep_until(until.into()) => {}
            }
        }
    }
}

/// The answer of a waiting acquisition whose wait ran out without the key: no key (or the
/// error of a try whose outcome stayed unknown), its place left saying whether a release of its
/// owner is to come; the error of a lost hand-over where one was recorded for it first.
fn wait_ran_out(place: &Place, unknown: bool) -> Result<Option<Acquired>, LockError> {
    let answer = not_granted("PostgreSQL", unknown);
    if place.gives_up(answer.is_err()) {
        // Its owner is kept for the release that undoes a failed acquisition, which `Ok(None)`
        // would never bring.
        return Err(hand_over_lost());
    }
    answer
}

/// The error of an acquisition a release was handing the key to when it lost its answer.
fn hand_over_lost() -> LockError {
    LockError::backend(
        "PostgreSQL: the connection of a release that was handing this waiter the key broke; whether it was handed over is unknown, and what it may have written is deleted",
    )
}
