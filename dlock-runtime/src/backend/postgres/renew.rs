//! Renewal: every lease of a tick in one `UPDATE … FROM unnest(…)`; and one lease's expiry set
//! exactly.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sqlx::Row;

use super::query::Statement;
use super::{backend_error, is_conflict, Shared};
use crate::backend::sql::retry_transient;
use crate::LockError;

/// Renews `leases` (key, owner, ttl in µs): one statement that passes over the rows another
/// transaction keeps locked, then, where it passed some over, one for those that waits for them,
/// for a sixth of their shortest ttl at most (a rival's try locks a row for a moment; a
/// transaction left open keeps it locked: the rest of the batch, renewed already, is not held up
/// for it, and the next tick comes in time). A lease is renewed (`Some(true)`) where either
/// renewed it, not known to be (`None`, tried again at the next tick) where the second failed,
/// and not held (`Some(false)`) where neither found it.
pub(super) async fn renew_all(
    shared: &Shared,
    leases: &[(Vec<u8>, String, i64)],
) -> Result<Vec<Option<bool>>, LockError> {
    let rows = send_renewal(shared, &shared.sql.renew, leases).await?;
    let answered = rows
        .iter()
        .map(|row| {
            let pair = (row.try_get::<Vec<u8>, _>(0)?, row.try_get::<String, _>(1)?);
            Ok((pair, row.try_get::<bool, _>(2)?))
        })
        .collect::<Result<HashMap<(Vec<u8>, String), bool>, sqlx::Error>>()
        .map_err(backend_error)?;
    let passed_over: Vec<(Vec<u8>, String, i64)> = leases
        .iter()
        .filter(|(key, owner, _)| answered.get(&(key.clone(), owner.clone())) == Some(&false))
        .cloned()
        .collect();
    let renewed_late = if passed_over.is_empty() {
        Some(HashMap::new())
    } else {
        let shortest_us = passed_over
            .iter()
            .map(|(_, _, ttl)| *ttl)
            .min()
            .unwrap_or(0);
        let patience = Duration::from_micros(u64::try_from(shortest_us / 6).unwrap_or(0))
            .clamp(Duration::from_millis(20), Duration::from_secs(2));
        // Dropped at the bound, the statement is left to the server, where a renewal that lands
        // late never moves an expiry back; its connection is closed rather than reused.
        let waited = tokio::time::timeout(
            patience,
            send_renewal(shared, &shared.sql.renew_waiting, &passed_over),
        )
        .await
        .unwrap_or_else(|_| {
            Err(LockError::backend(
                "PostgreSQL: a renewal waited too long for a locked row",
            ))
        });
        match waited {
            Ok(rows) => Some(
                rows.iter()
                    .map(|row| Ok(((row.try_get(0)?, row.try_get(1)?), true)))
                    .collect::<Result<HashMap<(Vec<u8>, String), bool>, sqlx::Error>>()
                    .map_err(backend_error)?,
            ),
            Err(error) => {
                tracing::debug!(%error, leases = passed_over.len(), "distributed_lock: renewals of rows another transaction keeps locked failed; tried again at the next tick");
                None
            }
        }
    };
    Ok(leases
        .iter()
        .map(|(key, owner, _)| {
            let pair = (key.clone(), owner.clone());
            match answered.get(&pair) {
                Some(true) => Some(true),
                Some(false) => renewed_late.as_ref().map(|late| late.contains_key(&pair)),
                None => Some(false),
            }
        })
        .collect())
}

/// Sends `statement` (a renewal) for `leases`: its rows.
async fn send_renewal(
    shared: &Shared,
    statement: &Statement,
    leases: &[(Vec<u8>, String, i64)],
) -> Result<Vec<sqlx::postgres::PgRow>, LockError> {
    let keys: Vec<Vec<u8>> = leases.iter().map(|(key, _, _)| key.clone()).collect();
    let owners: Vec<String> = leases.iter().map(|(_, owner, _)| owner.clone()).collect();
    let ttls: Vec<i64> = leases.iter().map(|(_, _, ttl)| *ttl).collect();
    retry_transient(is_conflict, || {
        shared.statements.fetch_add(1, Ordering::Relaxed);
        statement
            .query()
            .bind(keys.as_slice())
            .bind(owners.as_slice())
            .bind(ttls.as_slice())
            .fetch_all(&shared.pool)
    })
    .await
    .map_err(backend_error)
}

/// Sets the expiry of `owner`'s live row of `key` to `after_us` from now by the database's
/// clock, sooner or later than it was, and announces it; whether `owner` held it.
pub(super) async fn expire_row(
    shared: &Shared,
    key: &[u8],
    owner: &str,
    after_us: i64,
) -> Result<bool, LockError> {
    let rows = retry_transient(is_conflict, || {
        shared.statements.fetch_add(1, Ordering::Relaxed);
        shared
            .sql
            .expire
            .query()
            .bind(key)
            .bind(owner)
            .bind(after_us)
            .fetch_all(&shared.pool)
    })
    .await
    .map_err(backend_error)?;
    Ok(!rows.is_empty())
}
