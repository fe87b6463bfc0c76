//! [`MysqlBuilder`]: the options of a MySQL store, and the statements they make.

use std::sync::Arc;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, Executor};

use super::retry::{backend_error, on_background};
use super::{MysqlBackend, Shared, Statements};
use crate::backend::description::LIST_PAGE;
use crate::backend::sql::ROW_LOCK_PATIENCE_S;
use crate::inspect::bounded;
use crate::url::{duration_param, number_param, query_param};
use crate::LockError;

/// Options of a [`MysqlBackend`], from [`MysqlBackend::builder`] or
/// [`MysqlBackend::with_pool`]. Nothing is connected until [`connect`](Self::connect).
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
/// use std::time::Duration;
/// use dlock::{backend::MysqlBackend, Locker};
///
/// let backend = MysqlBackend::builder("mysql://app:secret@db.internal:3306/orders")?
///     .table("order_locks")
///     .max_connections(4)
///     .connect_timeout(Duration::from_secs(2))
///     .connect()
///     .await?;
/// let locker = Locker::with_backend(backend);
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "a builder does nothing until `connect`"]
pub struct MysqlBuilder {
    source: Source,
    table: String,
    max_connections: u32,
    connect_timeout: Duration,
    create_table: bool,
    time_zone: Option<String>,
}

/// Where the connections come from.
#[derive(Clone)]
enum Source {
    /// A pool of dlock's own, opened by `connect` and closed by `Locker::shutdown`.
    Url(Box<MySqlConnectOptions>),
    /// The service's own pool: used, never closed.
    Pool(MySqlPool),
}

/// Everything but the password, which the connect options would print.
impl std::fmt::Debug for MysqlBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut debug = f.debug_struct("MysqlBuilder");
        match &self.source {
            Source::Url(options) => debug
                .field("host", &options.get_host())
                .field("port", &options.get_port())
                .field("username", &options.get_username())
                .field("database", &options.get_database()),
            Source::Pool(_) => debug.field("pool", &"the caller's"),
        };
        debug
            .field("table", &self.table)
            .field("max_connections", &self.max_connections)
            .field("connect_timeout", &self.connect_timeout)
            .field("create_table", &self.create_table)
            .field("time_zone", &self.time_zone)
            .finish()
    }
}

impl MysqlBuilder {
    pub(super) fn new(url: &str) -> Result<MysqlBuilder, LockError> {
        let options: MySqlConnectOptions = url
            .parse()
            .map_err(|error| LockError::invalid_url(url, error))?;
        let mut builder = Self::from_source(Source::Url(Box::new(options)));
        if let Some(table) = query_param(url, "table") {
            builder.table = table.to_owned();
        }
        if let Some(timeout) = duration_param(url, "connect_timeout")? {
            builder.connect_timeout = timeout;
        }
        if let Some(max) = number_param::<u32>(url, "max_connections")? {
            builder = builder.max_connections(max);
        }
        Ok(builder)
    }

    pub(super) fn with_pool(pool: MySqlPool) -> MysqlBuilder {
        Self::from_source(Source::Pool(pool))
    }

    fn from_source(source: Source) -> MysqlBuilder {
        MysqlBuilder {
            source,
            table: "dlock_locks".into(),
            max_connections: 10,
            connect_timeout: Duration::from_secs(5),
            create_table: true,
            time_zone: None,
        }
    }
}

