//! The PostgreSQL store: a lease table whose primary key is the compare-and-set, judged by the
//! database's clock, with releases announced by `NOTIFY`. The table, the statements, the fences
//! and the waiting are described for users on [`PostgresBackend`].
//!
//! # Why sqlx
//!
//! The MySQL store's driver already, with only its `postgres` feature added: pure Rust, async,
//! a pool with health checks, SQLSTATE codes on errors, and a `LISTEN` client (`PgListener`).
//! Its connections belong to a tokio runtime, so they live on dlock's background runtime and a
//! `Locker` in a `static` keeps working across runtimes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgPool;

use super::sql::{micros, ttl_micros, TTL_LIMIT};
use super::{AcquireRequest, Acquired, Backend, Renewal};
use crate::cleanups::{Cleanups, CLEANUP_PATIENCE};
use crate::{KeyState, LockError, Owner};

mod acquire;
mod builder;
mod errors;
mod inspect;
mod line;
mod query;
mod renew;
mod rows;
mod statements;
mod waiting;

use builder::quote_table;
pub use builder::PostgresBuilder;
use errors::{backend_error, is_conflict, lock_timed_out, on_background};
use statements::Statements;
use waiting::Waiting;

/// The longest key the store takes, in bytes. A primary-key entry of PostgreSQL's B-tree holds
/// at most about 2,700 bytes; a release's notification carries the key hex-encoded, within the
/// 8,000 bytes of a payload. Longer keys are rejected, never truncated: truncation could merge
/// two keys into one lock.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
/// use dlock::{backend::POSTGRES_MAX_KEY_BYTES, LockError, LockOptions, Locker};
///
/// let locker = Locker::connect("postgres://app:secret@db.internal:5432/orders").await?;
/// let too_long = "k".repeat(POSTGRES_MAX_KEY_BYTES + 1);
/// let refused = locker.lock(too_long, LockOptions::new()).await;
/// assert!(matches!(refused, Err(LockError::InvalidKey { .. })));
/// # Ok(()) }
/// ```
pub const MAX_KEY_BYTES: usize = 2048;

