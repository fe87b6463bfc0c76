//! Late copies of calls: an acquisition or its undo that a connection sent twice, or that
//! reached the server after its caller gave up, and must not grant the key to nobody.

use std::time::{Duration, Instant};

use dlock::backend::RedisBackend;
use dlock::{LockError, LockOptions, Locker};
use redis::AsyncCommands;

use crate::support::fault_proxy::{Direction, FaultProxy};
use crate::support::redis_server::RedisServer;
use crate::support::{lock_and_release, unique_key};

/// An acquisition that timed out on a connection that hangs is not sent again on a fresh one:
/// the first copy still waits on the old connection, and had a second copy been granted and
/// released meanwhile, the first would grant the key to nobody for a whole ttl when it ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_timed_out_leaves_no_late_copy_to_grant_the_key_to_nobody() {
    let server = RedisServer::start();
    let (proxy, url) = FaultProxy::in_front_of(&server.url());
    let backend = RedisBackend::builder(&url)
        .unwrap()
        .response_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let locker = Locker::with_backend(backend.clone());
    let key = unique_key("late-copy");
    // The connections exist before the stall, so it catches them.
    lock_and_release(&locker, &key, LockOptions::new()).await;

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

/// An acquisition granted on the server whose reply was lost (its connection dropped), and whose
/// copy sent again on a fresh connection hangs past the response timeout, fails; the caller's
/// undo then finds the key granted and releases it. That second copy, reaching the server after
/// the undo, takes no effect: the undo left the owner's cancel marker although it found the key
/// held. Without it the copy found the key free and granted it to an owner nobody holds, for a
/// full ttl.
#[test]
fn a_copy_of_a_failed_acquisition_that_lands_after_its_undo_grants_nothing() {
    let server = RedisServer::start();
    let (proxy, url) = FaultProxy::in_front_of(&server.url());
    let backend = RedisBackend::builder(&url)
        .unwrap()
        .response_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let locker = Locker::with_backend(backend.clone());
    let key = unique_key("copy-after-undo");
    let lock_key = backend.lock_key(&key);
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // The caller's runtime, whose connection is made last, so that the proxy can single it out.
    let caller = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut raw = main.block_on(async {
        redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    });
    main.block_on(async {
        // The background connection exists (a dropped lease is released from there), and the
        // scripts are loaded.
        drop(locker.lock(&*key, LockOptions::new()).await.unwrap());
        wait_until_gone(&mut raw, &lock_key).await;
    });
    caller.block_on(locker.health()).unwrap();
    let evalsha_calls = |raw: &mut redis::aio::MultiplexedConnection| {
        let mut raw = raw.clone();
        async move {
            let stats: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut raw)
                .await
                .unwrap();
            stats
                .lines()
                .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
                .and_then(|rest| rest.split(',').next())
                .map_or(0, |calls| calls.parse::<u64>().unwrap())
        }
    };

    // The first copy's reply is held, and a fresh connection hangs on its first request (the
    // handshake is two requests: the setup pipeline and the version check).
    proxy.stall_newest(Direction::ToClient);
    proxy.stall_new_connections_after(Direction::ToServer, 2);
    let lock = caller.spawn({
        let (locker, key) = (locker.clone(), key.clone());
        async move {
            locker
                .lock(&*key, LockOptions::new().ttl(Duration::from_secs(30)))
                .await
                .map(drop)
        }
    });
    main.block_on(async {
        // The first copy granted the key: its connection drops before the reply gets through.
        let started = Instant::now();
        while raw.get::<_, Option<String>>(&lock_key).await.unwrap().is_none() {
            assert!(started.elapsed() < Duration::from_secs(5), "the first copy never ran");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        proxy.cut_newest();
        let result = lock.await.unwrap();
        assert!(
            matches!(result, Err(LockError::Backend(_))),
            "the acquisition did not fail: {result:?}"
        );
        // The undo, from the background connection, released the key.
        wait_until_gone(&mut raw, &lock_key).await;
        let before = evalsha_calls(&mut raw).await;
        proxy.resume(Direction::ToServer);
        let started = Instant::now();
        while evalsha_calls(&mut raw).await == before {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "the second copy never reached the server"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let pttl: i64 = raw.pttl(&lock_key).await.unwrap();
        assert_eq!(
            pttl, -2,
            "the key is held by nobody: a copy of the failed acquisition that landed after its undo granted it (PTTL {pttl} ms)"
        );
    });
    caller.shutdown_background();
}

/// An acquisition granted on the server whose reply was lost, while the server could not be
/// reached at all: its undo fails too (no connection can be made), and is tried again, backing
/// off, until one lands. Tried once only, it left the key granted to nobody for its whole ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_undo_of_an_unanswered_acquisition_is_retried_until_the_server_is_back() {
    let server = RedisServer::start();
    let (proxy, url) = FaultProxy::in_front_of(&server.url());
    let backend = RedisBackend::builder(&url)
        .unwrap()
        .response_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let locker = Locker::with_backend(backend.clone());
    let key = unique_key("undo-retried");
    let lock_key = backend.lock_key(&key);
    let mut raw = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // The background connection exists (a dropped lease is released from there), and the
    // scripts are loaded.
    drop(locker.lock(&*key, LockOptions::new()).await.unwrap());
    wait_until_gone(&mut raw, &lock_key).await;

    // The grant's reply is held; then every connection drops and none can be made.
    proxy.stall(Direction::ToClient);
    let lock = tokio::spawn({
        let (locker, key) = (locker.clone(), key.clone());
        async move {
            locker
                .lock(&*key, LockOptions::new().ttl(Duration::from_secs(30)))
                .await
                .map(drop)
        }
    });
    let started = Instant::now();
    while raw
        .get::<_, Option<String>>(&lock_key)
        .await
        .unwrap()
        .is_none()
    {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the acquisition never ran"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    proxy.refuse_connections(true);
    proxy.cut_all();
    proxy.resume(Direction::ToClient);
    let result = lock.await.unwrap();
    assert!(
        matches!(result, Err(LockError::Backend(_))),
        "the acquisition did not fail: {result:?}"
    );
    // The undo was sent, and could not reach the server.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pttl: i64 = raw.pttl(&lock_key).await.unwrap();
    assert!(
        pttl > 0,
        "the key was freed while the server was unreachable: PTTL {pttl}"
    );

    proxy.refuse_connections(false);
    let back = Instant::now();
    loop {
        let pttl: i64 = raw.pttl(&lock_key).await.unwrap();
        if pttl == -2 {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(8),
            "the key is still granted to nobody {:?} after the server came back (PTTL {pttl} ms): its undo was not tried again",
            back.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An acquisition whose first copy is held up in the network while its connection is reported
/// dropped is sent again on a fresh connection, granted, and becomes a lease; the lease is
/// released. The first copy, landing after that release, takes no effect: the release of a
/// lease granted to a call sent more than once leaves the owner's cancel marker, as an undo
/// does. Without it the copy found the key free and granted it to an owner nobody holds, for a
/// full ttl.
#[test]
fn a_copy_of_a_resent_acquisition_that_lands_after_its_release_grants_nothing() {
    a_copy_of_a_resent_acquisition_lands_after_its_lease_ended(None);
}

/// As above, for a lease released before the end of its hold: the key is left to expire at
/// that end, and the first copy, landing after it, takes no effect either.
#[test]
fn a_copy_of_a_resent_acquisition_that_lands_after_its_hold_ended_grants_nothing() {
    a_copy_of_a_resent_acquisition_lands_after_its_lease_ended(Some(Duration::from_millis(200)));
}

/// As above, the first copy landing while the hold still keeps the key: it leaves the hold's
/// end where it is, rather than granting the key, which nobody holds any more, a whole ttl.
#[test]
fn a_copy_of_a_resent_acquisition_that_lands_during_its_hold_leaves_the_hold_s_end() {
    a_copy_of_a_resent_acquisition_lands_after_its_lease_ended(Some(Duration::from_secs(3)));
}

/// The first copy of a resent acquisition lands after its lease was released (held at least
/// `hold`, where given; a hold of a second or more is still on when it lands): the key stays
/// free, or its hold ends when it would have.
fn a_copy_of_a_resent_acquisition_lands_after_its_lease_ended(hold: Option<Duration>) {
    let lands_during_the_hold = hold.is_some_and(|hold| hold >= Duration::from_secs(1));
    let server = RedisServer::start();
    let (proxy, url) = FaultProxy::in_front_of(&server.url());
    let backend = RedisBackend::builder(&url)
        .unwrap()
        .response_timeout(Duration::from_millis(2000))
        .build()
        .unwrap();
    let locker = Locker::with_backend(backend.clone());
    let key = unique_key("copy-after-release");
    let lock_key = backend.lock_key(&key);
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // The caller's runtime, whose connection is made last, so that the proxy can single it out.
    let caller = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut raw = main.block_on(async {
        redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    });
    main.block_on(async {
        // The background connection exists, and the scripts are loaded.
        drop(locker.lock(&*key, LockOptions::new()).await.unwrap());
        wait_until_gone(&mut raw, &lock_key).await;
    });
    caller.block_on(locker.health()).unwrap();
    let evalsha_calls = |raw: &mut redis::aio::MultiplexedConnection| {
        let mut raw = raw.clone();
        async move {
            let stats: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut raw)
                .await
                .unwrap();
            stats
                .lines()
                .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
                .and_then(|rest| rest.split(',').next())
                .map_or(0, |calls| calls.parse::<u64>().unwrap())
        }
    };

    // The first copy is held on its way to the server.
    proxy.stall_newest(Direction::ToServer);
    let sent_before = proxy.chunks(Direction::ToServer);
    let lock = caller.spawn({
        let (locker, key) = (locker.clone(), key.clone());
        async move {
            let mut options = LockOptions::new().ttl(Duration::from_secs(30));
            if let Some(hold) = hold {
                options = options.hold_at_least(hold);
            }
            let lease = locker.lock(&*key, options).await?;
            lease.release().await
        }
    });
    main.block_on(async {
        let started = Instant::now();
        while proxy.chunks(Direction::ToServer) == sent_before {
            assert!(started.elapsed() < Duration::from_secs(5), "the first copy was never sent");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The client sees its connection dropped, sends the call again on a fresh one, is
        // granted the key, and releases the lease.
        proxy.cut_client_side_of_newest();
        let result = lock.await.unwrap();
        assert!(result.is_ok(), "the acquisition or its release failed: {result:?}");
        match hold {
            None => assert!(!raw.exists::<_, bool>(&lock_key).await.unwrap()),
            Some(_) if lands_during_the_hold => {}
            // Left to expire at the hold's end.
            Some(_) => wait_until_gone(&mut raw, &lock_key).await,
        }
        // Then the first copy lands.
        let before = evalsha_calls(&mut raw).await;
        proxy.resume(Direction::ToServer);
        let started = Instant::now();
        while evalsha_calls(&mut raw).await == before {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "the first copy never reached the server"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let pttl: i64 = raw.pttl(&lock_key).await.unwrap();
        if let Some(hold) = hold.filter(|_| lands_during_the_hold) {
            assert!(
                pttl <= hold.as_millis() as i64,
                "the key is held by nobody past its hold: a copy of the acquisition that landed during the hold stretched it (PTTL {pttl} ms)"
            );
            return;
        }
        assert_eq!(
            pttl, -2,
            "the key is held by nobody: a copy of the acquisition that landed after its lease's release granted it (PTTL {pttl} ms)"
        );
    });
    caller.shutdown_background();
}

/// Waits until `lock_key` is gone from the server.
async fn wait_until_gone(raw: &mut redis::aio::MultiplexedConnection, lock_key: &str) {
    let started = Instant::now();
    while raw.exists::<_, bool>(lock_key).await.unwrap() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{lock_key} was never released"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
