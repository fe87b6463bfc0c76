//! The PostgreSQL backend against the server on 127.0.0.1:5432 (or `DLOCK_POSTGRES_URL`). Each
//! test uses a table of its own (and so a notification channel of its own), so tests run in
//! parallel.

mod support;

use std::time::{Duration, Instant};

use dlock::backend::{Backend, PostgresBackend, Renewal};
use dlock::{LockError, LockOptions, Locker, Owner};
use sqlx::postgres::PgPool;
use sqlx::{AssertSqlSafe, Connection, Row};
use support::postgres_url;

#[path = "postgres/channels.rs"]
mod channels;
#[path = "postgres/handoff.rs"]
mod handoff;
#[path = "postgres/line.rs"]
mod line;
#[path = "postgres/pgbouncer.rs"]
mod pgbouncer;
/// The scenarios PostgreSQL shares with MySQL and every store, on prepared statements and on
/// simple queries.
#[path = "postgres/scenarios.rs"]
mod scenarios;
#[path = "postgres/unclaimed.rs"]
mod unclaimed;

/// A lock table of this test's own; dropped with it. Its backends send prepared statements,
/// or simple queries where `PREPARED` is `false`.
struct Postgres<const PREPARED: bool = true> {
    table: String,
    admin: PgPool,
}

impl Postgres {
    async fn fresh() -> Postgres {
        Postgres::new_table().await
    }
}

impl<const PREPARED: bool> Postgres<PREPARED> {
    async fn new_table() -> Postgres<PREPARED> {
        let table = format!("dlock_test_{}", &Owner::random().to_string()[..12]);
        let admin = PgPool::connect(&postgres_url())
            .await
            .expect("PostgreSQL on 127.0.0.1:5432 (see scripts/test.sh)");
        Postgres { table, admin }
    }

    async fn locker(&self) -> Locker {
        Locker::with_backend(support::Store::backend(self).await)
    }

    /// Runs `sql` with `key` as `$1`; the rows it changed.
    async fn execute_on(&self, sql: String, key: &str) -> u64 {
        sqlx::query(AssertSqlSafe(sql))
            .bind(key.as_bytes())
            .execute(&self.admin)
            .await
            .unwrap()
            .rows_affected()
    }

