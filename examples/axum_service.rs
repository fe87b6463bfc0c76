//! A web service under the lock: the duplicate-rows story as an axum service, run as several
//! processes on one lock store and one database.
//!
//! `POST /accounts/{open_id}/devices/{local_id}` checks for the account's row, then inserts or
//! updates it. Clients retry on time-outs, so the same call reaches several processes at once;
//! with no unique index on `open_id`, two checks that both see "no row" both insert. Under
//! `#[distributed_lock(key = "acct:<open_id>")]` one call per account runs at a time, in every
//! process; a call that finds the account busy answers `409 Conflict`, which the client retries.
//! `POST /unlocked/…` is the same handler without the lock, to show the duplicates it leaves.
//! `GET /health` answers `200` when the lock store does.
//!
//! On Ctrl-C or `SIGTERM` the server stops taking requests, lets those in flight finish, and
//! then calls `locker.shutdown()`: no lease outlives the process.
//!
//! `ACCOUNTS_URL` names the accounts' database, MySQL (`mysql://…`, the default
//! `mysql://root@127.0.0.1:3306/test`) or PostgreSQL (`postgres://…`); `DLOCK_URL` names the
//! lock store (`redis://…`, `mysql://…`, `postgres://…`, `zk://…`, with its feature enabled),
//! which may be the same database:
//!
//! ```text
//! DLOCK_URL=redis://127.0.0.1:6379 \
//! ACCOUNTS_URL=mysql://root@127.0.0.1:3306/test \
//! PORT=3000 cargo run --example axum_service
//!
//! DLOCK_URL=postgres://postgres@127.0.0.1:5432/test \
//! ACCOUNTS_URL=postgres://postgres@127.0.0.1:5432/test \
//! PORT=3000 cargo run --example axum_service --features postgres
//!
//! curl -X POST localhost:3000/accounts/oX7f/devices/phone-1
//! ```
//!
//! Without `DLOCK_URL` it locks on the in-memory store (one process only).

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use dlock::{distributed_lock, LockError, Locker};
use sqlx::{AssertSqlSafe, MySqlPool, PgPool};

#[derive(Clone)]
struct App {
    locker: Locker,
    db: Accounts,
    table: String,
}

/// The database of the accounts table, MySQL or PostgreSQL. The statements are the same on
/// both but for how a parameter is written (`?`, `$1`) and how the table numbers its rows.
#[derive(Clone)]
enum Accounts {
    Mysql(MySqlPool),
    Postgres(PgPool),
}

impl Accounts {
    /// Connects to `url`: PostgreSQL for `postgres://` and `postgresql://`, else MySQL.
    async fn connect(url: &str) -> Result<Accounts, sqlx::Error> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Accounts::Postgres(PgPool::connect(url).await?))
        } else {
            Ok(Accounts::Mysql(MySqlPool::connect(url).await?))
        }
    }

    /// As in many tables grown over the years: no unique index on `open_id`.
    async fn create_table(&self, table: &str) -> Result<(), sqlx::Error> {
        let columns = "open_id VARCHAR(64) NOT NULL, local_id VARCHAR(64) NOT NULL";
        match self {
            Accounts::Mysql(db) => sqlx::query(AssertSqlSafe(format!(
                "CREATE TABLE IF NOT EXISTS {table} (id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY, {columns})"
            )))
            .execute(db)
            .await
            .map(drop),
            Accounts::Postgres(db) => sqlx::query(AssertSqlSafe(format!(
                "CREATE TABLE IF NOT EXISTS {table} (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, {columns})"
            )))
            .execute(db)
            .await
            .map(drop),
        }
    }

    /// The id of a row of `open_id`, if there is one.
    async fn find(&self, table: &str, open_id: &str) -> Result<Option<u64>, sqlx::Error> {
        match self {
            Accounts::Mysql(db) => {
                sqlx::query_scalar(AssertSqlSafe(format!(
                    "SELECT id FROM {table} WHERE open_id = ? LIMIT 1"
                )))
                .bind(open_id)
                .fetch_optional(db)
                .await
            }
            Accounts::Postgres(db) => {
                let id: Option<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
                    "SELECT id FROM {table} WHERE open_id = $1 LIMIT 1"
                )))
                .bind(open_id)
                .fetch_optional(db)
                .await?;
                // An identity column counts up from 1.
                Ok(id.map(|id| id as u64))
            }
        }
    }

    async fn update(&self, table: &str, id: u64, local_id: &str) -> Result<(), sqlx::Error> {
        match self {
            Accounts::Mysql(db) => sqlx::query(AssertSqlSafe(format!(
                "UPDATE {table} SET local_id = ? WHERE id = ?"
            )))
            .bind(local_id)
            .bind(id)
            .execute(db)
            .await
            .map(drop),
            Accounts::Postgres(db) => sqlx::query(AssertSqlSafe(format!(
                "UPDATE {table} SET local_id = $1 WHERE id = $2"
            )))
            .bind(local_id)
            .bind(id as i64)
            .execute(db)
            .await
            .map(drop),
        }
    }

    async fn insert(&self, table: &str, open_id: &str, local_id: &str) -> Result<(), sqlx::Error> {
        match self {
            Accounts::Mysql(db) => sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {table} (open_id, local_id) VALUES (?, ?)"
            )))
            .bind(open_id)
            .bind(local_id)
            .execute(db)
            .await
            .map(drop),
            Accounts::Postgres(db) => sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {table} (open_id, local_id) VALUES ($1, $2)"
            )))
            .bind(open_id)
            .bind(local_id)
            .execute(db)
            .await
            .map(drop),
        }
    }
}

