//! Leases on ZooKeeper trusted no longer than the session that holds their nodes: through a
//! partition, a server outage and a follower cut off from the quorum, a ttl beyond what the
//! session allows, and the leader's view of the session's expiry; and a waiter kept waiting
//! through a silent link that its session outlives.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::backend::ZookeeperBackend;
use dlock::{current_lease, distributed_lock, LeaseInfo, LockError, Locker, Owner};

use crate::support::fault_proxy::{Direction, FaultProxy};
use crate::support::unique_key;
use crate::support::zk_server::{self, ZkServer};
use crate::{backend_at, ttl, Zookeeper, ROOT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_partition_the_client_gives_its_leases_up_before_the_ensemble_deletes_their_nodes() {
    let zk = Zookeeper::shared().await;
    let (partition, url) = FaultProxy::in_front_of(&zk.url);
    let session = Duration::from_secs(4);
    let backend = backend_at(&url, session).await;
    assert_eq!(backend.session_timeout(), session);
    let locker = Locker::with_backend(backend);
    let keys = [unique_key("partition-a"), unique_key("partition-b")];
    let mut leases = Vec::new();
    for key in &keys {
        leases.push(locker.lock(&**key, ttl(4)).await.unwrap());
    }

    // The server hears nothing from the client, and the client nothing from the server, but
    // no connection closes.
    partition.stall(Direction::Both);
    let frozen_at = Instant::now();
    let deadline = frozen_at + Duration::from_secs(60);
    for key in &keys {
        // The ensemble expires the session and deletes its nodes...
        while !zk.queue(key).await.is_empty() {
            assert!(Instant::now() < deadline, "the session never expired");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    // ... by which time the client had stopped trusting the leases: the ttl (4 s) does not
    // exceed the session timeout, and the client counts from before the server's last word.
    let deleted_after = frozen_at.elapsed();
    for lease in &leases {
        assert!(
            !lease.is_held(),
            "a node was deleted {deleted_after:?} into the partition while its lease was trusted"
        );
        tokio::time::timeout(Duration::ZERO, lease.lost())
            .await
            .expect("the loss was not reported");
    }
    assert!(
        deleted_after >= session,
        "expired after only {deleted_after:?}"
    );

    // When the network comes back, the client learns that its session expired and later calls
    // run on a new session.
    partition.resume(Direction::Both);
    drop(leases);
    for key in &keys {
        let lease = tokio::time::timeout(Duration::from_secs(30), locker.lock(&**key, ttl(4)))
            .await
            .expect("the first call after the partition hung")
            .unwrap();
        assert!(lease.is_held());
        assert_eq!(zk.queue(key).await.len(), 1);
    }
}

/// A ttl longer than the session allows (two thirds of its timeout less a tick) is refused by
/// the backend called directly, naming the fix, without a node left behind; a session too
/// short for any ttl is refused outright. (The `Locker` shortens such a ttl instead: see the
/// tests below.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_beyond_the_session_s_limit_is_refused_by_the_backend() {
    use dlock::backend::{AcquireRequest, Backend};

    let zk = Zookeeper::shared().await;
    let backend = backend_at(&zk.url, Duration::from_secs(6)).await;
    assert_eq!(backend.session_timeout(), Duration::from_secs(6));
    assert_eq!(backend.ttl_limit(), Duration::from_millis(3500));
    let key = unique_key("ttl-rule");
    let request = AcquireRequest::new(
        &key,
        Owner::random(),
        Duration::from_secs(4),
        Duration::ZERO,
    );
    match backend.acquire(&request).await {
        Err(LockError::InvalidOptions { reason }) => {
            assert!(reason.contains("session_timeout"), "{reason}");
            assert!(reason.contains("3.5s"), "{reason}");
        }
        other => panic!("expected InvalidOptions, got {other:?}"),
    }
    assert!(
        zk.queue(&key).await.is_empty(),
        "a refused acquisition made a node"
    );

    // Two thirds of 1.5 s is one (claimed) tick: nothing is left.
    let too_short = ZookeeperBackend::builder(&zk.url)
        .unwrap()
        .root(ROOT)
        .session_timeout(Duration::from_millis(1500))
        .tick_time(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let too_short = Locker::with_backend(too_short);
    match too_short.lock(unique_key("ttl-rule"), ttl(1)).await {
        Err(LockError::InvalidOptions { reason }) => {
            assert!(reason.contains("leaves no safe ttl"), "{reason}");
            assert!(reason.contains("session_timeout"), "{reason}");
        }
        other => panic!(
            "expected InvalidOptions, got {:?}",
            other.map(|l| l.fence())
        ),
    }
}

/// The leader may start counting a session's expiry before the request the client counts a
/// lease from: a follower tells it of the session's activity only in its ping replies, so the
/// leader's clock for the session can run from the client's previous request (up to a third of
/// the session timeout earlier) plus half a tick. A lease whose ttl equals the session timeout
/// would then be trusted past that expiry; the client must stop trusting a confirmation within
/// two thirds of the session timeout less half a tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmation_is_trusted_no_longer_than_the_leader_keeps_the_session() {
    let zk = Zookeeper::shared().await;
    let (partition, url) = FaultProxy::in_front_of(&zk.url);
    let session = Duration::from_secs(6);
    let backend = backend_at(&url, session).await;
    assert_eq!(backend.session_timeout(), session);
    let locker = Locker::with_backend(backend);
    let key = unique_key("ttl-within-session");
    let sent_at = Instant::now();
    let lease = locker
        .lock(&*key, ttl(6))
        .await
        .expect("a ttl as long as the session timeout is served");
    // The acquisition is the only confirmation: no renewal is answered after it.
    partition.stall(Direction::Both);
    // The shared server's tick is 500 ms.
    let leader_may_expire = sent_at + session * 2 / 3 - Duration::from_millis(250);
    while lease.is_held() {
        assert!(
            Instant::now() <= leader_may_expire,
            "the lease was still trusted {:?} after its only confirmation was sent, past the \
             {:?} after which the leader may expire the session",
            sent_at.elapsed(),
            leader_may_expire - sent_at
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A lease without renewal is the user's for its whole ttl, even where the ttl is longer than
/// the session lets one confirmation vouch for: the `Locker` confirms it (a check of its node,
/// which extends nothing) at the pace the session allows, and gives it up when its own ttl runs
/// out, as on any store. Taken on a session of 6 s (a limit of 3.5 s) with a ttl of 8 s: held
/// past the limit, lost at the ttl less its margin (7.2 s), its node kept through the margin
/// and deleted when the whole ttl ran out (8 s), though the `Lease` is not released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_without_renewal_keeps_its_whole_ttl_beyond_the_session_s_limit() {
    let zk = Zookeeper::shared().await;
    let locker = Locker::with_backend(backend_at(&zk.url, Duration::from_secs(6)).await);
    let key = unique_key("unrenewed");
    let sent_at = Instant::now();
    let lease = locker.lock(&*key, ttl(8).renew(false)).await.unwrap();
    let granted_in = sent_at.elapsed();
    tokio::time::sleep_until((sent_at + Duration::from_secs(6)).into()).await;
    assert!(
        lease.is_held(),
        "a lease of 8 s without renewal was no longer held {:?} in",
        sent_at.elapsed()
    );
    assert_eq!(zk.queue(&key).await.len(), 1);
    tokio::time::timeout(Duration::from_secs(4), lease.lost())
        .await
        .expect("a lease without renewal outlived its ttl");
    let lost_after = sent_at.elapsed();
    assert!(
        lost_after >= Duration::from_millis(7200),
        "given up after {lost_after:?}, before its ttl less the margin"
    );
    assert!(
        lost_after <= Duration::from_millis(7200) + granted_in + Duration::from_millis(300),
        "given up only after {lost_after:?}: trusted past its ttl"
    );
    assert_eq!(
        zk.queue(&key).await.len(),
        1,
        "the node went before the whole ttl ran out"
    );
    zk.until_queue_is(&key, 0).await;
    let deleted_after = sent_at.elapsed();
    assert!(
        deleted_after <= Duration::from_millis(8500),
        "the node outlived its ttl of 8 s: deleted after {deleted_after:?}"
    );
    // Released already: the release changes nothing.
    lease.release().await.unwrap();
}

/// A lease without renewal whose ttl the session shortened frees its key when its whole ttl
/// runs out, as a store that expires keys would, though its holder keeps the `Lease`: a waiter
/// on another session gets the key then, not when the holder lets go. Taken on a session of 6 s
/// with a ttl of 8 s and kept for 15 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_without_renewal_frees_its_key_at_its_ttl_though_its_holder_keeps_it() {
    let zk = Zookeeper::shared().await;
    let holder = Locker::with_backend(backend_at(&zk.url, Duration::from_secs(6)).await);
    let waiter = Locker::with_backend(zk.backend().await);
    let key = unique_key("unrenewed-kept");
    let sent_at = Instant::now();
    let lease = holder.lock(&*key, ttl(8).renew(false)).await.unwrap();
    let kept = tokio::spawn(async move {
        tokio::time::sleep_until((sent_at + Duration::from_secs(15)).into()).await;
        assert!(!lease.is_held(), "held 15 s in, past its ttl of 8 s");
        // Its key is another's now: the release changes nothing.
        lease.release().await.unwrap();
    });
    let waited = waiter
        .lock(&*key, ttl(8).wait(Duration::from_secs(20)))
        .await
        .expect("the waiter never got the key");
    let granted_after = sent_at.elapsed();
    assert!(
        granted_after <= Duration::from_millis(8500),
        "the waiter got the key only {granted_after:?} after a lease of 8 s was taken"
    );
    assert!(
        granted_after >= Duration::from_secs(8) - Duration::from_millis(100),
        "the waiter got the key {granted_after:?} in, before the ttl of 8 s ran out"
    );
    kept.await.unwrap();
    assert!(waited.is_held());
    assert_eq!(
        zk.queue(&key).await.len(),
        1,
        "the old holder's release took the key"
    );
    waited.release().await.unwrap();
    zk.until_queue_is(&key, 0).await;
}

/// The same for a lease without renewal whose ttl is within the session's limit, which the
/// `Locker` does not shorten: nothing on the server ends its node at that ttl either. Taken on a
/// session of 6 s (a limit of about 3.5 s) with a ttl of 3 s and kept for 15 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_without_renewal_within_the_limit_frees_its_key_at_its_ttl() {
    let zk = Zookeeper::shared().await;
    let holder = Locker::with_backend(backend_at(&zk.url, Duration::from_secs(6)).await);
    let waiter = Locker::with_backend(zk.backend().await);
    let key = unique_key("unrenewed-within");
    let sent_at = Instant::now();
    let lease = holder.lock(&*key, ttl(3).renew(false)).await.unwrap();
    let kept = tokio::spawn(async move {
        tokio::time::sleep_until((sent_at + Duration::from_secs(15)).into()).await;
        assert!(!lease.is_held(), "held 15 s in, past its ttl of 3 s");
        // Its key is another's now: the release changes nothing.
        lease.release().await.unwrap();
    });
    let waited = waiter
        .lock(&*key, ttl(8).wait(Duration::from_secs(20)))
        .await
        .expect("the waiter never got the key");
    let granted_after = sent_at.elapsed();
    assert!(
        granted_after <= Duration::from_millis(3500),
        "the waiter got the key only {granted_after:?} after a lease of 3 s was taken"
    );
    assert!(
        granted_after >= Duration::from_secs(3) - Duration::from_millis(100),
        "the waiter got the key {granted_after:?} in, before the ttl of 3 s ran out"
    );
    kept.await.unwrap();
    assert!(waited.is_held());
    assert_eq!(
        zk.queue(&key).await.len(),
        1,
        "the old holder's release took the key"
    );
    waited.release().await.unwrap();
    zk.until_queue_is(&key, 0).await;
}

#[distributed_lock(key = "<key>", ttl = "8s", renew = false, on_lost = "continue", locker = locker)]
async fn work_on_past_an_unrenewed_ttl(locker: &Locker, key: &str) -> Result<bool, LockError> {
    tokio::time::sleep(Duration::from_secs(15)).await;
    Ok(dlock::current_lease()
        .expect("inside a locked body")
        .is_held())
}

/// The same for a body under `on_lost = "continue"` that works on for 15 s: its key goes to the
/// waiter at 8 s, while the body runs on without it, and its release at the end changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_continues_past_an_unrenewed_ttl_frees_its_key_at_the_ttl() {
    let zk = Zookeeper::shared().await;
    let holder = Locker::with_backend(backend_at(&zk.url, Duration::from_secs(6)).await);
    let waiter = Locker::with_backend(zk.backend().await);
    let key = unique_key("unrenewed-continue");
    let sent_at = Instant::now();
    let body = tokio::spawn({
        let (holder, key) = (holder.clone(), key.clone());
        async move { work_on_past_an_unrenewed_ttl(&holder, &key).await }
    });
    zk.until_queue_is(&key, 1).await;
    let waited = waiter
        .lock(&*key, ttl(8).wait(Duration::from_secs(20)))
        .await
        .expect("the waiter never got the key");
    let granted_after = sent_at.elapsed();
    assert!(
        granted_after <= Duration::from_millis(8500),
        "the waiter got the key only {granted_after:?} after the body took it with a ttl of 8 s"
    );
    let held_at_the_end = body.await.unwrap().expect("the body ran to its end");
    assert!(!held_at_the_end, "the body's lease read as held 15 s in");
    assert!(waited.is_held());
    assert_eq!(
        zk.queue(&key).await.len(),
        1,
        "the body's release took the key"
    );
    waited.release().await.unwrap();
    zk.until_queue_is(&key, 0).await;
}

/// An operator's `force_release` is noticed by the holder of a lease without renewal whose ttl
/// the session shortened at the next check of its node, as by a renewed lease, even once its
/// checks have vouched for it up to the end of its ttl: on a session of 6 s (checks every
/// 1.17 s) with a ttl of 8 s, taken away 5 s in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_without_renewal_notices_an_operator_s_release() {
    let zk = Zookeeper::shared().await;
    let locker = Locker::with_backend(backend_at(&zk.url, Duration::from_secs(6)).await);
    let key = unique_key("unrenewed-forced");
    let sent_at = Instant::now();
    let lease = locker.lock(&*key, ttl(8).renew(false)).await.unwrap();
    tokio::time::sleep_until((sent_at + Duration::from_secs(5)).into()).await;
    assert!(lease.is_held());
    assert!(zk.admin.force_release(&key).await.unwrap());
    let released_at = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), lease.lost())
        .await
        .expect("the loss was never seen");
    let noticed_after = released_at.elapsed();
    assert!(
        noticed_after <= Duration::from_millis(1500),
        "the holder trusted its lease for {noticed_after:?} after an operator released it \
         ({:?} in)",
        sent_at.elapsed()
    );
    lease.release().await.unwrap();
}