    /// How many rows the table holds for `key` under an owner: a released row stays, owned by
    /// nobody (`''`), for the key's next grant to take over.
    async fn rows(&self, key: &str) -> i64 {
        let sql = format!(
            "SELECT COUNT(*) FROM \"{}\" WHERE lock_key = $1 AND owner <> ''",
            self.table
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(key.as_bytes())
            .fetch_one(&self.admin)
            .await
            .unwrap()
            .get(0)
    }

    /// Writes `key`'s row for a holder that died: it expires `left` from now, and nobody will
    /// release it (so no release is announced).
    async fn insert_row_of_a_dead_holder(&self, key: &str, left: Duration) {
        let sql = format!(
            "INSERT INTO \"{}\" (lock_key, owner, fence, expires_at, created_at) VALUES ($1, 'dead', 1, clock_timestamp() + interval '{} milliseconds', \
             clock_timestamp())",
            self.table,
            left.as_millis()
        );
        self.execute_on(sql, key).await;
    }

    /// Makes a release's hand-over statement (and no other) sleep `pause` before it writes (a
    /// statement-level trigger that recognises it by its text, and takes no row lock).
    async fn hold_up_hand_overs(&self, pause: Duration) {
        let table = &self.table;
        for sql in [
            format!(
                "CREATE FUNCTION \"{table}_hold\"() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN IF current_query() LIKE '%handed AS%' THEN PERFORM pg_sleep({}); END IF; \
                 RETURN NULL; END $$",
                pause.as_secs_f64()
            ),
            format!(
                "CREATE TRIGGER \"{table}_hold\" BEFORE UPDATE ON \"{table}\" \
                 FOR EACH STATEMENT EXECUTE FUNCTION \"{table}_hold\"()"
            ),
        ] {
            sqlx::query(AssertSqlSafe(sql))
                .execute(&self.admin)
                .await
                .unwrap();
        }
    }

    /// Makes a release statement (a plain release, and the undo of a grant nobody claimed, which
    /// releases by its fence) sleep `pause` before it looks for its row (a statement-level
    /// trigger that recognises it by its text, and takes no row lock).
    async fn hold_up_releases(&self, pause: Duration) {
        let table = &self.table;
        for sql in [
            format!(
                "CREATE FUNCTION \"{table}_release\"() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN IF current_query() LIKE 'WITH released AS (UPDATE%' THEN PERFORM pg_sleep({}); END IF; \
                 RETURN NULL; END $$",
                pause.as_secs_f64()
            ),
            format!(
                "CREATE TRIGGER \"{table}_release\" BEFORE UPDATE ON \"{table}\" \
                 FOR EACH STATEMENT EXECUTE FUNCTION \"{table}_release\"()"
            ),
        ] {
            sqlx::query(AssertSqlSafe(sql))
                .execute(&self.admin)
                .await
                .unwrap();
        }
    }

    /// The fence of `key`'s row, if there is one.
    async fn fence(&self, key: &str) -> Option<i64> {
        let sql = format!("SELECT fence FROM \"{}\" WHERE lock_key = $1", self.table);
        sqlx::query(AssertSqlSafe(sql))
            .bind(key.as_bytes())
            .fetch_optional(&self.admin)
            .await
            .unwrap()
            .map(|row| row.get(0))
    }

    /// Undoes [`slow_down`](Self::slow_down).
    async fn stop_slowing_down(&self) {
        let sql = format!("DROP TRIGGER \"{0}_pause\" ON \"{0}\"", self.table);
        sqlx::query(AssertSqlSafe(sql))
            .execute(&self.admin)
            .await
            .unwrap();
    }

    /// Makes every `command` (`DELETE`, `UPDATE`) of the lock table sleep `pause` before it
    /// looks for its rows (a statement-level trigger, which takes no row lock while it sleeps).
    async fn slow_down(&self, command: &str, pause: Duration) {
        let table = &self.table;
        for sql in [
            format!(
                "CREATE FUNCTION \"{table}_pause\"() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN PERFORM pg_sleep({}); RETURN NULL; END $$",
                pause.as_secs_f64()
            ),
            format!(
                "CREATE TRIGGER \"{table}_pause\" BEFORE {command} ON \"{table}\" \
                 FOR EACH STATEMENT EXECUTE FUNCTION \"{table}_pause\"()"
            ),
        ] {
            sqlx::query(AssertSqlSafe(sql))
                .execute(&self.admin)
                .await
                .unwrap();
        }
    }
}

impl<const PREPARED: bool> support::sql_store::SqlStore for Postgres<PREPARED> {
    async fn fresh() -> Postgres<PREPARED> {
        Postgres::new_table().await
    }

    fn url() -> String {
        postgres_url()
    }

    async fn backend_at(&self, url: &str) -> PostgresBackend {
        PostgresBackend::builder(url)
            .unwrap()
            .table(&self.table)
            .prepared_statements(PREPARED)
            .connect()
            .await
            .unwrap()
    }

    async fn rows(&self, key: &str) -> i64 {
        Postgres::<PREPARED>::rows(self, key).await
    }

    async fn insert_expired_row(&self, key: &str) {
        let sql = format!(
            "INSERT INTO \"{}\" (lock_key, owner, fence, expires_at, created_at) VALUES ($1, 'stranger', 1, clock_timestamp() - interval '1 second', \
             clock_timestamp())",
            self.table
        );
        self.execute_on(sql, key).await;
    }