/// A lock store on a PostgreSQL table. Clones share one connection pool and one listener.
///
/// ```no_run
/// # async fn demo() -> Result<(), dlock::LockError> {
/// use dlock::{backend::PostgresBackend, Locker};
///
/// let backend = PostgresBackend::builder("postgres://app:secret@db.internal:5432/orders")?
///     .table("order_locks")
///     .max_connections(8)
///     .connect()
///     .await?;
/// let locker = Locker::with_backend(backend);
/// // or simply: Locker::connect("postgres://app:secret@db.internal:5432/orders").await?
/// # Ok(()) }
/// ```
///
/// # The tables
///
/// One row per key, created if missing (name configurable, default `dlock_locks`), and
/// beside it the waiters table (the name with `_waiters` added): one row per process waiting
/// for a key, its place in line (see "Waiting"). A DBA can create both ahead with
/// [`PostgresBackend::ddl`]:
///
/// ```sql
/// CREATE TABLE IF NOT EXISTS "dlock_locks" (
///   lock_key   BYTEA       NOT NULL PRIMARY KEY, -- the rendered key, compared byte for byte
///   owner      TEXT        NOT NULL,             -- the holder's owner token
///   fence      BIGINT      NOT NULL,             -- fencing token of the current acquisition
///   expires_at TIMESTAMPTZ NOT NULL,             -- lease expiry, by the database's clock
///   created_at TIMESTAMPTZ NOT NULL,             -- when the current holder acquired
///   label      BYTEA,                            -- the label it acquired under
///   host       BYTEA,                            -- the host it runs on
///   pid        BIGINT                            -- its process id on that host
/// );
/// CREATE TABLE IF NOT EXISTS "dlock_locks_waiters" (
///   lock_key   BYTEA       NOT NULL,             -- the key waited for
///   waiter     TEXT        NOT NULL,             -- the waiting backend (one per process)
///   ticket     BIGINT      NOT NULL,             -- its place: the database's µs when it came
///   expires_at TIMESTAMPTZ NOT NULL,             -- kept while it waits; lapses after
///   PRIMARY KEY (lock_key, waiter)
/// );
/// ```
///
/// `BYTEA` because a key is bytes: no collation can make two keys one lock, and no database
/// encoding can refuse one. Read them in `psql` with `convert_from(lock_key, 'UTF8')`.
///
/// `label`, `host` and `pid` describe the holder to operators ([`Locker::inspect`](crate::Locker::inspect)),
/// written by the statement that grants the key (a release's hand-over to a waiter writes the
/// waiter's); `BYTEA` for the key's reason, read them with `convert_from` too. A label longer
/// than 255 bytes is kept cut to 255, at a character boundary. A table created by an earlier
/// version has none of them: `connect` adds them (`ALTER TABLE … ADD COLUMN IF NOT EXISTS`,
/// nullable, only where one is missing, waiting at most 2 s for the table), unless told not to
/// create the tables ([`create_table(false)`](PostgresBuilder::create_table)); a table it does
/// not or cannot alter (not its owner, the table kept locked) keeps working, its holders
/// described without them. Rows written by an earlier version leave them `NULL`, and
/// one such version's take-over of a row keeps the previous holder's: while versions are
/// mixed, a holder may be shown with another's label.
///
/// A lease lasts at most a century, as on MySQL: PostgreSQL refuses an interval past 2⁶³ µs and
/// a timestamp past the year 294276. A longer ttl is refused with [`LockError::InvalidOptions`],
/// and nothing is written.
///
/// # The statements
///
/// Each is one short autocommit statement on a connection of the pool (the backend's own, or
/// the service's with [`with_pool`](Self::with_pool)) — never inside the caller's business
/// transaction — and all time is the database's (`clock_timestamp()`), never the client's.
///
/// - **Acquire**: one `INSERT … ON CONFLICT (lock_key) DO UPDATE … WHERE` the row expired by the
///   database's clock (or is already this owner's, which makes a retried acquire idempotent: it
///   keeps the row's fence, unless the row still carries the fence of a grant of the same
///   acquisition that was withdrawn, whose fence-checked undo must then miss the new grant)
///   `RETURNING fence`; no row back means busy. The same statement checks the line across
///   processes (no other process's place earlier than this one's), takes or keeps this
///   process's place when busy and gives it up when granted, and reads the holder's time left,
///   which a waiter sleeps for at most. A lease's validity is counted on the client from when
///   the statement was sent, after the wait for a pooled connection. An acquisition whose
///   caller stops waiting deletes its row itself, after the statement that wrote it; so does a
///   grant its caller does not claim within the *claim window* (3 s, or the ttl where shorter:
///   the caller's future was parked in a `select!`, or its runtime stalled, while the statement
///   was in flight), so the next caller waits that long at most, not the ttl. The caller,
///   polled again, finds the grant withdrawn and keeps waiting for what is left of its wait.
///   A try lasts for the caller no longer than its wait (at least 1 s, for a caller that does
///   not wait), even when the row is locked by another transaction (a `SELECT … FOR UPDATE` in
///   `psql` makes the statement wait for as long as that transaction lasts): the caller takes it
///   as busy and a grant that comes later is undone. Tries use at most one connection fewer than
///   the pool has, so renewals and releases always find one; and the backend's own connections
///   run with `lock_timeout = '2s'`, so a statement stuck behind such a lock gives up (a try
///   then reads as busy) and hands its connection back. On a service's pool
///   ([`with_pool`](Self::with_pool)) that setting is the service's: without it, stuck tries
///   keep their connections, and every other key's tries wait, until that transaction ends.
///   (Without prepared statements, see "PgBouncer", each statement sets it for itself, on any
///   pool.) A process that dies while its
///   statement waits on a row lock leaves the statement waiting on the server: PostgreSQL
///   notices a client gone during a lock wait only with `client_connection_check_interval` set
///   (PostgreSQL 14+), so otherwise the statement runs when the lock goes and writes a row held
///   by nobody until its ttl runs out.
/// - **Release**: where a waiter of this backend waits for the key at rest, an `UPDATE` that
///   hands the row over to it (its owner, a new fence, its ttl), so the waiter takes the key
///   without a statement of its own — unless another process's waiter is ahead in the line
///   across processes (see "Waiting"). It claims that grant as it would its own try's: one it
///   does not claim within the claim window, or whose waiter is gone, is given back by its fence.
///   Otherwise `UPDATE … SET owner = '', expires_at = clock_timestamp() WHERE lock_key = $1 AND
///   owner = $2` (and, undoing a grant nobody claimed, `AND fence = $3`: that grant only, never
///   a later one of the same owner, whose caller came back and tried again while the undo was on
///   its way) and, in the same statement, `pg_notify` on the table's channel with the key, sent
///   when the release commits. The row stays, expired and owned by nobody, for the key's next
///   grant to take over (see "Fences"); the rows of keys never taken again stay too, a few dozen
///   bytes each: delete them from time to time where keys are many and short-lived
///   (`DELETE FROM dlock_locks WHERE owner = '' AND expires_at < now() - interval '1 day'`,
///   nothing younger, see "Fences"). The
///   channel is `dlock_` and a hash of the schema and name the table resolves to when the
///   backend connects, so every spelling of one table's name (`locks`, `public.locks`, another
///   `search_path`) shares it.
/// - **Renewal**: one `UPDATE … FROM unnest($1::bytea[], $2::text[], $3::bigint[])` for every
///   lease of the tick, each by its own ttl (never moving an expiry back: a late copy of an
///   earlier renewal lands harmlessly), `RETURNING` the (key, owner) pairs it renewed. A held
///   row another transaction keeps locked (a `SELECT … FOR UPDATE` left open in a client) is
///   passed over (`FOR UPDATE SKIP LOCKED`), not waited for: that lease is not renewed this
///   time, and tried again at the next tick, while the others are renewed as usual.
///
/// # Fences
///
/// A fence is `GREATEST(previous fence + 1, database microseconds since the epoch)`: a clock
/// floor, as on MySQL, rather than a sequence. A release keeps the row, so each grant after a
/// key's first takes over its row, under the row's lock, and the `+ 1` makes its fence greater
/// than the last even if the clock steps back; a fresh row (a key's first grant, or one whose
/// row was deleted by hand) starts from the microsecond clock, which every earlier fence of the
/// key stayed within a few counts of. A sequence would survive a clock stepped back, but not what a clock
/// floor survives: the table dropped and created again, `TRUNCATE … RESTART IDENTITY`, a
/// fail-over to a logical replica (sequences are not replicated logically); and it needs one more
/// object, and grant, per table. (The one thing that could break the clock floor is the
/// database's clock stepping back after a row was deleted.)
///
/// A fresh row's clock floor is read as the statement's `VALUES` are evaluated, before the
/// conflict check: had a release deleted the row, a statement that stalled between the two (a
/// busy server, a stalled connection) while another acquisition was granted and released
/// would write a fresh row with a fence below that acquisition's. Kept, the row makes that
/// statement take it over, with a fence above its last. Only a row deleted while such a
/// statement is still running (by hand, younger than the running statements) lets it happen.
///
/// # Waiting
///
/// A waiter does not poll. The backend keeps one connection that `LISTEN`s on the table's
/// channel (one per backend, whatever the number of waiters); each release `NOTIFY`s it with
/// the key. Waiters on a key are queued in this backend in arrival order and only the head
/// asks the database: it tries, and on a busy key sleeps until a release of the key is
/// announced or the holder's lease runs out by its expiry (which nobody announces), then tries
/// again. So within one process waiters are served first come, first served. Across processes,
/// every process's head is woken by the same notification of every release (a release made
/// here gives this process's own waiters no head start), and a line in the database decides:
/// a process waiting for a key holds one place in the *waiters table* (`<table>_waiters`),
/// taken by a busy try once the process lost a race for the key (a try after a release it was
/// woken for, refused) or finds others in line, its ticket the database's clock then (a process
/// alone at a key, whose waiters each find it busy once and get it at the release, writes
/// nothing there), and kept alive every
/// second while its head waits; a try at a free key (and a release's hand-over to a waiter of
/// its own process) is refused while another process's live place is earlier, and the try
/// that gets the key gives its process's place up, or, where more of its waiters wait, takes
/// it anew at the end of the line, so that processes with waiters take turns. So a process
/// whose statements arrive later than another's (farther from the database, or busier) is not
/// overtaken for ever. A place its process stops keeping (the process died, or its head is
/// parked) lapses 3 s later, which is what it costs the processes behind it. While the listening
/// connection is down, the heads poll with jittered back-off (5 ms doubling to 250 ms) and the
/// listener reconnects by itself.
///
/// A head whose future is no longer polled (parked in a `select!`, its runtime stalled) cannot
/// hold the others up: a head that has not started its try within 1 s of being woken (or of its
/// own pause running out) is passed over by the waiter behind it, and is not counted by a
/// caller that does not wait; polled again, it queues again at the back.
///
/// # Inspecting
///
/// - [`Locker::inspect`](crate::Locker::inspect) reads, in one statement, the key's row if it
///   has not expired by the database's clock (its owner, fence, label, host and process id,
///   `created_at` as the time it was acquired, `expires_at` less the database's now as its time
///   left) and the live places of other processes in the waiters table. The waiters counted
///   are this backend's own waiters for the key, every one, and one for each other process
///   with a live place: a process stands in line with one place however many of its waiters
///   wait, and takes it only once it lost a race for the key or found others in line, so
///   waiters elsewhere are a lower bound.
/// - [`Locker::list`](crate::Locker::list) reads the keys of the rows that have not expired, as
///   a range of the primary key (`lock_key >= prefix AND lock_key < ` the prefix's successor:
///   the keys are bytes, and no byte of the prefix is a pattern, so `%`, `_` and `\` match only
///   themselves), 1,000 keys to a statement, each page from where the last ended, until the
///   range is read: no statement runs long, and every held key is listed.
/// - [`Locker::force_release`](crate::Locker::force_release) evicts the holder by `UPDATE …
///   SET owner = '', expires_at = clock_timestamp() WHERE lock_key = $1 AND owner = $2 AND
///   expires_at > clock_timestamp()`, and announces it as a release is: the row stays, expired
///   and owned by nobody, so the next grant takes it over with its fence + 1 or more, never a
///   fresh row's clock floor; the evicted holder's renewals find no row of its own and its
///   lease is lost.
///
/// # PgBouncer
///
/// A lease holds no connection and no session state (no advisory lock, no open transaction),
/// so the statements can go through PgBouncer in transaction mode, given:
///
/// - Statements PgBouncer can pass on. By default each goes as a named prepared statement
///   (parsed once per connection, then only bound and executed), which PgBouncer follows across
///   server connections from 1.21 on, with `max_prepared_statements` set (say, to 100); an
///   older one mixes up its clients' statements (`prepared statement "sqlx_s_1" already
///   exists`). Before 1.21 (Debian 12 ships 1.18), or behind any pooler that cannot follow
///   prepared statements, turn them off with
///   [`prepared_statements(false)`](PostgresBuilder::prepared_statements) or
///   `?prepared_statements=false`: each statement then goes as one simple query with its values
///   written in (keys in hex), which the server parses every time. Do not set sqlx's
///   `statement-cache-capacity=0` instead: sqlx then still names each statement, and never
///   closes it.
/// - `ignore_startup_parameters = extra_float_digits`: sqlx sets that parameter when it
///   connects, and PgBouncer refuses a connection with a parameter it does not know.
/// - The listener pointed at the server, with [`PostgresBuilder::listen_url`]: it needs a
///   session of its own. Through PgBouncer, its `LISTEN` runs on a server connection lent for
///   that one statement, and the notifications that connection gets afterwards never reach the
///   listener: no release is heard, and nothing tells the backend so. (PgBouncer passes them to
///   whichever client it lends the connection to next, whose statement then fails: calls fail
///   now and then.) Exclusion, fences, renewal and
///   expiry do not depend on the listener; a waiter then learns of a release only from its
///   process's place keeper, which reads every second whether the keys its waiters wait for
///   came free.
///
/// With prepared statements, the backend's own connections run `SET lock_timeout` when they
/// open (see the statements above); through PgBouncer in transaction mode, that setting stays
/// with the server connection it ran on, for whichever client PgBouncer lends that connection
/// to next. Without them, each statement sets it for itself alone (`SET LOCAL` in the same
/// simple query, which runs as one transaction), and leaves no setting behind.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
/// use dlock::Locker;
///
/// // PgBouncer 1.18 in transaction mode; the listener straight to the server.
/// let backend = dlock::backend::PostgresBackend::builder(
///     "postgres://app:secret@pgbouncer.internal:6432/orders?prepared_statements=false",
/// )?
/// .listen_url("postgres://app:secret@db.internal:5432/orders")?
/// .connect()
/// .await?;
/// let locker = Locker::with_backend(backend);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresBackend {
    shared: Arc<Shared>,
}

