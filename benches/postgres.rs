//! The PostgreSQL backend against what a hand-written lock would send, in one run.
//!
//! ```text
//! cargo bench --features postgres,mysql --bench postgres   # without mysql: no MySQL row
//! ```
//!
//! `DLOCK_POSTGRES_URL` overrides `postgres://postgres@127.0.0.1:5432/test`, and
//! `DLOCK_MYSQL_URL` overrides `mysql://root@127.0.0.1:3306/test`.
//!
//! Each workload runs on tokio's current-thread runtime, then on its multi-thread one.
//!
//! - Uncontended: sequential acquire + release on distinct keys, through `Locker::lock` and
//!   `Lease::release`, against two baselines, each through a pool of the backend's size: the
//!   same `INSERT … ON CONFLICT` and `DELETE` the backend sends, raw (target ≥ 0.9×), and a
//!   `pg_try_advisory_lock` + `pg_advisory_unlock` pair on one pooled connection. And the
//!   backend again without prepared statements (`prepared_statements(false)`: simple queries,
//!   values written in), on a table of its own.
//! - Contended: 8 tasks on one key, each critical section a read-then-write increment of a
//!   counter row on PostgreSQL; critical sections/s, lost updates (target 0), critical sections
//!   per worker (target: within 2× of each other), wait p50 / p99 / max (target max ≤ 25 ms).
//!   The same workload locked by dlock on MySQL, and by a raw `pg_try_advisory_lock` poller
//!   (1 ms between tries), the baseline. The counter stays on PostgreSQL throughout, so only the
//!   lock differs between rows.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::backend::PostgresBackend;
use dlock::{LockOptions, Locker, Owner};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Postgres, Row};

/// Uncontended pairs per round, and rounds (interleaved; each contender keeps its best).
const PAIRS: usize = 1_000;
const ROUNDS: usize = 5;
/// Contended critical sections per contender, shared by its workers.
const SECTIONS: u64 = 2_000;
/// Unmeasured critical sections before each contended run.
const WARM_UP_SECTIONS: u64 = 80;
const WORKERS: usize = 8;
/// A contender still running after this long stops where it is; its row says how far it got.
const CONTENDED_CAP: Duration = Duration::from_secs(30);
/// The backend's default pool size; the raw baselines get a pool of the same size.
const POOL_SIZE: u32 = 10;

const RAW_TABLE: &str = "dlock_bench_raw";
const COUNTER: &str = "dlock_bench_counter";

fn url() -> String {
    std::env::var("DLOCK_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// The backend's acquire statement on the raw table, word for word (see the backend's
/// `statements.rs`): the insert, and the holder's time left where the key is busy.
fn raw_acquire() -> String {
    let now_us = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint";
    format!(
        "WITH attempt AS ( \
           INSERT INTO {RAW_TABLE} AS held (lock_key, owner, fence, expires_at, created_at) \
           VALUES ($1, $2, {now_us}, clock_timestamp() + $3 * interval '1 microsecond', clock_timestamp()) \
           ON CONFLICT (lock_key) DO UPDATE SET owner = excluded.owner, \
             fence = GREATEST(held.fence + 1, excluded.fence), \
             expires_at = excluded.expires_at, created_at = excluded.created_at \
           WHERE held.expires_at <= clock_timestamp() OR held.owner = excluded.owner \
           RETURNING fence) \
         SELECT (SELECT fence FROM attempt), \
           (SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint \
            FROM {RAW_TABLE} WHERE lock_key = $1)"
    )
}

/// The backend's release statement on the raw table: the deletion, announced on a channel.
fn raw_release() -> String {
    format!(
        "WITH released AS (DELETE FROM {RAW_TABLE} WHERE lock_key = $1 AND owner = $2 RETURNING lock_key) \
         SELECT pg_notify('dlock_bench_raw', encode(lock_key, 'hex')) FROM released"
    )
}

async fn dlock_pairs(locker: &Locker, round: usize) -> Duration {
    let started = Instant::now();
    for i in 0..PAIRS {
        let lease = locker
            .lock(
                format!("bench:{round}:{i}"),
                LockOptions::new().renew(false),
            )
            .await
            .unwrap();
        lease.release().await.unwrap();
    }
    started.elapsed()
}

async fn table_pairs(pool: &PgPool, round: usize) -> Duration {
    let (acquire, release) = (raw_acquire(), raw_release());
    let started = Instant::now();
    for i in 0..PAIRS {
        let key = format!("bench:{round}:{i}");
        let owner = Owner::random().to_string();
        let fence: Option<i64> = sqlx::query(AssertSqlSafe(acquire.as_str()))
            .bind(key.as_bytes())
            .bind(&owner)
            .bind(30_000_000i64)
            .fetch_one(pool)
            .await
            .unwrap()
            .get(0);
        assert!(fence.is_some(), "{key} was busy in the raw table");
        let released = sqlx::query(AssertSqlSafe(release.as_str()))
            .bind(key.as_bytes())
            .bind(&owner)
            .fetch_all(pool)
            .await
            .unwrap();
        assert_eq!(released.len(), 1, "{key} was not released");
    }
    started.elapsed()
}

/// An advisory lock belongs to the session that took it: lock and unlock on one connection,
/// taken from the pool for the pair.
async fn advisory_pairs(pool: &PgPool, round: usize) -> Duration {
    let started = Instant::now();
    for i in 0..PAIRS {
        let key = format!("bench:{round}:{i}");
        let mut connection = pool.acquire().await.unwrap();
        let locked: bool =
            sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtextextended($1, 0))")
                .bind(&key)
                .fetch_one(&mut *connection)
                .await
                .unwrap();
        assert!(locked, "{key} was busy");
        let unlocked: bool =
            sqlx::query_scalar("SELECT pg_advisory_unlock(hashtextextended($1, 0))")
                .bind(&key)
                .fetch_one(&mut *connection)
                .await
                .unwrap();
        assert!(unlocked, "{key} was not unlocked");
    }
    started.elapsed()
}

/// A lock under contention: `acquire` waits (up to a minute) until it holds `key`.
trait Contender: Clone + Send + Sync + 'static {
    type Guard: Send;
    fn acquire(&self, key: &str) -> impl Future<Output = Self::Guard> + Send;
    fn release(&self, guard: Self::Guard) -> impl Future<Output = ()> + Send;
}

