//! dlock on Redis against the raw `redis` crate and `rslock`, measured in one run.
//!
//! ```text
//! cargo run --release --manifest-path bench/Cargo.toml            # redis://127.0.0.1:6379
//! cargo run --release --manifest-path bench/Cargo.toml -- w1 w2   # only these workloads
//! cargo run --release --manifest-path bench/Cargo.toml -- w4 processes=8 tasks=1
//! DLOCK_REDIS_URL=redis://host:port cargo run --release --manifest-path bench/Cargo.toml
//! ```
//!
//! - W1 uncontended: sequential acquire + release on distinct keys; pairs/s, p50, p99; on
//!   tokio's current-thread and multi-thread runtimes (the flavour alone moves raw clients ~35%).
//! - W2 contended: 8 tasks on one key, a GET-then-SET counter increment as the critical section;
//!   critical sections/s, lost updates, p50/p99/max wait, critical sections per worker.
//! - W3 scale: 10,000 leases held at once (ttl 3 s): renewal round trips per tick, client CPU,
//!   memory per held lease.
//! - W4 across processes: the W2 critical section on one key from N processes of M tasks each
//!   (default 4 × 2), each process with a `Locker` (or client) of its own, for a fixed time: the
//!   bench runs copies of itself as the processes.
//!
//! Every row also says how many commands the server ran per operation (an acquire + release
//! pair, or a critical section with its two commands), read from `INFO commandstats`, which
//! counts the commands a script runs as well as the script's own `EVALSHA`. Other clients of
//! the same server count too: point the bench at a server of its own for those figures.
//!
//! Baselines: the raw `redis` crate doing the same two commands (`SET NX PX`, then an `EVALSHA`
//! compare-and-delete; waiting by a 1 ms poll), and `rslock` 0.10.

