//! `Locker::force_release` on ZooKeeper, what `dlock release --force` does: the holder's node is
//! deleted and its fence answered, the holder's lease is reported lost, and the waiter gets the
//! key with a greater fence (a later node's `czxid`).

use std::time::Duration;

use dlock::Locker;

use crate::support::unique_key;
use crate::{ttl, Zookeeper};

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
        operator.force_release(&key).await.unwrap(),
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
    next.release().await.unwrap();
    zk.until_queue_is(&key, 0).await;
    assert_eq!(operator.force_release(&key).await.unwrap(), None);
    holder.shutdown().await.unwrap();
    operator.shutdown().await.unwrap();
}
