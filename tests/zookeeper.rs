//! The ZooKeeper backend against a private server, started once per test process (or the server
//! `DLOCK_ZK_URL` names, which must tick every 500 ms and grant session timeouts of two minutes); the outage test starts
//! one of its own, to stop it.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::backend::{ZookeeperBackend, ZOOKEEPER_MAX_PATH_BYTES};
use dlock::{distributed_lock, LockError, LockOptions, Locker, Owner};
use support::fault_proxy::{Direction, FaultProxy};
use support::zk_server::{self, ZkServer};
use support::{unique_key, Gauge};

/// The tests' root, so a shared server's `/dlock` is left alone.
const ROOT: &str = "/dlock-test";

/// Long enough for the properties' leases of a minute: a ttl may be two thirds of the session
/// timeout less a tick.
const SESSION: Duration = Duration::from_secs(120);

/// The tick of the tests' servers.
const TICK: Duration = Duration::from_millis(500);

async fn backend_at(url: &str, session: Duration) -> ZookeeperBackend {
    ZookeeperBackend::builder(url)
        .unwrap()
        .root(ROOT)
        .session_timeout(session)
        .tick_time(TICK)
        .connect()
        .await
        .unwrap()
}

/// The shared server, and a client of its own that plays the operator.
struct Zookeeper {
    url: String,
    admin: ZookeeperBackend,
}

impl Zookeeper {
    async fn shared() -> Zookeeper {
        let url = zk_server::shared_url().await;
        let admin = backend_at(&url, SESSION).await;
        Zookeeper { url, admin }
    }

    /// A backend on a session of its own, as another process would have.
    async fn backend(&self) -> ZookeeperBackend {
        backend_at(&self.url, SESSION).await
    }

    async fn queue(&self, key: &str) -> Vec<String> {
        self.admin.queue(key).await.unwrap()
    }

