//! What a call costs the Redis server: renewals pipelined into one round trip, a fixed set of
//! commands for an uncontended acquire and release, and nothing at all for a key over the limit.

use std::time::{Duration, Instant};

use dlock::backend::{AcquireRequest, Backend, RedisBackend, Renewal};
use dlock::{LockError, LockOptions, Owner};
use redis::AsyncCommands;

use crate::support::fault_proxy::{Direction, FaultProxy};
use crate::support::redis_commands::{command_counts, commands, commands_between, script_runs};
use crate::support::redis_server::RedisServer;
use crate::support::{lock_and_release, unique_key};
use crate::{locker_on, Redis};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewing_many_leases_is_one_round_trip() {
    const LEASES: usize = 50;
    let server = RedisServer::start();
    let (proxy, url) = FaultProxy::in_front_of(&server.url());
    let backend = RedisBackend::connect(&url).await.unwrap();
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
    let scripts_before = script_runs(&mut raw).await;
    // What the client sends: a pipeline is one chunk, N requests one at a time are N.
    let chunks_before = proxy.chunks(Direction::ToServer);
    let held = backend.renew(&renewals).await.unwrap();
    let chunks = proxy.chunks(Direction::ToServer) - chunks_before;
    assert_eq!(held, vec![true; LEASES]);
    assert_eq!(
        script_runs(&mut raw).await - scripts_before,
        LEASES as u64,
        "every lease was renewed on the server"
    );
    assert!(chunks >= 1, "the renewals never went through the proxy");
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

/// An uncontended acquire and release cost the server a fixed set of eight commands, as Redis
/// counts them: two script runs and the six commands they make — no queue probe in the release,
/// no `WAIT` and nothing else unless a backend option asks for it (`min_replicas` is 0 by
/// default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_acquire_and_release_run_eight_commands() {
    let redis = Redis::start();
    let mut raw = redis.raw().await;
    let locker = locker_on(&redis.server).await;
    // The first pair connects and teaches the server the scripts.
    lock_and_release(&locker, "warm-up", LockOptions::new()).await;
    for round in 0..3 {
        let key = unique_key("commands");
        let before = command_counts(&mut raw).await;
        lock_and_release(&locker, &key, LockOptions::new()).await;
        let ran = commands_between(&before, &command_counts(&mut raw).await);
        let expected = commands(&[
            // acquire: EXISTS of the lock, queue and cancel marker; TIME; one SET … GET of the
            // counter; SET of the lock (marked: nobody waits). release: GET of the lock, DEL.
            ("del", 1),
            ("evalsha", 2),
            ("exists", 1),
            ("get", 1),
            ("set", 2),
            ("time", 1),
        ]);
        assert_eq!(ran, expected, "round {round}");
        assert_eq!(ran.iter().map(|(_, n)| n).sum::<u64>(), 8, "round {round}");
    }
}

/// A key too long for the backend's bound fails at once with `InvalidKey`, naming the limit,
/// rather than sending it to the server three times a call; a key at the bound works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_longer_than_the_limit_is_an_invalid_key_error() {
    let redis = Redis::start();
    let locker = locker_on(&redis.server).await;
    let limit = dlock::backend::REDIS_MAX_KEY_BYTES;
    let longest = "k".repeat(limit);
    lock_and_release(&locker, &longest, LockOptions::new()).await;
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
    // Whatever the refused calls queued has reached the server once shutdown returns.
    locker.shutdown().await.unwrap();
    let keys: Vec<String> = redis.raw().await.keys("*").await.unwrap();
    assert!(
        keys.iter().all(|key| key.len() < 2 * limit),
        "a key over the limit reached the server"
    );
}
