//! The MySQL / MariaDB store: a lock table whose primary key is the compare-and-set. The table,
//! the statements and the fences are described for users on [`MysqlBackend`].
//!
//! # Why sqlx
//!
//! `sqlx` with only its `mysql` and `runtime-tokio` features: pure Rust, async, maintained, a
//! pool with health checks, and the server's error numbers (1062) through
//! `MySqlDatabaseError::number`. `mysql_async` would do too; sqlx is the one more services
//! already depend on. Its connections belong to a tokio runtime, so they live on dlock's
//! background runtime and a `Locker` in a `static` keeps working across runtimes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::mysql::MySqlPool;

use super::sql::{not_granted, ttl_micros, Backoff, Limits, TTL_LIMIT, UNKNOWN_FENCE};
use super::{AcquireRequest, Acquired, Backend, Renewal};
use crate::cleanups::{Cleanups, CLEANUP_PATIENCE};
use crate::{KeyState, LockError, Owner};

mod builder;
mod inspect;
mod renew;
mod retry;
mod rows;
mod rows_seen;
mod waiters;

use builder::quote_table;
pub use builder::MysqlBuilder;
use renew::{expire_row, renew_chunk};
use retry::on_background;
use rows::{release_row, Attempt};

/// The widest key the `lock_key` column holds. Longer keys are rejected, never truncated:
/// truncation could merge two keys into one lock.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
/// use dlock::{backend::MYSQL_MAX_KEY_BYTES, LockError, LockOptions, Locker};
///
/// let locker = Locker::connect("mysql://app:secret@db.internal:3306/orders").await?;
/// let too_long = "k".repeat(MYSQL_MAX_KEY_BYTES + 1);
/// let refused = locker.lock(too_long, LockOptions::new()).await;
/// assert!(matches!(refused, Err(LockError::InvalidKey { .. })));
/// # Ok(()) }
/// ```
pub const MAX_KEY_BYTES: usize = 255;

/// Leases renewed by one statement; a tick with more sends more statements.
const RENEW_CHUNK: usize = 1_000;

/// Back-off between tries of a waiting acquire.
const FIRST_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_millis(250);

