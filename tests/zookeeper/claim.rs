//! A grant nobody claims is held for the claim window at most: a waiter whose future is alive
//! but no longer polled (its caller's runtime stalled by blocking code, a future parked in a
//! `select!` that stopped polling it) costs the next waiter that window, not the time until its
//! caller comes back; and when it does come back, it queues again behind whoever got the key.

use std::time::{Duration, Instant};

use dlock::Locker;

use crate::support::unique_key;
use crate::{ttl, Zookeeper};

/// The default claim window, and what the test allows on top of it for the requests.
const CLAIM_WINDOW: Duration = Duration::from_secs(3);
const SLACK: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_is_no_longer_polled_costs_the_next_one_the_claim_window_only() {
    let zk = Zookeeper::shared().await;
    let key = unique_key("unpolled");
    let holder = Locker::with_backend(zk.backend().await);
    let lease = holder.lock(&*key, ttl(60)).await.unwrap();

    // The stalled waiter: polled until its node is in the queue, then never again, but kept.
    let stalled = Locker::with_backend(zk.backend().await);
    let mut stalled_lock = Box::pin(stalled.lock(&*key, ttl(60).wait(Duration::from_secs(120))));
    tokio::select! {
        got = &mut stalled_lock => panic!("the waiter got the held key: {got:?}"),
        () = zk.until_queue_is(&key, 2) => {}
    }

    lease.release().await.unwrap();
    let next = Locker::with_backend(zk.backend().await);
    let asked = Instant::now();
    let got = next
        .lock(&*key, ttl(60).wait(Duration::from_secs(10)))
        .await;
    let waited = asked.elapsed();
    assert!(
        got.is_ok(),
        "the key stayed granted to a waiter nobody polls: {got:?} after {waited:?}; queue {:?}",
        zk.queue(&key).await
    );
    assert!(
        waited <= CLAIM_WINDOW + SLACK,
        "the next waiter got the key only after {waited:?}, more than the claim window"
    );
    let queue = zk.queue(&key).await;
    assert_eq!(
        queue.len(),
        1,
        "the unclaimed grant's node stayed: {queue:?}"
    );
    let next_lease = got.unwrap();
    let next_fence = next_lease.fence();

    // Polled again, the stalled waiter finds its grant withdrawn and queues again, behind the
    // new holder: it must not take the key while that one holds it.
    tokio::select! {
        got = &mut stalled_lock => panic!("the stalled waiter took a held key: {got:?}"),
        () = zk.until_queue_is(&key, 2) => {}
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut stalled_lock)
            .await
            .is_err(),
        "the stalled waiter took a held key"
    );
    next_lease.release().await.unwrap();
    let late = tokio::time::timeout(Duration::from_secs(10), stalled_lock)
        .await
        .expect("the stalled waiter, polled again, never got the free key")
        .unwrap();
    assert!(late.fence() > next_fence, "fences went back");
    late.release().await.unwrap();
    zk.until_queue_is(&key, 0).await;
}
