//! One try at a key, and the deletion of a row: the statements an acquisition sends, run on the
//! background runtime so that a grant nobody claims is undone after the statement that made it.

use std::time::Instant;

use sqlx::AssertSqlSafe;

use super::retry::{
    backend_error, is_duplicate_key, lock_timed_out, retry_transient, retry_transient_blind,
};
use super::{MysqlBackend, Shared};
use crate::backend::sql::{self, Limits};
use crate::LockError;

/// One try's answer.
pub(super) enum Attempt {
    /// The key is the caller's: its fence, and when the statement that made it so was sent.
    Granted(u64, Instant),
    Busy,
    /// Not granted by the answer, but a copy of the statement went astray before it and may
    /// have granted the key ([`sql::Wrote::Unknown`]): busy for the acquisition, which has it
    /// undone by its owner if it ends without the key ([`sql::not_granted`]).
    Unknown,
    /// Not granted to the caller: the statement's answer did not come in time, or its grant was
    /// withdrawn before the caller came back for it. What it wrote is undone by its fence, this
    /// one ([`sql::UNKNOWN_FENCE`] where the answer did not come), which the acquisition
    /// records: its next grant must not keep that fence, or that undo would take it.
    Abandoned(u64),
}

impl MysqlBackend {
    /// One try at the key: its `INSERT`, and the take-over `UPDATE` if the row exists; run so
    /// that a caller who stops waiting, or does not come back for its grant within the claim
    /// window, leaves no row behind (see [`sql::claimed`]: a reader's gap lock delays an
    /// `INSERT`, not a `DELETE` of the absent row). `withdrawn`: the greatest fence of this
    /// acquisition's grants that were withdrawn (0 where none was), whose undo may still be on
    /// its way (see [`sql::withdrawn_bound`]).
    pub(super) async fn try_acquire(
        &self,
        key: &str,
        owner: &str,
        label: &str,
        ttl_us: i64,
        withdrawn: u64,
        limits: Limits,
    ) -> Result<Attempt, LockError> {
        let (shared, undo_shared) = (self.shared.clone(), self.shared.clone());
        let (key, owner, label) = (key.as_bytes().to_vec(), owner.to_owned(), label.to_owned());
        let (undo_key, undo_owner) = (key.clone(), owner.clone());
        let attempt = sql::claimed(
            "MySQL",
            &self.shared.cleanups,
            &self.shared.tries,
            limits,
            async move { acquire_row(&shared, &key, &owner, &label, ttl_us, withdrawn).await },
            |(granted, blind)| match granted {
                Some((fence, _)) => sql::Wrote::Grant(*fence),
                None if *blind => sql::Wrote::Unknown,
                None => sql::Wrote::Nothing,
            },
            move |fence| {
                let (shared, key, owner) =
                    (undo_shared.clone(), undo_key.clone(), undo_owner.clone());
                async move { release_row(&shared, &key, &owner, fence).await }
            },
        )
        .await?;
        Ok(match attempt {
            sql::Claimed::Answer((Some((fence, sent_at)), _)) => Attempt::Granted(fence, sent_at),
            sql::Claimed::Answer((None, true)) => Attempt::Unknown,
            sql::Claimed::Answer((None, false)) => Attempt::Busy,
            sql::Claimed::Withdrawn(fence) => Attempt::Abandoned(fence),
            sql::Claimed::Unanswered => Attempt::Abandoned(sql::UNKNOWN_FENCE),
        })
    }
}

/// `INSERT`s the row of `key` for `owner`, or takes an expired (or already ours) row over;
/// `Some((fence, sent_at))` when the key is ours, `sent_at` being when the statement that made
/// it ours left on a connection of its own: the row's ttl starts no earlier. Measured after the
/// wait for a pooled connection, which on a busy pool would otherwise eat into the lease.
/// `label` is written with the row where the table has the column. And whether a copy of a
/// statement went astray (see [`sql::retry_transient_blind`]): a grant it made is this owner's
/// row, which a copy sent again takes over as its own, unless that copy finds the row locked by
/// another transaction past the lock timeout.
async fn acquire_row(
    shared: &Shared,
    key: &[u8],
    owner: &str,
    label: &str,
    ttl_us: i64,
    withdrawn: u64,
) -> Result<(Option<(u64, Instant)>, bool), LockError> {
    let described = shared.sql.described;
    let (insert, inserted_blind) = retry_transient_blind(|| {
        let query = sqlx::query(AssertSqlSafe(shared.sql.insert.clone()))
            .bind(key)
            .bind(owner)
            .bind(ttl_us);
        execute_timed(shared, if described { query.bind(label) } else { query })
    })
    .await;
    match insert {
        Ok((done, sent_at)) => return Ok((Some((done.last_insert_id(), sent_at)), inserted_blind)),
        // The row stayed locked by another transaction for longer than the lock wait timeout.
        Err(error) if lock_timed_out(&error) => return Ok((None, inserted_blind)),
        Err(error) if !is_duplicate_key(&error) => return Err(backend_error(error)),
        Err(_) => {}
    }
    // Held or expired? Take the row over only if it expired by the database's clock.
    let (take_over, took_over_blind) = retry_transient_blind(|| {
        let query = sqlx::query(AssertSqlSafe(shared.sql.take_over.clone()))
            .bind(owner)
            .bind(ttl_us)
            .bind(ttl_us)
            .bind(owner)
            .bind(sql::withdrawn_bound(withdrawn))
            .bind(owner);
        let query = if described { query.bind(label) } else { query };
        execute_timed(shared, query.bind(key).bind(owner))
    })
    .await;
    let blind = inserted_blind || took_over_blind;
    let (take_over, sent_at) = match take_over {
        Ok(answer) => answer,
        Err(error) if lock_timed_out(&error) => return Ok((None, blind)),
        Err(error) => return Err(backend_error(error)),
    };
    let granted = (take_over.rows_affected() == 1).then(|| (take_over.last_insert_id(), sent_at));
    // Answered: a row of this owner's, written by a copy that went astray, would have been taken
    // over as its own (`owner = ?`), so an answer that grants nothing says there is none. Only a
    // lock timeout leaves that unknown (above).
    Ok((granted, false))
}

/// Runs `query` on a connection of its own from the pool, and says when it was sent: after the
/// wait for the connection.
async fn execute_timed(
    shared: &Shared,
    query: sqlx::query::Query<'_, sqlx::MySql, sqlx::mysql::MySqlArguments>,
) -> Result<(sqlx::mysql::MySqlQueryResult, Instant), sqlx::Error> {
    // Boxed: sqlx's future for a pooled connection holds its whole connect path (about
    // 8 KB), which would otherwise sit in every try's and release's task and be copied
    // with it on each move: most of the CPU an uncontended lock spent on the client.
    let mut connection = Box::pin(shared.pool.acquire()).await?;
    let sent_at = Instant::now();
    Ok((query.execute(&mut *connection).await?, sent_at))
}

/// Releases the row of `key` where `owner` holds it (by the grant of `fence` only, where
/// given), keeping it expired and owned by nobody; whether it did.
pub(super) async fn release_row(
    shared: &Shared,
    key: &[u8],
    owner: &str,
    fence: Option<u64>,
) -> Result<bool, LockError> {
    let done = retry_transient(|| {
        sqlx::query(AssertSqlSafe(shared.sql.release.clone()))
            .bind(key)
            .bind(owner)
            .bind(fence)
            .bind(fence)
            .execute(&shared.pool)
    })
    .await
    .map_err(backend_error)?;
    Ok(done.rows_affected() == 1)
}
