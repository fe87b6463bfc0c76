//! The connections to Redis: the first call after a restart, AUTH and TLS through the URL, a
//! locker that outlives the runtime that connected it, a server that never answers, the URL's
//! settings, and what a server must allow (its eviction policy, publishing, pub/sub).

use std::time::{Duration, Instant};

use dlock::backend::RedisBackend;
use dlock::{LockError, LockOptions, Locker};
use redis::AsyncCommands;

use crate::support::fault_proxy::{Direction, FaultProxy};
use crate::support::redis_server::RedisServer;
use crate::support::{lock_and_release, unique_key};
use crate::{locker_on, spawn_lock, wait_for_subscribers, waiters_channel, Redis};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_call_after_a_server_restart_succeeds() {
    let mut server = RedisServer::start();
    let locker = locker_on(&server).await;
    let key = unique_key("restart");
    lock_and_release(&locker, &key, LockOptions::new()).await;
    server.restart();
    // No reconnect by hand: the call finds its connection broken and retries on a fresh one.
    let lease = locker.lock(&*key, LockOptions::new()).await;
    assert!(
        lease.is_ok(),
        "first call after the restart failed: {lease:?}"
    );
    lease.unwrap().release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_through_the_url_and_a_wrong_password_is_a_clear_error() {
    let server = RedisServer::start_with_password("s3cret-pw");
    let locker = Locker::connect(&server.url())
        .await
        .expect("the right password was refused");
    lock_and_release(&locker, &unique_key("auth"), LockOptions::new()).await;

    let port = server.port();
    for (url, what) in [
        (
            format!("redis://:wrong-pw@127.0.0.1:{port}"),
            "a wrong password",
        ),
        (
            format!("redis://default:wrong-pw@127.0.0.1:{port}"),
            "a wrong user password",
        ),
        (format!("redis://127.0.0.1:{port}"), "no password"),
    ] {
        let started = Instant::now();
        let result = tokio::time::timeout(Duration::from_secs(10), Locker::connect(&url))
            .await
            .expect("connecting hung");
        let error = result.expect_err(what).to_string();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{what}: took {:?}",
            started.elapsed()
        );
        let lower = error.to_lowercase();
        assert!(
            lower.contains("auth") || lower.contains("wrongpass"),
            "{what}: unclear error: {error}"
        );
        assert!(
            !error.contains("wrong-pw"),
            "{what}: the password leaked into the error: {error}"
        );
    }
}

