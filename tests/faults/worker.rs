//! The worker process of the fault scenarios: what it is told to do, its bodies, its loop.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backend::{EtcdBackend, MysqlBackend, PostgresBackend, ZookeeperBackend};
use dlock::{distributed_lock, LockError, LockOptions, Locker};

use super::support::history::Log;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Memory,
    Redis,
    Mysql,
    Postgres,
    Zookeeper,
    /// A private ensemble of three ZooKeeper servers, every worker's URL naming all three.
    ZookeeperEnsemble,
    /// A private one-member etcd cluster.
    Etcd,
    /// A private cluster of three etcd members, every worker's URL naming all three.
    EtcdCluster,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Redis => "redis",
            Backend::Mysql => "mysql",
            Backend::Postgres => "postgres",
            Backend::Zookeeper => "zookeeper",
            Backend::ZookeeperEnsemble => "zookeeper-ensemble",
            Backend::Etcd => "etcd",
            Backend::EtcdCluster => "etcd-cluster",
        }
    }

    pub fn parse(name: &str) -> Backend {
        match name {
            "memory" => Backend::Memory,
            "redis" => Backend::Redis,
            "mysql" => Backend::Mysql,
            "postgres" => Backend::Postgres,
            "zookeeper" => Backend::Zookeeper,
            "zookeeper-ensemble" => Backend::ZookeeperEnsemble,
            "etcd" => Backend::Etcd,
            "etcd-cluster" => Backend::EtcdCluster,
            other => panic!("unknown backend {other}"),
        }
    }
}

/// What a worker's bodies do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body {
    /// [`count`]: read, pause, write plus one, under the lock.
    Count,
    /// [`write_fenced`]: pause, then a fenced write, running on after a loss.
    WriteFenced,
    /// [`count_unlocked`]: the counting body without the lock — the control that shows the
    /// checker sees what a broken lock would do.
    CountUnlocked,
    /// [`lead`]: campaign for the key, then count for a whole term as its leader.
    Lead,
    /// [`permit`]: hold one of the key's [`PERMITS`] permits, log entry and exit around a pause.
    Permit,
}

impl Body {
    pub fn name(self) -> &'static str {
        match self {
            Body::Count => "count",
            Body::WriteFenced => "write-fenced",
            Body::CountUnlocked => "count-unlocked",
            Body::Lead => "lead",
            Body::Permit => "permit",
        }
    }

    pub fn parse(name: &str) -> Body {
        match name {
            "count" => Body::Count,
            "write-fenced" => Body::WriteFenced,
            "count-unlocked" => Body::CountUnlocked,
            "lead" => Body::Lead,
            "permit" => Body::Permit,
            other => panic!("unknown body {other}"),
        }
    }
}

/// What one worker process does; passed to it in `DLOCK_FAULT_WORKER` as `name=value` words.
#[derive(Clone, Debug)]
pub struct WorkerSpec {
    pub name: String,
    pub backend: Backend,
    /// The lock server's URL, through the worker's proxy (an ensemble's: straight to its
    /// servers).
    pub lock_url: String,
    /// The SQL stores' lock table.
    pub table: String,
    pub data_url: String,
    pub keys: Vec<String>,
    /// Concurrent tasks running bodies.
    pub tasks: usize,
    /// No body starts after this long.
    pub run_for: Duration,
    /// Each task stops after this many bodies entered.
    pub sections: usize,
    /// The pause between reading and writing the counter.
    pub work: Duration,
    pub body: Body,
    pub log: PathBuf,
}

