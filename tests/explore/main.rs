//! The schedule explorer: many seeded runs of several workers ("processes", each a `Locker` on a
//! runtime of its own) on one store, each run's faults, stalls, cancellations, nesting and ttls
//! drawn from its seed, checked for the promises a lock makes:
//!
//! - no two bodies inside one key at once, no more than N inside a semaphore of N permits (a
//!   body under `on_lost = "continue"` counts while its lease is held), and no two siblings
//!   re-entering one lease at once;
//! - no body entering a key before the hold (`hold_at_least`) of an earlier one ran out;
//! - no body polled on a lease that was invalid for sure: never started after the lease ran
//!   out, and under `on_lost = "cancel"` never resumed after it;
//! - fences rising in the order bodies enter (per permit, on a semaphore);
//! - no key held by nobody: once every worker has finished, every key is free at once (every
//!   store key of a semaphore; a key with holds once they ran out);
//! - a lease whose renewals are all answered in time is kept, however short the other leases
//!   of its `Locker`.
//!
//! `DLOCK_EXPLORE_SEEDS=N` runs N seeds (from `DLOCK_EXPLORE_FIRST`, default 0),
//! `DLOCK_EXPLORE_SEED=S` replays seed S alone, `DLOCK_EXPLORE_JOBS=J` runs J seeds at a time.
//! A run's timing is the machine's, so a replay draws the same schedule of faults but may
//! interleave threads differently; a failing seed fails again most of the time.

// The support every test crate shares, one directory up.
#[path = "../support/mod.rs"]
mod support;

mod calls;
mod checker;
mod driver;
mod plan;
mod store;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use dlock::backend::RedisBackend;

use checker::{Finding, Kind, Tally};
use driver::run_seed;
use plan::SeedPlan;
use store::{MemoryStore, RedisStore, Store};

/// Seeds run by default: together well under a minute on a loaded two-core machine.
const MEMORY_SEEDS: u64 = 300;
const REDIS_SEEDS: u64 = 120;

#[test]
fn memory() {
    explore("memory", MEMORY_SEEDS, |_| MemoryStore::default());
}

#[test]
fn redis() {
    let url = std::env::var("DLOCK_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let prefix = format!("dlock-explore:{}:", support::unique_key("run"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let clients: Vec<RedisBackend> = (0..4)
        .map(|_| {
            runtime
                .block_on(
                    RedisBackend::builder(&url)
                        .unwrap()
                        .key_prefix(&prefix)
                        .connect(),
                )
                .expect("the explorer needs a Redis server (DLOCK_REDIS_URL)")
        })
        .collect();
    let store = RedisStore { clients };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        explore("redis", REDIS_SEEDS, |_| &store);
    }));
    runtime.block_on(delete_keys(&url, &prefix));
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// Deletes what a run left on the server (fence counters outlive the leases on purpose).
async fn delete_keys(url: &str, prefix: &str) {
    let Ok(client) = redis::Client::open(url) else {
        return;
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return;
    };
    let mut cursor = 0u64;
    loop {
        let Ok((next, keys)): Result<(u64, Vec<String>), _> = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
        else {
            return;
        };
        if !keys.is_empty() {
            let _: Result<(), _> = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await;
        }
        if next == 0 {
            return;
        }
        cursor = next;
    }
}

fn env(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value} is not a number")),
    )
}

/// Runs the seeds the environment asks for (else `default_seeds` of them) on stores from
/// `store`, and fails with every finding and the command that replays each failing seed.
fn explore<S: Store>(test: &str, default_seeds: u64, store: impl Fn(u64) -> S + Sync) {
    let seeds: Vec<u64> = match env("DLOCK_EXPLORE_SEED") {
        Some(seed) => vec![seed],
        None => {
            let first = env("DLOCK_EXPLORE_FIRST").unwrap_or(0);
            (first..first + env("DLOCK_EXPLORE_SEEDS").unwrap_or(default_seeds)).collect()
        }
    };
    let jobs = env("DLOCK_EXPLORE_JOBS").unwrap_or(8).max(1);
    let started = Instant::now();
    let next = AtomicU64::new(0);
    let failures: Mutex<BTreeMap<u64, (String, Vec<Finding>)>> = Mutex::default();
    let totals: Mutex<(Tally, Duration)> = Mutex::default();
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(&seed) = seeds.get(index) else {
                    return;
                };
                let plan = SeedPlan::new(seed);
                let outcome = run_seed(&plan, &store(seed));
                {
                    let mut totals = totals.lock().unwrap();
                    totals.0 += outcome.tally;
                    totals.1 = totals.1.max(outcome.elapsed);
                }
                if !outcome.findings.is_empty() {
                    // At once, for long runs that are watched as they go.
                    eprintln!(
                        "explore {test}: seed {seed} ({}) failed: {}",
                        plan.describe(),
                        outcome.findings[0]
                    );
                    failures
                        .lock()
                        .unwrap()
                        .insert(seed, (plan.describe(), outcome.findings));
                }
                if (index + 1).is_multiple_of(5000) {
                    eprintln!(
                        "explore {test}: {} seeds in {:?}, {} failing",
                        index + 1,
                        started.elapsed(),
                        failures.lock().unwrap().len()
                    );
                }
            });
        }
    });
    let (tally, slowest) = *totals.lock().unwrap();
    let failures = failures.into_inner().unwrap();
    println!(
        "explore {test}: {} seeds in {:?} (slowest {:?}); {} bodies, {} lost, {} busy, {} store errors, {} cut short, {} suspects unjudged (thread preempted or process starved); {} bodies on a semaphore's permit ({} whose permit could not be told), {} holds judged; {} seeds failing",
        seeds.len(),
        started.elapsed(),
        slowest,
        tally.bodies,
        tally.lost,
        tally.busy,
        tally.store_errors,
        tally.cut,
        tally.unjudged,
        tally.permit_bodies,
        tally.permit_unknown,
        tally.holds,
        failures.len()
    );
    if failures.is_empty() {
        return;
    }
    panic!("{}", report(test, seeds.len(), &failures));
}

/// The failure message: which seeds found which kind of bug, then each failing seed's findings
/// and the command that replays it.
fn report(test: &str, seeds: usize, failures: &BTreeMap<u64, (String, Vec<Finding>)>) -> String {
    let mut by_kind: BTreeMap<Kind, Vec<u64>> = BTreeMap::new();
    for (seed, (_, findings)) in failures {
        for finding in findings {
            let seeds = by_kind.entry(finding.kind).or_default();
            if seeds.last() != Some(seed) {
                seeds.push(*seed);
            }
        }
    }
    let mut text = format!(
        "the explorer ({test}) found {} of {seeds} seeds breaking the lock's promises\n",
        failures.len()
    );
    for (kind, seeds) in &by_kind {
        let shown: Vec<String> = seeds.iter().take(12).map(u64::to_string).collect();
        text += &format!(
            "  {kind:?} ({}): {} seeds: {}{}\n",
            kind.meaning(),
            seeds.len(),
            shown.join(", "),
            if seeds.len() > shown.len() {
                ", …"
            } else {
                ""
            }
        );
    }
    for (seed, (plan, findings)) in failures.iter().take(10) {
        text += &format!("\nseed {seed} ({plan}):\n");
        for finding in findings.iter().take(6) {
            text += &format!("  {finding}\n");
        }
        if findings.len() > 6 {
            text += &format!("  … and {} more\n", findings.len() - 6);
        }
        text += &format!(
            "  replay: DLOCK_EXPLORE_SEED={seed} cargo nextest run --all-features --test explore -E 'test({test})'\n"
        );
    }
    text
}