struct Shared {
    pool: PgPool,
    /// Whether the pool is dlock's own, to close at shutdown, or the caller's.
    owns_pool: bool,
    sql: Statements,
    waiting: Waiting,
    /// This backend's name in the waiters table.
    waiter: String,
    /// Statements sent, for tests that check a waiter does not poll and a renewal is one.
    statements: AtomicU64,
    /// The acquisitions' statements, which may need their own undo: `close` waits for them.
    cleanups: Arc<Cleanups>,
    /// Permits for the acquisitions' statements, one fewer than the pool's connections (see
    /// [`claimed`](crate::backend::sql::claimed)).
    tries: Arc<tokio::sync::Semaphore>,
}

impl PostgresBackend {
    /// Connects with the default options (table `dlock_locks`, created if missing): the same as
    /// [`Locker::connect`](crate::Locker::connect) with a PostgreSQL URL, as a backend to wrap
    /// or to hand to [`Locker::with_backend`](crate::Locker::with_backend).
    ///
    /// # Errors
    ///
    /// As [`builder`](Self::builder) and [`PostgresBuilder::connect`].
    ///
    /// # Cancel safety
    ///
    /// As [`PostgresBuilder::connect`]: a dropped future leaves no backend behind.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::{backend::PostgresBackend, Locker};
    ///
    /// let backend = PostgresBackend::connect("postgres://app:secret@db.internal:5432/orders").await?;
    /// let locker = Locker::with_backend(backend);
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<PostgresBackend, LockError> {
        Self::builder(url)?.connect().await
    }

