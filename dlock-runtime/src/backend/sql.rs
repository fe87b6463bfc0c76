//! What the SQL stores (MySQL, PostgreSQL) share: their statements run on dlock's background
//! runtime, are tried again after a failure that says nothing about the lock, grant the key only
//! to a caller that claims it (undone when nobody does), and their waiters back off with jitter.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::claim::{Caller, DEFAULT_CLAIM_WINDOW};
use crate::cleanups::Cleanups;
use crate::{background, LockError, Owner};

/// Runs `task` on dlock's background runtime, where the pool's connections live; `store` names
/// the store in the error of a task that failed.
pub(super) async fn on_background<T: Send + 'static>(
    store: &'static str,
    task: impl Future<Output = Result<T, LockError>> + Send + 'static,
) -> Result<T, LockError> {
    background::handle()
        .spawn(task)
        .await
        .map_err(|error| LockError::backend(format!("{store} task failed: {error}")))?
}

/// What became of one try for its caller (see [`claimed`]).
pub(super) enum Claimed<T> {
    /// The statement's answer: a grant the caller claimed, or an answer that grants nothing.
    Answer(T),
    /// A grant withdrawn before the caller came back for it, which the caller treats as not
    /// granted: its fence, by which its undo deletes it.
    Withdrawn(u64),
    /// No answer within [`Limits::bound`]: a grant that comes later is withdrawn and undone, by
    /// a fence the caller never learns.
    Unanswered,
}

/// What a try's answer says its statement left on the store (see [`claimed`]).
pub(super) enum Wrote {
    /// A grant, of this fence.
    Grant(u64),
    /// Nothing: the key was busy.
    Nothing,
    /// Perhaps a grant: a copy of the statement went astray (its connection broke once it was
    /// sent), and the copy sent again did not grant the key. The first may have all the same
    /// (its answer was lost), and the one sent again can miss its own row: it found the row
    /// locked by another transaction past the lock timeout. Such a row is held by nobody
    /// until its ttl unless undone, by owner: the acquisition does not know its fence.
    Unknown,
}

/// Stands for the fence of a grant withdrawn before its answer came ([`Claimed::Unanswered`]):
/// greater than every fence, so every later grant of the acquisition takes a new one. (A try's
/// answer that late comes after the caller's deadline, where it has one, so its acquisition
/// tries no more: see [`Limits::new`].)
pub(super) const UNKNOWN_FENCE: u64 = i64::MAX as u64;

/// The greatest fence of an acquisition's withdrawn grants, `withdrawn`, as a statement binds
/// it: a re-grant to the row's own owner keeps the row's fence only where it is greater.
///
/// A re-grant to the owner that holds the row is the same acquisition's (an [`Owner`] names
/// one acquisition): a late copy of one of its statements (re-sent after a broken connection
/// while the first copy was held up on the server), or its next try after one of its grants
/// was withdrawn. A withdrawn grant is undone by its fence (see [`claimed`]): a late copy must
/// keep the row's fence, or that undo would miss and leave the row held by nobody until its
/// ttl; the try after a withdrawal must take a new fence where the row still carries the
/// withdrawn one, or that undo would delete the grant the caller claims. Fences only grow, so
/// every grant made after a withdrawal is above its fence, and a row above the greatest
/// withdrawn fence is a grant of this acquisition nobody undoes; a late copy carries the value
/// from when it was sent, which is no greater.
pub(super) fn withdrawn_bound(withdrawn: u64) -> i64 {
    i64::try_from(withdrawn).unwrap_or(i64::MAX)
}

