//! The MySQL backend against the same two statements sent raw, in one run.
//!
//! ```text
//! cargo bench --features mysql --bench mysql      # DLOCK_MYSQL_URL overrides the server
//! ```
//!
//! - Uncontended: sequential acquire + release on distinct keys, through `Locker::lock` and
//!   `Lease::release`, against the same `INSERT` and `DELETE` sent raw through a pool of the same
//!   size. Target ≥ 0.9× raw.
//! - Contended: 8 tasks on one key, each critical section a read-then-write increment of a
//!   counter row; critical sections/s and lost updates (target 0).

use std::time::{Duration, Instant};

use dlock::backend::MysqlBackend;
use dlock::{LockOptions, Locker, Owner};
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, Row};

const PAIRS: usize = 2_000;
const ROUNDS: usize = 3;

fn url() -> String {
    std::env::var("DLOCK_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
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

async fn raw_pairs(pool: &MySqlPool, round: usize) -> Duration {
    let insert = "INSERT INTO `dlock_bench_raw` (lock_key, owner, fence, expires_at, created_at) VALUES (?, ?, \
                  LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))), \
                  UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6))";
    let delete = "DELETE FROM `dlock_bench_raw` WHERE lock_key = ? AND owner = ?";
    let started = Instant::now();
    for i in 0..PAIRS {
        let key = format!("bench:{round}:{i}");
        let owner = Owner::random().to_string();
        sqlx::query(insert)
            .bind(key.as_bytes())
            .bind(&owner)
            .bind(30_000_000u64)
            .execute(pool)
            .await
            .unwrap();
        sqlx::query(delete)
            .bind(key.as_bytes())
            .bind(&owner)
            .execute(pool)
            .await
            .unwrap();
    }
    started.elapsed()
}

async fn contended(locker: &Locker, pool: &MySqlPool, per_task: usize) -> (f64, i64) {
    sqlx::query("REPLACE INTO `dlock_bench_counter` (id, value) VALUES (1, 0)")
        .execute(pool)
        .await
        .unwrap();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (locker, pool) = (locker.clone(), pool.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..per_task {
                let lease = locker
                    .lock(
                        "bench:counter",
                        LockOptions::new().wait(Duration::from_secs(60)),
                    )
                    .await
                    .unwrap();
                let value: i64 =
                    sqlx::query("SELECT value FROM `dlock_bench_counter` WHERE id = 1")
                        .fetch_one(&pool)
                        .await
                        .unwrap()
                        .get(0);
                sqlx::query("UPDATE `dlock_bench_counter` SET value = ? WHERE id = 1")
                    .bind(value + 1)
                    .execute(&pool)
                    .await
                    .unwrap();
                lease.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = started.elapsed();
    let value: i64 = sqlx::query("SELECT value FROM `dlock_bench_counter` WHERE id = 1")
        .fetch_one(pool)
        .await
        .unwrap()
        .get(0);
    let total = 8 * per_task;
    (total as f64 / elapsed.as_secs_f64(), total as i64 - value)
}

#[tokio::main]
async fn main() {
    let backend = MysqlBackend::builder(&url())
        .unwrap()
        .table("dlock_bench")
        .connect()
        .await
        .unwrap();
    let locker = Locker::with_backend(backend);
    let pool = MySqlPoolOptions::new()
        .max_connections(10)
        .connect(&url())
        .await
        .unwrap();
    let ddl = MysqlBackend::ddl("dlock_bench_raw").unwrap();
    sqlx::query(AssertSqlSafe(ddl))
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE IF NOT EXISTS `dlock_bench_counter` (id INT PRIMARY KEY, value BIGINT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();

    let (mut best_dlock, mut best_raw) = (Duration::MAX, Duration::MAX);
    for round in 0..ROUNDS {
        best_dlock = best_dlock.min(dlock_pairs(&locker, round).await);
        best_raw = best_raw.min(raw_pairs(&pool, round).await);
    }
    let per_sec = |d: Duration| PAIRS as f64 / d.as_secs_f64();
    println!("[mysql uncontended: {PAIRS} acquire+release pairs, best of {ROUNDS}]");
    println!(
        "  raw INSERT + DELETE (baseline)  {:>8.0} pairs/s",
        per_sec(best_raw)
    );
    println!(
        "  dlock lock + release            {:>8.0} pairs/s   {:.2}x raw (target >= 0.9x)",
        per_sec(best_dlock),
        per_sec(best_dlock) / per_sec(best_raw)
    );
    let (rate, lost) = contended(&locker, &pool, 100).await;
    println!("[mysql contended: 8 tasks, one key, read-then-write counter]");
    println!("  {rate:>8.0} critical sections/s, {lost} lost updates (target 0)");
}
