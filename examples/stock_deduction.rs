//! Concurrent consumers over-sell stock.
//!
//! Order consumers read a SKU's stock, check it, and write it back decremented. Run side by
//! side, two consumers read the same count and both sell the last unit: the shop sells more than
//! it has. The fix is a lock per SKU, for instance in a MySQL lock table; a hot SKU is then split
//! into buckets, each with its own count and its own lock, chosen by a hash of the user id,
//! so that one hot row stops serialising every order.
//!
//! This example runs the three versions over the same orders and prints what each sold and how
//! fast. It locks on the in-memory store by default; `DLOCK_URL=mysql://root@127.0.0.1:3306/test`
//! runs it on a MySQL lock table, `DLOCK_URL=postgres://postgres@127.0.0.1:5432/test` on a
//! PostgreSQL one (any other store URL works too):
//!
//! ```text
//! cargo run --example stock_deduction
//! DLOCK_URL=mysql://root@127.0.0.1:3306/test cargo run --features mysql --example stock_deduction
//! DLOCK_URL=postgres://postgres@127.0.0.1:5432/test cargo run --features postgres --example stock_deduction
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::{distributed_lock, LockError, Locker};

const SKU: &str = "sku-1001";
const UNITS: u64 = 300;
const ORDERS: u64 = 400;
const CONSUMERS: u64 = 8;
const BUCKETS: u64 = 10;

/// The stock table: one count per (SKU, bucket), with a database round trip's latency.
#[derive(Default)]
struct StockTable {
    rows: Mutex<HashMap<(String, u64), u64>>,
}

impl StockTable {
    fn stocked(buckets: u64) -> Self {
        let table = StockTable::default();
        for bucket in 0..buckets {
            let share = UNITS / buckets + u64::from(bucket < UNITS % buckets);
            table
                .rows
                .lock()
                .unwrap()
                .insert((SKU.into(), bucket), share);
        }
        table
    }

    async fn read(&self, sku: &str, bucket: u64) -> u64 {
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.rows.lock().unwrap()[&(sku.to_owned(), bucket)]
    }

    async fn write(&self, sku: &str, bucket: u64, stock: u64) {
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.rows
            .lock()
            .unwrap()
            .insert((sku.to_owned(), bucket), stock);
    }

    fn remaining(&self) -> u64 {
        self.rows.lock().unwrap().values().sum()
    }
}

#[derive(Debug)]
enum OrderError {
    SoldOut,
    Lock(LockError),
}

impl From<LockError> for OrderError {
    fn from(error: LockError) -> Self {
        OrderError::Lock(error)
    }
}

/// Read, check, write: correct alone, wrong side by side.
async fn deduct_unlocked(table: &StockTable, sku: &str, bucket: u64) -> Result<(), OrderError> {
    let stock = table.read(sku, bucket).await;
    if stock == 0 {
        return Err(OrderError::SoldOut);
    }
    table.write(sku, bucket, stock - 1).await;
    Ok(())
}

/// The same deduction under one lock per SKU: every order queues on the same key.
#[distributed_lock(key = "stock:<sku>", ttl = "5s", wait = "30s")]
async fn deduct(table: &StockTable, sku: &str) -> Result<(), OrderError> {
    deduct_unlocked(table, sku, 0).await
}

/// One lock per bucket: the count and the lock of a bucket go together.
#[distributed_lock(key = "stock:<sku>:<bucket>", ttl = "5s", wait = "30s")]
async fn deduct_bucket(table: &StockTable, sku: &str, bucket: u64) -> Result<(), OrderError> {
    deduct_unlocked(table, sku, bucket).await
}

/// Tries the user's own bucket first, then the others in turn, each under its own lock, so a
/// bucket that sold out early does not turn away orders the SKU can still serve.
async fn deduct_bucketed(table: &StockTable, sku: &str, user: u64) -> Result<(), OrderError> {
    let home = user.wrapping_mul(0x9E37_79B9_7F4A_7C15) % BUCKETS;
    for step in 0..BUCKETS {
        match deduct_bucket(table, sku, (home + step) % BUCKETS).await {
            Err(OrderError::SoldOut) => continue,
            other => return other,
        }
    }
    Err(OrderError::SoldOut)
}

#[derive(Clone, Copy)]
enum Version {
    Unlocked,
    OneLock,
    Buckets,
}

struct Outcome {
    sold: u64,
    sold_out: u64,
    remaining: u64,
    elapsed: Duration,
}

/// `CONSUMERS` consumers take `ORDERS` orders off a shared queue.
async fn run(version: Version) -> Outcome {
    let table = Arc::new(match version {
        Version::Buckets => StockTable::stocked(BUCKETS),
        _ => StockTable::stocked(1),
    });
    let next_order = Arc::new(AtomicU64::new(0));
    let (sold, sold_out) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let started = Instant::now();
    let mut consumers = Vec::new();
    for _ in 0..CONSUMERS {
        let (table, next_order, sold, sold_out) = (
            table.clone(),
            next_order.clone(),
            sold.clone(),
            sold_out.clone(),
        );
        consumers.push(tokio::spawn(async move {
            loop {
                let user = next_order.fetch_add(1, Ordering::SeqCst);
                if user >= ORDERS {
                    break;
                }
                let result = match version {
                    Version::Unlocked => deduct_unlocked(&table, SKU, 0).await,
                    Version::OneLock => deduct(&table, SKU).await,
                    Version::Buckets => deduct_bucketed(&table, SKU, user).await,
                };
                match result {
                    Ok(()) => sold.fetch_add(1, Ordering::SeqCst),
                    Err(OrderError::SoldOut) => sold_out.fetch_add(1, Ordering::SeqCst),
                    Err(OrderError::Lock(error)) => panic!("lock failed: {error}"),
                };
            }
        }));
    }
    for consumer in consumers {
        consumer.await.expect("a consumer panicked");
    }
    Outcome {
        sold: sold.load(Ordering::SeqCst),
        sold_out: sold_out.load(Ordering::SeqCst),
        remaining: table.remaining(),
        elapsed: started.elapsed(),
    }
}

fn report(title: &str, outcome: &Outcome) -> f64 {
    let rate = ORDERS as f64 / outcome.elapsed.as_secs_f64();
    let oversold = outcome.sold.saturating_sub(UNITS);
    println!("{title}");
    println!(
        "  sold {} of {UNITS} units, {} orders turned away, {} left in stock, oversold {oversold}",
        outcome.sold, outcome.sold_out, outcome.remaining
    );
    println!(
        "  {:.0} orders/s ({:.2}s for {ORDERS} orders)",
        rate,
        outcome.elapsed.as_secs_f64()
    );
    rate
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let locker = match std::env::var("DLOCK_URL") {
        Ok(url) if !url.is_empty() => Locker::connect(&url).await?,
        _ => Locker::memory(),
    };
    println!(
        "locker: {locker:?}; {CONSUMERS} consumers, {ORDERS} orders for {UNITS} units of {SKU}\n"
    );
    dlock::set_default_locker(locker);

    report("without a lock", &run(Version::Unlocked).await);
    let one_lock = report(
        "\none lock per SKU: #[distributed_lock(key = \"stock:<sku>\")]",
        &run(Version::OneLock).await,
    );
    let buckets = report(
        &format!("\n{BUCKETS} buckets: #[distributed_lock(key = \"stock:<sku>:<bucket>\")]"),
        &run(Version::Buckets).await,
    );
    println!("\nbucketed throughput: {:.1}x one lock", buckets / one_lock);
    Ok(())
}