/// Runs an acquisition's statement `work` in a task of its own on the background runtime, which
/// a caller that stops polling or is dropped does not stop, and hands its answer back; a grant
/// (an answer `wrote` finds a fence in) only once the caller claims it (see
/// [`claim`](super::claim)): [`Claimed::Withdrawn`] when the grant was withdrawn before the
/// caller came back for it, which the caller treats as not granted.
///
/// The background side undoes what the statement did, after it, when nobody claims its grant
/// within `window` (the caller was parked, its runtime stalled, or its future dropped), or when
/// nobody takes an error or an answer that leaves it unknown whether the row was written
/// ([`Wrote::Unknown`]): an undo the caller queued itself could reach the database before a statement still on its
/// way, and the row that statement then writes would stay for the whole ttl, held by nobody. A
/// claimed grant is the caller's lease, which the locker's own release undoes.
///
/// `undo` is given the fence of the grant it undoes (`None` after an error or an unknown
/// answer), is sent again until it is answered (for up to the ttl), and must release that grant
/// only: a caller that finds its grant withdrawn tries
/// again as the same owner, and may be granted the key anew before a slow undo (waiting for a
/// connection, or sent again after a broken one) reaches the database, whose `DELETE` by owner
/// alone would then take the new lease from under its holder. (So the acquisition records the
/// fence of each grant withdrawn, and its next try takes a new fence for a row that still
/// carries it, which that undo misses: see [`withdrawn_bound`].) After an error or an unknown
/// answer the caller is gone (nobody took the answer), so the owner tries no more. A caller that
/// takes such an answer has it undone itself once its acquisition has ended (see
/// [`not_granted`]). The task is one of `cleanups`, which the store's `close` waits for: the
/// undo must reach the store before the process ends.
///
/// A try ends for its caller after [`Limits::bound`] whatever the statement does (it can wait
/// for as long as another transaction keeps the row locked): the caller takes it as not
/// granted, and the background side undoes a grant that comes later. The statement and its undo
/// each hold a permit of `tries` while they run, so that tries stuck on locked rows never take
/// every pooled connection: renewals and releases keep one. A try whose caller gave up before
/// it got its permit is not sent.
pub(super) async fn claimed<T, Work, Undo, UndoFut>(
    store: &'static str,
    cleanups: &Arc<Cleanups>,
    tries: &Arc<Semaphore>,
    limits: Limits,
    work: Work,
    wrote: fn(&T) -> Wrote,
    undo: Undo,
) -> Result<Claimed<T>, LockError>
where
    T: Send + 'static,
    Work: Future<Output = Result<T, LockError>> + Send + 'static,
    Undo: Fn(Option<u64>) -> UndoFut + Send + Sync + 'static,
    UndoFut: Future<Output = Result<bool, LockError>> + Send + 'static,
{
    let (caller, claim) = Caller::new();
    let (answer, answered) = tokio::sync::oneshot::channel();
    let tries = Arc::clone(tries);
    cleanups.spawn(async move {
        let outcome = match tries.acquire().await {
            // The caller gave up while the try waited for its turn: nothing is sent, so nothing
            // is to be undone. Sent anyway, a queue of such tries (callers that do not wait, at
            // a row another transaction keeps locked) would cost the database their statements
            // for nobody, and hold up the undo of a grant behind them.
            Ok(_permit) if claim.is_withdrawn() => return,
            Ok(_permit) => work.await,
            Err(_) => Err(LockError::backend(format!("{store} is shut down"))),
        };
        let wrote = outcome.as_ref().map_or(Wrote::Unknown, wrote);
        let granted = match wrote {
            Wrote::Grant(fence) => Some(fence),
            Wrote::Nothing | Wrote::Unknown => None,
        };
        let unknown = matches!(wrote, Wrote::Unknown);
        let unanswered = answer.send(outcome).is_err();
        let withdrawn = if granted.is_some() {
            // A dropped caller withdrew it already; a parked one has the window to come back.
            claim.withdrawn_after(limits.window).await
        } else {
            // A busy answer wrote nothing; an error, or a copy of the statement that went
            // astray, may leave it unknown whether the row was written, and the undo is
            // owner-checked, so harmless where nothing was.
            unknown && unanswered
        };
        if withdrawn {
            if granted.is_some() {
                tracing::debug!(
                    store,
                    "distributed_lock: a grant was not claimed within the claim window; undone"
                );
            }
            undo_until_done(store, &tries, limits.ttl, || undo(granted)).await;
        }
    });
    let Ok(answered) = tokio::time::timeout(limits.bound, answered).await else {
        // Dropping `caller` withdraws a grant that may still come.
        return Ok(Claimed::Unanswered);
    };
    let outcome = answered
        .map_err(|_| LockError::backend(format!("{store} task failed before answering")))??;
    match wrote(&outcome) {
        Wrote::Grant(fence) if !caller.claim() => Ok(Claimed::Withdrawn(fence)),
        _ => Ok(Claimed::Answer(outcome)),
    }
}

