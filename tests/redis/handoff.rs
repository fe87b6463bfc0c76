//! A release on Redis hands the key to the first waiter for its claim window; the waiter claims
//! it, late if its runtime stalled, and a waiter that died lets the grant lapse.

use std::time::{Duration, Instant};

use dlock::backend::{AcquireRequest, Acquired, Backend, RedisBackend, Renewal};
use dlock::{LockOptions, Locker, Owner};
use redis::AsyncCommands;

use crate::support::redis_commands::script_runs;
use crate::support::unique_key;
use crate::{locker_on, spawn_lock, wait_for_queue_length, Redis};

/// One hand-off from `holder` to a waiter on `waiter`, both with a ttl of `ttl`: the waiter's
/// owner and grant, the holder's fence, how many scripts the server ran from the release until
/// the waiter's return, and how long after the waiter queued it returned.
async fn hand_off_once(
    redis: &Redis,
    holder: &RedisBackend,
    waiter: &RedisBackend,
    ttl: Duration,
    renewed: bool,
) -> (String, Owner, Acquired, u64, u64, Duration) {
    let mut raw = redis.raw().await;
    let key = unique_key("handed-off");
    let holder_owner = Owner::random();
    let holder_fence = holder
        .acquire(&AcquireRequest::new(
            &key,
            holder_owner,
            ttl,
            Duration::ZERO,
        ))
        .await
        .unwrap()
        .expect("the key was busy")
        .fence;
    let waiter_owner = Owner::random();
    let waiting = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        async move {
            let request = AcquireRequest::new(&key, waiter_owner, ttl, Duration::from_secs(30))
                .renewed(renewed);
            waiter.acquire(&request).await
        }
    });
    wait_for_queue_length(&mut raw, &redis.names.queue_key(&key), 1).await;
    let queued_at = Instant::now();
    let scripts_before = script_runs(&mut raw).await;
    assert!(holder.release(&key, holder_owner).await.unwrap());
    let acquired = waiting
        .await
        .unwrap()
        .unwrap()
        .expect("the waiter was not handed the key");
    let returned_after = queued_at.elapsed();
    let scripts = script_runs(&mut raw).await - scripts_before;
    (
        key,
        waiter_owner,
        acquired,
        holder_fence,
        scripts,
        returned_after,
    )
}

