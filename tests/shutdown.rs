//! A clean exit: `Locker::shutdown` leaves no key held behind a program that returns from `main`,
//! against a real Redis. In its own binary, as `init_from_env` reads the process's environment.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::{distributed_lock, LockError, LockOptions, Locker};
use tokio::sync::Notify;

use support::fault_proxy::{Direction, FaultProxy};
use support::redis_server::RedisServer;
use support::unique_key;

/// Whether another client gets `key` at once: the key is free on the store.
async fn free_on_the_store(url: &str, key: &str) -> bool {
    let other = Locker::connect(url).await.unwrap();
    match other.lock(key, LockOptions::new()).await {
        Ok(lease) => {
            lease.release().await.unwrap();
            true
        }
        Err(LockError::Busy { .. }) => false,
        Err(error) => panic!("{error}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_the_release_of_a_lease_dropped_on_the_way_out() {
    let redis = RedisServer::start();
    // A slow link: the release queued by the drop is still on its way when `main` would return.
    let (proxy, slow_url) = FaultProxy::in_front_of(&redis.url());
    let locker = Locker::connect(&slow_url).await.unwrap();
    let key = unique_key("exit");
    let lease = locker
        .lock(&*key, LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    proxy.set_latency(Direction::Both, Duration::from_millis(300));
    drop(lease);
    locker.shutdown().await.unwrap();
    assert!(
        free_on_the_store(&redis.url(), &key).await,
        "the dropped lease's key was still held after shutdown returned"
    );
}

#[distributed_lock(key = "<key>", ttl = "30s", locker = locker)]
async fn long_job(locker: &Locker, key: &str, started: &Notify) -> Result<(), LockError> {
    started.notify_one();
    tokio::time::sleep(Duration::from_secs(600)).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_held_leases_and_stops_the_bodies_under_them() {
    let redis = RedisServer::start();
    let locker = Locker::connect(&redis.url()).await.unwrap();
    let (body_key, lease_key) = (unique_key("body"), unique_key("lease"));

    let started = Arc::new(Notify::new());
    let job = tokio::spawn({
        let (locker, key, started) = (locker.clone(), body_key.clone(), started.clone());
        async move { long_job(&locker, &key, &started).await }
    });
    started.notified().await;
    let lease = locker.lock(&*lease_key, LockOptions::new()).await.unwrap();

    locker.shutdown().await.unwrap();

    let stopped = tokio::time::timeout(Duration::from_secs(5), job).await;
    assert!(
        matches!(stopped, Ok(Ok(Err(LockError::Lost { .. })))),
        "the body under the lock was not stopped: {stopped:?}"
    );
    assert!(!lease.is_held());
    tokio::time::timeout(Duration::from_secs(1), lease.lost())
        .await
        .expect("the holder of a manual lease was not told it is lost");
    assert!(free_on_the_store(&redis.url(), &body_key).await);
    assert!(free_on_the_store(&redis.url(), &lease_key).await);
    // Releasing it again after shutdown is harmless.
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shut_down_locker_takes_no_new_leases_on_any_clone_and_shuts_down_twice() {
    let redis = RedisServer::start();
    let locker = Locker::connect(&redis.url()).await.unwrap();
    let clone = locker.clone();
    locker.shutdown().await.unwrap();
    let key = unique_key("after");
    assert!(matches!(
        clone.lock(&*key, LockOptions::new()).await,
        Err(LockError::ShutDown)
    ));
    assert!(free_on_the_store(&redis.url(), &key).await);
    clone.shutdown().await.unwrap();
}

/// Shuts down `locker` while an acquisition of a fresh key crosses a slow link to `url`'s store,
/// and checks, the moment shutdown returns (when a program would exit), that the acquisition was
/// refused and left the key free.
async fn shut_down_during_an_acquisition(url: &str) {
    let (proxy, slow_url) = FaultProxy::in_front_of(url);
    let locker = Locker::connect(&slow_url).await.unwrap();
    // Only the answers are slow: the grant lands on the store at once, its reply after shutdown
    // began.
    proxy.set_latency(Direction::ToClient, Duration::from_millis(300));
    let key = unique_key("inflight");
    let acquiring = tokio::spawn({
        let (locker, key) = (locker.clone(), key.clone());
        async move { locker.lock(&*key, LockOptions::new()).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    locker.shutdown().await.unwrap();
    assert!(
        free_on_the_store(url, &key).await,
        "the key of an acquisition in flight was held when shutdown returned"
    );
    let outcome = acquiring.await.unwrap();
    assert!(
        matches!(outcome, Err(LockError::ShutDown)),
        "an acquisition finishing after shutdown was kept: {outcome:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_in_flight_during_shutdown_leaves_the_key_free() {
    let redis = RedisServer::start();
    shut_down_during_an_acquisition(&redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mysql_acquisition_in_flight_during_shutdown_leaves_the_key_free() {
    shut_down_during_an_acquisition(&support::mysql_url()).await;
}

/// When the first body stopped working.
type Stopped = Mutex<Option<Instant>>;

/// How the first body goes on working after shutdown began.
#[derive(Clone, Copy)]
enum Work {
    InOnePoll,
    /// For longer than its ttl: its lease must be kept alive meanwhile.
    InOnePollPastItsTtl,
    /// As `InOnePollPastItsTtl`, after a nested call on its key under `on_lost = "continue"`
    /// returned: the body left under the lease is one that stops at its next `.await`.
    InOnePollPastItsTtlAfterANestedContinueCall,
    OnAfterTheLoss,
}

#[distributed_lock(key = "<key>", ttl = "900ms", locker = locker)]
async fn busy_past_its_ttl(
    locker: &Locker,
    key: &str,
    started: &Notify,
    stopped: &Stopped,
) -> Result<(), LockError> {
    started.notify_one();
    tokio::time::sleep(Duration::from_millis(100)).await;
    std::thread::sleep(Duration::from_secs(3));
    *stopped.lock().unwrap() = Some(Instant::now());
    tokio::task::yield_now().await;
    Ok(())
}

#[distributed_lock(key = "<key>", ttl = "900ms", locker = locker)]
async fn busy_past_its_ttl_after_a_nested_continue_call(
    locker: &Locker,
    key: &str,
    started: &Notify,
    stopped: &Stopped,
) -> Result<(), LockError> {
    nested_continue_call(locker, key).await?;
    started.notify_one();
    tokio::time::sleep(Duration::from_millis(100)).await;
    std::thread::sleep(Duration::from_secs(3));
    *stopped.lock().unwrap() = Some(Instant::now());
    tokio::task::yield_now().await;
    Ok(())
}

#[distributed_lock(key = "<key>", locker = locker, on_lost = "continue")]
async fn nested_continue_call(locker: &Locker, key: &str) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "<key>", ttl = "30s", locker = locker)]
async fn busy_in_one_poll(
    locker: &Locker,
    key: &str,
    started: &Notify,
    stopped: &Stopped,
) -> Result<(), LockError> {
    started.notify_one();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Work that does not yield: it runs to its end whatever happens to the lease meanwhile.
    std::thread::sleep(Duration::from_millis(400));
    *stopped.lock().unwrap() = Some(Instant::now());
    tokio::task::yield_now().await;
    Ok(())
}

#[distributed_lock(key = "<key>", ttl = "30s", locker = locker, on_lost = "continue")]
async fn finishing_after_the_loss(
    locker: &Locker,
    key: &str,
    started: &Notify,
    stopped: &Stopped,
) -> Result<(), LockError> {
    started.notify_one();
    tokio::time::sleep(Duration::from_millis(500)).await;
    *stopped.lock().unwrap() = Some(Instant::now());
    Ok(())
}

/// Shuts down the locker of a body that works on for a while after its lease is lost, while
/// another process waits for the key: the other body must not start before the first stopped.
async fn shut_down_under_a_working_body(work: Work) {
    let redis = RedisServer::start();
    let locker = Locker::connect(&redis.url()).await.unwrap();
    let key = unique_key("working");
    let stopped: Arc<Stopped> = Arc::default();
    let started = Arc::new(Notify::new());
    // The body on a thread of its own, so that its blocking work stalls nothing else (the
    // locker's connection is driven by this test's runtime).
    let first = std::thread::spawn({
        let (locker, key, started, stopped) = (
            locker.clone(),
            key.clone(),
            started.clone(),
            stopped.clone(),
        );
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                match work {
                    Work::InOnePoll => busy_in_one_poll(&locker, &key, &started, &stopped).await,
                    Work::InOnePollPastItsTtl => {
                        busy_past_its_ttl(&locker, &key, &started, &stopped).await
                    }
                    Work::InOnePollPastItsTtlAfterANestedContinueCall => {
                        busy_past_its_ttl_after_a_nested_continue_call(
                            &locker, &key, &started, &stopped,
                        )
                        .await
                    }
                    Work::OnAfterTheLoss => {
                        finishing_after_the_loss(&locker, &key, &started, &stopped).await
                    }
                }
            })
        }
    });
    started.notified().await;
    // Another process: a runtime of its own, so nothing it does waits for this one's threads.
    let second = std::thread::spawn({
        let (url, key) = (redis.url(), key.clone());
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let next = Locker::connect(&url).await.unwrap();
                let lease = next
                    .lock(&*key, LockOptions::new().wait(Duration::from_secs(10)))
                    .await
                    .unwrap();
                let entered = Instant::now();
                lease.release().await.unwrap();
                entered
            })
        }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    locker.shutdown().await.unwrap();
    let _ = first.join().unwrap();
    let entered = second.join().unwrap();
    let stopped = stopped
        .lock()
        .unwrap()
        .expect("the first body never stopped");
    assert!(
        entered >= stopped,
        "the next holder entered {:?} before the body under the shut-down lease stopped",
        stopped - entered
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_the_next_holder_in_only_after_a_body_busy_in_one_poll_stopped() {
    shut_down_under_a_working_body(Work::InOnePoll).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_keeps_the_lease_of_a_body_busy_in_one_poll_past_its_ttl_until_it_stopped() {
    shut_down_under_a_working_body(Work::InOnePollPastItsTtl).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_keeps_the_lease_of_a_body_busy_in_one_poll_after_a_nested_continue_call() {
    shut_down_under_a_working_body(Work::InOnePollPastItsTtlAfterANestedContinueCall).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_the_next_holder_in_only_after_a_continue_body_finished() {
    shut_down_under_a_working_body(Work::OnAfterTheLoss).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_from_env_fails_at_boot_and_then_serves_as_the_default() {
    std::env::remove_var("DLOCK_URL");
    assert!(matches!(
        dlock::init_from_env().await,
        Err(LockError::NoLocker)
    ));
    std::env::set_var("DLOCK_URL", "nosuch://127.0.0.1");
    assert!(matches!(
        dlock::init_from_env().await,
        Err(LockError::InvalidUrl { .. })
    ));

    let redis = RedisServer::start();
    std::env::set_var("DLOCK_URL", redis.url());
    let locker = dlock::init_from_env().await.unwrap();
    let key = unique_key("default");
    let held = locker.lock(&*key, LockOptions::new()).await.unwrap();
    // The attribute without `locker = …` now uses the same locker and store.
    assert!(matches!(
        default_job(&key).await,
        Err(LockError::Busy { .. })
    ));
    held.release().await.unwrap();
    assert_eq!(default_job(&key).await.unwrap(), 7);
    locker.shutdown().await.unwrap();
}

#[distributed_lock(key = "<key>")]
async fn default_job(key: &str) -> Result<u32, LockError> {
    Ok(7)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_shutdown_releases_before_it_closes_the_pool() {
    let url = support::mysql_url();
    let locker = Locker::connect(&url).await.unwrap();
    let key = unique_key("mysql-exit");
    let held = locker.lock(&*key, LockOptions::new()).await.unwrap();
    let dropped = locker
        .lock(unique_key("mysql-drop"), LockOptions::new())
        .await
        .unwrap();
    let dropped_key = dropped.key().to_owned();
    drop(dropped);
    locker.shutdown().await.unwrap();
    assert!(!held.is_held());
    assert!(
        free_on_the_store(&url, &key).await,
        "held lease not released"
    );
    assert!(
        free_on_the_store(&url, &dropped_key).await,
        "dropped lease not released"
    );
    // The closed pool answers a late release with an error, not a hang.
    locker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locker_on_the_services_own_pool_excludes_and_leaves_the_pool_open_at_shutdown() {
    use dlock::backend::MysqlBackend;

    let url = support::mysql_url();
    let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
    let locker = Locker::with_backend(
        MysqlBackend::with_pool(pool.clone())
            .connect()
            .await
            .unwrap(),
    );
    let key = unique_key("service-pool");
    let held = locker.lock(&*key, LockOptions::new()).await.unwrap();
    // Another process, on a pool of its own, is kept out.
    assert!(!free_on_the_store(&url, &key).await);
    drop(held);
    locker.shutdown().await.unwrap();
    assert!(free_on_the_store(&url, &key).await);
    let one: i64 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(one, 1, "shutdown closed the service's pool");
}

/// Polls `future` for a moment (it starts its work), then hands it back unfinished, to be kept
/// and never polled again, as a `select!` that took another branch keeps its other futures.
async fn started_then_parked<F: std::future::Future + Unpin>(mut future: F) -> F {
    assert!(
        tokio::time::timeout(Duration::from_millis(50), &mut future)
            .await
            .is_err(),
        "finished before it was parked"
    );
    future
}

/// Futures kept but not polled while shutdown runs (a `select!` on a termination signal keeps
/// the others): an acquisition waiting for a busy key, a release, and a body under a lease.
/// Shutdown returns within moments, and the released keys are free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn futures_parked_during_shutdown_do_not_hold_it_up() {
    let redis = RedisServer::start();
    // Slow answers, so that a release is still on its way when it is parked.
    let (proxy, slow_url) = FaultProxy::in_front_of(&redis.url());
    let locker = Locker::connect(&slow_url).await.unwrap();
    let other = Locker::connect(&redis.url()).await.unwrap();
    let (busy, released, body_key) = (
        unique_key("parked-busy"),
        unique_key("parked-release"),
        unique_key("parked-body"),
    );
    let _held_elsewhere = other.lock(&*busy, LockOptions::new()).await.unwrap();
    let acquiring = started_then_parked(Box::pin(
        locker.lock(&*busy, LockOptions::new().wait(Duration::from_secs(60))),
    ))
    .await;
    let started = Notify::new();
    let body = started_then_parked(Box::pin(long_job(&locker, &body_key, &started))).await;
    tokio::time::timeout(Duration::from_secs(1), started.notified())
        .await
        .expect("the body did not start before it was parked");
    let lease = locker.lock(&*released, LockOptions::new()).await.unwrap();
    proxy.set_latency(Direction::ToClient, Duration::from_millis(300));
    let releasing = started_then_parked(Box::pin(lease.release())).await;

    let shutdown = tokio::time::timeout(Duration::from_secs(15), locker.shutdown()).await;
    assert!(
        matches!(shutdown, Ok(Ok(()))),
        "shutdown with parked futures: {shutdown:?}"
    );
    assert!(free_on_the_store(&redis.url(), &released).await);
    assert!(free_on_the_store(&redis.url(), &body_key).await);
    drop((acquiring, releasing, body));
}

#[distributed_lock(key = "<key>", ttl = "30s", locker = locker, on_lost = "continue")]
async fn shuts_down_its_own_locker(locker: &Locker, key: &str) -> Result<Duration, LockError> {
    let began = Instant::now();
    locker.shutdown().await?;
    Ok(began.elapsed())
}

/// A body that shuts down its own locker (under `on_lost = "continue"`, so it runs on) is not
/// waited for: it cannot rest while it waits for shutdown itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_shuts_down_its_own_locker_is_not_waited_for() {
    let redis = RedisServer::start();
    let locker = Locker::connect(&redis.url()).await.unwrap();
    let key = unique_key("own-shutdown");
    let took = shuts_down_its_own_locker(&locker, &key).await.unwrap();
    assert!(
        took < Duration::from_secs(3),
        "shutdown from inside the body took {took:?}"
    );
    assert!(free_on_the_store(&redis.url(), &key).await);
}

#[distributed_lock(key = "<key>", ttl = "30s", locker = locker)]
async fn cancelled_by_its_own_shutdown(locker: &Locker, key: &str) -> Result<(), LockError> {
    locker.shutdown().await
}

/// A body under `on_lost = "cancel"` that shuts down its own locker is stopped by it, and the
/// shutdown still finishes: the store is closed (its pool refuses statements).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_that_stops_the_body_that_called_it_still_closes_the_store() {
    use dlock::backend::{Backend, MysqlBackend};

    let backend = MysqlBackend::connect(&support::mysql_url()).await.unwrap();
    let locker = Locker::with_backend(backend.clone());
    let key = unique_key("own-cancel");
    let outcome = cancelled_by_its_own_shutdown(&locker, &key).await;
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "the body was not stopped: {outcome:?}"
    );
    for _ in 0..60 {
        if backend.health().await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the store was still open 3 s after the body that shut it down was stopped");
}