/// A locker kept across runtimes, as a `static` serves every `#[tokio::test]`: its connections
/// and its waiters' pub/sub must not die with the runtime that first used it.
#[test]
fn a_locker_outlives_the_runtime_that_connected_it() {
    let server = RedisServer::start();
    let key = unique_key("runtimes");
    let runtime = |_| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime(1);
    let locker = first.block_on(locker_on(&server));
    first.block_on(async {
        // Waits once, so the pub/sub connection is made on this runtime's watch.
        let holder = locker.lock(&*key, LockOptions::new()).await.unwrap();
        let waiter = spawn_lock(
            &locker,
            &key,
            LockOptions::new().wait(Duration::from_secs(10)),
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        holder.release().await.unwrap();
        waiter.await.unwrap().unwrap().release().await.unwrap();
    });
    drop(first);
    let second = runtime(2);
    second.block_on(async {
        let holder = locker
            .lock(&*key, LockOptions::new().ttl(Duration::from_millis(900)))
            .await
            .unwrap();
        let waiting = LockOptions::new()
            .ttl(Duration::from_secs(60))
            .wait(Duration::from_secs(10));
        let waiter = spawn_lock(&locker, &key, waiting);
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        // Renewed by the watchdog across the runtime change, so still held.
        assert!(holder.is_held());
        let released_at = Instant::now();
        holder.release().await.unwrap();
        let lease = waiter.await.unwrap().unwrap();
        assert!(
            released_at.elapsed() < Duration::from_secs(1),
            "the waiter was not woken by the release"
        );
        lease.release().await.unwrap();
    });
}

/// `rediss://` with the `redis-tls` feature: the server's certificate is checked against the
/// system's roots, here a test CA given through `SSL_CERT_FILE`.
#[cfg(feature = "redis-tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_through_a_rediss_url() {
    let server = RedisServer::start_tls();
    std::env::set_var("SSL_CERT_FILE", server.ca_file().unwrap());
    let url = server.url();
    assert!(url.starts_with("rediss://"), "{url}");
    let locker = Locker::connect(&url).await.expect("no TLS connection");
    let key = unique_key("tls");
    let holder = locker.lock(&*key, LockOptions::new()).await.unwrap();
    // A waiter, so the pub/sub connection goes over TLS too.
    let waiter = spawn_lock(
        &locker,
        &key,
        LockOptions::new().wait(Duration::from_secs(10)),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    holder.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
    assert!(
        released_at.elapsed() < Duration::from_secs(1),
        "the waiter was not woken over TLS"
    );
    // Plain text to a TLS port fails, and says so rather than hanging.
    let plain = tokio::time::timeout(
        Duration::from_secs(15),
        Locker::connect(&format!("redis://127.0.0.1:{}", server.port())),
    )
    .await;
    assert!(plain
        .expect("a plain connection to a TLS port hung")
        .is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresponsive_server_is_an_error_not_a_hang() {
    let port = crate::support::black_hole();
    let url = format!("redis://127.0.0.1:{port}");
    let timeout = Duration::from_millis(500);
    let started = Instant::now();
    let connected = RedisBackend::builder(&url)
        .unwrap()
        .connect_timeout(timeout)
        .response_timeout(timeout)
        .connect()
        .await;
    assert!(
        connected.is_err(),
        "connected to a server that never answers"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "connecting took {:?}",
        started.elapsed()
    );

    // Many callers at once share the failed attempt instead of queueing one timeout each.
    let backend = RedisBackend::builder(&url)
        .unwrap()
        .connect_timeout(timeout)
        .response_timeout(timeout)
        .build()
        .unwrap();
    let locker = Locker::with_backend(backend);
    let started = Instant::now();
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let locker = locker.clone();
            tokio::spawn(async move {
                locker
                    .lock(format!("silent-{i}"), LockOptions::new())
                    .await
                    .map(drop)
            })
        })
        .collect();
    for call in calls {
        let result = call.await.unwrap();
        assert!(matches!(result, Err(LockError::Backend(_))), "{result:?}");
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(8),
        "20 calls took {elapsed:?}: each waited out its own attempt"
    );
}

/// A deployment configures the store with one variable: the key prefix and the time-outs ride in
/// the URL's query, and the keys land under that prefix on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_url_carries_the_key_prefix_and_the_time_outs() {
    let server = RedisServer::start();
    let url = format!(
        "{}?key_prefix=billing:&connect_timeout=1s&response_timeout=2s",
        server.url()
    );
    let locker = Locker::connect(&url).await.unwrap();
    let key = unique_key("prefixed");
    let lease = locker.lock(&*key, LockOptions::new()).await.unwrap();
    let mut redis = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let under_prefix: bool = redis.exists(format!("billing:{{{key}}}")).await.unwrap();
    let under_default: bool = redis.exists(format!("dlock:{{{key}}}")).await.unwrap();
    assert!(
        under_prefix && !under_default,
        "the lock is not under the URL's prefix"
    );
    lease.release().await.unwrap();

    let bad = format!("{}?response_timeout=fast", server.url());
    match Locker::connect(&bad).await {
        Err(LockError::InvalidUrl { reason, .. }) => {
            assert!(reason.contains("response_timeout=`fast`"), "{reason}")
        }
        other => panic!("a bad duration in the URL was not refused: {other:?}"),
    }
}