/// A lock store on a MySQL or MariaDB table. Clones share one connection pool.
///
/// ```no_run
/// # async fn demo() -> Result<(), dlock::LockError> {
/// use dlock::{backend::MysqlBackend, Locker};
///
/// let backend = MysqlBackend::builder("mysql://app:secret@db.internal:3306/orders")?
///     .table("order_locks")
///     .max_connections(8)
///     .connect()
///     .await?;
/// let locker = Locker::with_backend(backend);
/// // or simply: Locker::connect("mysql://app:secret@db.internal:3306/orders").await?
/// # Ok(()) }
/// ```
///
/// # The table
///
/// One row per held key, created if missing (name configurable, default `dlock_locks`); a DBA can
/// create it ahead with [`MysqlBackend::ddl`]:
///
/// ```sql
/// CREATE TABLE IF NOT EXISTS `dlock_locks` (
///   `lock_key`   VARBINARY(255)  NOT NULL,  -- the rendered key, compared byte for byte
///   `owner`      CHAR(32) CHARACTER SET ascii NOT NULL,  -- the holder's owner token
///   `fence`      BIGINT UNSIGNED NOT NULL,  -- fencing token of the current acquisition
///   `expires_at` DATETIME(6)     NOT NULL,  -- lease expiry, UTC, by the database's clock
///   `created_at` DATETIME(6)     NOT NULL,  -- when the current holder acquired, UTC
///   `label`      VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, -- its label
///   `host`       VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, -- its host
///   `pid`        INT UNSIGNED NULL,         -- its process id on that host
///   PRIMARY KEY (`lock_key`)
/// ) ENGINE=InnoDB
/// ```
///
/// `label`, `host` and `pid` describe the holder to operators ([`Locker::inspect`](crate::Locker::inspect)),
/// written by the statement that grants the key (a label longer than 255 bytes is kept cut to
/// 255, at a character boundary). A table created by an earlier version has none of them:
/// `connect` adds them (one `ALTER TABLE … ADD COLUMN` each, nullable, only where missing,
/// waiting at most 2 s for the table), unless told not to create the table
/// ([`create_table(false)`](MysqlBuilder::create_table)); a table it does not or cannot alter
/// (no privilege, the table kept locked) keeps working, its holders described without them. Rows written by an earlier
/// version leave them `NULL`, and one such version's take-over of a row keeps the previous
/// holder's: while versions are mixed, a holder may be shown with another's label.
///
/// `VARBINARY` because a case-insensitive collation would make `Acct:1` and `acct:1` one lock;
/// `DATETIME(6)` written with `UTC_TIMESTAMP(6)` so neither the session time zone nor 2038 matter.
///
/// A lease lasts at most a century: its expiry must be a `DATETIME(6)`, which ends with the year
/// 9999, and MySQL does not refuse a later one but wraps it, or makes it `NULL`. A longer ttl is
/// refused with [`LockError::InvalidOptions`], and nothing is written.
///
/// # The statements
///
/// Each is one short autocommit statement on a connection of the pool (the backend's own, or
/// the service's with [`with_pool`](Self::with_pool)) — never inside the caller's business
/// transaction, where a lock row would stay invisible to others until that transaction
/// commits and vanish if it rolls back — and all time is the database's (`UTC_TIMESTAMP(6)`),
/// never the client's.
///
/// - **Acquire**: `INSERT`. On a duplicate key (error 1062) the row is either held or expired:
///   one `UPDATE … WHERE lock_key = ? AND (expires_at <= UTC_TIMESTAMP(6) OR owner = ?)` takes it
///   over only if it expired by the database's clock (or is already ours, which makes a retried
///   acquire idempotent: it keeps the row's fence, unless the row still carries the fence of a
///   grant of the same acquisition that was withdrawn, whose fence-checked undo must then miss
///   the new grant). No `INSERT IGNORE`, which would hide real errors.
///   An acquisition whose caller stops waiting deletes its row itself, after the statement that
///   wrote it, never before (a statement can wait on another transaction's row lock for long);
///   so does a grant its caller does not claim within the *claim window* (3 s, or the ttl where
///   shorter: the caller's future was parked in a `select!`, or its runtime stalled, while the
///   statement was in flight), so the next caller waits that long at most, not the ttl. The
///   caller, polled again, finds the grant withdrawn and keeps waiting for what is left of its
///   wait.
///   A try lasts for the caller no longer than its wait (at least 1 s, for a caller that does
///   not wait), even when the row is locked by another transaction (a `SELECT … FOR UPDATE` in
///   a client makes the statement wait up to `innodb_lock_wait_timeout`, 50 s by default): the
///   caller takes it as busy and a grant that comes later is undone. Tries use at most one
///   connection fewer than the pool has, so renewals and releases always find one; and the
///   backend's own connections run with `innodb_lock_wait_timeout = 2`, so a statement stuck
///   behind such a lock gives up (a try then reads as busy, never tried again) and hands its
///   connection back. On a service's pool ([`with_pool`](Self::with_pool)) that setting is the
///   service's: without it, stuck tries keep their connections, and every other key's tries
///   wait, for up to its 50 s.
/// - **Release**: `UPDATE … SET owner = '', expires_at = UTC_TIMESTAMP(6) WHERE lock_key = ? AND
///   owner = ?` (and, undoing a grant nobody claimed, `AND fence = ?`: that grant only, not a
///   later one of the same owner): the row stays, expired and owned by nobody, so the key's next
///   grant takes it over with a fence above this one (see "Fences"). Retried once if its reply
///   is lost — the goal is that the row is no longer ours, which a second try achieves either
///   way. Rows of keys never taken again stay in the table: a few dozen bytes each. A DBA may
///   delete old ones at any time, in small batches so that no statement keeps the lock table's
///   rows locked for long (every lock statement waits for such locks, up to 2 s), repeated until
///   it deletes none: `DELETE FROM dlock_locks WHERE owner = '' AND expires_at <
///   UTC_TIMESTAMP(6) - INTERVAL 1 DAY LIMIT 500`, in a session with `SET SESSION
///   TRANSACTION ISOLATION LEVEL READ COMMITTED` (no gap locks).
/// - **Renewal**: one `UPDATE … WHERE lock_key IN (…) AND (lock_key, owner) IN (…)` for every
///   lease of the tick (in chunks of 1,000), to `GREATEST(expires_at, …)` (a late copy of an
///   earlier renewal never moves an expiry back); only when fewer rows changed than leases were
///   sent does a `SELECT` find out which were lost. A held row that another transaction keeps
///   locked (a `SELECT … FOR UPDATE` left open in a client on the lock table) holds the whole
///   batch up until the lock wait times out (2 s), and the batch is not renewed that time: a
///   lease whose ttl is that short may be lost with it. Keep other transactions off the lock
///   table. (PostgreSQL's renewal passes such rows over.)
/// - **Waiting**: MySQL cannot say when a row goes, so a waiter polls with jittered exponential
///   back-off, 5 ms doubling to 250 ms, within `wait`; between tries it holds no connection.
///
/// # Inspecting
///
/// - [`Locker::inspect`](crate::Locker::inspect) reads the key's row, if it has not expired by
///   the database's clock: its owner, fence, label, host and process id, `created_at` as the
///   time it was acquired and `expires_at` less the database's now as its time left. MySQL
///   keeps no queue, so the waiters counted are those of the backend asked (acquisitions that
///   found the key busy and wait for it): waiters in other processes are not seen.
/// - [`Locker::list`](crate::Locker::list) reads the keys of the rows that have not expired, as
///   a range of the primary key (`lock_key >= prefix AND lock_key < ` the prefix's successor: the
///   keys are bytes, and no byte of the prefix is a pattern, so `%`, `_` and `\` match only
///   themselves), 1,000 keys to a statement, each page from where the last ended, until the
///   range is read: no statement runs long, and every held key is listed.
/// - [`Locker::force_release`](crate::Locker::force_release) evicts the holder by `UPDATE …
///   SET owner = '', expires_at = UTC_TIMESTAMP(6) WHERE lock_key = ? AND owner = ? AND
///   expires_at > UTC_TIMESTAMP(6)`: the row stays, expired and owned by nobody, so the next
///   grant takes it over with its fence + 1 or more, never a fresh row's clock floor; the
///   evicted holder's renewals find no row of its own and its lease is lost. Waiters (which
///   poll) find the key free at their next try.
///
/// # Fences
///
/// A fence is `GREATEST(previous fence + 1, database microseconds since the epoch)`, through
/// `LAST_INSERT_ID(expr)` so the statement's reply carries it. It strictly increases across
/// releases, expiries, evictions and take-overs, which all keep the row: a grant after them
/// takes the row over under its row lock, whatever the clock says. A fresh row starts from the
/// database's microsecond clock, which every earlier fence of the key stayed within a few
/// counts of, so it also increases across a released row being deleted by a DBA a day later.
/// (The one thing that could break it is the database's clock stepping back by more than the
/// age of the deleted rows.)
#[derive(Clone)]
pub struct MysqlBackend {
    shared: Arc<Shared>,
}

