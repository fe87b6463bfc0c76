//! For operators: a key's live row and waiters
//! ([`Backend::inspect`](crate::backend::Backend::inspect)), the live rows' keys
//! ([`Backend::list`](crate::backend::Backend::list)), and the eviction of a holder
//! ([`Backend::force_release`](crate::backend::Backend::force_release)).

use std::sync::atomic::Ordering;

use sqlx::Row;

use super::{backend_error, check_key, is_conflict, on_background, PostgresBackend};
use crate::backend::description::{list_by_pages, Described};
use crate::backend::sql;
use crate::{KeyState, LockError, Owner};

impl PostgresBackend {
    /// `key`'s live row, described, and its waiters: this backend's, and one for each other
    /// backend's live place in line.
    pub(super) async fn inspect_key(&self, key: &str) -> Result<KeyState, LockError> {
        let own = self.shared.waiting.waiters(key.as_bytes());
        if check_key(key).is_err() {
            // Never acquired: an acquire refuses such a key before sending anything.
            return Ok(KeyState::new(key, Vec::new(), own));
        }
        let shared = self.shared.clone();
        let bytes = key.as_bytes().to_vec();
        let row = on_background(async move {
            sql::retry_transient(is_conflict, || {
                shared.statements.fetch_add(1, Ordering::Relaxed);
                shared
                    .sql
                    .inspect
                    .query()
                    .bind(bytes.as_slice())
                    .bind(shared.waiter.as_str())
                    .fetch_one(&shared.pool)
            })
            .await
            .map_err(backend_error)
        })
        .await?;
        let others: i64 = row.try_get(0).map_err(backend_error)?;
        let waiters = own + usize::try_from(others).unwrap_or(0);
        let Some(owner) = row.try_get::<Option<String>, _>(1).map_err(backend_error)? else {
            return Ok(KeyState::new(key, Vec::new(), waiters));
        };
        let text = |at: usize| -> Result<Option<String>, LockError> {
            let bytes: Option<Vec<u8>> = row.try_get(at).map_err(backend_error)?;
            Ok(bytes.map(|bytes| String::from_utf8_lossy(&bytes).into_owned()))
        };
        let fence: i64 = row.try_get(2).map_err(backend_error)?;
        let pid: Option<i64> = row.try_get(7).map_err(backend_error)?;
        let described = Described {
            owner,
            fence: u64::try_from(fence).unwrap_or(0),
            acquired_us: row.try_get(3).map_err(backend_error)?,
            left_us: Some(row.try_get(4).map_err(backend_error)?),
            label: text(5)?,
            host: text(6)?,
            pid: pid.and_then(|pid| u32::try_from(pid).ok()),
        };
        Ok(KeyState::new(
            key,
            vec![described.holder("PostgreSQL", key)?],
            waiters,
        ))
    }

    /// The keys of the live rows that start with `prefix`, in key order, a page at a time.
    pub(super) async fn list_keys(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        let shared = self.shared.clone();
        let prefix = prefix.as_bytes().to_vec();
        on_background(async move {
            list_by_pages(&prefix, |from, end| {
                let shared = &shared;
                async move {
                    let rows = sql::retry_transient(is_conflict, || {
                        shared.statements.fetch_add(1, Ordering::Relaxed);
                        let query = match &end {
                            Some(end) => shared
                                .sql
                                .list_to
                                .query()
                                .bind(from.as_slice())
                                .bind(end.as_slice()),
                            None => shared.sql.list.query().bind(from.as_slice()),
                        };
                        query.fetch_all(&shared.pool)
                    })
                    .await
                    .map_err(backend_error)?;
                    rows.iter()
                        .map(|row| row.try_get::<Vec<u8>, _>(0))
                        .collect::<Result<Vec<Vec<u8>>, _>>()
                        .map_err(backend_error)
                }
            })
            .await
        })
        .await
    }

    /// Evicts `owner`'s live row of `key`, announcing it as a release is: the row stays,
    /// expired and owned by nobody, so that the next grant takes it over with a greater fence.
    /// The evicted fence, or `None` where `owner` holds no live row of `key`. Sent again after a
    /// lost reply, it finds the row no longer `owner`'s and changes nothing.
    pub(super) async fn evict(&self, key: &str, owner: Owner) -> Result<Option<u64>, LockError> {
        if check_key(key).is_err() {
            return Ok(None);
        }
        let shared = self.shared.clone();
        let (bytes, owner) = (key.as_bytes().to_vec(), owner.to_string());
        let rows = on_background(async move {
            sql::retry_transient(is_conflict, || {
                shared.statements.fetch_add(1, Ordering::Relaxed);
                shared
                    .sql
                    .evict
                    .query()
                    .bind(bytes.as_slice())
                    .bind(owner.as_str())
                    .fetch_all(&shared.pool)
            })
            .await
            .map_err(backend_error)
        })
        .await?;
        rows.first()
            .map(|row| {
                let fence: i64 = row.try_get(0).map_err(backend_error)?;
                Ok(u64::try_from(fence).unwrap_or(0))
            })
            .transpose()
    }
}
