//! `Locker::force_release` on ZooKeeper, what `dlock release --force` does: the holder's node is
//! deleted and its fence answered, the holder's lease is reported lost, and the waiter gets the
//! key with a greater fence (a later node's `czxid`).

use std::time::Duration;

use dlock::{LockError, Locker};

use crate::support::{unique_key, zk_server};
use crate::{ttl, Zookeeper, ROOT};

/// How long the test waits for what must happen: patience, not a speed requirement.
const PATIENCE: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_evicts_the_holder_and_the_waiter_gets_a_greater_fence() {
    let zk = Zookeeper::shared().await;
    let holder = Locker::with_backend(zk.backend().await);
    let operator = Locker::with_backend(zk.backend().await);
    let key = unique_key("forced-by-an-operator");
    let stuck = holder.lock(&*key, ttl(6)).await.unwrap();
    let waiter = tokio::spawn({
        let (holder, key) = (holder.clone(), key.clone());
        async move {
            holder
                .lock(&*key, ttl(6).wait(Duration::from_secs(60)))
                .await
        }
    });
    zk.until_queue_is(&key, 2).await;

    assert_eq!(
        operator.force_release(&key, stuck.owner()).await.unwrap(),
        Some(stuck.fence())
    );
    tokio::time::timeout(PATIENCE, stuck.lost())
        .await
        .expect("the evicted lease is reported lost");
    let next = tokio::time::timeout(PATIENCE, waiter)
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
    stuck.release().await.unwrap();
    assert!(next.is_held());
    let gone = next.owner();
    next.release().await.unwrap();
    zk.until_queue_is(&key, 0).await;
    assert_eq!(operator.force_release(&key, gone).await.unwrap(), None);
    holder.shutdown().await.unwrap();
    operator.shutdown().await.unwrap();
}

/// The holder an operator read (A) released the key and B took it before the eviction: the
/// eviction of A, sent once or twice, changes nothing, and B keeps the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_of_a_holder_that_left_keeps_the_next_one() {
    let zk = Zookeeper::shared().await;
    let holder = Locker::with_backend(zk.backend().await);
    let operator = Locker::with_backend(zk.backend().await);
    let key = unique_key("forced-after-a-change");
    let a = holder.lock(&*key, ttl(6)).await.unwrap();
    let shown = operator.inspect(&key).await.unwrap().holders()[0].owner();
    assert_eq!(shown, a.owner());
    a.release().await.unwrap();
    let b = holder.lock(&*key, ttl(6)).await.unwrap();
    assert_eq!(operator.force_release(&key, shown).await.unwrap(), None);
    assert_eq!(operator.force_release(&key, shown).await.unwrap(), None);
    let state = operator.inspect(&key).await.unwrap();
    assert_eq!(state.holders()[0].owner(), b.owner());
    assert!(b.is_held());
    let rival = operator.lock(&*key, ttl(6)).await;
    assert!(
        matches!(rival, Err(LockError::Busy { .. })),
        "a rival got the key: {rival:?}"
    );
    b.release().await.unwrap();
    holder.shutdown().await.unwrap();
    operator.shutdown().await.unwrap();
}

/// An eviction of a key nobody waits for leaves nothing behind: the key's parent node goes with
/// its holder's node, as a release's does, rather than staying empty under the root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_of_a_key_nobody_waits_for_leaves_no_parent() {
    let zk = Zookeeper::shared().await;
    let holder = Locker::with_backend(zk.backend().await);
    let operator = Locker::with_backend(zk.backend().await);
    let key = unique_key("forced-and-tidied");
    let stuck = holder.lock(&*key, ttl(6)).await.unwrap();
    let parent = format!("{ROOT}/{key}");
    let plain = zk_server::plain_client(&zk.url).await;
    assert!(plain.check_stat(&parent).await.unwrap().is_some());

    let evicted = operator.force_release(&key, stuck.owner()).await.unwrap();
    assert_eq!(evicted, Some(stuck.fence()));
    assert_eq!(
        plain.check_stat(&parent).await.unwrap(),
        None,
        "the evicted key's parent node stayed"
    );
    drop(stuck);
    holder.shutdown().await.unwrap();
    operator.shutdown().await.unwrap();
}
