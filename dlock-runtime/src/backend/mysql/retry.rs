//! Running statements: on the background runtime, again after a transient failure, and the
//! server's errors told apart.

use std::future::Future;

use sqlx::mysql::MySqlDatabaseError;

use crate::backend::sql;
use crate::LockError;

/// Runs `task` on dlock's background runtime, where the pool's connections live.
pub(super) async fn on_background<T: Send + 'static>(
    task: impl Future<Output = Result<T, LockError>> + Send + 'static,
) -> Result<T, LockError> {
    sql::on_background("MySQL", task).await
}

/// Runs `statement` again after a failure that says nothing about the lock: a broken
/// connection (once), or InnoDB choosing it as a deadlock victim or timing out its row-lock
/// wait (up to three times) — concurrent `INSERT`s and `DELETE`s of one key can deadlock on the
/// key's index record, and a victim's autocommit statement was rolled back whole.
pub(super) async fn retry_transient<T, F, Fut>(statement: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    sql::retry_transient(is_lock_conflict, statement).await
}

/// As [`retry_transient`], and whether a copy sent went astray (see
/// [`sql::retry_transient_blind`]).
pub(super) async fn retry_transient_blind<T, F, Fut>(statement: F) -> (Result<T, sqlx::Error>, bool)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    sql::retry_transient_blind(is_lock_conflict, statement).await
}

/// A deadlock (1213). Not a row-lock wait time-out (1205): the row is another transaction's for
/// longer than a lock statement takes, which trying again would only wait out again.
fn is_lock_conflict(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .is_some_and(|e| e.number() == 1213),
        _ => false,
    }
}

/// A row-lock wait time-out (1205): the row stayed another transaction's for longer than
/// `innodb_lock_wait_timeout`.
pub(super) fn lock_timed_out(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .is_some_and(|e| e.number() == 1205),
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