    /// Options for a connection to `url` (`postgres://user:password@host:port/database`, or
    /// `postgresql://…`).
    ///
    /// The URL's query may hold `table=order_locks`, `connect_timeout=2s`, `max_connections=8`
    /// and `prepared_statements=false` (see [`PostgresBuilder::prepared_statements`]) besides
    /// the driver's own (`sslmode=require`, `application_name=orders`); a method of the builder
    /// called later overrides them.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidUrl`] where `url` cannot be parsed. Nothing is connected yet.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dlock::backend::PostgresBackend;
    ///
    /// let builder = PostgresBackend::builder("postgres://app@db.internal/orders?table=order_locks")?
    ///     .connect_timeout(Duration::from_secs(2));
    /// assert!(format!("{builder:?}").contains("order_locks"));
    /// // … then `builder.connect().await?` …
    /// assert!(PostgresBackend::builder("postgres://app:secret@db.internal:port/orders").is_err());
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn builder(url: &str) -> Result<PostgresBuilder, LockError> {
        PostgresBuilder::new(url)
    }

    /// Options for a store on the service's own pool, so the statements need no connections of
    /// their own (the listener opens one, with the pool's connect options). Each lock statement
    /// is one short autocommit statement on a connection of that pool, never inside a
    /// transaction of the service's. [`Locker::shutdown`](crate::Locker::shutdown) leaves the
    /// pool open: it is the service's to close. The pool must belong to a runtime that
    /// outlives the locker (the service's main runtime, usually).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use dlock::{backend::PostgresBackend, Locker};
    ///
    /// let pool = sqlx::PgPool::connect("postgres://app:secret@db.internal:5432/orders").await?;
    /// let locker = Locker::with_backend(PostgresBackend::with_pool(pool.clone()).connect().await?);
    /// # Ok(()) }
    /// ```
    pub fn with_pool(pool: PgPool) -> PostgresBuilder {
        PostgresBuilder::with_pool(pool)
    }

