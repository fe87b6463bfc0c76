//! At most three calls at once to a partner's API, across every instance of the service.
//!
//! The account story's shipping partner allows each client three concurrent requests and
//! answers the fourth with `429 Too Many Requests`, which the service must then retry later.
//! Three instances of the service, each with four workers, push 60 label requests through it. A
//! lock per instance cannot help (each instance alone stays under the limit, together they do
//! not), and a mutex would allow one call at a time where three are paid for.
//! `#[distributed_lock(permits = 3)]` is a semaphore on the key: at most three bodies at once,
//! across processes, each with its own lease, and the waiting workers served in turn.
//!
//! Locks on the in-memory store by default; `DLOCK_URL` (`redis://…`, `mysql://…`,
//! `postgres://…`, `zk://…`, with the store's feature enabled) runs it on a real one.
//!
//! ```text
//! cargo run --example partner_api
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{distributed_lock, LockError, Locker};

const INSTANCES: usize = 3;
const WORKERS: usize = 4;
const REQUESTS: u64 = 60;

/// The partner's side: three requests in flight per client, a `429` for any more.
#[derive(Default)]
struct Partner {
    in_flight: AtomicU64,
    most_in_flight: AtomicU64,
    served: AtomicU64,
    refused: AtomicU64,
}

impl Partner {
    const LIMIT: u64 = 3;

    /// One label request: 20 ms of the partner's time, unless it is over the limit.
    async fn create_label(&self) -> Result<(), &'static str> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        let answer = if now > Self::LIMIT {
            self.refused.fetch_add(1, Ordering::SeqCst);
            Err("429 Too Many Requests")
        } else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            self.served.fetch_add(1, Ordering::SeqCst);
            Ok(())
        };
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        answer
    }
}

/// The call as first written: straight to the partner.
async fn create_label_unlimited(partner: &Partner) -> Result<(), &'static str> {
    partner.create_label().await
}

/// The call through a semaphore of three permits, shared by every instance.
#[distributed_lock(key = "partner:shipping", permits = 3, wait = "30s", locker = locker)]
async fn create_label_limited(locker: &Locker, partner: &Partner) -> Result<(), LockError> {
    // Inside, at most three calls at once: never refused for the limit.
    partner
        .create_label()
        .await
        .expect("refused inside the semaphore");
    Ok(())
}

/// Runs the 60 requests through `INSTANCES` × `WORKERS` workers; a refused request is tried
/// again after 5 ms, as a client of a rate-limited API would. Returns the time it took.
async fn run<F, Fut>(instances: &[Locker], partner: Arc<Partner>, call: F) -> Duration
where
    F: Fn(Locker, Arc<Partner>) -> Fut + Copy + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for locker in instances {
        for _ in 0..WORKERS {
            let (locker, partner, next) = (locker.clone(), partner.clone(), next.clone());
            workers.push(tokio::spawn(async move {
                while next.fetch_add(1, Ordering::SeqCst) < REQUESTS {
                    while !call(locker.clone(), partner.clone()).await {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }));
        }
    }
    for worker in workers {
        worker.await.expect("a worker panicked");
    }
    started.elapsed()
}

fn report(what: &str, partner: &Partner, took: Duration) {
    println!(
        "{what}: {} labels created, {} requests refused with 429, at most {} in flight, in {} ms",
        partner.served.load(Ordering::SeqCst),
        partner.refused.load(Ordering::SeqCst),
        partner.most_in_flight.load(Ordering::SeqCst),
        took.as_millis()
    );
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    // In memory, the instances share one store, as processes share a server.
    let memory = dlock::backend::MemoryBackend::new();
    let mut instances = Vec::new();
    for _ in 0..INSTANCES {
        instances.push(match std::env::var("DLOCK_URL") {
            Ok(url) if !url.is_empty() => Locker::connect(&url).await?,
            _ => Locker::with_backend(memory.clone()),
        });
    }
    println!(
        "{INSTANCES} instances × {WORKERS} workers create {REQUESTS} shipping labels; the partner allows {} requests at once",
        Partner::LIMIT
    );

    let partner = Arc::new(Partner::default());
    let took = run(&instances, partner.clone(), |_, partner| async move {
        create_label_unlimited(&partner).await.is_ok()
    })
    .await;
    report("without a limit", &partner, took);

    let partner = Arc::new(Partner::default());
    let took = run(&instances, partner.clone(), |locker, partner| async move {
        create_label_limited(&locker, &partner).await.is_ok()
    })
    .await;
    report("permits = 3", &partner, took);

    for locker in instances {
        locker.shutdown().await?;
    }
    Ok(())
}
