//! Renewal: every lease of a tick in one `UPDATE … FROM unnest(…)`; and one lease's expiry set
//! exactly.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use sqlx::Row;

use super::{backend_error, is_conflict, Shared};
use crate::backend::sql::retry_transient;
use crate::LockError;

/// Renews `leases` (key, owner, ttl in µs) with one statement, which answers the (key, owner)
/// pairs it renewed, and those it passed over, their rows locked by another transaction: a
/// lease is renewed (`Some(true)`) where its pair came back renewed, not known to be
/// (`None`, tried again) where it came back passed over, and not held where it did not come
/// back.
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
            let pair = (row.try_get::<Vec<u8>, _>(0)?, row.try_get::<String, _>(1)?);
            Ok((pair, row.try_get::<bool, _>(2)?))
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
