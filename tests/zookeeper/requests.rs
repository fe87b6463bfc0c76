//! Requests that carry many lock node paths at once — a renewal's `multi`, a waiter's and the
//! operator's `multiRead` — stay within what the server accepts: its `jute.maxbuffer`, 1 MiB by
//! default, caps a whole request, and a server sent a larger one drops the connection, which
//! fails every request in flight on the session, other keys' among them.

use std::time::{Duration, Instant};

use dlock::Locker;

use crate::support::{unique_key, zk_server};
use crate::{ttl, Zookeeper, ROOT};

/// A unique key `len` bytes long.
fn long_key(name: &str, len: usize) -> String {
    let prefix = unique_key(name);
    format!("{prefix}{}", "k".repeat(len - prefix.len()))
}

/// Two leases whose keys are 600,000 bytes each, and one with a short key, taken together so
/// that every renewal tick takes all three: their paths add up to more than a request may
/// carry, so they are confirmed in more than one request, and all three stay held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_whose_paths_pass_the_request_limit_together_are_all_renewed() {
    let zk = Zookeeper::shared().await;
    let locker = Locker::with_backend(zk.backend().await);
    let (a, b, short) = (
        long_key("long-a", 600_000),
        long_key("long-b", 600_000),
        unique_key("short"),
    );
    let started = Instant::now();
    let (a, b, short) = tokio::join!(
        locker.lock(&*a, ttl(4)),
        locker.lock(&*b, ttl(4)),
        locker.lock(&*short, ttl(4)),
    );
    let leases = [a.unwrap(), b.unwrap(), short.unwrap()];
    // A tick renews together the leases due within half a renewal period (ttl/6, 667 ms).
    assert!(
        started.elapsed() < Duration::from_millis(600),
        "the three leases took {:?} to take: not renewed in one tick",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(8)).await;
    let lost: Vec<String> = leases
        .iter()
        .filter(|lease| !lease.is_held())
        .map(|lease| format!("{} bytes", lease.key().len()))
        .collect();
    assert!(lost.is_empty(), "leases lost 8 s in, keys of {lost:?}");
    for lease in leases {
        lease.release().await.unwrap();
    }
}

/// A key of 100,000 bytes with a holder and ten waiters: the twelfth caller reads the ages of
/// the eleven nodes ahead of it, whose paths add up to more than a request may carry. It queues
/// like the others, and the holder, on the same session, keeps its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_nodes_whose_paths_pass_the_request_limit_queues() {
    let zk = Zookeeper::shared().await;
    let locker = Locker::with_backend(zk.backend().await);
    let key = long_key("hot", 100_000);
    // Counted with a plain listing: the names are short, whatever the key.
    let lister = zk_server::plain_client(&zk.url).await;
    let parent = format!("{ROOT}/{key}");
    let count = || {
        let (lister, parent) = (lister.clone(), parent.clone());
        async move { lister.list_children(&parent).await.map_or(0, |c| c.len()) }
    };
    let holder = locker.lock(&*key, ttl(20)).await.unwrap();
    let mut waiters = Vec::new();
    for queued in 2..=12 {
        let (locker, key) = (locker.clone(), key.clone());
        let waiter = tokio::spawn(async move {
            let lease = locker
                .lock(&*key, ttl(20).wait(Duration::from_secs(60)))
                .await?;
            lease.release().await.map(drop)
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while count().await < queued {
            if waiter.is_finished() {
                panic!(
                    "waiter {queued} did not queue behind {} nodes: {:?}",
                    queued - 1,
                    waiter.await.unwrap()
                );
            }
            assert!(Instant::now() < deadline, "waiter {queued} never queued");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        waiters.push(waiter);
    }
    assert!(holder.is_held(), "the holder lost its lease");
    holder.release().await.unwrap();
    for (i, waiter) in waiters.into_iter().enumerate() {
        tokio::time::timeout(Duration::from_secs(60), waiter)
            .await
            .unwrap_or_else(|_| panic!("waiter {} never got the key", i + 2))
            .unwrap()
            .unwrap_or_else(|error| panic!("waiter {} failed: {error}", i + 2));
    }
}