    /// Waits until `key` has `len` lock nodes.
    async fn until_queue_is(&self, key: &str, len: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let queue = self.queue(key).await;
            if queue.len() == len {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the queue of `{key}` stayed {queue:?}, not {len} long"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl support::Store for Zookeeper {
    type Backend = ZookeeperBackend;

    async fn backend(&self) -> ZookeeperBackend {
        Zookeeper::backend(self).await
    }

    /// Deletes the holder's node from another session.
    async fn take_away(&self, key: &str) {
        assert!(
            self.admin.force_release(key).await.unwrap(),
            "`{key}` was not held"
        );
    }

    /// The same: a lease on ZooKeeper ends when its node goes.
    async fn expire(&self, key: &str) {
        self.take_away(key).await;
    }
}

lock_properties!(Zookeeper::shared().await);

fn ttl(secs: u64) -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(secs))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_from_eight_sessions_get_the_key_in_queue_order() {
    let zk = Zookeeper::shared().await;
    let key = unique_key("fair");
    let holder = Locker::with_backend(zk.backend().await);
    let lease = holder.lock(&*key, ttl(60)).await.unwrap();
    let log = Arc::new(Mutex::new(vec![(usize::MAX, lease.fence())]));
    let mut waiters = Vec::new();
    for id in 0..8 {
        let locker = Locker::with_backend(zk.backend().await);
        let (task_key, log) = (key.clone(), log.clone());
        waiters.push(tokio::spawn(async move {
            let lease = locker
                .lock(&*task_key, ttl(60).wait(Duration::from_secs(60)))
                .await
                .unwrap();
            log.lock().unwrap().push((id, lease.fence()));
            tokio::time::sleep(Duration::from_millis(20)).await;
            lease.release().await.unwrap();
        }));
        // The queue, not a sleep, says this waiter is in line before the next one comes.
        zk.until_queue_is(&key, id + 2).await;
    }
    lease.release().await.unwrap();
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(60), waiter)
            .await
            .expect("a waiter never got the key")
            .unwrap();
    }
    let log = log.lock().unwrap().clone();
    let order: Vec<usize> = log[1..].iter().map(|(id, _)| *id).collect();
    assert_eq!(order, (0..8).collect::<Vec<_>>(), "served out of order");
    assert!(
        log.windows(2).all(|w| w[0].1 < w[1].1),
        "fences did not increase: {log:?}"
    );
    zk.until_queue_is(&key, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_exactly_one_of_twenty_waiters() {
    let zk = Zookeeper::shared().await;
    let key = unique_key("herd");
    let holder = Locker::with_backend(zk.backend().await);
    let lease = holder.lock(&*key, ttl(60)).await.unwrap();
    let backends = [zk.backend().await, zk.backend().await];
    let lockers = backends.clone().map(Locker::with_backend);
    let entered = Arc::new(AtomicUsize::new(0));
    let mut waiters = Vec::new();
    for i in 0..20 {
        let (locker, task_key, entered) = (lockers[i % 2].clone(), key.clone(), entered.clone());
        waiters.push(tokio::spawn(async move {
            let _lease = locker
                .lock(&*task_key, ttl(60).wait(Duration::from_secs(120)))
                .await
                .unwrap();
            entered.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<()>().await;
        }));
        zk.until_queue_is(&key, i + 2).await;
    }
    // Time for the last waiters to set their watches.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let watches = || {
        backends
            .iter()
            .map(ZookeeperBackend::watch_events)
            .sum::<u64>()
    };
    let before = watches();
    lease.release().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while entered.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "no waiter got the key");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Time for a herd to show, if there were one.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(entered.load(Ordering::SeqCst), 1);
    assert_eq!(
        watches() - before,
        1,
        "one release fired more than one waiter's watch"
    );
    assert_eq!(zk.queue(&key).await.len(), 20, "the queue changed");
    for waiter in &waiters {
        waiter.abort();
    }
    zk.until_queue_is(&key, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_or_is_dropped_leaves_no_node() {
    let zk = Zookeeper::shared().await;
    let key = unique_key("abandon");
    let holder = Locker::with_backend(zk.backend().await);
    let lease = holder.lock(&*key, ttl(60)).await.unwrap();
    let waiter = Locker::with_backend(zk.backend().await);

    // A try on a busy key creates nothing.
    let busy = waiter.lock(&*key, LockOptions::new()).await;
    assert!(matches!(busy, Err(LockError::Busy { .. })), "{busy:?}");
    assert_eq!(zk.queue(&key).await.len(), 1);

    // A waiter that gives up deletes its node before it answers.
    let started = Instant::now();
    let busy = waiter
        .lock(&*key, LockOptions::new().wait(Duration::from_millis(300)))
        .await;
    assert!(matches!(busy, Err(LockError::Busy { .. })), "{busy:?}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(
        zk.queue(&key).await.len(),
        1,
        "the node of a waiter that gave up stayed"
    );

    // A waiter whose future is dropped: its node goes at once, not when its session ends.
    let task = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        async move {
            waiter
                .lock(&*key, ttl(60).wait(Duration::from_secs(60)))
                .await
        }
    });
    zk.until_queue_is(&key, 2).await;
    task.abort();
    let dropped_at = Instant::now();
    zk.until_queue_is(&key, 1).await;
    assert!(
        dropped_at.elapsed() < Duration::from_secs(5),
        "the dropped waiter's node stayed {:?}",
        dropped_at.elapsed()
    );

    // So the release hands the key to nobody: it is free.
    lease.release().await.unwrap();
    assert!(zk.queue(&key).await.is_empty());
    assert!(waiter.lock(&*key, LockOptions::new()).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_key_cleanup_never_breaks_a_concurrent_acquirer() {
    let zk = Zookeeper::shared().await;
    let key = unique_key("cleanup");
    let gauge = Arc::new(Gauge::default());
    let fences = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let locker = Locker::with_backend(zk.backend().await);
        let (key, gauge, fences) = (key.clone(), gauge.clone(), fences.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..150 {
                // Every release that leaves the key idle deletes its parent; the other client
                // may be creating its node under that parent at the same moment.
                let lease = locker
                    .lock(&*key, ttl(10).wait(Duration::from_secs(30)))
                    .await
                    .unwrap();
                gauge.enter();
                fences.lock().unwrap().push(lease.fence());
                tokio::task::yield_now().await;
                gauge.leave();
                lease.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(gauge.entered(), 300);
    assert_eq!(gauge.max(), 1, "two clients held the key at once");
    let fences = fences.lock().unwrap().clone();
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences did not increase across parent deletions"
    );
    assert!(zk.queue(&key).await.is_empty());
}

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

/// A ttl longer than the session allows (two thirds of its timeout less a tick) is shortened by
/// the `Locker` — the lease is served and trusted no longer than the limit — and refused by the
/// backend called directly, naming the fix, without a node left behind; a session too short
/// for any ttl is refused outright.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_beyond_the_session_s_limit_is_shortened_or_refused() {
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

    let locker = Locker::with_backend(backend);
    let sent_at = Instant::now();
    let lease = locker.lock(&*key, ttl(60).renew(false)).await.unwrap();
    assert!(lease.is_held());
    assert_eq!(zk.queue(&key).await.len(), 1);
    tokio::time::timeout(Duration::from_secs(10), lease.lost())
        .await
        .expect("a lease of a shortened ttl was trusted for longer");
    assert!(
        sent_at.elapsed() >= Duration::from_millis(3150),
        "given up after {:?}, before the limit less the margin",
        sent_at.elapsed()
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
    let session = Duration::from_secs(6);
    let backend = backend_at(&zk.url, session).await;
    assert_eq!(backend.session_timeout(), session);
    let locker = Locker::with_backend(backend);
    let key = unique_key("ttl-within-session");
    // The acquisition is the only confirmation: no renewal follows it.
    let sent_at = Instant::now();
    let lease = locker
        .lock(&*key, ttl(6).renew(false))
        .await
        .expect("a ttl as long as the session timeout is served");
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

/// ZooKeeper answers a request over its `jute.maxbuffer` (1 MiB by default) by dropping the
/// connection, so a key whose lock node path would pass `ZOOKEEPER_MAX_PATH_BYTES` is refused up
/// front, whole; the longest key allowed is served; neither disturbs the session's other leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_key_is_served_and_a_longer_one_refused_naming_the_limit() {
    let zk = Zookeeper::shared().await;
    let locker = Locker::with_backend(zk.backend().await);
    let bystander = locker.lock(unique_key("bystander"), ttl(10)).await.unwrap();
    // root + "/" + key + "/" + owner (32) + "-" + sequence (up to 11).
    let longest = ZOOKEEPER_MAX_PATH_BYTES - zk.admin.root().len() - 1 - 45;
    let prefix = unique_key("longest");
    let key = format!("{prefix}{}", "k".repeat(longest - prefix.len()));
    let lease = locker.lock(&*key, ttl(10)).await.unwrap();
    assert_eq!(lease.key().len(), longest);
    assert_eq!(zk.queue(&key).await.len(), 1);
    lease.release().await.unwrap();
    let longer = format!("{key}k");
    match locker.lock(&*longer, ttl(10)).await {
        Err(LockError::InvalidKey { key, reason }) => {
            assert_eq!(key, longer, "the refused key was cut");
            assert!(reason.contains("1000000"), "{reason}");
        }
        other => panic!("expected InvalidKey, got {:?}", other.map(|l| l.fence())),
    }
    assert!(bystander.is_held());
    bystander.release().await.unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locker_connects_by_url_and_creates_the_chroot() {
    let url = zk_server::shared_url().await;
    let chroot = format!("/dlock-chroot-{}", Owner::random());
    let locker = Locker::connect(&format!("{url}{chroot}/app"))
        .await
        .unwrap();
    let key = unique_key("url");
    let lease = locker.lock(&*key, LockOptions::new()).await.unwrap();
    let admin = ZookeeperBackend::connect(&format!("{url}{chroot}/app"))
        .await
        .unwrap();
    assert_eq!(admin.root(), format!("{chroot}/app/dlock"));
    assert_eq!(admin.queue(&key).await.unwrap().len(), 1);
    lease.release().await.unwrap();
    assert!(admin.queue(&key).await.unwrap().is_empty());

    let unreachable =
        tokio::time::timeout(Duration::from_secs(30), Locker::connect("zk://127.0.0.1:1"))
            .await
            .expect("an unreachable server must fail, not hang");
    let message = unreachable.unwrap_err().to_string();
    assert!(message.contains("cannot connect to ZooKeeper"), "{message}");
    for bad in ["zk://", "zk://host:1,,host:2", "zk://host:1/a//b"] {
        assert!(
            matches!(
                Locker::connect(bad).await,
                Err(LockError::InvalidUrl { .. })
            ),
            "{bad}"
        );
    }
}

/// The queue is the order in which the lock nodes were created, whatever the numbers in their
/// names say. ZooKeeper numbers a key's lock nodes with a signed 32-bit counter of changes to
/// the key's children, so a key that stays busy long enough sees the number jump from
/// `2147483647` to `-2147483648`: the node created after the jump must still queue behind the
/// one created before it. (Two nodes named as the counter leaves them around the jump, made
/// directly, stand in for the 2^31 creations it would take.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_follows_creation_order_not_the_numbers_in_node_names() {
    use zookeeper_client::{Acls, CreateMode};

    let zk = Zookeeper::shared().await;
    let key = unique_key("wrap");
    let parent = format!("{ROOT}/{key}");
    let plain = zk_server::plain_client(&zk.url).await;
    plain
        .mkdir(
            &parent,
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    let ephemeral = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
    let (before, after) = (Owner::random(), Owner::random());
    let before_wrap = format!("{before}-2147483647");
    let after_wrap = format!("{after}--2147483648");
    for (name, owner) in [(&before_wrap, before), (&after_wrap, after)] {
        plain
            .create(
                &format!("{parent}/{name}"),
                owner.to_string().as_bytes(),
                &ephemeral,
            )
            .await
            .unwrap();
    }

    // A dlock waiter comes third; ZooKeeper numbers its node 2.
    let got_in = Arc::new(AtomicBool::new(false));
    let locker = Locker::with_backend(zk.backend().await);
    let waiter = {
        let (key, got_in) = (key.clone(), got_in.clone());
        tokio::spawn(async move {
            let lease = locker
                .lock(&*key, ttl(60).wait(Duration::from_secs(60)))
                .await
                .unwrap();
            got_in.store(true, Ordering::SeqCst);
            lease
        })
    };
    zk.until_queue_is(&key, 3).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !got_in.load(Ordering::SeqCst),
        "the newest node got the key while two older ones were ahead of it: {:?}",
        zk.queue(&key).await
    );
    let queue = zk.queue(&key).await;
    assert_eq!(
        &queue[..2],
        [before_wrap.clone(), after_wrap.clone()],
        "not in creation order: {queue:?}"
    );

    plain
        .delete(&format!("{parent}/{before_wrap}"), None)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !got_in.load(Ordering::SeqCst),
        "the newest node got the key while an older one was ahead of it"
    );
    plain
        .delete(&format!("{parent}/{after_wrap}"), None)
        .await
        .unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter did not get the key once it was first")
        .unwrap();
    assert!(lease.is_held());
    lease.release().await.unwrap();
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
            let lease = elsewhere
                .lock(&*key, ttl(4).wait(Duration::from_secs(60)))
                .await
                .unwrap();
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
