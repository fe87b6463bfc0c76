//! [`PostgresBuilder`]: the options of a PostgreSQL store, and the statements they make.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, Executor};

use super::query::{Protocol, Query};
use super::statements::resolve_channel;
use super::waiting::Waiting;
use super::{backend_error, line, on_background, PostgresBackend, Shared, Statements};
use crate::backend::sql::ROW_LOCK_PATIENCE_S;
use crate::url::{bool_param, duration_param, number_param, query_param, without_params};
use crate::{LockError, Owner};

/// The URL settings that are dlock's, taken out before the driver reads the rest.
const SETTINGS: [&str; 4] = [
    "table",
    "connect_timeout",
    "max_connections",
    "prepared_statements",
];

/// Options of a [`PostgresBackend`], from [`PostgresBackend::builder`] or
/// [`PostgresBackend::with_pool`]. Nothing is connected until [`connect`](Self::connect).
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
/// use std::time::Duration;
/// use dlock::{backend::PostgresBackend, Locker};
///
/// let backend = PostgresBackend::builder("postgres://app:secret@db.internal:5432/orders")?
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
pub struct PostgresBuilder {
    source: Source,
    /// Where the `LISTEN` connection goes, where not where the statements go.
    listen: Option<Box<PgConnectOptions>>,
    table: String,
    max_connections: u32,
    connect_timeout: Duration,
    create_table: bool,
    protocol: Protocol,
}

/// Where the connections come from.
#[derive(Clone)]
enum Source {
    /// A pool of dlock's own, opened by `connect` and closed by `Locker::shutdown`.
    Url(Box<PgConnectOptions>),
    /// The service's own pool: used, never closed.
    Pool(PgPool),
}

/// Everything but the password, which the connect options would print.
impl std::fmt::Debug for PostgresBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut debug = f.debug_struct("PostgresBuilder");
        match &self.source {
            Source::Url(options) => debug
                .field("host", &options.get_host())
                .field("port", &options.get_port())
                .field("username", &options.get_username())
                .field("database", &options.get_database()),
            Source::Pool(_) => debug.field("pool", &"the caller's"),
        };
        if let Some(listen) = &self.listen {
            debug.field("listen_host", &listen.get_host());
            debug.field("listen_port", &listen.get_port());
        }
        debug
            .field("table", &self.table)
            .field("max_connections", &self.max_connections)
            .field("connect_timeout", &self.connect_timeout)
            .field("create_table", &self.create_table)
            .field(
                "prepared_statements",
                &(self.protocol == Protocol::Prepared),
            )
            .finish()
    }
}

/// The driver's options from `url`, without dlock's own settings.
fn connect_options(url: &str) -> Result<PgConnectOptions, LockError> {
    without_params(url, &SETTINGS)
        .parse()
        .map_err(|error| LockError::invalid_url(url, error))
}

impl PostgresBuilder {
    pub(super) fn new(url: &str) -> Result<PostgresBuilder, LockError> {
        let options = connect_options(url)?;
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
        if let Some(prepared) = bool_param(url, "prepared_statements")? {
            builder = builder.prepared_statements(prepared);
        }
        Ok(builder)
    }

    pub(super) fn with_pool(pool: PgPool) -> PostgresBuilder {
        Self::from_source(Source::Pool(pool))
    }

    fn from_source(source: Source) -> PostgresBuilder {
        PostgresBuilder {
            source,
            listen: None,
            table: "dlock_locks".into(),
            max_connections: 10,
            connect_timeout: Duration::from_secs(5),
            create_table: true,
            protocol: Protocol::Prepared,
        }
    }
}

impl PostgresBuilder {
    /// The lock table's name (default `dlock_locks`): letters, digits and `_`, optionally
    /// `schema.table`, at most 63 bytes. Spelled with or without its schema, one table is one
    /// lock table with one notification channel (derived from the table the name resolves to).
    /// Checked by [`connect`](Self::connect).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = dlock::backend::PostgresBackend::builder("postgres://app:secret@db.internal/orders")?
    ///     .table("locks.order_locks") // in the `locks` schema
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// How long connecting, or waiting for a free connection of the pool, may take (default
    /// 5 s). Not used with [`PostgresBackend::with_pool`], whose pool has its own, except for
    /// the listening connection. A lock call that waits longer for a connection fails with
    /// [`LockError::Backend`].
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// use std::time::Duration;
    ///
    /// let backend = dlock::backend::PostgresBackend::builder("postgres://app:secret@db.internal/orders")?
    ///     .connect_timeout(Duration::from_secs(1))
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The most connections the locker's own pool opens (default 10), besides the one that
    /// listens. Not used with [`PostgresBackend::with_pool`]. Each lock statement holds a
    /// connection only while it runs, and a waiter holds none, so a few serve many locks.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = dlock::backend::PostgresBackend::builder("postgres://app:secret@db.internal/orders")?
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
    /// [`PostgresBackend::ddl`] ahead of time: the table must exist when the backend connects.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = dlock::backend::PostgresBackend::builder("postgres://app:secret@db.internal/orders")?
    ///     .create_table(false)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }

