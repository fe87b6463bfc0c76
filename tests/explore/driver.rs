//! The workers of one seed: their runs, and the check that they left every key free.
//!
//! Each worker is one "process": a `Locker` of its own on the seed's store (through a chaos
//! layer of its own), on a current-thread runtime on a thread of its own, so that a blocked
//! thread stalls exactly that worker's runtime. Its tasks make the plan's calls; a sibling task
//! blocks the thread at the plan's stall times.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{LockError, LockOptions, Locker};

use crate::calls::{call, Ctx, VARIANTS};
use crate::checker::{marked, starved_between, watch_starvation, Checker, Finding, Kind, Tally};
use crate::plan::{Cut, KeyKind, Op, Scenario, SeedPlan, TaskPlan, WorkerPlan};
use crate::store::Store;
use crate::support::chaos::{Chaos, LeaseBook, SplitMix};

/// How long a worker may take before the seed is called hung.
const WORKER_LIMIT: Duration = Duration::from_secs(30);

/// How long after the last worker finished a key may still be held: releases queued on drop
/// run on the background runtime, and take a moment.
const SETTLE: Duration = Duration::from_millis(500);

/// What every worker of a seed shares.
pub struct Run {
    pub checker: Checker,
    pub book: Arc<LeaseBook>,
    pub keys: Vec<String>,
    pub kinds: Vec<KeyKind>,
    /// Set once the seed's lease that must be kept is done (at once when it has none): churning
    /// tasks stop then.
    pub kept_done: AtomicBool,
}

/// What a seed found.
pub struct Outcome {
    pub findings: Vec<Finding>,
    pub tally: Tally,
    pub elapsed: Duration,
}

/// Runs every worker of `plan` on `store`, then checks that every key is free.
pub fn run_seed<S: Store>(plan: &SeedPlan, store: &S) -> Outcome {
    watch_starvation();
    let started = Instant::now();
    let book = Arc::new(LeaseBook::default());
    let must_keep = plan
        .workers
        .iter()
        .flat_map(|w| &w.tasks)
        .flat_map(|t| &t.ops)
        .any(|op| op.must_keep_lease);
    let run = Arc::new(Run {
        checker: Checker::new(book.clone()),
        book: book.clone(),
        keys: (0..plan.keys).map(|i| store.key(plan.seed, i)).collect(),
        kinds: plan.kinds.clone(),
        kept_done: AtomicBool::new(!must_keep),
    });
    let workers: Vec<_> = plan
        .workers
        .iter()
        .enumerate()
        .map(|(index, worker)| {
            let chaos = Chaos::new(
                store.client(index),
                worker.faults,
                SplitMix::new(worker.chaos_seed),
                book.clone(),
            );
            let locker = Locker::with_backend(chaos);
            let (run, worker) = (run.clone(), worker.clone());
            std::thread::Builder::new()
                .name(format!("explore-{}-w{index}", plan.seed))
                .spawn(move || {
                    let runtime = match worker.threads {
                        1 => tokio::runtime::Builder::new_current_thread(),
                        threads => {
                            let mut builder = tokio::runtime::Builder::new_multi_thread();
                            builder.worker_threads(threads);
                            builder
                        }
                    }
                    .enable_all()
                    .build()
                    .unwrap();
                    let ctx = Ctx {
                        run,
                        locker,
                        worker: index,
                        frames: Vec::new(),
                    };
                    runtime.block_on(async {
                        tokio::time::timeout(WORKER_LIMIT, run_worker(ctx, worker)).await
                    })
                })
                .expect("cannot start a worker thread")
        })
        .collect();
    for (index, worker) in workers.into_iter().enumerate() {
        match worker.join() {
            Ok(Ok(())) => {}
            Ok(Err(_)) => run.checker.report(
                Kind::Broken,
                format!("worker {index} did not finish within {WORKER_LIMIT:?}"),
            ),
            Err(panic) => run.checker.report(
                Kind::Broken,
                format!("worker {index} panicked: {}", panic_message(&*panic)),
            ),
        }
    }
    check_keys_free(store, &run);
    Outcome {
        findings: run.checker.findings(),
        tally: run.checker.tally(),
        elapsed: started.elapsed(),
    }
}

