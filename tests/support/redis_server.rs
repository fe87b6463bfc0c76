//! A private `redis-server` for one test: on a free port, without persistence unless asked,
//! stoppable and restartable on the same port, killed on drop. Never the shared server on 6379.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

pub struct RedisServer {
    port: u16,
    password: Option<String>,
    child: Option<Child>,
    /// For a TLS server: the directory of its certificates.
    tls: Option<std::path::PathBuf>,
    /// For a persistent server: the directory of its append-only file.
    aof: Option<std::path::PathBuf>,
    /// It ran once on its port: a restart must come back on the same one.
    started_once: bool,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers.
    pub fn start() -> RedisServer {
        Self::start_with(None)
    }

    /// Starts a server that requires `password` (`--requirepass`).
    pub fn start_with_password(password: &str) -> RedisServer {
        Self::start_with(Some(password.to_owned()))
    }

    /// Starts a server that writes every command to an append-only file before answering
    /// (`--appendfsync always`), so a restart keeps every key and its expiry: the configuration
    /// a lock needs to survive a restart of its server.
    pub fn start_persistent() -> RedisServer {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("dlock-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut server = RedisServer {
            port,
            password: None,
            child: None,
            tls: None,
            aof: Some(dir),
            started_once: false,
        };
        server.spawn();
        server
    }

    fn start_with(password: Option<String>) -> RedisServer {
        let mut server = RedisServer {
            port: free_port(),
            password,
            child: None,
            tls: None,
            aof: None,
            started_once: false,
        };
        server.spawn();
        server
    }