/// Sends `undo` until it is answered, for up to `ttl` (the grant it undoes has expired by
/// then): an undo that fails leaves the row held by nobody for the rest of its ttl, and the
/// row it is sent for may well be locked by the transaction that held up the statement it
/// undoes, which outlasts the first try's lock wait. Each try holds a permit of `tries`.
async fn undo_until_done<F, Fut>(store: &'static str, tries: &Semaphore, ttl: Duration, undo: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<bool, LockError>>,
{
    let give_up_at = Instant::now().checked_add(ttl);
    let mut pause = Duration::from_millis(200);
    loop {
        let result = match tries.acquire().await {
            Ok(_permit) => undo().await,
            Err(_) => Err(LockError::backend(format!("{store} is shut down"))),
        };
        let Err(error) = result else { return };
        if give_up_at.is_some_and(|at| Instant::now() + pause >= at) || tries.is_closed() {
            tracing::warn!(store, %error, "distributed_lock: cannot undo an abandoned acquisition; its row expires with its ttl");
            return;
        }
        tracing::debug!(store, %error, retry_in = ?pause, "distributed_lock: an undo failed; trying again");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// How an acquisition that ends without the key answers, `unknown` where a try's answer it took
/// left it unknown whether the key was granted ([`Wrote::Unknown`]): busy, or then an error, so
/// that the runtime undoes the acquisition by its owner
/// ([`Backend::acquire`](super::Backend::acquire)). Only once the acquisition has ended: while
/// it goes on, a later try may be granted the row, which an undo by owner would delete; and a
/// later try granted the key takes the row over as its own, whatever the lost copy wrote.
pub(super) fn not_granted(
    store: &'static str,
    unknown: bool,
) -> Result<Option<super::Acquired>, LockError> {
    if !unknown {
        return Ok(None);
    }
    Err(LockError::backend(format!(
        "{store}: a try's connection broke once its statement was sent, and the statement sent \
         again found the key's row locked by another transaction; whether the key was granted is \
         unknown, and what the try may have written is deleted"
    )))
}

/// How long a try's caller waits for its statement, and then for the grant to be claimed.
pub(super) struct Limits {
    /// How long a grant waits for its caller to claim it.
    pub(super) window: Duration,
    /// How long the caller waits for the statement's answer.
    pub(super) bound: Duration,
    /// The lease's ttl: what a try writes is undone within it, after which it expires anyway.
    pub(super) ttl: Duration,
}

impl Limits {
    /// The limits of a try by a caller that waits until `deadline` (`None`: a wait too long to
    /// add) for a lease of `ttl`: the claim window, or the ttl where shorter; and the time left,
    /// but at least [`TRY_FLOOR`].
    pub(super) fn new(deadline: Option<Instant>, ttl: Duration) -> Limits {
        let left = deadline.map_or(Duration::MAX, |deadline| {
            deadline.saturating_duration_since(Instant::now())
        });
        Limits {
            window: DEFAULT_CLAIM_WINDOW.min(ttl),
            bound: left.max(TRY_FLOOR),
            ttl,
        }
    }
}

/// How long a statement on a backend's own connection waits for a row lock another
/// transaction holds before the server gives up on it (PostgreSQL's `lock_timeout`, MySQL's
/// `innodb_lock_wait_timeout`). A lock statement holds a row lock only for its own short run, so
/// a longer wait is for someone else's transaction (a `SELECT … FOR UPDATE` left open): a try
/// that gives up reads as busy, and hands its connection back rather than keep it, and its
/// permit, for as long as that transaction lasts. Whole seconds, as MySQL takes it.
pub(super) const ROW_LOCK_PATIENCE_S: u64 = 2;

/// The shortest time a try's caller waits for its statement, however short its wait: a caller
/// that does not wait at all still needs one round trip.
pub(super) const TRY_FLOOR: Duration = Duration::from_secs(1);

/// The permits for tries of a pool of `max_connections`: one fewer, so one connection stays
/// for renewals and releases (none fewer than one).
pub(super) fn try_permits(max_connections: u32) -> Arc<Semaphore> {
    let permits = usize::try_from(max_connections.saturating_sub(1).max(1)).unwrap_or(1);
    Arc::new(Semaphore::new(permits))
}

/// Runs `statement` again if it failed in a way that says nothing about the lock: once on a
/// fresh connection if its connection broke (so the first call after a server restart
/// succeeds), and up to three times where `is_conflict` says the server rolled it back for a
/// conflict with another statement (a deadlock victim). Every lock
/// statement is safe to repeat for its owner.
pub(super) async fn retry_transient<T, F, Fut>(
    is_conflict: fn(&sqlx::Error) -> bool,
    statement: F,
) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    retry_transient_blind(is_conflict, statement).await.0
}

/// As [`retry_transient`], and says whether a copy sent went astray: its connection broke (or
/// it read a message it did not expect), which leaves it unknown whether that copy wrote, so an
/// answer of the copy sent again that grants nothing does not say that nothing was granted
/// ([`Wrote::Unknown`]). Counted so even where the connection broke before the statement left
/// (a failed connect): the undo that follows is owner-checked, so harmless then. A closed pool
/// sent nothing.
pub(super) async fn retry_transient_blind<T, F, Fut>(
    is_conflict: fn(&sqlx::Error) -> bool,
    mut statement: F,
) -> (Result<T, sqlx::Error>, bool)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut conflicts = 0;
    let mut reconnected = false;
    let mut blind = false;
    loop {
        match statement().await {
            Err(
                error @ (sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::PoolClosed),
            ) if !reconnected => {
                reconnected = true;
                blind |= !matches!(error, sqlx::Error::PoolClosed);
            }
            Err(error) if is_conflict(&error) && conflicts < 3 => conflicts += 1,
            other => return (other, blind),
        }
    }
}

/// `duration` in whole microseconds, `u64::MAX` where longer.
pub(super) fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// The longest lease the SQL stores keep: a century, as long as
/// [`LockOptions::MAX_WAIT`](crate::LockOptions::MAX_WAIT), which stands for "for ever" too.
///
/// An expiry is `now + ttl` by the database's clock, and must be a timestamp the column holds:
/// MySQL's `DATETIME(6)` ends with the year 9999, and MariaDB does not refuse an interval past
/// that but wraps it (`+ INTERVAL 18446744073709551615 MICROSECOND` is minus one microsecond) or
/// makes it `NULL`, so a longer ttl could write a row that is expired already, which a rival
/// then takes over; PostgreSQL refuses an interval past 2⁶³ µs and a timestamp past the year
/// 294276. A century from now stays thousands of years inside all of these, and in
/// microseconds (3.2 × 10¹⁵) far inside a signed 64-bit integer, which is how MySQL reads an
/// `INTERVAL` and PostgreSQL a `bigint`. A longer ttl is refused rather than shortened (the
/// stores report no [`ttl_limit`](super::Backend::ttl_limit)): a store with a limit is one that
/// does not end a lease at its ttl by itself, which these do.
pub(super) const TTL_LIMIT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `ttl` in whole microseconds, as the statements bind it; [`LockError::InvalidOptions`] for a
/// ttl beyond [`TTL_LIMIT`], which `store` names.
pub(super) fn ttl_micros(store: &'static str, ttl: Duration) -> Result<i64, LockError> {
    let too_long = || LockError::InvalidOptions {
        reason: format!(
            "ttl {ttl:?} is longer than the {TTL_LIMIT:?} (a century) a {store} lease may last: \
             its expiry would be past what the database's timestamps hold"
        ),
    };
    if ttl > TTL_LIMIT {
        return Err(too_long());
    }
    i64::try_from(ttl.as_micros()).map_err(|_| too_long())
}

/// The pauses of an exponential back-off with full jitter: each a random share of the current
/// step (half of it to all of it, so waiters spread out), the step doubling up to a cap.
pub(super) struct Backoff {
    first: Duration,
    step: Duration,
    cap: Duration,
    jitter: Jitter,
}

impl Backoff {
    /// Steps from `first` up to `cap`, the jitter started from `owner`'s token.
    pub(super) fn new(first: Duration, cap: Duration, owner: Owner) -> Self {
        Backoff {
            first,
            step: first,
            cap,
            jitter: Jitter::new(owner),
        }
    }

    /// The next pause; the step after it is twice as long, up to the cap.
    pub(super) fn next_pause(&mut self) -> Duration {
        let pause = self.jitter.between(self.step / 2, self.step);
        self.step = (self.step * 2).min(self.cap);
        pause
    }

    /// Starts again from the first step.
    pub(super) fn reset(&mut self) {
        self.step = self.first;
    }
}

/// A small xorshift generator for back-off jitter, started from the owner token.
struct Jitter(u64);

impl Jitter {
    fn new(owner: Owner) -> Self {
        Jitter((owner.as_u128() as u64) | 1)
    }

    /// A random duration in `low..high` (full jitter between them, so waiters spread out).
    fn between(&mut self, low: Duration, high: Duration) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let span = high.saturating_sub(low).as_micros() as u64;
        low + Duration::from_micros(if span == 0 { 0 } else { self.0 % span })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{ttl_micros, Backoff, Jitter, TTL_LIMIT};
    use crate::{LockError, Owner};

    #[test]
    fn a_ttl_is_bound_in_microseconds_up_to_the_limit_and_refused_past_it() {
        assert_eq!(
            ttl_micros("MySQL", Duration::from_millis(1500)).unwrap(),
            1_500_000
        );
        assert_eq!(
            ttl_micros("MySQL", TTL_LIMIT).unwrap(),
            i64::try_from(TTL_LIMIT.as_micros()).unwrap()
        );
        for ttl in [
            TTL_LIMIT + Duration::from_micros(1),
            Duration::from_millis(i64::MAX as u64),
            Duration::MAX,
        ] {
            match ttl_micros("PostgreSQL", ttl) {
                Err(LockError::InvalidOptions { reason }) => {
                    assert!(
                        reason.contains("century") && reason.contains("PostgreSQL"),
                        "{reason}"
                    )
                }
                other => panic!("a ttl of {ttl:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn backoff_steps_double_up_to_the_cap_and_start_again_on_reset() {
        let ms = Duration::from_millis;
        let mut backoff = Backoff::new(ms(5), ms(40), Owner::random());
        for step in [5, 10, 20, 40, 40, 40] {
            let pause = backoff.next_pause();
            assert!(
                pause >= ms(step) / 2 && pause < ms(step),
                "{pause:?} for a step of {step} ms"
            );
        }
        backoff.reset();
        assert!(backoff.next_pause() < ms(5));
    }

    #[test]
    fn jitter_stays_within_its_bounds() {
        let mut jitter = Jitter::new(Owner::random());
        let (low, high) = (Duration::from_millis(5), Duration::from_millis(10));
        for _ in 0..1_000 {
            let pause = jitter.between(low, high);
            assert!(pause >= low && pause < high, "{pause:?}");
        }
        assert_eq!(jitter.between(high, high), high);
    }
}
