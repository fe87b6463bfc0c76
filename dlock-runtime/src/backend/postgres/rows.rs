//! One try at a key, and the deletion of a row: the statements an acquisition sends, run on the
//! background runtime so that a grant nobody claims is undone after the statement that made it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::Row;

use super::line::PLACE_LIFETIME;
use super::waiting::{Handed, Offered};
use super::{backend_error, is_conflict, lock_timed_out, micros_i64, PostgresBackend, Shared};
use crate::backend::claim::{Caller, DEFAULT_CLAIM_WINDOW};
use crate::backend::sql::{self, Limits};
use crate::LockError;

/// Whether a try takes a place in the line across processes when the key is busy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Line {
    /// A caller that does not wait: never.
    StayOut,
    /// A waiter's first try: where others are in line already (or this backend is).
    JoinIfQueued,
    /// A waiter that lost a race for the key before.
    Join,
}

/// One acquire statement's answer.
pub(super) enum Attempt {
    Granted {
        fence: u64,
        sent_at: Instant,
        /// Whether this backend holds a place in line now (kept for its waiters behind).
        in_line: bool,
    },
    /// How long until the key may be free: the holder's time left, or where nobody holds it,
    /// until the first place in line ahead of this backend lapses; `None` where the statement
    /// could read neither.
    Busy {
        remaining: Option<Duration>,
        /// Whether this backend holds a place in line for the key now; `None` where the
        /// statement did not say (it timed out, or its answer came too late).
        in_line: Option<bool>,
        /// Whether a copy of the statement went astray before this answer, and may have granted
        /// the key all the same ([`sql::Wrote::Unknown`]): the acquisition then has it undone by
        /// its owner if it ends without the key ([`sql::not_granted`]).
        unknown: bool,
    },
    /// Not granted to the caller: the statement's answer did not come in time, or its grant was
    /// withdrawn before the caller came back for it. What it wrote is undone by its fence,
    /// `withdrawn` ([`sql::UNKNOWN_FENCE`] where the answer did not come), which the acquisition
    /// records: its next grant must not keep that fence, or that undo would take it.
    Abandoned { withdrawn: u64 },
}

impl PostgresBackend {
    /// One try at the key, run so that a caller who stops waiting, or does not come back for
    /// its grant within the claim window, leaves no row behind (see [`sql::claimed`]); such a
    /// grant is busy, its holder's expiry unknown. `line`: whether a busy try may take (or keep)
    /// this backend's place in the line across processes; `others_behind`: whether other
    /// waiters of this backend wait behind this one (granted, its place is then kept);
    /// `withdrawn`: the greatest fence of this acquisition's grants that were withdrawn (0 where
    /// none was), whose undo may still be on its way (see [`sql::withdrawn_bound`]); `label` is
    /// written with a granted row, where the table has the column.
    #[allow(clippy::too_many_arguments)] // One try's every input, each a plain value.
    pub(super) async fn try_acquire(
        &self,
        key: &[u8],
        owner: &str,
        label: &str,
        ttl_us: i64,
        line: Line,
        others_behind: bool,
        withdrawn: u64,
        limits: Limits,
    ) -> Result<Attempt, LockError> {
        let (shared, undo_shared) = (self.shared.clone(), self.shared.clone());
        let (key, owner, label) = (key.to_vec(), owner.to_owned(), label.to_owned());
        let (undo_key, undo_owner) = (key.clone(), owner.clone());
        let attempt = sql::claimed(
            "PostgreSQL",
            &self.shared.cleanups,
            &self.shared.tries,
            limits,
            async move {
                acquire_row(
                    &shared,
                    &key,
                    &owner,
                    &label,
                    ttl_us,
                    line,
                    others_behind,
                    withdrawn,
                )
                .await
            },
            |attempt| match attempt {
                Attempt::Granted { fence, .. } => sql::Wrote::Grant(*fence),
                Attempt::Busy { unknown: true, .. } => sql::Wrote::Unknown,
                Attempt::Busy { .. } | Attempt::Abandoned { .. } => sql::Wrote::Nothing,
            },
            move |fence| {
                let (shared, key, owner) =
                    (undo_shared.clone(), undo_key.clone(), undo_owner.clone());
                async move { delete_row(&shared, &key, &owner, fence).await }
            },
        )
        .await?;
        Ok(match attempt {
            sql::Claimed::Answer(attempt) => attempt,
            sql::Claimed::Withdrawn(withdrawn) => Attempt::Abandoned { withdrawn },
            sql::Claimed::Unanswered => Attempt::Abandoned {
                withdrawn: sql::UNKNOWN_FENCE,
            },
        })
    }
}