/// A release hands the lock to the first waiter for its claim window, with a fresh fence, and
/// the waiter starts on the release alone — one script from the release until its lease, no
/// claim call on the way — whether it waits on the releasing backend (woken in-process with the
/// release's reply) or on another one (woken by the published message, which carries the
/// grant). Its lease counts from the waiter's last call before the grant, for the claim window
/// only, so its first renewal is due within that window; it extends the key to the full ttl on
/// the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_off_lease_starts_on_the_release_alone_and_its_first_renewal_claims_the_ttl() {
    let redis = Redis::start();
    let ttl = Duration::from_secs(60);
    let holder_backend = RedisBackend::connect(&redis.server.url()).await.unwrap();
    let other_backend = RedisBackend::connect(&redis.server.url()).await.unwrap();
    // Teaches the server both scripts, so that each run below is one EVALSHA.
    for backend in [&holder_backend, &other_backend] {
        let (key, owner, ..) = hand_off_once(&redis, backend, backend, ttl, true).await;
        backend.release(&key, owner).await.unwrap();
    }
    for (waiter_backend, how) in [
        (&holder_backend, "a waiter of the releasing backend"),
        (&other_backend, "a waiter of another backend"),
    ] {
        // A waiter's first fallback poll comes at least 187 ms after it queued; a hand-off that
        // took longer than that (a loaded machine) may have been found by that poll: run again.
        let mut attempts = 0;
        let (key, owner, acquired, holder_fence, scripts) = loop {
            attempts += 1;
            let (key, owner, acquired, holder_fence, scripts, returned_after) =
                hand_off_once(&redis, &holder_backend, waiter_backend, ttl, true).await;
            if returned_after < Duration::from_millis(150) || attempts == 5 {
                break (key, owner, acquired, holder_fence, scripts);
            }
            waiter_backend.release(&key, owner).await.unwrap();
        };
        assert!(
            acquired.fence > holder_fence,
            "{how}: fence {} after the holder's {holder_fence}",
            acquired.fence
        );
        assert_eq!(
            scripts, 1,
            "{how}: the server ran {scripts} scripts for the hand-off, not the release alone"
        );
        let mut raw = redis.raw().await;
        let lock_key = redis.names.lock_key(&key);
        let fence: u64 = raw.get(redis.names.fence_key(&key)).await.unwrap();
        assert_eq!(fence, acquired.fence, "{how}: not the grant's fence");
        // Valid for now, for less than the claim window (3 s by default), and due for renewal.
        let now = Instant::now();
        let valid_until = acquired.valid_from + ttl - ttl / 10;
        assert!(valid_until > now + Duration::from_secs(1), "{how}");
        assert!(valid_until < now + Duration::from_secs(3), "{how}");
        assert!(
            acquired.valid_from + ttl / 3 <= now,
            "{how}: no renewal due"
        );
        let pttl: i64 = raw.pttl(&lock_key).await.unwrap();
        assert!(
            pttl <= 3_000,
            "{how}: the handed-off key expires in {pttl} ms"
        );
        // The first renewal claims the key for the full ttl.
        let renewed = waiter_backend
            .renew(&[Renewal::new(&key, owner, ttl)])
            .await
            .unwrap();
        assert_eq!(renewed, [true], "{how}");
        let holder: String = raw.get(&lock_key).await.unwrap();
        assert_eq!(crate::owner_line(&holder), owner.to_string(), "{how}");
        let pttl: i64 = raw.pttl(&lock_key).await.unwrap();
        assert!(pttl > 50_000, "{how}: the renewed key expires in {pttl} ms");
        waiter_backend.release(&key, owner).await.unwrap();
    }
    // A lease nobody renews would end with the claim window: that waiter claims the full ttl
    // with an acquire call instead, and its lease counts from that call.
    let (key, owner, acquired, _, scripts, _) =
        hand_off_once(&redis, &holder_backend, &other_backend, ttl, false).await;
    assert_eq!(scripts, 2, "not the release and the claim");
    assert!(acquired.valid_from + ttl / 3 > Instant::now());
    let pttl: i64 = redis
        .raw()
        .await
        .pttl(redis.names.lock_key(&key))
        .await
        .unwrap();
    assert!(pttl > 50_000, "the claimed key expires in {pttl} ms");
    other_backend.release(&key, owner).await.unwrap();
}

/// A caller of `Backend::acquire` that does not say its lease will be renewed (the request's
/// default) is handed the key for its full ttl: nothing renews a lease it did not ask to have
/// renewed, and one started on the hand-off alone would end with the claim window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_acquire_handed_the_key_holds_it_for_its_full_ttl() {
    let redis = Redis::start();
    let ttl = Duration::from_secs(60);
    let holder_backend = RedisBackend::connect(&redis.server.url()).await.unwrap();
    let waiter_backend = RedisBackend::connect(&redis.server.url()).await.unwrap();
    let mut raw = redis.raw().await;
    let key = unique_key("direct-hand-off");
    let holder = Owner::random();
    holder_backend
        .acquire(&AcquireRequest::new(&key, holder, ttl, Duration::ZERO))
        .await
        .unwrap()
        .expect("the key was busy");
    let waiter = Owner::random();
    let waiting = tokio::spawn({
        let (backend, key) = (waiter_backend.clone(), key.clone());
        async move {
            let request = AcquireRequest::new(&key, waiter, ttl, Duration::from_secs(30));
            backend.acquire(&request).await
        }
    });
    wait_for_queue_length(&mut raw, &redis.names.queue_key(&key), 1).await;
    assert!(holder_backend.release(&key, holder).await.unwrap());
    let acquired = waiting
        .await
        .unwrap()
        .unwrap()
        .expect("the waiter was not handed the key");
    let pttl: i64 = raw.pttl(redis.names.lock_key(&key)).await.unwrap();
    let valid_for =
        (acquired.valid_from + ttl - ttl / 10).saturating_duration_since(Instant::now());
    assert!(
        pttl > 50_000 && valid_for > Duration::from_secs(30),
        "a direct acquire was handed the key for its claim window only: the key expires in {pttl} ms, the lease is valid for {valid_for:?}"
    );
    waiter_backend.release(&key, waiter).await.unwrap();
}

