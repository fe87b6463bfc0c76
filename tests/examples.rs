//! Each example, run as a process on each backend, tells its story: the printed result is
//! checked, not just the exit code.

#[cfg(any(
    feature = "mysql",
    feature = "postgres",
    feature = "redis",
    feature = "zookeeper",
    feature = "etcd"
))]
mod support;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// Example `name`'s binary, built with the features this test was built with. All examples are
/// built by one cargo call, the first time any is asked for in this process (each cargo call costs
/// about a second even when there is nothing to do). Cargo holds no lock on the build directory
/// while tests run, so this nested build works under both `cargo test` and nextest.
fn example_binary(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(build_examples);
    let deps = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    deps.parent().unwrap().join("examples").join(name)
}

/// Builds every example, reusing this test build's compiled crates: a no-op when they are up to
/// date.
fn build_examples() {
    // The same features as this test build, so the examples reuse its compiled crates.
    let features: Vec<&str> = [
        ("memory", cfg!(feature = "memory")),
        ("mysql", cfg!(feature = "mysql")),
        ("postgres", cfg!(feature = "postgres")),
        ("redis", cfg!(feature = "redis")),
        ("redis-cluster", cfg!(feature = "redis-cluster")),
        ("redis-tls", cfg!(feature = "redis-tls")),
        ("zookeeper", cfg!(feature = "zookeeper")),
        ("etcd", cfg!(feature = "etcd")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "--examples",
            "--no-default-features",
            "--features",
        ])
        .arg(features.join(","))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .unwrap();
    assert!(status.success(), "building the examples failed");
}

fn run(name: &str, url: Option<&str>) -> String {
    let mut command = Command::new(example_binary(name));
    match url {
        Some(url) => command.env("DLOCK_URL", url),
        None => command.env_remove("DLOCK_URL"),
    };
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{name} on {url:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The section of `output` that starts with the line beginning `title`.
fn section<'a>(output: &'a str, title: &str) -> &'a str {
    let start = output
        .find(title)
        .unwrap_or_else(|| panic!("no section `{title}` in:\n{output}"));
    let rest = &output[start..];
    let end = rest[1..].find("\n\n").map_or(rest.len(), |i| i + 1);
    &rest[..end]
}

fn check_account_sync(url: Option<&str>) {
    let out = run("account_sync", url);
    assert!(
        !section(&out, "without a lock").contains(" 0 duplicate rows"),
        "{out}"
    );
    assert!(
        section(&out, "with #[distributed_lock")
            .contains("=> 5 open_ids, 5 rows, 0 duplicate rows"),
        "{out}"
    );
    let cleanup = section(&out, "clean-up:");
    assert!(cleanup.contains("run 1: deleted 1000 rows"), "{out}");
    assert!(
        cleanup.contains("after the clean-up: 400 open_ids, 400 rows, 0 duplicate rows"),
        "{out}"
    );
}

fn check_stock_deduction(url: Option<&str>) {
    let out = run("stock_deduction", url);
    assert!(
        !section(&out, "without a lock").contains("oversold 0"),
        "{out}"
    );
    for locked in ["one lock per SKU", "10 buckets"] {
        assert!(
            section(&out, locked).contains(
                "sold 300 of 300 units, 100 orders turned away, 0 left in stock, oversold 0"
            ),
            "{out}"
        );
    }
    assert!(out.contains("bucketed throughput: "), "{out}");
}

fn check_dedupe_messages(url: Option<&str>) {
    let out = run("dedupe_messages", url);
    assert!(
        !section(&out, "marker only").contains("(0 duplicates)"),
        "{out}"
    );
    let locked = section(&out, "marker + #[distributed_lock");
    assert!(
        locked.contains("200 effects for 200 messages (0 duplicates)"),
        "{out}"
    );
    assert!(locked.contains("credited 39900 (expected 39900)"), "{out}");
}

