//! What the SQL stores (MySQL, PostgreSQL) share: their statements run on dlock's background
//! runtime, are tried again after a failure that says nothing about the lock, are undone when
//! the acquisition that sent them was abandoned, and their waiters back off with jitter.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

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

/// Runs an acquisition's statement `work` in a task of its own on the background runtime, which
/// a dropped caller does not stop, and hands its answer back. When nobody is left to take the
/// answer (the caller stopped waiting), runs `undo` instead, after the statement: an undo the
/// caller queued itself could reach the database before a statement still on its way, and the
/// row that statement then writes would stay for the whole ttl, held by nobody. A caller
/// dropped after taking the answer is covered by the locker's own release, which then runs
/// after the statement too.
pub(super) async fn unless_abandoned<T, Work, Undo, UndoFut>(
    store: &'static str,
    cleanups: &Arc<Cleanups>,
    work: Work,
    undo: Undo,
) -> Result<T, LockError>
where
    T: Send + 'static,
    Work: Future<Output = Result<T, LockError>> + Send + 'static,
    Undo: FnOnce() -> UndoFut + Send + 'static,
    UndoFut: Future<Output = ()> + Send + 'static,
{
    let (answer, answered) = tokio::sync::oneshot::channel();
    // A clean-up, which the store's `close` waits for: the undo must reach the store before
    // the process ends.
    cleanups.spawn(async move {
        let outcome = work.await;
        if answer.send(outcome).is_err() {
            // Whatever the outcome, even an error that leaves it unknown whether the row was
            // written: the undo is owner-checked, so it is harmless where nothing was.
            undo().await;
        }
    });
    answered
        .await
        .map_err(|_| LockError::backend(format!("{store} task failed before answering")))?
}

/// Runs `statement` again if it failed in a way that says nothing about the lock: once on a
/// fresh connection if its connection broke (so the first call after a server restart
/// succeeds), and up to three times where `is_conflict` says the server rolled it back for a
/// conflict with another statement (a deadlock victim, a lock-wait time-out). Every lock
/// statement is safe to repeat for its owner.
pub(super) async fn retry_transient<T, F, Fut>(
    is_conflict: fn(&sqlx::Error) -> bool,
    mut statement: F,
) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut conflicts = 0;
    let mut reconnected = false;
    loop {
        match statement().await {
            Err(sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::PoolClosed)
                if !reconnected =>
            {
                reconnected = true;
            }
            Err(error) if is_conflict(&error) && conflicts < 3 => conflicts += 1,
            other => return other,
        }
    }
}

/// `duration` in whole microseconds, as the statements take a ttl.
pub(super) fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// A small xorshift generator for back-off jitter, started from the owner token.
pub(super) struct Jitter(u64);

impl Jitter {
    pub(super) fn new(owner: Owner) -> Self {
        Jitter((owner.as_u128() as u64) | 1)
    }

    /// A random duration in `low..high` (full jitter between them, so waiters spread out).
    pub(super) fn between(&mut self, low: Duration, high: Duration) -> Duration {
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

    use super::Jitter;
    use crate::Owner;

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
