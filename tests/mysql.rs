//! The MySQL/MariaDB backend against the server on 127.0.0.1:3306 (or `DLOCK_MYSQL_URL`). Each
//! test uses a table of its own, so tests run in parallel.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backend::MysqlBackend;
use dlock::{distributed_lock, LockError, LockOptions, Locker, Owner};
use sqlx::mysql::MySqlPool;
use sqlx::{AssertSqlSafe, Row};
use support::mysql_url;

/// The scenarios MySQL shares with PostgreSQL and every store.
#[path = "mysql/scenarios.rs"]
mod scenarios;

/// A lock table of this test's own; dropped with it.
struct Mysql {
    table: String,
    admin: MySqlPool,
}

impl Mysql {
    async fn fresh() -> Mysql {
        let table = format!("dlock_test_{}", &Owner::random().to_string()[..12]);
        let admin = MySqlPool::connect(&mysql_url())
            .await
            .expect("MariaDB on 127.0.0.1:3306 (see scripts/test.sh)");
        Mysql { table, admin }
    }

    async fn locker(&self) -> Locker {
        Locker::with_backend(support::Store::backend(self).await)
    }

    async fn execute(&self, sql: String) -> u64 {
        sqlx::query(AssertSqlSafe(sql))
            .execute(&self.admin)
            .await
            .unwrap()
            .rows_affected()
    }
}

impl support::sql_store::SqlStore for Mysql {
    async fn fresh() -> Mysql {
        Mysql::fresh().await
    }

    fn url() -> String {
        mysql_url()
    }

    async fn backend_at(&self, url: &str) -> MysqlBackend {
        MysqlBackend::builder(url)
            .unwrap()
            .table(&self.table)
            .connect()
            .await
            .unwrap()
    }