/// The leader example: a resigning leader is followed at once; with a shared store, a killed
/// one only once its lease ran out.
fn check_leader(url: Option<&str>) {
    let out = run("leader", url);
    assert!(out.contains("the leader is instance-a"), "{out}");
    assert!(
        out.contains("instance-b took over") || out.contains("instance-c took over"),
        "{out}"
    );
    assert!(out.contains("refused as stale: 0"), "{out}");
    if url.is_none() {
        return;
    }
    let seconds: f64 = out
        .split("instance-e took over ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|seconds| seconds.parse().ok())
        .unwrap_or_else(|| panic!("no take-over after the kill in:\n{out}"));
    // A ttl of 2 s renewed every 667 ms: the lease outlives its dead holder by 1.3 s at least.
    assert!(
        (1.2..15.0).contains(&seconds),
        "taken over {seconds} s after the kill:\n{out}"
    );
}

/// The partner API example: without a limit the partner refuses requests, with three permits
/// none, and never more than three in flight.
fn check_partner_api(url: Option<&str>) {
    let out = run("partner_api", url);
    let refused = |row: &str| -> u64 {
        let line = out
            .lines()
            .find(|line| line.starts_with(row))
            .unwrap_or_else(|| panic!("no `{row}` row in:\n{out}"));
        line.split(", ")
            .nth(1)
            .and_then(|part| part.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count of refusals in `{line}`"))
    };
    assert!(refused("without a limit") > 0, "{out}");
    assert_eq!(refused("permits = 3"), 0, "{out}");
    assert!(
        out.contains(
            "permits = 3: 60 labels created, 0 requests refused with 429, at most 3 in flight"
        ),
        "{out}"
    );
}

/// The metrics example runs on the in-memory store only: its story needs the store's hand to
/// take a key away.
fn check_nightly_cleanup(url: Option<&str>, holds: bool) {
    let out = run("nightly_cleanup", url);
    assert!(out.contains("(more than once a window)"), "{out}");
    let expected = if holds {
        "hold_at_least = \"700ms\": the job ran 4 times"
    } else {
        "hold_at_least: this store cannot keep a key held after its release"
    };
    assert!(out.contains(expected), "{out}");
}

fn check_metrics() {
    let out = run("metrics", None);
    assert!(out.contains("reindex: Err(Lost"), "{out}");
    for series in [
        "dlock_acquire_wait_seconds_count{label=\"metrics::pay_out\",store=\"memory\",outcome=\"granted\"} 5",
        "dlock_acquire_wait_seconds_count{label=\"metrics::pay_out\",store=\"memory\",outcome=\"busy\"} 2",
        "dlock_busy_total{label=\"metrics::pay_out\",store=\"memory\"} 2",
        "dlock_hold_seconds_count{label=\"metrics::pay_out\",store=\"memory\"} 5",
        "dlock_reentries_total{label=\"ledger::record_payout\",store=\"memory\"} 5",
        "dlock_lost_total{label=\"jobs::reindex\",store=\"memory\"} 1",
        "dlock_leases_held{label=\"jobs::reindex\",store=\"memory\"} 0",
        "dlock_leases_held{label=\"metrics::pay_out\",store=\"memory\"} 0",
        "# TYPE dlock_busy_total counter",
    ] {
        assert!(out.contains(series), "no `{series}` in:\n{out}");
    }
}

#[test]
fn examples_on_the_in_memory_default() {
    check_account_sync(None);
    check_stock_deduction(None);
    check_dedupe_messages(None);
    check_nightly_cleanup(None, true);
    check_leader(None);
    check_partner_api(None);
    check_metrics();
}

#[cfg(feature = "mysql")]
#[test]
fn examples_on_mysql() {
    let url = support::mysql_url();
    check_account_sync(Some(&url));
    check_stock_deduction(Some(&url));
    check_dedupe_messages(Some(&url));
    check_nightly_cleanup(Some(&url), true);
    check_leader(Some(&url));
    check_partner_api(Some(&url));
}

#[cfg(feature = "postgres")]
#[test]
fn examples_on_postgres() {
    let url = support::postgres_url();
    check_account_sync(Some(&url));
    check_stock_deduction(Some(&url));
    check_dedupe_messages(Some(&url));
    check_nightly_cleanup(Some(&url), true);
    check_leader(Some(&url));
    check_partner_api(Some(&url));
}

#[cfg(feature = "redis")]
#[test]
fn examples_on_redis() {
    // A private server: the examples use fixed keys.
    let server = support::redis_server::RedisServer::start();
    let url = server.url();
    check_account_sync(Some(&url));
    check_stock_deduction(Some(&url));
    check_dedupe_messages(Some(&url));
    check_nightly_cleanup(Some(&url), true);
    check_leader(Some(&url));
    check_partner_api(Some(&url));
}

#[cfg(feature = "zookeeper")]
#[test]
fn examples_on_zookeeper() {
    // A private server: the examples use fixed keys.
    let server = support::zk_server::ZkServer::start_new();
    let url = server.url();
    check_account_sync(Some(&url));
    check_stock_deduction(Some(&url));
    check_dedupe_messages(Some(&url));
    check_nightly_cleanup(Some(&url), false);
    // A short session: a killed process's lock node goes when its session expires.
    check_leader(Some(&format!("{url}?session_timeout=4s")));
    check_partner_api(Some(&url));
}

#[cfg(feature = "etcd")]
#[test]
fn examples_on_etcd() {
    // A private member: the examples use fixed keys.
    let server = support::etcd_server::EtcdMember::start_new();
    let url = server.url();
    check_account_sync(Some(&url));
    check_stock_deduction(Some(&url));
    check_dedupe_messages(Some(&url));
    check_nightly_cleanup(Some(&url), false);
    // A short etcd lease: a killed process's nodes go when its lease expires.
    check_leader(Some(&format!("{url}?lease_ttl=4s")));
    check_partner_api(Some(&url));
}

/// The web service example as two processes on one Redis and one MariaDB: concurrent requests
/// for the same accounts, spread over both, leave one row per account under the lock (and
/// duplicates without it); `SIGTERM` stops a process cleanly, its leases released.
#[cfg(all(feature = "mysql", feature = "redis"))]
#[test]
fn axum_service_keeps_one_row_per_account_across_two_processes() {
    let redis = support::redis_server::RedisServer::start();
    let table = format!("axum_accounts_{}", std::process::id());
    axum_service::two_processes_keep_one_row_per_account(
        &redis.url(),
        &support::mysql_url(),
        &table,
    );
    support::drop_mysql_table(&table);
}

/// The same story on PostgreSQL alone: the lock table and the accounts table in one database.
#[cfg(feature = "postgres")]
#[test]
fn axum_service_keeps_one_row_per_account_on_postgres() {
    let url = support::postgres_url();
    let table = format!("axum_accounts_{}", std::process::id());
    axum_service::two_processes_keep_one_row_per_account(&url, &url, &table);
    support::drop_postgres_table(&table);
}

/// The web service example run as two processes, and HTTP requests to them.
#[cfg(any(all(feature = "mysql", feature = "redis"), feature = "postgres"))]
mod axum_service {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpStream;
    use std::process::{Child, Command, Stdio};

    use super::example_binary;

    /// Two processes of the service, locking on `dlock_url`, with the accounts table `table` on
    /// `accounts_url` (MySQL or PostgreSQL): without the lock concurrent requests leave some
    /// account a duplicate row, with it every account has one; both stop cleanly on `SIGTERM`.
    pub fn two_processes_keep_one_row_per_account(
        dlock_url: &str,
        accounts_url: &str,
        table: &str,
    ) {
        let binary = example_binary("axum_service");
        let (mut first, first_port) = start(&binary, dlock_url, accounts_url, table);
        let (mut second, second_port) = start(&binary, dlock_url, accounts_url, table);
        assert_eq!(request(first_port, "GET", "/health"), 200);

        let ports = [first_port, second_port];
        let unlocked = race(ports, "/unlocked", "free", accounts_url, table);
        assert!(
            unlocked.iter().any(|&rows| rows > 1),
            "without the lock no account got a duplicate row, so the race proves nothing: {unlocked:?}"
        );
        let locked = race(ports, "", "acct", accounts_url, table);
        assert_eq!(locked, vec![1; 10], "rows per account under the lock");

        for child in [&mut first, &mut second] {
            // SIGTERM: a graceful shutdown that ends with `locker.shutdown()`.
            let killed = Command::new("kill")
                .arg(child.id().to_string())
                .status()
                .unwrap();
            assert!(killed.success());
            let status = child.wait().unwrap();
            assert!(
                status.success(),
                "the service did not stop cleanly: {status}"
            );
        }
    }

    /// One HTTP/1.1 request; the response's status.
    fn request(port: u16, method: &str, path: &str) -> u16 {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
            .split(' ')
            .nth(1)
            .and_then(|status| status.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"))
    }

    fn start(
        binary: &std::path::Path,
        dlock_url: &str,
        accounts_url: &str,
        table: &str,
    ) -> (Child, u16) {
        let mut child = Command::new(binary)
            .env("DLOCK_URL", dlock_url)
            .env("ACCOUNTS_URL", accounts_url)
            .env("ACCOUNTS_TABLE", table)
            .env("PORT", "0")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        stdout.read_line(&mut first).unwrap();
        let port = first
            .trim()
            .rsplit(':')
            .next()
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("no port in {first:?}"));
        // Keep reading so the process never blocks on a full pipe; collect for the exit check.
        child.stdout = None;
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = stdout.read_to_string(&mut rest);
        });
        (child, port)
    }

    /// The row count of each account named `{prefix}N`, in `accounts_url`'s `table`.
    fn rows_per_account(accounts_url: &str, table: &str, prefix: &str) -> Vec<i64> {
        let sql = format!(
            "SELECT COUNT(*) FROM {table} WHERE open_id LIKE '{prefix}%' GROUP BY open_id ORDER BY open_id"
        );
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                if accounts_url.starts_with("postgres") {
                    let db = sqlx::PgPool::connect(accounts_url).await.unwrap();
                    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                        .fetch_all(&db)
                        .await
                        .unwrap()
                } else {
                    let db = sqlx::MySqlPool::connect(accounts_url).await.unwrap();
                    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                        .fetch_all(&db)
                        .await
                        .unwrap()
                }
            })
    }

    /// Eight concurrent requests for each of ten accounts `{account}N`, alternating between the
    /// processes; the rows each account has afterwards.
    fn race(
        ports: [u16; 2],
        route: &str,
        account: &str,
        accounts_url: &str,
        table: &str,
    ) -> Vec<i64> {
        let threads: Vec<_> = (0..80)
            .map(|i| {
                let port = ports[i % 2];
                let path = format!("{route}/accounts/{account}{}/devices/d{i}", i % 10);
                std::thread::spawn(move || request(port, "POST", &path))
            })
            .collect();
        for thread in threads {
            let status = thread.join().unwrap();
            assert!(status == 200 || status == 409, "unexpected status {status}");
        }
        rows_per_account(accounts_url, table, account)
    }
}