/// A readiness probe: `health` answers Ok while the server runs, and an error (not a hang) once
/// it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_while_the_server_runs_and_fails_once_it_is_gone() {
    let mut server = RedisServer::start();
    let backend = RedisBackend::builder(&server.url())
        .unwrap()
        .response_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let locker = Locker::with_backend(backend);
    for _ in 0..3 {
        locker.health().await.unwrap();
    }
    // A probe changes nothing on the store, not even for a while.
    let mut raw = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<String> = raw.keys("*health-probe*").await.unwrap();
    assert!(keys.is_empty(), "health probes left {keys:?} on the server");
    server.stop();
    let started = Instant::now();
    assert!(
        locker.health().await.is_err(),
        "health passed with the server gone"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "health hung: {:?}",
        started.elapsed()
    );
}

/// A server that may evict keys when its memory runs short (a limit, and a policy other than
/// `noeviction`) could drop a held lock: `connect` refuses it with a message that names the fix,
/// unless the risk is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_may_evict_keys_is_refused_unless_allowed() {
    let redis = Redis::start();
    let mut raw = redis.raw().await;
    for (name, value) in [("maxmemory", "64mb"), ("maxmemory-policy", "volatile-lru")] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query_async(&mut raw)
            .await
            .unwrap();
    }
    let url = redis.server.url();
    let refused = RedisBackend::connect(&url).await.map(drop);
    assert!(
        matches!(&refused, Err(LockError::InvalidOptions { reason }) if reason.contains("noeviction") && reason.contains("volatile-lru")),
        "a server that may evict locks was accepted: {refused:?}"
    );
    let allowed = RedisBackend::builder(&url)
        .unwrap()
        .allow_eviction(true)
        .connect()
        .await;
    assert!(allowed.is_ok(), "{:?}", allowed.map(drop));
    let from_url = Locker::connect(&format!("{url}/?allow_eviction=true")).await;
    assert!(from_url.is_ok(), "{:?}", from_url.map(drop));
    // Its memory unlimited, the same policy evicts nothing.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("0")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(RedisBackend::connect(&url).await.is_ok());
}

/// Sets the ACL user `dl` (password `pw`) on the server behind `raw`: every key and command,
/// and the channels `channels` says (`allchannels`, `resetchannels`, `&pattern`). Redis 7 gives a
/// new user no channel at all (`acl-pubsub-default resetchannels`).
async fn set_acl_user(raw: &mut redis::aio::MultiplexedConnection, channels: &str) {
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "dl", "on", ">pw", "~*", "+@all", channels])
        .query_async(raw)
        .await
        .unwrap();
}

/// `total_connections_received` of the server's `INFO stats`.
async fn connections_received(raw: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(raw)
        .await
        .unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("total_connections_received:"))
        .and_then(|count| count.trim().parse().ok())
        .expect("INFO stats has total_connections_received")
}

/// A user who may not use the lock channels (Redis 7's default for a new ACL user) would see
/// every hand-off to another process fail after the script granted it, and its waiters could
/// not subscribe: `connect` refuses it with a message that names the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_who_may_not_publish_on_the_lock_channels_is_refused() {
    let redis = Redis::start();
    let mut raw = redis.raw().await;
    set_acl_user(&mut raw, "resetchannels").await;
    let url = format!("redis://dl:pw@127.0.0.1:{}", redis.server.port());
    let refused = RedisBackend::connect(&url).await.map(drop);
    assert!(
        matches!(&refused, Err(LockError::InvalidOptions { reason }) if reason.contains("&dlock:*") && reason.contains("allchannels")),
        "a user who may not publish on the lock channels was accepted, or the error names no fix: {refused:?}"
    );
    assert!(!format!("{refused:?}").contains("pw@"), "{refused:?}");
    // The prefix's channels granted, it connects.
    set_acl_user(&mut raw, "&dlock:*").await;
    let granted = RedisBackend::connect(&url).await;
    assert!(granted.is_ok(), "{:?}", granted.map(drop));

    // And with the prefix's channels alone, a release hands the key to a waiter of another
    // process: its message goes out on a channel the user may publish on.
    let holding = Locker::connect(&url).await.unwrap();
    let waiting = Locker::connect(&url).await.unwrap();
    let key = unique_key("acl-hand-off");
    let holder = holding.lock(&*key, LockOptions::new()).await.unwrap();
    let waiter = spawn_lock(
        &waiting,
        &key,
        LockOptions::new().wait(Duration::from_secs(30)),
    );
    crate::wait_for_queue_length(&mut raw, &redis.names.queue_key(&key), 1).await;
    waiters_channel(&mut raw).await;
    let released = holder.release().await;
    assert!(
        released.is_ok(),
        "a release to a waiter of another process failed under `&dlock:*`: {released:?}"
    );
    let lease = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter never got the key")
        .unwrap()
        .unwrap();
    lease.release().await.unwrap();
}