/// Sends the acquire statement on a connection of its own from the pool; `sent_at` is measured
/// after the wait for the connection, which on a busy pool would otherwise eat into the lease.
/// A copy sent again after one went astray takes over a grant that one made as its own (the
/// row is this owner's), unless it finds the row locked by another transaction past the lock
/// timeout: a busy answer is then `unknown`.
#[allow(clippy::too_many_arguments)] // One try's every input, each a plain value.
async fn acquire_row(
    shared: &Shared,
    key: &[u8],
    owner: &str,
    label: &str,
    ttl_us: i64,
    line: Line,
    others_behind: bool,
    withdrawn: u64,
) -> Result<Attempt, LockError> {
    let (answer, unknown) = sql::retry_transient_blind(is_conflict, || async {
        shared.statements.fetch_add(1, Ordering::Relaxed);
        // Boxed: sqlx's future for a pooled connection holds its whole connect path (about
        // 8 KB), which would otherwise sit in every try's and release's task and be copied
        // with it on each move: most of the CPU an uncontended lock spent on the client.
        let mut connection = Box::pin(shared.pool.acquire()).await?;
        let sent_at = Instant::now();
        let query = shared
            .sql
            .acquire
            .query()
            .bind(key)
            .bind(owner)
            .bind(ttl_us)
            .bind(shared.waiter.as_str())
            .bind(line != Line::StayOut)
            .bind(micros_i64(PLACE_LIFETIME))
            .bind(line == Line::Join)
            .bind(others_behind)
            .bind(sql::withdrawn_bound(withdrawn));
        let query = if shared.sql.described {
            query.bind(label.as_bytes())
        } else {
            query
        };
        let row = query.fetch_one(&mut *connection).await?;
        Ok((row, sent_at))
    })
    .await;
    let (row, sent_at) = match answer {
        Ok(answer) => answer,
        // The row stayed locked by another transaction for longer than the lock timeout.
        Err(error) if lock_timed_out(&error) => {
            return Ok(Attempt::Busy {
                remaining: None,
                in_line: None,
                unknown,
            })
        }
        Err(error) => return Err(backend_error(error)),
    };
    let fence: Option<i64> = row.try_get(0).map_err(backend_error)?;
    let holder_us: Option<i64> = row.try_get(1).map_err(backend_error)?;
    let ahead_us: Option<i64> = row.try_get(2).map_err(backend_error)?;
    let in_line: bool = row.try_get(3).map_err(backend_error)?;
    // An expired holder's row keeps nobody out: a place ahead does, until it lapses.
    let free_in_us = holder_us.filter(|&us| us > 0).or(ahead_us);
    Ok(match fence {
        Some(fence) => Attempt::Granted {
            fence: fence as u64,
            sent_at,
            in_line,
        },
        // Answered: a row of this owner's, written by a copy that went astray, would have been
        // granted again (its own row is its own), so an answer that grants nothing says there is
        // none. Only a lock timeout leaves that unknown (above).
        None => Attempt::Busy {
            remaining: free_in_us.map(|us| Duration::from_micros(us.max(0) as u64)),
            in_line: Some(in_line),
            unknown: false,
        },
    })
}

