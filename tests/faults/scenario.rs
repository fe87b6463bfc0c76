//! The scenario harness: the servers, the worker processes, what is done to them, the verdict.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use dlock::Owner;

use super::support::etcd_server::{EtcdCluster, EtcdMember};
use super::support::fault_proxy::FaultProxy;
use super::support::history::{self, Event, Section, Verdict, Write};
use super::support::pg_server::PgServer;
use super::support::redis_server::RedisServer;
use super::support::zk_server::{ZkEnsemble, ZkServer};
use super::support::{drop_mysql_table, mysql_url};
use super::worker::{Backend, Body, WorkerSpec};

/// The lock server of a scenario.
pub enum LockServer {
    /// A private server that keeps every write in its append-only file, so a restart loses no
    /// lease: the configuration dlock documents for surviving a restart.
    Redis(RedisServer),
    /// The shared MariaDB (never restarted): a table of the scenario's own.
    Mysql {
        table: String,
    },
    /// A private server of the scenario's own, which a restart stops as a crash would.
    Postgres(PgServer),
    Zookeeper(ZkServer),
    ZookeeperEnsemble(ZkEnsemble),
    /// A private one-member cluster, which a restart stops as a crash would.
    Etcd(EtcdMember),
    EtcdCluster(EtcdCluster),
    /// The memory store lives in the test process.
    None,
}

impl LockServer {
    pub fn start(backend: Backend) -> LockServer {
        match backend {
            Backend::Memory => LockServer::None,
            Backend::Redis => LockServer::Redis(RedisServer::start_persistent()),
            Backend::Mysql => LockServer::Mysql {
                table: format!("dlock_faults_{}", &Owner::random().to_string()[..12]),
            },
            Backend::Postgres => LockServer::Postgres(PgServer::start_new()),
            Backend::Zookeeper => LockServer::Zookeeper(ZkServer::start_new()),
            Backend::ZookeeperEnsemble => LockServer::ZookeeperEnsemble(ZkEnsemble::start()),
            Backend::Etcd => LockServer::Etcd(EtcdMember::start_new()),
            Backend::EtcdCluster => LockServer::EtcdCluster(EtcdCluster::start()),
        }
    }

    pub fn url(&self) -> String {
        match self {
            LockServer::Redis(server) => server.url(),
            LockServer::Mysql { .. } => mysql_url(),
            LockServer::Postgres(server) => server.url(),
            LockServer::Zookeeper(server) => server.url(),
            LockServer::ZookeeperEnsemble(ensemble) => ensemble.url(),
            LockServer::Etcd(server) => server.url(),
            LockServer::EtcdCluster(cluster) => cluster.url(),
            LockServer::None => "memory://".into(),
        }
    }
}

impl Drop for LockServer {
    fn drop(&mut self) {
        if let LockServer::Mysql { table } = self {
            drop_mysql_table(table);
        }
    }
}

/// One worker process of a scenario.
pub struct Worker {
    pub spec: WorkerSpec,
    /// The proxy the worker reaches its lock server through; `None` for an ensemble, whose
    /// faults are the servers' own.
    pub proxy: Option<FaultProxy>,
    pub child: Child,
}

/// A scenario: the servers, the workers, and what was done to them.
pub struct Scenario {
    pub name: &'static str,
    pub backend: Backend,
    pub dir: PathBuf,
    pub keys: Vec<String>,
    pub data_server: RedisServer,
    pub data: redis::Connection,
    pub lock_server: LockServer,
    pub workers: Vec<Worker>,
    pub killed: BTreeMap<String, i64>,
    pub started: Instant,
    /// The wall clock when `started` was read: how far the two have drifted apart by the end
    /// tells whether the host's wall clock stepped during the run.
    pub started_wall: SystemTime,
}

/// A drift of the wall clock from the monotonic one, over a run, past which the run is void.
/// The stores and the data server judge expiry and order by the host's wall clock: stepped
/// (an NTP correction, a virtual machine resumed), they end leases early and misdate entries,
/// and the verdict says nothing about dlock (docs/correctness.md, "Skewed clock").
const CLOCK_STEP: Duration = Duration::from_millis(1500);

/// How far the wall clock moved apart from the monotonic one since `started` (read together
/// with `started_wall`), when that is more than [`CLOCK_STEP`]: `"+28.0 s"`.
pub fn wall_clock_step(started: Instant, started_wall: SystemTime) -> Option<String> {
    let wall = SystemTime::now()
        .duration_since(started_wall)
        .map_or_else(|e| -e.duration().as_secs_f64(), |d| d.as_secs_f64());
    let drift = wall - started.elapsed().as_secs_f64();
    (drift.abs() > CLOCK_STEP.as_secs_f64()).then(|| format!("{drift:+.1} s"))
}

