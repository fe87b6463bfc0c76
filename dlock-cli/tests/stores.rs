//! The `dlock` binary against MariaDB (127.0.0.1:3306), PostgreSQL (127.0.0.1:5432) and a
//! private ZooKeeper and a private etcd, as an operator runs it while this process holds a key and waits for it:
//! `inspect` and `list` show the holder, `release --force` evicts it, the holder learns it has
//! lost its lease, the waiter gets the key with a greater fence, and the evicted fence is the
//! one reported. (The same session against Redis is in `redis.rs`, with every command's details.)

mod support;

use std::time::Duration;

use dlock::{LockOptions, Owner};

use support::{
    dlock, json, labelled_locker, mysql_url, postgres_url, stderr, stdout, until_waiters,
    PrivateEtcd, PrivateZookeeper,
};

const TTL: Duration = Duration::from_secs(3);

/// How long the test waits for what must happen: patience, not a speed requirement.
const PATIENCE: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread")]
async fn an_operator_evicts_a_stuck_holder_on_mysql() {
    operator_session(&mysql_url(), Waiters::OfThisProcessOnly).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operator_evicts_a_stuck_holder_on_postgres() {
    operator_session(&postgres_url(), Waiters::OfThisProcessOnly).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operator_evicts_a_stuck_holder_on_zookeeper() {
    let server = tokio::task::spawn_blocking(PrivateZookeeper::start)
        .await
        .unwrap();
    operator_session(&server.url(), Waiters::Everyone).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operator_evicts_a_stuck_holder_on_etcd() {
    let server = tokio::task::spawn_blocking(PrivateEtcd::start)
        .await
        .unwrap();
    operator_session(&server.url(), Waiters::Everyone).await;
}

/// Whose waiters `dlock inspect`, another process, counts: MySQL keeps no queue, and a
/// PostgreSQL process stands in line only once it lost a race for the key, so their waiters are
/// seen by their own process; ZooKeeper's and etcd's waiters are nodes everyone sees.
#[derive(PartialEq)]
enum Waiters {
    Everyone,
    OfThisProcessOnly,
}

/// One holder, stuck, and a waiter in this process; an operator's `dlock` in another.
async fn operator_session(url: &str, waiters: Waiters) {
    let locker = labelled_locker(url, "cli-test::stuck").await;
    // Keys of this test's own: the SQL stores' table is shared with other tests.
    let prefix = format!("cli-{}:", Owner::random());
    let key = format!("{prefix}report");
    let stuck = locker
        .lock(&*key, LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let (locker, key) = (locker.clone(), key.clone());
        async move {
            let options = LockOptions::new().ttl(TTL).wait(Duration::from_secs(30));
            locker.lock(&*key, options).await
        }
    });
    until_waiters(&locker, &key, 1).await;

    let output = dlock(&["inspect", url, &key]).await;
    let page = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{page}{}", stderr(&output));
    assert!(page.contains("cli-test::stuck"), "{page}");
    assert!(page.contains(&stuck.fence().to_string()), "{page}");
    let output = dlock(&["--json", "inspect", url, &key]).await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let report = json(&output);
    assert_eq!(report["held"], true, "{report}");
    let holder = &report["holders"][0];
    assert_eq!(holder["owner"], stuck.owner().to_string(), "{report}");
    assert_eq!(holder["fence"], stuck.fence(), "{report}");
    assert_eq!(holder["label"], "cli-test::stuck", "{report}");
    assert_eq!(holder["pid"], std::process::id(), "{report}");
    if waiters == Waiters::Everyone {
        assert_eq!(report["waiters"], 1, "{report}");
    }

    let output = dlock(&["--json", "list", url, &prefix]).await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let listed = json(&output);
    assert_eq!(listed["keys"][0]["key"], key.as_str(), "{listed}");
    assert_eq!(listed["keys"].as_array().map(Vec::len), Some(1), "{listed}");

    let output = dlock(&["--json", "release", "--force", "--yes", url, &key]).await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let released = json(&output);
    assert_eq!(released["released"], true, "{released}");
    assert_eq!(released["evicted_fence"], stuck.fence(), "{released}");

    tokio::time::timeout(PATIENCE, stuck.lost())
        .await
        .expect("the evicted holder's lease is reported lost");
    let next = tokio::time::timeout(PATIENCE, waiter)
        .await
        .expect("the waiter gets the key")
        .unwrap()
        .unwrap();
    assert!(
        next.fence() > stuck.fence(),
        "a stale fence would be accepted: {} after {}",
        next.fence(),
        stuck.fence()
    );
    // The evicted holder's release leaves the new holder alone.
    drop(stuck);
    let output = dlock(&["--json", "inspect", url, &key]).await;
    assert_eq!(json(&output)["holders"][0]["fence"], next.fence());

    next.release().await.unwrap();
    let output = dlock(&["inspect", url, &key]).await;
    assert_eq!(
        output.status.code(),
        Some(3),
        "a free key: {}",
        stdout(&output)
    );
    let output = dlock(&["release", "--force", "--yes", url, &key]).await;
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    locker.shutdown().await.unwrap();
}
