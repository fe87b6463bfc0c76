//! Correct under failure: scenarios that break the network, the server or a client while several
//! OS processes run critical sections on shared keys, and a checker that judges what they did.
//!
//! Each scenario starts its worker processes (this test binary again, running the ignored test
//! [`fault_worker`]), each with a `Locker` of its own whose connections pass through a
//! [`FaultProxy`] of its own. A worker's body reads a counter, pauses, writes it back plus one
//! (a lost update if two bodies overlap), and logs when it entered and left by the clock of a
//! private Redis all processes share (the *data server*, never faulted). The checker
//! ([`support::history`]) then asserts: no two bodies of one key overlapped, fences increased in
//! the order of entry, no increment was lost. Each scenario prints a row of the README's table.

mod support;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backend::{MysqlBackend, ZookeeperBackend};
use dlock::{distributed_lock, LockError, Locker, Owner};
use support::fault_proxy::{Direction, FaultProxy};
use support::history::{self, Event, Log, Section, Verdict};
use support::redis_server::RedisServer;
use support::zk_server::ZkServer;

/// The lease of every worker's body (the attribute's `ttl` below says the same).
const TTL: Duration = Duration::from_secs(2);

/// The renewal period: the longest a dead holder's lease can have been renewed before its death.
const RENEW_PERIOD: Duration = Duration::from_millis(667);

// ---------------------------------------------------------------------------------------------
// The worker process

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Memory,
    Redis,
    Mysql,
    Zookeeper,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Redis => "redis",
            Backend::Mysql => "mysql",
            Backend::Zookeeper => "zookeeper",
        }
    }

    fn parse(name: &str) -> Backend {
        match name {
            "memory" => Backend::Memory,
            "redis" => Backend::Redis,
            "mysql" => Backend::Mysql,
            "zookeeper" => Backend::Zookeeper,
            other => panic!("unknown backend {other}"),
        }
    }
}

/// What a worker's bodies do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Body {
    /// [`count`]: read, pause, write plus one, under the lock.
    Count,
    /// [`write_fenced`]: pause, then a fenced write, running on after a loss.
    WriteFenced,
    /// [`count_unlocked`]: the counting body without the lock — the control that shows the
    /// checker sees what a broken lock would do.
    CountUnlocked,
}

impl Body {
    fn name(self) -> &'static str {
        match self {
            Body::Count => "count",
            Body::WriteFenced => "write-fenced",
            Body::CountUnlocked => "count-unlocked",
        }
    }

    fn parse(name: &str) -> Body {
        match name {
            "count" => Body::Count,
            "write-fenced" => Body::WriteFenced,
            "count-unlocked" => Body::CountUnlocked,
            other => panic!("unknown body {other}"),
        }
    }
}

/// What one worker process does; passed to it in `DLOCK_FAULT_WORKER` as `name=value` words.
#[derive(Clone, Debug)]
struct WorkerSpec {
    name: String,
    backend: Backend,
    /// The lock server's URL, through the worker's proxy.
    lock_url: String,
    /// The MySQL lock table.
    table: String,
    data_url: String,
    keys: Vec<String>,
    /// Concurrent tasks running bodies.
    tasks: usize,
    /// No body starts after this long.
    run_for: Duration,
    /// Each task stops after this many bodies entered.
    sections: usize,
    /// The pause between reading and writing the counter.
    work: Duration,
    body: Body,
    log: PathBuf,
}

impl WorkerSpec {
    fn encode(&self) -> String {
        format!(
            "name={} backend={} lock_url={} table={} data_url={} keys={} tasks={} run_ms={} \
             sections={} work_ms={} body={} log={}",
            self.name,
            self.backend.name(),
            self.lock_url,
            self.table,
            self.data_url,
            self.keys.join(","),
            self.tasks,
            self.run_for.as_millis(),
            self.sections,
            self.work.as_millis(),
            self.body.name(),
            self.log.display()
        )
    }

    fn decode(text: &str) -> WorkerSpec {
        let fields: BTreeMap<&str, &str> = text
            .split(' ')
            .filter_map(|word| word.split_once('='))
            .collect();
        let field = |name: &str| *fields.get(name).unwrap_or_else(|| panic!("no {name}"));
        let millis = |name: &str| Duration::from_millis(field(name).parse().unwrap());
        WorkerSpec {
            name: field("name").into(),
            backend: Backend::parse(field("backend")),
            lock_url: field("lock_url").into(),
            table: field("table").into(),
            data_url: field("data_url").into(),
            keys: field("keys").split(',').map(String::from).collect(),
            tasks: field("tasks").parse().unwrap(),
            run_for: millis("run_ms"),
            sections: field("sections").parse().unwrap(),
            work: millis("work_ms"),
            body: Body::parse(field("body")),
            log: field("log").into(),
        }
    }
}