struct Shared {
    pool: MySqlPool,
    /// Whether the pool is dlock's own, to close at shutdown, or the caller's.
    owns_pool: bool,
    sql: Statements,
    /// The acquisitions' statements, which may need their own undo: `close` waits for them.
    cleanups: Arc<Cleanups>,
    /// Permits for the acquisitions' statements, one fewer than the pool's connections (see
    /// [`claimed`](crate::backend::sql::claimed)).
    tries: Arc<tokio::sync::Semaphore>,
    /// How many acquisitions of this backend wait for each key (see [`waiters::Waiting`]).
    waiting: waiters::Waiting,
    /// The keys this backend has seen a row of (see `rows::acquire_row`).
    rows_seen: rows_seen::RowsSeen,
}

/// The statements, with the table name filled in once. The table name is checked by
/// `quote_table` before it is spliced in, which is what makes them safe to assert as SQL.
struct Statements {
    table: String,
    insert: Arc<str>,
    take_over: Arc<str>,
    release: Arc<str>,
    /// An operator's eviction of a key's live holder, by owner (`force_release`).
    evict: Arc<str>,
    /// A live lease's expiry set exactly, sooner or later (`expire_after`).
    expire: Arc<str>,
    /// A key's live row, for `inspect`.
    inspect: Arc<str>,
    /// A page of the live keys from a start (`list`), and up to an end (`list_to`).
    list: Arc<str>,
    list_to: Arc<str>,
    /// Whether the table has the columns that describe a holder (label, host, pid), which the
    /// statements then write and read.
    described: bool,
}

