//! The server's errors told apart, and where statements run: on the background runtime, where the
//! pool's connections live.

use crate::backend::sql;
use crate::LockError;

/// Runs `task` on dlock's background runtime, where the pool's connections live.
pub(super) async fn on_background<T: Send + 'static>(
    task: impl std::future::Future<Output = Result<T, LockError>> + Send + 'static,
) -> Result<T, LockError> {
    sql::on_background("PostgreSQL", task).await
}

/// A deadlock (40P01) or a serialization failure (40001): the statement was rolled back whole.
pub(super) fn is_conflict(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => matches!(db.code().as_deref(), Some("40P01" | "40001")),
        _ => false,
    }
}

/// A row lock not granted within the connection's `lock_timeout` (55P03): the row is another
/// transaction's for longer than a lock statement takes.
pub(super) fn lock_timed_out(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => db.code().as_deref() == Some("55P03"),
        _ => false,
    }
}

/// A failed statement, as the caller is told of it.
pub(super) fn backend_error(error: sqlx::Error) -> LockError {
    LockError::backend(format!("PostgreSQL: {error}"))
}
