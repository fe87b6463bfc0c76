//! Releases and undos on a Redis out of memory (`maxmemory` reached, `noeviction`, the policy
//! `connect` insists on): the server refuses a script at its first write that may grow memory
//! (a "denyoom" command, such as `SET`) unless the script wrote something before it, so a
//! release must free the lock before it writes its cancel marker, or it changes nothing and the
//! key stays held, unrenewed, for its ttl.

use std::time::Duration;

use dlock::backend::{AcquireRequest, Backend, RedisBackend};
use dlock::Owner;
use redis::AsyncCommands;

use crate::support::unique_key;
use crate::{wait_for_queue_length, Redis};

/// Puts the server out of memory: `maxmemory` below what it uses (it is this test's own server,
/// never the shared one), so that a write that may grow memory is refused with OOM.
async fn run_out_of_memory(raw: &mut redis::aio::MultiplexedConnection) {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(raw)
        .await
        .unwrap();
    let used: u64 = info
        .lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .expect("no used_memory in INFO")
        .trim()
        .parse()
        .unwrap();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(used / 2)
        .query_async(raw)
        .await
        .unwrap();
    let refused: redis::RedisResult<()> = raw.set("dlock-test-oom-probe", 1).await;
    let error = refused.expect_err("a SET was accepted: the server is not out of memory");
    assert!(error.to_string().contains("OOM"), "{error}");
}

/// Lifts the limit again.
async fn free_memory(raw: &mut redis::aio::MultiplexedConnection) {
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(0)
        .query_async(raw)
        .await
        .unwrap();
}

/// A lock held by a fresh owner of `backend`, for a minute; then a waiter of `other` that
/// queued for it and gave up, which leaves the lock unmarked (a release looks at its queue).
async fn held_after_a_waiter_left(
    redis: &Redis,
    backend: &RedisBackend,
    other: &RedisBackend,
    key: &str,
) -> Owner {
    let ttl = Duration::from_secs(60);
    let holder = Owner::random();
    backend
        .acquire(&AcquireRequest::new(key, holder, ttl, Duration::ZERO))
        .await
        .unwrap()
        .expect("the key was busy");
    let gave_up = other
        .acquire(&AcquireRequest::new(
            key,
            Owner::random(),
            ttl,
            Duration::from_millis(300),
        ))
        .await
        .unwrap();
    assert!(gave_up.is_none(), "the waiter was granted a held key");
    let mut raw = redis.raw().await;
    let stored: String = raw.get(redis.names.lock_key(key)).await.unwrap();
    assert_eq!(
        crate::owner_line(&stored),
        holder.to_string(),
        "not unmarked"
    );
    let queued: u64 = raw.llen(redis.names.queue_key(key)).await.unwrap();
    assert_eq!(queued, 0, "the waiter did not leave");
    holder
}

/// The undo of a held lock (every release on a Redis Cluster is one; so is a resent lease's, or
/// that of a grant handed over) frees it on a server out of memory: it deletes the lock before
/// it writes the cancel marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undo_frees_a_held_lock_on_a_server_out_of_memory() {
    let redis = Redis::start();
    let backend = RedisBackend::connect(&redis.server.url()).await.unwrap();
    let other = RedisBackend::connect(&redis.server.url()).await.unwrap();
    let key = unique_key("oom-undo");
    let holder = held_after_a_waiter_left(&redis, &backend, &other, &key).await;
    let mut raw = redis.raw().await;
    run_out_of_memory(&mut raw).await;
    let undone = backend.undo_acquire(&key, holder).await;
    let lock_key = redis.names.lock_key(&key);
    let pttl: i64 = raw.pttl(&lock_key).await.unwrap();
    free_memory(&mut raw).await;
    assert!(matches!(undone, Ok(true)), "the undo failed: {undone:?}");
    assert_eq!(pttl, -2, "the lock is still held, for {pttl} ms");
    // Its cancel marker was left all the same.
    let marked: i64 = raw.pttl(format!("{lock_key}:x:{holder}")).await.unwrap();
    assert!(marked > 0, "no cancel marker: PTTL {marked}");
}

