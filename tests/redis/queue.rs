//! The queue of waiters on Redis: a waiter that is dropped or gives up leaves it, and a release
//! wakes the next one through pub/sub, not a poll, also after the server restarted.

use std::time::{Duration, Instant};

use dlock::backend::RedisBackend;
use dlock::{LockError, LockOptions, Locker};
use redis::AsyncCommands;

use crate::support::fault_proxy::{Direction, FaultProxy};
use crate::support::redis_server::RedisServer;
use crate::support::unique_key;
use crate::{
    locker_on, spawn_lock, wait_for_queue_length, wait_for_subscribers, waiters_channel, Redis,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_waiter_leaves_the_queue() {
    let redis = Redis::start();
    // A long liveness window: a waiter that failed to leave would block the next one for 30 s.
    let backend = RedisBackend::builder(&redis.server.url())
        .unwrap()
        .waiter_liveness(Duration::from_secs(30))
        .connect()
        .await
        .unwrap();
    let locker = Locker::with_backend(backend.clone());
    let key = unique_key("dropped-waiter");
    let holder = locker
        .lock(&*key, LockOptions::new().ttl(Duration::from_secs(60)))
        .await
        .unwrap();
    let waiting = LockOptions::new()
        .ttl(Duration::from_secs(60))
        .wait(Duration::from_secs(60));
    let dropped = spawn_lock(&locker, &key, waiting);
    let queue = backend.queue_key(&key);
    let mut raw = redis.raw().await;
    wait_for_queue_length(&mut raw, &queue, 1).await;
    let next = spawn_lock(&locker, &key, waiting);
    wait_for_queue_length(&mut raw, &queue, 2).await;
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    wait_for_queue_length(&mut raw, &queue, 1).await;
    let released_at = Instant::now();
    holder.release().await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(20), next)
        .await
        .expect("the next waiter was blocked")
        .unwrap()
        .unwrap();
    let latency = released_at.elapsed();
    assert!(
        latency < Duration::from_secs(3),
        "the next waiter got the key {latency:?} after the release"
    );
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_gives_up_when_its_wait_runs_out_and_leaves_the_queue() {
    let redis = Redis::start();
    let locker = locker_on(&redis.server).await;
    let key = unique_key("gives-up");
    let _holder = locker
        .lock(&*key, LockOptions::new().ttl(Duration::from_secs(60)))
        .await
        .unwrap();
    let started = Instant::now();
    let result = locker
        .lock(&*key, LockOptions::new().wait(Duration::from_millis(700)))
        .await;
    let waited = started.elapsed();
    assert!(matches!(result, Err(LockError::Busy { .. })), "{result:?}");
    assert!(
        waited >= Duration::from_millis(700),
        "gave up after {waited:?}, before its wait ran out"
    );
    assert!(
        waited < Duration::from_secs(5),
        "gave up only after {waited:?}"
    );
    let queued: u64 = redis
        .raw()
        .await
        .llen(redis.names.queue_key(&key))
        .await
        .unwrap();
    assert_eq!(queued, 0, "the waiter stayed in the queue");
}

/// Holds `key`, lets a waiter wait `after`, releases, and says how long the waiter took to enter.
async fn wake_latency(locker: &Locker, key: &str, after: Duration) -> Duration {
    let holder = locker
        .lock(key, LockOptions::new().ttl(Duration::from_secs(60)))
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let (locker, key) = (locker.clone(), key.to_owned());
        async move {
            let lease = locker
                .lock(
                    &*key,
                    LockOptions::new()
                        .ttl(Duration::from_secs(60))
                        .wait(Duration::from_secs(60)),
                )
                .await;
            (Instant::now(), lease)
        }
    });
    tokio::time::sleep(after).await;
    let released_at = Instant::now();
    holder.release().await.unwrap();
    let (entered_at, lease) = waiter.await.unwrap();
    lease.unwrap().release().await.unwrap();
    entered_at.duration_since(released_at)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_by_pub_sub_not_polling_also_after_a_restart() {
    let mut server = RedisServer::start();
    // A 30 s liveness window lets the fallback polls back off to 10 s: polls come about 0.25,
    // 0.75, 1.75, 3.75 and 7.75 s into a wait, so a release 4.5 s in is seen within a second only
    // through the published hand-off.
    let backend = RedisBackend::builder(&server.url())
        .unwrap()
        .waiter_liveness(Duration::from_secs(30))
        .connect()
        .await
        .unwrap();
    let locker = Locker::with_backend(backend);
    let key = unique_key("pubsub");
    let latency = wake_latency(&locker, &key, Duration::from_millis(4_500)).await;
    assert!(
        latency < Duration::from_secs(1),
        "the waiter entered {latency:?} after the release"
    );
    // The pub/sub connection dies with the server; the next waiter subscribes on a fresh one.
    server.restart();
    let latency = wake_latency(&locker, &key, Duration::from_millis(4_500)).await;
    assert!(
        latency < Duration::from_secs(1),
        "after a restart, the waiter entered {latency:?} after the release"
    );
}