    /// The `CREATE TABLE` statements for `table` and its waiters table (`table` with
    /// `_waiters` added), for a DBA to run ahead of time (then connect with
    /// [`create_table(false)`](PostgresBuilder::create_table)).
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidOptions`] where `table` is not letters, digits and `_`, optionally
    /// `schema.table`, the table's name at most 55 bytes (so that its waiters table's fits in
    /// PostgreSQL's 63).
    ///
    /// ```
    /// let ddl = dlock::backend::PostgresBackend::ddl("dlock_locks").unwrap();
    /// assert!(ddl.contains("lock_key   BYTEA       NOT NULL PRIMARY KEY"));
    /// assert!(ddl.contains("CREATE TABLE IF NOT EXISTS \"dlock_locks_waiters\""));
    /// ```
    pub fn ddl(table: &str) -> Result<String, LockError> {
        let waiters = quote_table(table, builder::WAITERS_SUFFIX)?;
        let table = quote_table(table, "")?;
        Ok(format!(
            "CREATE TABLE IF NOT EXISTS {table} (\n\
             \x20 lock_key   BYTEA       NOT NULL PRIMARY KEY,\n\
             \x20 owner      TEXT        NOT NULL,\n\
             \x20 fence      BIGINT      NOT NULL,\n\
             \x20 expires_at TIMESTAMPTZ NOT NULL,\n\
             \x20 created_at TIMESTAMPTZ NOT NULL,\n\
             \x20 label      BYTEA,\n\
             \x20 host       BYTEA,\n\
             \x20 pid        BIGINT\n\
             );\n\
             CREATE TABLE IF NOT EXISTS {waiters} (\n\
             \x20 lock_key   BYTEA       NOT NULL,\n\
             \x20 waiter     TEXT        NOT NULL,\n\
             \x20 ticket     BIGINT      NOT NULL,\n\
             \x20 expires_at TIMESTAMPTZ NOT NULL,\n\
             \x20 PRIMARY KEY (lock_key, waiter)\n\
             );"
        ))
    }