/// A waiter whose SUBSCRIBE the server refuses (its user lost the channels after `connect`)
/// waits on its timer: it neither reconnects nor polls in a loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_refused_subscribe_backs_off_instead_of_reconnecting_in_a_loop() {
    let redis = Redis::start();
    let mut raw = redis.raw().await;
    set_acl_user(&mut raw, "allchannels").await;
    let url = format!("redis://dl:pw@127.0.0.1:{}", redis.server.port());
    let waiting = Locker::connect(&url).await.unwrap();
    let holding = locker_on(&redis.server).await;
    let key = unique_key("refused-subscribe");
    let holder = holding
        .lock(&*key, LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    set_acl_user(&mut raw, "resetchannels").await;
    let before = connections_received(&mut raw).await;
    let waited = waiting
        .lock(&*key, LockOptions::new().wait(Duration::from_secs(3)))
        .await
        .map(drop);
    let opened = connections_received(&mut raw).await - before;
    eprintln!("connections opened while waiting 3 s: {opened}");
    assert!(matches!(waited, Err(LockError::Busy { .. })), "{waited:?}");
    assert!(
        opened <= 5,
        "a waiter refused SUBSCRIBE opened {opened} connections in 3 s"
    );
    holder.release().await.unwrap();
}

/// The ids of the server's pub/sub clients.
async fn pub_sub_clients(raw: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    let list: String = redis::cmd("CLIENT")
        .arg(&["LIST", "TYPE", "pubsub"])
        .query_async(raw)
        .await
        .unwrap();
    list.lines()
        .filter_map(|line| line.split(' ').next())
        .map(str::to_owned)
        .collect()
}

/// A pub/sub connection that goes silent without closing (a NAT that forgot it, a peer gone
/// without a word) would leave the waiters deaf for good, woken by their timers only: a PING
/// notices it, and the waiters subscribe on a new one. A healthy one is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_pub_sub_connection_is_noticed_and_replaced() {
    let redis = Redis::start();
    let (proxy, proxied) = FaultProxy::in_front_of(&redis.server.url());
    // Short timeouts: a connection silent for a few of them is pinged.
    let timeout = Duration::from_millis(500);
    let backend = RedisBackend::builder(&proxied)
        .unwrap()
        .connect_timeout(timeout)
        .response_timeout(timeout)
        .connect()
        .await
        .unwrap();
    let waiting = Locker::with_backend(backend);
    let direct = locker_on(&redis.server).await;
    let key = unique_key("silent-pub-sub");
    let holder = direct
        .lock(&*key, LockOptions::new().ttl(Duration::from_secs(60)))
        .await
        .unwrap();
    let waiter = spawn_lock(
        &waiting,
        &key,
        LockOptions::new().wait(Duration::from_secs(60)),
    );
    let mut raw = redis.raw().await;
    let channel = waiters_channel(&mut raw).await;
    wait_for_subscribers(&mut raw, &channel, 1).await;
    let subscriber = pub_sub_clients(&mut raw).await;
    assert_eq!(subscriber.len(), 1, "{subscriber:?}");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        pub_sub_clients(&mut raw).await,
        subscriber,
        "a healthy pub/sub connection was replaced"
    );

    // The pub/sub connection, the last one the waiting backend opened, goes silent; the server
    // still counts it a subscriber.
    proxy.stall_newest(Direction::Both);
    wait_for_subscribers(&mut raw, &channel, 2).await;
    holder.release().await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter never got the key")
        .unwrap()
        .unwrap();
    lease.release().await.unwrap();
    proxy.resume(Direction::Both);
}