    /// Whether to send the statements as prepared statements (default `true`; also set by
    /// `?prepared_statements=false` in the URL). Turn it off for PgBouncer in transaction mode
    /// before 1.21, or any connection pooler that cannot follow a client's prepared statements
    /// from one server connection to another (see [`PostgresBackend`]'s PgBouncer notes).
    ///
    /// Off, each statement goes as one simple query with its values written into the SQL
    /// (keys in hex, never as text), so nothing it leaves on a server connection outlives it.
    /// The cost: the server parses and plans every statement it gets, where a prepared one is
    /// parsed once per connection. The wait for another transaction's row lock is then bounded
    /// within each statement (`SET LOCAL lock_timeout`), not by a setting of the connection's
    /// session, which a pooler would hand on to its other clients; so it is bounded on a
    /// service's pool ([`PostgresBackend::with_pool`]) too.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// // Through PgBouncer 1.18 in transaction mode; the listener straight to the server.
    /// let backend = dlock::backend::PostgresBackend::builder(
    ///     "postgres://app:secret@pgbouncer.internal:6432/orders",
    /// )?
    /// .prepared_statements(false)
    /// .listen_url("postgres://app:secret@db.internal:5432/orders")?
    /// .connect()
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub fn prepared_statements(mut self, prepared: bool) -> Self {
        self.protocol = Protocol::prepared(prepared);
        self
    }

    /// Where the one `LISTEN` connection goes, where that is not where the statements go: the
    /// server itself, when the statements go through PgBouncer in transaction mode, which
    /// cannot keep a `LISTEN` for a session (see [`PostgresBackend`]'s PgBouncer notes). By
    /// default the listener connects as the statements do.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidUrl`] where `url` cannot be parsed.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// // The statements through PgBouncer; the listener straight to the server.
    /// let backend = dlock::backend::PostgresBackend::builder(
    ///     "postgres://app:secret@pgbouncer.internal:6432/orders",
    /// )?
    /// .listen_url("postgres://app:secret@db.internal:5432/orders")?
    /// .connect()
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub fn listen_url(mut self, url: &str) -> Result<Self, LockError> {
        self.listen = Some(Box::new(connect_options(url)?));
        Ok(self)
    }

