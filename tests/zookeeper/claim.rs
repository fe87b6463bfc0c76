//! A grant nobody claims is held for the claim window at most: a waiter whose future is alive
//! but no longer polled (its caller's runtime stalled by blocking code, a future parked in a
//! `select!` that stopped polling it) costs the next waiter that window, not the time until its
//! caller comes back; and when it does come back, it queues again behind whoever got the key.

use std::time::{Duration, Instant};

use dlock::backend::ZookeeperBackend;
use dlock::{LockOptions, Locker};

use crate::support::unique_key;
use crate::{ttl, Zookeeper, ROOT, SESSION, TICK};

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

/// The other way a caller stalls: its runtime's thread is blocked. A grant waits for the claim
/// window or the waiter's ttl, whichever is shorter: past the ttl the grant is worth nothing to
/// the caller, so a long window set for other callers does not hold the key longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_runtime_s_grant_waits_no_longer_than_the_waiter_s_ttl() {
    const WAITER_TTL: Duration = Duration::from_secs(2);
    let zk = Zookeeper::shared().await;
    let key = unique_key("blocked-runtime");
    let holder = Locker::with_backend(zk.backend().await);
    let lease = holder.lock(&*key, ttl(60)).await.unwrap();
    let long_window = ZookeeperBackend::builder(&zk.url)
        .unwrap()
        .root(ROOT)
        .session_timeout(SESSION)
        .tick_time(TICK)
        .claim_window(Duration::from_secs(60))
        .connect()
        .await
        .unwrap();
    let stalled = Locker::with_backend(long_window);

    // The waiter's runtime polls it until told to stall, then blocks its one thread for 8 s,
    // then polls it to the end.
    let (stall, stall_now) = tokio::sync::oneshot::channel::<()>();
    let waiter = std::thread::spawn({
        let key = key.clone();
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let options = LockOptions::new()
                    .ttl(WAITER_TTL)
                    .wait(Duration::from_secs(60));
                let mut waiting = Box::pin(stalled.lock(&*key, options));
                tokio::select! {
                    got = &mut waiting => panic!("the waiter got the held key: {got:?}"),
                    _ = stall_now => {}
                }
                std::thread::sleep(Duration::from_secs(8));
                let lease = tokio::time::timeout(Duration::from_secs(30), waiting)
                    .await
                    .expect("the waiter, polled again, never got the key")
                    .unwrap();
                let fence = lease.fence();
                lease.release().await.unwrap();
                fence
            })
        }
    });
    zk.until_queue_is(&key, 2).await;
    stall.send(()).unwrap();

    lease.release().await.unwrap();
    let next = Locker::with_backend(zk.backend().await);
    let asked = Instant::now();
    let got = next
        .lock(&*key, ttl(60).wait(Duration::from_secs(10)))
        .await;
    let waited = asked.elapsed();
    assert!(got.is_ok(), "{got:?} after {waited:?}");
    assert!(
        waited <= WAITER_TTL + SLACK,
        "the next waiter got the key only after {waited:?}, more than the stalled waiter's ttl"
    );
    let next_lease = got.unwrap();
    // The stalled waiter wakes, finds its grant withdrawn and queues behind the new holder.
    zk.until_queue_is(&key, 2).await;
    let next_fence = next_lease.fence();
    next_lease.release().await.unwrap();
    let late_fence = tokio::task::spawn_blocking(move || waiter.join().unwrap())
        .await
        .unwrap();
    assert!(late_fence > next_fence, "fences went back");
    zk.until_queue_is(&key, 0).await;
}