/// Releases the row of `key` where `owner` holds it (by the grant of `fence` only, where given),
/// keeping it expired and owned by nobody, and announces the release; whether it did.
pub(super) async fn delete_row(
    shared: &Shared,
    key: &[u8],
    owner: &str,
    fence: Option<u64>,
) -> Result<bool, LockError> {
    let fence = fence.map(|fence| fence as i64);
    let rows = sql::retry_transient(is_conflict, || {
        shared.statements.fetch_add(1, Ordering::Relaxed);
        shared
            .sql
            .release
            .query()
            .bind(key)
            .bind(owner)
            .bind(fence)
            .fetch_all(&shared.pool)
    })
    .await
    .map_err(backend_error)?;
    // This backend's waiters are woken by the release's notification, as every other backend's
    // are: waking them here first would let one process's waiters keep the key from others (a
    // hand-over to one of them, `release_row`, asks the line first).
    Ok(!rows.is_empty())
}

/// Releases `owner`'s lease of `key`, handing the row over to this backend's next waiter at
/// rest where there is one (see `Statements::hand_over`), else deleting it; whether `owner`
/// held it.
///
/// The waiter gets the grant as it would its own try's: it claims it when its future is polled
/// again, and a grant it does not claim within the claim window (or that finds it gone, or is
/// withdrawn as it is passed over) is deleted by a clean-up of the backend, by its fence.
pub(super) async fn release_row(
    shared: &Arc<Shared>,
    key: &[u8],
    owner: &str,
) -> Result<bool, LockError> {
    if shared.waiting.take_lost_owner(owner) {
        return delete_row(shared, key, owner, None).await;
    }
    let Some(offered) = shared.waiting.offer(key) else {
        return delete_row(shared, key, owner, None).await;
    };
    // Settles the offer however this ends (a panic included), so the waiter never waits for a
    // release that is gone.
    let mut offer = OfferGuard {
        shared,
        key,
        offered: Some(offered),
    };
    let offered = offer.offered.as_ref().expect("set above");
    // Whether a send went astray: its connection broke (or it read a message it did not expect)
    // once it was sent, which leaves it unknown whether it wrote. A send sent after one went
    // astray also takes over a row of the waiter's own owner, which the one astray may have
    // written (see `Statements::hand_over`). A conflict (a deadlock victim) was rolled back
    // whole; an error before the send (no connection) wrote nothing.
    let sent_blind = AtomicBool::new(false);
    let sent_blind = &sent_blind;
    // Whether a send started (a statement still running when the time runs out may write).
    let sending = AtomicBool::new(false);
    let sending = &sending;
    let send = || async move {
        shared.statements.fetch_add(1, Ordering::Relaxed);
        let mut connection = Box::pin(shared.pool.acquire()).await?; // Boxed: see `acquire_row`.
        let sent_at = Instant::now();
        sending.store(true, Ordering::SeqCst);
        let again = sent_blind.load(Ordering::SeqCst);
        let query = shared
            .sql
            .hand_over
            .query()
            .bind(key)
            .bind(owner)
            .bind(&*offered.owner)
            .bind(offered.ttl_us)
            .bind(shared.waiter.as_str())
            .bind(offered.others_behind)
            .bind(micros_i64(PLACE_LIFETIME))
            .bind(again);
        let query = if shared.sql.described {
            query.bind(offered.label.as_bytes())
        } else {
            query
        };
        let sent = query.fetch_one(&mut *connection).await;
        if let Err(sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::PoolClosed) = &sent
        {
            sent_blind.store(true, Ordering::SeqCst);
        }
        Ok::<_, sqlx::Error>((sent?, sent_at))
    };
    // Sent again, within the patience, after a send that went astray (a send after it takes
    // over what it wrote) or was rolled back as a deadlock victim: a pooler that passes a
    // notification to a connection that did not ask for it (PgBouncer, where the listener goes
    // through it too) makes sends go astray in a row.
    let answer = tokio::time::timeout(HAND_OVER_PATIENCE, async {
        let mut sends = 0;
        loop {
            sends += 1;
            match send().await {
                Err(sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::PoolClosed)
                    if sends < HAND_OVER_SENDS => {}
                Err(error) if is_conflict(&error) && sends < HAND_OVER_SENDS => {}
                answer => return answer,
            }
        }
    })
    .await;
    let sent_blind = sent_blind.load(Ordering::SeqCst);
    let answer = match answer {
        Ok(Ok((row, sent_at))) => read_hand_over(&row).map(|read| (read, sent_at)),
        Ok(Err(error)) => Err(error),
        // No answer in time (a connection gone half-open, a server that stalls): a statement
        // sent may still run, and write.
        Err(_) if sending.load(Ordering::SeqCst) => {
            offer.outcome_unknown(owner);
            return Err(LockError::backend(
                "PostgreSQL: a release's statement did not answer in time",
            ));
        }
        Err(_) => Err(sqlx::Error::PoolTimedOut),
    };
    let ((fence, released, in_line), sent_at) = match answer {
        Ok(answer) => answer,
        // Nothing was written, and no send went astray: refused by the server (a row another
        // transaction keeps locked past the lock timeout), or never
        // sent (no connection in time). The key is released the plain way.
        Err(sqlx::Error::Database(_) | sqlx::Error::PoolTimedOut) if !sent_blind => {
            offer.settle(None);
            return delete_row(shared, key, owner, None).await;
        }
        Err(error) => {
            offer.outcome_unknown(owner);
            return Err(backend_error(error));
        }
    };
    let Some(fence) = fence else {
        // Not handed over (someone is ahead in line, or `owner` held nothing, and no send went
        // astray that may have): the waiter, if still there, tries.
        offer.settle(None);
        return Ok(released);
    };
    let fence = fence as u64;
    shared.waiting.in_line(key, in_line);
    let (caller, claim) = Caller::new();
    let handed = Handed {
        fence,
        valid_from: sent_at,
        caller,
        withdrawn: Arc::clone(&offered.withdrawn),
    };
    // A grant that finds its waiter gone is dropped here, which withdraws it at once.
    let offered = offer.settle(Some(handed));
    let window = DEFAULT_CLAIM_WINDOW.min(Duration::from_micros(offered.ttl_us.max(0) as u64));
    let (undo_shared, undo_key) = (Arc::clone(shared), key.to_vec());
    shared.cleanups.spawn(async move {
        if claim.withdrawn_after(window).await {
            tracing::debug!("distributed_lock: a PostgreSQL waiter did not claim the key a release handed it; given back");
            undo_hand_over(&undo_shared, &undo_key, &offered.owner, fence).await;
        }
    });
    Ok(true)
}

