//! Each example, run as a process on each backend, tells its story: the printed result is
//! checked, not just the exit code.

#[cfg(any(feature = "redis", feature = "zookeeper"))]
mod support;

use std::path::PathBuf;
use std::process::Command;

/// Builds example `name` with the features this test was built with, and returns its path.
/// Cargo holds no lock on the build directory while tests run, so this nested build works under
/// both `cargo test` and nextest; it is a no-op when the example is up to date.
fn example_binary(name: &str) -> PathBuf {
    // The same features as this test build, so the example reuses its compiled crates.
    let features: Vec<&str> = [
        ("memory", cfg!(feature = "memory")),
        ("mysql", cfg!(feature = "mysql")),
        ("redis", cfg!(feature = "redis")),
        ("redis-cluster", cfg!(feature = "redis-cluster")),
        ("redis-tls", cfg!(feature = "redis-tls")),
        ("zookeeper", cfg!(feature = "zookeeper")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "--example",
            name,
            "--no-default-features",
            "--features",
        ])
        .arg(features.join(","))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .unwrap();
    assert!(status.success(), "building example {name} failed");
    let deps = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    deps.parent().unwrap().join("examples").join(name)
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

#[test]
fn examples_on_the_in_memory_default() {
    check_account_sync(None);
    check_stock_deduction(None);
    check_dedupe_messages(None);
}

#[cfg(feature = "mysql")]
#[test]
fn examples_on_mysql() {
    let url = support::mysql_url();
    check_account_sync(Some(&url));
    check_stock_deduction(Some(&url));
    check_dedupe_messages(Some(&url));
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
}
