//! A private PostgreSQL server for one test: a fresh cluster (`initdb`) on a free port of
//! 127.0.0.1, with the database `test` and the user `postgres` trusted; stoppable as a crash
//! would stop it and startable again on the same port and data; gone, data and all, on drop.
//! Never the shared server on 5432.
//!
//! The server runs under a small shell that reads the test process's pipe: when the test
//! process ends, however it ends (a nextest time-out kills it), the pipe closes and the shell
//! shuts the server down, so no server outlives its test binary.
//!
//! `initdb` and `postgres` refuse to run as root: as root, the shell, the server and the data
//! directory are the `postgres` user's.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::free_port;

/// How long a server may take to accept connections (crash recovery included, after a
/// [`stop`](PgServer::stop)).
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// One private PostgreSQL server.
pub struct PgServer {
    port: u16,
    /// Holds the data directory (`data/`), the server's log and its Unix socket.
    dir: PathBuf,
    /// Where `initdb`, `postgres` and `psql` are.
    bindir: PathBuf,
    /// The shell that runs the server; `None` while stopped.
    shell: Option<Child>,
    /// It served once on its port: a start after a stop must come back on the same one.
    started_once: bool,
}

impl PgServer {
    /// Creates a cluster, starts it on a free port, creates the database `test`, and returns
    /// once it serves.
    pub fn start_new() -> PgServer {
        let dir = new_dir();
        let mut server = PgServer {
            port: free_port(),
            bindir: bindir(),
            dir,
            shell: None,
            started_once: false,
        };
        server.initdb();
        server.start();
        server.psql("postgres", "CREATE DATABASE test").unwrap();
        server
    }

    /// `postgres://postgres@127.0.0.1:PORT/test`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/test", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Starts the server (again, after a [`stop`](Self::stop): same port, same data, every
    /// committed row kept) and waits until it serves. A fresh server whose port was taken in
    /// the meantime starts again on another.
    pub fn start(&mut self) {
        assert!(self.shell.is_none(), "the server is running");
        let started = Instant::now();
        loop {
            let pid = self.spawn();
            match self.serving_within(&pid, START_TIMEOUT) {
                Ok(()) => {
                    self.started_once = true;
                    return;
                }
                Err(failure) => {
                    self.stop();
                    assert!(
                        !self.started_once && started.elapsed() < 2 * START_TIMEOUT,
                        "{failure}"
                    );
                    // Taken since `free_port` found it free, most likely: another port.
                    self.port = free_port();
                }
            }
        }
    }

    /// Stops the server at once, as a crash would (`pg_ctl stop -m immediate`: no checkpoint,
    /// no goodbye to its clients; the next start recovers from the write-ahead log), and
    /// waits until it is gone. The data directory stays for [`start`](Self::start).
    pub fn stop(&mut self) {
        if let Some(mut shell) = self.shell.take() {
            let _ = shell.stdin.take().unwrap().write_all(b"keep\n");
            let _ = shell.wait();
        }
    }

