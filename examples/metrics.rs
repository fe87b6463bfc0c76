//! What an operator sees of the locks: dlock's metrics, as Prometheus scrapes them.
//!
//! A payout service locks each account while it pays out (`#[distributed_lock]`, label: the
//! function's path), records the payout under the same lock (a nested call: a re-entry), and
//! turns a payout away while maintenance holds the account (busy). A reindex job loses its lease
//! when an operator takes its key away. dlock records all of it through the `metrics` facade;
//! this program installs a Prometheus recorder (`metrics-exporter-prometheus` without its HTTP
//! listener) and prints the text a scrape of `/metrics` would return. A real service serves
//! `handle.render()` from its own web framework's route, or enables the exporter's listener.
//!
//! Runs on the in-memory store:
//!
//! ```text
//! cargo run --example metrics
//! ```

use std::time::Duration;

use dlock::backend::MemoryBackend;
use dlock::{distributed_lock, LockError, LockOptions, Locker};
use metrics_exporter_prometheus::PrometheusBuilder;

/// Pays out an account's balance: one payout per account at a time.
#[distributed_lock(key = "payout:<account>")]
async fn pay_out(account: &str) -> Result<(), LockError> {
    tokio::time::sleep(Duration::from_millis(5)).await;
    record_payout(account).await
}

/// Writes the payout to the ledger; called on its own too, so it takes the account's lock
/// itself, and re-enters it when `pay_out` already holds it.
#[distributed_lock(key = "payout:<account>", label = "ledger::record_payout")]
async fn record_payout(account: &str) -> Result<(), LockError> {
    tokio::time::sleep(Duration::from_millis(1)).await;
    Ok(())
}

/// Rebuilds the search index, for far longer than its lease's ttl: the watchdog renews it.
#[distributed_lock(key = "reindex", ttl = "300ms", label = "jobs::reindex")]
async fn reindex() -> Result<(), LockError> {
    tokio::time::sleep(Duration::from_secs(5)).await;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    // The recorder first: what happens before it is installed is not recorded.
    let prometheus = PrometheusBuilder::new()
        .install_recorder()
        .expect("no other recorder installed");
    let store = MemoryBackend::new();
    let locker = Locker::with_backend(store.clone());
    dlock::set_default_locker(locker.clone());

    // Five payouts, each re-entering its account's lock to record itself.
    for account in ["acct-1", "acct-2", "acct-3", "acct-4", "acct-5"] {
        pay_out(account).await?;
    }
    // Maintenance holds acct-7: two payouts are turned away.
    let maintenance = locker
        .lock(
            "payout:acct-7",
            LockOptions::new().label("ops::maintenance"),
        )
        .await?;
    for _ in 0..2 {
        let turned_away = pay_out("acct-7").await;
        assert!(matches!(turned_away, Err(LockError::Busy { .. })));
    }
    maintenance.release().await?;
    // An operator takes the reindex job's key away: its next renewal is refused, and the job
    // stops with `LockError::Lost`.
    let job = tokio::spawn(reindex());
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(store.steal("reindex"), "the job holds its key");
    let stopped = job.await.expect("the job ran to its end");
    println!("reindex: {stopped:?}\n");
    locker.shutdown().await?;

    // The waits and holds are summaries: each also has a line per quantile, left out here.
    println!("# what a scrape of /metrics returns (dlock's series, quantiles left out)");
    let text = prometheus.render();
    let shown = |line: &&str| line.contains("dlock_") && !line.contains("quantile=");
    for line in text.lines().filter(shown) {
        println!("{line}");
    }
    Ok(())
}