impl MysqlBuilder {
    /// The lock table's name (default `dlock_locks`): letters, digits and `_`, optionally
    /// `database.table`. Checked by [`connect`](Self::connect).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = dlock::backend::MysqlBackend::builder("mysql://app:secret@db.internal/orders")?
    ///     .table("locks.order_locks") // in the `locks` database
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// How long connecting, or waiting for a free connection of the pool, may take (default
    /// 5 s). Not used with [`MysqlBackend::with_pool`], whose pool has its own. A lock call that
    /// waits longer for a connection fails with [`LockError::Backend`].
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// use std::time::Duration;
    ///
    /// let backend = dlock::backend::MysqlBackend::builder("mysql://app:secret@db.internal/orders")?
    ///     .connect_timeout(Duration::from_secs(1))
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The most connections the locker's own pool opens (default 10). Not used with
    /// [`MysqlBackend::with_pool`]. Each lock statement holds a connection only while it runs,
    /// and a waiter holds none between tries, so a few serve many locks.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = dlock::backend::MysqlBackend::builder("mysql://app:secret@db.internal/orders")?
    ///     .max_connections(4)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn max_connections(mut self, max: u32) -> Self {
        self.max_connections = max.max(1);
        self
    }

    /// Whether to create the table if it is missing (default `true`). Turn it off where the
    /// service's database user may not create tables, and have a DBA run
    /// [`MysqlBackend::ddl`] ahead of time.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = dlock::backend::MysqlBackend::builder("mysql://app:secret@db.internal/orders")?
    ///     .create_table(false)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }

    /// The session time zone of the pool's connections. Expiry is judged in UTC by the
    /// database whatever this is; it exists for deployments that must set one. Not used with
    /// [`MysqlBackend::with_pool`].
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = dlock::backend::MysqlBackend::builder("mysql://app:secret@db.internal/orders")?
    ///     .time_zone("+00:00")
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn time_zone(mut self, time_zone: impl Into<String>) -> Self {
        self.time_zone = Some(time_zone.into());
        self
    }

    /// Opens the pool (one connection at once, so a wrong password or an unreachable server is
    /// reported here) and creates the table if asked.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidOptions`] where the [table](Self::table) name cannot be used;
    /// [`LockError::Backend`] where the server cannot be reached within the
    /// [connect timeout](Self::connect_timeout), refuses the credentials, or refuses to create
    /// the table.
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped, no backend exists. The pool opens on dlock's background
    /// runtime, and an opening or a `CREATE TABLE` under way when the future is dropped finishes
    /// there; a pool of the backend's own is then dropped.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::{backend::MysqlBackend, Locker};
    ///
    /// let backend = MysqlBackend::builder("mysql://app:secret@db.internal:3306/orders")?
    ///     .table("order_locks")
    ///     .connect()
    ///     .await?;
    /// let locker = Locker::with_backend(backend);
    /// # Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<MysqlBackend, LockError> {
        let table = quote_table(&self.table)?;
        let ddl = MysqlBackend::ddl(&self.table)?;
        let (pool, owns_pool) = match self.source {
            Source::Url(options) => {
                let options = match &self.time_zone {
                    Some(zone) => options.timezone(Some(zone.clone())),
                    None => *options,
                };
                let pool_options = MySqlPoolOptions::new()
                    .max_connections(self.max_connections)
                    .min_connections(1)
                    .acquire_timeout(self.connect_timeout)
                    // Whatever the server's default (`autocommit = 0` in my.cnf), each lock
                    // statement must commit by itself: a row left in an open transaction would
                    // block others, and vanish in the rollback of a recycled connection.
                    // A statement stuck behind someone else's row lock gives its connection
                    // back (see `ROW_LOCK_PATIENCE_S`).
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            conn.execute(AssertSqlSafe(format!(
                                "SET autocommit = 1, innodb_lock_wait_timeout = {ROW_LOCK_PATIENCE_S}"
                            )))
                            .await?;
                            Ok(())
                        })
                    });
                let pool = on_background(async move {
                    pool_options.connect_with(options).await.map_err(|error| {
                        LockError::backend(format!("cannot connect to MySQL: {error}"))
                    })
                })
                .await?;
                (pool, true)
            }
            Source::Pool(pool) => (pool, false),
        };
        check_autocommit(&pool).await?;
        if self.create_table {
            let pool = pool.clone();
            on_background(async move {
                sqlx::query(AssertSqlSafe(ddl))
                    .execute(&pool)
                    .await
                    .map_err(backend_error)
            })
            .await?;
        }
        let described = {
            let (pool, name, create) = (pool.clone(), self.table.clone(), self.create_table);
            on_background(async move { describe_holders(&pool, &name, create).await }).await?
        };
        let now_us = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))";
        // The holder's description, written by the statement that grants the key: this
        // process's host and id written in (the same for every statement), the label bound.
        let (meta_columns, meta_values, meta_set, meta_read) = if described {
            let (host, pid) = (host_literal(), std::process::id());
            (
                ", label, host, pid",
                format!(", ?, {host}, {pid}"),
                format!(", label = ?, host = {host}, pid = {pid}"),
                "label, host, pid",
            )
        } else {
            ("", String::new(), String::new(), "NULL, NULL, NULL")
        };
        let sql = Statements {
            insert: Arc::from(format!(
                "INSERT INTO {table} (lock_key, owner, fence, expires_at, created_at{meta_columns}) \
                 VALUES (?, ?, LAST_INSERT_ID({now_us}), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6){meta_values})"
            )),
            // A row owned by nobody (released, evicted) is free whatever its expiry says: the
            // database's clock may have stepped back since. A take-over by the owner that holds
            // the row already (a retried acquire, its first answer lost) never moves its
            // expiry back: a late copy of the statement (re-sent
            // after a broken connection while the first was held up on the server) would else
            // cut the lease below what the client counts from. MySQL assigns left to right, so
            // the expiry and the fence are set while `owner` is still the old holder. Such a
            // copy keeps the row's fence, too, where it is greater than every fence of the
            // acquisition that was withdrawn (the fifth value bound): the undo of a grant
            // withdrawn unclaimed deletes by that fence, and a new one would leave the row held
            // by nobody until its ttl. A row of the owner that still carries a withdrawn fence
            // takes a new one, which that grant's undo, perhaps still on its way, then misses
            // (see `sql::withdrawn_bound`).
            take_over: Arc::from(format!(
                "UPDATE {table} SET \
                 expires_at = IF(owner = ?, GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), \
                                 UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), \
                 fence = LAST_INSERT_ID(IF(owner = ? AND fence > ?, fence, GREATEST(fence + 1, {now_us}))), \
                 owner = ?, \
                 created_at = UTC_TIMESTAMP(6){meta_set} \
                 WHERE lock_key = ? AND (owner = '' OR expires_at <= UTC_TIMESTAMP(6) OR owner = ?)"
            )),
            inspect: Arc::from(format!(
                "SELECT owner, fence, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', created_at), \
                 TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at), {meta_read} \
                 FROM {table} WHERE lock_key = ? AND owner <> '' AND expires_at > UTC_TIMESTAMP(6)"
            )),
            // A range of the primary key, a page at a time (see `description::prefix_end`).
            list: Arc::from(format!(
                "SELECT lock_key FROM {table} WHERE lock_key >= ? \
                 AND owner <> '' AND expires_at > UTC_TIMESTAMP(6) ORDER BY lock_key LIMIT {LIST_PAGE}"
            )),
            list_to: Arc::from(format!(
                "SELECT lock_key FROM {table} WHERE lock_key >= ? AND lock_key < ? \
                 AND owner <> '' AND expires_at > UTC_TIMESTAMP(6) ORDER BY lock_key LIMIT {LIST_PAGE}"
            )),
            described,
            // The row is kept, expired and owned by nobody (no owner is empty), rather than
            // deleted: the key's next grant takes it over with a fence above this one, where a
            // fresh row's clock floor would only nearly promise it (an `INSERT` that read the
            // clock and was held up while another grant came and went; a clock stepped back).
            release: Arc::from(format!(
                "UPDATE {table} SET owner = '', expires_at = UTC_TIMESTAMP(6) \
                 WHERE lock_key = ? AND owner = ? AND (? IS NULL OR fence = ?)"
            )),
            // Kept the same way; the reply carries the evicted fence.
            expire: Arc::from(format!(
                "UPDATE {table} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
                 WHERE lock_key = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)"
            )),
            evict: Arc::from(format!(
                "UPDATE {table} SET fence = LAST_INSERT_ID(fence), owner = '', \
                 expires_at = UTC_TIMESTAMP(6) \
                 WHERE lock_key = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)"
            )),
            table,
        };
        let tries = crate::backend::sql::try_permits(pool.options().get_max_connections());
        Ok(MysqlBackend {
            shared: Arc::new(Shared {
                pool,
                owns_pool,
                sql,
                cleanups: Arc::default(),
                tries,
                waiting: Default::default(),
                rows_seen: Default::default(),
            }),
        })
    }
}