    async fn rows(&self, key: &str) -> i64 {
        // A released row stays, owned by nobody.
        let sql = format!(
            "SELECT COUNT(*) FROM `{}` WHERE lock_key = ? AND owner <> ''",
            self.table
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(key.as_bytes())
            .fetch_one(&self.admin)
            .await
            .unwrap()
            .get(0)
    }

    async fn insert_expired_row(&self, key: &str) {
        let sql = format!(
            "INSERT INTO `{}` (lock_key, owner, fence, expires_at, created_at) VALUES (?, 'stranger', 1, UTC_TIMESTAMP(6) - INTERVAL 1 SECOND, \
             UTC_TIMESTAMP(6))",
            self.table
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(key.as_bytes())
            .execute(&self.admin)
            .await
            .unwrap();
    }

    async fn create_old_table(&self) {
        // The table as dlock 0.x created it, before holders were described.
        self.execute(format!(
            "CREATE TABLE `{}` (\
               `lock_key`   VARBINARY(255) NOT NULL, \
               `owner`      CHAR(32) CHARACTER SET ascii NOT NULL, \
               `fence`      BIGINT UNSIGNED NOT NULL, \
               `expires_at` DATETIME(6) NOT NULL, \
               `created_at` DATETIME(6) NOT NULL, \
               PRIMARY KEY (`lock_key`)) ENGINE=InnoDB",
            self.table
        ))
        .await;
    }

    async fn insert_held_row(&self, key: &str, owner: &str, fence: u64) {
        let sql = format!(
            "INSERT INTO `{}` (lock_key, owner, fence, expires_at, created_at) \
             VALUES (?, ?, ?, UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, UTC_TIMESTAMP(6))",
            self.table
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(key.as_bytes())
            .bind(owner)
            .bind(fence)
            .execute(&self.admin)
            .await
            .unwrap();
    }

    async fn insert_live_rows(&self, keys: &[String]) {
        let rows: Vec<String> = keys
            .iter()
            .map(|key| {
                let hex: String = key.bytes().map(|b| format!("{b:02X}")).collect();
                format!(
                    "(X'{hex}', 'stranger', 1, UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, UTC_TIMESTAMP(6))"
                )
            })
            .collect();
        self.execute(format!(
            "INSERT INTO `{}` (lock_key, owner, fence, expires_at, created_at) VALUES {}",
            self.table,
            rows.join(", ")
        ))
        .await;
    }

    async fn date_released_rows_ahead(&self) {
        self.execute(format!(
            "UPDATE `{}` SET expires_at = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR WHERE owner = ''",
            self.table
        ))
        .await;
    }

    async fn backend_leaving_the_table(&self) -> MysqlBackend {
        MysqlBackend::builder(&mysql_url())
            .unwrap()
            .table(&self.table)
            .create_table(false)
            .connect()
            .await
            .unwrap()
    }

    async fn hold_up_inserts_of(&self, key: &str) -> support::sql_store::RowLock {
        // A reader's `SELECT … FOR UPDATE` on the absent key holds a gap lock: an `INSERT` of
        // the key waits for its transaction, while a `DELETE` of the absent row does not.
        self.lock_row(key).await
    }

    async fn lock_row(&self, key: &str) -> support::sql_store::RowLock {
        let mut transaction = self.admin.begin().await.unwrap();
        let sql = format!(
            "SELECT * FROM `{}` WHERE lock_key = ? FOR UPDATE",
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

impl Drop for Mysql {
    fn drop(&mut self) {
        // The test's runtime is blocked in this `Drop`, and the admin pool with it.
        support::drop_mysql_table(&self.table);
    }
}

impl support::Store for Mysql {
    type Backend = MysqlBackend;

    // MySQL cannot tell a waiter that a row went, so waiting polls with back-off.
    const WAKES_WAITERS_ON_RELEASE: bool = false;
    const SERVES_IN_ARRIVAL_ORDER: bool = false;

    async fn backend(&self) -> MysqlBackend {
        MysqlBackend::builder(&mysql_url())
            .unwrap()
            .table(&self.table)
            .max_connections(4)
            .connect()
            .await
            .unwrap()
    }

    async fn take_away(&self, key: &str) {
        let sql = format!(
            "UPDATE `{}` SET owner = 'stranger', expires_at = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR WHERE lock_key = '{key}'",
            self.table
        );
        assert_eq!(self.execute(sql).await, 1, "`{key}` was not held");
    }

    async fn expire(&self, key: &str) {
        let sql = format!(
            "UPDATE `{}` SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE lock_key = '{key}'",
            self.table
        );
        assert_eq!(self.execute(sql).await, 1, "`{key}` was not held");
    }
}

lock_properties!(Mysql::fresh().await);

/// The account table of the `account_sync` example: no unique index on `open_id`.
async fn account_table(db: &Mysql) -> String {
    let table = format!("{}_account", db.table);
    db.execute(format!(
        "CREATE TABLE `{table}` (id BIGINT AUTO_INCREMENT PRIMARY KEY, open_id VARCHAR(64) NOT NULL, local_id VARCHAR(64) NOT NULL)"
    ))
    .await;
    table
}

async fn check_then_write(pool: &MySqlPool, table: &str, open_id: &str, local_id: &str) {
    let found = sqlx::query(AssertSqlSafe(format!(
        "SELECT id FROM `{table}` WHERE open_id = ? LIMIT 1"
    )))
    .bind(open_id)
    .fetch_optional(pool)
    .await
    .unwrap();
    // The gap between the check and the write that client retries fall into.
    tokio::time::sleep(Duration::from_millis(30)).await;
    let sql = match found {
        None => format!("INSERT INTO `{table}` (local_id, open_id) VALUES (?, ?)"),
        Some(_) => format!("UPDATE `{table}` SET local_id = ? WHERE open_id = ?"),
    };
    sqlx::query(AssertSqlSafe(sql))
        .bind(local_id)
        .bind(open_id)
        .execute(pool)
        .await
        .unwrap();
}

#[distributed_lock(key = "acct:<open_id>", ttl = "3s", locker = locker)]
async fn submit(
    locker: &Locker,
    pool: &MySqlPool,
    table: &str,
    open_id: &str,
    local_id: &str,
) -> Result<(), LockError> {
    check_then_write(pool, table, open_id, local_id).await;
    Ok(())
}

async fn rows_for(db: &Mysql, table: &str, open_id: &str) -> i64 {
    sqlx::query(AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM `{table}` WHERE open_id = ?"
    )))
    .bind(open_id)
    .fetch_one(&db.admin)
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_submits_leave_one_row_and_would_duplicate_without_the_lock() {
    let db = Mysql::fresh().await;
    let table = account_table(&db).await;
    let pool = MySqlPool::connect(&mysql_url()).await.unwrap();

    // Without the lock: check-then-insert races, and duplicates appear.
    let mut calls = Vec::new();
    for i in 0..10 {
        let (pool, table) = (pool.clone(), table.clone());
        calls.push(tokio::spawn(async move {
            check_then_write(&pool, &table, "unlocked", &format!("d{i}")).await
        }));
    }
    for call in calls {
        call.await.unwrap();
    }
    assert!(
        rows_for(&db, &table, "unlocked").await > 1,
        "the unlocked race should duplicate rows"
    );

    // With it: four processes' worth of lockers, ten concurrent retries each.
    let mut lockers = Vec::new();
    for _ in 0..4 {
        lockers.push(db.locker().await);
    }
    let (applied, discarded) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut calls = Vec::new();
    for i in 0..40 {
        let (locker, pool, table) = (lockers[i % 4].clone(), pool.clone(), table.clone());
        let (applied, discarded) = (applied.clone(), discarded.clone());
        calls.push(tokio::spawn(async move {
            match submit(&locker, &pool, &table, "oX7f", &format!("d{i}")).await {
                Ok(()) => applied.fetch_add(1, Ordering::SeqCst),
                Err(LockError::Busy { .. }) => discarded.fetch_add(1, Ordering::SeqCst),
                Err(other) => panic!("{other:?}"),
            };
        }));
    }
    for call in calls {
        call.await.unwrap();
    }
    assert_eq!(rows_for(&db, &table, "oX7f").await, 1);
    assert_eq!(
        applied.load(Ordering::SeqCst) + discarded.load(Ordering::SeqCst),
        40
    );
    assert!(applied.load(Ordering::SeqCst) >= 1);
    db.execute(format!("DROP TABLE `{table}`")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_holder_is_taken_over_only_after_expiry_by_the_database_clock() {
    let db = Mysql::fresh().await;
    let key = support::unique_key("dead");
    // Two clients whose sessions disagree about the time by a day.
    let early = MysqlBackend::builder(&mysql_url())
        .unwrap()
        .table(&db.table)
        .time_zone("-12:00")
        .connect()
        .await
        .unwrap();
    let late = MysqlBackend::builder(&mysql_url())
        .unwrap()
        .table(&db.table)
        .time_zone("+12:00")
        .connect()
        .await
        .unwrap();
    let (holder, rival) = (Locker::with_backend(early), Locker::with_backend(late));

    let ttl = Duration::from_secs(2);
    let acquired_at = Instant::now();
    let lease = holder
        .lock(&*key, LockOptions::new().ttl(ttl).renew(false))
        .await
        .unwrap();
    // The process "dies": no release, no renewal.
    std::mem::forget(lease);

    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(matches!(
        rival.lock(&*key, LockOptions::new()).await,
        Err(LockError::Busy { .. })
    ));
    let taken = rival
        .lock(&*key, LockOptions::new().wait(Duration::from_secs(10)))
        .await
        .unwrap();
    let after = acquired_at.elapsed();
    assert!(
        after >= ttl - Duration::from_millis(50),
        "taken over after {after:?}, before the ttl of {ttl:?}"
    );
    assert!(taken.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_statements_never_wait_on_a_business_transaction() {
    let db = Mysql::fresh().await;
    let locker = db.locker().await;
    let business = account_table(&db).await;
    let app_pool = MySqlPool::connect(&mysql_url()).await.unwrap();

    let mut tx = app_pool.begin().await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO `{business}` (open_id, local_id) VALUES ('a', 'b')"
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    // The transaction stays open across every lock statement below.
    let key = support::unique_key("tx");
    let lease = tokio::time::timeout(
        Duration::from_secs(5),
        locker.lock(&*key, LockOptions::new()),
    )
    .await
    .expect("acquire waited on the open transaction")
    .unwrap();
    // The lock row is committed on its own: another connection sees it while the business
    // transaction is still open, and its rollback does not take the lock away.
    let visible = sqlx::query(AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM `{}` WHERE lock_key = ?",
        db.table
    )))
    .bind(key.as_bytes())
    .fetch_one(&db.admin)
    .await
    .unwrap()
    .get::<i64, _>(0);
    assert_eq!(visible, 1);
    tx.rollback().await.unwrap();
    assert!(lease.is_held());
    tokio::time::timeout(Duration::from_secs(5), lease.release())
        .await
        .expect("release waited")
        .unwrap();
    db.execute(format!("DROP TABLE `{business}`")).await;
}

/// A key that fits the `lock_key` column as a mutex can be too long for it as a semaphore,
/// whose keys on the store are a few bytes longer: refused whole, under the key given, with a
/// reason that says by how much, and nothing left held.
#[tokio::test]
async fn a_permit_key_too_long_for_the_column_says_by_how_much() {
    let db = Mysql::fresh().await;
    let locker = db.locker().await;
    let key = "k".repeat(dlock::backend::MYSQL_MAX_KEY_BYTES - 5);
    locker
        .lock(&*key, LockOptions::new())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let wait = LockOptions::new().permits(2).wait(Duration::from_secs(1));
    match locker.lock(&*key, wait).await {
        Err(LockError::InvalidKey { key: named, reason }) => {
            assert_eq!(named, key);
            assert!(
                reason
                    .contains("with 2 permits the store holds it under keys up to 10 bytes longer"),
                "{reason}"
            );
            assert!(reason.contains("255"), "{reason}");
        }
        other => panic!("expected InvalidKey, got {other:?}"),
    }
    assert!(locker.list("").await.unwrap().is_empty());
}

#[tokio::test]
async fn bad_input_is_a_clear_error() {
    let db = Mysql::fresh().await;
    let locker = db.locker().await;
    let long = "k".repeat(300);
    match locker.lock(&*long, LockOptions::new()).await {
        Err(LockError::InvalidKey { reason, .. }) => assert!(reason.contains("255"), "{reason}"),
        other => panic!("expected InvalidKey, got {other:?}"),
    }

    let unreachable = tokio::time::timeout(
        Duration::from_secs(20),
        Locker::connect("mysql://root@127.0.0.1:1/test"),
    )
    .await
    .expect("an unreachable server must fail, not hang");
    let message = unreachable.unwrap_err().to_string();
    assert!(message.contains("cannot connect to MySQL"), "{message}");

    let url = mysql_url();
    let (scheme, rest) = url.split_once("://").unwrap();
    let (userinfo, host) = rest.split_once('@').unwrap();
    let user = userinfo.split(':').next().unwrap();
    let wrong = format!("{scheme}://{user}:wrong-password@{host}");
    let denied = tokio::time::timeout(Duration::from_secs(20), Locker::connect(&wrong))
        .await
        .expect("a wrong password must fail, not hang");
    let message = denied.unwrap_err().to_string();
    assert!(message.contains("Access denied"), "{message}");
    assert!(
        !message.contains("wrong-password"),
        "the password leaked into {message}"
    );
}

#[tokio::test]
async fn a_waiter_polls_within_its_wait_and_gets_in_after_the_release() {
    let db = Mysql::fresh().await;
    let (a, b) = (db.locker().await, db.locker().await);
    let key = support::unique_key("poll");
    let lease = a
        .lock(&*key, LockOptions::new().ttl(Duration::from_secs(60)))
        .await
        .unwrap();
    let started = Instant::now();
    let busy = b
        .lock(&*key, LockOptions::new().wait(Duration::from_millis(400)))
        .await;
    assert!(matches!(busy, Err(LockError::Busy { .. })));
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "gave up before its wait"
    );
    let waiter = tokio::spawn(async move {
        b.lock(&*key, LockOptions::new().wait(Duration::from_secs(30)))
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    lease.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter did not get in");
    assert!(got.unwrap().is_ok());
}

/// A service pool whose connections turn autocommit off would keep each lock row inside a
/// transaction nobody commits: other processes block on it, and a recycled connection's
/// rollback deletes a row its holder still trusts. Such a pool is refused when the store is
/// built, with an error that names the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_without_autocommit_is_refused_at_connect() {
    use sqlx::mysql::MySqlPoolOptions;
    use sqlx::Executor;

    let pool = MySqlPoolOptions::new()
        .max_connections(2)
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute("SET autocommit = 0").await?;
                Ok(())
            })
        })
        .connect(&mysql_url())
        .await
        .unwrap();
    match MysqlBackend::with_pool(pool).connect().await {
        Err(LockError::InvalidOptions { reason }) => {
            assert!(reason.contains("autocommit"), "{reason}")
        }
        Err(other) => panic!("refused with an error that does not name autocommit: {other}"),
        Ok(_) => panic!("a pool with autocommit off was accepted"),
    }
}
