//! Renewal: the leases of a tick in one short transaction per chunk, which passes over a row
//! another transaction keeps locked rather than wait for it.
//!
//! A single `UPDATE` of every lease would wait on such a row (a `SELECT … FOR UPDATE` left
//! open in a client) holding the locks of the rows it already changed, and fail after the lock
//! wait timeout with every lease of the chunk: one locked row would cost every lease renewed
//! beside it, tick after tick. `SELECT … FOR UPDATE SKIP LOCKED` takes the rows it can at once,
//! the `UPDATE` then changes only those, and a lease whose row was passed over is answered
//! "not confirmed this round" (judged by its own deadline, and tried again soon).

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use sqlx::mysql::MySqlDatabaseError;
use sqlx::{AssertSqlSafe, Row};

use super::retry::{backend_error, retry_transient};
use super::Shared;
use crate::LockError;

/// The expiry a renewal sets, the ttl bound first: never earlier than the row's. A renewal is
/// sent again when its answer is late, and the first copy can land last, held up on the server
/// with the time it read as it began; the client counts the lease from the later copy.
const EXTENDED: &str = "GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)";

/// One lease to renew: key, owner, ttl in µs.
pub(super) type Lease = (Vec<u8>, String, i64);

/// Renews `chunk`: for each lease, `Some(held)`, or `None` where another transaction keeps its
/// row locked. On a server without `SKIP LOCKED` (before MySQL 8.0.1 and MariaDB 10.6), one
/// `UPDATE` per distinct ttl, which waits on such a row.
pub(super) async fn renew_chunk(
    shared: &Shared,
    chunk: &[Lease],
) -> Result<Vec<Option<bool>>, LockError> {
    if !shared.without_skip_locked.load(Ordering::Relaxed) {
        match retry_transient(|| renew_skipping_locked(shared, chunk)).await {
            Err(error) if is_syntax_error(&error) => {
                shared.without_skip_locked.store(true, Ordering::Relaxed);
                tracing::warn!(%error, "distributed_lock: the MySQL server has no `SKIP LOCKED`; a lock row another transaction keeps locked holds up the renewal of every lease renewed with it");
            }
            other => return other.map_err(backend_error),
        }
    }
    let held = renew_in_one_update(shared, chunk).await?;
    Ok(held.into_iter().map(Some).collect())
}