    /// Opens the pool (one connection at once, so a wrong password or an unreachable server is
    /// reported here), creates the table if asked, and starts listening for releases (waiting
    /// up to the [connect timeout](Self::connect_timeout) for it; until it listens, waiters
    /// poll).
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidOptions`] where the [table](Self::table) name cannot be used;
    /// [`LockError::Backend`] where the server cannot be reached within the connect timeout,
    /// refuses the credentials, or refuses to create the table; or where the table does not
    /// exist and [`create_table`](Self::create_table) is off (the table must exist to know its
    /// notification channel).
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped, no backend exists. The pool opens on dlock's background
    /// runtime, and an opening or a `CREATE TABLE` under way when the future is dropped finishes
    /// there; a pool of the backend's own, and the listener, are then dropped.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::{backend::PostgresBackend, Locker};
    ///
    /// let backend = PostgresBackend::builder("postgres://app:secret@db.internal:5432/orders")?
    ///     .table("order_locks")
    ///     .connect()
    ///     .await?;
    /// let locker = Locker::with_backend(backend);
    /// # Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<PostgresBackend, LockError> {
        let table = quote_table(&self.table, "")?;
        let waiters = quote_table(&self.table, WAITERS_SUFFIX)?;
        let ddl = PostgresBackend::ddl(&self.table)?;
        let protocol = self.protocol;
        let (pool, owns_pool) = match self.source {
            Source::Url(options) => {
                let pool_options = PgPoolOptions::new()
                    .max_connections(self.max_connections)
                    .min_connections(1)
                    .acquire_timeout(self.connect_timeout);
                // A statement stuck behind someone else's row lock gives its connection back
                // (see `ROW_LOCK_PATIENCE_S`). Simple queries set that within each statement
                // instead: a session's setting would stay on a pooler's server connection.
                let pool_options = match protocol {
                    Protocol::Prepared => pool_options.after_connect(|conn, _| {
                        Box::pin(async move {
                            conn.execute(AssertSqlSafe(format!(
                                "SET lock_timeout = '{ROW_LOCK_PATIENCE_S}s'"
                            )))
                            .await?;
                            Ok(())
                        })
                    }),
                    Protocol::Simple => pool_options,
                };
                // Simple queries carry their values (keys in hex, owner tokens): kept out of
                // sqlx's statement log, which would print them.
                let options = match protocol {
                    Protocol::Prepared => *options,
                    Protocol::Simple => options.disable_statement_logging(),
                };
                let pool = on_background(async move {
                    pool_options.connect_with(options).await.map_err(|error| {
                        LockError::backend(format!("cannot connect to PostgreSQL: {error}"))
                    })
                })
                .await?;
                (pool, true)
            }
            Source::Pool(pool) => (pool, false),
        };
        if self.create_table {
            let pool = pool.clone();
            on_background(async move { create_table(&pool, ddl, protocol).await }).await?;
        }
        let described = {
            let (pool, table, create) = (pool.clone(), table.clone(), self.create_table);
            on_background(async move { describe_holders(&pool, &table, create, protocol).await })
                .await?
        };
        let listen = match self.listen {
            Some(options) => *options,
            None => (*pool.connect_options()).clone(),
        };
        // Named, so an operator can tell it in `pg_stat_activity`.
        let listen = match listen.get_application_name() {
            Some(_) => listen,
            None => listen.application_name("dlock listener"),
        };
        let waiter = Owner::random().to_string();
        let waiting = Waiting::new(waiter.clone());
        // The channel is the table's, however its name is written: derived from the table it
        // resolves to (see `resolve_channel`).
        let channel = {
            let (pool, table, waiters) = (pool.clone(), table.clone(), waiters.clone());
            on_background(async move { resolve_channel(&pool, &table, &waiters, protocol).await })
                .await?
        };
        waiting
            .start_listener(listen, channel.clone(), self.connect_timeout)
            .await;
        let tries = crate::backend::sql::try_permits(pool.options().get_max_connections());
        let shared = Arc::new(Shared {
            pool,
            owns_pool,
            sql: Statements::new(table, &waiters, &channel, protocol, described),
            waiting,
            waiter,
            statements: Default::default(),
            cleanups: Arc::default(),
            tries,
        });
        crate::background::handle().spawn(line::keep_places(Arc::downgrade(&shared)));
        Ok(PostgresBackend { shared })
    }
}

/// Runs the `CREATE TABLE IF NOT EXISTS` of each table. Two of them at once for one new table can both pass
/// the "if not exists" and collide in the catalog (a unique violation on the table's row type,
/// or "already exists"): the table then exists, which is what was asked.
async fn create_table(pool: &PgPool, ddl: String, protocol: Protocol) -> Result<(), LockError> {
    for statement in ddl.split(';').filter(|s| !s.trim().is_empty()) {
        match Query::once(statement, protocol).execute(pool).await {
            Ok(_) => {}
            Err(sqlx::Error::Database(db))
                if matches!(db.code().as_deref(), Some("23505" | "42P07")) => {}
            Err(error) => return Err(backend_error(error)),
        }
    }
    Ok(())
}

/// The columns that describe a lease's holder, with their types: added to a table of an
/// earlier version where missing (see [`describe_holders`]). `BYTEA`, as the key: no database
/// encoding can refuse a label or a host name.
pub(super) const HOLDER_COLUMNS: [(&str, &str); 3] =
    [("label", "BYTEA"), ("host", "BYTEA"), ("pid", "BIGINT")];

/// Whether the lock table `table` (quoted) has the columns that describe a lease's holder,
/// adding those it lacks where `create` allows (a table created by an earlier version of dlock).
///
/// The columns are looked up first, and the table altered only where one is missing: an
/// `ALTER TABLE`, even one that changes nothing, takes the table's strongest lock, waiting for
/// every transaction that read the table to end while every statement on the table waits
/// behind it. The columns are nullable, with no default (rows of earlier versions, and of
/// earlier versions still running beside this one, leave them `NULL`), which PostgreSQL adds
/// without rewriting the table; `IF NOT EXISTS`, so that processes upgrading the table at once
/// all succeed. It waits at most [`ROW_LOCK_PATIENCE_S`] for that lock (`SET LOCAL
/// lock_timeout`, in the same transaction: nothing stays on the connection). A table without
/// them that may not be altered (`create` is off, the role does not own it, it stayed locked)
/// keeps working as before, its holders described without label, host or process, and the next
/// connect tries again.
async fn describe_holders(
    pool: &PgPool,
    table: &str,
    create: bool,
    protocol: Protocol,
) -> Result<bool, LockError> {
    let names: Vec<String> = HOLDER_COLUMNS
        .iter()
        .map(|(name, _)| (*name).to_owned())
        .collect();
    let present: i64 = Query::once(
        "SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass($1) \
         AND attname = ANY($2::text[]) AND NOT attisdropped",
        protocol,
    )
    .bind(table)
    .bind(names.as_slice())
    .fetch_one(pool)
    .await
    .and_then(|row| sqlx::Row::try_get(&row, 0))
    .map_err(backend_error)?;
    if present == HOLDER_COLUMNS.len() as i64 {
        return Ok(true);
    }
    if !create {
        tracing::warn!(
            table,
            "distributed_lock: the PostgreSQL lock table has no label, host and pid columns (created by an earlier version; see PostgresBackend::ddl): holders are described without them"
        );
        return Ok(false);
    }
    let columns: Vec<String> = HOLDER_COLUMNS
        .iter()
        .map(|(name, kind)| format!("ADD COLUMN IF NOT EXISTS {name} {kind}"))
        .collect();
    // One simple query of two statements: one transaction, which `SET LOCAL` lasts for.
    let alter = format!(
        "SET LOCAL lock_timeout = '{ROW_LOCK_PATIENCE_S}s'; ALTER TABLE {table} {}",
        columns.join(", ")
    );
    match sqlx::raw_sql(AssertSqlSafe(alter)).execute(pool).await {
        Ok(_) => Ok(true),
        Err(error) => {
            tracing::warn!(
                table,
                %error,
                "distributed_lock: cannot add the label, host and pid columns to the PostgreSQL lock table (see PostgresBackend::ddl): holders are described without them"
            );
            Ok(false)
        }
    }
}

/// What the waiters table's name adds to the lock table's.
pub(super) const WAITERS_SUFFIX: &str = "_waiters";

/// Accepts `name` or `schema.name` made of letters, digits and `_`, the schema at most 63 bytes
/// and the name at most 55 (PostgreSQL's 63 less [`WAITERS_SUFFIX`], which the waiters table's
/// name adds), and quotes it with `suffix` added to the name.
pub(super) fn quote_table(name: &str, suffix: &str) -> Result<String, LockError> {
    let valid_part = |part: &str, longest: usize| {
        !part.is_empty()
            && part.len() <= longest
            && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    };
    let longest_name = 63 - WAITERS_SUFFIX.len();
    let (schema, table) = match name.split_once('.') {
        Some((schema, table)) => (Some(schema), table),
        None => (None, name),
    };
    if !schema.is_none_or(|schema| valid_part(schema, 63)) || !valid_part(table, longest_name) {
        return Err(LockError::InvalidOptions {
            reason: format!(
                "table name `{name}` must be letters, digits and `_` (optionally `schema.table`), the table's at most {longest_name} bytes"
            ),
        });
    }
    Ok(match schema {
        Some(schema) => format!("\"{schema}\".\"{table}{suffix}\""),
        None => format!("\"{table}{suffix}\""),
    })
}

#[cfg(test)]
mod tests {
    use super::{quote_table, PostgresBuilder};