    async fn create_old_table(&self) {
        // The tables as dlock 0.x created them, before holders were described.
        let sql = format!(
            "CREATE TABLE \"{0}\" (lock_key BYTEA NOT NULL PRIMARY KEY, owner TEXT NOT NULL, \
               fence BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL, created_at TIMESTAMPTZ NOT NULL); \
             CREATE TABLE \"{0}_waiters\" (lock_key BYTEA NOT NULL, waiter TEXT NOT NULL, \
               ticket BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL, PRIMARY KEY (lock_key, waiter))",
            self.table
        );
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&self.admin)
            .await
            .unwrap();
    }

    async fn insert_held_row(&self, key: &str, owner: &str, fence: u64) {
        let sql = format!(
            "INSERT INTO \"{}\" (lock_key, owner, fence, expires_at, created_at) \
             VALUES ($1, $2, $3, clock_timestamp() + interval '1 hour', clock_timestamp())",
            self.table
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(key.as_bytes())
            .bind(owner)
            .bind(fence as i64)
            .execute(&self.admin)
            .await
            .unwrap();
    }

    async fn insert_live_rows(&self, keys: &[String]) {
        let rows: Vec<String> = keys
            .iter()
            .map(|key| {
                let hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
                format!(
                    "(decode('{hex}', 'hex'), 'stranger', 1, clock_timestamp() + interval '1 hour', clock_timestamp())"
                )
            })
            .collect();
        let sql = format!(
            "INSERT INTO \"{}\" (lock_key, owner, fence, expires_at, created_at) VALUES {}",
            self.table,
            rows.join(", ")
        );
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&self.admin)
            .await
            .unwrap();
    }

    async fn date_released_rows_ahead(&self) {
        let sql = format!(
            "UPDATE \"{}\" SET expires_at = clock_timestamp() + interval '1 hour' WHERE owner = ''",
            self.table
        );
        sqlx::query(AssertSqlSafe(sql))
            .execute(&self.admin)
            .await
            .unwrap();
    }

    async fn backend_leaving_the_table(&self) -> PostgresBackend {
        PostgresBackend::builder(&postgres_url())
            .unwrap()
            .table(&self.table)
            .prepared_statements(PREPARED)
            .create_table(false)
            .connect()
            .await
            .unwrap()
    }

