//! The line across processes: each backend with waiters for a key holds one place in the
//! waiters table, its ticket the database's clock when it took the place. A try at a free key
//! is refused while another backend's live place is earlier (the acquire statement checks), so
//! processes take the key in the order they came, and a process whose statements are slower
//! (farther from the database) is not overtaken for ever by a nearer one.
//!
//! A place lasts [`PLACE_LIFETIME`] unless kept: this backend keeps its places every
//! [`KEEP_EVERY`], one statement for all of them, while a head of its own waits for the key and
//! has not let its turn lapse (a waiter nobody polls must not keep other processes out). A
//! place whose backend died, or stopped keeping it, lapses by itself: it costs the waiters
//! behind it that long at most, as a grant nobody claims costs the claim window. A backend whose
//! last waiter for a key leaves without it gives its place up at once.

use std::sync::Weak;
use std::time::Duration;

use sqlx::AssertSqlSafe;

use super::Shared;
use crate::backend::sql::micros;

/// How long a place in line lasts unless kept.
pub(super) const PLACE_LIFETIME: Duration = Duration::from_secs(3);

/// How often a backend keeps its places.
const KEEP_EVERY: Duration = Duration::from_secs(1);

/// The place keeper of one backend: keeps its live places, gives up those left, until the
/// backend is gone. Runs on dlock's background runtime.
pub(super) async fn keep_places(backend: Weak<Shared>) {
    let lifetime_us = i64::try_from(micros(PLACE_LIFETIME)).unwrap_or(i64::MAX);
    loop {
        let Some(shared) = backend.upgrade() else {
            return;
        };
        let waiting = shared.waiting.clone();
        drop(shared);
        tokio::select! {
            () = tokio::time::sleep(KEEP_EVERY) => {}
            () = waiting.place_left() => {}
        }
        let Some(shared) = backend.upgrade() else {
            return;
        };
        let (keep, leave) = waiting.places();
        for key in leave {
            let left = sqlx::query(AssertSqlSafe(shared.sql.leave.clone()))
                .bind(&key)
                .bind(&shared.waiter)
                .execute(&shared.pool)
                .await;
            if let Err(error) = left {
                tracing::debug!(%error, "distributed_lock: cannot give up a PostgreSQL place in line; it lapses by itself");
            }
        }
        if !keep.is_empty() {
            let kept = sqlx::query(AssertSqlSafe(shared.sql.keep_places.clone()))
                .bind(&shared.waiter)
                .bind(&keep)
                .bind(lifetime_us)
                .execute(&shared.pool)
                .await;
            if let Err(error) = kept {
                tracing::debug!(%error, "distributed_lock: cannot keep PostgreSQL places in line; the next tries take new ones");
            }
        }
    }
}
