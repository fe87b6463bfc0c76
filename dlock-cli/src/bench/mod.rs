//! `dlock bench URL`: two workloads against a store, then a summary.
//!
//! - uncontended: one task acquiring and releasing distinct keys, one pair after another: the
//!   cost of a lock nobody else wants (the latency of a pair).
//! - contended: `--tasks` tasks taking turns on one key around a read-yield-write of a counter.
//!   A body that ran beside another would lose an increment, so the summary counts lost
//!   updates (0 where the lock excludes); it also shows how long each acquisition waited and
//!   how the turns were shared among the tasks.
//! - permits (with `--permits N`, N > 1): the same tasks on one key as a semaphore of N permits,
//!   each turn `--work` long (a call to a resource that takes N at a time), against the same
//!   tasks on the key as a mutex, in the same run: turns per second and their ratio, how many
//!   bodies were ever inside at once (never more than N), and how the turns were shared.
//!
//! Keys are `<key prefix><run id>:…`, fresh each run, and every lease is released.

mod permits;
mod stats;

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{mask_password, LockError, LockOptions, Locker, Owner};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use self::permits::Permits;
use self::stats::Spread;
use crate::cli::BenchArgs;
use crate::commands::{connect, finish, print_json};
use crate::exit::Exit;
use crate::table::Table;

/// The ttl of the benchmark's leases: far longer than a turn, so none is lost to a slow store.
const TTL: Duration = Duration::from_secs(10);

/// `bench`'s JSON.
#[derive(Debug, Serialize)]
struct Summary {
    /// The store's URL, password masked.
    store: String,
    /// How long each workload ran, in seconds.
    seconds: u64,
    uncontended: Uncontended,
    contended: Contended,
    /// The permits workload, where `--permits` asked for one.
    #[serde(skip_serializing_if = "Option::is_none")]
    permits: Option<Permits>,
}

/// The uncontended workload's results.
#[derive(Debug, Serialize)]
struct Uncontended {
    /// Acquire + release pairs completed.
    pairs: u64,
    /// Pairs per second.
    per_second: f64,
    /// The time one pair took, in milliseconds.
    latency_ms: Spread,
    /// Acquisitions or releases that failed.
    errors: u64,
}

/// The contended workload's results.
#[derive(Debug, Serialize)]
struct Contended {
    /// Tasks contending for the key.
    tasks: u64,
    /// Turns completed (critical sections run), all tasks together.
    sections: u64,
    /// Turns per second.
    per_second: f64,
    /// Increments of the counter that were lost: bodies that overlapped. 0 where the lock
    /// excludes. Counted only where the key is a mutex.
    lost_updates: u64,
    /// The most bodies inside at once: 1 for a mutex, at most the permits for a semaphore.
    most_inside: u64,
    /// How long an acquisition waited for the key, in milliseconds.
    wait_ms: Spread,
    /// Turns per task, in task order.
    per_worker: Vec<u64>,
    /// Acquisitions or releases that failed.
    errors: u64,
}

/// Runs both workloads and prints the summary.
pub async fn run(args: &BenchArgs, json: bool) -> Result<Exit, LockError> {
    let locker = connect(&args.url).await?;
    let result = measure(&locker, args, json).await;
    let summary = finish(locker, result).await?;
    if json {
        print_json(&summary);
    } else {
        print!("{}", render(&summary));
    }
    Ok(Exit::Ok)
}

async fn measure(locker: &Locker, args: &BenchArgs, json: bool) -> Result<Summary, LockError> {
    let run_id = format!("{:08x}", Owner::random().as_u128() as u32);
    let prefix = format!("{}{run_id}:", args.key_prefix);
    let length = Duration::from_secs(args.seconds);
    // Drawn on standard error, and only for a person watching: never into JSON or a log.
    let show = !json && std::io::stderr().is_terminal();
    let uncontended = uncontended(
        locker,
        &prefix,
        length,
        progress("uncontended", length, show),
    )
    .await?;
    let contended = contended(
        locker,
        &format!("{prefix}hot"),
        length,
        args.tasks,
        Turn::COUNTER,
        progress("contended", length, show),
    )
    .await;
    let permits = if args.permits > 1 {
        Some(permits::measure(locker, &prefix, length, args, show).await)
    } else {
        None
    };
    Ok(Summary {
        store: mask_password(&args.url),
        seconds: args.seconds,
        uncontended,
        contended,
        permits,
    })
}

