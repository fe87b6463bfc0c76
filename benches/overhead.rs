//! What `#[distributed_lock]` costs over taking a `Lease` by hand, on the in-memory store.
//!
//! ```text
//! cargo bench --bench overhead
//! ```
//!
//! Prints ns per call for: an annotated fn; the same body under a manually taken lease (the
//! baseline, measured in the same run, interleaved); the annotated fn with a metrics recorder
//! installed (a Prometheus exporter's, for the calling thread), against the same fn without one;
//! a re-entrant nested call; and the memory a held lease costs (store entry, lease state and
//! watchdog entry, counted by a global allocator). Targets: attribute ≤ 1.05× manual; nested
//! call ≤ 1 µs; ≤ 1 KiB per held lease. Without a recorder, dlock's metrics cost nothing to
//! speak of; the row with one says what recording costs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use dlock::{distributed_lock, LockError, LockOptions, Locker};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};

/// Counts live heap bytes, to measure what a held lease costs.
struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const KEYS: u64 = 1024;

#[distributed_lock(key = "bench:<id>", locker = locker)]
async fn annotated(locker: &Locker, id: u64) -> Result<u64, LockError> {
    Ok(black_box(id))
}

async fn manual(locker: &Locker, id: u64) -> Result<u64, LockError> {
    let lease = locker
        .lock(format!("bench:{id}"), LockOptions::new())
        .await?;
    let output = black_box(id);
    lease.release().await?;
    Ok(output)
}

#[distributed_lock(key = "bench:<id>", locker = locker)]
async fn nested_outer(locker: &Locker, id: u64, calls: u64) -> Result<Duration, LockError> {
    let started = Instant::now();
    for _ in 0..calls {
        nested_inner(locker, id).await?;
    }
    Ok(started.elapsed())
}

#[distributed_lock(key = "bench:<id>", locker = locker)]
async fn nested_inner(locker: &Locker, id: u64) -> Result<u64, LockError> {
    Ok(black_box(id))
}

async fn time_annotated(locker: &Locker, calls: u64) -> Duration {
    let started = Instant::now();
    for i in 0..calls {
        annotated(locker, i % KEYS).await.unwrap();
    }
    started.elapsed()
}

/// As [`time_annotated`], with `recorder` installed for this thread: a runtime polls the future
/// it blocks on on the calling thread, and the in-memory store's calls all happen in it.
async fn time_recorded(locker: &Locker, calls: u64, recorder: &PrometheusRecorder) -> Duration {
    let _installed = metrics::set_default_local_recorder(recorder);
    time_annotated(locker, calls).await
}

async fn time_manual(locker: &Locker, calls: u64) -> Duration {
    let started = Instant::now();
    for i in 0..calls {
        manual(locker, i % KEYS).await.unwrap();
    }
    started.elapsed()
}

fn ns_per(elapsed: Duration, calls: u64) -> f64 {
    elapsed.as_nanos() as f64 / calls as f64
}

async fn run(flavour: &str) {
    let locker = Locker::memory();
    let calls = 100_000;
    // Warm up, then interleave rounds so drift in the machine hits both sides alike; keep each
    // side's best round.
    let recorder = PrometheusBuilder::new().build_recorder();
    time_annotated(&locker, calls / 10).await;
    time_manual(&locker, calls / 10).await;
    time_recorded(&locker, calls / 10, &recorder).await;
    let (mut best_annotated, mut best_manual, mut best_recorded) = (f64::MAX, f64::MAX, f64::MAX);
    for _ in 0..7 {
        best_annotated = best_annotated.min(ns_per(time_annotated(&locker, calls).await, calls));
        best_manual = best_manual.min(ns_per(time_manual(&locker, calls).await, calls));
        best_recorded = best_recorded.min(ns_per(
            time_recorded(&locker, calls, &recorder).await,
            calls,
        ));
    }
    // The recorder did record: one wait and one hold per call.
    let text = recorder.handle().render();
    assert!(text.contains("dlock_hold_seconds"), "{text}");
    let nested_calls = 1_000_000;
    let nested = ns_per(
        nested_outer(&locker, 1, nested_calls).await.unwrap(),
        nested_calls,
    );
    println!("[{flavour}]");
    println!("  manual lease (baseline)   {best_manual:>8.0} ns/call");
    println!(
        "  #[distributed_lock]       {best_annotated:>8.0} ns/call   {:.3}x manual (target <= 1.05x)",
        best_annotated / best_manual
    );
    println!(
        "  with a recorder installed {best_recorded:>8.0} ns/call   {:.3}x #[distributed_lock] without one",
        best_recorded / best_annotated
    );
    println!("  re-entrant nested call    {nested:>8.0} ns/call   (target <= 1000 ns)");
}

async fn memory_per_lease() {
    let locker = Locker::memory();
    let leases = 10_000;
    // Key strings are part of the cost, so they are made inside the measured span.
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let mut held = Vec::with_capacity(leases);
    let vec_bytes = (leases * std::mem::size_of::<dlock::Lease>()) as isize;
    for i in 0..leases {
        held.push(
            locker
                .lock(
                    format!("order:{i:08}"),
                    LockOptions::new().ttl(Duration::from_secs(30)),
                )
                .await
                .unwrap(),
        );
    }
    let per_lease = (LIVE_BYTES.load(Ordering::Relaxed) - before - vec_bytes) as f64
        / leases as f64
        + std::mem::size_of::<dlock::Lease>() as f64;
    println!("[memory]\n  per held lease            {per_lease:>8.0} bytes      (target <= 1024; {leases} leases, renewed)");
    drop(held);
}

fn main() {
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    current.block_on(run("current-thread runtime"));
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    multi.block_on(run("multi-thread runtime"));
    current.block_on(memory_per_lease());
}