impl MysqlBackend {
    /// Connects with the default options (table `dlock_locks`, created if missing): the same as
    /// [`Locker::connect`](crate::Locker::connect) with a MySQL URL, as a backend to wrap or to
    /// hand to [`Locker::with_backend`](crate::Locker::with_backend).
    ///
    /// # Errors
    ///
    /// As [`builder`](Self::builder) and [`MysqlBuilder::connect`].
    ///
    /// # Cancel safety
    ///
    /// As [`MysqlBuilder::connect`]: a dropped future leaves no backend behind.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::{backend::MysqlBackend, Locker};
    ///
    /// let backend = MysqlBackend::connect("mysql://app:secret@db.internal:3306/orders").await?;
    /// let locker = Locker::with_backend(backend);
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<MysqlBackend, LockError> {
        Self::builder(url)?.connect().await
    }

    /// Options for a connection to `url` (`mysql://user:password@host:port/database`).
    ///
    /// The URL's query may hold `table=order_locks`, `connect_timeout=2s` and
    /// `max_connections=8` besides the driver's own (`ssl-mode=required`); a method of the
    /// builder called later overrides them.
    ///
    /// ```
    /// use dlock::backend::MysqlBackend;
    ///
    /// let builder = MysqlBackend::builder("mysql://app@db.internal/orders?table=order_locks")?;
    /// assert!(format!("{builder:?}").contains("order_locks"));
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidUrl`] where `url` cannot be parsed. Nothing is connected yet.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dlock::backend::MysqlBackend;
    ///
    /// let builder = MysqlBackend::builder("mysql://app:secret@db.internal:3306/orders")?
    ///     .table("order_locks")
    ///     .connect_timeout(Duration::from_secs(2));
    /// // … then `builder.connect().await?` …
    /// assert!(MysqlBackend::builder("mysql://app:secret@db.internal:port/orders").is_err());
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn builder(url: &str) -> Result<MysqlBuilder, LockError> {
        MysqlBuilder::new(url)
    }

    /// Options for a store on the service's own pool, so the locks need no connections of their
    /// own. Each lock statement is one short autocommit statement on a connection of that pool,
    /// never inside a transaction of the service's. [`Locker::shutdown`](crate::Locker::shutdown)
    /// leaves the pool open: it is the service's to close. The pool must belong to a runtime
    /// that outlives the locker (the service's main runtime, usually), and keep MySQL's default
    /// `autocommit = 1` (connecting refuses one that turns it off).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use dlock::{backend::MysqlBackend, Locker};
    ///
    /// let pool = sqlx::MySqlPool::connect("mysql://app:secret@db.internal:3306/orders").await?;
    /// let locker = Locker::with_backend(MysqlBackend::with_pool(pool.clone()).connect().await?);
    /// # Ok(()) }
    /// ```
    pub fn with_pool(pool: MySqlPool) -> MysqlBuilder {
        MysqlBuilder::with_pool(pool)
    }

    /// The `CREATE TABLE` statement for `table`, for a DBA to run ahead of time (then connect
    /// with [`create_table(false)`](MysqlBuilder::create_table)).
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidOptions`] where `table` is not letters, digits and `_`, optionally
    /// `database.table`.
    ///
    /// ```
    /// let ddl = dlock::backend::MysqlBackend::ddl("dlock_locks").unwrap();
    /// assert!(ddl.contains("PRIMARY KEY (`lock_key`)"));
    /// ```
    pub fn ddl(table: &str) -> Result<String, LockError> {
        let table = quote_table(table)?;
        let [(_, label), (_, host), (_, pid)] = builder::HOLDER_COLUMNS;
        Ok(format!(
            "CREATE TABLE IF NOT EXISTS {table} (\n\
             \x20 `lock_key`   VARBINARY({MAX_KEY_BYTES}) NOT NULL,\n\
             \x20 `owner`      CHAR(32) CHARACTER SET ascii NOT NULL,\n\
             \x20 `fence`      BIGINT UNSIGNED NOT NULL,\n\
             \x20 `expires_at` DATETIME(6) NOT NULL,\n\
             \x20 `created_at` DATETIME(6) NOT NULL,\n\
             \x20 `label`      {label},\n\
             \x20 `host`       {host},\n\
             \x20 `pid`        {pid},\n\
             \x20 PRIMARY KEY (`lock_key`)\n\
             ) ENGINE=InnoDB"
        ))
    }

