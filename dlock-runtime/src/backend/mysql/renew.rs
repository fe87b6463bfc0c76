//! Renewal: every lease of a tick in one `UPDATE` per chunk; and one lease's expiry set exactly.

use sqlx::{AssertSqlSafe, Row};

use super::retry::{backend_error, retry_transient};
use super::Shared;
use crate::LockError;

/// Renews `chunk` with one `UPDATE` per distinct ttl (normally one), and a `SELECT` only when
/// some lease was not renewed.
pub(super) async fn renew_chunk(
    shared: &Shared,
    chunk: &[(Vec<u8>, String, i64)],
) -> Result<Vec<bool>, LockError> {
    let table = &shared.sql.table;
    let mut ttls: Vec<i64> = chunk.iter().map(|(_, _, ttl)| *ttl).collect();
    ttls.sort_unstable();
    ttls.dedup();
    let mut renewed = 0;
    for ttl in ttls {
        let group: Vec<&(Vec<u8>, String, i64)> =
            chunk.iter().filter(|(_, _, t)| *t == ttl).collect();
        let keys = vec!["?"; group.len()].join(", ");
        let pairs = vec!["(?, ?)"; group.len()].join(", ");
        // Never moving an expiry back: a renewal is sent again when its answer is late, and
        // the first copy can land last, held up on the server with the time it read as it
        // began; the client counts the lease from the later copy.
        let sql = format!(
            "UPDATE {table} SET expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
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
    let ours: Vec<(Vec<u8>, String)> = rows
        .iter()
        .map(|row| (row.get::<Vec<u8>, _>(0), row.get::<String, _>(1)))
        .collect();
    Ok(chunk
        .iter()
        .map(|(key, owner, _)| ours.iter().any(|(k, o)| k == key && o == owner))
        .collect())
}

/// Sets the expiry of `owner`'s live row of `key` to `after_us` from now by the database's
/// clock, sooner or later than it was; whether `owner` held it.
pub(super) async fn expire_row(
    shared: &Shared,
    key: &[u8],
    owner: &str,
    after_us: i64,
) -> Result<bool, LockError> {
    let done = retry_transient(|| {
        sqlx::query(AssertSqlSafe(shared.sql.expire.clone()))
            .bind(after_us)
            .bind(key)
            .bind(owner)
            .execute(&shared.pool)
    })
    .await
    .map_err(backend_error)?;
    Ok(done.rows_affected() == 1)
}