impl Scenario {
    pub fn new(name: &'static str, backend: Backend, keys: usize) -> Scenario {
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
            started_wall: SystemTime::now(),
        }
    }

    /// A worker's spec with this scenario's defaults: one task, bodies of 5 ms on every key,
    /// for `run_for`.
    pub fn spec(&self, name: &str, run_for: Duration) -> WorkerSpec {
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

    /// Starts a worker behind a proxy of its own (straight to an ensemble's servers: all three
    /// unless `spec.lock_url` names some), its command prefixed by `wrapper` (e.g. `faketime`)
    /// if any; returns its index.
    pub fn spawn(&mut self, mut spec: WorkerSpec, wrapper: &[&str]) -> usize {
        let proxy = match &self.lock_server {
            LockServer::ZookeeperEnsemble(ensemble) => {
                if spec.lock_url.is_empty() {
                    spec.lock_url = ensemble.url();
                }
                None
            }
            LockServer::EtcdCluster(cluster) => {
                if spec.lock_url.is_empty() {
                    spec.lock_url = cluster.url();
                }
                None
            }
            server => {
                let (proxy, lock_url) = FaultProxy::in_front_of(&server.url());
                spec.lock_url = lock_url;
                Some(proxy)
            }
        };
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
            .args([
                "worker::fault_worker",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
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

    pub fn proxy(&self, worker: usize) -> &FaultProxy {
        self.workers[worker]
            .proxy
            .as_ref()
            .expect("a worker of a single lock server")
    }

    /// The lock server's ensemble; panics for another lock server.
    pub fn ensemble(&mut self) -> &mut ZkEnsemble {
        match &mut self.lock_server {
            LockServer::ZookeeperEnsemble(ensemble) => ensemble,
            _ => panic!("{}: the lock server is not an ensemble", self.name),
        }
    }

    /// The lock server's etcd cluster; panics for another lock server.
    pub fn etcd_cluster(&mut self) -> &mut EtcdCluster {
        match &mut self.lock_server {
            LockServer::EtcdCluster(cluster) => cluster,
            _ => panic!("{}: the lock server is not an etcd cluster", self.name),
        }
    }

    /// The sections logged so far, entered or not finished.
    pub fn sections(&self) -> Vec<Section> {
        history::sections(&self.events())
    }

    /// Now, by the data server's clock, in microseconds.
    pub fn now(&mut self) -> i64 {
        let (seconds, micros): (i64, i64) = redis::cmd("TIME").query(&mut self.data).unwrap();
        seconds * 1_000_000 + micros
    }

    pub fn events(&self) -> Vec<Event> {
        let logs: Vec<&Path> = self.workers.iter().map(|w| w.spec.log.as_path()).collect();
        history::read(&logs)
    }

    /// Waits for the first event of `kind` logged by `worker`.
    pub fn wait_for(&mut self, worker: usize, kind: &str, patience: Duration) -> Event {
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
    pub fn kill(&mut self, worker: usize) -> i64 {
        let _ = self.workers[worker].child.kill();
        let _ = self.workers[worker].child.wait();
        let at = self.now();
        self.killed
            .insert(self.workers[worker].spec.name.clone(), at);
        at
    }

    /// Sends `signal` (`STOP`, `CONT`) to a worker: a stopped process is frozen whole, watchdog
    /// included, as in a long garbage-collection pause.
    pub fn signal(&self, worker: usize, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.workers[worker].child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// What the workers printed, for a failure message.
    pub fn outputs(&self) -> String {
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
    /// `patience`), then judges the history: `None`, judging nothing, where the host's wall
    /// clock stepped during the run (printed as a void run), as no verdict would mean anything.
    pub fn finish(&mut self, patience: Duration) -> Option<(Vec<Section>, Verdict)> {
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
        if let Some(step) = wall_clock_step(self.started, self.started_wall) {
            eprintln!(
                "{}: VOID RUN: the host's wall clock stepped {step} during it (against the \
                 monotonic clock); the stores judge expiry by it, so nothing here is judged",
                self.name
            );
            return None;
        }
        let sections = history::sections(&self.events());
        let journals = self.journals();
        let verdict = history::check(&sections, &self.killed, &journals);
        Some((sections, verdict))
    }

    /// Each key's journal of counter writes, in the order they ran (fenced scenarios keep none).
    pub fn journals(&mut self) -> BTreeMap<String, Vec<Write>> {
        let mut journals = BTreeMap::new();
        for key in self.keys.clone() {
            let entries: Vec<String> = redis::cmd("LRANGE")
                .arg(format!("journal:{key}"))
                .arg(0)
                .arg(-1)
                .query(&mut self.data)
                .unwrap();
            let writes = entries
                .iter()
                .map(|e| Write::parse(e).expect("a journal entry"));
            journals.insert(key, writes.collect());
        }
        journals
    }

    /// Prints the scenario's row of the results table in docs/correctness.md, which
    /// `scripts/write-docs.sh` collects: keep its columns and that script's header in step.
    pub fn report(&self, verdict: &Verdict, recovery: &str) {
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
pub fn longest_pause(sections: &[Section]) -> Duration {
    let mut starts: Vec<i64> = sections.iter().map(|s| s.start).collect();
    starts.sort_unstable();
    let gap = starts.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    Duration::from_micros(gap as u64)
}

pub fn millis(micros: i64) -> String {
    format!("{} ms", micros / 1000)
}

pub fn ms(duration: Duration) -> String {
    format!("{} ms", duration.as_millis())
}