    /// The quoted name of the lock table, to read it by hand.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::backend::MysqlBackend;
    ///
    /// let backend = MysqlBackend::builder("mysql://app:secret@db.internal:3306/orders")?
    ///     .table("orders.order_locks")
    ///     .connect()
    ///     .await?;
    /// assert_eq!(backend.table(), "`orders`.`order_locks`");
    /// println!("SELECT lock_key, owner, expires_at FROM {}", backend.table());
    /// # Ok(()) }
    /// ```
    pub fn table(&self) -> &str {
        &self.shared.sql.table
    }
}

impl Backend for MysqlBackend {
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Option<Acquired>, LockError> {
        check_key(request.key)?;
        let owner = request.owner.to_string();
        let ttl_us = ttl_micros("MySQL", request.ttl)?;
        let deadline = crate::backend::wait_deadline(request.wait);
        let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF, request.owner);
        // The greatest fence of this acquisition's grants that were withdrawn (a try's answer
        // came too late, or was not claimed in time): their undos may still be on their way,
        // and the next grant must not keep such a fence.
        let mut withdrawn = 0;
        // Whether a try's answer left it unknown whether the key was granted: undone by owner
        // if the acquisition ends without the key (see `not_granted`).
        let mut unknown = false;
        // Counted among the key's waiters from its first busy try to its end.
        let mut waiting = None;
        let label = crate::inspect::bounded(request.label);
        loop {
            match self
                .try_acquire(
                    request.key,
                    &owner,
                    label,
                    ttl_us,
                    withdrawn,
                    Limits::new(Some(deadline), request.ttl),
                )
                .await?
            {
                Attempt::Granted(fence, valid_from) => {
                    return Ok(Some(Acquired { fence, valid_from }))
                }
                Attempt::Busy => {}
                Attempt::Unknown => unknown = true,
                // A try whose answer did not come may still be on its way, and would keep the
                // fence of a grant claimed after it: its undo (by owner) is safe only once the
                // acquisition has ended (in real time its bound ends past the deadline anyway;
                // under a paused tokio clock it can end at once).
                Attempt::Abandoned(UNKNOWN_FENCE) => return not_granted("MySQL", unknown),
                Attempt::Abandoned(fence) => withdrawn = withdrawn.max(fence),
            }
            let now = Instant::now();
            if now >= deadline {
                return not_granted("MySQL", unknown);
            }
            waiting.get_or_insert_with(|| self.shared.waiting.wait_for(request.key));
            tokio::time::sleep(backoff.next_pause().min(deadline - now)).await;
        }
    }

    async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        let shared = self.shared.clone();
        let (key, owner) = (key.as_bytes().to_vec(), owner.to_string());
        on_background(async move { release_row(&shared, &key, &owner, None).await }).await
    }

    async fn close(&self) {
        self.shared.cleanups.done(CLEANUP_PATIENCE).await;
        if !self.shared.owns_pool {
            return;
        }
        // Undos still being sent again (see `sql::claimed`) stop at their next try: the pool
        // they would use closes now. (A service's own pool stays open, and they go on.)
        self.shared.tries.close();
        let shared = self.shared.clone();
        let _ = on_background(async move {
            // sqlx waits for every connection lent out to come back: bounded, for one stuck in
            // a statement that never ends.
            let _ = tokio::time::timeout(CLEANUP_PATIENCE, shared.pool.close()).await;
            Ok(())
        })
        .await;
    }

    /// The key's live row, and this backend's waiters for it (see "Inspecting" above).
    async fn inspect(&self, key: &str) -> Result<KeyState, LockError> {
        self.inspect_key(key).await
    }

    /// The live rows' keys, a range of the primary key read a page at a time (see "Inspecting"
    /// above).
    async fn list(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        self.list_keys(prefix).await
    }

    /// Evicts `owner`'s live row of `key`, keeping the row and its fence (see "Inspecting"
    /// above).
    async fn force_release(&self, key: &str, owner: Owner) -> Result<Option<u64>, LockError> {
        self.evict(key, owner).await
    }

    fn expires_at_a_set_time(&self) -> bool {
        true
    }

    /// `UPDATE … SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND`, owner-checked on a
    /// live row: exactly, where a renewal never moves an expiry back.
    async fn expire_after(
        &self,
        key: &str,
        owner: Owner,
        after: Duration,
    ) -> Result<bool, LockError> {
        let after_us = ttl_micros("MySQL", after.min(TTL_LIMIT))?;
        let shared = self.shared.clone();
        let (key, owner) = (key.as_bytes().to_vec(), owner.to_string());
        on_background(async move { expire_row(&shared, &key, &owner, after_us).await }).await
    }

    async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        let shared = self.shared.clone();
        // A longer ttl than the limit renews to the limit (a `Locker` never asks for one).
        let leases = leases
            .iter()
            .map(|l| {
                let ttl_us = ttl_micros("MySQL", l.ttl.min(TTL_LIMIT))?;
                Ok((l.key.as_bytes().to_vec(), l.owner.to_string(), ttl_us))
            })
            .collect::<Result<Vec<(Vec<u8>, String, i64)>, LockError>>()?;
        on_background(async move {
            let mut held = Vec::with_capacity(leases.len());
            for chunk in leases.chunks(RENEW_CHUNK) {
                held.extend(renew_chunk(&shared, chunk).await?);
            }
            Ok(held)
        })
        .await
    }
}