/// The hand-over statement's answer: the new fence where it handed the row over, whether it
/// released it instead, and whether this backend holds a place in line now.
fn read_hand_over(row: &sqlx::postgres::PgRow) -> Result<(Option<i64>, bool, bool), sqlx::Error> {
    Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
}

/// An offer of the key to a waiter (see [`Waiting::offer`](super::waiting::Waiting::offer)),
/// settled exactly once: by the release, or as it is dropped (the release failed or panicked),
/// with nothing handed.
struct OfferGuard<'a> {
    shared: &'a Arc<Shared>,
    key: &'a [u8],
    offered: Option<Offered>,
}

impl OfferGuard<'_> {
    /// Tells the waiter how the hand-over went; a grant whose waiter is gone is dropped, which
    /// withdraws it. Returns the offer, for the clean-up that watches the grant.
    fn settle(&mut self, handed: Option<Handed>) -> Offered {
        let offered = self.offered.take().expect("an offer is settled once");
        if let Err(unclaimed) = self.shared.waiting.settle(self.key, &offered, handed) {
            drop(unclaimed);
        }
        offered
    }

    /// The hand-over's outcome is unknown (its answer was lost with its connection, or did not
    /// come in time): the row may be the waiter's now, or still `releaser`'s, or the statement
    /// may still be on its way. The waiter's acquisition fails (it does not try again under its
    /// owner), and a clean-up deletes the row under either owner, in one statement that checks
    /// the row again once a hand-over still holding it commits. (A copy of the hand-over
    /// landing after finds no row of the releaser's to hand over; a late copy of the delete
    /// finds no lease of either owner to take, as neither is used again.)
    fn outcome_unknown(mut self, releaser: &str) {
        let offered = self.offered.take().expect("an offer is settled once");
        self.shared.waiting.hand_over_lost(self.key, &offered);
        let (shared, key) = (Arc::clone(self.shared), self.key.to_vec());
        let owners = vec![offered.owner.to_string(), releaser.to_owned()];
        self.shared.cleanups.spawn(async move {
            let mut pause = Duration::from_millis(100);
            for _ in 0..UNKNOWN_HAND_OVER_TRIES {
                let deleted = tokio::time::timeout(HAND_OVER_PATIENCE, async {
                    shared.statements.fetch_add(1, Ordering::Relaxed);
                    shared
                        .sql
                        .release_any
                        .query()
                        .bind(key.as_slice())
                        .bind(owners.as_slice())
                        .fetch_all(&shared.pool)
                        .await
                })
                .await;
                match deleted {
                    Ok(Ok(_)) => return,
                    Ok(Err(sqlx::Error::PoolClosed)) => break,
                    failed => {
                        tracing::debug!(?failed, "distributed_lock: cannot delete what a PostgreSQL hand-over of unknown outcome wrote yet; trying again");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(2));
                    }
                }
            }
            tracing::warn!("distributed_lock: cannot delete what a PostgreSQL hand-over of unknown outcome wrote; the row expires with its ttl");
        });
    }
}