impl WorkerSpec {
    pub fn encode(&self) -> String {
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

    pub fn decode(text: &str) -> WorkerSpec {
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
pub struct Context {
    pub data: redis::aio::MultiplexedConnection,
    pub log: Log,
    pub work: Duration,
    pub worker: String,
}

impl Context {
    /// Now, by the data server's clock, in microseconds.
    pub async fn now(&self) -> i64 {
        let (seconds, micros): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut self.data.clone())
            .await
            .expect("the data server keeps time");
        seconds * 1_000_000 + micros
    }

    pub async fn record(&self, kind: &str, key: &str, fence: u64) {
        self.log.record(kind, key, fence, self.now().await);
    }
}

/// Stores `value` with `fence` unless the stored fence is as new or newer: the check a store
/// makes to reject a stale holder's write.
pub const FENCED_WRITE: &str = r"
local stored = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) <= stored then return 0 end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return 1";

/// The counting body: read, pause, write plus one.
#[distributed_lock(key = "<key>", ttl = "2s", wait = "30s", locker = locker)]
pub async fn count(
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
pub async fn count_unlocked(key: &str, context: &Context, entered: &AtomicU64) {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    increment(key, NEXT.fetch_add(1, Ordering::SeqCst), context, entered).await;
}

/// A term as the key's leader: campaigns (as [`count`] waits, 30 s at most), then increments
/// the counter again and again under [`Leadership::run`](dlock::Leadership::run), for
/// `context.work` or until the leadership is lost. The term is the section the checker judges:
/// entered when elected, left when the run ends (after its last write landed: the exit is
/// logged on the data server's connection behind it).
pub async fn lead(
    locker: &Locker,
    key: &str,
    context: &Context,
    entered: &AtomicU64,
) -> Result<(), LockError> {
    let options = LockOptions::new()
        .ttl(Duration::from_secs(2))
        .wait(Duration::from_secs(30));
    let leadership = locker.campaign(key, options).await?;
    let fence = leadership.fence();
    entered.store(fence, Ordering::SeqCst);
    context.record("enter", key, fence).await;
    let term = tokio::time::sleep(context.work);
    let work = async {
        tokio::pin!(term);
        loop {
            tokio::select! {
                () = &mut term => return,
                () = write_increment(key, fence, context, Duration::from_millis(20)) => {}
            }
        }
    };
    let outcome = leadership.run(work).await;
    context.record("exit", key, fence).await;
    match outcome {
        Ok(()) => leadership.resign().await,
        Err(lost) => Err(lost),
    }
}

/// Logs the entry, reads `key`'s counter, pauses, writes it back plus one, logs the exit.
pub async fn increment(key: &str, fence: u64, context: &Context, entered: &AtomicU64) {
    entered.store(fence, Ordering::SeqCst);
    context.record("enter", key, fence).await;
    write_increment(key, fence, context, context.work).await;
    context.record("exit", key, fence).await;
}

/// Reads `key`'s counter, pauses for `work`, writes it back plus one (journaled).
async fn write_increment(key: &str, fence: u64, context: &Context, work: Duration) {
    let counter = format!("counter:{key}");
    let mut data = context.data.clone();
    let value: Option<u64> = redis::cmd("GET")
        .arg(&counter)
        .query_async(&mut data)
        .await
        .unwrap();
    tokio::time::sleep(work).await;
    let read = value.unwrap_or(0);
    let () = redis::Script::new(JOURNALED_SET)
        .key(&counter)
        .key(format!("journal:{key}"))
        .arg(read + 1)
        .arg(format!("{fence} {read} {}", read + 1))
        .invoke_async(&mut data)
        .await
        .unwrap();
}

/// Sets the counter and journals the write (`<fence> <read> <written>`) in one step, so the
/// journal lists every write in the order it ran, even a write whose body was stopped before it
/// could log its exit.
const JOURNALED_SET: &str = r"
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[2])";

/// The permits of [`permit`]'s keys: the most bodies the checker lets be inside a key at once.
pub const PERMITS: usize = 2;

/// A body holding one of [`PERMITS`] permits of the key (a semaphore): logs its entry, pauses
/// for `context.work`, logs its exit. Up to `PERMITS` bodies may be inside at once, so it
/// writes no counter (their read-modify-writes would legitimately lose updates).
///
/// Its log lines carry, where the other bodies put the fence, a number of the body's own
/// (unique in its process): a permit's fence is that permit's, so two bodies of one process
/// may enter with one fence value (on two permits) and their entries and exits could not be
/// paired by it. The fence is not judged for a semaphore anyway (`history::check_permits`).
/// (`permits = 2` is [`PERMITS`]: the attribute takes a literal only.)
#[distributed_lock(key = "<key>", ttl = "2s", wait = "30s", locker = locker, permits = 2)]
pub async fn permit(
    locker: &Locker,
    key: &str,
    context: &Context,
    entered: &AtomicU64,
) -> Result<(), LockError> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let body = NEXT.fetch_add(1, Ordering::SeqCst);
    entered.store(body, Ordering::SeqCst);
    context.record("enter", key, body).await;
    tokio::time::sleep(context.work).await;
    context.record("exit", key, body).await;
    Ok(())
}

/// The fenced body: pause, then write with the fence; a holder that lost its lease meanwhile
/// runs on (`on_lost = "continue"`) and its write is judged by the data server alone.
#[distributed_lock(key = "<key>", ttl = "2s", wait = "30s", locker = locker, on_lost = "continue")]
pub async fn write_fenced(
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

/// The tick of the scenarios' ZooKeeper servers.
const ZK_TICK: Duration = Duration::from_millis(500);

/// The shortest ZooKeeper session that keeps the bodies' leases of 2 s whole: a ttl may be two
/// thirds of the session timeout less a tick.
const ZK_SESSION: Duration = Duration::from_secs(4);

/// The etcd lease of each worker: as long as the bodies' leases of 2 s, so a killed worker's
/// keys go one lease TTL after its last keep-alive.
const ETCD_LEASE: Duration = Duration::from_secs(2);

/// Connects the worker's `Locker`, retrying while its server is unreachable.
pub async fn connect(spec: &WorkerSpec) -> Locker {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let attempt = match spec.backend {
            Backend::Memory => panic!("the memory store cannot be shared between processes"),
            Backend::Redis => Locker::connect(&spec.lock_url).await,
            Backend::Mysql => match MysqlBackend::builder(&spec.lock_url) {
                Ok(builder) => builder
                    .table(&spec.table)
                    .max_connections(4)
                    .connect()
                    .await
                    .map(Locker::with_backend),
                Err(error) => Err(error),
            },
            // The pool as small as MySQL's: the renewals and releases of a worker's few
            // leases need no more, and the listener has a connection of its own.
            Backend::Postgres => match PostgresBackend::builder(&spec.lock_url) {
                Ok(builder) => builder
                    .table(&spec.table)
                    .max_connections(4)
                    .connect()
                    .await
                    .map(Locker::with_backend),
                Err(error) => Err(error),
            },
            Backend::Zookeeper | Backend::ZookeeperEnsemble => {
                match ZookeeperBackend::builder(&spec.lock_url) {
                    Ok(builder) => builder
                        .session_timeout(ZK_SESSION)
                        .tick_time(ZK_TICK)
                        .connect()
                        .await
                        .map(Locker::with_backend),
                    Err(error) => Err(error),
                }
            }
            Backend::Etcd | Backend::EtcdCluster => match EtcdBackend::builder(&spec.lock_url) {
                Ok(builder) => builder
                    .lease_ttl(ETCD_LEASE)
                    .timeout(Duration::from_secs(1))
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

pub async fn run_worker(spec: WorkerSpec) {
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
pub async fn run_bodies(
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
            Body::Lead => lead(locker, key, context, &entered).await,
            Body::Permit => permit(locker, key, context, &entered).await,
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
pub fn fault_worker() {
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