#[derive(Clone)]
struct Dlock(Locker);

impl Contender for Dlock {
    type Guard = dlock::Lease;
    async fn acquire(&self, key: &str) -> dlock::Lease {
        self.0
            .lock(key, LockOptions::new().wait(Duration::from_secs(60)))
            .await
            .unwrap()
    }
    async fn release(&self, lease: dlock::Lease) {
        lease.release().await.unwrap();
    }
}

/// `pg_try_advisory_lock` every millisecond until it is granted; the connection that holds the
/// lock is kept out of the pool until the unlock.
#[derive(Clone)]
struct AdvisoryPoller(PgPool);

impl Contender for AdvisoryPoller {
    type Guard = (PoolConnection<Postgres>, String);
    async fn acquire(&self, key: &str) -> (PoolConnection<Postgres>, String) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut connection = self.0.acquire().await.unwrap();
            let locked: bool =
                sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtextextended($1, 0))")
                    .bind(key)
                    .fetch_one(&mut *connection)
                    .await
                    .unwrap();
            if locked {
                return (connection, key.to_owned());
            }
            drop(connection);
            assert!(Instant::now() < deadline, "{key} stayed busy for a minute");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    async fn release(&self, (mut connection, key): (PoolConnection<Postgres>, String)) {
        let unlocked: bool =
            sqlx::query_scalar("SELECT pg_advisory_unlock(hashtextextended($1, 0))")
                .bind(&key)
                .fetch_one(&mut *connection)
                .await
                .unwrap();
        assert!(unlocked, "{key} was not unlocked");
    }
}

/// What one contended run measured.
struct Contended {
    sections_per_sec: f64,
    lost: i64,
    per_worker: Vec<u64>,
    /// Sorted.
    waits: Vec<Duration>,
}

impl Contended {
    fn wait(&self, p: f64) -> Duration {
        let last = self.waits.len().saturating_sub(1);
        self.waits
            .get((last as f64 * p).round() as usize)
            .copied()
            .unwrap_or_default()
    }
}

/// The critical section: read the counter, then write it back one higher.
async fn increment(pool: &PgPool) {
    let value: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT value FROM {COUNTER} WHERE id = 1"
    )))
    .fetch_one(pool)
    .await
    .unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {COUNTER} SET value = $1 WHERE id = 1"
    )))
    .bind(value + 1)
    .execute(pool)
    .await
    .unwrap();
}