    async fn hold_up_inserts_of(&self, key: &str) -> support::sql_store::RowLock {
        // An uncommitted insert of the key: a second insert of it waits for that transaction.
        let mut transaction = self.admin.begin().await.unwrap();
        let sql = format!(
            "INSERT INTO \"{}\" (lock_key, owner, fence, expires_at, created_at) VALUES ($1, 'blocker', 1, clock_timestamp() - interval '1 second', \
             clock_timestamp())",
            self.table
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(key.as_bytes())
            .execute(&mut *transaction)
            .await
            .unwrap();
        Box::new(transaction)
    }

    async fn lock_row(&self, key: &str) -> support::sql_store::RowLock {
        let mut transaction = self.admin.begin().await.unwrap();
        let sql = format!(
            "SELECT * FROM \"{}\" WHERE lock_key = $1 FOR UPDATE",
            self.table
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(key.as_bytes())
            .fetch_all(&mut *transaction)
            .await
            .unwrap();
        Box::new(transaction)
    }
}

impl<const PREPARED: bool> Drop for Postgres<PREPARED> {
    fn drop(&mut self) {
        // The test's runtime is blocked in this `Drop`, and the admin pool with it.
        support::drop_postgres_table(&self.table);
    }
}

impl<const PREPARED: bool> support::Store for Postgres<PREPARED> {
    type Backend = PostgresBackend;

    // A release NOTIFYs the backend's listener; each backend queues its waiters in arrival
    // order (the property suite's waiters share one locker).

    async fn backend(&self) -> PostgresBackend {
        PostgresBackend::builder(&postgres_url())
            .unwrap()
            .table(&self.table)
            .max_connections(4)
            .prepared_statements(PREPARED)
            .connect()
            .await
            .unwrap()
    }

    async fn take_away(&self, key: &str) {
        let sql = format!(
            "UPDATE \"{}\" SET owner = 'stranger', expires_at = clock_timestamp() + interval '1 hour' WHERE lock_key = $1",
            self.table
        );
        assert_eq!(self.execute_on(sql, key).await, 1, "`{key}` was not held");
    }

    async fn expire(&self, key: &str) {
        let sql = format!(
            "UPDATE \"{}\" SET expires_at = clock_timestamp() - interval '1 second' WHERE lock_key = $1",
            self.table
        );
        assert_eq!(self.execute_on(sql, key).await, 1, "`{key}` was not held");
    }
}

lock_properties!(Postgres::fresh().await);

/// A resource that takes a write only with a fence above the last one it took, as a fenced
/// store would.
async fn fenced_write(db: &Postgres, resource: &str, fence: u64) -> bool {
    let sql = format!("UPDATE \"{resource}\" SET fence = $1 WHERE fence < $1");
    sqlx::query(AssertSqlSafe(sql))
        .bind(fence as i64)
        .execute(&db.admin)
        .await
        .unwrap()
        .rows_affected()
        == 1
}

/// A holder paused while its row was deleted (by a clean-up, by hand) and the key taken by
/// another: the new row's fence is above the old one, so the paused holder's late write is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_fence_is_refused_after_the_row_was_deleted_and_created_again() {
    let db = Postgres::fresh().await;
    let (paused, next) = (db.locker().await, db.locker().await);
    let key = support::unique_key("fenced");
    let resource = format!("{}_resource", db.table);
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE \"{resource}\" (fence BIGINT NOT NULL); INSERT INTO \"{resource}\" VALUES (0)"
    )))
    .execute(&db.admin)
    .await
    .unwrap();

    let old = paused
        .lock(&*key, LockOptions::new().renew(false))
        .await
        .unwrap();
    let deleted = format!("DELETE FROM \"{}\" WHERE lock_key = $1", db.table);
    assert_eq!(db.execute_on(deleted, &key).await, 1);
    let new = next.lock(&*key, LockOptions::new()).await.unwrap();
    assert!(
        new.fence() > old.fence(),
        "fence {} after {} across the row's deletion",
        new.fence(),
        old.fence()
    );
    assert!(fenced_write(&db, &resource, new.fence()).await);
    assert!(
        !fenced_write(&db, &resource, old.fence()).await,
        "the paused holder's stale write went through"
    );
    // And across a release, which deletes the row too.
    let new_fence = new.fence();
    new.release().await.unwrap();
    let after_release = paused.lock(&*key, LockOptions::new()).await.unwrap();
    assert!(after_release.fence() > new_fence);
    sqlx::query(AssertSqlSafe(format!("DROP TABLE \"{resource}\"")))
        .execute(&db.admin)
        .await
        .unwrap();
}

/// A try whose statement read the clock and then stalled before its insert, while another
/// acquisition was granted the key and released it, still gets a fence above that one's: the
/// release kept the row, and the late statement takes it over with a fence above its last
/// (deleted, the row would be written fresh with the clock the statement read first). The stall
/// is a trigger that waits on an advisory lock for the try labelled `late`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_stalled_before_its_insert_gets_a_fence_above_a_grant_made_meanwhile() {
    let db = Postgres::fresh().await;
    let (late, quick) = (db.locker().await, db.locker().await);
    let key = support::unique_key("stalled-insert");
    let table = &db.table;
    let mut blocker = sqlx::postgres::PgConnection::connect(&postgres_url())
        .await
        .unwrap();
    for sql in [
        format!(
            "CREATE FUNCTION \"{table}_stall\"() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN IF NEW.label = convert_to('late', 'UTF8') THEN \
             PERFORM pg_advisory_xact_lock(424242); END IF; RETURN NEW; END $$"
        ),
        format!(
            "CREATE TRIGGER \"{table}_stall\" BEFORE INSERT ON \"{table}\" \
             FOR EACH ROW EXECUTE FUNCTION \"{table}_stall\"()"
        ),
    ] {
        sqlx::query(AssertSqlSafe(sql))
            .execute(&db.admin)
            .await
            .unwrap();
    }
    sqlx::query("SELECT pg_advisory_lock(424242)")
        .execute(&mut blocker)
        .await
        .unwrap();

    let stalled = tokio::spawn({
        let key = key.clone();
        async move {
            late.lock(
                &*key,
                LockOptions::new()
                    .label("late")
                    .wait(Duration::from_secs(10)),
            )
            .await
        }
    });
    // The late try has read the clock and waits in the trigger.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!stalled.is_finished(), "the late try did not stall");
    let meanwhile = quick.lock(&*key, LockOptions::new()).await.unwrap();
    let meanwhile_fence = meanwhile.fence();
    meanwhile.release().await.unwrap();
    sqlx::query("SELECT pg_advisory_unlock(424242)")
        .execute(&mut blocker)
        .await
        .unwrap();

    let lease = stalled.await.unwrap().unwrap();
    assert!(
        lease.fence() > meanwhile_fence,
        "the stalled try got fence {} after a grant of fence {} came and went",
        lease.fence(),
        meanwhile_fence
    );
    lease.release().await.unwrap();
}

