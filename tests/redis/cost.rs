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

/// A release that hands the key to a waiter of another backend costs the server one script of
/// eight commands, and the waiter starts on it with no call of its own: the critical section's
/// hand-off is the release alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_is_the_release_script_alone() {
    let redis = Redis::start();
    let mut raw = redis.raw().await;
    let holder_backend = RedisBackend::connect(&redis.server.url()).await.unwrap();
    let waiter_backend = RedisBackend::connect(&redis.server.url()).await.unwrap();
    let ttl = Duration::from_secs(60);
    let mut checked = 0;
    for round in 0..8 {
        if checked == 3 {
            break;
        }
        let key = unique_key("hand-off-commands");
        let holder = Owner::random();
        let granted = holder_backend
            .acquire(&AcquireRequest::new(&key, holder, ttl, Duration::ZERO))
            .await
            .unwrap();
        assert!(granted.is_some());
        let waiter = Owner::random();
        let waiting = tokio::spawn({
            let (backend, key) = (waiter_backend.clone(), key.clone());
            async move {
                let request =
                    AcquireRequest::new(&key, waiter, ttl, Duration::from_secs(30)).renewed(true);
                backend.acquire(&request).await
            }
        });
        crate::wait_for_queue_length(&mut raw, &redis.names.queue_key(&key), 1).await;
        let queued_at = Instant::now();
        let before = command_counts(&mut raw).await;
        assert!(holder_backend.release(&key, holder).await.unwrap());
        let acquired = waiting.await.unwrap().unwrap();
        let ran = commands_between(&before, &command_counts(&mut raw).await);
        assert!(acquired.is_some(), "round {round}");
        waiter_backend.release(&key, waiter).await.unwrap();
        // The first hand-off may teach the server the script; a waiter's first fallback poll
        // comes at least 187 ms after it queued, and a loaded machine may let it run first.
        if round == 0 || queued_at.elapsed() > Duration::from_millis(150) {
            continue;
        }
        checked += 1;
        let expected = commands(&[
            // GET of the lock (unmarked: someone queued); LPOP of the queue and GETDEL of the
            // waiter's key; the grant's TIME, SET … GET of the counter and SET of the lock;
            // PUBLISH on the waiter's backend's channel.
            ("evalsha", 1),
            ("get", 1),
            ("getdel", 1),
            ("lpop", 1),
            ("publish", 1),
            ("set", 2),
            ("time", 1),
        ]);
        assert_eq!(ran, expected, "round {round}");
        assert_eq!(ran.iter().map(|(_, n)| n).sum::<u64>(), 8, "round {round}");
    }
    assert!(
        checked > 0,
        "every hand-off was slower than a fallback poll"
    );
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
