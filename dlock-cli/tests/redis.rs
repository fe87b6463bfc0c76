//! The `dlock` binary against the shared Redis (127.0.0.1:6379), run as operators run it, while
//! this process holds keys and waits for them.

mod support;

use std::process::Stdio;
use std::time::Duration;

use dlock::LockOptions;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use support::{
    dlock, json, labelled_locker, redis_url, stderr, stdout, until_waiters, PasswordRedis,
};

const TTL: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread")]
async fn inspect_shows_the_holder_and_its_waiter() {
    let url = redis_url();
    let locker = labelled_locker(&url, "cli-test::holder").await;
    let lease = locker
        .lock("acct:42", LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let locker = locker.clone();
        async move {
            locker
                .lock(
                    "acct:42",
                    LockOptions::new().ttl(TTL).wait(Duration::from_secs(30)),
                )
                .await
        }
    });
    until_waiters(&locker, "acct:42", 1).await;

    let output = dlock(&["inspect", &url, "acct:42"]).await;
    let page = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{page}{}", stderr(&output));
    assert!(page.contains("cli-test::holder"), "{page}");
    assert!(page.contains(&std::process::id().to_string()), "{page}");
    assert!(page.contains("waiters  1\n"), "{page}");
    assert!(page.contains(&lease.fence().to_string()), "{page}");

    let output = dlock(&["--json", "inspect", &url, "acct:42"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let report = json(&output);
    assert_eq!(report["key"], "acct:42");
    assert_eq!(report["held"], true);
    assert_eq!(report["waiters"], 1);
    let holder = &report["holders"][0];
    assert_eq!(holder["fence"], lease.fence());
    assert_eq!(holder["label"], "cli-test::holder");
    assert_eq!(holder["pid"], std::process::id());
    assert_eq!(holder["owner"], lease.owner().to_string());
    assert!(
        holder["time_left_ms"]
            .as_u64()
            .is_some_and(|left| left <= 3_000),
        "{holder}"
    );
    assert!(
        holder["acquired_at"]
            .as_str()
            .is_some_and(|at| at.ends_with('Z')),
        "{holder}"
    );

    lease.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    next.release().await.unwrap();
    locker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn list_shows_the_held_keys_and_inspect_of_a_free_key_exits_3() {
    let url = redis_url();
    let locker = labelled_locker(&url, "cli-test::lister").await;
    let held = locker
        .lock("job:nightly", LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    let other = locker
        .lock("acct:7", LockOptions::new().ttl(TTL))
        .await
        .unwrap();

    let output = dlock(&["list", &url]).await;
    let page = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{page}{}", stderr(&output));
    assert!(page.starts_with("2 held keys on "), "{page}");
    assert!(
        page.contains("job:nightly") && page.contains("acct:7"),
        "{page}"
    );
    assert!(page.contains("cli-test::lister"), "{page}");

    let output = dlock(&["--json", "list", &url, "job:"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let listed = json(&output);
    assert_eq!(listed["prefix"], "job:");
    let keys = listed["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1, "{listed}");
    assert_eq!(keys[0]["key"], "job:nightly");
    assert_eq!(keys[0]["holders"][0]["fence"], held.fence());

    let output = dlock(&["inspect", &url, "acct:nobody"]).await;
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    assert!(
        stdout(&output).contains("none: the key is free"),
        "{}",
        stdout(&output)
    );

    held.release().await.unwrap();
    other.release().await.unwrap();
    let output = dlock(&["--json", "list", &url]).await;
    assert_eq!(json(&output)["keys"], serde_json::json!([]));
    locker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn release_force_evicts_the_holder_and_the_next_fence_is_greater() {
    let url = redis_url();
    let locker = labelled_locker(&url, "cli-test::stuck").await;
    let stuck = locker
        .lock("report", LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let locker = locker.clone();
        async move {
            locker
                .lock(
                    "report",
                    LockOptions::new().ttl(TTL).wait(Duration::from_secs(30)),
                )
                .await
        }
    });
    until_waiters(&locker, "report", 1).await;

    let output = dlock(&["--json", "release", "--force", "--yes", &url, "report"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let released = json(&output);
    assert_eq!(released["released"], true);
    assert_eq!(released["holder_changed"], false);
    assert_eq!(released["evicted_fence"], stuck.fence());

    // The evicted holder learns it at its next renewal (a third of the ttl); the bound is the
    // test's patience, not a speed requirement.
    tokio::time::timeout(Duration::from_secs(10), stuck.lost())
        .await
        .expect("the evicted holder's lease is reported lost");
    assert!(!stuck.is_held());
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter is handed the key")
        .unwrap()
        .unwrap();
    assert!(
        next.fence() > stuck.fence(),
        "{} after {}",
        next.fence(),
        stuck.fence()
    );
    // The evicted holder's release changes nothing for the new holder.
    drop(stuck);
    let state = locker.inspect("report").await.unwrap();
    assert_eq!(state.holders()[0].fence(), next.fence());
    next.release().await.unwrap();

    let output = dlock(&["release", "--force", "--yes", &url, "report"]).await;
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("is not held"),
        "{}",
        stderr(&output)
    );
    locker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn release_force_without_yes_refuses_when_nobody_can_confirm() {
    let url = redis_url();
    let locker = labelled_locker(&url, "cli-test::kept").await;
    let lease = locker
        .lock("kept", LockOptions::new().ttl(TTL))
        .await
        .unwrap();

    let output = dlock(&["release", "--force", &url, "kept"]).await;
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("--yes"), "{}", stderr(&output));
    // Without --force at all: clap's usage error, the same code.
    let output = dlock(&["release", "--yes", &url, "kept"]).await;
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));

    let state = locker.inspect("kept").await.unwrap();
    assert_eq!(state.holders()[0].fence(), lease.fence());
    assert!(lease.is_held());
    lease.release().await.unwrap();
    locker.shutdown().await.unwrap();
}

/// At a terminal (a pseudo-terminal made by `script`, from util-linux), `release --force` names
/// the holder and asks: `n` releases nothing (exit 4), `y` evicts.
#[tokio::test(flavor = "multi_thread")]
async fn release_force_asks_at_a_terminal() {
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: no `script` command to make a terminal");
        return;
    }
    let url = redis_url();
    let locker = labelled_locker(&url, "cli-test::asked").await;
    let lease = locker
        .lock("asked", LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    let at_a_terminal = |answer: &'static str| {
        let command = format!(
            "'{}' release --force '{url}' asked",
            env!("CARGO_BIN_EXE_dlock")
        );
        async move {
            let mut script = tokio::process::Command::new("script")
                .args(["-qec", &command, "/dev/null"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut stdin = script.stdin.take().unwrap();
            tokio::io::AsyncWriteExt::write_all(&mut stdin, answer.as_bytes())
                .await
                .unwrap();
            let output = script.wait_with_output().await.unwrap();
            (output.status.code(), stdout(&output))
        }
    };

    let (code, page) = at_a_terminal("n\n").await;
    assert_eq!(code, Some(4), "{page}");
    assert!(
        page.contains("cli-test::asked") && page.contains("[y/N]"),
        "{page}"
    );
    assert!(page.contains(&lease.fence().to_string()), "{page}");
    assert_eq!(
        locker.inspect("asked").await.unwrap().holders()[0].fence(),
        lease.fence()
    );

    let (code, page) = at_a_terminal("y\n").await;
    assert_eq!(code, Some(0), "{page}");
    assert!(page.contains("evicted the holder"), "{page}");
    tokio::time::timeout(Duration::from_secs(10), lease.lost())
        .await
        .expect("the evicted lease is reported lost");
    locker.shutdown().await.unwrap();
}

/// The key changes hands while the question waits (the holder shown, A, released it and B took
/// it): answering `y` evicts nobody, B keeps the key, and `dlock` says the holder changed (exit
/// 3).
#[tokio::test(flavor = "multi_thread")]
async fn release_force_keeps_a_holder_that_took_the_key_during_the_question() {
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: no `script` command to make a terminal");
        return;
    }
    let url = redis_url();
    let key = "changed-during-the-question";
    let locker = labelled_locker(&url, "cli-test::shown").await;
    let a = locker.lock(key, LockOptions::new().ttl(TTL)).await.unwrap();
    let command = format!(
        "'{}' release --force '{url}' {key}",
        env!("CARGO_BIN_EXE_dlock")
    );
    let mut script = tokio::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = script.stdin.take().unwrap();
    let mut out = script.stdout.take().unwrap();
    let mut page = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&page).contains("[y/N]") {
            let n = out.read(&mut buf).await.unwrap();
            assert!(n > 0, "ended unasked: {}", String::from_utf8_lossy(&page));
            page.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("the question is asked");
    assert!(
        String::from_utf8_lossy(&page).contains(&a.fence().to_string()),
        "{}",
        String::from_utf8_lossy(&page)
    );

    a.release().await.unwrap();
    let b = locker.lock(key, LockOptions::new().ttl(TTL)).await.unwrap();
    stdin.write_all(b"y\n").await.unwrap();
    drop(stdin);
    out.read_to_end(&mut page).await.unwrap();
    let status = script.wait().await.unwrap();
    let page = String::from_utf8_lossy(&page);
    assert_eq!(status.code(), Some(3), "{page}");
    assert!(
        page.contains("the holder changed: nothing released"),
        "{page}"
    );
    let state = locker.inspect(key).await.unwrap();
    assert_eq!(state.holders()[0].owner(), b.owner());
    assert!(b.is_held());
    let rival = locker.lock(key, LockOptions::new().ttl(TTL)).await;
    assert!(
        matches!(rival, Err(dlock::LockError::Busy { .. })),
        "a rival got the key: {rival:?}"
    );
    b.release().await.unwrap();
    locker.shutdown().await.unwrap();
}

/// `--owner` evicts the holder named, seen earlier; a holder that is not it keeps the key.
#[tokio::test(flavor = "multi_thread")]
async fn release_force_owner_evicts_only_that_owner() {
    let url = redis_url();
    let key = "evicted-by-owner";
    let locker = labelled_locker(&url, "cli-test::named").await;
    let lease = locker.lock(key, LockOptions::new().ttl(TTL)).await.unwrap();
    let other = dlock::Owner::random().to_string();

    let args = ["release", "--force", "--yes", "--owner", &other, &url, key];
    let output = dlock(&args).await;
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("the holder changed: nothing released"),
        "{}",
        stderr(&output)
    );
    let state = locker.inspect(key).await.unwrap();
    assert_eq!(state.holders()[0].owner(), lease.owner());
    assert!(lease.is_held());

    let named = lease.owner().to_string().to_ascii_uppercase();
    let args = [
        "--json", "release", "--force", "--yes", "--owner", &named, &url, key,
    ];
    let output = dlock(&args).await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let released = json(&output);
    assert_eq!(released["released"], true);
    assert_eq!(released["evicted_fence"], lease.fence());
    tokio::time::timeout(Duration::from_secs(10), lease.lost())
        .await
        .expect("the evicted holder's lease is reported lost");

    let args = [
        "release", "--force", "--yes", "--owner", "not-hex", &url, key,
    ];
    assert_eq!(dlock(&args).await.status.code(), Some(2));
    locker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn passwords_in_urls_are_printed_masked() {
    let server = PasswordRedis::start("s3cret-pw");
    let url = format!(
        "redis://:s3cret-pw@127.0.0.1:{}/?key_prefix=cli:",
        server.port
    );
    let masked = format!("redis://:***@127.0.0.1:{}/", server.port);
    let locker = labelled_locker(&url, "cli-test::secret").await;
    let lease = locker
        .lock("acct:1", LockOptions::new().ttl(TTL))
        .await
        .unwrap();

    for args in [
        vec!["list", &url],
        vec!["--json", "list", &url],
        vec!["inspect", &url, "acct:1"],
        vec!["--json", "inspect", &url, "acct:1"],
    ] {
        let output = dlock(&args).await;
        let (out, err) = (stdout(&output), stderr(&output));
        assert_eq!(output.status.code(), Some(0), "{args:?}: {out}{err}");
        assert!(out.contains(&masked), "{args:?}: {out}");
        assert!(
            !out.contains("s3cret-pw") && !err.contains("s3cret-pw"),
            "{args:?}: {out}{err}"
        );
    }
    // A wrong password: the store's error, masked too.
    let wrong = format!("redis://:wr0ng-pw@127.0.0.1:{}", server.port);
    let output = dlock(&["list", &wrong]).await;
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(!err.contains("wr0ng-pw") && err.contains("***"), "{err}");

    lease.release().await.unwrap();
    locker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_prints_a_line_of_json_per_refresh_until_stopped() {
    let url = redis_url();
    let locker = labelled_locker(&url, "cli-test::watched").await;
    let lease = locker
        .lock("watched", LockOptions::new().ttl(TTL))
        .await
        .unwrap();

    let mut watch = tokio::process::Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["--json", "watch", &url, "--interval", "0.2"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    for _ in 0..2 {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .expect("a refresh")
            .unwrap()
            .expect("watch still running");
        let refreshed: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(refreshed["keys"][0]["key"], "watched", "{line}");
        assert_eq!(refreshed["keys"][0]["holders"][0]["fence"], lease.fence());
    }
    watch.kill().await.unwrap();
    lease.release().await.unwrap();
    locker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn bench_loses_no_update() {
    let url = redis_url();
    let output = dlock(&["--json", "bench", &url, "--seconds", "1", "--tasks", "3"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let summary = json(&output);
    assert!(
        summary["uncontended"]["pairs"].as_u64().unwrap() > 0,
        "{summary}"
    );
    let contended = &summary["contended"];
    assert!(contended["sections"].as_u64().unwrap() > 0, "{summary}");
    assert_eq!(contended["lost_updates"], 0, "{summary}");
    assert_eq!(
        contended["per_worker"].as_array().unwrap().len(),
        3,
        "{summary}"
    );
    assert_eq!(contended["most_inside"], 1, "{summary}");
    assert!(summary.get("permits").is_none(), "{summary}");
    // Every lease was released: nothing is left under the run's prefix.
    let output = dlock(&["--json", "list", &url]).await;
    assert_eq!(json(&output)["keys"], serde_json::json!([]));
}

/// With `--permits`, the tasks share the key as a semaphore, against the mutex in the same run:
/// never more bodies inside than permits, and with more tasks than permits, every permit used.
#[tokio::test(flavor = "multi_thread")]
async fn bench_with_permits_never_lets_more_in_than_the_permits() {
    let url = redis_url();
    let args = [
        "--json",
        "bench",
        &url,
        "--seconds",
        "1",
        "--tasks",
        "6",
        "--permits",
        "3",
        "--work",
        "5",
    ];
    let output = dlock(&args).await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let summary = json(&output);
    let permits = &summary["permits"];
    assert_eq!(permits["permits"], 3, "{summary}");
    assert_eq!(permits["mutex"]["most_inside"], 1, "{summary}");
    assert_eq!(permits["mutex"]["lost_updates"], 0, "{summary}");
    assert_eq!(permits["semaphore"]["most_inside"], 3, "{summary}");
    for run in ["mutex", "semaphore"] {
        assert!(permits[run]["sections"].as_u64().unwrap() > 0, "{summary}");
        assert_eq!(permits[run]["errors"], 0, "{summary}");
    }
    let output = dlock(&["--json", "list", &url]).await;
    assert_eq!(json(&output)["keys"], serde_json::json!([]));
}