/// After every worker finished, every key must be free: at once on the store, and acquirable
/// with no wait. A semaphore's every store key (its permits, and its turnstile, which is never
/// renewed and may be left to expire within the longest ttl of its calls), and a key with holds
/// once the last hold ran out.
fn check_keys_free<S: Store>(store: &S, run: &Run) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let locker = Locker::with_backend(store.client(0));
    for (key, kind) in run.keys.iter().zip(&run.kinds) {
        match *kind {
            KeyKind::Mutex => check_key_free(store, run, &runtime, &locker, key, SETTLE),
            KeyKind::Hold => {
                if let Some(end) = run.checker.holds_end(key) {
                    std::thread::sleep(end.saturating_duration_since(Instant::now()));
                }
                check_key_free(store, run, &runtime, &locker, key, SETTLE);
            }
            KeyKind::Semaphore(permits) => {
                for permit in 0..permits {
                    let permit = format!("{key}\u{1f}permit:{permit}");
                    check_key_free(store, run, &runtime, &locker, &permit, SETTLE);
                }
                let longest_ttl = VARIANTS
                    .iter()
                    .filter(|v| v.permits == permits)
                    .map(|v| Duration::from_millis(v.ttl_ms))
                    .max()
                    .unwrap_or_default();
                let turnstile = format!("{key}\u{1f}turnstile");
                check_key_free(
                    store,
                    run,
                    &runtime,
                    &locker,
                    &turnstile,
                    SETTLE + longest_ttl,
                );
                // And every permit at once, through the semaphore.
                let options = LockOptions::new().permits(permits);
                let mut taken = Vec::new();
                for _ in 0..permits {
                    match runtime.block_on(locker.lock(key.as_str(), options)) {
                        Ok(lease) => taken.push(lease),
                        Err(error) => {
                            run.checker.report(
                                Kind::HeldByNobody,
                                format!("`{key}` ({permits} permits): only {} permits could be taken once every store key was free: {error}", taken.len()),
                            );
                            break;
                        }
                    }
                }
                for lease in taken {
                    let _ = runtime.block_on(lease.release());
                }
            }
        }
    }
}