    /// Starts a server that speaks only TLS, with a certificate for `localhost` and 127.0.0.1
    /// signed by a fresh CA (see [`ca_file`](Self::ca_file)). Needs the `openssl` command.
    pub fn start_tls() -> RedisServer {
        let dir =
            std::env::temp_dir().join(format!("dlock-tls-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).unwrap();
        let openssl = |args: &[&str]| {
            let status = Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("cannot run openssl");
            assert!(status.success(), "openssl {args:?} failed");
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=dlock test CA",
        ]);
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ]);
        std::fs::write(
            dir.join("san.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        )
        .unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ]);
        let mut server = RedisServer {
            port: free_port(),
            password: None,
            child: None,
            tls: Some(dir),
            aof: None,
            started_once: false,
        };
        server.spawn();
        server
    }

    /// The CA that signed a TLS server's certificate.
    pub fn ca_file(&self) -> Option<std::path::PathBuf> {
        self.tls.as_ref().map(|dir| dir.join("ca.pem"))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`, with the password if the server has one.
    pub fn url(&self) -> String {
        match &self.password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}", self.port),
            None => self.url_without_password(),
        }
    }

    pub fn url_without_password(&self) -> String {
        match &self.tls {
            Some(_) => format!("rediss://localhost:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// Kills the server (SIGKILL: no goodbye to its clients) and waits for it to be gone.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server if it runs, and starts it again on the same port: empty, unless it was
    /// started [persistent](Self::start_persistent).
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// The command that starts this server on its port.
    fn command(&self) -> Command {
        let port = self.port.to_string();
        let mut command = Command::new("redis-server");
        match &self.tls {
            None => command.args(["--port", &port]),
            Some(dir) => command
                .args([
                    "--port",
                    "0",
                    "--tls-port",
                    &port,
                    "--tls-auth-clients",
                    "no",
                ])
                .arg("--tls-cert-file")
                .arg(dir.join("server.pem"))
                .arg("--tls-key-file")
                .arg(dir.join("server.key"))
                .arg("--tls-ca-cert-file")
                .arg(dir.join("ca.pem")),
        };
        command.args(["--bind", "127.0.0.1", "--save", ""]);
        match &self.aof {
            None => command
                .args(["--appendonly", "no"])
                .arg("--dir")
                .arg(std::env::temp_dir()),
            Some(dir) => command
                .args(["--appendonly", "yes", "--appendfsync", "always"])
                .arg("--dir")
                .arg(dir),
        };
        if let Some(password) = &self.password {
            command.args(["--requirepass", password]);
        }
        command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .stdin(Stdio::null());
        command
    }

    fn spawn(&mut self) {
        let started = Instant::now();
        loop {
            let child = self
                .command()
                .spawn()
                .expect("cannot run redis-server: is it installed (apt-get install redis-server)?");
            self.child = Some(child);
            if self.wait_until_answering(Duration::from_secs(10)) {
                self.started_once = true;
                return;
            }
            self.stop();
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "redis-server on port {} did not start",
                self.port
            );
            if !self.started_once {
                // Taken since `free_port` found it free: another port. (A restart keeps its
                // port, which is free again right after a kill once the kernel lets it go.)
                self.port = free_port();
            }
        }
    }

    /// Whether the server answering on `stream` is the process this handle started: a server
    /// that failed to bind its port (another test's took it between `free_port` and the spawn)
    /// exits, while the other one answers in its place.
    fn is_ours(&mut self, stream: &mut TcpStream) -> bool {
        let Some(child) = self.child.as_mut() else {
            return false;
        };
        let pid = child.id();
        let mut request = String::new();
        if let Some(password) = &self.password {
            request.push_str(&format!("AUTH {password}\r\n"));
        }
        request.push_str("INFO server\r\n");
        if stream.write_all(request.as_bytes()).is_err() {
            return false;
        }
        let mut info = Vec::new();
        let mut chunk = [0u8; 4096];
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => info.extend_from_slice(&chunk[..n]),
            }
            if String::from_utf8_lossy(&info).contains("tcp_port:") {
                break;
            }
        }
        let info = String::from_utf8_lossy(&info);
        let ours = info.contains(&format!("process_id:{pid}\r\n"));
        ours && matches!(child.try_wait(), Ok(None))
    }

    fn wait_until_answering(&mut self, patience: Duration) -> bool {
        let deadline = Instant::now() + patience;
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(_)) = child.try_wait() {
                    return false; // exited: port taken, most likely
                }
            }
            if let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                if self.tls.is_some() {
                    // It listens; the TLS handshake is the client's to test.
                    return true;
                }
                let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
                let mut reply = [0u8; 64];
                if stream.write_all(b"PING\r\n").is_ok() {
                    if let Ok(n) = stream.read(&mut reply) {
                        // +PONG, or -NOAUTH where a password is required: it answers either way.
                        if n > 0
                            && (reply[0] == b'+' || reply[0] == b'-')
                            && !reply[..n].starts_with(b"-LOADING")
                        {
                            // Ours, or another test's server on a port ours failed to take?
                            return self.is_ours(&mut stream);
                        }
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        for dir in self.tls.iter().chain(&self.aof) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A private Redis Cluster of three primaries (no replicas, unless started
/// [with them](RedisCluster::start_with_replicas)), each node on free ports, killed on drop.
pub struct RedisCluster {
    nodes: Vec<Child>,
    ports: Vec<u16>,
    dir: std::path::PathBuf,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        Self::start_with(0)
    }

    /// Three primaries with one replica each, the replicas in sync when it returns.
    pub fn start_with_replicas() -> RedisCluster {
        Self::start_with(1)
    }

    fn start_with(replicas: usize) -> RedisCluster {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("dlock-cluster-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut cluster = RedisCluster {
            nodes: Vec::new(),
            ports: Vec::new(),
            dir,
        };
        for _ in 0..3 * (1 + replicas) {
            // A port found free can be taken before the node binds it, by another test's
            // server, which would then answer in its place: a node counts as started once the
            // server answering on its port is its own process, else it starts again elsewhere.
            let mut tries = 0;
            loop {
                let (port, bus) = (free_port(), free_port());
                let mut child = Command::new("redis-server")
                    .args([
                        "--port",
                        &port.to_string(),
                        "--cluster-port",
                        &bus.to_string(),
                        "--bind",
                        "127.0.0.1",
                    ])
                    .args([
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &format!("nodes-{port}.conf"),
                    ])
                    .args([
                        "--repl-diskless-sync-delay",
                        "0",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--dir",
                        &cluster.dir.to_string_lossy(),
                    ])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect(
                        "cannot run redis-server: is it installed (apt-get install redis-server)?",
                    );
                let its_own = format!("process_id:{}\r\n", child.id());
                if answers(
                    port,
                    b"INFO server\r\n",
                    its_own.as_bytes(),
                    Duration::from_secs(10),
                ) {
                    cluster.nodes.push(child);
                    cluster.ports.push(port);
                    break;
                }
                let _ = child.kill();
                let _ = child.wait();
                tries += 1;
                assert!(tries < 3, "cluster node on port {port} did not start");
            }
        }
        let addresses: Vec<String> = cluster
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let status = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("cannot run redis-cli");
        assert!(status.success(), "redis-cli --cluster create failed");
        for &port in &cluster.ports {
            assert!(
                answers(
                    port,
                    b"CLUSTER INFO\r\n",
                    b"cluster_state:ok",
                    Duration::from_secs(20)
                ),
                "cluster node {port} never saw the cluster ok"
            );
        }
        for &port in &cluster.ports {
            if replicas == 0 {
                break;
            }
            // In sync: a replica says its link is up, a primary that its replica is online.
            let started = Instant::now();
            let request = b"INFO replication\r\n";
            while !answers(
                port,
                request,
                b"master_link_status:up",
                Duration::from_millis(100),
            ) && !answers(port, request, b"state=online", Duration::from_millis(100))
            {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "cluster node {port}: its replication never came up"
                );
            }
        }
        cluster
    }

    /// `redis+cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// Kills node `index` (SIGKILL), as a primary that goes down.
    pub fn kill_node(&mut self, index: usize) {
        let _ = self.nodes[index].kill();
        let _ = self.nodes[index].wait();
    }

    pub fn node_urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for child in &mut self.nodes {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether the server on `port` answers `request` with a reply containing `expected` within
/// `patience`.
fn answers(port: u16, request: &[u8], expected: &[u8], patience: Duration) -> bool {
    let deadline = Instant::now() + patience;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    while Instant::now() < deadline {
        if let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
            let mut reply = [0u8; 4096];
            if stream.write_all(request).is_ok() {
                if let Ok(n) = stream.read(&mut reply) {
                    if reply[..n].windows(expected.len()).any(|w| w == expected) {
                        return true;
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Gives `lock_key` to a stranger for an hour from outside, as a split-brain takeover would;
/// asserts it was held.
pub async fn steal_lock(connection: &mut impl redis::aio::ConnectionLike, lock_key: &str) {
    let taken: Option<String> = redis::cmd("SET")
        .arg(lock_key)
        .arg("a-stranger")
        .arg("XX")
        .arg("PX")
        .arg(3_600_000)
        .query_async(connection)
        .await
        .unwrap();
    assert!(taken.is_some(), "`{lock_key}` was not held");
}

/// Deletes `lock_key` from outside, as its expiry would; asserts it was held.
pub async fn delete_lock(connection: &mut impl redis::aio::ConnectionLike, lock_key: &str) {
    let deleted: u64 = redis::cmd("DEL")
        .arg(lock_key)
        .query_async(connection)
        .await
        .unwrap();
    assert_eq!(deleted, 1, "`{lock_key}` was not held");
}
