//! What holding a lease on Redis guarantees: no update lost across lockers, a lease lost to a
//! dead server or a deleted key seen in time, and no lease left behind by a cancelled call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{distributed_lock, LockError, LockOptions, Locker, Owner};
use redis::AsyncCommands;

use crate::support::redis_server::RedisServer;
use crate::support::unique_key;
use crate::{locker_on, Redis};

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
/// Redis keeps a lease for whole milliseconds. A ttl with a fraction of one, cut down to the
/// milliseconds below it, would expire on the server before its holder stops trusting it
/// (1.99 ms becomes 1 ms, trusted for 1.79 ms), and a rival could take the key meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_with_a_fraction_of_a_millisecond_is_never_trusted_past_the_server_s_expiry() {
    let redis = Redis::start();
    let holder = locker_on(&redis.server).await;
    let rival = locker_on(&redis.server).await;
    let options = LockOptions::new()
        .ttl(Duration::from_micros(1_990))
        .renew(false);
    // Both connections made before anything is timed.
    drop(holder.lock(unique_key("warm"), options).await.unwrap());
    drop(rival.lock(unique_key("warm"), options).await.unwrap());
    for _ in 0..20 {
        let key = unique_key("fraction");
        let lease = holder.lock(&*key, options).await.unwrap();
        let second = loop {
            match rival.lock(&*key, options).await {
                Ok(second) => break second,
                Err(LockError::Busy { .. }) => continue,
                Err(error) => panic!("{error}"),
            }
        };
        assert!(
            !lease.is_held(),
            "two holders: the rival got the key (fence {}) while the first lease (fence {}) \
             was still trusted",
            second.fence(),
            lease.fence()
        );
    }
}

/// A lease's hold sets the lock's expiry exactly, sooner or later; a renewal after it (one held
/// up on its way while the lease was released) neither shortens it nor renews the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_never_shortens_the_expiry_a_hold_set() {
    use dlock::backend::{AcquireRequest, Backend, Renewal};

    let redis = Redis::start();
    let backend = crate::support::Store::backend(&redis).await;
    let mut raw = redis.raw().await;
    let (key, owner) = (unique_key("held-on"), Owner::random());
    let ttl = Duration::from_secs(30);
    let request = AcquireRequest::new(&key, owner, ttl, Duration::ZERO);
    backend.acquire(&request).await.unwrap().expect("free");
    let pttl = |raw: &mut redis::aio::MultiplexedConnection| {
        let lock = redis.names.lock_key(&key);
        let mut raw = raw.clone();
        async move { raw.pttl::<_, i64>(lock).await.unwrap() }
    };
    assert!(backend
        .expire_after(&key, owner, Duration::from_secs(120))
        .await
        .unwrap());
    assert!(pttl(&mut raw).await > 110_000);
    assert_eq!(
        backend
            .renew(&[Renewal::new(&key, owner, ttl)])
            .await
            .unwrap(),
        [false],
        "a lease whose hold was set is released: not renewed"
    );
    let after_renewal = pttl(&mut raw).await;
    assert!(
        after_renewal > 110_000,
        "a renewal cut the hold's expiry to {after_renewal} ms"
    );
    // Sooner: the hold's expiry is exact.
    assert!(backend
        .expire_after(&key, owner, Duration::from_secs(5))
        .await
        .unwrap());
    assert!(pttl(&mut raw).await <= 5_000);
    assert!(!backend
        .expire_after(&key, Owner::random(), Duration::from_secs(60))
        .await
        .unwrap());
}

/// A renewal sent before the lease's release and held up on its way past the watchdog's wait
/// (a copy a connection sent again after a time-out, the first still on its way; on a cluster, a
/// slot's call given up on while the client kept trying it) lands after the hold set the lock's
/// expiry to the hold's end. It must not stretch that end to a whole ttl: the key would be held
/// for nobody for 30 s, and a job due at the end of the hold window skipped. Replayed here by
/// hand: the renew script, with the keys and arguments a plain renewal of the owner sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_renewal_copy_does_not_stretch_a_hold() {
    use dlock::backend::{AcquireRequest, Backend};

    let redis = Redis::start();
    let backend = crate::support::Store::backend(&redis).await;
    let mut raw = redis.raw().await;
    let (key, owner) = (unique_key("late-renewal"), Owner::random());
    let ttl = Duration::from_secs(30);
    let request = AcquireRequest::new(&key, owner, ttl, Duration::ZERO);
    backend.acquire(&request).await.unwrap().expect("free");
    let lock_key = redis.names.lock_key(&key);
    let hold = Duration::from_millis(300);
    assert!(backend.expire_after(&key, owner, hold).await.unwrap());

    // The late copy: KEYS the lock; ARGV the owner and the ttl in ms, as a renewal sends them.
    let renewed: i64 = redis::cmd("EVAL")
        .arg(include_str!(
            "../../dlock-runtime/src/backend/redis/renew.lua"
        ))
        .arg(1)
        .arg(&lock_key)
        .arg(owner.to_string())
        .arg(ttl.as_millis() as u64)
        .query_async(&mut raw)
        .await
        .unwrap();
    let pttl: i64 = raw.pttl(&lock_key).await.unwrap();
    assert!(
        pttl <= hold.as_millis() as i64,
        "a late renewal stretched the hold to {pttl} ms (renewal answered {renewed})"
    );
    assert_eq!(renewed, 0, "a lease whose hold was set is not renewed");
    let started = Instant::now();
    while raw.exists::<_, bool>(&lock_key).await.unwrap() {
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "the key outlived its hold (PTTL {} ms)",
            raw.pttl::<_, i64>(&lock_key).await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Redis has no readers yet: a read acquisition is refused before anything is sent. On a built
/// backend whose server does not exist, any I/O would fail as a store error; on a real server,
/// nothing of the refused call is left, and the key is free for a plain lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_acquisition_is_refused_before_any_io() {
    let read = LockOptions::new().mode(dlock::Mode::Read);
    let nowhere = dlock::backend::RedisBackend::builder("redis://127.0.0.1:1")
        .unwrap()
        .build()
        .unwrap();
    let refused = Locker::with_backend(nowhere).lock("catalog", read).await;
    assert!(
        matches!(refused, Err(LockError::Unsupported { .. })),
        "{refused:?}"
    );
    let redis = Redis::start();
    let locker = locker_on(&redis.server).await;
    let key = unique_key("read-refused");
    let refused = locker.lock(&*key, read).await;
    assert!(
        matches!(refused, Err(LockError::Unsupported { .. })),
        "{refused:?}"
    );
    let mut raw = redis.raw().await;
    // The server is shared with the binary's other tests: only this key's are looked for.
    let keys: Vec<String> = raw.keys(format!("*{key}*")).await.unwrap();
    assert!(keys.is_empty(), "{keys:?}");
    let _writer = locker.lock(&*key, LockOptions::new()).await.unwrap();
}