/// Through a `Locker`, the watchdog makes the first renewal of a handed-off lease a third of the
/// way into its claim window (about a second, by default): the key is the waiter's for its full
/// ttl on the server soon after it starts, and the lease is held throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_claims_a_handed_off_lease_for_its_full_ttl() {
    let redis = Redis::start();
    let holder_locker = locker_on(&redis.server).await;
    let waiter_locker = locker_on(&redis.server).await;
    let key = unique_key("watchdog-claims");
    let ttl = Duration::from_secs(60);
    let holder = holder_locker
        .lock(&*key, LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let waiter = spawn_lock(
        &waiter_locker,
        &key,
        LockOptions::new().ttl(ttl).wait(Duration::from_secs(30)),
    );
    let mut raw = redis.raw().await;
    wait_for_queue_length(&mut raw, &redis.names.queue_key(&key), 1).await;
    holder.release().await.unwrap();
    let lease = waiter.await.unwrap().unwrap();
    let lock_key = redis.names.lock_key(&key);
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        assert!(lease.is_held(), "the handed-off lease was lost");
        let pttl: i64 = raw.pttl(&lock_key).await.unwrap();
        if pttl > 50_000 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the handed-off key still expires in {pttl} ms"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(lease.is_held());
    let holder: String = raw.get(&lock_key).await.unwrap();
    assert_eq!(crate::owner_line(&holder), lease.owner().to_string());
    lease.release().await.unwrap();
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
                let request = AcquireRequest::new(&key, waiter_owner, ttl, Duration::from_secs(30))
                    .renewed(true);
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
        assert_eq!(crate::owner_line(&stored), waiter_owner.to_string());
        let pttl: i64 = raw.pttl(&lock_key).await.unwrap();
        assert!(pttl > 1_500, "the key expires in {pttl} ms");
    });
}

/// A waiter dropped after a release handed it the key, before it ran, gives the key up; and an
/// acquire call of its owner that reaches the server after that undo (sent before the drop,
/// held up on a connection the undo overtook) takes no effect: the undo leaves the owner's
/// cancel marker whether or not it found the key handed to it. Without the marker the late
/// call found the key free and granted it to an owner nobody holds, for a full ttl.
#[test]
fn a_late_call_of_a_waiter_undone_after_its_hand_off_is_not_granted() {
    let redis = Redis::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let ttl = Duration::from_secs(30);
    let key = unique_key("undone-after-hand-off");
    let holder_backend = runtime
        .block_on(RedisBackend::connect(&redis.server.url()))
        .unwrap();
    let holder = Owner::random();
    runtime
        .block_on(holder_backend.acquire(&AcquireRequest::new(&key, holder, ttl, Duration::ZERO)))
        .unwrap()
        .expect("the key was busy");

    // The waiter, on a current-thread runtime of its own, which a second task can stall; its
    // acquisition is dropped once the runtime runs again, before it is polled.
    let (stall_tx, stall_rx) = tokio::sync::oneshot::channel::<()>();
    let (stalling_tx, stalling_rx) = std::sync::mpsc::channel::<()>();
    let (drop_tx, drop_rx) = tokio::sync::oneshot::channel::<()>();
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
                        std::thread::sleep(Duration::from_millis(500));
                    }
                });
                let request = AcquireRequest::new(&key, waiter_owner, ttl, Duration::from_secs(30));
                let acquired = tokio::select! {
                    biased;
                    _ = drop_rx => None,
                    acquired = backend.acquire(&request) => Some(acquired),
                };
                // The dropped waiter's undo runs in the background: wait for it.
                backend.close().await;
                acquired
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
        assert!(holder_backend.release(&key, holder).await.unwrap());
        let stored: Option<String> = raw.get(redis.names.lock_key(&key)).await.unwrap();
        assert_eq!(
            stored.as_deref().map(crate::owner_line),
            Some(waiter_owner.to_string().as_str()),
            "not handed to the waiter"
        );
        drop_tx.send(()).unwrap();
        let acquired = tokio::task::spawn_blocking(move || waiter.join().unwrap())
            .await
            .unwrap();
        assert!(
            acquired.is_none(),
            "the waiter was not dropped: {acquired:?}"
        );
        let stored: Option<String> = raw.get(redis.names.lock_key(&key)).await.unwrap();
        assert_eq!(stored, None, "the undo left the key held");

        // The waiter's late call.
        let late = holder_backend
            .acquire(&AcquireRequest::new(
                &key,
                waiter_owner,
                ttl,
                Duration::ZERO,
            ))
            .await
            .unwrap();
        let pttl: i64 = raw.pttl(redis.names.lock_key(&key)).await.unwrap();
        assert!(
            late.is_none(),
            "a late acquire call of a waiter undone after its hand-off was granted the key, \
             held by nobody for {pttl} ms: {late:?}"
        );
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
        RedisBackend::builder(&redis.server.url())
            .unwrap()
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

