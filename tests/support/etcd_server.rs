//! Private etcd members for the tests: the Debian `etcd-server` package's binary, on free ports of
//! 127.0.0.1 with data directories of their own; one member for most tests, three for the
//! fault scenarios. Never a shared server.
//!
//! Each member is started through a small shell that reads the test process's pipe: when the
//! test process ends, however it ends, the pipe closes and the shell kills the member, so no etcd
//! outlives its test binary — not even one kept in a `static`.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::free_port;

const ETCD: &str = "/usr/bin/etcd";

/// How long a member may take to serve, on a loaded machine.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// One etcd member.
pub struct EtcdMember {
    name: String,
    client_port: u16,
    peer_port: u16,
    dir: PathBuf,
    /// `name=http://127.0.0.1:peer,…` for every member of the cluster.
    initial_cluster: String,
    /// The shell that runs the member; `None` while stopped.
    shell: Option<Child>,
}

impl EtcdMember {
    /// Starts a one-member cluster and waits until it serves.
    pub fn start_new() -> EtcdMember {
        let mut members = EtcdMember::configure(1);
        let mut member = members.pop().unwrap();
        member.start();
        member.wait_until_serving();
        member
    }

    /// `count` members of one cluster, configured, not started.
    fn configure(count: usize) -> Vec<EtcdMember> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let ports: Vec<(u16, u16)> = (0..count).map(|_| (free_port(), free_port())).collect();
        let names: Vec<String> = (0..count).map(|i| format!("m{i}")).collect();
        let initial_cluster = names
            .iter()
            .zip(&ports)
            .map(|(name, (_, peer))| format!("{name}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        names
            .into_iter()
            .zip(ports)
            .map(|(name, (client_port, peer_port))| {
                let dir = std::env::temp_dir().join(format!(
                    "dlock-etcd-{}-{}-{client_port}",
                    std::process::id(),
                    NEXT.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&dir).unwrap();
                EtcdMember {
                    name,
                    client_port,
                    peer_port,
                    dir,
                    initial_cluster: initial_cluster.clone(),
                    shell: None,
                }
            })
            .collect()
    }

    /// `host:port` of the member's client endpoint.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The member's client port.
    pub fn port(&self) -> u16 {
        self.client_port
    }

    /// `etcd://` for this member alone.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoint())
    }

    /// Starts the member (again, on the same ports and data), without waiting for it.
    pub fn start(&mut self) {
        assert!(self.shell.is_none(), "the member is running");
        assert!(
            Path::new(ETCD).exists(),
            "etcd is not installed ({ETCD} is missing): run scripts/test.sh, which installs the \
             `etcd-server` package"
        );
        let data = self.dir.join("data");
        let state = if data.exists() { "existing" } else { "new" };
        // `read` returns when the test process writes a line or ends; then the member goes,
        // and so does the data directory unless the line was `keep`.
        let script = r#"
            "$1" --name "$2" --data-dir "$3/data" \
                --listen-client-urls "http://127.0.0.1:$4" --advertise-client-urls "http://127.0.0.1:$4" \
                --listen-peer-urls "http://127.0.0.1:$5" --initial-advertise-peer-urls "http://127.0.0.1:$5" \
                --initial-cluster "$6" --initial-cluster-state "$7" --initial-cluster-token dlock-test \
                --heartbeat-interval 50 --election-timeout 500 \
                --logger zap --log-level error >>"$3/server.log" 2>&1 &
            server=$!
            echo "$server"
            read -r command
            kill -9 "$server" 2>/dev/null
            wait "$server" 2>/dev/null
            [ "$command" = keep ] || rm -rf "$3"
        "#;
        let mut shell = Command::new("sh")
            .args(["-c", script, "etcd-member", ETCD, &self.name])
            .arg(&self.dir)
            .arg(self.client_port.to_string())
            .arg(self.peer_port.to_string())
            .arg(&self.initial_cluster)
            .arg(state)
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
    }

    /// Waits until the member accepts connections; panics with its log after
    /// [`START_TIMEOUT`].
    pub fn wait_until_serving(&self) {
        let deadline = Instant::now() + START_TIMEOUT;
        while TcpStream::connect(("127.0.0.1", self.client_port)).is_err() {
            if Instant::now() >= deadline {
                let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
                panic!(
                    "etcd {} did not serve within {START_TIMEOUT:?}:\n{log}",
                    self.name
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the member (as a crash would), keeping its data for a restart.
    pub fn stop(&mut self) {
        if let Some(mut shell) = self.shell.take() {
            let _ = shell.stdin.take().unwrap().write_all(b"keep\n");
            let _ = shell.wait();
        }
    }
}

impl Drop for EtcdMember {
    fn drop(&mut self) {
        match self.shell.take() {
            Some(mut shell) => {
                // Closing the pipe without a command: the shell kills the member and removes
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

/// Three members of one cluster.
pub struct EtcdCluster {
    pub members: Vec<EtcdMember>,
}

impl EtcdCluster {
    /// Starts three members and waits until each serves.
    pub fn start() -> EtcdCluster {
        let mut members = EtcdMember::configure(3);
        for member in &mut members {
            member.start();
        }
        for member in &members {
            member.wait_until_serving();
        }
        EtcdCluster { members }
    }

    /// `etcd://` naming every member.
    pub fn url(&self) -> String {
        let endpoints: Vec<String> = self.members.iter().map(EtcdMember::endpoint).collect();
        format!("etcd://{}", endpoints.join(","))
    }

    /// The member that leads now, as a member that serves says; `None` during an election or
    /// where none answers.
    pub fn leader(&self) -> Option<usize> {
        for member in self.members.iter().filter(|m| m.shell.is_some()) {
            if let Some(leader) = member.leader_port() {
                // A member may still name a leader that was just killed: that one leads no more.
                return self
                    .members
                    .iter()
                    .position(|m| m.client_port == leader && m.shell.is_some());
            }
        }
        None
    }

    /// Waits until some member leads, for up to `patience`; returns it.
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

    /// Kills member `index` with SIGKILL, as a crash would; its data stays for
    /// [`restart`](Self::restart).
    pub fn kill(&mut self, index: usize) {
        self.members[index].stop();
    }

    /// Starts member `index` again, with its data, and waits until it serves.
    pub fn restart(&mut self, index: usize) {
        self.members[index].start();
        self.members[index].wait_until_serving();
    }
}

impl EtcdMember {
    /// The client port of the member this one says leads, asked on a runtime of its own (the
    /// fault scenarios are synchronous); `None` where it does not answer within a second or
    /// knows no leader.
    fn leader_port(&self) -> Option<u16> {
        let endpoint = format!("http://{}", self.endpoint());
        let ask = async move {
            let mut client = etcd_client::Client::connect([endpoint], None).await.ok()?;
            let status = client.status().await.ok()?;
            let leader = status.leader();
            if leader == 0 {
                return None;
            }
            let members = client.member_list().await.ok()?;
            let url = members
                .members()
                .iter()
                .find(|member| member.id() == leader)?
                .client_urls()
                .first()?
                .clone();
            url.rsplit(':').next()?.parse().ok()
        };
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(1), ask)
                    .await
                    .ok()?
            })
    }
}

/// The URL of the member the tests of this process share, started on first use.
pub async fn shared_url() -> String {
    static SHARED: OnceLock<EtcdMember> = OnceLock::new();
    tokio::task::spawn_blocking(|| SHARED.get_or_init(EtcdMember::start_new).url())
        .await
        .unwrap()
}