/// Refuses a pool whose connections run with autocommit off (a service's pool can turn it off
/// in its own `after_connect`): each lock statement must commit by itself.
async fn check_autocommit(pool: &MySqlPool) -> Result<(), LockError> {
    let pool = pool.clone();
    let autocommit: i64 = on_background(async move {
        sqlx::query_scalar("SELECT @@autocommit")
            .fetch_one(&pool)
            .await
            .map_err(backend_error)
    })
    .await?;
    if autocommit == 1 {
        return Ok(());
    }
    Err(LockError::InvalidOptions {
        reason: "the pool's connections run with autocommit off, so a lock row would stay in a \
                 transaction nobody commits: let the pool keep MySQL's default (remove its \
                 `SET autocommit = 0`), or give the locks a pool of their own \
                 (`MysqlBackend::builder(url)`)"
            .into(),
    })
}

/// The columns that describe a lease's holder, with their types: added to a table of an
/// earlier version where missing (see [`describe_holders`]).
pub(super) const HOLDER_COLUMNS: [(&str, &str); 3] = [
    (
        "label",
        "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL",
    ),
    (
        "host",
        "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL",
    ),
    ("pid", "INT UNSIGNED NULL"),
];

/// Whether the lock table `name` has the columns that describe a lease's holder, adding those
/// it lacks where `create` allows (a table created by an earlier version of dlock).
///
/// The columns are looked up first, and the table altered only where one is missing: an
/// `ALTER TABLE`, even one that changes nothing, waits for every transaction that read the
/// table to end, and every statement on the table waits behind it meanwhile. Each column is
/// added on its own, nullable (rows of earlier versions, and of earlier versions still running
/// beside this one, leave it `NULL`: instant on MySQL 8 and MariaDB 10.3); one another process
/// added meanwhile is refused as a duplicate (1060), which is what was asked. (MySQL 8 has no
/// `ADD COLUMN IF NOT EXISTS`, which MariaDB has.) The `ALTER`s wait at most
/// [`ROW_LOCK_PATIENCE_S`] for the table's metadata lock (`lock_wait_timeout`, a year by
/// default), on a connection of their own that is closed after them, so the setting never
/// reaches the pool (a service's, perhaps). A table without the columns that may not be altered
/// (`create` is off, the user lacks the privilege, the table stayed locked) keeps working as
/// before, its holders described without label, host or process, and the next connect tries
/// again.
async fn describe_holders(pool: &MySqlPool, name: &str, create: bool) -> Result<bool, LockError> {
    let (database, table) = match name.split_once('.') {
        Some((database, table)) => (Some(database), table),
        None => (None, name),
    };
    let present: Vec<String> = sqlx::query_scalar(
        "SELECT CAST(COLUMN_NAME AS CHAR) FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?",
    )
    .bind(database)
    .bind(table)
    .fetch_all(pool)
    .await
    .map_err(backend_error)?;
    let missing: Vec<&(&str, &str)> = HOLDER_COLUMNS
        .iter()
        .filter(|(column, _)| !present.iter().any(|p| p.eq_ignore_ascii_case(column)))
        .collect();
    if missing.is_empty() {
        return Ok(true);
    }
    if !create {
        tracing::warn!(
            table = name,
            "distributed_lock: the MySQL lock table has no label, host and pid columns (created by an earlier version; see MysqlBackend::ddl): holders are described without them"
        );
        return Ok(false);
    }
    let quoted = quote_table(name)?;
    let mut connection = pool.acquire().await.map_err(backend_error)?.detach();
    let mut altered = connection
        .execute(AssertSqlSafe(format!(
            "SET SESSION lock_wait_timeout = {ROW_LOCK_PATIENCE_S}"
        )))
        .await
        .map(drop);
    for (column, definition) in missing {
        if altered.is_err() {
            break;
        }
        let alter = format!("ALTER TABLE {quoted} ADD COLUMN `{column}` {definition}");
        altered = match connection.execute(AssertSqlSafe(alter)).await {
            Err(sqlx::Error::Database(db))
                if db
                    .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                    .is_some_and(|e| e.number() == 1060) =>
            {
                Ok(())
            }
            other => other.map(drop),
        };
    }
    let _ = sqlx::Connection::close(connection).await;
    match altered {
        Ok(()) => Ok(true),
        Err(error) => {
            tracing::warn!(
                table = name,
                %error,
                "distributed_lock: cannot add the label, host and pid columns to the MySQL lock table (see MysqlBackend::ddl): holders are described without them"
            );
            Ok(false)
        }
    }
}

