//! Renewal: every lease of a tick in one `UPDATE … FROM unnest(…)`, which passes over a row
//! another transaction keeps locked rather than wait for it.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use sqlx::Row;

use super::{backend_error, is_conflict, Shared};
use crate::backend::sql::retry_transient;
use crate::LockError;

/// Renews `leases` (key, owner, ttl in µs) with one statement: for each, `Some(held)`, or `None`
/// where its row is held but another transaction keeps it locked (not renewed this round).
pub(super) async fn renew_all(
    shared: &Shared,
    leases: &[(Vec<u8>, String, i64)],
) -> Result<Vec<Option<bool>>, LockError> {
    let keys: Vec<Vec<u8>> = leases.iter().map(|(key, _, _)| key.clone()).collect();
    let owners: Vec<String> = leases.iter().map(|(_, owner, _)| owner.clone()).collect();
    let ttls: Vec<i64> = leases.iter().map(|(_, _, ttl)| *ttl).collect();
    let rows = retry_transient(is_conflict, || {
        shared.statements.fetch_add(1, Ordering::Relaxed);
        shared
            .sql
            .renew
            .query()
            .bind(keys.as_slice())
            .bind(owners.as_slice())
            .bind(ttls.as_slice())
            .fetch_all(&shared.pool)
    })
    .await
    .map_err(backend_error)?;
    let answered = rows
        .iter()
        .map(|row| {
            Ok((
                (row.try_get::<Vec<u8>, _>(0)?, row.try_get::<String, _>(1)?),
                row.try_get::<bool, _>(2)?,
            ))
        })
        .collect::<Result<HashMap<(Vec<u8>, String), bool>, sqlx::Error>>()
        .map_err(backend_error)?;
    Ok(leases
        .iter()
        .map(
            |(key, owner, _)| match answered.get(&(key.clone(), owner.clone())) {
                Some(true) => Some(true),
                Some(false) => None,
                None => Some(false),
            },
        )
        .collect())
}
