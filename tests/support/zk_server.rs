//! A private ZooKeeper server for the tests: the Debian `zookeeper` package's jar, run as a
//! standalone server on a free port of 127.0.0.1 with a data directory of its own.
//!
//! The server is started through a small shell that reads the test process's pipe: when the
//! test process ends, however it ends, the pipe closes and the shell kills the server, so no JVM
//! outlives its test binary — not even the one kept in a `static`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::fault_proxy::{Direction, FaultProxy};
use super::free_port;

const JAR: &str = "/usr/share/java/zookeeper.jar";

/// How long a JVM may take to serve, on a loaded machine.
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// One standalone ZooKeeper server.
pub struct ZkServer {
    port: u16,
    dir: PathBuf,
    /// The shell that runs the server; `None` while stopped.
    shell: Option<Child>,
    /// A member of an ensemble, rather than a standalone server.
    in_ensemble: bool,
}

impl ZkServer {
    /// Starts a server on a free port with a fresh data directory, and waits until it serves.
    ///
    /// Its tick is 500 ms and it grants session timeouts from 1 s to 120 s, so tests may ask
    /// for short sessions (to see them expire) and for leases of a minute.
    pub fn start_new() -> ZkServer {
        ZkServer::start_granting_at_most(Duration::from_secs(120))
    }

    /// Starts a server as [`start_new`](Self::start_new) does, but granting session timeouts
    /// of at most `max_session`: a server configured differently from the one a client was on.
    pub fn start_granting_at_most(max_session: Duration) -> ZkServer {
        let port = free_port();
        let dir = ZkServer::new_dir(port);
        let config = format!(
            "tickTime=500\n\
             minSessionTimeout=1000\n\
             maxSessionTimeout={max}\n\
             dataDir={data}\n\
             clientPort={port}\n\
             clientPortAddress=127.0.0.1\n\
             maxClientCnxns=0\n\
             forceSync=no\n\
             admin.enableServer=false\n\
             4lw.commands.whitelist=srvr\n",
            data = dir.join("data").display(),
            max = max_session.as_millis()
        );
        std::fs::write(dir.join("zoo.cfg"), config).unwrap();
        let mut server = ZkServer {
            port,
            dir,
            shell: None,
            in_ensemble: false,
        };
        server.start();
        server
    }

    /// A fresh data directory for a server on client port `port`.
    fn new_dir(port: u16) -> PathBuf {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "dlock-zk-{}-{}-{port}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        dir
    }

    /// The `zk://` URL of the server.
    pub fn url(&self) -> String {
        format!("zk://127.0.0.1:{}", self.port)
    }

    /// Starts the server again (same port, same data: sessions and nodes survive a restart,
    /// as on a real ensemble) and waits until it serves.
    pub fn start(&mut self) {
        let pid = self.spawn();
        self.wait_until_serving(&pid);
    }