/// A waiter in another backend (another process, as far as the database can tell) gets the key
/// within moments of the release, announced by NOTIFY, having sent one statement to find it
/// busy and one to take it: not a poll every few milliseconds while it waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_elsewhere_is_woken_by_the_release_without_polling() {
    let db = Postgres::fresh().await;
    let holder = db.locker().await;
    let waiting_backend = support::Store::backend(&db).await;
    let waiter = Locker::with_backend(waiting_backend.clone());
    let key = support::unique_key("notify");
    let lease = holder
        .lock(&*key, LockOptions::new().ttl(Duration::from_secs(60)))
        .await
        .unwrap();
    let before = waiting_backend.statements();
    let waiting = tokio::spawn({
        let key = key.clone();
        async move {
            let lease = waiter
                .lock(&*key, LockOptions::new().wait(Duration::from_secs(30)))
                .await;
            (lease.map(|lease| lease.fence()), Instant::now(), waiter)
        }
    });
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let released_at = Instant::now();
    lease.release().await.unwrap();
    let (fence, entered_at, _waiter) = waiting.await.unwrap();
    assert!(fence.is_ok(), "{fence:?}");
    let latency = entered_at - released_at;
    assert!(
        latency < Duration::from_millis(300),
        "the waiter got in {latency:?} after the release"
    );
    let sent = waiting_backend.statements() - before;
    assert!(
        sent <= 3,
        "the waiter sent {sent} statements over 1.5 s of waiting: it polled"
    );
}

