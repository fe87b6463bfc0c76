//! A scheduled job that runs on every replica runs once per replica, not once.
//!
//! The duplicate-account clean-up (the account story's second half) is a scheduled task: every
//! minute it deletes up to 1,000 duplicate rows. The service runs on three replicas, and each
//! replica's scheduler fires it. A lock with no wait keeps two runs from overlapping, but the
//! job is quick: the first replica is done before the second one's timer fires, finds the key
//! free, and runs it again. Three runs a minute, three times the load the limit was meant to
//! cap. The fix: `hold_at_least`, which keeps the key held after the job until the window is
//! over, so the replicas that fire later in the window find it busy and skip.
//!
//! Locks on the in-memory store by default; `DLOCK_URL` (`redis://…`, `mysql://…`,
//! `postgres://…`, with the store's feature enabled) runs it on a real one. (ZooKeeper cannot
//! keep a key held after its holder is done: its lock nodes end with their session. The example
//! says so and stops.)
//!
//! ```text
//! cargo run --example nightly_cleanup
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dlock::{distributed_lock, LockError, Locker};

/// The schedule, scaled down: a window of one second stands for a minute.
const WINDOW: Duration = Duration::from_secs(1);
const WINDOWS: u32 = 4;
const REPLICAS: u32 = 3;

/// How many times the job ran: each run would delete up to 1,000 rows.
#[derive(Default)]
struct Runs(AtomicU64);

impl Runs {
    async fn clean_up(&self) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// The job as first written: a lock keeps two runs from overlapping, and nothing more.
#[distributed_lock(key = "cleanup:duplicate-open-ids", locker = locker)]
async fn clean_up_locked(locker: &Locker, runs: &Runs) -> Result<(), LockError> {
    runs.clean_up().await;
    Ok(())
}

/// The job held for most of its window (the rest leaves room for a slow start): the replicas
/// that fire later in it skip.
#[distributed_lock(
    key = "cleanup:duplicate-open-ids",
    hold_at_least = "700ms",
    locker = locker
)]
async fn clean_up_once_per_window(locker: &Locker, runs: &Runs) -> Result<(), LockError> {
    runs.clean_up().await;
    Ok(())
}

/// Runs the schedule: each replica fires `job` at the start of every window, a little later
/// than the one before it (their clocks and timers are never in step). Returns how many runs.
async fn schedule<F, Fut>(replicas: &[Locker], job: F) -> u64
where
    F: Fn(Locker, Arc<Runs>) -> Fut + Copy + Send + 'static,
    Fut: std::future::Future<Output = Result<(), LockError>> + Send,
{
    let runs = Arc::new(Runs::default());
    let started = tokio::time::Instant::now();
    let mut timers = Vec::new();
    for (index, locker) in replicas.iter().enumerate() {
        let (locker, runs) = (locker.clone(), runs.clone());
        let offset = Duration::from_millis(100) * index as u32;
        timers.push(tokio::spawn(async move {
            for window in 0..WINDOWS {
                tokio::time::sleep_until(started + WINDOW * window + offset).await;
                // Busy: another replica has this window; the job is skipped.
                let _ = job(locker.clone(), runs.clone()).await;
            }
        }));
    }
    for timer in timers {
        timer.await.expect("a replica's timer panicked");
    }
    runs.0.load(Ordering::SeqCst)
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    // In memory, the replicas share one store, as processes share a server.
    let memory = dlock::backend::MemoryBackend::new();
    let mut replicas = Vec::new();
    for _ in 0..REPLICAS {
        // Each replica is a process of its own, with a locker of its own.
        replicas.push(match std::env::var("DLOCK_URL") {
            Ok(url) if !url.is_empty() => Locker::connect(&url).await?,
            _ => Locker::with_backend(memory.clone()),
        });
    }
    println!("{REPLICAS} replicas fire the clean-up at the start of each of {WINDOWS} windows");

    let runs = schedule(&replicas, |locker, runs| async move {
        clean_up_locked(&locker, &runs).await
    })
    .await;
    let verdict = if runs > u64::from(WINDOWS) {
        "more than once a window"
    } else {
        "once a window"
    };
    println!("locked, no hold: the job ran {runs} times ({verdict})");

    // Wait out the last window, so the next schedule starts on a free key.
    tokio::time::sleep(WINDOW).await;
    let runs = schedule(&replicas, |locker, runs| async move {
        clean_up_once_per_window(&locker, &runs).await
    })
    .await;
    match runs {
        0 => println!("hold_at_least: this store cannot keep a key held after its release"),
        runs => println!("hold_at_least = \"700ms\": the job ran {runs} times"),
    }
    for locker in replicas {
        locker.shutdown().await?;
    }
    Ok(())
}