/// What a body needs besides its key.
struct Context {
    data: redis::aio::MultiplexedConnection,
    log: Log,
    work: Duration,
    worker: String,
}

impl Context {
    /// Now, by the data server's clock, in microseconds.
    async fn now(&self) -> i64 {
        let (seconds, micros): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut self.data.clone())
            .await
            .expect("the data server keeps time");
        seconds * 1_000_000 + micros
    }

    async fn record(&self, kind: &str, key: &str, fence: u64) {
        self.log.record(kind, key, fence, self.now().await);
    }
}

/// Stores `value` with `fence` unless the stored fence is as new or newer: the check a store
/// makes to reject a stale holder's write.
const FENCED_WRITE: &str = r"
local stored = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) <= stored then return 0 end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return 1";

/// The counting body: read, pause, write plus one.
#[distributed_lock(key = "<key>", ttl = "2s", wait = "30s", locker = locker)]
async fn count(
    locker: &Locker,
    key: &str,
    context: &Context,
    entered: &AtomicU64,
) -> Result<(), LockError> {
    let fence = dlock::current_lease().expect("inside the body").fence();
    increment(key, fence, context, entered).await;
    Ok(())
}

/// [`count`]'s body with no lock: fences are made up, one per body, increasing per process only.
async fn count_unlocked(key: &str, context: &Context, entered: &AtomicU64) {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    increment(key, NEXT.fetch_add(1, Ordering::SeqCst), context, entered).await;
}

/// Logs the entry, reads `key`'s counter, pauses, writes it back plus one, logs the exit.
async fn increment(key: &str, fence: u64, context: &Context, entered: &AtomicU64) {
    entered.store(fence, Ordering::SeqCst);
    context.record("enter", key, fence).await;
    let counter = format!("counter:{key}");
    let mut data = context.data.clone();
    let value: Option<u64> = redis::cmd("GET")
        .arg(&counter)
        .query_async(&mut data)
        .await
        .unwrap();
    tokio::time::sleep(context.work).await;
    let () = redis::cmd("SET")
        .arg(&counter)
        .arg(value.unwrap_or(0) + 1)
        .query_async(&mut data)
        .await
        .unwrap();
    context.record("exit", key, fence).await;
}

/// The fenced body: pause, then write with the fence; a holder that lost its lease meanwhile
/// runs on (`on_lost = "continue"`) and its write is judged by the data server alone.
#[distributed_lock(key = "<key>", ttl = "2s", wait = "30s", locker = locker, on_lost = "continue")]
async fn write_fenced(
    locker: &Locker,
    key: &str,
    context: &Context,
    entered: &AtomicU64,
) -> Result<(), LockError> {
    let fence = dlock::current_lease().expect("inside the body").fence();
    entered.store(fence, Ordering::SeqCst);
    context.record("enter", key, fence).await;
    tokio::time::sleep(context.work).await;
    let held = dlock::current_lease().expect("inside the body").is_held();
    let accepted: bool = redis::Script::new(FENCED_WRITE)
        .key(format!("fenced:{key}"))
        .arg(fence)
        .arg(&context.worker)
        .invoke_async(&mut context.data.clone())
        .await
        .unwrap();
    let verdict = if accepted { "accepted" } else { "rejected" };
    context.record(verdict, key, fence).await;
    context
        .record(if held { "held" } else { "unheld" }, key, fence)
        .await;
    context.record("exit", key, fence).await;
    Ok(())
}

