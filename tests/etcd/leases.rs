//! The etcd lease under every node of a backend. Revoked (as its expiry would be), it takes its
//! holder's locks, which are reported lost, and fails its waiters with `Lost` rather than leaving
//! them to wait on; the backend grants a new lease for its later calls.

use std::time::{Duration, Instant};

use dlock::{LockError, LockOptions, Locker};

use crate::support::unique_key;
use crate::support::Store;
use crate::{raw_client, Etcd, ROOT};

/// How long the test waits for what must happen: patience, not a speed requirement.
const PATIENCE: Duration = Duration::from_secs(20);

fn ttl(secs: u64) -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(secs))
}

/// The etcd leases of `key`'s nodes, oldest node first, once there are `count` of them.
async fn node_leases(etcd: &Etcd, key: &str, count: usize) -> Vec<i64> {
    let mut client = raw_client(&etcd.url).await;
    let prefix = format!("{ROOT}/{key}/");
    let options = etcd_client::GetOptions::new().with_prefix().with_sort(
        etcd_client::SortTarget::Create,
        etcd_client::SortOrder::Ascend,
    );
    let deadline = Instant::now() + PATIENCE;
    loop {
        let nodes = client
            .get(prefix.as_str(), Some(options.clone()))
            .await
            .unwrap();
        if nodes.kvs().len() == count {
            return nodes.kvs().iter().map(|node| node.lease()).collect();
        }
        assert!(Instant::now() < deadline, "`{key}` never had {count} nodes");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn revoke(etcd: &Etcd, lease: i64) {
    raw_client(&etcd.url)
        .await
        .lease_revoke(lease)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_etcd_lease_is_revoked_fails_with_lost_and_its_backend_recovers() {
    let etcd = Etcd::shared().await;
    let (holder, waiter) = (
        Locker::with_backend(etcd.backend().await),
        Locker::with_backend(etcd.backend().await),
    );
    let key = unique_key("revoked-waiter");
    let held = holder.lock(&*key, ttl(10)).await.unwrap();
    let waiting = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        async move {
            waiter
                .lock(&*key, ttl(10).wait(Duration::from_secs(120)))
                .await
        }
    });
    let leases = node_leases(&etcd, &key, 2).await;
    revoke(&etcd, leases[1]).await;
    let outcome = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("the waiter waited on after its etcd lease was gone")
        .unwrap();
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "{:?}",
        outcome.map(|lease| lease.fence())
    );
    assert!(held.is_held(), "the holder's own lease was taken too");
    held.release().await.unwrap();
    // A new etcd lease for the waiter's backend.
    let next = waiter.lock(&*key, ttl(10)).await.unwrap();
    assert!(next.is_held());
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_etcd_lease_is_revoked_loses_its_lock_and_the_waiter_gets_the_key() {
    let etcd = Etcd::shared().await;
    let (holder, waiter) = (
        Locker::with_backend(etcd.backend().await),
        Locker::with_backend(etcd.backend().await),
    );
    let key = unique_key("revoked-holder");
    let held = holder.lock(&*key, ttl(3)).await.unwrap();
    let waiting = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        async move {
            waiter
                .lock(&*key, ttl(10).wait(Duration::from_secs(120)))
                .await
        }
    });
    let leases = node_leases(&etcd, &key, 2).await;
    revoke(&etcd, leases[0]).await;
    tokio::time::timeout(PATIENCE, held.lost())
        .await
        .expect("the holder was not told its lock is lost");
    assert!(!held.is_held());
    let next = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("the waiter never got the key")
        .unwrap()
        .unwrap();
    assert!(
        next.fence() > held.fence(),
        "{} after {}",
        next.fence(),
        held.fence()
    );
    next.release().await.unwrap();
}