/// With its listening connection killed, a waiter still gets the key soon after the release
/// (it polls while nobody listens, and the listener comes back by itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_gets_in_after_the_listener_connection_was_killed() {
    let db = Postgres::fresh().await;
    let backend = support::Store::backend(&db).await;
    let channel = backend.channel().to_owned();
    let (holder, waiter) = (Locker::with_backend(backend), db.locker().await);
    let key = support::unique_key("deaf");
    let lease = holder
        .lock(&*key, LockOptions::new().ttl(Duration::from_secs(60)))
        .await
        .unwrap();
    let waiting = tokio::spawn({
        let key = key.clone();
        async move {
            waiter
                .lock(&*key, LockOptions::new().wait(Duration::from_secs(30)))
                .await
                .map(|lease| lease.fence())
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed: i64 = sqlx::query(
        "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name = 'dlock listener' AND query LIKE '%LISTEN%' AND query LIKE $1",
    )
    .bind(format!("%{channel}%"))
    .fetch_one(&db.admin)
    .await
    .unwrap()
    .get(0);
    assert_eq!(killed, 2, "both backends' listeners were found");
    let released_at = Instant::now();
    lease.release().await.unwrap();
    let taken = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the waiter did not get in after the release");
    assert!(taken.unwrap().is_ok());
    assert!(released_at.elapsed() < Duration::from_secs(3));
}

/// Renewing many leases, of different ttls and owners, is one statement, which answers for each
/// lease on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewing_many_leases_is_one_statement() {
    let db = Postgres::fresh().await;
    let backend = support::Store::backend(&db).await;
    let locker = Locker::with_backend(backend.clone());
    let mut leases = Vec::new();
    for i in 0..300 {
        let ttl = Duration::from_millis(30_000 + 1_000 * (i % 7));
        let options = LockOptions::new().ttl(ttl).renew(false);
        leases.push(
            locker
                .lock(support::unique_key("many"), options)
                .await
                .unwrap(),
        );
    }
    let stranger = Owner::random();
    let mut renewals: Vec<Renewal<'_>> = leases
        .iter()
        .map(|lease| Renewal::new(lease.key(), lease.owner(), Duration::from_secs(45)))
        .collect();
    renewals.push(Renewal::new(
        leases[0].key(),
        stranger,
        Duration::from_secs(45),
    ));
    let before = backend.statements();
    let held = backend.renew(&renewals).await.unwrap();
    assert_eq!(
        backend.statements() - before,
        1,
        "one statement for every lease"
    );
    assert_eq!(held.len(), 301);
    assert!(
        held[..300].iter().all(|held| *held),
        "a lease was not renewed"
    );
    assert!(!held[300], "a stranger's renewal took effect");
    let left: f64 = sqlx::query(AssertSqlSafe(format!(
        "SELECT extract(epoch FROM min(expires_at) - clock_timestamp())::float8 FROM \"{}\"",
        db.table
    )))
    .fetch_one(&db.admin)
    .await
    .unwrap()
    .get(0);
    assert!(
        left > 40.0,
        "the renewal did not extend every lease: {left} s left"
    );
}

#[tokio::test]
async fn both_schemes_connect_and_bad_input_is_a_clear_error() {
    let db = Postgres::fresh().await;
    let url = postgres_url();
    let table_url = |scheme: &str| {
        let rest = url.split_once("://").unwrap().1;
        let separator = if rest.contains('?') { '&' } else { '?' };
        format!("{scheme}://{rest}{separator}table={}", db.table)
    };
    for scheme in ["postgres", "postgresql"] {
        let locker = Locker::connect(&table_url(scheme)).await.unwrap();
        let key = support::unique_key(scheme);
        let lease = locker.lock(&*key, LockOptions::new()).await.unwrap();
        assert_eq!(db.rows(&key).await, 1, "the URL's table was not used");
        lease.release().await.unwrap();
        locker.shutdown().await.unwrap();
    }

    let locker = db.locker().await;
    let long = "k".repeat(dlock::backend::POSTGRES_MAX_KEY_BYTES + 1);
    match locker.lock(&*long, LockOptions::new()).await {
        Err(LockError::InvalidKey { reason, .. }) => assert!(reason.contains("2048"), "{reason}"),
        other => panic!("expected InvalidKey, got {other:?}"),
    }

    let unreachable = tokio::time::timeout(
        Duration::from_secs(20),
        Locker::connect("postgres://postgres:secret@127.0.0.1:1/test?connect_timeout=500ms"),
    )
    .await
    .expect("an unreachable server must fail, not hang");
    let message = unreachable.unwrap_err().to_string();
    assert!(
        message.contains("cannot connect to PostgreSQL"),
        "{message}"
    );
    assert!(
        !message.contains("secret"),
        "the password leaked into {message}"
    );
}

/// On the service's own pool: the locks use it, and shutdown leaves it open but stops the
/// backend's listening connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locker_on_the_service_pool_leaves_it_open_at_shutdown() {
    let db = Postgres::fresh().await;
    let pool = PgPool::connect(&postgres_url()).await.unwrap();
    let backend = PostgresBackend::with_pool(pool.clone())
        .table(&db.table)
        .connect()
        .await
        .unwrap();
    let locker = Locker::with_backend(backend);
    let key = support::unique_key("pool");
    let lease = locker.lock(&*key, LockOptions::new()).await.unwrap();
    assert_eq!(db.rows(&key).await, 1);
    drop(lease);
    locker.health().await.unwrap();
    locker.shutdown().await.unwrap();
    assert_eq!(db.rows(&key).await, 0, "shutdown left the lease");
    let one: i32 = sqlx::query("SELECT 1")
        .fetch_one(&pool)
        .await
        .expect("the service's pool was closed")
        .get(0);
    assert_eq!(one, 1);
    let listening = || async {
        sqlx::query(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = 'dlock listener' AND query LIKE $1",
        )
        .bind(format!("%{}%", db.table))
        .fetch_one(&db.admin)
        .await
        .unwrap()
        .get::<i64, _>(0)
    };
    let started = Instant::now();
    while listening().await > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the listener outlived shutdown"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sent as simple queries (`prepared_statements(false)`), the statements leave no prepared
/// statement on the connections they ran on, which a pooler would hand on to other clients:
/// every kind of them (a try that finds the key busy and takes a place in line, the place kept
/// and given up, a grant, a renewal, a release). Sent prepared, they leave theirs, as this test
/// checks too, so that it can tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simple_queries_leave_no_prepared_statement_on_the_connections() {
    let db = Postgres::fresh().await;
    for prepared in [true, false] {
        // Two connections (one for the tries, and one for the rest), both looked at below.
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect(&postgres_url())
            .await
            .unwrap();
        let backend = PostgresBackend::with_pool(pool.clone())
            .table(&db.table)
            .prepared_statements(prepared)
            .connect()
            .await
            .unwrap();
        let locker = Locker::with_backend(backend.clone());
        let key = support::unique_key("nothing-left");
        let lease = locker
            .lock(&*key, LockOptions::new().renew(false))
            .await
            .unwrap();
        // Waits in line past a keeping of its place, then gives it up.
        let waited = locker
            .lock(&*key, LockOptions::new().wait(Duration::from_millis(1_500)))
            .await;
        assert!(matches!(waited, Err(LockError::Busy { .. })), "{waited:?}");
        let renewal = [Renewal::new(
            lease.key(),
            lease.owner(),
            Duration::from_secs(30),
        )];
        assert_eq!(backend.renew(&renewal).await.unwrap(), [true]);
        lease.release().await.unwrap();
        locker.shutdown().await.unwrap();

        let mut prepared_left = 0;
        let connections = [pool.acquire().await.unwrap(), pool.acquire().await.unwrap()];
        for mut connection in connections {
            // A simple query, which prepares nothing itself.
            let row = sqlx::raw_sql("SELECT count(*) FROM pg_prepared_statements")
                .fetch_one(&mut *connection)
                .await
                .unwrap();
            prepared_left += row.get::<i64, _>(0);
        }
        if prepared {
            assert!(
                prepared_left > 0,
                "no prepared statement seen: the test cannot tell"
            );
        } else {
            assert_eq!(prepared_left, 0, "simple queries left prepared statements");
        }
        pool.close().await;
    }
}

/// A simple query's rows come as text, keys included: they read back the same where the
/// session writes `bytea` in the old escape format rather than in hex.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simple_queries_read_keys_back_whatever_the_bytea_output() {
    let db = Postgres::fresh().await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .after_connect(|connection, _| {
            Box::pin(async move {
                sqlx::raw_sql("SET bytea_output = 'escape'")
                    .execute(connection)
                    .await
                    .map(drop)
            })
        })
        .connect(&postgres_url())
        .await
        .unwrap();
    let backend = PostgresBackend::with_pool(pool)
        .table(&db.table)
        .prepared_statements(false)
        .connect()
        .await
        .unwrap();
    let locker = Locker::with_backend(backend.clone());
    let lease = locker
        .lock("key \\ with ' odd é bytes", LockOptions::new().renew(false))
        .await
        .unwrap();
    let renewal = [Renewal::new(
        lease.key(),
        lease.owner(),
        Duration::from_secs(30),
    )];
    assert_eq!(backend.renew(&renewal).await.unwrap(), [true]);
    lease.release().await.unwrap();
}