/// Checks that the store key `key` is free within `patience` (more where the process was starved
/// meanwhile).
fn check_key_free<S: Store>(
    store: &S,
    run: &Run,
    runtime: &tokio::runtime::Runtime,
    locker: &Locker,
    key: &str,
    patience: Duration,
) {
    let mut deadline = Instant::now() + patience;
    let hard_deadline = deadline + 10 * SETTLE;
    loop {
        let free = store.is_held(key) != Some(true)
            && match runtime.block_on(locker.lock(key, LockOptions::new())) {
                Ok(lease) => {
                    let _ = runtime.block_on(lease.release());
                    true
                }
                Err(LockError::Busy { .. }) => false,
                Err(error) => {
                    run.checker
                        .report(Kind::Broken, format!("final check of `{key:?}`: {error}"));
                    true
                }
            };
        if free {
            break;
        }
        let now = Instant::now();
        if now >= deadline && now < hard_deadline && starved_between(deadline - patience, now) {
            // The releases had no CPU to run on: give them the time again.
            deadline = Instant::now() + patience;
        } else if now >= deadline {
            run.checker.report(
                Kind::HeldByNobody,
                format!("`{key:?}` was still held {patience:?} after every worker had finished"),
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

async fn run_worker(ctx: Ctx, plan: WorkerPlan) {
    let start = tokio::time::Instant::now();
    let stalls = plan.stalls.clone();
    let hog = tokio::spawn(async move {
        for (at, stall) in stalls {
            tokio::time::sleep_until(start + at).await;
            std::thread::sleep(stall);
        }
    });
    let tasks: Vec<_> = plan
        .tasks
        .into_iter()
        .map(|task| tokio::spawn(marked(run_task(ctx.clone(), task))))
        .collect();
    for task in tasks {
        if let Err(error) = task.await {
            ctx.run.checker.report(
                Kind::Broken,
                format!("worker {}: a task failed: {error}", ctx.worker),
            );
        }
    }
    let _ = hog.await;
}

async fn run_task(ctx: Ctx, task: TaskPlan) {
    if task.together {
        for _ in 0..task.rounds {
            let ops: Vec<_> = task
                .ops
                .iter()
                .cloned()
                .map(|op| {
                    let ctx = ctx.clone();
                    tokio::spawn(marked(async move {
                        tokio::time::sleep(op.start_after).await;
                        run_op(&ctx, &op).await;
                    }))
                })
                .collect();
            for op in ops {
                if let Err(error) = op.await {
                    ctx.run.checker.report(
                        Kind::Broken,
                        format!("worker {}: an op failed: {error}", ctx.worker),
                    );
                }
            }
        }
        return;
    }
    loop {
        for op in &task.ops {
            tokio::time::sleep(op.start_after).await;
            run_op(&ctx, op).await;
        }
        if !task.churn || ctx.run.kept_done.load(Ordering::SeqCst) {
            break;
        }
    }
}

async fn run_op(ctx: &Ctx, op: &Op) {
    let checker = &ctx.run.checker;
    let started = Instant::now();
    let result = match op.cut {
        Cut::None => Some(call(ctx, &op.call).await),
        Cut::Timeout(after) => tokio::time::timeout(after, call(ctx, &op.call)).await.ok(),
        Cut::Abort(after) => {
            let (task_ctx, plan) = (ctx.clone(), op.call.clone());
            let task = tokio::spawn(marked(async move { call(&task_ctx, &plan).await }));
            tokio::time::sleep(after).await;
            task.abort();
            match task.await {
                Ok(result) => Some(result),
                Err(error) if error.is_cancelled() => None,
                Err(error) => {
                    checker.report(Kind::Broken, format!("worker {}: {error}", ctx.worker));
                    None
                }
            }
        }
    };
    if op.must_keep_lease {
        ctx.run.kept_done.store(true, Ordering::SeqCst);
    }
    match result {
        None => checker.count(|t| t.cut += 1),
        Some(Ok(())) => {}
        Some(Err(LockError::Busy { .. })) => checker.count(|t| t.busy += 1),
        Some(Err(LockError::Lost { key })) => {
            checker.count(|t| t.lost += 1);
            // The promise holds where the watchdog asked on time (every third of the ttl, a
            // tenth of it late at most) and every answer came within a tenth of the ttl. A slow
            // store, or a process so short of CPU that even the asking ran late, breaks the
            // premise, not the promise; so this judges a watchdog that gives up on answers
            // that come in time, not one that stops asking.
            let ttl = Duration::from_millis(VARIANTS[op.call.variant].ttl_ms);
            let (slowest, gap) = ctx.run.book.timeliness(&key, Instant::now());
            let answers_in_time = slowest <= ttl / 10
                && gap <= ttl / 3 + ttl / 10
                && !starved_between(started, Instant::now());
            if op.must_keep_lease && !answers_in_time {
                checker.count(|t| t.unjudged += 1);
            } else if op.must_keep_lease {
                checker.report(
                    Kind::KeptLeaseLost,
                    format!(
                        "worker {}: the lease on `{key}` was lost though its renewals were asked on time and answered within a tenth of its ttl",
                        ctx.worker
                    ),
                );
            }
        }
        Some(Err(LockError::Backend(_))) => checker.count(|t| t.store_errors += 1),
        Some(Err(error)) => checker.report(
            Kind::Broken,
            format!("worker {}: unexpected error {error}", ctx.worker),
        ),
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "(no message)".into())
}

impl SeedPlan {
    /// A one-line description, for failure reports.
    pub fn describe(&self) -> String {
        format!(
            "{} seed, {} workers, {} keys, {} calls",
            match self.scenario {
                Scenario::Chaos => "chaos",
                Scenario::RenewalPressure => "renewal-pressure",
            },
            self.workers.len(),
            self.keys,
            self.calls()
        )
    }
}
