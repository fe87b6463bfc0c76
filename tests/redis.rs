//! The lock's properties on the Redis backend, and what only a real server can show: lost updates,
//! restarts, AUTH, the queue, round trips. Every test runs its own `redis-server` on a free port.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backend::{AcquireRequest, Backend, RedisBackend, Renewal};
use dlock::{distributed_lock, Lease, LockError, LockOptions, Locker, Owner};
use redis::AsyncCommands;
use support::redis_server::RedisServer;
use support::unique_key;

/// A private server, and a raw client on it for meddling from outside.
struct Redis {
    server: RedisServer,
    names: RedisBackend,
}

impl Redis {
    fn start() -> Redis {
        let server = RedisServer::start();
        // Only for the key names: no I/O.
        let names = RedisBackend::builder(server.url()).build().unwrap();
        Redis { server, names }
    }

    async fn raw(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

impl support::Store for Redis {
    type Backend = RedisBackend;

    async fn backend(&self) -> RedisBackend {
        RedisBackend::connect(&self.server.url()).await.unwrap()
    }

    async fn take_away(&self, key: &str) {
        support::redis_server::steal_lock(&mut self.raw().await, &self.names.lock_key(key)).await;
    }

    async fn expire(&self, key: &str) {
        support::redis_server::delete_lock(&mut self.raw().await, &self.names.lock_key(key)).await;
    }
}

lock_properties!(Redis::start());

async fn locker_on(server: &RedisServer) -> Locker {
    Locker::connect(&server.url()).await.unwrap()
}

/// `locker.lock(key, options)` in a task of its own, as another caller would.
fn spawn_lock(
    locker: &Locker,
    key: &str,
    options: LockOptions,
) -> tokio::task::JoinHandle<Result<Lease, LockError>> {
    let (locker, key) = (locker.clone(), key.to_owned());
    tokio::spawn(async move { locker.lock(&*key, options).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_update_is_lost_across_lockers() {
    let redis = Redis::start();
    let key = unique_key("counter-lock");
    let counter = unique_key("counter");
    const INCREMENTS: u64 = 1_500;
    const TASKS: u64 = 3 * 8;
    let mut tasks = Vec::new();
    for _ in 0..3 {
        // Three separate clients, as three processes would have.
        let locker = locker_on(&redis.server).await;
        for _ in 0..8 {
            let share = INCREMENTS / TASKS + u64::from((tasks.len() as u64) < INCREMENTS % TASKS);
            let (locker, key, counter, mut raw) = (
                locker.clone(),
                key.clone(),
                counter.clone(),
                redis.raw().await,
            );
            tasks.push(tokio::spawn(async move {
                for _ in 0..share {
                    let lease = locker
                        .lock(
                            &*key,
                            LockOptions::new()
                                .ttl(Duration::from_secs(10))
                                .wait(Duration::from_secs(120)),
                        )
                        .await?;
                    // Read, yield, write back: without the lock, increments would overwrite each other.
                    let value: Option<u64> = raw.get(&counter).await.unwrap();
                    tokio::task::yield_now().await;
                    let () = raw.set(&counter, value.unwrap_or(0) + 1).await.unwrap();
                    lease.release().await?;
                }
                Ok::<_, LockError>(())
            }));
        }
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let total: u64 = redis.raw().await.get(&counter).await.unwrap();
    assert_eq!(total, INCREMENTS, "increments were lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_call_after_a_server_restart_succeeds() {
    let mut server = RedisServer::start();
    let locker = locker_on(&server).await;
    let key = unique_key("restart");
    locker
        .lock(&*key, LockOptions::new())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
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
async fn fences_keep_rising_when_a_restart_loses_the_counter() {
    let mut server = RedisServer::start(); // no persistence: a restart forgets every key
    let locker = locker_on(&server).await;
    let key = unique_key("fence-restart");
    let mut fences = Vec::new();
    for _ in 0..3 {
        let lease = locker.lock(&*key, LockOptions::new()).await.unwrap();
        fences.push(lease.fence());
        lease.release().await.unwrap();
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

#[distributed_lock(key = "<key>", ttl = "3s", locker = locker)]
async fn works_for_a_while(
    locker: &Locker,
    key: &str,
    started: &AtomicBool,
) -> Result<(), LockError> {
    started.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(30)).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_while_held_cancels_the_body_before_the_ttl_ends() {
    let mut server = RedisServer::start();
    let locker = locker_on(&server).await;
    let key = unique_key("killed");
    let started = Arc::new(AtomicBool::new(false));
    let called_at = Instant::now();
    let call = tokio::spawn({
        let (locker, key, started) = (locker.clone(), key.clone(), started.clone());
        async move { works_for_a_while(&locker, &key, &started).await }
    });
    while !started.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.stop();
    let result = tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .expect("the body was not cancelled")
        .unwrap();
    let elapsed = called_at.elapsed();
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    // The server would have let the lease expire 3 s after it granted it, which was after the call.
    assert!(
        elapsed < Duration::from_secs(3),
        "the body ran on for {elapsed:?}, past the ttl"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_deleted_from_outside_is_lost_at_the_next_renewal() {
    let redis = Redis::start();
    let locker = locker_on(&redis.server).await;
    let key = unique_key("deleted");
    let ttl = Duration::from_secs(6);
    let lease = locker
        .lock(&*key, LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let acquired_at = Instant::now();
    let deleted: u64 = redis
        .raw()
        .await
        .del(redis.names.lock_key(&key))
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    tokio::time::timeout(Duration::from_secs(20), lease.lost())
        .await
        .expect("the loss was never seen");
    let seen_after = acquired_at.elapsed();
    // Renewals run every 2 s; on its own the lease would run out of validity only at 5.4 s.
    assert!(
        seen_after < Duration::from_millis(4_500),
        "loss seen after {seen_after:?}: not at a renewal"
    );
    assert!(!lease.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_through_the_url_and_a_wrong_password_is_a_clear_error() {
    let server = RedisServer::start_with_password("s3cret-pw");
    let locker = Locker::connect(&server.url())
        .await
        .expect("the right password was refused");
    let key = unique_key("auth");
    locker
        .lock(&*key, LockOptions::new())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_waiter_leaves_the_queue() {
    let redis = Redis::start();
    // A long liveness window: a waiter that failed to leave would block the next one for 30 s.
    let backend = RedisBackend::builder(redis.server.url())
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

async fn wait_for_queue_length(
    raw: &mut redis::aio::MultiplexedConnection,
    queue: &str,
    length: u64,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now: u64 = raw.llen(queue).await.unwrap();
        if now == length {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "queue {queue} has {now} waiters, expected {length}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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

/// A TCP proxy in front of the server that counts the chunks clients send: a pipeline is one
/// chunk, N sequential requests are N.
struct CountingProxy {
    port: u16,
    chunks: Arc<AtomicU64>,
}

impl CountingProxy {
    async fn start(target_port: u16) -> CountingProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let chunks = Arc::new(AtomicU64::new(0));
        let counted = chunks.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = tokio::net::TcpStream::connect(("127.0.0.1", target_port))
                    .await
                    .unwrap();
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let counted = counted.clone();
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buffer = vec![0u8; 1 << 20];
                    while let Ok(n) = client_read.read(&mut buffer).await {
                        if n == 0 || server_write.write_all(&buffer[..n]).await.is_err() {
                            break;
                        }
                        counted.fetch_add(1, Ordering::SeqCst);
                    }
                });
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                });
            }
        });
        CountingProxy { port, chunks }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewing_many_leases_is_one_round_trip() {
    const LEASES: usize = 50;
    let server = RedisServer::start();
    let proxy = CountingProxy::start(server.port()).await;
    let backend = RedisBackend::connect(&format!("redis://127.0.0.1:{}", proxy.port))
        .await
        .unwrap();
    let keys: Vec<String> = (0..LEASES)
        .map(|i| unique_key(&format!("renew-{i}")))
        .collect();
    let owners: Vec<Owner> = keys.iter().map(|_| Owner::random()).collect();
    let ttl = Duration::from_secs(60);
    for (key, owner) in keys.iter().zip(&owners) {
        let acquired = backend
            .acquire(&AcquireRequest::new(key, *owner, ttl, Duration::ZERO))
            .await
            .unwrap();
        assert!(acquired.is_some());
    }
    let renewals: Vec<Renewal<'_>> = keys
        .iter()
        .zip(&owners)
        .map(|(key, owner)| Renewal::new(key, *owner, ttl))
        .collect();
    // The first renewal may have to teach the server the script.
    assert!(backend
        .renew(&renewals)
        .await
        .unwrap()
        .into_iter()
        .all(|held| held));

    let mut raw = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let calls_before = evalsha_calls(&mut raw).await;
    let chunks_before = proxy.chunks.load(Ordering::SeqCst);
    let held = backend.renew(&renewals).await.unwrap();
    let chunks = proxy.chunks.load(Ordering::SeqCst) - chunks_before;
    assert_eq!(held, vec![true; LEASES]);
    assert_eq!(
        evalsha_calls(&mut raw).await - calls_before,
        LEASES as u64,
        "every lease was renewed on the server"
    );
    assert!(
        chunks <= 2,
        "{LEASES} renewals took {chunks} sends, not one pipelined round trip"
    );

    // A lease that is no longer its owner's is answered as such, in the same batch.
    let () = raw
        .set(backend.lock_key(&keys[7]), "a-stranger")
        .await
        .unwrap();
    let held = backend.renew(&renewals).await.unwrap();
    assert_eq!(held.iter().filter(|held| !**held).count(), 1);
    assert!(!held[7]);
}

async fn evalsha_calls(raw: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(raw)
        .await
        .unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
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
    let backend = RedisBackend::builder(server.url())
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresponsive_server_is_an_error_not_a_hang() {
    // Accepts connections and never says a word.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            held.push(stream);
        }
    });
    let url = format!("redis://127.0.0.1:{port}");
    let timeout = Duration::from_millis(500);
    let started = Instant::now();
    let connected = RedisBackend::builder(&url)
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

/// One hand-off from a holder on `holder_locker` to a waiter on `waiter_locker`: the waiter's
/// lease, the holder's fence, how many scripts the server ran from the release until the
/// waiter's return, and how long after the waiter queued it returned.
async fn hand_off_once(
    redis: &Redis,
    holder_locker: &Locker,
    waiter_locker: &Locker,
    ttl: Duration,
) -> (dlock::Lease, u64, u64, Duration) {
    let mut raw = redis.raw().await;
    let key = unique_key("handed-off");
    let holder = holder_locker
        .lock(&*key, LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let holder_fence = holder.fence();
    let waiting = LockOptions::new().ttl(ttl).wait(Duration::from_secs(30));
    let waiter = spawn_lock(waiter_locker, &key, waiting);
    wait_for_queue_length(&mut raw, &redis.names.queue_key(&key), 1).await;
    let queued_at = Instant::now();
    let scripts_before = script_calls(&mut raw).await;
    holder.release().await.unwrap();
    let lease = waiter.await.unwrap().unwrap();
    let returned_after = queued_at.elapsed();
    let scripts = script_calls(&mut raw).await - scripts_before;
    (lease, holder_fence, scripts, returned_after)
}

/// Runs of a script (`EVALSHA` and `EVAL`) on the server so far.
async fn script_calls(raw: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(raw)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            line.strip_prefix("cmdstat_evalsha:calls=")
                .or_else(|| line.strip_prefix("cmdstat_eval:calls="))
        })
        .filter_map(|rest| rest.split(',').next())
        .map(|calls| calls.parse::<u64>().unwrap())
        .sum()
}

/// A release hands the lock to the first waiter for its claim window, with a fresh fence; the
/// waiter, woken, claims it with one round trip and holds it for its full ttl — whether it
/// waits on the releasing backend (woken in-process) or on another one (woken by the published
/// message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_off_lease_is_claimed_with_one_round_trip_for_its_full_ttl() {
    let redis = Redis::start();
    let ttl = Duration::from_secs(60);
    let holder_locker = locker_on(&redis.server).await;
    let other_locker = locker_on(&redis.server).await;
    // Teaches the server both scripts, so that each run below is one EVALSHA.
    for locker in [&holder_locker, &other_locker] {
        let (lease, ..) = hand_off_once(&redis, locker, locker, ttl).await;
        lease.release().await.unwrap();
    }
    for (waiter_locker, how) in [
        (&holder_locker, "a waiter of the releasing locker"),
        (&other_locker, "a waiter of another locker"),
    ] {
        // A waiter's first fallback poll comes at least 187 ms after it queued; a hand-off that
        // took longer than that (a loaded machine) may have been found by that poll: run again.
        let mut attempts = 0;
        let (lease, holder_fence, scripts) = loop {
            attempts += 1;
            let (lease, holder_fence, scripts, returned_after) =
                hand_off_once(&redis, &holder_locker, waiter_locker, ttl).await;
            if returned_after < Duration::from_millis(150) || attempts == 5 {
                break (lease, holder_fence, scripts);
            }
            lease.release().await.unwrap();
        };
        assert!(lease.is_held(), "{how}: the handed-off lease is not held");
        assert!(
            lease.fence() > holder_fence,
            "{how}: fence {} after the holder's {holder_fence}",
            lease.fence()
        );
        assert_eq!(
            scripts, 2,
            "{how}: the server ran {scripts} scripts for the hand-off, not the release and the claim"
        );
        // Claimed: the server holds the key for the waiter's full ttl, not the claim window.
        let mut raw = redis.raw().await;
        let lock_key = redis.names.lock_key(lease.key());
        let holder: String = raw.get(&lock_key).await.unwrap();
        assert_eq!(holder, lease.owner().to_string(), "{how}");
        let pttl: i64 = raw.pttl(&lock_key).await.unwrap();
        assert!(
            pttl > 50_000,
            "{how}: the handed-off key expires in {pttl} ms"
        );
        lease.release().await.unwrap();
    }
}

/// A waiter handed the lock while its runtime stalls (for less than its claim window) claims it
/// once it runs again: its lease counts from the claim, not from its last look at the key, and
/// the server holds the key for its full ttl.
#[test]
fn a_waiter_that_stalls_after_its_hand_off_claims_it_once_it_runs() {
    let redis = Redis::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let ttl = Duration::from_secs(2);
    let key = unique_key("stalled-waiter");
    let holder_backend = runtime
        .block_on(RedisBackend::connect(&redis.server.url()))
        .unwrap();
    let holder = Owner::random();
    let holder_fence = runtime
        .block_on(holder_backend.acquire(&AcquireRequest::new(
            &key,
            holder,
            Duration::from_secs(60),
            Duration::ZERO,
        )))
        .unwrap()
        .expect("the key was busy")
        .fence;

    // The waiter, on a current-thread runtime of its own, which a second task can stall.
    let (stall_tx, stall_rx) = tokio::sync::oneshot::channel::<()>();
    let (stalling_tx, stalling_rx) = std::sync::mpsc::channel::<()>();
    let waiter_owner = Owner::random();
    let waiter = std::thread::spawn({
        let (url, key) = (redis.server.url(), key.clone());
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let backend = RedisBackend::connect(&url).await.unwrap();
                tokio::spawn(async move {
                    if stall_rx.await.is_ok() {
                        stalling_tx.send(()).unwrap();
                        // Blocks the runtime, waiter and all, for 0.6 ttl: within the claim
                        // window (the ttl, shorter than the liveness window).
                        std::thread::sleep(Duration::from_millis(1_200));
                    }
                });
                let request = AcquireRequest::new(&key, waiter_owner, ttl, Duration::from_secs(30));
                let acquired = backend.acquire(&request).await;
                (acquired, Instant::now())
            })
        }
    });

    runtime.block_on(async {
        let mut raw = redis.raw().await;
        wait_for_queue_length(&mut raw, &redis.names.queue_key(&key), 1).await;
        stall_tx.send(()).unwrap();
        stalling_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the waiter's runtime did not stall");
        let released_at = Instant::now();
        assert!(holder_backend.release(&key, holder).await.unwrap());
        let (acquired, returned_at) = tokio::task::spawn_blocking(move || waiter.join().unwrap())
            .await
            .unwrap();
        let acquired = acquired
            .unwrap()
            .expect("the waiter was not handed the key");
        assert!(acquired.fence > holder_fence, "{acquired:?}");
        assert!(
            acquired.valid_from >= released_at,
            "the lease counts from {:?} before the release, from the waiter's last look: \
             it was not claimed",
            released_at - acquired.valid_from
        );
        let left = (acquired.valid_from + ttl - ttl / 10).saturating_duration_since(returned_at);
        assert!(left >= ttl / 2, "only {left:?} of validity left");
        // Claimed on the server too: the key is the waiter's, extended to its full ttl.
        let lock_key = redis.names.lock_key(&key);
        let stored: String = raw.get(&lock_key).await.unwrap();
        assert_eq!(stored, waiter_owner.to_string());
        let pttl: i64 = raw.pttl(&lock_key).await.unwrap();
        assert!(pttl > 1_500, "the key expires in {pttl} ms");
    });
}

/// A waiter whose process died while it waited in the queue (nothing polls its future again,
/// nothing drops it) is handed the key by the holder's release all the same. The hand-off is a
/// grant for the waiter's claim window only, which the dead waiter never claims: the next
/// caller gets the key within that window, not after the dead waiter's ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_to_a_waiter_that_died_lapses_after_its_claim_window() {
    let redis = Redis::start();
    let window = Duration::from_secs(1);
    let holder_locker = locker_on(&redis.server).await;
    let doomed_locker = Locker::with_backend(
        RedisBackend::builder(redis.server.url())
            .waiter_liveness(window)
            .connect()
            .await
            .unwrap(),
    );
    let key = unique_key("dead-waiter");
    let holder = holder_locker
        .lock(&*key, LockOptions::new().ttl(Duration::from_secs(60)))
        .await
        .unwrap();
    let mut doomed = Box::pin({
        let (locker, key) = (doomed_locker.clone(), key.clone());
        async move {
            let waiting = LockOptions::new()
                .ttl(Duration::from_secs(30))
                .wait(Duration::from_secs(60));
            locker.lock(&*key, waiting).await
        }
    });
    let mut raw = redis.raw().await;
    let queue = redis.names.queue_key(&key);
    tokio::select! {
        result = &mut doomed => panic!("the waiter did not queue: {result:?}"),
        () = wait_for_queue_length(&mut raw, &queue, 1) => {}
    }
    // The waiter's process dies: its future is neither polled again nor dropped.
    std::mem::forget(doomed);
    holder.release().await.unwrap();
    let granted_for: i64 = raw.pttl(redis.names.lock_key(&key)).await.unwrap();
    let started = Instant::now();
    let next = holder_locker
        .lock(&*key, LockOptions::new().wait(Duration::from_secs(8)))
        .await;
    let waited = started.elapsed();
    assert!(
        next.is_ok() && waited < window + Duration::from_millis(1_500),
        "the next caller got {next:?} after {waited:?}; the key was handed to the dead waiter \
         for {granted_for} ms"
    );
    assert!(
        granted_for <= window.as_millis() as i64,
        "the key was handed to the dead waiter for {granted_for} ms"
    );
}

/// Thousands of acquires, each cancelled at a random point — many while the server is busy
/// with something else (a script from another client), so that calls and their undoing pile
/// up on the server side by side: whatever reached the server is undone, and no key is left
/// held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelled_acquires_leave_no_lease_behind() {
    let redis = Redis::start();
    let locker = locker_on(&redis.server).await;
    const ROUNDS: usize = 100;
    const CALLS: usize = 50;
    let prefix = unique_key("cancelled");
    let key = |round: usize, call: usize| format!("{prefix}-{round}-{call}");
    let mut busy = redis.raw().await;
    // Keeps the server busy for 20 ms.
    let stall = redis::Script::new(
        "local t = redis.call('TIME') local from = t[1] * 1000000 + t[2] \
         repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - from > 20000 return 1",
    );
    let mut seed = Owner::random().as_u128() as u64 | 1;
    let mut cancelled = 0;
    for round in 0..ROUNDS {
        let calls: Vec<_> = (0..CALLS)
            .map(|call| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let cut = Duration::from_micros(seed % 25_000);
                let (locker, key) = (locker.clone(), key(round, call));
                tokio::spawn(async move {
                    let options = LockOptions::new().ttl(Duration::from_secs(60));
                    match tokio::time::timeout(cut, locker.lock(&*key, options)).await {
                        Ok(lease) => {
                            lease.unwrap().release().await.unwrap();
                            false
                        }
                        Err(_) => true,
                    }
                })
            })
            .collect();
        let _: i64 = stall.invoke_async(&mut busy).await.unwrap();
        for call in calls {
            cancelled += usize::from(call.await.unwrap());
        }
    }
    assert!(cancelled >= 1_000, "only {cancelled} calls were cancelled");
    // The undo of a cancelled call is queued in the background: give it a moment to run (far
    // less than the 60 s ttl a leaked lease would keep its key for).
    let locks: Vec<String> = (0..ROUNDS)
        .flat_map(|round| (0..CALLS).map(move |call| (round, call)))
        .map(|(round, call)| redis.names.lock_key(&key(round, call)))
        .collect();
    let mut raw = redis.raw().await;
    let mut held = Vec::new();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut exists = redis::pipe();
        for lock in &locks {
            exists.exists(lock);
        }
        let answers: Vec<bool> = exists.query_async(&mut raw).await.unwrap();
        held = locks
            .iter()
            .zip(answers)
            .filter(|(_, exists)| *exists)
            .map(|(lock, _)| lock.clone())
            .collect();
        if held.is_empty() {
            break;
        }
    }
    let mut ttls = Vec::new();
    for lock in held.iter().take(5) {
        ttls.push(raw.pttl::<_, i64>(lock).await.unwrap());
    }
    assert!(
        held.is_empty(),
        "{} of {cancelled} cancelled acquires left their key held (PTTL of the first: {ttls:?} \
         ms): {:?}",
        held.len(),
        &held[..held.len().min(5)]
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
        let lease = locker.lock(&**key, LockOptions::new()).await.unwrap();
        lease.release().await.unwrap();
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
    let lease = locker.lock(&*keys[0], LockOptions::new()).await.unwrap();
    assert!(
        lease.fence() > before,
        "fence {} after {before}, past an expired counter",
        lease.fence()
    );
    lease.release().await.unwrap();
}

/// A key too long for the backend's bound fails at once with `InvalidKey`, naming the limit,
/// rather than sending it to the server three times a call; a key at the bound works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_longer_than_the_limit_is_an_invalid_key_error() {
    let redis = Redis::start();
    let locker = locker_on(&redis.server).await;
    let limit = dlock::backend::REDIS_MAX_KEY_BYTES;
    let longest = "k".repeat(limit);
    let lease = locker.lock(&*longest, LockOptions::new()).await.unwrap();
    lease.release().await.unwrap();
    for length in [limit + 1, 1 << 20] {
        let started = Instant::now();
        let result = locker.lock("k".repeat(length), LockOptions::new()).await;
        let error = match result {
            Err(LockError::InvalidKey { reason, .. }) => reason,
            other => panic!(
                "a key of {length} bytes: {:?}",
                other.map(|lease| lease.key().len())
            ),
        };
        assert!(error.contains(&limit.to_string()), "{error}");
        assert!(started.elapsed() < Duration::from_millis(100));
    }
    let keys: Vec<String> = redis.raw().await.keys("*").await.unwrap();
    assert!(
        keys.iter().all(|key| key.len() < 2 * limit),
        "a key over the limit reached the server"
    );
}

/// Every command the server ran so far, by name (`INFO commandstats`; the commands a script runs
/// count too), without the `INFO` calls that read it.
async fn command_counts(
    raw: &mut redis::aio::MultiplexedConnection,
) -> std::collections::BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(raw)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_"))
        .filter_map(|line| {
            let (name, rest) = line.split_once(":calls=")?;
            let calls = rest.split(',').next()?.parse().ok()?;
            Some((name.to_owned(), calls))
        })
        .filter(|(name, _)| name != "info")
        .collect()
}

/// The commands run between two [`command_counts`].
fn commands_between(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> Vec<(String, u64)> {
    after
        .iter()
        .map(|(name, calls)| (name.clone(), calls - before.get(name).copied().unwrap_or(0)))
        .filter(|(_, calls)| *calls > 0)
        .collect()
}

/// An uncontended acquire and release cost the server a fixed set of commands: two script runs
/// and the nine commands they make — no `WAIT` and nothing else unless a backend option asks for
/// it (`min_replicas` is 0 by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_acquire_and_release_run_the_same_commands_as_ever() {
    let redis = Redis::start();
    let mut raw = redis.raw().await;
    let locker = locker_on(&redis.server).await;
    // The first pair connects and teaches the server the scripts.
    let lease = locker.lock("warm-up", LockOptions::new()).await.unwrap();
    lease.release().await.unwrap();
    for round in 0..3 {
        let key = unique_key("commands");
        let before = command_counts(&mut raw).await;
        let lease = locker.lock(&*key, LockOptions::new()).await.unwrap();
        lease.release().await.unwrap();
        let ran = commands_between(&before, &command_counts(&mut raw).await);
        let expected: Vec<(String, u64)> = [
            // acquire: EXISTS of the lock, queue and cancel marker; TIME; GET and SET of the
            // counter; SET of the lock. release: GET of the lock, LPOP of no queue, DEL.
            ("del", 1),
            ("evalsha", 2),
            ("exists", 1),
            ("get", 2),
            ("lpop", 1),
            ("set", 2),
            ("time", 1),
        ]
        .into_iter()
        .map(|(name, calls)| (name.to_owned(), calls))
        .collect();
        assert_eq!(ran, expected, "round {round}");
    }
}

/// An acquisition that timed out on a connection that hangs is not sent again on a fresh one:
/// the first copy still waits on the old connection, and had a second copy been granted and
/// released meanwhile, the first would grant the key to nobody for a whole ttl when it ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_timed_out_leaves_no_late_copy_to_grant_the_key_to_nobody() {
    use support::fault_proxy::{Direction, FaultProxy};
    let server = RedisServer::start();
    let (proxy, url) = FaultProxy::in_front_of(&server.url());
    let backend = RedisBackend::builder(url)
        .response_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let locker = Locker::with_backend(backend.clone());
    let key = unique_key("late-copy");
    // The connections exist before the stall, so it catches them.
    let warm = locker.lock(&*key, LockOptions::new()).await.unwrap();
    warm.release().await.unwrap();

    proxy.stall_open(Direction::ToServer);
    match locker.lock(&*key, LockOptions::new()).await {
        // Granted through a fresh connection: the body runs, and releases.
        Ok(lease) => lease.release().await.unwrap(),
        Err(error) => assert!(matches!(error, LockError::Backend(_)), "{error:?}"),
    }
    proxy.resume(Direction::ToServer);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut raw = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let pttl: i64 = raw.pttl(backend.lock_key(&key)).await.unwrap();
    assert_eq!(
        pttl, -2,
        "the key is held by nobody: a late copy of an acquisition granted it (PTTL {pttl} ms)"
    );
}
