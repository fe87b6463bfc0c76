//! Through PgBouncer in transaction mode: a private `pgbouncer` on a free port in front of the
//! shared server, pooling the lockers' connections onto fewer server connections than they
//! open, so consecutive statements of one client run on different server connections.
//!
//! With the listener pointed at the server ([`PostgresBuilder::listen_url`]), leases keep every
//! promise: exclusion, a waiter woken by the release, renewal and expiry. With the listener
//! through PgBouncer too, exclusion still holds.
//!
//! Each test runs with the backends sending simple queries (`?prepared_statements=false`),
//! which every PgBouncer passes on, and again sending prepared statements where the PgBouncer
//! can carry them across server connections: 1.21 and later, with `max_prepared_statements`
//! set. (Debian 12 ships 1.18, which mixes up its clients' prepared statements: there, the
//! tests say so and run with simple queries only.) Without a `pgbouncer` at all, they say so
//! and return. `DLOCK_PGBOUNCER` names another `pgbouncer` program to run.
//!
//! [`PostgresBuilder::listen_url`]: dlock::backend::PostgresBuilder::listen_url

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backend::PostgresBackend;
use dlock::{LockError, LockOptions, Locker};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{Connection, Row};

use crate::support::pg_server::{is_root, is_running};
use crate::support::{self, free_port, postgres_url};
use crate::Postgres;

/// The first PgBouncer that follows a client's prepared statements across server connections.
const PREPARED_STATEMENTS_SINCE: (u32, u32) = (1, 21);

/// Server connections PgBouncer opens for the tests' clients: fewer than the clients, so they
/// take turns on them.
const SERVER_CONNECTIONS: u32 = 3;

/// How the backends under test send their statements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sent {
    /// Simple queries, their values written into the SQL: any PgBouncer passes them on.
    AsSimpleQueries,
    /// Named prepared statements: PgBouncer 1.21 and later, with `max_prepared_statements`.
    Prepared,
}

/// A private PgBouncer, killed (with its directory removed) on drop.
struct PgBouncer {
    port: u16,
    dir: PathBuf,
    /// The shell that runs it, and kills it when its standard input closes.
    shell: Child,
    /// Whether it carries prepared statements across server connections.
    carries_prepared_statements: bool,
}

impl PgBouncer {
    /// Starts one in transaction mode in front of the shared server, or says why not and
    /// returns `None`: there is no PgBouncer.
    fn start() -> Option<PgBouncer> {
        let Some(program) = program() else {
            eprintln!(
                "SKIPPED: no pgbouncer (scripts/test.sh installs Debian's `pgbouncer`; \
                 DLOCK_PGBOUNCER names another)"
            );
            return None;
        };
        let version = version(&program);
        let carries_prepared_statements = version >= Some(PREPARED_STATEMENTS_SINCE);
        if !carries_prepared_statements {
            let version = version.map_or("of unknown version".into(), |(major, minor)| {
                format!("{major}.{minor}")
            });
            eprintln!(
                "NOTE: {} is PgBouncer {version}, which cannot carry prepared statements \
                 across server connections in transaction mode (1.21 and later can; \
                 DLOCK_PGBOUNCER names another pgbouncer): testing with simple queries only",
                program.display()
            );
        }
        let mut failures = Vec::new();
        for _ in 0..3 {
            match PgBouncer::spawn(&program, carries_prepared_statements) {
                Ok(pgbouncer) => return Some(pgbouncer),
                // Its port taken since `free_port` found it free, most likely.
                Err(failure) => failures.push(failure),
            }
        }
        panic!("pgbouncer did not start:\n{}", failures.join("\n"));
    }

    /// The ways of sending statements this PgBouncer passes on.
    fn ways(&self) -> Vec<Sent> {
        if self.carries_prepared_statements {
            vec![Sent::AsSimpleQueries, Sent::Prepared]
        } else {
            vec![Sent::AsSimpleQueries]
        }
    }