/// How long a release's hand-over statement, and each delete of the clean-up after one whose
/// answer was lost, may take before its outcome counts as unknown: the waiter it is offered to
/// waits that long at most, and the waiters behind it with it.
const HAND_OVER_PATIENCE: Duration = super::waiting::TRY_TURN;

/// How many times a release sends its hand-over statement at most, within its patience.
const HAND_OVER_SENDS: u32 = 5;

/// How many times the clean-up of a hand-over of unknown outcome, or the undo of one not
/// claimed, tries its delete before it gives up (the row then expires with its ttl): with its
/// pauses, half a minute to a minute.
const UNKNOWN_HAND_OVER_TRIES: u32 = 12;

impl Drop for OfferGuard<'_> {
    fn drop(&mut self) {
        if self.offered.is_some() {
            self.settle(None);
        }
    }
}

/// Deletes the row a hand-over to `owner` wrote, the grant of `fence` only: its waiter did not
/// claim it. Tried again as the clean-up of a hand-over of unknown outcome is: nobody else
/// deletes that row (its waiter answered busy, or is gone), so a delete lost with its
/// connection would leave the key to nobody for the waiter's whole ttl. Deleting by owner and
/// fence, a try sent twice deletes that grant and nothing after it.
async fn undo_hand_over(shared: &Shared, key: &[u8], owner: &str, fence: u64) {
    let mut pause = Duration::from_millis(100);
    for _ in 0..UNKNOWN_HAND_OVER_TRIES {
        // A permit for each try, not across the pauses: a store that keeps failing must not
        // hold up the acquisitions' statements for as long as this tries.
        let deleted = tokio::time::timeout(HAND_OVER_PATIENCE, async {
            let _permit = shared.tries.acquire().await;
            delete_row(shared, key, owner, Some(fence)).await
        })
        .await;
        match deleted {
            Ok(Ok(_)) => return,
            _ if shared.pool.is_closed() => break,
            failed => {
                tracing::debug!(?failed, "distributed_lock: cannot give back a PostgreSQL key handed to a waiter that is gone yet; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
    }
    tracing::warn!("distributed_lock: cannot give back a PostgreSQL key handed to a waiter that is gone; its row expires with its ttl");
}