fn check_key(key: &str) -> Result<(), LockError> {
    if key.len() > MAX_KEY_BYTES {
        return Err(LockError::InvalidKey {
            key: key.to_owned(),
            reason: format!(
                "{} bytes is longer than the {MAX_KEY_BYTES} the MySQL lock table's `lock_key` column holds",
                key.len()
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{check_key, MAX_KEY_BYTES};
    use crate::key::KeyBuilder;
    use crate::LockError;

    #[test]
    fn keys_longer_than_the_column_are_rejected() {
        assert!(check_key(&"k".repeat(255)).is_ok());
        assert!(check_key(&"k".repeat(256)).is_err());
    }

    /// The limit counts bytes of the rendered key, after escaping: `é` renders as `%C3%A9`.
    #[test]
    fn the_limit_applies_to_the_rendered_key() {
        let rendered = |value: &str| {
            let mut builder = KeyBuilder::with_capacity(0);
            builder.push_literal("acct:");
            builder.push_display(value);
            builder.finish()
        };
        assert!(check_key(&rendered(&"a".repeat(250))).is_ok());
        assert!(check_key(&rendered(&"a".repeat(251))).is_err());
        // 5 + 6 × 41 = 251 bytes; 5 + 6 × 42 = 257.
        assert!(check_key(&rendered(&"é".repeat(41))).is_ok());
        assert!(check_key(&rendered(&"é".repeat(42))).is_err());
    }

    proptest! {
        /// Exactly the keys of at most 255 bytes pass, whatever their characters' widths; a
        /// longer one is refused whole, with its length and the limit in the message, never cut
        /// to fit (two keys cut alike would be one lock).
        #[test]
        fn the_key_limit_is_exactly_the_column_width_in_bytes(
            key in proptest::collection::vec(prop_oneof![Just('k'), Just('é'), Just('€'), Just('𝄞'), any::<char>()], 60..260)
                .prop_map(|chars| chars.into_iter().collect::<String>())
                .prop_map(|key| {
                    // Most keys land near the limit: cut at a char boundary in 250..=260 bytes.
                    let end = (250..=260.min(key.len())).rev().find(|&i| key.is_char_boundary(i));
                    end.map_or(key.clone(), |end| key[..end].to_owned())
                }),
        ) {
            match check_key(&key) {
                Ok(()) => prop_assert!(key.len() <= MAX_KEY_BYTES, "{} bytes passed", key.len()),
                Err(LockError::InvalidKey { key: refused, reason }) => {
                    prop_assert!(key.len() > MAX_KEY_BYTES);
                    prop_assert_eq!(refused, key.clone());
                    prop_assert!(reason.contains(&format!("{} bytes", key.len())), "{}", reason);
                    prop_assert!(reason.contains("255"), "{}", reason);
                }
                Err(other) => prop_assert!(false, "unexpected {other:?}"),
            }
        }
    }
}