/// The undo of a held lock with a waiter queued hands it to that waiter on a server out of
/// memory, which starts on the hand-off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undo_hands_a_held_lock_to_its_waiter_on_a_server_out_of_memory() {
    let redis = Redis::start();
    let backend = RedisBackend::connect(&redis.server.url()).await.unwrap();
    // A long window: the waiter's polls (which write, and fail while memory is out) are rare.
    let other = RedisBackend::builder(&redis.server.url())
        .unwrap()
        .waiter_liveness(Duration::from_secs(30))
        .connect()
        .await
        .unwrap();
    let key = unique_key("oom-hand-off");
    let ttl = Duration::from_secs(60);
    let holder = Owner::random();
    backend
        .acquire(&AcquireRequest::new(&key, holder, ttl, Duration::ZERO))
        .await
        .unwrap()
        .expect("the key was busy");
    let waiter = Owner::random();
    let waiting = tokio::spawn({
        let (other, key) = (other.clone(), key.clone());
        async move {
            let request =
                AcquireRequest::new(&key, waiter, ttl, Duration::from_secs(30)).renewed(true);
            other.acquire(&request).await
        }
    });
    let mut raw = redis.raw().await;
    wait_for_queue_length(&mut raw, &redis.names.queue_key(&key), 1).await;
    // Past the waiter's first polls, which come soon after it queued.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    run_out_of_memory(&mut raw).await;
    let undone = backend.undo_acquire(&key, holder).await;
    let acquired = tokio::time::timeout(Duration::from_secs(5), waiting).await;
    let stored: Option<String> = raw.get(redis.names.lock_key(&key)).await.unwrap();
    free_memory(&mut raw).await;
    assert!(matches!(undone, Ok(true)), "the undo failed: {undone:?}");
    let acquired = acquired
        .expect("the waiter was not handed the key")
        .unwrap();
    assert!(
        matches!(acquired, Ok(Some(_))),
        "the waiter did not get the key: {acquired:?}"
    );
    let stored = stored.expect("the lock is free");
    assert_eq!(crate::owner_line(&stored), waiter.to_string());
    other.release(&key, waiter).await.unwrap();
}

/// The undo of a waiter's acquisition (it gave up, or was dropped) takes it out of the queue on
/// a server out of memory, before it writes the cancel marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiters_undo_leaves_the_queue_on_a_server_out_of_memory() {
    let redis = Redis::start();
    let backend = RedisBackend::connect(&redis.server.url()).await.unwrap();
    let key = unique_key("oom-leave");
    let ttl = Duration::from_secs(60);
    let holder = Owner::random();
    backend
        .acquire(&AcquireRequest::new(&key, holder, ttl, Duration::ZERO))
        .await
        .unwrap()
        .expect("the key was busy");
    // A waiter queued from outside, as the acquire script queues one, that never polls again.
    let waiter = Owner::random();
    let lock_key = redis.names.lock_key(&key);
    let queue = redis.names.queue_key(&key);
    let mut raw = redis.raw().await;
    let () = raw.rpush(&queue, waiter.to_string()).await.unwrap();
    let () = raw
        .pset_ex(
            format!("{lock_key}:w:{waiter}"),
            "60000 elsewhere 1",
            60_000,
        )
        .await
        .unwrap();
    run_out_of_memory(&mut raw).await;
    let undone = backend.undo_acquire(&key, waiter).await;
    let queued: u64 = raw.llen(&queue).await.unwrap();
    let waiter_key: bool = raw.exists(format!("{lock_key}:w:{waiter}")).await.unwrap();
    let marked: i64 = raw.pttl(format!("{lock_key}:x:{waiter}")).await.unwrap();
    free_memory(&mut raw).await;
    assert!(matches!(undone, Ok(false)), "the undo failed: {undone:?}");
    assert_eq!(queued, 0, "the waiter is still queued");
    assert!(!waiter_key, "the waiter's key is left");
    assert!(marked > 0, "no cancel marker: PTTL {marked}");
    assert!(backend.release(&key, holder).await.unwrap());
}