/// How a request can fail, and the status each failure answers with.
#[derive(Debug)]
enum ApiError {
    Lock(LockError),
    Database(sqlx::Error),
}

impl From<LockError> for ApiError {
    fn from(error: LockError) -> Self {
        ApiError::Lock(error)
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(error: sqlx::Error) -> Self {
        ApiError::Database(error)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            // Another request for the same account is being served: try again shortly.
            ApiError::Lock(LockError::Busy { key }) => {
                (StatusCode::CONFLICT, format!("{key} is busy; retry\n")).into_response()
            }
            ApiError::Lock(error) => {
                (StatusCode::SERVICE_UNAVAILABLE, format!("{error}\n")).into_response()
            }
            ApiError::Database(error) => {
                (StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")).into_response()
            }
        }
    }
}

impl App {
    /// The account's row, created or updated: one call per account at a time, in every process.
    #[distributed_lock(key = "acct:<open_id>", ttl = "3s", locker = &self.locker)]
    async fn submit(&self, open_id: &str, local_id: &str) -> Result<&'static str, ApiError> {
        self.check_then_write(open_id, local_id).await
    }

    /// Finds the row, then writes it: two requests in between both find nothing.
    async fn check_then_write(
        &self,
        open_id: &str,
        local_id: &str,
    ) -> Result<&'static str, ApiError> {
        let found = self.db.find(&self.table, open_id).await?;
        // The service's own work between the check and the write (validation, a call to
        // another service) widens the window a concurrent duplicate slips through.
        tokio::time::sleep(Duration::from_millis(20)).await;
        match found {
            Some(id) => {
                self.db.update(&self.table, id, local_id).await?;
                Ok("updated\n")
            }
            None => {
                self.db.insert(&self.table, open_id, local_id).await?;
                Ok("created\n")
            }
        }
    }
}

async fn submit(
    State(app): State<App>,
    Path((open_id, local_id)): Path<(String, String)>,
) -> Result<&'static str, ApiError> {
    app.submit(&open_id, &local_id).await
}

async fn submit_unlocked(
    State(app): State<App>,
    Path((open_id, local_id)): Path<(String, String)>,
) -> Result<&'static str, ApiError> {
    app.check_then_write(&open_id, &local_id).await
}

/// `200` when the lock store answers.
async fn health(State(app): State<App>) -> Result<&'static str, ApiError> {
    app.locker.health().await?;
    Ok("ok\n")
}

/// Resolves on Ctrl-C or `SIGTERM`.
async fn stop_signal() {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("cannot listen for SIGTERM");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // DLOCK_URL names the lock store; without it, the in-memory one.
    let locker = match Locker::from_env().await {
        Err(LockError::NoLocker) => Locker::memory(),
        locker => locker?,
    };
    let accounts_url =
        std::env::var("ACCOUNTS_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    let db = Accounts::connect(&accounts_url).await?;
    let table = std::env::var("ACCOUNTS_TABLE").unwrap_or_else(|_| "t_account".into());
    db.create_table(&table).await?;

    let app = App {
        locker: locker.clone(),
        db,
        table,
    };
    let routes = Router::new()
        .route("/accounts/{open_id}/devices/{local_id}", post(submit))
        .route(
            "/unlocked/accounts/{open_id}/devices/{local_id}",
            post(submit_unlocked),
        )
        .route("/health", get(health))
        .with_state(app);
    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    println!("listening on http://{}", listener.local_addr()?);

    axum::serve(listener, routes)
        .with_graceful_shutdown(stop_signal())
        .await?;
    // Last: release whatever is still held, and wait for the releases of dropped leases.
    locker.shutdown().await?;
    println!("stopped; every lease released");
    Ok(())
}