    #[test]
    fn table_names_are_checked_and_quoted() {
        assert_eq!(quote_table("dlock_locks", "").unwrap(), "\"dlock_locks\"");
        assert_eq!(
            quote_table("app.locks", "_waiters").unwrap(),
            "\"app\".\"locks_waiters\""
        );
        assert!(quote_table(&"t".repeat(55), "_waiters").is_ok());
        for bad in [
            "",
            "a;b",
            "a\"b",
            "a.b.c",
            "a.",
            "lock table",
            &"t".repeat(56),
            &format!("{}.t", "s".repeat(64)),
        ] {
            assert!(quote_table(bad, "").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn dlock_settings_come_from_the_query_and_the_password_stays_out_of_debug() {
        let builder = PostgresBuilder::new(
            "postgresql://app:secret@db:5432/orders?table=order_locks&connect_timeout=2s&max_connections=3&prepared_statements=false&sslmode=disable",
        )
        .unwrap();
        let debug = format!("{builder:?}");
        assert!(
            debug.contains("order_locks") && debug.contains("2s"),
            "{debug}"
        );
        assert!(debug.contains("max_connections: 3"), "{debug}");
        assert!(debug.contains("prepared_statements: false"), "{debug}");
        let default = format!(
            "{:?}",
            PostgresBuilder::new("postgres://db/orders").unwrap()
        );
        assert!(default.contains("prepared_statements: true"), "{default}");
        let error =
            PostgresBuilder::new("postgres://app:secret@db:5432/orders?prepared_statements=no")
                .unwrap_err()
                .to_string();
        assert!(
            error.contains("prepared_statements=`no`") && !error.contains("secret"),
            "{error}"
        );
        assert!(!debug.contains("secret"), "{debug}");
        let error =
            PostgresBuilder::new("postgres://app:secret@db:5432/orders?connect_timeout=soon")
                .unwrap_err()
                .to_string();
        assert!(
            error.contains("connect_timeout") && !error.contains("secret"),
            "{error}"
        );
    }
}