#[distributed_lock(key = "<key>", ttl = "3s", on_lost = "continue", locker = locker)]
async fn work_on_through_a_stall(
    locker: &Locker,
    key: &str,
    seen: &Mutex<Option<LeaseInfo>>,
) -> Result<(), LockError> {
    *seen.lock().unwrap() = Some(current_lease().expect("inside a locked body"));
    tokio::time::sleep(Duration::from_secs(20)).await;
    Ok(())
}

/// A renewed lease lost because its renewals went unanswered frees its key a ttl after its last
/// confirmed renewal was sent, as a store that expires keys would, though its body runs on
/// under `on_lost = "continue"`: the session outlives the stall, so nothing on the server ends
/// the node. On a session of 6 s with a ttl of 3 s, the link to the server stalled for 3.5 s
/// while the body works for 20 s: a waiter on another session gets the key within a few
/// seconds of the stall's end, not when the body ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_lease_lost_unconfirmed_frees_its_key_though_its_body_runs_on() {
    let zk = Zookeeper::shared().await;
    let (link, url) = FaultProxy::in_front_of(&zk.url);
    let holder = Locker::with_backend(backend_at(&url, Duration::from_secs(6)).await);
    let waiter = Locker::with_backend(zk.backend().await);
    let key = unique_key("renewed-stalled-continue");
    let seen = Arc::new(Mutex::new(None));
    let body = tokio::spawn({
        let (holder, key, seen) = (holder.clone(), key.clone(), seen.clone());
        async move { work_on_through_a_stall(&holder, &key, &seen).await }
    });
    let lease = loop {
        if let Some(lease) = seen.lock().unwrap().clone() {
            break lease;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // A renewal goes through before the stall.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(lease.is_held(), "lost before the stall");

    let resumed_at = stall_for_3500_ms(&link).await;
    assert!(!lease.is_held(), "held through a stall longer than its ttl");
    tokio::time::timeout(Duration::ZERO, lease.lost())
        .await
        .expect("the loss was not reported");

    let waited = waiter
        .lock(&*key, ttl(3).wait(Duration::from_secs(10)))
        .await
        .expect("the waiter never got the key: held by nobody while the body ran on");
    let granted_after = resumed_at.elapsed();
    assert!(
        !body.is_finished(),
        "the waiter got the key only when the body ended"
    );
    assert!(
        granted_after <= Duration::from_secs(5),
        "the waiter got the key only {granted_after:?} after the stall ended"
    );
    assert!(waited.is_held());
    body.await.unwrap().expect("the body ran to its end");
    assert_eq!(
        zk.queue(&key).await.len(),
        1,
        "the body's release took the key"
    );
    waited.release().await.unwrap();
    zk.until_queue_is(&key, 0).await;
}

/// The same for a `Lease` its holder keeps after it was lost: its key goes to a waiter on
/// another session a ttl after the last confirmed renewal, not when the holder drops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_lease_lost_unconfirmed_frees_its_key_though_its_holder_keeps_it() {
    let zk = Zookeeper::shared().await;
    let (link, url) = FaultProxy::in_front_of(&zk.url);
    let holder = Locker::with_backend(backend_at(&url, Duration::from_secs(6)).await);
    let waiter = Locker::with_backend(zk.backend().await);
    let key = unique_key("renewed-stalled-kept");
    let lease = holder.lock(&*key, ttl(3)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(lease.is_held(), "lost before the stall");

    let resumed_at = stall_for_3500_ms(&link).await;
    tokio::time::timeout(Duration::ZERO, lease.lost())
        .await
        .expect("the loss was not reported");
    assert!(!lease.is_held(), "held through a stall longer than its ttl");

    let waited = waiter
        .lock(&*key, ttl(3).wait(Duration::from_secs(10)))
        .await
        .expect("the waiter never got the key: held by nobody while its holder kept the lease");
    let granted_after = resumed_at.elapsed();
    assert!(
        granted_after <= Duration::from_secs(5),
        "the waiter got the key only {granted_after:?} after the stall ended"
    );
    assert!(waited.is_held());
    // Released already: the release changes nothing.
    lease.release().await.unwrap();
    assert_eq!(
        zk.queue(&key).await.len(),
        1,
        "the old holder's release took the key"
    );
    waited.release().await.unwrap();
    zk.until_queue_is(&key, 0).await;
}

/// Holds every byte between the client and the server for 3.5 s, less than the session's
/// 6 s, and says when they flow again.
async fn stall_for_3500_ms(link: &FaultProxy) -> Instant {
    link.stall(Direction::Both);
    tokio::time::sleep(Duration::from_millis(3500)).await;
    link.resume(Direction::Both);
    Instant::now()
}

async fn until_set(flag: &AtomicBool) {
    while !flag.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[distributed_lock(key = "<key>", ttl = "4s", locker = locker)]
async fn hold_on_a_short_session(
    locker: &Locker,
    key: &str,
    started: &AtomicBool,
) -> Result<(), LockError> {
    started.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(300)).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_outage_longer_than_the_session_cancels_the_body_and_later_calls_succeed() {
    let mut server = tokio::task::spawn_blocking(ZkServer::start_new)
        .await
        .unwrap();
    let session = Duration::from_secs(4);
    let backend = backend_at(&server.url(), session).await;
    assert_eq!(backend.session_timeout(), session);
    let locker = Locker::with_backend(backend);
    let key = unique_key("outage");
    let started = Arc::new(AtomicBool::new(false));
    let body = tokio::spawn({
        let (locker, key, started) = (locker.clone(), key.clone(), started.clone());
        async move { hold_on_a_short_session(&locker, &key, &started).await }
    });
    until_set(&started).await;

    let stopped_at = Instant::now();
    tokio::task::block_in_place(|| server.stop());
    let result = tokio::time::timeout(Duration::from_secs(30), body)
        .await
        .expect("the body was not cancelled while the server was down");
    assert!(matches!(result.unwrap(), Err(LockError::Lost { .. })));
    // Judged by the client: ttl less the margin (3.6 s) after the last confirmation.
    let lost_after = stopped_at.elapsed();
    assert!(
        lost_after < Duration::from_secs(10),
        "lost only after {lost_after:?}"
    );

    // Down past the session's end: the client gives a session up after 7/5 of its timeout.
    tokio::time::sleep_until((stopped_at + Duration::from_secs(8)).into()).await;
    tokio::task::block_in_place(|| server.start());

    // The first call after the outage succeeds, on a new session.
    let other_key = unique_key("after-outage");
    let lease = tokio::time::timeout(Duration::from_secs(30), locker.lock(&*other_key, ttl(4)))
        .await
        .expect("the first call after the outage hung")
        .unwrap();
    assert!(lease.is_held());
    // The old session's node goes when the restarted server expires that session; a waiter is
    // woken by it.
    let again = tokio::time::timeout(
        Duration::from_secs(60),
        locker.lock(&*key, ttl(4).wait(Duration::from_secs(30))),
    )
    .await
    .expect("the key never came free")
    .unwrap();
    assert!(again.is_held());
    drop((lease, again));
    tokio::task::block_in_place(|| drop(server));
}

/// A follower cut off from the quorum goes on answering reads from its own copy of the data
/// for `syncLimit` ticks, while the leader expires the sessions it serves and grants their keys
/// to others. A lease renewed through such a follower must not be confirmed by it: the client
/// gives the lease up by its own deadline, before the leader can grant the key again, and no
/// two holders overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_off_from_the_quorum_confirms_no_lease() {
    let ensemble = tokio::task::spawn_blocking(zk_server::ZkEnsemble::start)
        .await
        .unwrap();
    assert_eq!(ensemble.server(0).mode(), "follower");
    let session = Duration::from_secs(4);
    let through_follower = Locker::with_backend(backend_at(&ensemble.url_of(&[0]), session).await);
    let elsewhere = Locker::with_backend(backend_at(&ensemble.url_of(&[1, 2]), session).await);
    let key = unique_key("stale-follower");
    let lease = through_follower.lock(&*key, ttl(4)).await.unwrap();
    // Renewals go through while the ensemble is whole.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(lease.is_held(), "lost while the ensemble was whole");

    ensemble.cut_off_first();
    let cut_at = Instant::now();
    let rival_got_in = Arc::new(Mutex::new(None));
    let rival = {
        let (key, got_in) = (key.clone(), rival_got_in.clone());
        tokio::spawn(async move {
            // The cut may take the ensemble's leader away: until a new one is elected, the
            // rival's server answers nothing, and its call fails; it asks again, as a caller
            // would (what is checked here is the holder's lease, not the rival's patience).
            let lease = loop {
                match elsewhere
                    .lock(&*key, ttl(4).wait(Duration::from_secs(60)))
                    .await
                {
                    Ok(lease) => break lease,
                    Err(dlock::LockError::Backend(_)) => {
                        tokio::time::sleep(Duration::from_millis(200)).await
                    }
                    Err(error) => panic!("the rival failed: {error}"),
                }
            };
            *got_in.lock().unwrap() = Some(Instant::now());
            lease
        })
    };
    // The lease's deadline: the ttl past the last confirmation, which came before the cut.
    let deadline = cut_at + Duration::from_secs(4);
    let mut lost_at = None;
    while rival_got_in.lock().unwrap().is_none() {
        let now = Instant::now();
        if lost_at.is_none() && !lease.is_held() {
            lost_at = Some(now);
        }
        assert!(
            lost_at.is_some() || now < deadline + Duration::from_millis(500),
            "the lease was still held {:?} after the cut, past its ttl: confirmed by a follower \
             cut off from the quorum",
            now - cut_at
        );
        assert!(
            now < cut_at + Duration::from_secs(60),
            "the rival never got the key"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rival_at = rival_got_in.lock().unwrap().unwrap();
    let Some(lost_at) = lost_at else {
        panic!(
            "the rival got the key {:?} after the cut while the lease was still held: two holders",
            rival_at - cut_at
        );
    };
    assert!(
        lost_at <= rival_at,
        "two holders for {:?}",
        lost_at - rival_at
    );
    let second = rival.await.unwrap();
    assert!(second.is_held());
    assert!(!lease.is_held());
}

/// An acquisition that has to move to a new session — its session ended while it waited —
/// checks its ttl against the new session too: a server that grants a shorter session timeout
/// cannot vouch for a lease as long as the first session could, so the acquisition is refused
/// with the reason, and nothing is created on the new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_moved_to_a_shorter_session_checks_its_ttl_again() {
    use dlock::backend::{AcquireRequest, Backend};

    let zk = Zookeeper::shared().await;
    let stingy =
        tokio::task::spawn_blocking(|| ZkServer::start_granting_at_most(Duration::from_secs(3)))
            .await
            .unwrap();
    let (link, url) = FaultProxy::in_front_of(&zk.url);
    let backend = backend_at(&url, Duration::from_secs(6)).await;
    assert_eq!(backend.ttl_limit(), Duration::from_millis(3500));
    let key = unique_key("ttl-new-session");
    let holder = Locker::with_backend(zk.backend().await);
    let lease = holder.lock(&*key, ttl(60)).await.unwrap();
    let acquiring = tokio::spawn({
        let (backend, key) = (backend.clone(), key.clone());
        async move {
            let request = AcquireRequest::new(
                &key,
                Owner::random(),
                Duration::from_millis(3500),
                Duration::from_secs(30),
            );
            backend.acquire(&request).await
        }
    });
    zk.until_queue_is(&key, 2).await;

    // The waiter's next connection reaches a server that does not know its session (so the
    // session ends) and grants new sessions 3 s at most, which leave a ttl of 1.5 s.
    let stingy_url = stingy.url();
    link.retarget(stingy_url.strip_prefix("zk://").unwrap());
    link.cut_all();
    let acquired = tokio::time::timeout(Duration::from_secs(30), acquiring)
        .await
        .expect("the acquisition did not answer")
        .unwrap();
    match acquired {
        Err(LockError::InvalidOptions { reason }) => {
            assert!(reason.contains("3.5s"), "{reason}");
            assert!(reason.contains("session_timeout"), "{reason}");
        }
        other => panic!(
            "expected InvalidOptions on a session of {:?}, got {other:?}",
            backend.session_timeout()
        ),
    }
    let on_stingy = backend_at(&stingy_url, Duration::from_secs(3)).await;
    assert!(
        on_stingy.queue(&key).await.unwrap().is_empty(),
        "a refused acquisition made a node on the new session"
    );
    drop(lease);
    tokio::task::block_in_place(|| drop(stingy));
}

/// A readiness probe asks the ensemble: it fails (within the session timeout, not hanging) once
/// the server is gone, and a probe with the server up answers Ok.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_asks_the_ensemble() {
    let mut server = tokio::task::spawn_blocking(ZkServer::start_new)
        .await
        .unwrap();
    let locker = Locker::with_backend(backend_at(&server.url(), Duration::from_secs(4)).await);
    locker.health().await.unwrap();
    tokio::task::block_in_place(|| server.stop());
    let probed = tokio::time::timeout(Duration::from_secs(10), locker.health()).await;
    assert!(
        matches!(probed, Ok(Err(_))),
        "health with the server down: {probed:?}"
    );
}

/// A link that goes silent — nothing closes, nothing gets through — for half the session
/// timeout while a waiter's request is on it, then comes back. The client fails that request
/// with the error that broke the connection ("no response from connection in …", not
/// `ConnectionLoss`) and reconnects on the same session, which the silence did not outlast. The
/// waiter must go on waiting within its wait, and get the key once its holder releases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_request_meets_a_silent_link_waits_on_when_the_session_survives() {
    let zk = Zookeeper::shared().await;
    let key = unique_key("silent-link");
    let holder = Locker::with_backend(zk.backend().await);
    let lease = holder.lock(&*key, ttl(60)).await.unwrap();
    let (link, url) = FaultProxy::in_front_of(&zk.url);
    let session = Duration::from_secs(4);
    let waiter = Locker::with_backend(backend_at(&url, session).await);

    // Silent from now on, both ways, for new connections too: the waiter's create goes into
    // it. The client gives the connection up after 40% of the session timeout (its connection
    // timeout), and its reconnection gets through once the link is back at 50%.
    link.stall(Direction::Both);
    let silent_at = Instant::now();
    let task = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        async move {
            waiter
                .lock(&*key, ttl(2).wait(Duration::from_secs(20)))
                .await
        }
    });
    tokio::time::sleep(session / 2).await;
    link.resume(Direction::Both);

    // The holder releases once the waiter is queued behind it (or once the waiter gave up).
    let deadline = Instant::now() + Duration::from_secs(30);
    while zk.queue(&key).await.len() < 2 && !task.is_finished() {
        assert!(Instant::now() < deadline, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    lease.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the waiter hung")
        .unwrap();
    let got = got.unwrap_or_else(|error| {
        panic!(
            "the waiter gave up {:?} after the link went silent, within its wait of 20 s and \
             though its session lived on: {error:?}",
            silent_at.elapsed()
        )
    });
    assert!(got.is_held());
    assert_eq!(zk.queue(&key).await.len(), 1, "an orphan node stayed");
    got.release().await.unwrap();
}
