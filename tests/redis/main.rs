//! The lock's properties on the Redis backend, and what only a real server can show. Every test
//! runs its own `redis-server` on a free port. By topic: [`leases`] (lost updates, losses seen
//! in time, cancelled calls), [`fencing`] (fences across restarts and expired counters),
//! [`queue`] (waiters queueing, giving up, woken), [`handoff`] (a release handing the key to a
//! waiter), [`oom`] (releases on a server out of memory), [`connection`] (restarts, AUTH, TLS,
//! runtimes, a server that hangs) and [`cost`] (round trips and commands a call costs the
//! server).

// The support every test crate shares, one directory up.
#[path = "../support/mod.rs"]
mod support;

mod connection;
mod cost;
mod fencing;
mod handoff;
mod late_copies;
mod leases;
mod oom;
mod queue;

use std::time::{Duration, Instant};

use dlock::backend::RedisBackend;
use dlock::{Lease, LockError, LockOptions, Locker};
use redis::AsyncCommands;
use support::redis_server::RedisServer;

/// A private server, and a raw client on it for meddling from outside.
struct Redis {
    server: RedisServer,
    names: RedisBackend,
}

impl Redis {
    fn start() -> Redis {
        let server = RedisServer::start();
        // Only for the key names: no I/O.
        let names = RedisBackend::builder(&server.url())
            .unwrap()
            .build()
            .unwrap();
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

/// The owner's line of a lock's value (the owner, marked `-` where nobody queued since its
/// grant): the holder's description follows it on a line of its own.
fn owner_line(stored: &str) -> &str {
    stored.split('\n').next().unwrap_or_default()
}

/// A `Locker` of its own on `server`, as another process would have.
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

/// Waits until the waiters' queue `queue` is `length` long (fails after 10 s): a waiter has
/// queued, or left, for sure.
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

/// The channel the one waiting backend on this test's server listens on (each backend has one;
/// a test's server is its own), once it is subscribed (fails after 10 s).
async fn waiters_channel(raw: &mut redis::aio::MultiplexedConnection) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .arg("*waiters:*")
            .query_async(raw)
            .await
            .unwrap();
        match channels.as_slice() {
            [channel] => return channel.clone(),
            [] => {}
            more => panic!("more than one backend listens: {more:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "no backend's channel is subscribed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `count` connections subscribe to `channel` (fails after 10 s).
async fn wait_for_subscribers(
    raw: &mut redis::aio::MultiplexedConnection,
    channel: &str,
    count: u64,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, now): (String, u64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query_async(raw)
            .await
            .unwrap();
        if now == count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "channel {channel} has {now} subscribers, expected {count}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
