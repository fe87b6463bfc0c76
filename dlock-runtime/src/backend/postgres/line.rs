//! The line across processes: a backend whose waiter lost a race for a key (refused after a
//! release it was woken for), or found others in line, holds one place in the waiters table,
//! its ticket the database's clock when it took the place. A try at a free key is refused while
//! another backend's live place is earlier (the acquire statement checks), so a process whose
//! statements are slower (farther from the database) is not overtaken for ever by a nearer one.
//! A process alone at a key, whose waiters each find it busy once and get it at the release,
//! writes nothing to the table.
//!
//! A place lasts [`PLACE_LIFETIME`] unless kept: this backend keeps its places every
//! [`KEEP_EVERY`], one statement for all of them, while a head of its own waits for the key and
//! has not let its turn lapse (a waiter nobody polls must not keep other processes out). A
//! place whose backend died, or stopped keeping it, lapses by itself: it costs the waiters
//! behind it that long at most, as a grant nobody claims costs the claim window. A backend whose
//! last waiter for a key leaves without it gives its place up at once.

use std::sync::Weak;
use std::time::Duration;

use sqlx::Row;

use super::{micros_i64, Shared};

/// How long a place in line lasts unless kept.
pub(super) const PLACE_LIFETIME: Duration = Duration::from_secs(3);

/// How often a backend keeps its places.
const KEEP_EVERY: Duration = Duration::from_secs(1);

/// The place keeper of one backend: keeps its live places, gives up those left, until the
/// backend is gone. Runs on dlock's background runtime.
///
/// The same statement reads, for every key a live head of this backend waits for (in line or
/// not), whether it is free, and the keeper wakes the head of a free key: the release that
/// freed it was announced, but a listener whose connection went deaf without breaking (a load
/// balancer dropped the idle flow, a listener through PgBouncer) cannot tell, and its head
/// would rest until the holder's old expiry (and, first in line, keep every other process from
/// the free key meanwhile). So a deaf listener costs a second at most. One statement a second
/// per backend with waiters, whatever their number.
pub(super) async fn keep_places(backend: Weak<Shared>) {
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
        let places = waiting.places();
        give_up(&shared, places.leave).await;
        if places.waited.is_empty() {
            continue;
        }
        let free = shared
            .sql
            .keep_places
            .query()
            .bind(shared.waiter.as_str())
            .bind(places.keep.as_slice())
            .bind(micros_i64(PLACE_LIFETIME))
            .bind(places.waited.as_slice())
            .fetch_all(&shared.pool)
            .await;
        match free {
            Ok(rows) => {
                for row in rows {
                    if let Ok(key) = row.try_get::<Vec<u8>, _>(0) {
                        waiting.wake(&key);
                    }
                }
            }
            Err(error) => {
                tracing::debug!(%error, "distributed_lock: cannot keep PostgreSQL places in line; the next tries take new ones");
            }
        }
    }
}

/// Gives up this backend's places for `keys` (each announced, so the waiters behind look again
/// at once); a place that cannot be given up lapses by itself.
pub(super) async fn give_up(shared: &Shared, keys: Vec<Vec<u8>>) {
    for key in keys {
        let left = shared
            .sql
            .leave
            .query()
            .bind(key.as_slice())
            .bind(shared.waiter.as_str())
            .fetch_all(&shared.pool)
            .await;
        if let Err(error) = left {
            tracing::debug!(%error, "distributed_lock: cannot give up a PostgreSQL place in line; it lapses by itself");
        }
    }
}
