//! For operators: a key's live row ([`Backend::inspect`](crate::backend::Backend::inspect)),
//! the live rows' keys ([`Backend::list`](crate::backend::Backend::list)), and the eviction of a
//! holder ([`Backend::force_release`](crate::backend::Backend::force_release)).

use sqlx::{AssertSqlSafe, Row};

use super::retry::{backend_error, on_background, retry_transient};
use super::{check_key, MysqlBackend};
use crate::backend::description::{list_by_pages, Described};
use crate::{KeyState, LockError, Owner};

impl MysqlBackend {
    /// `key`'s live row, described, and this backend's waiters for it.
    pub(super) async fn inspect_key(&self, key: &str) -> Result<KeyState, LockError> {
        let waiters = self.shared.waiting.waiters(key);
        if check_key(key).is_err() {
            // Never acquired: an acquire refuses such a key before sending anything.
            return Ok(KeyState::new(key, Vec::new(), waiters));
        }
        let shared = self.shared.clone();
        let bytes = key.as_bytes().to_vec();
        let row = on_background(async move {
            retry_transient(|| {
                sqlx::query(AssertSqlSafe(shared.sql.inspect.clone()))
                    .bind(bytes.as_slice())
                    .fetch_optional(&shared.pool)
            })
            .await
            .map_err(backend_error)
        })
        .await?;
        let Some(row) = row else {
            return Ok(KeyState::new(key, Vec::new(), waiters));
        };
        let described = Described {
            owner: row.try_get(0).map_err(backend_error)?,
            fence: row.try_get(1).map_err(backend_error)?,
            acquired_us: row.try_get(2).map_err(backend_error)?,
            left_us: Some(row.try_get(3).map_err(backend_error)?),
            label: row.try_get(4).map_err(backend_error)?,
            host: row.try_get(5).map_err(backend_error)?,
            pid: row.try_get(6).map_err(backend_error)?,
        };
        Ok(KeyState::new(
            key,
            vec![described.holder("MySQL", key)?],
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
                    retry_transient(|| {
                        let query = match &end {
                            Some(end) => {
                                sqlx::query_scalar(AssertSqlSafe(shared.sql.list_to.clone()))
                                    .bind(from.as_slice())
                                    .bind(end.as_slice())
                            }
                            None => sqlx::query_scalar(AssertSqlSafe(shared.sql.list.clone()))
                                .bind(from.as_slice()),
                        };
                        query.fetch_all(&shared.pool)
                    })
                    .await
                    .map_err(backend_error)
                }
            })
            .await
        })
        .await
    }

    /// Evicts `owner`'s live row of `key`: the row stays, expired and owned by nobody, so that
    /// the next grant takes it over with a greater fence. The evicted fence, or `None` where
    /// `owner` holds no live row of `key`. Sent again after a lost reply, it finds the row no
    /// longer `owner`'s and changes nothing.
    pub(super) async fn evict(&self, key: &str, owner: Owner) -> Result<Option<u64>, LockError> {
        if check_key(key).is_err() {
            return Ok(None);
        }
        let shared = self.shared.clone();
        let (bytes, owner) = (key.as_bytes().to_vec(), owner.to_string());
        on_background(async move {
            let done = retry_transient(|| {
                sqlx::query(AssertSqlSafe(shared.sql.evict.clone()))
                    .bind(bytes.as_slice())
                    .bind(owner.as_str())
                    .execute(&shared.pool)
            })
            .await
            .map_err(backend_error)?;
            Ok((done.rows_affected() == 1).then(|| done.last_insert_id()))
        })
        .await
    }
}
