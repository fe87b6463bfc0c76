//! Running statements: on the background runtime, again after a transient failure, and the
//! server's errors told apart.

use std::future::Future;

use sqlx::mysql::MySqlDatabaseError;

use crate::{background, LockError};

/// Runs `task` on dlock's background runtime, where the pool's connections live.
pub(super) async fn on_background<T: Send + 'static>(
    task: impl Future<Output = Result<T, LockError>> + Send + 'static,
) -> Result<T, LockError> {
    background::handle()
        .spawn(task)
        .await
        .map_err(|error| LockError::backend(format!("MySQL task failed: {error}")))?
}

/// Runs `statement` again if it failed in a way that says nothing about the lock: once on a
/// fresh connection if its connection broke (so the first call after a server restart
/// succeeds), and up to three times when InnoDB chose it as a deadlock victim or timed out its
/// row-lock wait — concurrent `INSERT`s and `DELETE`s of one key can deadlock on the key's index
/// record, and a victim's autocommit statement was rolled back whole. Every lock statement is
/// safe to repeat for its owner.
pub(super) async fn retry_transient<T, F, Fut>(mut statement: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut deadlocks = 0;
    let mut reconnected = false;
    loop {
        match statement().await {
            Err(sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::PoolClosed)
                if !reconnected =>
            {
                reconnected = true;
            }
            Err(error) if is_lock_conflict(&error) && deadlocks < 3 => deadlocks += 1,
            other => return other,
        }
    }
}

/// A deadlock (1213) or a row-lock wait time-out (1205).
fn is_lock_conflict(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .is_some_and(|e| matches!(e.number(), 1205 | 1213)),
        _ => false,
    }
}

pub(super) fn is_duplicate_key(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .is_some_and(|e| e.number() == 1062),
        _ => false,
    }
}

pub(super) fn backend_error(error: sqlx::Error) -> LockError {
    LockError::backend(format!("MySQL: {error}"))
}