    /// The Java class that runs the server: a standalone one, or a member of an ensemble.
    fn main_class(&self) -> &'static str {
        if self.in_ensemble {
            "org.apache.zookeeper.server.quorum.QuorumPeerMain"
        } else {
            "org.apache.zookeeper.server.ZooKeeperServerMain"
        }
    }

    /// Runs the server's JVM under the watching shell; returns the JVM's pid.
    fn spawn(&mut self) -> String {
        assert!(self.shell.is_none(), "the server is running");
        assert!(
            Path::new(JAR).exists(),
            "ZooKeeper is not installed ({JAR} is missing): run scripts/test.sh, which installs \
             the `zookeeper` package, or set DLOCK_ZK_URL"
        );
        // `read` returns when the test process writes a line or ends; then the server goes,
        // and so does the data directory unless the line was `keep`.
        //
        // An ensemble member that finds no peer to vote with asks again after a pause that
        // doubles up to a minute by default: one slow JVM start on a loaded machine once kept
        // a fresh ensemble from electing anyone for 90 s. Asking every second at most keeps
        // an election as short as the slowest member's start.
        let script = r#"
            java -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto \
                -Dzookeeper.admin.enableServer=false \
                -Dzookeeper.fastleader.maxNotificationInterval=1000 \
                -cp /etc/zookeeper/conf:/usr/share/java/zookeeper.jar \
                "$2" "$1/zoo.cfg" >>"$1/server.log" 2>&1 &
            server=$!
            echo "$server"
            read -r command
            kill -9 "$server" 2>/dev/null
            wait "$server" 2>/dev/null
            [ "$command" = keep ] || rm -rf "$1"
        "#;
        let mut shell = Command::new("sh")
            .args(["-c", script, "zk-server"])
            .arg(&self.dir)
            .arg(self.main_class())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot run sh");
        let mut pid = String::new();
        BufReader::new(shell.stdout.take().unwrap())
            .read_line(&mut pid)
            .unwrap();
        self.shell = Some(shell);
        pid.trim().to_owned()
    }

    /// Waits until the server whose JVM is `pid` serves clients; panics with its log if it dies
    /// or takes longer than [`START_TIMEOUT`].
    fn wait_until_serving(&self, pid: &str) {
        if let Err(failure) = self.serving_within(pid, START_TIMEOUT) {
            panic!("{failure}");
        }
    }

    /// Waits until the server whose JVM is `pid` serves clients, for up to `patience`; what went
    /// wrong, with its log, if it died or took longer.
    fn serving_within(&self, pid: &str, patience: Duration) -> Result<(), String> {
        let started = Instant::now();
        while !self.is_serving() {
            let alive = Path::new(&format!("/proc/{pid}")).exists();
            if !alive || started.elapsed() > patience {
                let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
                return Err(format!(
                    "ZooKeeper on port {} did not start within {:?} (alive: {alive}; `srvr` \
                     answers {:?}):\n{log}",
                    self.port,
                    started.elapsed(),
                    self.srvr()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Kills the server (as a crash would: no goodbye to its clients) and waits until it is
    /// gone. The data directory stays for [`start`](Self::start).
    pub fn stop(&mut self) {
        if let Some(mut shell) = self.shell.take() {
            let _ = shell.stdin.take().unwrap().write_all(b"keep\n");
            let _ = shell.wait();
        }
    }

    /// Whether the server serves clients: `srvr` answers its version once it does (`ruok`
    /// answers `imok` before that).
    fn is_serving(&self) -> bool {
        self.srvr().starts_with("Zookeeper version")
    }

    /// The server's role as `srvr` tells it: `standalone`, `leader` or `follower`; empty while
    /// it serves no clients.
    pub fn mode(&self) -> String {
        self.srvr()
            .lines()
            .find_map(|line| line.strip_prefix("Mode: "))
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    /// The answer to the `srvr` command; empty if there is none.
    fn srvr(&self) -> String {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return String::new();
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let mut answer = String::new();
        if stream.write_all(b"srvr").is_err() || stream.read_to_string(&mut answer).is_err() {
            return String::new();
        }
        answer
    }
}

impl Drop for ZkServer {
    fn drop(&mut self) {
        match self.shell.take() {
            Some(mut shell) => {
                // Closing the pipe without a command: the shell kills the server and removes
                // the data directory.
                drop(shell.stdin.take());
                let _ = shell.wait();
            }
            None => {
                let _ = std::fs::remove_dir_all(&self.dir);
            }
        }
    }
}

/// The URL of the server the tests share: `DLOCK_ZK_URL` if set, else a private server started
/// on first use and shared by every test of this process.
pub async fn shared_url() -> String {
    if let Ok(url) = std::env::var("DLOCK_ZK_URL") {
        if !url.trim().is_empty() {
            return url.trim().to_owned();
        }
    }
    static SHARED: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    SHARED
        .get_or_init(|| async {
            static SERVER: OnceLock<ZkServer> = OnceLock::new();
            let url = tokio::task::spawn_blocking(|| SERVER.get_or_init(ZkServer::start_new).url())
                .await
                .unwrap();
            warm_up(&url).await;
            url
        })
        .await
        .clone()
}

/// Runs the server's write path a few hundred times, so its JIT has compiled it before a test
/// measures anything: a cold JVM serves a lock several times slower than a warm one.
#[cfg(feature = "zookeeper")]
async fn warm_up(url: &str) {
    use dlock::backend::ZookeeperBackend;
    use dlock::{LockOptions, Locker};

    let backend = ZookeeperBackend::builder(url)
        .unwrap()
        .root("/dlock-warm-up")
        .connect()
        .await
        .unwrap();
    let locker = Locker::with_backend(backend);
    for i in 0..WARM_UP_LOCKS {
        let key = format!("warm-up-{i}");
        super::lock_and_release(&locker, &key, LockOptions::new().renew(false)).await;
    }
}

#[cfg(not(feature = "zookeeper"))]
async fn warm_up(_: &str) {}

/// Lock-release cycles of the warm-up: each is four writes and two reads on the server.
const WARM_UP_LOCKS: usize = 100;

/// A plain ZooKeeper client on `url` (`zk://host:port[/chroot]`), for tests that create or read
/// nodes directly. Its session task runs on the calling test's runtime.
pub async fn plain_client(url: &str) -> zookeeper_client::Client {
    struct OnTestRuntime(tokio::runtime::Handle);
    impl spawns_core::Spawn for OnTestRuntime {
        fn spawn(&self, task: spawns_core::Task) {
            drop(self.0.spawn(Box::into_pin(task.future)));
        }
    }
    use std::future::Future;

    let spawner = OnTestRuntime(tokio::runtime::Handle::current());
    let hosts = url.strip_prefix("zk://").expect("a zk:// URL");
    let connect = zookeeper_client::Client::connector()
        .with_session_timeout(Duration::from_secs(30))
        .connect(hosts);
    let mut connect = std::pin::pin!(connect);
    std::future::poll_fn(|cx| {
        let _scope = spawns_core::enter(&spawner);
        connect.as_mut().poll(cx)
    })
    .await
    .expect("cannot connect a plain ZooKeeper client")
}

/// A private ensemble of three servers on 127.0.0.1 whose first server can be cut off from the
/// other two while its clients stay connected to it: every connection between the first server
/// and another (its link to the leader, and the election links) runs through a [`FaultProxy`].
///
/// Its tick is 500 ms and a follower keeps following a silent leader for `syncLimit` = 20
/// ticks, so a follower cut off from the quorum goes on serving its clients from its own copy
/// of the data for about 10 s: longer than the sessions the tests ask for.
pub struct ZkEnsemble {
    servers: Vec<ZkServer>,
    /// The proxies on the first server's links to the other two.
    links: Vec<FaultProxy>,
}

impl ZkEnsemble {
    /// Starts the three servers and waits until all serve: the first is a follower then, as a
    /// fresh ensemble elects the server with the highest id.
    ///
    /// A fresh ensemble on this loaded machine has, now and then, stayed without a leader for
    /// well over a minute (its members alive, none serving): such a start is given up after
    /// 40 s and made again on fresh ports, up to three times.
    pub fn start() -> ZkEnsemble {
        let mut failures = Vec::new();
        for _ in 0..3 {
            match Self::try_start(Duration::from_secs(40)) {
                Ok(ensemble) => return ensemble,
                Err(failure) => {
                    eprintln!("a ZooKeeper ensemble did not start; starting another: {failure}");
                    failures.push(failure);
                }
            }
        }
        panic!(
            "no ZooKeeper ensemble started in three tries:\n{}",
            failures.join("\n")
        );
    }

    /// One try of [`start`](Self::start), each server given `patience`.
    fn try_start(patience: Duration) -> Result<ZkEnsemble, String> {
        let client: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let quorum: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let election: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let proxy = |port: u16| {
            let proxy = FaultProxy::start(&format!("127.0.0.1:{port}"));
            // A follower dials its new leader as soon as it is elected, maybe before that
            // leader listens; refused, it tries again, but a connection the proxy accepted and
            // then closed would send it back to the election, and the leader would wait
            // `initLimit` for it.
            proxy.retry_refused_for(Duration::from_secs(5));
            proxy
        };
        // The first server's ports as the others reach them, and theirs as it reaches them.
        let first_seen = (proxy(quorum[0]), proxy(election[0]));
        let others_seen: Vec<(FaultProxy, FaultProxy)> = (1..3)
            .map(|i| (proxy(quorum[i]), proxy(election[i])))
            .collect();
        let mut servers = Vec::new();
        for (me, &client_port) in client.iter().enumerate() {
            let dir = ZkServer::new_dir(client_port);
            std::fs::write(dir.join("data").join("myid"), format!("{}\n", me + 1)).unwrap();
            let mut config = format!(
                "tickTime=500\n\
                 initLimit=20\n\
                 syncLimit=20\n\
                 minSessionTimeout=1000\n\
                 maxSessionTimeout=120000\n\
                 dataDir={data}\n\
                 clientPort={port}\n\
                 clientPortAddress=127.0.0.1\n\
                 maxClientCnxns=0\n\
                 forceSync=no\n\
                 admin.enableServer=false\n\
                 4lw.commands.whitelist=srvr\n",
                data = dir.join("data").display(),
                port = client_port
            );
            for peer in 0..3 {
                let (q, e) = match (me, peer) {
                    _ if me == peer => (quorum[peer], election[peer]),
                    (0, _) => (
                        others_seen[peer - 1].0.port(),
                        others_seen[peer - 1].1.port(),
                    ),
                    (_, 0) => (first_seen.0.port(), first_seen.1.port()),
                    _ => (quorum[peer], election[peer]),
                };
                config.push_str(&format!("server.{}=127.0.0.1:{q}:{e}\n", peer + 1));
            }
            std::fs::write(dir.join("zoo.cfg"), config).unwrap();
            servers.push(ZkServer {
                port: client_port,
                dir,
                shell: None,
                in_ensemble: true,
            });
        }
        let pids: Vec<String> = servers.iter_mut().map(ZkServer::spawn).collect();
        for (server, pid) in servers.iter().zip(&pids) {
            // Dropped on failure, the servers are killed and their directories removed.
            server.serving_within(pid, patience)?;
        }
        let mut links = vec![first_seen.0, first_seen.1];
        for (q, e) in others_seen {
            links.extend([q, e]);
        }
        Ok(ZkEnsemble { servers, links })
    }

    /// The server `index` (0, 1 or 2).
    pub fn server(&self, index: usize) -> &ZkServer {
        &self.servers[index]
    }

    /// A `zk://` URL naming the servers `indices`, so a client connects to those only.
    pub fn url_of(&self, indices: &[usize]) -> String {
        let hosts: Vec<String> = indices
            .iter()
            .map(|&i| format!("127.0.0.1:{}", self.servers[i].port))
            .collect();
        format!("zk://{}", hosts.join(","))
    }

    /// A `zk://` URL naming every server.
    pub fn url(&self) -> String {
        self.url_of(&[0, 1, 2])
    }

    /// Cuts the first server off from the other two, both ways, keeping every connection open
    /// (its bytes are held, as in a partition); its clients still reach it.
    pub fn cut_off_first(&self) {
        for link in &self.links {
            link.stall(Direction::Both);
        }
    }

    /// Ends the partition [`cut_off_first`](Self::cut_off_first) made: the held bytes flow.
    pub fn reconnect_first(&self) {
        for link in &self.links {
            link.resume(Direction::Both);
        }
    }

    /// The server that leads the ensemble now, as `srvr` tells; `None` during an election.
    pub fn leader(&self) -> Option<usize> {
        (0..self.servers.len()).find(|&i| self.servers[i].mode() == "leader")
    }

    /// Waits until some server leads, for up to `patience`; returns it.
    pub fn wait_for_leader(&self, patience: Duration) -> Option<usize> {
        let deadline = Instant::now() + patience;
        loop {
            if let Some(leader) = self.leader() {
                return Some(leader);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server `index` with SIGKILL, as a crash would; its data stays for
    /// [`restart`](Self::restart).
    pub fn kill(&mut self, index: usize) {
        self.servers[index].stop();
    }

    /// Starts the server `index` again, with its data, and waits until it serves: it has
    /// rejoined the ensemble and caught up with the leader by then.
    pub fn restart(&mut self, index: usize) {
        self.servers[index].start();
    }
}
