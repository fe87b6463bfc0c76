//! An operator's view: `inspect` describes a key's holder from its lock node's data and counts
//! the nodes behind it; `list` names the keys that have a lock node under a prefix.

use std::time::{Duration, SystemTime};

use dlock::backend::{AcquireRequest, Backend};
use dlock::{LockOptions, Locker, Owner};
use zookeeper_client::{Acls, CreateMode};

use crate::support::{unique_key, zk_server};
use crate::{Zookeeper, ROOT};

/// This host's name as the stores record it (`/proc/sys/kernel/hostname` on Linux).
fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap()
}

/// While a lease granted under a label is held and a waiter of another session queues behind
/// it, an operator's session sees the holder described — its label, this host, this process,
/// its owner, its fence, acquired now by the ensemble's clock, no time left counted (the node
/// lives with its session) — and one waiter; once the waiter holds the key, it is the holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_describes_the_holder_and_counts_the_nodes_behind_it() {
    let zk = Zookeeper::shared().await;
    let operator = Locker::with_backend(zk.admin.clone());
    let key = unique_key("inspected");
    let free = operator.inspect(&key).await.unwrap();
    assert!(!free.is_held() && free.waiters() == 0, "{free:?}");

    let holder_backend = zk.backend().await;
    let owner = Owner::random();
    let request = AcquireRequest::new(&key, owner, Duration::from_secs(10), Duration::ZERO)
        .label("nightly-report");
    let asked_at = SystemTime::now();
    let acquired = holder_backend
        .acquire(&request)
        .await
        .unwrap()
        .expect("the key was free");
    let waiter = tokio::spawn({
        let (locker, key) = (Locker::with_backend(zk.backend().await), key.clone());
        async move {
            locker
                .lock(&*key, LockOptions::new().wait(Duration::from_secs(30)))
                .await
        }
    });
    zk.until_queue_is(&key, 2).await;

    let state = operator.inspect(&key).await.unwrap();
    assert_eq!(state.waiters(), 1, "{state:?}");
    let [holder] = state.holders() else {
        panic!("one holder expected: {state:?}")
    };
    assert_eq!(holder.label(), "nightly-report");
    assert_eq!(holder.host(), Some(this_host().as_str()));
    assert_eq!(holder.pid(), Some(std::process::id()));
    assert_eq!(holder.owner(), owner);
    assert_eq!(holder.fence(), acquired.fence);
    let skew = holder
        .acquired_at()
        .duration_since(asked_at)
        .unwrap_or_else(|e| e.duration());
    assert!(skew < Duration::from_secs(5), "{skew:?} apart");
    assert_eq!(holder.time_left(), None);

    assert!(holder_backend.release(&key, owner).await.unwrap());
    let lease = waiter.await.unwrap().unwrap();
    let state = operator.inspect(&key).await.unwrap();
    assert_eq!(state.waiters(), 0, "{state:?}");
    assert_eq!(state.holders()[0].owner(), lease.owner());
    assert_eq!(state.holders()[0].fence(), lease.fence());
    assert_eq!(state.holders()[0].label(), dlock::LockOptions::UNLABELLED);
    lease.release().await.unwrap();
    assert!(!operator.inspect(&key).await.unwrap().is_held());
}

/// A lock node an earlier dlock created, whose data is its owner alone, is described by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_node_of_an_earlier_version_is_described_by_its_owner() {
    let zk = Zookeeper::shared().await;
    let key = unique_key("earlier");
    let parent = format!("{ROOT}/{key}");
    let plain = zk_server::plain_client(&zk.url).await;
    plain
        .mkdir(
            &parent,
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    let owner = Owner::random();
    let (stat, _) = plain
        .create(
            &format!("{parent}/{owner}-0000000000"),
            owner.to_string().as_bytes(),
            &CreateMode::Ephemeral.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    let state = Locker::with_backend(zk.admin.clone())
        .inspect(&key)
        .await
        .unwrap();
    let [holder] = state.holders() else {
        panic!("one holder expected: {state:?}")
    };
    assert_eq!(holder.owner(), owner);
    assert_eq!(holder.fence(), stat.czxid as u64);
    assert_eq!(
        (holder.label(), holder.host(), holder.pid()),
        ("", None, None)
    );
}

/// `list` names exactly the keys under a prefix that have a lock node: not a released one, not
/// a parent left without one; a prefix's `%` and `/` (escaped in node names) match themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_names_the_keys_with_a_lock_node_under_a_prefix() {
    let zk = Zookeeper::shared().await;
    let locker = Locker::with_backend(zk.backend().await);
    let base = unique_key("listed");
    let key = |tail: &str| format!("{base}{tail}");
    let mut leases = Vec::new();
    for tail in [":b", ":a", "%x", "/y", "_z", ":released"] {
        leases.push(locker.lock(key(tail), LockOptions::new()).await.unwrap());
    }
    leases.pop().unwrap().release().await.unwrap();
    let plain = zk_server::plain_client(&zk.url).await;
    plain
        .mkdir(
            &format!("{ROOT}/{}", key(":empty")),
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();

    let mut listed = locker.list(&key(":")).await.unwrap();
    listed.sort();
    assert_eq!(listed, [key(":a"), key(":b")]);
    assert_eq!(locker.list(&key("%")).await.unwrap(), [key("%x")]);
    assert_eq!(locker.list(&key("/")).await.unwrap(), [key("/y")]);
    assert_eq!(locker.list(&key("_")).await.unwrap(), [key("_z")]);
    let mut all = locker.list(&base).await.unwrap();
    all.sort();
    let mut expected = vec![key("%x"), key("/y"), key(":a"), key(":b"), key("_z")];
    expected.sort();
    assert_eq!(all, expected);
    drop(leases);
}