    /// Runs `initdb`, fast: no syncing to disk, no locale.
    fn initdb(&self) {
        let data = self.dir.join("data");
        let output = self
            .as_server_user(&self.bindir.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["--auth=trust", "-U", "postgres", "--no-sync"])
            .args(["-E", "UTF8", "--locale=C"])
            .output()
            .expect("cannot run initdb");
        assert!(
            output.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Runs the server under the watching shell; returns the server's pid.
    fn spawn(&mut self) -> String {
        // `read` returns when the test process writes a line or ends; then the server goes
        // (SIGQUIT: an immediate shutdown, which waits for its backends to go), and so does the
        // directory unless the line was `keep`.
        //
        // fsync off and a small shared memory keep it fast; commits still reach the operating
        // system before they are acknowledged (`synchronous_commit` stays on), so a stop loses
        // no committed row: the process dies, not the machine.
        let script = r#"
            "$2/postgres" -D "$1/data" -p "$3" -k "$1" \
                -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off \
                -c shared_buffers=16MB -c max_connections=100 \
                >>"$1/server.log" 2>&1 &
            server=$!
            echo "$server"
            read -r command
            kill -QUIT "$server" 2>/dev/null
            wait "$server" 2>/dev/null
            [ "$command" = keep ] || rm -rf "$1"
        "#;
        let mut shell = self
            .as_server_user(Path::new("sh"))
            .args(["-c", script, "pg-server"])
            .arg(&self.dir)
            .arg(&self.bindir)
            .arg(self.port.to_string())
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

    /// Waits until the server whose pid is `pid` serves on this port, for up to `patience`;
    /// what went wrong, with its log, if it died or took longer. The server that answers must
    /// be this one: one that failed to bind its port (another test's server took it between
    /// `free_port` and the start) exits, while the other answers in its place.
    fn serving_within(&self, pid: &str, patience: Duration) -> Result<(), String> {
        let started = Instant::now();
        let data = self.dir.join("data");
        loop {
            let alive = is_running(pid);
            let answer = self.psql("postgres", "SHOW data_directory");
            match &answer {
                Ok(directory) if Path::new(directory) == data && alive => return Ok(()),
                Ok(directory) if !directory.is_empty() => {
                    return Err(format!(
                        "another server answers on port {} (its data: {directory})",
                        self.port
                    ))
                }
                _ => {}
            }
            if !alive || started.elapsed() > patience {
                let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
                return Err(format!(
                    "PostgreSQL on port {} did not start within {:?} (alive: {alive}; psql: \
                     {answer:?}):\n{log}",
                    self.port,
                    started.elapsed()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs one statement with `psql` in `database`, over TCP; its output, trimmed.
    pub fn psql(&self, database: &str, sql: &str) -> Result<String, String> {
        let output = Command::new(self.bindir.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", database, "-XtAq", "-c", sql])
            .env("PGCONNECT_TIMEOUT", "2")
            .stdin(Stdio::null())
            .output()
            .map_err(|error| format!("cannot run psql: {error}"))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).trim().to_owned())
        }
    }

    /// `program`, run as the user that may own the data: `postgres` when this process is root.
    fn as_server_user(&self, program: &Path) -> Command {
        let mut command = if is_root() {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            Command::new(program)
        };
        // Not the test's directory, which the server's user may not be allowed to enter.
        command.current_dir(&self.dir);
        command
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        match self.shell.take() {
            Some(mut shell) => {
                // Closing the pipe without a command: the shell stops the server and removes
                // the directory.
                drop(shell.stdin.take());
                let _ = shell.wait();
            }
            None => {
                let _ = std::fs::remove_dir_all(&self.dir);
            }
        }
    }
}

/// Whether process `pid` runs: it exists and is not a zombie (a server that exited stays one
/// until its shell, waiting for the test's word, reaps it).
pub fn is_running(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat.rsplit_once(") ").map(|(_, rest)| rest.as_bytes());
        !matches!(
            state.and_then(|rest| rest.first()),
            Some(b'Z' | b'X') | None
        )
    })
}

/// A fresh directory for a server, the server's user's.
fn new_dir() -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "dlock-pg-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    if is_root() {
        let status = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(&dir)
            .status()
            .expect("cannot run chown");
        assert!(
            status.success(),
            "cannot hand {} to the user postgres",
            dir.display()
        );
    }
    dir
}

/// Whether this process runs as root, which `initdb` and `postgres` refuse.
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|output| output.stdout.trim_ascii() == b"0")
}

/// Where the server's programs are: `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/*/bin` (Debian's layout, where `pg_config` comes with the headers).
fn bindir() -> PathBuf {
    let has_initdb = |dir: &Path| dir.join("initdb").exists();
    if let Ok(output) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        if output.status.success() && has_initdb(&dir) {
            return dir;
        }
    }
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, dir)| has_initdb(dir))
        .max_by_key(|(version, _)| *version);
    match newest {
        Some((_, dir)) => dir,
        None => panic!(
            "PostgreSQL's server programs (initdb, postgres) are not installed: run \
             scripts/test.sh, which installs the `postgresql` package"
        ),
    }
}