use std::alloc::{GlobalAlloc, Layout, System};
use std::future::Future;
use std::sync::atomic::{AtomicIsize, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dlock::backend::{AcquireRequest, Acquired, Backend, RedisBackend, Renewal};
use dlock::{LockError, LockOptions, Locker, Owner};
use redis::AsyncCommands;

struct CountingAllocator;
static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for CountingAllocator {
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
static ALLOCATOR: CountingAllocator = CountingAllocator;

const W1_PAIRS: usize = 20_000;
const W2_SECTIONS: usize = 10_000;
const W2_WORKERS: usize = 8;
const W3_LEASES: usize = 10_000;
/// How long each W4 row runs.
const W4_RUN: Duration = Duration::from_secs(4);

const RELEASE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

fn url() -> String {
    std::env::var("DLOCK_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn micros(d: Duration) -> String {
    format!("{:.0}µs", d.as_secs_f64() * 1e6)
}

/// Reads how many commands the server ran: `INFO commandstats`, summed. A script's `EVALSHA`
/// counts once and every command it runs counts too, as Redis counts them. Left out: the `INFO`
/// calls that read it, and what connections run to set themselves up (`HELLO`, `CLIENT`,
/// `SELECT`, `AUTH`), which a longer run would spread thinner.
struct Commands(redis::aio::MultiplexedConnection);

impl Commands {
    async fn connect() -> Commands {
        let client = redis::Client::open(url()).unwrap();
        Commands(client.get_multiplexed_async_connection().await.unwrap())
    }

    async fn so_far(&mut self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.0)
            .await
            .unwrap();
        info.lines()
            .filter_map(|line| line.strip_prefix("cmdstat_"))
            .filter_map(|line| {
                let (name, rest) = line.split_once(":calls=")?;
                let calls: u64 = rest.split(',').next()?.parse().ok()?;
                let set_up = ["info", "hello", "client", "select", "auth"]
                    .iter()
                    .any(|skip| name == *skip || name.starts_with(&format!("{skip}|")));
                (!set_up).then_some(calls)
            })
            .sum()
    }
}

/// A lock implementation under test: acquire waits up to `wait` (zero: try once).
trait Contender: Clone + Send + Sync + 'static {
    type Guard: Send;
    fn acquire(
        &self,
        key: String,
        wait: Duration,
    ) -> impl Future<Output = Option<Self::Guard>> + Send;
    fn release(&self, guard: Self::Guard) -> impl Future<Output = ()> + Send;
}

#[derive(Clone)]
struct Dlock(Locker);

impl Contender for Dlock {
    type Guard = dlock::Lease;
    async fn acquire(&self, key: String, wait: Duration) -> Option<dlock::Lease> {
        self.0
            .lock(
                key,
                LockOptions::new().ttl(Duration::from_secs(30)).wait(wait),
            )
            .await
            .ok()
    }
    async fn release(&self, lease: dlock::Lease) {
        lease.release().await.unwrap();
    }
}

/// The two raw commands; waiting is a 1 ms poll.
#[derive(Clone)]
struct Raw {
    connection: redis::aio::MultiplexedConnection,
    release: Arc<redis::Script>,
}

impl Raw {
    async fn connect() -> Raw {
        let client = redis::Client::open(url()).unwrap();
        Raw {
            connection: client.get_multiplexed_async_connection().await.unwrap(),
            release: Arc::new(redis::Script::new(RELEASE)),
        }
    }
}

impl Contender for Raw {
    type Guard = (String, String);
    async fn acquire(&self, key: String, wait: Duration) -> Option<(String, String)> {
        let owner = Owner::random().to_string();
        let deadline = Instant::now() + wait;
        let mut connection = self.connection.clone();
        loop {
            let set: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg(&owner)
                .arg("NX")
                .arg("PX")
                .arg(30_000)
                .query_async(&mut connection)
                .await
                .unwrap();
            if set.is_some() {
                return Some((key, owner));
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    async fn release(&self, (key, owner): (String, String)) {
        let mut connection = self.connection.clone();
        let _: i64 = self
            .release
            .key(key)
            .arg(owner)
            .invoke_async(&mut connection)
            .await
            .unwrap();
    }
}

#[derive(Clone)]
struct Rslock(Arc<rslock::LockManager>);

impl Contender for Rslock {
    type Guard = rslock::Lock;
    async fn acquire(&self, key: String, wait: Duration) -> Option<rslock::Lock> {
        let deadline = Instant::now() + wait;
        loop {
            if let Ok(lock) = self.0.lock(key.as_bytes(), Duration::from_secs(30)).await {
                return Some(lock);
            }
            if Instant::now() >= deadline {
                return None;
            }
        }
    }
    async fn release(&self, lock: rslock::Lock) {
        self.0.unlock(&lock).await;
    }
}

fn rslock_manager() -> Rslock {
    let mut manager = rslock::LockManager::new(vec![url()]);
    // One try per `lock` call: the waiting loop above is the same for every contender.
    manager.set_retry(1, Duration::from_millis(1));
    Rslock(Arc::new(manager))
}

async fn w1<C: Contender>(lock: &C, round: &str) -> (f64, Duration, Duration) {
    let mut latencies = Vec::with_capacity(W1_PAIRS);
    let started = Instant::now();
    for i in 0..W1_PAIRS {
        let t = Instant::now();
        let guard = lock
            .acquire(
                format!("bench:{}:w1:{round}:{i}", std::process::id()),
                Duration::ZERO,
            )
            .await
            .expect("uncontended key busy");
        lock.release(guard).await;
        latencies.push(t.elapsed());
    }
    let rate = W1_PAIRS as f64 / started.elapsed().as_secs_f64();
    latencies.sort();
    (
        rate,
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
    )
}

async fn w1_all(flavour: &str) -> Vec<(String, f64)> {
    let dlock = Dlock(Locker::connect(&url()).await.unwrap());
    let raw = Raw::connect().await;
    let rslock = rslock_manager();
    let mut stats = Commands::connect().await;
    let mut best: Vec<(&str, (f64, Duration, Duration))> = vec![
        ("raw redis", (0.0, Duration::ZERO, Duration::ZERO)),
        ("dlock", (0.0, Duration::ZERO, Duration::ZERO)),
        ("rslock", (0.0, Duration::ZERO, Duration::ZERO)),
    ];
    let mut commands = [0u64; 3];
    // Interleaved rounds; each contender keeps its best.
    for round in 0..3 {
        let mut results = Vec::new();
        for (contender, count) in commands.iter_mut().enumerate() {
            let before = stats.so_far().await;
            results.push(match contender {
                0 => w1(&raw, &format!("raw{round}")).await,
                1 => w1(&dlock, &format!("dlock{round}")).await,
                _ => w1(&rslock, &format!("rslock{round}")).await,
            });
            *count += stats.so_far().await - before;
        }
        for (slot, result) in best.iter_mut().zip(results) {
            if result.0 > slot.1 .0 {
                slot.1 = result;
            }
        }
    }
    println!("W1 uncontended, {W1_PAIRS} acquire+release pairs on distinct keys, {flavour} runtime (best of 3)");
    let raw_rate = best[0].1 .0;
    for ((name, (rate, p50, p99)), commands) in best.iter().zip(commands) {
        println!(
            "  {name:<10} {rate:>7.0} pairs/s  {:.2}x raw  p50 {}  p99 {}  {:.1} commands/pair",
            rate / raw_rate,
            micros(*p50),
            micros(*p99),
            commands as f64 / (3 * W1_PAIRS) as f64,
        );
    }
    best.iter().map(|(n, r)| (n.to_string(), r.0)).collect()
}

async fn w2<C: Contender>(name: &str, lock: C, counter_key: &str) {
    let mut connection = redis::Client::open(url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = connection.set(counter_key, 0).await.unwrap();
    let mut stats = Commands::connect().await;
    let commands_before = stats.so_far().await;
    let done = Arc::new(AtomicU64::new(0));
    let waits = Arc::new(Mutex::new(Vec::with_capacity(W2_SECTIONS + W2_WORKERS)));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..W2_WORKERS {
        let (lock, done, waits, mut connection) = (
            lock.clone(),
            done.clone(),
            waits.clone(),
            connection.clone(),
        );
        let counter_key = counter_key.to_owned();
        workers.push(tokio::spawn(async move {
            let mut mine = 0u64;
            while done.load(Ordering::SeqCst) < W2_SECTIONS as u64
                && started.elapsed() < Duration::from_secs(60)
            {
                let t = Instant::now();
                let Some(guard) = lock
                    .acquire(
                        format!("bench:{}:w2", std::process::id()),
                        Duration::from_secs(60),
                    )
                    .await
                else {
                    continue;
                };
                waits.lock().unwrap().push(t.elapsed());
                let value: u64 = connection.get(&counter_key).await.unwrap();
                let _: () = connection.set(&counter_key, value + 1).await.unwrap();
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
    let commands = stats.so_far().await - commands_before;
    let sections: u64 = per_worker.iter().sum();
    let counter: u64 = connection.get(counter_key).await.unwrap();
    let waits = waits.lock().unwrap().clone();
    print_contended(
        name,
        sections as f64 / elapsed.as_secs_f64(),
        sections - counter,
        waits,
        &per_worker,
        commands as f64 / sections as f64,
    );
}

/// One row of a contended workload.
fn print_contended(
    name: &str,
    rate: f64,
    lost: u64,
    mut waits: Vec<Duration>,
    per_worker: &[u64],
    commands: f64,
) {
    waits.sort();
    println!(
        "  {name:<10} {rate:>6.0} cs/s  lost {lost}  wait p50 {}  p99 {}  max {}  per worker {}–{}  {commands:.1} commands/cs",
        micros(percentile(&waits, 0.5)),
        micros(percentile(&waits, 0.99)),
        micros(*waits.last().unwrap_or(&Duration::ZERO)),
        per_worker.iter().min().unwrap_or(&0),
        per_worker.iter().max().unwrap_or(&0),
    );
}

/// The processes and tasks of W4.
#[derive(Clone, Copy)]
struct Shape {
    processes: usize,
    tasks: usize,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

async fn w4_all(shape: Shape) {
    println!(
        "W4 across processes: {} processes × {} tasks, one key, GET-then-SET counter, {:.0} s each",
        shape.processes,
        shape.tasks,
        W4_RUN.as_secs_f64()
    );
    for contender in ["raw", "dlock", "rslock"] {
        w4(contender, shape).await;
    }
}

/// Runs `contender` in `shape.processes` copies of this binary, all on one key, and sums up
/// what they report.
async fn w4(contender: &str, shape: Shape) {
    let pid = std::process::id();
    let lock_key = format!("bench:{pid}:w4:{contender}");
    let counter_key = format!("bench:{pid}:w4:counter:{contender}");
    let mut connection = redis::Client::open(url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = connection.set(&counter_key, 0).await.unwrap();
    let mut stats = Commands::connect().await;
    let before = stats.so_far().await;
    // Time for every copy to start, connect and warm up before the common start.
    let start_at = unix_ms() + 2_000;
    let children: Vec<_> = (0..shape.processes)
        .map(|_| {
            tokio::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--child",
                    contender,
                    &lock_key,
                    &counter_key,
                    &shape.tasks.to_string(),
                    &start_at.to_string(),
                ])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut per_worker = Vec::new();
    let mut waits = Vec::new();
    let mut end = start_at;
    for child in children {
        let output = child.wait_with_output().await.unwrap();
        assert!(output.status.success(), "a W4 process failed");
        for line in String::from_utf8(output.stdout).unwrap().lines() {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("worker") => per_worker.push(words.next().unwrap().parse().unwrap()),
                Some("waits") => {
                    waits.extend(words.map(|w| Duration::from_micros(w.parse().unwrap())))
                }
                Some("end") => end = end.max(words.next().unwrap().parse().unwrap()),
                _ => {}
            }
        }
    }
    let commands = stats.so_far().await - before;
    let sections: u64 = per_worker.iter().sum();
    let counter: u64 = connection.get(&counter_key).await.unwrap();
    let name = if contender == "raw" {
        "raw poll"
    } else {
        contender
    };
    print_contended(
        name,
        sections as f64 / ((end - start_at) as f64 / 1e3),
        sections - counter,
        waits,
        &per_worker,
        commands as f64 / sections as f64,
    );
}

/// One W4 process: `tasks` tasks of `lock` on one key from `start_at` (Unix ms) for `W4_RUN`;
/// prints each task's count of critical sections, every wait in µs, and when it ended.
async fn w4_child<C: Contender>(
    lock: C,
    lock_key: String,
    counter_key: String,
    tasks: usize,
    start_at: u64,
) {
    let connection = redis::Client::open(url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // Warm up on a key of its own: connections made, scripts loaded.
    let warm = lock
        .acquire(
            format!("{lock_key}:warm:{}", std::process::id()),
            Duration::ZERO,
        )
        .await
        .expect("the warm-up key is busy");
    lock.release(warm).await;
    tokio::time::sleep(Duration::from_millis(start_at.saturating_sub(unix_ms()))).await;
    let deadline = Instant::now() + W4_RUN;
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let (lock, lock_key, counter_key, mut connection) = (
                lock.clone(),
                lock_key.clone(),
                counter_key.clone(),
                connection.clone(),
            );
            tokio::spawn(async move {
                let (mut mine, mut waits) = (0u64, Vec::new());
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let Some(guard) = lock
                        .acquire(lock_key.clone(), Duration::from_secs(60))
                        .await
                    else {
                        continue;
                    };
                    waits.push(t.elapsed());
                    let value: u64 = connection.get(&counter_key).await.unwrap();
                    let _: () = connection.set(&counter_key, value + 1).await.unwrap();
                    lock.release(guard).await;
                    mine += 1;
                }
                (mine, waits)
            })
        })
        .collect();
    let mut all_waits = Vec::new();
    for worker in workers {
        let (mine, waits) = worker.await.unwrap();
        println!("worker {mine}");
        all_waits.extend(waits);
    }
    println!("end {}", unix_ms());
    let waits: Vec<String> = all_waits
        .iter()
        .map(|wait| wait.as_micros().to_string())
        .collect();
    println!("waits {}", waits.join(" "));
}

/// Counts renewal calls — one pipelined round trip each — and the leases they carry.
#[derive(Clone)]
struct CountingRenewals {
    inner: RedisBackend,
    calls: Arc<AtomicU64>,
    leases: Arc<AtomicU64>,
}

impl Backend for CountingRenewals {
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Option<Acquired>, LockError> {
        self.inner.acquire(request).await
    }
    async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        self.inner.release(key, owner).await
    }
    async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.leases.fetch_add(leases.len() as u64, Ordering::SeqCst);
        self.inner.renew(leases).await
    }
}

fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks: u64 = fields.get(11).and_then(|u| u.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|s| s.parse().ok()).unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

async fn w3() {
    let backend = CountingRenewals {
        inner: RedisBackend::connect(&url()).await.unwrap(),
        calls: Arc::default(),
        leases: Arc::default(),
    };
    let locker = Locker::with_backend(backend.clone());
    let ttl = Duration::from_secs(3);
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let mut leases = Vec::with_capacity(W3_LEASES);
    let held_bytes = (W3_LEASES * std::mem::size_of::<dlock::Lease>()) as isize;
    for i in 0..W3_LEASES {
        leases.push(
            locker
                .lock(
                    format!("bench:{}:w3:{i}", std::process::id()),
                    LockOptions::new().ttl(ttl),
                )
                .await
                .unwrap(),
        );
    }
    let per_lease = (LIVE_BYTES.load(Ordering::Relaxed) - before - held_bytes) as f64
        / W3_LEASES as f64
        + std::mem::size_of::<dlock::Lease>() as f64;
    let mut stats = Commands::connect().await;
    let commands0 = stats.so_far().await;
    let (calls0, leases0, cpu0, t0) = (
        backend.calls.load(Ordering::SeqCst),
        backend.leases.load(Ordering::SeqCst),
        cpu_time(),
        Instant::now(),
    );
    let ticks = 6; // six renewal periods of ttl/3
    tokio::time::sleep(ttl / 3 * ticks).await;
    let calls = backend.calls.load(Ordering::SeqCst) - calls0;
    let renewed = backend.leases.load(Ordering::SeqCst) - leases0;
    let commands = stats.so_far().await - commands0;
    let cpu = cpu_time() - cpu0;
    let held = leases.iter().filter(|l| l.is_held()).count();
    println!(
        "W3 scale: {W3_LEASES} leases held, ttl 3 s, over {ticks} renewal periods ({:.1} s)",
        t0.elapsed().as_secs_f64()
    );
    println!(
        "  {:.1} renewal round trips per tick ({calls} for {renewed} renewals), {held} leases held at the end, {:.1} commands per renewal",
        calls as f64 / ticks as f64,
        commands as f64 / renewed.max(1) as f64,
    );
    println!(
        "  client CPU {:.1}% of one core while holding; {per_lease:.0} bytes per held lease",
        100.0 * cpu.as_secs_f64() / t0.elapsed().as_secs_f64()
    );
    drop(leases);
}

async fn w2_all() {
    println!("W2 contended: {W2_WORKERS} tasks, one key, GET-then-SET counter, {W2_SECTIONS} critical sections");
    w2("raw poll", Raw::connect().await, "bench:w2:counter:raw").await;
    w2(
        "dlock",
        Dlock(Locker::connect(&url()).await.unwrap()),
        "bench:w2:counter:dlock",
    )
    .await;
    w2("rslock", rslock_manager(), "bench:w2:counter:rslock").await;
}

/// Deletes what this run left in Redis: the baselines' keys and dlock's fence hashes, which
/// never expire by design.
async fn clean_up() {
    let mut connection = redis::Client::open(url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let pid = std::process::id();
    for pattern in [
        format!("bench:{pid}:*"),
        format!("dlock:{{bench:{pid}:*"),
        "bench:w2:counter:*".to_owned(),
    ] {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(&pattern)
            .query_async(&mut connection)
            .await
            .unwrap();
        for chunk in keys.chunks(1_000) {
            let _: () = redis::cmd("DEL")
                .arg(chunk)
                .query_async(&mut connection)
                .await
                .unwrap();
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        return child(&args[1..]);
    }
    // Workloads named on the command line (`w1` … `w4`), or all of them; `processes=N` and
    // `tasks=M` shape W4.
    let mut shape = Shape {
        processes: 4,
        tasks: 2,
    };
    let mut only = Vec::new();
    for arg in args {
        if let Some(n) = arg.strip_prefix("processes=") {
            shape.processes = n.parse().expect("processes=N");
        } else if let Some(n) = arg.strip_prefix("tasks=") {
            shape.tasks = n.parse().expect("tasks=M");
        } else {
            only.push(arg);
        }
    }
    let run = |workload: &str| only.is_empty() || only.iter().any(|w| w == workload);
    println!("redis at {}\n", url());
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let multi = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if run("w1") {
        current.block_on(w1_all("current-thread"));
        multi.block_on(w1_all("multi-thread"));
        println!();
    }
    if run("w2") {
        multi.block_on(w2_all());
        println!();
    }
    if run("w3") {
        multi.block_on(w3());
        println!();
    }
    if run("w4") {
        multi.block_on(w4_all(shape));
    }
    multi.block_on(clean_up());
}

/// A W4 process, started by `w4` as `--child CONTENDER LOCK_KEY COUNTER_KEY TASKS START_AT`.
fn child(args: &[String]) {
    let [contender, lock_key, counter_key, tasks, start_at] = args else {
        panic!("--child CONTENDER LOCK_KEY COUNTER_KEY TASKS START_AT");
    };
    let (lock_key, counter_key) = (lock_key.clone(), counter_key.clone());
    let tasks = tasks.parse().unwrap();
    let start_at = start_at.parse().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        match contender.as_str() {
            "raw" => w4_child(Raw::connect().await, lock_key, counter_key, tasks, start_at).await,
            "dlock" => {
                let locker = Locker::connect(&url()).await.unwrap();
                w4_child(
                    Dlock(locker.clone()),
                    lock_key,
                    counter_key,
                    tasks,
                    start_at,
                )
                .await;
                locker.shutdown().await.unwrap();
            }
            _ => w4_child(rslock_manager(), lock_key, counter_key, tasks, start_at).await,
        }
    });
}