/// A waiter with a short liveness window, on a backend of its own, never shortens the life of
/// the queue below another waiter's window: the first waiter stays queued, and a release hands
/// it the key rather than to a newcomer that asks once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_with_a_shorter_liveness_window_does_not_drop_the_queue_from_under_another() {
    let redis = Redis::start();
    let backend_at = |liveness: Duration| {
        let url = redis.server.url();
        async move {
            let backend = RedisBackend::builder(&url)
                .unwrap()
                .waiter_liveness(liveness)
                .connect()
                .await
                .unwrap();
            Locker::with_backend(backend)
        }
    };
    let (patient, hasty) = (
        backend_at(Duration::from_secs(3)).await,
        backend_at(Duration::from_millis(100)).await,
    );
    let key = unique_key("short-liveness");
    let holder = patient
        .lock(&*key, LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let first = spawn_lock(
        &patient,
        &key,
        LockOptions::new().wait(Duration::from_secs(20)),
    );
    let queue = redis.names.queue_key(&key);
    let mut raw = redis.raw().await;
    wait_for_queue_length(&mut raw, &queue, 1).await;
    // Long enough for the first waiter's fallback polls, which touch the queue, to be a second
    // apart.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Queues behind it, then gives up.
    let gave_up = hasty
        .lock(&*key, LockOptions::new().wait(Duration::from_millis(150)))
        .await;
    assert!(
        matches!(gave_up, Err(LockError::Busy { .. })),
        "{gave_up:?}"
    );
    // The release comes when the queue would have expired, if it does, before the first
    // waiter's next poll.
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_millis(900) {
        let exists: bool = raw.exists(&queue).await.unwrap();
        if !exists {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    holder.release().await.unwrap();
    let newcomer = hasty.lock(&*key, LockOptions::new()).await;
    assert!(
        newcomer.is_err(),
        "a newcomer that asked once got the key the first waiter had queued for"
    );
    let lease = tokio::time::timeout(Duration::from_secs(5), first)
        .await
        .expect("the first waiter was not handed the key")
        .unwrap()
        .unwrap();
    lease.release().await.unwrap();
}

/// Pub/sub trouble never holds up a waiter's polls, which keep its place alive: with the
/// pub/sub connection lost and every new connection to the server hanging, the waiters of the
/// backend still keep their places, and the first of them gets the key when the holder lets
/// go, not a newcomer that asks after their waiter keys would have run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_keep_their_places_while_pub_sub_cannot_reconnect() {
    let redis = Redis::start();
    let (proxy, proxied) = FaultProxy::in_front_of(&redis.server.url());
    // A reconnection that hangs is given up after 10 s: longer than a waiter key lives (3 s).
    let behind_proxy = RedisBackend::builder(&proxied)
        .unwrap()
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    let waiting = Locker::with_backend(behind_proxy);
    let direct = locker_on(&redis.server).await;
    let key = unique_key("pub-sub-hangs");
    let holder = direct
        .lock(&*key, LockOptions::new().ttl(Duration::from_secs(60)))
        .await
        .unwrap();
    let queue = redis.names.queue_key(&key);
    let mut raw = redis.raw().await;
    let options = LockOptions::new().wait(Duration::from_secs(30));
    let mut waiters = Vec::new();
    for length in 1..=3 {
        waiters.push(spawn_lock(&waiting, &key, options));
        wait_for_queue_length(&mut raw, &queue, length).await;
    }
    let channel = waiters_channel(&mut raw).await;
    wait_for_subscribers(&mut raw, &channel, 1).await;

    // Every new connection through the proxy hangs; the waiters' pub/sub connection is cut.
    proxy.stall_new_connections(true);
    let killed: u64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "pubsub"])
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(killed, 1);
    tokio::time::sleep(Duration::from_secs(4)).await;
    holder.release().await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let newcomer = direct.lock(&*key, LockOptions::new()).await;
    let overtaken = newcomer.is_ok();
    if let Ok(lease) = newcomer {
        lease.release().await.unwrap();
    }
    assert!(
        !overtaken,
        "a newcomer got the key while three waiters had been waiting for it"
    );
    let first = tokio::time::timeout(Duration::from_secs(10), waiters.remove(0))
        .await
        .expect("the first waiter never got the key")
        .unwrap();
    proxy.stall_new_connections(false);
    proxy.resume(Direction::Both);
    first.unwrap().release().await.unwrap();
    for waiter in waiters {
        waiter.abort();
    }
}
