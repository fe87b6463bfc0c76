//! What the command-line tests share: a locker on the shared Redis under a key prefix of the
//! test's own, the URLs of the other stores, holders that carry a label, the built `dlock`
//! binary run as a process, a private Redis that requires a password, and a private ZooKeeper.

#![allow(dead_code)] // Each test file uses a part.

use std::net::TcpStream;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use dlock::backend::{
    AcquireRequest, Acquired, Backend, EtcdBackend, MysqlBackend, PostgresBackend, RedisBackend,
    Renewal, ZookeeperBackend,
};
use dlock::{KeyState, LockError, Locker, Owner};

/// The shared Redis, under a key prefix no other test uses: `list` then sees this test's keys
/// alone.
pub fn redis_url() -> String {
    format!(
        "redis://127.0.0.1:6379/?key_prefix=dlock-cli-test-{}-{}:",
        std::process::id(),
        Owner::random()
    )
}

/// The MariaDB/MySQL the tests use: `DLOCK_MYSQL_URL`, else the machine's server as root.
pub fn mysql_url() -> String {
    std::env::var("DLOCK_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// The PostgreSQL the tests use: `DLOCK_POSTGRES_URL`, else the machine's server as `postgres`
/// (trust authentication) in the database `test`.
pub fn postgres_url() -> String {
    std::env::var("DLOCK_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A locker on `url` (any store's) whose every acquisition is labelled `label`, as an annotated
/// function's are, so that `inspect` has a label to show.
pub async fn labelled_locker(url: &str, label: &'static str) -> Locker {
    fn labelled<B: Backend>(store: Result<B, LockError>, label: &'static str) -> Locker {
        let store = store.expect("the test's store answers");
        Locker::with_backend(Labelled { store, label })
    }
    match url.split_once("://").map(|(scheme, _)| scheme) {
        Some("redis") => labelled(RedisBackend::connect(url).await, label),
        Some("mysql") => labelled(MysqlBackend::connect(url).await, label),
        Some("postgres") => labelled(PostgresBackend::connect(url).await, label),
        Some("zk") => labelled(ZookeeperBackend::connect(url).await, label),
        Some("etcd") => labelled(EtcdBackend::connect(url).await, label),
        _ => panic!("no store for {url}"),
    }
}

/// A store whose acquisitions all carry `label`.
struct Labelled<B> {
    store: B,
    label: &'static str,
}

impl<B: Backend> Backend for Labelled<B> {
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Option<Acquired>, LockError> {
        self.store.acquire(&request.label(self.label)).await
    }

    async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        self.store.release(key, owner).await
    }

    async fn undo_acquire(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        self.store.undo_acquire(key, owner).await
    }

    async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        self.store.renew(leases).await
    }

    async fn renew_each(&self, leases: &[Renewal<'_>]) -> Result<Vec<Option<bool>>, LockError> {
        self.store.renew_each(leases).await
    }

    fn ttl_limit(&self) -> Option<Duration> {
        self.store.ttl_limit()
    }

    async fn health(&self) -> Result<(), LockError> {
        self.store.health().await
    }

    async fn close(&self) {
        self.store.close().await
    }

    fn release_now(&self, key: &str, owner: Owner) -> bool {
        self.store.release_now(key, owner)
    }

    async fn inspect(&self, key: &str) -> Result<KeyState, LockError> {
        self.store.inspect(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        self.store.list(prefix).await
    }

    async fn force_release(&self, key: &str, owner: Owner) -> Result<Option<u64>, LockError> {
        self.store.force_release(key, owner).await
    }
}

/// Runs the built `dlock` with `args`, standard input not a terminal (empty), and waits for it.
pub async fn dlock(args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("cannot run dlock")
}

/// Standard output of `output`, as text.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Standard error of `output`, as text.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Standard output of `output` as JSON.
pub fn json(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "not JSON ({error}): {}\nstderr: {}",
            stdout(output),
            stderr(output)
        )
    })
}

/// Waits until `key` has `waiters` waiters on `locker`'s store.
pub async fn until_waiters(locker: &Locker, key: &str, waiters: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while locker.inspect(key).await.expect("inspect").waiters() != waiters {
        assert!(
            Instant::now() < deadline,
            "never {waiters} waiters on {key}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A private `redis-server` that requires a password, on a free port, killed on drop: never the
/// shared server, whose configuration other tests rely on.
pub struct PasswordRedis {
    pub port: u16,
    child: Child,
}

impl PasswordRedis {
    pub fn start(password: &str) -> PasswordRedis {
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--requirepass",
                password,
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start redis-server (apt-get install redis-server)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "redis-server never listened on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        PasswordRedis { port, child }
    }
}

impl Drop for PasswordRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A private ZooKeeper (Debian's `zookeeper` package) on a free port with a data directory of
/// its own, killed on drop.
pub struct PrivateZookeeper {
    pub port: u16,
    dir: std::path::PathBuf,
    child: Child,
}

impl PrivateZookeeper {
    pub fn start() -> PrivateZookeeper {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("dlock-cli-zk-{}-{port}", std::process::id()));
        std::fs::create_dir_all(dir.join("data")).expect("a data directory");
        let config = format!(
            "tickTime=500\nminSessionTimeout=1000\nmaxSessionTimeout=120000\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
             maxClientCnxns=0\nforceSync=no\nadmin.enableServer=false\n4lw.commands.whitelist=srvr\n",
            dir.join("data").display()
        );
        std::fs::write(dir.join("zoo.cfg"), config).expect("a configuration");
        let child = Command::new("java")
            .args(["-cp", "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar"])
            .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
            .arg(dir.join("zoo.cfg"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start ZooKeeper (apt-get install zookeeper)");
        let server = PrivateZookeeper { port, dir, child };
        // A JVM on a loaded machine is slow to serve; its port opens before it serves.
        let deadline = Instant::now() + Duration::from_secs(90);
        while !server.serves() {
            assert!(
                Instant::now() < deadline,
                "ZooKeeper never served on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// Whether the server answers the `srvr` command as a serving server does.
    fn serves(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let mut answer = String::new();
        stream.write_all(b"srvr").is_ok()
            && stream.read_to_string(&mut answer).is_ok()
            && answer.starts_with("Zookeeper version")
    }

    pub fn url(&self) -> String {
        format!("zk://127.0.0.1:{}", self.port)
    }
}

impl Drop for PrivateZookeeper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A private one-member etcd (Debian's `etcd-server` package) on free ports with a data
/// directory of its own, killed on drop.
pub struct PrivateEtcd {
    pub port: u16,
    dir: std::path::PathBuf,
    child: Child,
}

impl PrivateEtcd {
    pub fn start() -> PrivateEtcd {
        let (port, peer) = (free_port(), free_port());
        let dir =
            std::env::temp_dir().join(format!("dlock-cli-etcd-{}-{port}", std::process::id()));
        let client = format!("http://127.0.0.1:{port}");
        let peers = format!("http://127.0.0.1:{peer}");
        let child = Command::new("etcd")
            .args(["--name", "n", "--data-dir"])
            .arg(&dir)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peers,
                "--initial-advertise-peer-urls",
                &peers,
            ])
            .args(["--initial-cluster", &format!("n={peers}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start etcd (apt-get install etcd-server)");
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "etcd never served on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        PrivateEtcd { port, dir, child }
    }

    pub fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.port)
    }
}

impl Drop for PrivateEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A port of 127.0.0.1 nobody listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}