/// A hand-off whose grant lapsed before its waiter could look at it never starts that waiter:
/// the waiter's runtime stalls past the claim window right after the release handed it the key,
/// a newcomer takes the key that lapsed, and the waiter, running again, finds the grant in its
/// wake-up too old to count on and asks the server, which says the key is busy. (Counting the
/// grant from the moment the waiter read it would let it in beside the newcomer.)
#[test]
fn a_hand_off_that_lapsed_before_its_waiter_ran_does_not_start_it() {
    let redis = Redis::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let window = Duration::from_secs(1);
    let key = unique_key("lapsed-hand-off");
    let holder_backend = runtime
        .block_on(RedisBackend::connect(&redis.server.url()))
        .unwrap();
    let holder = Owner::random();
    let ttl = Duration::from_secs(60);
    runtime
        .block_on(holder_backend.acquire(&AcquireRequest::new(&key, holder, ttl, Duration::ZERO)))
        .unwrap()
        .expect("the key was busy");

    // The waiter, on a current-thread runtime of its own, which a second task can stall.
    let (stall_tx, stall_rx) = tokio::sync::oneshot::channel::<()>();
    let (stalling_tx, stalling_rx) = std::sync::mpsc::channel::<()>();
    let waiter = std::thread::spawn({
        let (url, key) = (redis.server.url(), key.clone());
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let backend = RedisBackend::builder(&url)
                    .unwrap()
                    .waiter_liveness(window)
                    .connect()
                    .await
                    .unwrap();
                tokio::spawn(async move {
                    if stall_rx.await.is_ok() {
                        stalling_tx.send(()).unwrap();
                        // Blocks the runtime, waiter and all, past the claim window (1 s).
                        std::thread::sleep(Duration::from_millis(2_000));
                    }
                });
                let owner = Owner::random();
                let request = AcquireRequest::new(&key, owner, ttl, Duration::from_millis(2_500))
                    .renewed(true);
                (owner, backend.acquire(&request).await)
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
        // Handed to the stalled waiter, for its claim window, which lapses.
        assert!(holder_backend.release(&key, holder).await.unwrap());
        tokio::time::sleep(window + Duration::from_millis(200)).await;
        let newcomer = Owner::random();
        let taken = holder_backend
            .acquire(&AcquireRequest::new(&key, newcomer, ttl, Duration::ZERO))
            .await
            .unwrap();
        assert!(taken.is_some(), "the lapsed grant did not free the key");
        let (owner, acquired) = tokio::task::spawn_blocking(move || waiter.join().unwrap())
            .await
            .unwrap();
        let acquired = acquired.unwrap();
        let stored: String = raw.get(redis.names.lock_key(&key)).await.unwrap();
        assert!(
            acquired.is_none(),
            "the waiter started on a grant that had lapsed, beside the newcomer: {acquired:?} \
             (the key holds {stored}; the waiter is {owner})"
        );
        assert!(stored.starts_with(&newcomer.to_string()), "{stored}");
    });
}