/// This host's name as a literal of the statements, cut as a label is; `NULL` where it is
/// unknown. Hex, so that nothing in it is read as SQL.
fn host_literal() -> String {
    let host = bounded(crate::inspect::this_host());
    if host.is_empty() {
        return "NULL".into();
    }
    let hex: String = host.bytes().map(|b| format!("{b:02X}")).collect();
    format!("CONVERT(X'{hex}' USING utf8mb4)")
}

/// Accepts `name` or `database.name` made of letters, digits and `_`, and quotes it.
pub(super) fn quote_table(name: &str) -> Result<String, LockError> {
    let valid_part = |part: &str| {
        !part.is_empty() && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    };
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() > 2 || !parts.iter().all(|p| valid_part(p)) {
        return Err(LockError::InvalidOptions {
            reason: format!(
                "table name `{name}` must be letters, digits and `_` (optionally `database.table`)"
            ),
        });
    }
    Ok(parts
        .iter()
        .map(|p| format!("`{p}`"))
        .collect::<Vec<_>>()
        .join("."))
}

#[cfg(test)]
mod tests {
    use super::quote_table;

    #[test]
    fn table_names_are_checked_and_quoted() {
        assert_eq!(quote_table("dlock_locks").unwrap(), "`dlock_locks`");
        assert_eq!(quote_table("app.locks").unwrap(), "`app`.`locks`");
        for bad in ["", "a;b", "a`b", "a.b.c", "a.", "lock table"] {
            assert!(quote_table(bad).is_err(), "{bad:?}");
        }
    }
}
