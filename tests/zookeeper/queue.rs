//! The queue of lock nodes on ZooKeeper: waiters get the key in the order their nodes were
//! created, a release wakes exactly one of them, and no node outlives its waiter or its key.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::backend::ZookeeperBackend;
use dlock::{LockError, LockOptions, Locker, Owner};

use crate::support::{unique_key, zk_server, Gauge};
use crate::{ttl, Zookeeper, ROOT};

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

/// A lock node whose age cannot be read (its ACL denies reading it to this client) is not taken
/// to be gone: the waiter behind it does not get the key past it — which would make two
/// holders — but fails, naming the error, and leaves no node of its own behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_node_that_cannot_be_read_is_not_passed_over() {
    use zookeeper_client::{Acl, Acls, AuthId, CreateMode, Permission};

    let zk = Zookeeper::shared().await;
    let key = unique_key("unreadable");
    let parent = format!("{ROOT}/{key}");
    let plain = zk_server::plain_client(&zk.url).await;
    plain
        .mkdir(
            &parent,
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    let no_read = [Acl::new(
        Permission::WRITE | Permission::DELETE | Permission::ADMIN,
        AuthId::anyone(),
    )];
    let holder = Owner::random();
    let (_, sequence) = plain
        .create(
            &format!("{parent}/{holder}-0-"),
            holder.to_string().as_bytes(),
            &CreateMode::EphemeralSequential.with_acls(Acls::new(&no_read)),
        )
        .await
        .unwrap();
    let holder_node = format!("{holder}-0-{sequence}");

    let locker = Locker::with_backend(zk.backend().await);
    let acquired = tokio::time::timeout(
        Duration::from_secs(30),
        locker.lock(&*key, ttl(10).wait(Duration::from_secs(1))),
    )
    .await
    .expect("the acquisition did not answer");
    match acquired {
        Err(LockError::Backend(error)) => {
            assert!(error.to_string().contains("ZooKeeper"), "{error}");
        }
        Ok(lease) => panic!(
            "granted fence {} past the unreadable node {holder_node}: two holders",
            lease.fence()
        ),
        Err(other) => panic!("expected a backend error, got {other}"),
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let children = plain.list_children(&parent).await.unwrap();
        if children == [holder_node.clone()] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the waiter's node stayed: {children:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
