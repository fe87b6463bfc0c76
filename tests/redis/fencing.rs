//! Fences on Redis keep rising where the server forgot its counter: after a restart without
//! persistence, and past a counter that expired.

use std::time::Duration;

use dlock::LockOptions;
use redis::AsyncCommands;

use crate::support::redis_server::RedisServer;
use crate::support::{lock_and_release, unique_key};
use crate::{locker_on, spawn_lock, wait_for_queue_length, Redis};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_keep_rising_when_a_restart_loses_the_counter() {
    let mut server = RedisServer::start(); // no persistence: a restart forgets every key
    let locker = locker_on(&server).await;
    let key = unique_key("fence-restart");
    let mut fences = Vec::new();
    for _ in 0..3 {
        fences.push(lock_and_release(&locker, &key, LockOptions::new()).await);
    }
    server.restart();
    let mut raw = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let kept: Option<u64> = redis::cmd("GET")
        .arg(format!("dlock:{{{key}}}:fences"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(kept, None, "the restart was meant to lose the counter");
    let lease = locker.lock(&*key, LockOptions::new()).await.unwrap();
    fences.push(lease.fence());
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences went back after the counter was lost: {fences:?}"
    );
}

/// A fence counter expires (one key per lock key ever used would never go away otherwise), and
/// fences keep rising past a counter that expired: the server's clock floors them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_counters_expire_and_fences_keep_rising_past_an_expired_one() {
    let redis = Redis::start();
    let locker = locker_on(&redis.server).await;
    let mut raw = redis.raw().await;
    let keys: Vec<String> = (0..20)
        .map(|i| unique_key(&format!("counter-ttl-{i}")))
        .collect();
    for key in &keys {
        lock_and_release(&locker, key, LockOptions::new()).await;
    }
    // A hand-off's grant counts a fence too.
    let holder = locker.lock(&*keys[0], LockOptions::new()).await.unwrap();
    let waiter = spawn_lock(
        &locker,
        &keys[0],
        LockOptions::new().wait(Duration::from_secs(10)),
    );
    wait_for_queue_length(&mut raw, &redis.names.queue_key(&keys[0]), 1).await;
    let before = holder.fence();
    holder.release().await.unwrap();
    let handed = waiter.await.unwrap().unwrap();
    assert!(handed.fence() > before);
    let before = handed.fence();
    handed.release().await.unwrap();
    for key in &keys {
        let pttl: i64 = raw.pttl(redis.names.fence_key(key)).await.unwrap();
        assert!(
            pttl > 0,
            "the fence counter of `{key}` has PTTL {pttl}: it never goes away"
        );
    }
    // The counter expires; the next fence is still greater.
    let counter = redis.names.fence_key(&keys[0]);
    let _: bool = raw.pexpire(&counter, 1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!raw.exists::<_, bool>(&counter).await.unwrap());
    let fence = lock_and_release(&locker, &keys[0], LockOptions::new()).await;
    assert!(
        fence > before,
        "fence {fence} after {before}, past an expired counter"
    );
}

/// A counter that went back to an older value — a fail-over to a replica that missed the last
/// grants, an older snapshot restored — does not bring fences back: every grant is floored by
/// the server's clock, not only one that finds the counter missing. (Counting on from the
/// counter alone would hand out the fences of the grants the replica missed a second time.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_keep_rising_when_the_counter_goes_back_to_an_older_value() {
    let redis = Redis::start();
    let locker = locker_on(&redis.server).await;
    let mut raw = redis.raw().await;
    let key = unique_key("fence-older-counter");
    let counter = redis.names.fence_key(&key);
    let first = lock_and_release(&locker, &key, LockOptions::new()).await;
    // What a replica that missed the grants after the first would hold.
    let older: String = raw.get(&counter).await.unwrap();
    let mut fences = vec![first];
    for _ in 0..3 {
        fences.push(lock_and_release(&locker, &key, LockOptions::new()).await);
    }
    let () = raw.set(&counter, &older).await.unwrap();
    fences.push(lock_and_release(&locker, &key, LockOptions::new()).await);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences went back with the counter: {fences:?}"
    );
}