    fn spawn(program: &Path, carries_prepared_statements: bool) -> Result<PgBouncer, String> {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("dlock-pgbouncer-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let server: PgConnectOptions = postgres_url().parse().unwrap();
        // An older PgBouncer refuses a configuration with a setting it does not know.
        let prepared_statements = if carries_prepared_statements {
            "max_prepared_statements = 100\n"
        } else {
            ""
        };
        let config = format!(
            "[databases]\n\
             test = host={host} port={server_port} dbname={database} user={user}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {dir}/users.txt\n\
             pool_mode = transaction\n\
             default_pool_size = {SERVER_CONNECTIONS}\n\
             {prepared_statements}\
             ignore_startup_parameters = extra_float_digits\n\
             logfile = {dir}/pgbouncer.log\n\
             pidfile = {dir}/pgbouncer.pid\n",
            host = server.get_host(),
            server_port = server.get_port(),
            database = server.get_database().unwrap_or("test"),
            user = server.get_username(),
            dir = dir.display(),
        );
        std::fs::write(dir.join("pgbouncer.ini"), config).unwrap();
        // PgBouncer logs in to the server with the password its users file gives the user.
        let users = format!(
            "\"{}\" \"{}\"\n",
            server.get_username(),
            password(&postgres_url())
        );
        std::fs::write(dir.join("users.txt"), users).unwrap();
        // PgBouncer refuses to run as root.
        let mut command = if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .expect("cannot run chown");
            assert!(status.success());
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--", "sh"]);
            command
        } else {
            Command::new("sh")
        };
        // `read` returns when the test process ends, however it ends: then PgBouncer goes.
        let script = r#"
            "$1" "$2/pgbouncer.ini" >>"$2/pgbouncer.out" 2>&1 &
            pgbouncer=$!
            echo "$pgbouncer"
            read -r _
            kill -9 "$pgbouncer" 2>/dev/null
            wait "$pgbouncer" 2>/dev/null
            rm -rf "$2"
        "#;
        let mut shell = command
            .args(["-c", script, "pgbouncer"])
            .arg(program)
            .arg(&dir)
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot run sh");
        let mut pid = String::new();
        BufReader::new(shell.stdout.take().unwrap())
            .read_line(&mut pid)
            .unwrap();
        let pgbouncer = PgBouncer {
            port,
            dir,
            shell,
            carries_prepared_statements,
        };
        // It serves once its pid file names it: written after it bound its port.
        let started = Instant::now();
        loop {
            let written = std::fs::read_to_string(pgbouncer.dir.join("pgbouncer.pid"))
                .is_ok_and(|written| written.trim() == pid.trim());
            if written {
                return Ok(pgbouncer);
            }
            let alive = is_running(pid.trim());
            if !alive || started.elapsed() > Duration::from_secs(10) {
                let log = std::fs::read_to_string(pgbouncer.dir.join("pgbouncer.out"))
                    .unwrap_or_default();
                return Err(format!("pgbouncer on port {port}: {log}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The shared server's database `test`, through this PgBouncer.
    fn url(&self) -> String {
        let server: PgConnectOptions = postgres_url().parse().unwrap();
        let password = password(&postgres_url());
        let user_info = if password.is_empty() {
            server.get_username().to_owned()
        } else {
            format!("{}:{password}", server.get_username())
        };
        format!("postgres://{user_info}@127.0.0.1:{}/test", self.port)
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        drop(self.shell.stdin.take());
        let _ = self.shell.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `pgbouncer` to run: `DLOCK_PGBOUNCER`, else one on the `PATH`, else Debian's.
fn program() -> Option<PathBuf> {
    if let Some(program) = std::env::var_os("DLOCK_PGBOUNCER") {
        return Some(program.into());
    }
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("pgbouncer"))
            .find(|program| program.exists())
    });
    on_path.or_else(|| Some(PathBuf::from("/usr/sbin/pgbouncer")).filter(|p| p.exists()))
}

/// `program`'s version, from its first line: `PgBouncer 1.18.0`.
fn version(program: &Path) -> Option<(u32, u32)> {
    let output = Command::new(program).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let number = text.lines().next()?.strip_prefix("PgBouncer ")?;
    let mut parts = number.split('.').map(|part| part.parse().ok());
    Some((parts.next()??, parts.next()??))
}

/// The password of a `postgres://user:password@host/…` URL; empty if it has none.
fn password(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    authority
        .rsplit_once('@')
        .and_then(|(user_info, _)| user_info.split_once(':'))
        .map(|(_, password)| password.to_owned())
        .unwrap_or_default()
}

/// A backend on `db`'s table whose statements go through `pgbouncer`, sent as `sent` says,
/// and whose listener goes straight to the server if `listen_on_the_server`, else through
/// `pgbouncer` too.
async fn backend(
    db: &Postgres,
    pgbouncer: &PgBouncer,
    sent: Sent,
    listen_on_the_server: bool,
) -> PostgresBackend {
    let url = match sent {
        // The URL's setting, as a deployment would write it.
        Sent::AsSimpleQueries => format!("{}?prepared_statements=false", pgbouncer.url()),
        Sent::Prepared => pgbouncer.url(),
    };
    let builder = PostgresBackend::builder(&url)
        .unwrap()
        .table(&db.table)
        .max_connections(4);
    let builder = if listen_on_the_server {
        builder.listen_url(&postgres_url()).unwrap()
    } else {
        builder
    };
    builder.connect().await.unwrap()
}

/// A locker on [`backend`].
async fn locker(
    db: &Postgres,
    pgbouncer: &PgBouncer,
    sent: Sent,
    listen_on_the_server: bool,
) -> Locker {
    Locker::with_backend(backend(db, pgbouncer, sent, listen_on_the_server).await)
}

/// How the bodies of [`count_on_two_lockers`] run.
#[derive(Clone, Copy)]
struct Load {
    tasks_per_locker: usize,
    bodies_per_task: u64,
    ttl: Duration,
    /// Whether a call may fail (with the listener through PgBouncer, see below): a failed lock
    /// is asked again, a failed release left to its ttl.
    errors_allowed: bool,
}

/// Bodies of two lockers, `load.tasks_per_locker` tasks each, on one key: each reads a counter,
/// pauses, writes it plus one. Returns (bodies run, the counter, overlaps seen).
async fn count_on_two_lockers(
    first: &Locker,
    second: &Locker,
    key: &str,
    load: Load,
) -> (u64, u64, u64) {
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for locker in [first, second] {
        for _ in 0..load.tasks_per_locker {
            let (locker, key) = (locker.clone(), key.to_owned());
            let (counter, inside, overlaps) = (counter.clone(), inside.clone(), overlaps.clone());
            tasks.spawn(async move {
                let options = LockOptions::new()
                    .ttl(load.ttl)
                    .wait(Duration::from_secs(30));
                for _ in 0..load.bodies_per_task {
                    let lease = loop {
                        match locker.lock(&*key, options).await {
                            Ok(lease) => break lease,
                            Err(error) if load.errors_allowed => {
                                eprintln!("a lock failed, asked again: {error}")
                            }
                            Err(error) => panic!("a lock failed: {error}"),
                        }
                    };
                    if inside.swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    let read = counter.load(Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    counter.store(read + 1, Ordering::SeqCst);
                    inside.store(false, Ordering::SeqCst);
                    match lease.release().await {
                        Err(error) if load.errors_allowed => {
                            eprintln!("a release failed, left to its ttl: {error}")
                        }
                        released => released.unwrap(),
                    }
                }
            });
        }
    }
    while let Some(task) = tasks.join_next().await {
        task.unwrap();
    }
    let bodies = 2 * load.tasks_per_locker as u64 * load.bodies_per_task;
    (
        bodies,
        counter.load(Ordering::SeqCst),
        overlaps.load(Ordering::SeqCst),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_lockers_through_pgbouncer_lose_no_update() {
    let Some(pgbouncer) = PgBouncer::start() else {
        return;
    };
    for sent in pgbouncer.ways() {
        let db = Postgres::fresh().await;
        let first = locker(&db, &pgbouncer, sent, true).await;
        let second = locker(&db, &pgbouncer, sent, true).await;
        let key = support::unique_key("pgbouncer-count");
        let load = Load {
            tasks_per_locker: 4,
            bodies_per_task: 15,
            ttl: Duration::from_secs(5),
            errors_allowed: false,
        };
        let (bodies, counted, overlaps) = count_on_two_lockers(&first, &second, &key, load).await;
        assert_eq!(overlaps, 0, "{sent:?}: bodies overlapped");
        assert_eq!(
            counted,
            bodies,
            "{sent:?}: {} updates lost",
            bodies - counted
        );
    }
}

/// The holder's lease outlasts the waiter's wait, so only the release's notification, heard by
/// the listener on the server, can get the waiter in; and it gets in having sent a statement
/// to find the key busy and one to take it, not one every few milliseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_through_pgbouncer_is_woken_by_the_release() {
    let Some(pgbouncer) = PgBouncer::start() else {
        return;
    };
    for sent in pgbouncer.ways() {
        let db = Postgres::fresh().await;
        let holder = locker(&db, &pgbouncer, sent, true).await;
        let waiting_backend = backend(&db, &pgbouncer, sent, true).await;
        let waiter = Locker::with_backend(waiting_backend.clone());
        let key = support::unique_key("pgbouncer-wake");
        let held = LockOptions::new().ttl(Duration::from_secs(60));
        let lease = holder.lock(&*key, held).await.unwrap();
        let before = waiting_backend.statements();
        let waiting = tokio::spawn({
            let key = key.clone();
            async move {
                let lease = waiter.lock(&*key, held.wait(Duration::from_secs(10))).await;
                (lease.map(|lease| lease.fence()), Instant::now(), waiter)
            }
        });
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let released_at = Instant::now();
        lease.release().await.unwrap();
        let (fence, entered_at, _waiter) = waiting.await.unwrap();
        assert!(
            fence.is_ok(),
            "{sent:?}: the waiter did not get in after the release: {fence:?}"
        );
        let statements = waiting_backend.statements() - before;
        eprintln!(
            "through PgBouncer ({sent:?}), the waiter got in {:?} after the release, having sent \
             {statements} statements",
            entered_at - released_at
        );
        assert!(
            statements <= 3,
            "{sent:?}: the waiter sent {statements} statements over 1.5 s of waiting: it polled"
        );
    }
}

/// A lease renewed through PgBouncer outlives its ttl several times over, and nobody else gets
/// in meanwhile; a lease left to expire is lost by its holder, and a waiter gets in once the
/// database's clock says it expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_through_pgbouncer_are_renewed_and_expire() {
    let Some(pgbouncer) = PgBouncer::start() else {
        return;
    };
    for sent in pgbouncer.ways() {
        let db = Postgres::fresh().await;
        let holder = locker(&db, &pgbouncer, sent, true).await;
        let other = locker(&db, &pgbouncer, sent, true).await;
        let key = support::unique_key("pgbouncer-renew");
        let short = LockOptions::new().ttl(Duration::from_secs(1));

        let renewed = holder.lock(&*key, short).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        assert!(
            renewed.is_held(),
            "{sent:?}: a renewal through PgBouncer failed"
        );
        assert!(
            matches!(other.lock(&*key, short).await, Err(LockError::Busy { .. })),
            "{sent:?}: another locker got in while the lease was renewed"
        );
        let renewed_fence = renewed.fence();
        renewed.release().await.unwrap();

        let expiring = holder.lock(&*key, short.renew(false)).await.unwrap();
        let waited_for = tokio::spawn({
            let (other, key) = (other.clone(), key.clone());
            async move {
                other
                    .lock(&*key, short.wait(Duration::from_secs(10)))
                    .await
                    .map(|lease| lease.fence())
            }
        });
        tokio::time::timeout(Duration::from_secs(5), expiring.lost())
            .await
            .expect("the unrenewed lease was never lost");
        assert!(!expiring.is_held());
        let fence = waited_for
            .await
            .unwrap()
            .expect("the waiter did not get in");
        assert!(fence > expiring.fence() && expiring.fence() > renewed_fence);
    }
}

/// Everything through PgBouncer, the listener included. PgBouncer lends the listener a server
/// connection for its `LISTEN` statement alone; the notifications that connection gets
/// afterwards never reach the listener, so releases are never heard: a waiter learns of one
/// from its process's place keeper, which reads once a second whether the keys its waiters
/// wait for came free. PgBouncer passes them to whichever client it lends that connection to
/// next instead, whose statement then fails (the client reads a message it did not ask for):
/// calls fail now and then, and are asked again here. The leases still exclude one another,
/// and every waiter gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_listener_through_pgbouncer_too_no_update_is_lost() {
    let Some(pgbouncer) = PgBouncer::start() else {
        return;
    };
    for sent in pgbouncer.ways() {
        let db = Postgres::fresh().await;
        let first = locker(&db, &pgbouncer, sent, false).await;
        let second = locker(&db, &pgbouncer, sent, false).await;
        let key = support::unique_key("pgbouncer-all");
        let load = Load {
            tasks_per_locker: 2,
            bodies_per_task: 3,
            ttl: Duration::from_secs(1),
            errors_allowed: true,
        };
        let started = Instant::now();
        let (bodies, counted, overlaps) = count_on_two_lockers(&first, &second, &key, load).await;
        eprintln!(
            "with the listener through PgBouncer ({sent:?}): {bodies} bodies of a {:?} ttl in {:?}",
            load.ttl,
            started.elapsed()
        );
        assert_eq!(overlaps, 0, "{sent:?}: bodies overlapped");
        assert_eq!(
            counted,
            bodies,
            "{sent:?}: {} updates lost",
            bodies - counted
        );
    }
}

/// Sent as simple queries, the statements leave no setting on PgBouncer's server connections
/// for its other clients: each bounds its wait for another transaction's row lock within
/// itself, and afterwards every server connection still has the server's own `lock_timeout`
/// (none). (A backend sending prepared statements sets the timeout for each of its
/// connections' sessions, and PgBouncer in transaction mode hands that on.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simple_queries_through_pgbouncer_leave_no_setting_to_other_clients() {
    let Some(pgbouncer) = PgBouncer::start() else {
        return;
    };
    let db = Postgres::fresh().await;
    let locker = locker(&db, &pgbouncer, Sent::AsSimpleQueries, true).await;
    for _ in 0..10 {
        locker
            .lock(
                support::unique_key("pgbouncer-settings"),
                LockOptions::new(),
            )
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    // Clients each in a transaction of their own hold a server connection each: all of them,
    // together.
    let mut clients = Vec::new();
    for _ in 0..SERVER_CONNECTIONS {
        let mut client = PgConnection::connect(&pgbouncer.url()).await.unwrap();
        sqlx::raw_sql("BEGIN").execute(&mut client).await.unwrap();
        clients.push(client);
    }
    for client in &mut clients {
        let row = sqlx::raw_sql("SELECT current_setting('lock_timeout'), pg_backend_pid()")
            .fetch_one(&mut *client)
            .await
            .unwrap();
        let (timeout, server): (String, i32) = (row.get(0), row.get(1));
        assert_eq!(
            timeout, "0",
            "server connection {server} kept the backend's lock timeout for other clients"
        );
    }
}
