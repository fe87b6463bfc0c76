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

/// `INSERT`s the row of `key` for `owner`, or takes an expired, released (or already ours) row
/// over; `Some((fence, sent_at))` when the key is ours, `sent_at` being when the statement that
/// made it ours left on a connection of its own: the row's ttl starts no earlier. Measured
/// after the wait for a pooled connection, which on a busy pool would otherwise eat into the
/// lease. `label` is written with the row where the table has the column. And whether a copy
/// of a statement went astray (see [`sql::retry_transient_blind`]): a grant it made is this
/// owner's row, which a copy sent again takes over as its own, unless that copy finds the row
/// locked by another transaction past the lock timeout.
///
/// A key this backend has seen a row of is tried with the take-over first: releases keep the
/// row, so a key taken again (a contended key, a key of a busy account) is granted by one
/// statement rather than by a failed `INSERT` and the take-over. Where that takes nothing, the
/// `INSERT` follows, as for a key never seen (its row may have been deleted since).
async fn acquire_row(
    shared: &Shared,
    key: &[u8],
    owner: &str,
    label: &str,
    ttl_us: i64,
    withdrawn: u64,
) -> Result<(Option<(u64, Instant)>, bool), LockError> {
    let take_over = || take_over_row(shared, key, owner, label, ttl_us, withdrawn);
    let row_seen = shared.rows_seen.contains(key);
    let mut blind = false;
    if row_seen {
        let (taken, took_over_blind) = take_over().await;
        blind = took_over_blind;
        match taken {
            Ok((done, sent_at)) if done.rows_affected() == 1 => {
                return Ok((Some((done.last_insert_id(), sent_at)), false))
            }
            // Held by another, or no row: the `INSERT` tells.
            Ok(_) => {}
            Err(error) if lock_timed_out(&error) => return Ok((None, blind)),
            Err(error) => return Err(backend_error(error)),
        }
    }
    let described = shared.sql.described;
    let (insert, inserted_blind) = retry_transient_blind(|| {
        let query = sqlx::query(AssertSqlSafe(shared.sql.insert.clone()))
            .bind(key)
            .bind(owner)
            .bind(ttl_us);
        execute_timed(shared, if described { query.bind(label) } else { query })
    })
    .await;
    blind |= inserted_blind;
    match insert {
        Ok((done, sent_at)) => {
            shared.rows_seen.insert(key);
            return Ok((Some((done.last_insert_id(), sent_at)), blind));
        }
        // The row stayed locked by another transaction for longer than the lock wait timeout.
        Err(error) if lock_timed_out(&error) => return Ok((None, blind)),
        Err(error) if !is_duplicate_key(&error) => return Err(backend_error(error)),
        Err(_) => shared.rows_seen.insert(key),
    }
    if row_seen && !inserted_blind {
        // The take-over answered that the row was not to be taken (held), or that there was
        // none, and another's `INSERT` came first since: busy either way, as of then. And not
        // this owner's (the take-over takes its own row), which no copy of the `INSERT` that
        // went astray could have written since.
        return Ok((None, false));
    }
    // Held, expired or released? Take the row over only if it is free by the database's clock.
    let (taken, took_over_blind) = take_over().await;
    let blind = blind || took_over_blind;
    let (taken, sent_at) = match taken {
        Ok(answer) => answer,
        Err(error) if lock_timed_out(&error) => return Ok((None, blind)),
        Err(error) => return Err(backend_error(error)),
    };
    let granted = (taken.rows_affected() == 1).then(|| (taken.last_insert_id(), sent_at));
    // Answered: a row of this owner's, written by a copy that went astray, would have been taken
    // over as its own (`owner = ?`), so an answer that grants nothing says there is none. Only a
    // lock timeout leaves that unknown (above).
    Ok((granted, false))
}

/// The take-over `UPDATE` of `key`'s row for `owner` (see [`Statements`](super::Statements)),
/// and whether a copy of it went astray.
async fn take_over_row(
    shared: &Shared,
    key: &[u8],
    owner: &str,
    label: &str,
    ttl_us: i64,
    withdrawn: u64,
) -> (
    Result<(sqlx::mysql::MySqlQueryResult, Instant), sqlx::Error>,
    bool,
) {
    retry_transient_blind(|| {
        let query = sqlx::query(AssertSqlSafe(shared.sql.take_over.clone()))
            .bind(owner)
            .bind(ttl_us)
            .bind(ttl_us)
            .bind(owner)
            .bind(sql::withdrawn_bound(withdrawn))
            .bind(owner);
        let query = if shared.sql.described {
            query.bind(label)
        } else {
            query
        };
        execute_timed(shared, query.bind(key).bind(owner))
    })
    .await
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