/// `WORKERS` tasks take `key` in turn until `sections` critical sections are done between them.
async fn contended<C: Contender>(lock: C, key: &str, pool: &PgPool, sections: u64) -> Contended {
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {COUNTER} SET value = 0 WHERE id = 1"
    )))
    .execute(pool)
    .await
    .unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let waits = Arc::new(Mutex::new(Vec::with_capacity(sections as usize + WORKERS)));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let (lock, done, waits, pool, key) = (
            lock.clone(),
            done.clone(),
            waits.clone(),
            pool.clone(),
            key.to_owned(),
        );
        workers.push(tokio::spawn(async move {
            let mut mine = 0u64;
            while done.load(Ordering::SeqCst) < sections && started.elapsed() < CONTENDED_CAP {
                let asked = Instant::now();
                let guard = lock.acquire(&key).await;
                waits.lock().unwrap().push(asked.elapsed());
                increment(&pool).await;
                lock.release(guard).await;
                done.fetch_add(1, Ordering::SeqCst);
                mine += 1;
            }
            mine
        }));
    }
    let mut per_worker = Vec::new();
    for worker in workers {
        per_worker.push(worker.await.unwrap());
    }
    let elapsed = started.elapsed();
    let sections: u64 = per_worker.iter().sum();
    let counter: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT value FROM {COUNTER} WHERE id = 1"
    )))
    .fetch_one(pool)
    .await
    .unwrap();
    let mut waits = waits.lock().unwrap().clone();
    waits.sort();
    Contended {
        sections_per_sec: sections as f64 / elapsed.as_secs_f64(),
        lost: sections as i64 - counter,
        per_worker,
        waits,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn print_contended(name: &str, run: &Contended, baseline: &Contended) {
    let (min, max) = (
        run.per_worker.iter().min().unwrap(),
        run.per_worker.iter().max().unwrap(),
    );
    println!(
        "| {name} | {:.0} | {:.2}x | {} | {min}–{max} ({:.2}x) | {} / {} / {} |",
        run.sections_per_sec,
        run.sections_per_sec / baseline.sections_per_sec,
        run.lost,
        *max as f64 / (*min).max(1) as f64,
        ms(run.wait(0.5)),
        ms(run.wait(0.99)),
        ms(run.wait(1.0)),
    );
}

/// `lock`'s contended run, after a short one that fills the pools, so that no measured wait
/// includes opening a connection.
async fn measured<C: Contender>(lock: C, key: &str, pool: &PgPool) -> Contended {
    contended(lock.clone(), key, pool, WARM_UP_SECTIONS).await;
    contended(lock, key, pool, SECTIONS).await
}

/// The same workload locked by dlock on MySQL (the counter still on PostgreSQL).
#[cfg(feature = "mysql")]
async fn mysql_contended(pool: &PgPool) -> Option<Contended> {
    let url = std::env::var("DLOCK_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    let backend = dlock::backend::MysqlBackend::builder(&url)
        .unwrap()
        .table("dlock_bench")
        .connect()
        .await
        .unwrap();
    let locker = Locker::with_backend(backend);
    let run = measured(
        Dlock(locker.clone()),
        "bench:postgres-compared:counter",
        pool,
    )
    .await;
    locker.shutdown().await.unwrap();
    Some(run)
}

#[cfg(not(feature = "mysql"))]
async fn mysql_contended(_: &PgPool) -> Option<Contended> {
    None
}

/// Every workload on tokio's current-thread runtime, then on its multi-thread one: the flavour
/// alone moves the raw clients, whose connections live on it, by a factor of two or more on a
/// small machine, while dlock's statements run on its own background runtime either way.
fn main() {
    let started = Instant::now();
    let flavours = [
        (
            "current-thread",
            tokio::runtime::Builder::new_current_thread(),
        ),
        ("multi-thread", tokio::runtime::Builder::new_multi_thread()),
    ];
    for (flavour, mut runtime) in flavours {
        runtime
            .enable_all()
            .build()
            .unwrap()
            .block_on(suite(flavour));
    }
    println!("whole run: {:.0} s", started.elapsed().as_secs_f64());
}

async fn suite(flavour: &str) {
    let backend = PostgresBackend::builder(&url())
        .unwrap()
        .table("dlock_bench")
        .max_connections(POOL_SIZE)
        .connect()
        .await
        .unwrap();
    let locker = Locker::with_backend(backend);
    let simple = PostgresBackend::builder(&url())
        .unwrap()
        .table("dlock_bench_simple")
        .max_connections(POOL_SIZE)
        .prepared_statements(false)
        .connect()
        .await
        .unwrap();
    let simple = Locker::with_backend(simple);
    let pool = PgPoolOptions::new()
        .max_connections(POOL_SIZE)
        .connect(&url())
        .await
        .unwrap();
    // Two statements (the table and its waiters table): one simple query.
    let ddl = PostgresBackend::ddl(RAW_TABLE).unwrap();
    sqlx::raw_sql(AssertSqlSafe(ddl))
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {COUNTER} (id INT PRIMARY KEY, value BIGINT NOT NULL)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    // Rows a run cut short left behind would make keys busy.
    for table in ["dlock_bench", "dlock_bench_simple", RAW_TABLE] {
        sqlx::query(AssertSqlSafe(format!("DELETE FROM {table}")))
            .execute(&pool)
            .await
            .unwrap();
    }
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {COUNTER} (id, value) VALUES (1, 0) ON CONFLICT (id) DO NOTHING"
    )))
    .execute(&pool)
    .await
    .unwrap();

    let (mut best_dlock, mut best_table, mut best_advisory, mut best_simple) =
        (Duration::MAX, Duration::MAX, Duration::MAX, Duration::MAX);
    for round in 0..ROUNDS {
        best_table = best_table.min(table_pairs(&pool, round).await);
        best_dlock = best_dlock.min(dlock_pairs(&locker, round).await);
        best_advisory = best_advisory.min(advisory_pairs(&pool, round).await);
        best_simple = best_simple.min(dlock_pairs(&simple, round).await);
    }
    let per_sec = |d: Duration| PAIRS as f64 / d.as_secs_f64();
    let (dlock, table, advisory, simple_rate) = (
        per_sec(best_dlock),
        per_sec(best_table),
        per_sec(best_advisory),
        per_sec(best_simple),
    );
    println!(
        "[postgres uncontended, {flavour} runtime: {PAIRS} acquire+release pairs on distinct keys, pools of {POOL_SIZE}, best of {ROUNDS}]"
    );
    println!("| what | pairs/s | µs/pair | ratio |");
    println!("| --- | --- | --- | --- |");
    let row = |name: &str, rate: f64, ratio: &str| {
        println!("| {name} | {rate:.0} | {:.0} | {ratio} |", 1e6 / rate);
    };
    row(
        "raw INSERT … ON CONFLICT + DELETE (baseline)",
        table,
        "1.00",
    );
    row(
        "dlock lock + release",
        dlock,
        &format!("{:.2}x (target >= 0.9x)", dlock / table),
    );
    row(
        "raw pg_try_advisory_lock + pg_advisory_unlock (baseline)",
        advisory,
        "1.00",
    );
    row(
        "dlock lock + release",
        dlock,
        &format!("{:.2}x", dlock / advisory),
    );
    row(
        "dlock lock + release, simple queries (prepared_statements(false))",
        simple_rate,
        &format!(
            "{:.2}x of the raw baseline, {:.2}x of prepared",
            simple_rate / table,
            simple_rate / dlock
        ),
    );

    let poller = measured(
        AdvisoryPoller(pool.clone()),
        "bench:postgres-advisory:counter",
        &pool,
    )
    .await;
    let postgres = measured(Dlock(locker.clone()), "bench:postgres:counter", &pool).await;
    let mysql = mysql_contended(&pool).await;
    println!();
    println!(
        "[postgres contended, {flavour} runtime: {WORKERS} tasks, one key, {SECTIONS} read-then-write increments of a counter row on PostgreSQL]"
    );
    println!("| lock | critical sections/s | ratio | lost (target 0) | per worker, max ÷ min (target <= 2x) | wait p50 / p99 / max (target max <= 25 ms) |");
    println!("| --- | --- | --- | --- | --- | --- |");
    print_contended(
        "raw pg_try_advisory_lock, 1 ms poll (baseline)",
        &poller,
        &poller,
    );
    print_contended("dlock on PostgreSQL", &postgres, &poller);
    match &mysql {
        Some(mysql) => {
            print_contended("dlock on MySQL", mysql, &poller);
            println!(
                "dlock on PostgreSQL ÷ dlock on MySQL: {:.2}x critical sections/s (target > 1x)",
                postgres.sections_per_sec / mysql.sections_per_sec
            );
        }
        None => println!("(dlock on MySQL: build with --features postgres,mysql to compare)"),
    }
    locker.shutdown().await.unwrap();
    simple.shutdown().await.unwrap();
    pool.close().await;
    println!();
}
