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

/// Renews `leases` (key, owner, ttl in µs) with one statement that passes over the rows another
/// transaction keeps locked; those passed over are tried again, a few milliseconds apart, for a
/// sixth of their shortest ttl at most. A rival's try locks a contended key's row for its own
/// short run (an `INSERT … ON CONFLICT` locks the row it conflicts with, granted or not), so a
/// second or third try renews it; a transaction left open keeps a row locked, and its lease is
/// answered `None` (not renewed this time, tried at the next tick) without holding up the rest
/// of the batch, or leaving a statement waiting on the server. A lease is renewed
/// (`Some(true)`) where a try renewed it, and not held (`Some(false)`) where a try found it
/// no longer its owner's.
pub(super) async fn renew_all(
    shared: &Shared,
    leases: &[(Vec<u8>, String, i64)],
) -> Result<Vec<Option<bool>>, LockError> {
    let mut answers: HashMap<(Vec<u8>, String), Option<bool>> = HashMap::new();
    let mut pending: Vec<(Vec<u8>, String, i64)> = leases.to_vec();
    let shortest_us = leases.iter().map(|(_, _, ttl)| *ttl).min().unwrap_or(0);
    let patience = Duration::from_micros(u64::try_from(shortest_us / 6).unwrap_or(0))
        .clamp(Duration::from_millis(20), Duration::from_secs(2));
    let deadline = tokio::time::Instant::now() + patience;
    let mut first = true;
    while !pending.is_empty() {
        if !first {
            if tokio::time::Instant::now() + RETRY_PASSED_OVER >= deadline {
                break;
            }
            tokio::time::sleep(RETRY_PASSED_OVER).await;
        }
        let rows = match send_renewal(shared, &shared.sql.renew, &pending).await {
            Ok(rows) => rows,
            // The batch itself failed: the store's error, as before.
            Err(error) if first => return Err(error),
            // A try of rows passed over failed: they are not renewed this time.
            Err(error) => {
                tracing::debug!(%error, leases = pending.len(), "distributed_lock: renewals of rows another transaction kept locked failed; tried at the next tick");
                break;
            }
        };
        first = false;
        let answered = rows
            .iter()
            .map(|row| {
                let pair = (row.try_get::<Vec<u8>, _>(0)?, row.try_get::<String, _>(1)?);
                Ok((pair, row.try_get::<bool, _>(2)?))
            })
            .collect::<Result<HashMap<(Vec<u8>, String), bool>, sqlx::Error>>()
            .map_err(backend_error)?;
        pending.retain(|(key, owner, _)| {
            let pair = (key.clone(), owner.clone());
            match answered.get(&pair) {
                Some(true) => {
                    answers.insert(pair, Some(true));
                    false
                }
                Some(false) => true,
                None => {
                    answers.insert(pair, Some(false));
                    false
                }
            }
        });
    }
    Ok(leases
        .iter()
        .map(|(key, owner, _)| {
            answers
                .get(&(key.clone(), owner.clone()))
                .copied()
                .unwrap_or(None)
        })
        .collect())
}

/// The pause before rows a renewal passed over are tried again.
const RETRY_PASSED_OVER: Duration = Duration::from_millis(3);

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