    /// The quoted name of the lock table, to read it by hand.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::backend::PostgresBackend;
    ///
    /// let backend = PostgresBackend::builder("postgres://app:secret@db.internal:5432/orders")?
    ///     .table("locks.order_locks")
    ///     .connect()
    ///     .await?;
    /// assert_eq!(backend.table(), "\"locks\".\"order_locks\"");
    /// println!("SELECT convert_from(lock_key, 'UTF8'), owner, expires_at FROM {}", backend.table());
    /// # Ok(()) }
    /// ```
    pub fn table(&self) -> &str {
        &self.shared.sql.table
    }

    #[doc(hidden)] // A hook for tests, not part of the API.
    /// The notification channel of the lock table, which releases `NOTIFY`.
    pub fn channel(&self) -> &str {
        &self.shared.sql.channel
    }

    #[doc(hidden)] // A hook for tests, not part of the API.
    /// How many statements this backend sent (its listener's aside).
    pub fn statements(&self) -> u64 {
        self.shared.statements.load(Ordering::Relaxed)
    }
}

impl Backend for PostgresBackend {
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Option<Acquired>, LockError> {
        self.acquire_key(request).await
    }

    /// The key's live row, and its waiters (see "Inspecting" above).
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

    async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        let shared = self.shared.clone();
        let (key, owner) = (key.as_bytes().to_vec(), owner.to_string());
        // A clean-up, so that `close` waits for it, and for the claim window of a key it hands
        // over, which it starts before it ends.
        let (answer, answered) = tokio::sync::oneshot::channel();
        let cleanups = Arc::clone(&self.shared.cleanups);
        cleanups.spawn(async move {
            let _ = answer.send(rows::release_row(&shared, &key, &owner).await);
        });
        answered
            .await
            .map_err(|_| LockError::backend("PostgreSQL: the release's task failed"))?
    }

    fn expires_at_a_set_time(&self) -> bool {
        true
    }

    /// `UPDATE … SET expires_at = clock_timestamp() + …`, owner-checked on a live row, and
    /// announced as a release is: waiters resting until the expiry they read wake to read the
    /// new one, which may be sooner.
    async fn expire_after(
        &self,
        key: &str,
        owner: Owner,
        after: Duration,
    ) -> Result<bool, LockError> {
        let after_us = ttl_micros("PostgreSQL", after.min(TTL_LIMIT))?;
        let shared = self.shared.clone();
        let (key, owner) = (key.as_bytes().to_vec(), owner.to_string());
        on_background(async move { renew::expire_row(&shared, &key, &owner, after_us).await }).await
    }

    async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        let answers = self.renew_each(leases).await?;
        if answers.iter().any(Option::is_none) {
            return Err(LockError::backend(
                "PostgreSQL: the row of a lease to renew is locked by another transaction; \
                 not renewed this time",
            ));
        }
        Ok(answers.into_iter().map(|held| held == Some(true)).collect())
    }

    /// One statement for every lease, which passes over the rows another transaction keeps
    /// locked: those leases are answered `None` (not renewed this time), the others as usual.
    async fn renew_each(&self, leases: &[Renewal<'_>]) -> Result<Vec<Option<bool>>, LockError> {
        let shared = self.shared.clone();
        // A longer ttl than the limit renews to the limit (a `Locker` never asks for one).
        let leases = leases
            .iter()
            .map(|l| {
                let ttl_us = ttl_micros("PostgreSQL", l.ttl.min(TTL_LIMIT))?;
                Ok((l.key.as_bytes().to_vec(), l.owner.to_string(), ttl_us))
            })
            .collect::<Result<Vec<(Vec<u8>, String, i64)>, LockError>>()?;
        on_background(async move { renew::renew_all(&shared, &leases).await }).await
    }

    async fn close(&self) {
        self.shared.cleanups.done(CLEANUP_PATIENCE).await;
        self.shared.waiting.stop();
        // The places in line of the waiters shutdown stopped: given up now, rather than left to
        // keep other processes from a free key until they lapse.
        let shared = self.shared.clone();
        let _ = on_background(async move {
            let places = shared.waiting.leave_every_place();
            let _ = tokio::time::timeout(CLEANUP_PATIENCE, line::give_up(&shared, places)).await;
            Ok(())
        })
        .await;
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
}

/// `duration` in microseconds, as the statements take it (a `bigint`).
fn micros_i64(duration: Duration) -> i64 {
    i64::try_from(micros(duration)).unwrap_or(i64::MAX)
}

fn check_key(key: &str) -> Result<(), LockError> {
    if key.len() > MAX_KEY_BYTES {
        return Err(LockError::InvalidKey {
            key: key.to_owned(),
            reason: format!(
                "{} bytes is longer than the {MAX_KEY_BYTES} the PostgreSQL lock table takes",
                key.len()
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{check_key, MAX_KEY_BYTES};

    #[test]
    fn keys_longer_than_the_limit_are_rejected_whole() {
        assert!(check_key(&"k".repeat(MAX_KEY_BYTES)).is_ok());
        let error = check_key(&"é".repeat(MAX_KEY_BYTES / 2 + 1)).unwrap_err();
        assert!(error.to_string().contains("2050 bytes"), "{error}");
    }
}