/// Connects the worker's `Locker`, retrying while its server is unreachable.
async fn connect(spec: &WorkerSpec) -> Locker {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let attempt = match spec.backend {
            Backend::Memory => panic!("the memory store cannot be shared between processes"),
            Backend::Redis => Locker::redis(&spec.lock_url).await,
            Backend::Mysql => match MysqlBackend::builder(&spec.lock_url) {
                Ok(builder) => builder
                    .table(&spec.table)
                    .max_connections(4)
                    .connect()
                    .await
                    .map(Locker::with_backend),
                Err(error) => Err(error),
            },
            Backend::Zookeeper => match ZookeeperBackend::builder(&spec.lock_url) {
                Ok(builder) => builder
                    .session_timeout(TTL)
                    .connect()
                    .await
                    .map(Locker::with_backend),
                Err(error) => Err(error),
            },
        };
        match attempt {
            Ok(locker) => return locker,
            Err(error) if Instant::now() > deadline => panic!("cannot connect: {error}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn run_worker(spec: WorkerSpec) {
    let locker = connect(&spec).await;
    let data = redis::Client::open(spec.data_url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("the data server answers");
    let context = Arc::new(Context {
        data,
        log: Log::create(&spec.log, &spec.name),
        work: spec.work,
        worker: spec.name.clone(),
    });
    let deadline = Instant::now() + spec.run_for;
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..spec.tasks {
        let (locker, context, spec) = (locker.clone(), context.clone(), spec.clone());
        tasks.spawn(async move { run_bodies(&locker, &context, &spec, task, deadline).await });
    }
    while let Some(task) = tasks.join_next().await {
        task.unwrap();
    }
}

/// One task of a worker: bodies on the keys in turn, from the `first`, until `deadline` or
/// `spec.sections` bodies entered.
async fn run_bodies(
    locker: &Locker,
    context: &Context,
    spec: &WorkerSpec,
    first: usize,
    deadline: Instant,
) {
    let mut entered_bodies = 0;
    let mut turn = first;
    while Instant::now() < deadline && entered_bodies < spec.sections {
        let key = &spec.keys[turn % spec.keys.len()];
        turn += 1;
        let entered = AtomicU64::new(0);
        let result = match spec.body {
            Body::Count => count(locker, key, context, &entered).await,
            Body::WriteFenced => write_fenced(locker, key, context, &entered).await,
            Body::CountUnlocked => {
                count_unlocked(key, context, &entered).await;
                Ok(())
            }
        };
        let fence = entered.load(Ordering::SeqCst);
        if fence != 0 {
            entered_bodies += 1;
        }
        match result {
            Ok(()) => {}
            Err(LockError::Lost { .. }) => context.record("lost", key, fence).await,
            // Busy after `wait`, or the store unreachable: try again, as a service would.
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// The worker process: runs only when a scenario starts it, with `DLOCK_FAULT_WORKER` set.
#[test]
#[ignore = "a worker process of the fault scenarios, which start it themselves"]
fn fault_worker() {
    let Ok(spec) = std::env::var("DLOCK_FAULT_WORKER") else {
        eprintln!("fault_worker only runs as a process started by a fault scenario");
        return;
    };
    let spec = WorkerSpec::decode(&spec);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(run_worker(spec));
}

// ---------------------------------------------------------------------------------------------
// The scenario harness

fn mysql_url() -> String {
    std::env::var("DLOCK_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// The lock server of a scenario.
enum LockServer {
    /// A private server that keeps every write in its append-only file, so a restart loses no
    /// lease: the configuration dlock documents for surviving a restart.
    Redis(RedisServer),
    /// The shared MariaDB (never restarted): a table of the scenario's own.
    Mysql {
        table: String,
    },
    Zookeeper(ZkServer),
    /// The memory store lives in the test process.
    None,
}

impl LockServer {
    fn start(backend: Backend) -> LockServer {
        match backend {
            Backend::Memory => LockServer::None,
            Backend::Redis => LockServer::Redis(RedisServer::start_persistent()),
            Backend::Mysql => LockServer::Mysql {
                table: format!("dlock_faults_{}", &Owner::random().to_string()[..12]),
            },
            Backend::Zookeeper => LockServer::Zookeeper(ZkServer::start_new()),
        }
    }

    fn url(&self) -> String {
        match self {
            LockServer::Redis(server) => server.url(),
            LockServer::Mysql { .. } => mysql_url(),
            LockServer::Zookeeper(server) => server.url(),
            LockServer::None => "memory://".into(),
        }
    }
}

impl Drop for LockServer {
    fn drop(&mut self) {
        let LockServer::Mysql { table } = self else {
            return;
        };
        let table = table.clone();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            if let Ok(admin) = sqlx::mysql::MySqlPool::connect(&mysql_url()).await {
                let drop_table = format!("DROP TABLE IF EXISTS `{table}`");
                let _ = sqlx::query(sqlx::AssertSqlSafe(drop_table))
                    .execute(&admin)
                    .await;
            }
        });
    }
}

/// One worker process of a scenario.
struct Worker {
    spec: WorkerSpec,
    proxy: FaultProxy,
    child: Child,
}

/// A scenario: the servers, the workers, and what was done to them.
struct Scenario {
    name: &'static str,
    backend: Backend,
    dir: PathBuf,
    keys: Vec<String>,
    data_server: RedisServer,
    data: redis::Connection,
    lock_server: LockServer,
    workers: Vec<Worker>,
    killed: BTreeMap<String, i64>,
    started: Instant,
}

impl Scenario {
    fn new(name: &'static str, backend: Backend, keys: usize) -> Scenario {
        let tag = Owner::random().to_string()[..8].to_owned();
        let dir = std::env::temp_dir().join(format!("dlock-faults-{name}-{tag}"));
        std::fs::create_dir_all(&dir).unwrap();
        let data_server = RedisServer::start();
        let data = redis::Client::open(data_server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        Scenario {
            name,
            backend,
            dir,
            keys: (0..keys).map(|i| format!("{name}-{tag}-{i}")).collect(),
            data_server,
            data,
            lock_server: LockServer::start(backend),
            workers: Vec::new(),
            killed: BTreeMap::new(),
            started: Instant::now(),
        }
    }

    /// A worker's spec with this scenario's defaults: one task, bodies of 5 ms on every key,
    /// for `run_for`.
    fn spec(&self, name: &str, run_for: Duration) -> WorkerSpec {
        WorkerSpec {
            name: name.into(),
            backend: self.backend,
            lock_url: String::new(),
            table: match &self.lock_server {
                LockServer::Mysql { table } => table.clone(),
                _ => "dlock_locks".into(),
            },
            data_url: self.data_server.url(),
            keys: self.keys.clone(),
            tasks: 1,
            run_for,
            sections: usize::MAX,
            work: Duration::from_millis(5),
            body: Body::Count,
            log: self.dir.join(format!("{name}.log")),
        }
    }

    /// Starts a worker behind a proxy of its own, its command prefixed by `wrapper` (e.g.
    /// `faketime`) if any; returns its index.
    fn spawn(&mut self, mut spec: WorkerSpec, wrapper: &[&str]) -> usize {
        let (proxy, lock_url) = FaultProxy::in_front_of(&self.lock_server.url());
        spec.lock_url = lock_url;
        let exe = std::env::current_exe().unwrap();
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(exe);
                command
            }
            None => Command::new(exe),
        };
        let output = File::create(self.dir.join(format!("{}.out", spec.name))).unwrap();
        let child = command
            .args(["fault_worker", "--exact", "--ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .env("DLOCK_FAULT_WORKER", spec.encode())
            .stdin(Stdio::null())
            .stdout(output.try_clone().unwrap())
            .stderr(output)
            .spawn()
            .expect("cannot start a worker process");
        self.workers.push(Worker { spec, proxy, child });
        self.workers.len() - 1
    }

    fn proxy(&self, worker: usize) -> &FaultProxy {
        &self.workers[worker].proxy
    }

    /// Now, by the data server's clock, in microseconds.
    fn now(&mut self) -> i64 {
        let (seconds, micros): (i64, i64) = redis::cmd("TIME").query(&mut self.data).unwrap();
        seconds * 1_000_000 + micros
    }

    fn events(&self) -> Vec<Event> {
        let logs: Vec<&Path> = self.workers.iter().map(|w| w.spec.log.as_path()).collect();
        history::read(&logs)
    }

    /// Waits for the first event of `kind` logged by `worker`.
    fn wait_for(&mut self, worker: usize, kind: &str, patience: Duration) -> Event {
        let deadline = Instant::now() + patience;
        loop {
            let name = &self.workers[worker].spec.name;
            if let Some(event) = self
                .events()
                .into_iter()
                .find(|e| e.kind == kind && &e.worker == name)
            {
                return event;
            }
            if Instant::now() > deadline {
                panic!(
                    "{}: {name} did not log `{kind}` within {patience:?}\n{}",
                    self.name,
                    self.outputs()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kills a worker with SIGKILL and notes when, by the data server's clock.
    fn kill(&mut self, worker: usize) -> i64 {
        let _ = self.workers[worker].child.kill();
        let _ = self.workers[worker].child.wait();
        let at = self.now();
        self.killed
            .insert(self.workers[worker].spec.name.clone(), at);
        at
    }

    /// Sends `signal` (`STOP`, `CONT`) to a worker: a stopped process is frozen whole, watchdog
    /// included, as in a long garbage-collection pause.
    fn signal(&self, worker: usize, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.workers[worker].child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// What the workers printed, for a failure message.
    fn outputs(&self) -> String {
        let mut text = String::new();
        for worker in &self.workers {
            let path = self.dir.join(format!("{}.out", worker.spec.name));
            let output = std::fs::read_to_string(path).unwrap_or_default();
            let tail: Vec<&str> = output.lines().rev().take(15).collect();
            text += &format!("--- {} ---\n", worker.spec.name);
            for line in tail.into_iter().rev() {
                text += line;
                text += "\n";
            }
        }
        text
    }

    /// Waits for every worker still running to finish (killing those that outlive
    /// `patience`), then judges the history.
    fn finish(&mut self, patience: Duration) -> (Vec<Section>, Verdict) {
        let deadline = Instant::now() + patience;
        for index in 0..self.workers.len() {
            loop {
                match self.workers[index].child.try_wait().unwrap() {
                    Some(status) => {
                        let killed = self.killed.contains_key(&self.workers[index].spec.name);
                        assert!(
                            killed || status.success(),
                            "{}: worker {} failed ({status})\n{}",
                            self.name,
                            self.workers[index].spec.name,
                            self.outputs()
                        );
                        break;
                    }
                    None if Instant::now() > deadline => {
                        let _ = self.workers[index].child.kill();
                        let _ = self.workers[index].child.wait();
                        panic!(
                            "{}: worker {} did not finish\n{}",
                            self.name,
                            self.workers[index].spec.name,
                            self.outputs()
                        );
                    }
                    None => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
        let sections = history::sections(&self.events());
        let counters = self.counters();
        let verdict = history::check(&sections, &self.killed, &counters);
        (sections, verdict)
    }

    /// The final value of each key's counter (fenced scenarios keep none).
    fn counters(&mut self) -> BTreeMap<String, u64> {
        let mut counters = BTreeMap::new();
        for key in self.keys.clone() {
            let value: Option<u64> = redis::cmd("GET")
                .arg(format!("counter:{key}"))
                .query(&mut self.data)
                .unwrap();
            if let Some(value) = value {
                counters.insert(key, value);
            }
        }
        counters
    }

    /// Prints the scenario's row of the README's results table.
    fn report(&self, verdict: &Verdict, recovery: &str) {
        eprintln!(
            "| {} | {} | {} | {} | {} | {} | {recovery} |",
            self.name,
            self.backend.name(),
            verdict.entered,
            verdict.overlaps.len(),
            verdict.lost_updates,
            verdict.fence_inversions.len(),
        );
        eprintln!(
            "{}: ran {:.1} s; {verdict}",
            self.name,
            self.started.elapsed().as_secs_f64()
        );
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        for worker in &mut self.workers {
            let _ = worker.child.kill();
            let _ = worker.child.wait();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The longest time between two bodies starting one after the other (of any key), during
/// `sections`: how long the service stood still.
fn longest_pause(sections: &[Section]) -> Duration {
    let mut starts: Vec<i64> = sections.iter().map(|s| s.start).collect();
    starts.sort_unstable();
    let gap = starts.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    Duration::from_micros(gap as u64)
}

fn millis(micros: i64) -> String {
    format!("{} ms", micros / 1000)
}

fn ms(duration: Duration) -> String {
    format!("{} ms", duration.as_millis())
}

// ---------------------------------------------------------------------------------------------
// The scenarios, each a function of the backend

/// Three processes of two tasks each run bodies on two keys for `run_for` while every
/// connection of theirs is cut, at random, once in a hundred chunks forwarded.
fn random_cuts(backend: Backend, run_for: Duration) {
    let mut scenario = Scenario::new("random-cuts", backend, 2);
    for name in ["a", "b", "c"] {
        let mut spec = scenario.spec(name, run_for);
        spec.tasks = 2;
        let worker = scenario.spawn(spec, &[]);
        scenario.proxy(worker).cut_randomly(0.01);
    }
    let (sections, verdict) = scenario.finish(run_for + Duration::from_secs(60));
    let cuts: u64 = (0..3).map(|w| scenario.proxy(w).cuts()).sum();
    scenario.report(
        &verdict,
        &format!(
            "{cuts} connections cut; longest pause {}",
            ms(longest_pause(&sections))
        ),
    );
    verdict.assert_clean(scenario.name);
    assert!(
        cuts > 0,
        "no connection was cut: the scenario tested nothing"
    );
}

/// Three processes run bodies on two keys while the lock server restarts (down for a second);
/// for MySQL, whose server the tests share, every connection is cut and none accepted for that
/// second instead.
fn restart_under_load(backend: Backend) {
    let mut scenario = Scenario::new("server-restart", backend, 2);
    let run_for = Duration::from_secs(12);
    for name in ["a", "b", "c"] {
        let mut spec = scenario.spec(name, run_for);
        spec.tasks = 2;
        scenario.spawn(spec, &[]);
    }
    std::thread::sleep(Duration::from_secs(4));
    let before = scenario.events().len();
    assert!(
        before > 0,
        "nothing ran before the restart\n{}",
        scenario.outputs()
    );
    let down_at = scenario.now();
    match &mut scenario.lock_server {
        LockServer::Redis(server) => {
            server.stop();
            std::thread::sleep(Duration::from_secs(1));
            server.restart();
        }
        LockServer::Zookeeper(server) => {
            server.stop();
            std::thread::sleep(Duration::from_secs(1));
            server.start();
        }
        LockServer::None => unreachable!("processes cannot share the memory store"),
        LockServer::Mysql { .. } => {
            for worker in &scenario.workers {
                worker.proxy.refuse_connections(true);
                worker.proxy.cut_all();
            }
            std::thread::sleep(Duration::from_secs(1));
            for worker in &scenario.workers {
                worker.proxy.refuse_connections(false);
            }
        }
    }
    let (sections, verdict) = scenario.finish(run_for + Duration::from_secs(60));
    let resumed = sections.iter().any(|s| s.start > down_at + 1_000_000);
    assert!(
        resumed,
        "no body ran after the restart\n{}",
        scenario.outputs()
    );
    scenario.report(
        &verdict,
        &format!(
            "server down 1 s; longest pause {}",
            ms(longest_pause(&sections))
        ),
    );
    verdict.assert_clean(scenario.name);
}

/// A holder's connection stalls (bytes held both ways, connection open) for twice the ttl: it
/// must be cancelled with `Lost` before a waiter in another process gets in. When the stall
/// ends, the held bytes arrive late — the holder's renewals and its release — while the waiter
/// still holds the key: a third process must not get in before the waiter leaves. `wrapper`
/// runs the holder under another clock (`faketime`).
fn stalled_holder(backend: Backend, name: &'static str, wrapper: &[&str]) {
    let mut scenario = Scenario::new(name, backend, 1);
    let mut holder = scenario.spec("holder", Duration::from_secs(60));
    holder.sections = 1;
    holder.work = Duration::from_secs(30);
    let holder = scenario.spawn(holder, wrapper);
    let entered = scenario.wait_for(holder, "enter", Duration::from_secs(60));
    let mut waiter = scenario.spec("waiter", Duration::from_secs(60));
    waiter.sections = 1;
    waiter.work = 2 * TTL;
    let waiter = scenario.spawn(waiter, &[]);
    std::thread::sleep(Duration::from_millis(300));
    scenario.proxy(holder).stall_for(Direction::Both, 2 * TTL);
    let lost = scenario.wait_for(holder, "lost", Duration::from_secs(30));
    let next = scenario.wait_for(waiter, "enter", Duration::from_secs(30));
    let mut third = scenario.spec("third", Duration::from_secs(60));
    third.sections = 1;
    scenario.spawn(third, &[]);
    let (_, verdict) = scenario.finish(Duration::from_secs(60));
    let margin = next.micros - lost.micros;
    scenario.report(
        &verdict,
        &format!(
            "holder cancelled {} after it entered; waiter entered {} later",
            millis(lost.micros - entered.micros),
            millis(margin)
        ),
    );
    verdict.assert_clean(scenario.name);
    assert_eq!(
        verdict.finished, 2,
        "the waiter and the third finish\n{verdict}"
    );
    assert!(
        margin > 0,
        "the waiter entered {} before the stalled holder was cancelled",
        millis(-margin)
    );
}

/// The stalled holder again, its clock two hours ahead and running 5 % slow (`faketime`): a
/// wall-clock offset means nothing to dlock, which only measures intervals; a slow clock eats
/// into the safety margin (ttl/10) but, at 5 %, leaves it positive.
fn skewed_clock_holder(backend: Backend) {
    assert!(
        Path::new(FAKETIME).exists(),
        "{FAKETIME} is missing: install Debian's `faketime` package (scripts/test.sh does)"
    );
    stalled_holder(
        backend,
        "skewed-clock",
        &[FAKETIME, "-m", "-f", "+2h x0.95"],
    );
}

const FAKETIME: &str = "/usr/bin/faketime";

/// A holder is killed (SIGKILL) in its body: the next process gets in once its lease has
/// expired — not before, and soon after (the README's table has the figures).
fn killed_holder(backend: Backend) {
    let mut scenario = Scenario::new("killed-holder", backend, 1);
    let mut holder = scenario.spec("holder", Duration::from_secs(60));
    holder.sections = 1;
    holder.work = Duration::from_secs(30);
    let holder = scenario.spawn(holder, &[]);
    scenario.wait_for(holder, "enter", Duration::from_secs(60));
    let mut waiter = scenario.spec("waiter", Duration::from_secs(60));
    waiter.sections = 1;
    let waiter = scenario.spawn(waiter, &[]);
    // Let the holder renew at least once, and the waiter queue up.
    std::thread::sleep(Duration::from_millis(1000));
    let killed_at = scenario.kill(holder);
    let next = scenario.wait_for(waiter, "enter", Duration::from_secs(30));
    let (_, verdict) = scenario.finish(Duration::from_secs(60));
    let recovery = Duration::from_micros((next.micros - killed_at).max(0) as u64);
    scenario.report(
        &verdict,
        &format!("next holder in {} after the kill", ms(recovery)),
    );
    verdict.assert_clean(scenario.name);
    // The lease was renewed at most a renewal period before the kill, so it lasts at least
    // ttl − period past it; the clock of the data server reads in µs, allow it 50 ms.
    let earliest = TTL - RENEW_PERIOD - Duration::from_millis(50);
    assert!(
        recovery >= earliest,
        "the waiter got in {recovery:?} after the kill: before the lease could have expired"
    );
    assert!(
        recovery <= TTL + Duration::from_secs(3),
        "the waiter took {recovery:?} to get in after the lease expired"
    );
}

/// A holder is frozen (SIGSTOP, as in a long GC pause) past its ttl; another process takes the
/// key and writes with its fence; the first resumes, still in its body (`on_lost =
/// "continue"`), and writes with its stale fence: the data store rejects it.
fn paused_holder_is_fenced_off(backend: Backend) {
    let mut scenario = Scenario::new("fenced-pause", backend, 1);
    let mut holder = scenario.spec("holder", Duration::from_secs(60));
    holder.sections = 1;
    holder.body = Body::WriteFenced;
    holder.work = Duration::from_millis(500);
    let holder = scenario.spawn(holder, &[]);
    let entered = scenario.wait_for(holder, "enter", Duration::from_secs(60));
    scenario.signal(holder, "STOP");
    let mut next = scenario.spec("next", Duration::from_secs(60));
    next.sections = 1;
    next.body = Body::WriteFenced;
    let next = scenario.spawn(next, &[]);
    let accepted = scenario.wait_for(next, "accepted", Duration::from_secs(30));
    scenario.signal(holder, "CONT");
    let rejected = scenario.wait_for(holder, "rejected", Duration::from_secs(30));
    scenario.wait_for(holder, "unheld", Duration::from_secs(5));
    let (_, verdict) = scenario.finish(Duration::from_secs(60));
    assert!(entered.fence < accepted.fence && rejected.fence == entered.fence);
    let stored: (u64, String) = redis::cmd("HMGET")
        .arg(format!("fenced:{}", scenario.keys[0]))
        .arg("fence")
        .arg("value")
        .query(&mut scenario.data)
        .unwrap();
    assert_eq!(stored, (accepted.fence, "next".to_owned()));
    // The paused holder's body ran on after its lease was gone — the overlap fencing exists
    // for — and was told so (`is_held() == false`); nothing else may be wrong.
    assert_eq!(verdict.overlaps.len(), 1, "{verdict}");
    assert!(verdict.fence_inversions.is_empty(), "{verdict}");
    scenario.report(
        &verdict,
        &format!(
            "stale write (fence {}) rejected after fence {}",
            rejected.fence, accepted.fence
        ),
    );
}

/// The in-process store: tasks sharing one memory `Locker` run bodies on two keys while, every
/// 20 ms, one of them is aborted (cancelled mid-body, as a dropped request would be) and
/// replaced by a new task.
async fn memory_with_aborted_tasks(run_for: Duration) {
    let mut scenario = Scenario::new("aborted-tasks", Backend::Memory, 2);
    let locker = Locker::memory();
    let data = redis::Client::open(scenario.data_server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let log = scenario.dir.join("tasks.log");
    let deadline = Instant::now() + run_for;
    let template = scenario.spec("t", run_for);
    let start_task = |index: usize| {
        let name = format!("t{index}");
        let context = Context {
            data: data.clone(),
            log: Log::create(&log, &name),
            work: Duration::from_millis(2),
            worker: name.clone(),
        };
        let spec = template.clone();
        let locker = locker.clone();
        let task = tokio::spawn(async move {
            run_bodies(&locker, &context, &spec, index, deadline).await;
        });
        (name, task)
    };
    let mut tasks: Vec<_> = (0..6).map(start_task).collect();
    let mut started = tasks.len();
    let mut aborted = 0;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let victim = started % tasks.len();
        // The body ends when its task is dropped, between this reading and the end of the
        // abort; its lease is released at that drop and the next body may enter at once, before
        // a reading taken after the abort reaches the data server. So the end is read first: the
        // body can act after it only by finishing a poll already under way, whose commands
        // reach the data server before the release lets anyone in.
        let at = scenario.now();
        let (name, task) = std::mem::replace(&mut tasks[victim], start_task(started));
        started += 1;
        task.abort();
        let _ = task.await;
        aborted += 1;
        scenario.killed.insert(name, at);
    }
    for (_, task) in tasks {
        task.await.unwrap();
    }
    let events = history::read(&[&log]);
    let sections = history::sections(&events);
    let counters = scenario.counters();
    let verdict = history::check(&sections, &scenario.killed, &counters);
    scenario.report(
        &verdict,
        &format!(
            "{aborted} tasks aborted mid-body; longest pause {}",
            ms(longest_pause(&sections))
        ),
    );
    verdict.assert_clean(scenario.name);
    assert!(
        sections.iter().any(|s| !s.finished),
        "no body was aborted mid-way: the scenario tested nothing"
    );
}

// ---------------------------------------------------------------------------------------------
// The tests

/// The control: the same workers without the lock. The checker must see overlaps and lost
/// updates, or the scenarios' clean verdicts would prove nothing.
#[test]
fn without_the_lock_the_checker_sees_overlaps_and_lost_updates() {
    let mut scenario = Scenario::new("no-lock", Backend::Redis, 1);
    for name in ["a", "b", "c"] {
        let mut spec = scenario.spec(name, Duration::from_secs(2));
        spec.body = Body::CountUnlocked;
        scenario.spawn(spec, &[]);
    }
    let (_, verdict) = scenario.finish(Duration::from_secs(60));
    scenario.report(&verdict, "(no lock: the control)");
    assert!(!verdict.overlaps.is_empty(), "{verdict}");
    assert!(verdict.lost_updates > 0, "{verdict}");
}

mod with_memory {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tasks_aborted_mid_body_lose_nothing() {
        memory_with_aborted_tasks(Duration::from_secs(5)).await;
    }
}

/// How long the random-cut runs last: `DLOCK_FAULT_SECONDS`, else 30 s.
fn cut_run() -> Duration {
    let seconds = std::env::var("DLOCK_FAULT_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    Duration::from_secs(seconds)
}

macro_rules! scenarios {
    ($($backend:ident: $variant:expr;)*) => {
        $(
            mod $backend {
                use super::*;

                #[test]
                fn random_connection_cuts_lose_nothing() {
                    random_cuts($variant, cut_run());
                }

                #[test]
                fn a_server_restart_under_load_loses_nothing() {
                    restart_under_load($variant);
                }

                #[test]
                fn a_stalled_holder_is_cancelled_before_anyone_enters() {
                    stalled_holder($variant, "stalled-holder", &[]);
                }

                #[test]
                fn a_holder_whose_clock_is_off_and_slow_still_leaves_first() {
                    skewed_clock_holder($variant);
                }

                #[test]
                fn a_killed_holder_is_replaced_after_its_ttl_not_before() {
                    killed_holder($variant);
                }

                #[test]
                fn a_paused_holder_s_stale_write_is_rejected_by_its_fence() {
                    paused_holder_is_fenced_off($variant);
                }
            }
        )*
    };
}

scenarios! {
    with_redis: Backend::Redis;
    with_mysql: Backend::Mysql;
    with_zookeeper: Backend::Zookeeper;
}

#[test]
fn the_checker_finds_what_it_looks_for() {
    fn run(key: &str, fence: u64, worker: &str, start: i64, end: Option<i64>) -> Section {
        Section {
            key: key.into(),
            fence,
            worker: worker.into(),
            start,
            end,
            finished: end.is_some(),
        }
    }
    let none: BTreeMap<String, u64> = BTreeMap::new();
    let no_kills: BTreeMap<String, i64> = BTreeMap::new();
    let clean = [
        run("k", 1, "a", 0, Some(10)),
        run("k", 2, "b", 10, Some(20)),
        run("k", 5, "a", 30, Some(40)),
    ];
    let verdict = history::check(&clean, &no_kills, &BTreeMap::from([("k".to_owned(), 3)]));
    assert!(verdict.overlaps.is_empty() && verdict.fence_inversions.is_empty());
    assert_eq!(verdict.lost_updates, 0);

    // A long body overlapping one two places after it; a fence going back; a lost write.
    let bad = [
        run("k", 1, "a", 0, Some(50)),
        run("k", 2, "b", 10, Some(20)),
        run("k", 2, "c", 30, Some(40)),
    ];
    let verdict = history::check(&bad, &no_kills, &BTreeMap::from([("k".to_owned(), 2)]));
    assert_eq!(verdict.overlaps.len(), 2, "{verdict}");
    assert_eq!(verdict.fence_inversions.len(), 1, "{verdict}");
    assert_eq!(verdict.lost_updates, 1);

    // A killed worker's body lasts until the kill.
    let killed = BTreeMap::from([("a".to_owned(), 25)]);
    let sections = [run("k", 1, "a", 0, None), run("k", 2, "b", 20, Some(30))];
    assert_eq!(history::check(&sections, &killed, &none).overlaps.len(), 1);
    let sections = [run("k", 1, "a", 0, None), run("k", 2, "b", 26, Some(30))];
    assert!(history::check(&sections, &killed, &none)
        .overlaps
        .is_empty());
}