/// The transaction: lock the rows that are live, ours, and not locked by another transaction;
/// extend them; and, where some lease's row was not locked so, tell a row passed over (ours
/// and live, `None`) from a lease lost (`Some(false)`).
async fn renew_skipping_locked(
    shared: &Shared,
    chunk: &[Lease],
) -> Result<Vec<Option<bool>>, sqlx::Error> {
    let table = &shared.sql.table;
    let mut transaction = shared.pool.begin().await?;
    let keys = vec!["?"; chunk.len()].join(", ");
    let pairs = vec!["(?, ?)"; chunk.len()].join(", ");
    let sql = format!(
        "SELECT lock_key, owner FROM {table} \
         WHERE lock_key IN ({keys}) AND (lock_key, owner) IN ({pairs}) \
           AND expires_at > UTC_TIMESTAMP(6) \
         FOR UPDATE SKIP LOCKED"
    );
    let mut query = sqlx::query(AssertSqlSafe(sql));
    for (key, _, _) in chunk {
        query = query.bind(key);
    }
    for (key, owner, _) in chunk {
        query = query.bind(key).bind(owner);
    }
    let locked = pairs_of(query.fetch_all(&mut *transaction).await?)?;
    // The rows are ours and live, and locked by this transaction until it commits: nobody can
    // take them over meanwhile, so the `UPDATE` needs no check of its own.
    let mut ttls: Vec<i64> = chunk.iter().map(|(_, _, ttl)| *ttl).collect();
    ttls.sort_unstable();
    ttls.dedup();
    for ttl in ttls {
        let group: Vec<&Vec<u8>> = chunk
            .iter()
            .filter(|(key, owner, t)| *t == ttl && locked.contains(&(key.clone(), owner.clone())))
            .map(|(key, _, _)| key)
            .collect();
        if group.is_empty() {
            continue;
        }
        let keys = vec!["?"; group.len()].join(", ");
        let sql = format!("UPDATE {table} SET expires_at = {EXTENDED} WHERE lock_key IN ({keys})");
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(ttl);
        for key in group {
            query = query.bind(key);
        }
        query.execute(&mut *transaction).await?;
    }
    let rest: Vec<&Lease> = chunk
        .iter()
        .filter(|(key, owner, _)| !locked.contains(&(key.clone(), owner.clone())))
        .collect();
    let passed_over = if rest.is_empty() {
        HashSet::new()
    } else {
        // A plain read, which no row lock holds up.
        let keys = vec!["?"; rest.len()].join(", ");
        let sql = format!(
            "SELECT lock_key, owner FROM {table} \
             WHERE lock_key IN ({keys}) AND expires_at > UTC_TIMESTAMP(6)"
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for (key, _, _) in &rest {
            query = query.bind(key);
        }
        pairs_of(query.fetch_all(&mut *transaction).await?)?
    };
    transaction.commit().await?;
    Ok(chunk
        .iter()
        .map(|(key, owner, _)| {
            let pair = (key.clone(), owner.clone());
            if locked.contains(&pair) {
                Some(true)
            } else if passed_over.contains(&pair) {
                None
            } else {
                Some(false)
            }
        })
        .collect())
}

/// The (key, owner) pairs of `rows`.
fn pairs_of(rows: Vec<sqlx::mysql::MySqlRow>) -> Result<HashSet<(Vec<u8>, String)>, sqlx::Error> {
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect()
}

/// A statement the server could not parse (1064): here, one with `SKIP LOCKED`.
fn is_syntax_error(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .is_some_and(|e| e.number() == 1064),
        _ => false,
    }
}

/// Renews `chunk` with one `UPDATE` per distinct ttl (normally one), and a `SELECT` only when
/// some lease was not renewed.
async fn renew_in_one_update(shared: &Shared, chunk: &[Lease]) -> Result<Vec<bool>, LockError> {
    let table = &shared.sql.table;
    let mut ttls: Vec<i64> = chunk.iter().map(|(_, _, ttl)| *ttl).collect();
    ttls.sort_unstable();
    ttls.dedup();
    let mut renewed = 0;
    for ttl in ttls {
        let group: Vec<&Lease> = chunk.iter().filter(|(_, _, t)| *t == ttl).collect();
        let keys = vec!["?"; group.len()].join(", ");
        let pairs = vec!["(?, ?)"; group.len()].join(", ");
        let sql = format!(
            "UPDATE {table} SET expires_at = {EXTENDED} \
             WHERE expires_at > UTC_TIMESTAMP(6) AND lock_key IN ({keys}) AND (lock_key, owner) IN ({pairs})"
        );
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(ttl);
        for (key, _, _) in &group {
            query = query.bind(key);
        }
        for (key, owner, _) in &group {
            query = query.bind(key).bind(owner);
        }
        renewed += query
            .execute(&shared.pool)
            .await
            .map_err(backend_error)?
            .rows_affected();
    }
    if renewed == chunk.len() as u64 {
        return Ok(vec![true; chunk.len()]);
    }
    // Some lease was not renewed: find out which are still ours.
    let keys = vec!["?"; chunk.len()].join(", ");
    let sql = format!("SELECT lock_key, owner FROM {table} WHERE lock_key IN ({keys}) AND expires_at > UTC_TIMESTAMP(6)");
    let mut query = sqlx::query(AssertSqlSafe(sql));
    for (key, _, _) in chunk {
        query = query.bind(key);
    }
    let rows = query.fetch_all(&shared.pool).await.map_err(backend_error)?;
    let ours = pairs_of(rows).map_err(backend_error)?;
    Ok(chunk
        .iter()
        .map(|(key, owner, _)| ours.contains(&(key.clone(), owner.clone())))
        .collect())
}