/// A progress bar for a workload of `length`, drawn where `show`.
fn progress(name: &str, length: Duration, show: bool) -> ProgressBar {
    let target = if show {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(Some(crate::report::millis(length)), target);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>11} [{bar:30}] {elapsed:>3} {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(name.to_owned());
    bar
}

/// Sequential acquire + release pairs on distinct keys for `length`. Fails where the first pair
/// fails (the store is unreachable, say): there is nothing to measure then.
async fn uncontended(
    locker: &Locker,
    prefix: &str,
    length: Duration,
    bar: ProgressBar,
) -> Result<Uncontended, LockError> {
    let options = LockOptions::new().ttl(TTL);
    let started = Instant::now();
    let mut latencies = Vec::new();
    let mut errors = 0;
    let mut next = 0u64;
    while started.elapsed() < length {
        let asked = Instant::now();
        let key = format!("{prefix}u:{next}");
        next += 1;
        let pair = match locker.lock(key, options).await {
            Ok(lease) => lease.release().await,
            Err(error) => Err(error),
        };
        match pair {
            Ok(()) => latencies.push(asked.elapsed()),
            Err(error) if latencies.is_empty() && errors == 0 => {
                bar.abandon();
                return Err(error);
            }
            Err(_) => errors += 1,
        }
        bar.set_position(crate::report::millis(started.elapsed()));
        bar.set_message(format!("{} pairs", latencies.len()));
    }
    bar.finish();
    let elapsed = started.elapsed();
    Ok(Uncontended {
        pairs: latencies.len() as u64,
        per_second: latencies.len() as f64 / elapsed.as_secs_f64(),
        latency_ms: Spread::of(&mut latencies),
        errors,
    })
}

/// What one task of the contended workload did.
#[derive(Default)]
struct Worker {
    sections: u64,
    waits: Vec<Duration>,
    errors: u64,
}

/// What a turn of the contended workloads does, and on how many permits.
#[derive(Debug, Clone, Copy)]
struct Turn {
    /// The key's permits: 1 for a mutex.
    permits: u32,
    /// How long a turn works (sleeps) inside.
    work: Duration,
}

impl Turn {
    /// The contended workload's turn: on a mutex, a read-yield-write of a counter and no more.
    const COUNTER: Turn = Turn {
        permits: 1,
        work: Duration::ZERO,
    };
}

/// `tasks` tasks taking turns on `key` for `length`, each turn a read-yield-write of a shared
/// counter that works `turn.work` in between.
async fn contended(
    locker: &Locker,
    key: &str,
    length: Duration,
    tasks: u64,
    turn: Turn,
    bar: ProgressBar,
) -> Contended {
    let counter = Arc::new(AtomicU64::new(0));
    let sections = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicU64::new(0));
    let most_inside = Arc::new(AtomicU64::new(0));
    let options = LockOptions::new().ttl(TTL).permits(turn.permits);
    let started = Instant::now();
    let deadline = started + length;
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let (locker, key) = (locker.clone(), key.to_owned());
            let (counter, sections) = (counter.clone(), sections.clone());
            let (inside, most_inside) = (inside.clone(), most_inside.clone());
            tokio::spawn(async move {
                let mut worker = Worker::default();
                while Instant::now() < deadline {
                    // Wait out every other task's turn: a turn missed is no measurement.
                    let wait = deadline.saturating_duration_since(Instant::now()) + TTL;
                    let asked = Instant::now();
                    let lease = match locker.lock(key.clone(), options.wait(wait)).await {
                        Ok(lease) => lease,
                        Err(_) => {
                            worker.errors += 1;
                            // A failing store is not hammered in a loop.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    worker.waits.push(asked.elapsed());
                    // The critical section: an increment that another body running at the same
                    // time would overwrite.
                    let now_inside = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most_inside.fetch_max(now_inside, Ordering::SeqCst);
                    let seen = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    if !turn.work.is_zero() {
                        tokio::time::sleep(turn.work).await;
                    }
                    counter.store(seen + 1, Ordering::SeqCst);
                    inside.fetch_sub(1, Ordering::SeqCst);
                    worker.sections += 1;
                    sections.fetch_add(1, Ordering::Relaxed);
                    if lease.release().await.is_err() {
                        worker.errors += 1;
                    }
                }
                worker
            })
        })
        .collect();
    while !workers.iter().all(|worker| worker.is_finished()) {
        bar.set_position(
            crate::report::millis(started.elapsed()).min(crate::report::millis(length)),
        );
        bar.set_message(format!("{} turns", sections.load(Ordering::Relaxed)));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bar.finish();
    let elapsed = started.elapsed();
    let mut per_worker = Vec::new();
    let mut waits = Vec::new();
    let mut errors = 0;
    for worker in workers {
        // A task that panicked counts as one error and no turns.
        let worker = worker.await.unwrap_or_else(|_| Worker {
            errors: 1,
            ..Worker::default()
        });
        per_worker.push(worker.sections);
        waits.extend(worker.waits);
        errors += worker.errors;
    }
    let total: u64 = per_worker.iter().sum();
    // Bodies inside at once on a semaphore overwrite one another's increments by design.
    let lost_updates = match turn.permits {
        1 => total - counter.load(Ordering::SeqCst).min(total),
        _ => 0,
    };
    Contended {
        tasks,
        sections: total,
        per_second: total as f64 / elapsed.as_secs_f64(),
        lost_updates,
        most_inside: most_inside.load(Ordering::SeqCst),
        wait_ms: Spread::of(&mut waits),
        per_worker,
        errors,
    }
}

/// The summary people read.
fn render(summary: &Summary) -> String {
    let ms = |ms: f64| format!("{ms:.2}ms");
    let (u, c) = (&summary.uncontended, &summary.contended);
    let mut table = Table::new(&[
        "WORKLOAD", "OPS>", "OPS/S>", "P50>", "P99>", "MAX>", "ERRORS>", "MEASURED",
    ]);
    table.row(vec![
        "uncontended".into(),
        u.pairs.to_string(),
        format!("{:.1}", u.per_second),
        ms(u.latency_ms.p50),
        ms(u.latency_ms.p99),
        ms(u.latency_ms.max),
        u.errors.to_string(),
        "acquire + release pair, distinct keys".into(),
    ]);
    table.row(vec![
        "contended".into(),
        c.sections.to_string(),
        format!("{:.1}", c.per_second),
        ms(c.wait_ms.p50),
        ms(c.wait_ms.p99),
        ms(c.wait_ms.max),
        c.errors.to_string(),
        format!("wait for the key, {} tasks on one key", c.tasks),
    ]);
    let mut workers = Table::new(&["TASK>", "TURNS>"]);
    for (task, turns) in c.per_worker.iter().enumerate() {
        workers.row(vec![task.to_string(), turns.to_string()]);
    }
    let verdict = if c.lost_updates == 0 {
        "none: the bodies never overlapped"
    } else {
        "BODIES OVERLAPPED: the lock did not exclude"
    };
    let mut page = format!(
        "dlock bench on {}, {}s per workload\n\n{table}\nlost updates: {} of {} ({verdict})\n\n{workers}",
        summary.store, summary.seconds, c.lost_updates, c.sections
    );
    if let Some(permits) = &summary.permits {
        page.push('\n');
        page.push_str(&permits::render(permits));
    }
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_shows_both_workloads_and_each_task() {
        let spread = Spread {
            p50: 0.5,
            p99: 1.25,
            max: 3.0,
        };
        let summary = Summary {
            store: "redis://:***@h:6379".into(),
            seconds: 5,
            uncontended: Uncontended {
                pairs: 10_000,
                per_second: 2_000.0,
                latency_ms: spread,
                errors: 0,
            },
            contended: Contended {
                tasks: 2,
                sections: 900,
                per_second: 180.0,
                lost_updates: 0,
                most_inside: 1,
                wait_ms: spread,
                per_worker: vec![450, 450],
                errors: 0,
            },
            permits: None,
        };
        let page = render(&summary);
        assert!(
            page.starts_with("dlock bench on redis://:***@h:6379, 5s per workload\n"),
            "{page}"
        );
        assert!(
            page.contains("uncontended  10000  2000.0  0.50ms  1.25ms  3.00ms       0  acquire"),
            "{page}"
        );
        assert!(page.contains("lost updates: 0 of 900 (none"), "{page}");
        assert!(page.contains("   1    450"), "{page}");
        let json = serde_json::to_value(&summary).unwrap();
        assert_eq!(
            json["contended"]["per_worker"],
            serde_json::json!([450, 450])
        );
        assert_eq!(json["uncontended"]["latency_ms"]["p99"], 1.25);
    }
}
