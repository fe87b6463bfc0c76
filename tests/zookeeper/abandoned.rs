//! Nodes nobody will use any more — a dropped waiter's, a released holder's — go even when the
//! answer to their delete is lost with the connection while the session lives on, and even when
//! nobody waits for that answer any more: otherwise every later acquirer of the key would queue
//! behind a node nobody deletes, for as long as that session lives.
//!
//! Each test runs one client through a [`FaultProxy`] on a session of two minutes, so the
//! session surely survives the faults; the key must come free within seconds, not when the
//! session ends.

use std::time::{Duration, Instant};

use dlock::backend::{AcquireRequest, Backend, ZookeeperBackend};
use dlock::{Locker, Owner};

use crate::support::fault_proxy::{Direction, FaultProxy};
use crate::support::unique_key;
use crate::{backend_at, ttl, Zookeeper, SESSION};

/// Waits until the proxy has read more than `seen` chunks going `direction`; false if none came
/// within `patience`.
async fn until_chunks_pass(
    link: &FaultProxy,
    direction: Direction,
    seen: u64,
    patience: Duration,
) -> bool {
    let deadline = Instant::now() + patience;
    while link.chunks(direction) <= seen {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    true
}

/// The holder releases `key`; a client of its own must get it within a few seconds, and then
/// be alone in its queue.
async fn the_key_comes_free(zk: &Zookeeper, key: &str, what: &str) {
    let rival = Locker::with_backend(zk.backend().await);
    let started = Instant::now();
    let got = rival.lock(key, ttl(60).wait(Duration::from_secs(10))).await;
    assert!(
        got.is_ok(),
        "{what}: the key was still held by nobody {:?} later ({got:?}); its queue: {:?}",
        started.elapsed(),
        zk.queue(key).await
    );
    let queue = zk.queue(key).await;
    assert_eq!(queue.len(), 1, "{what}: an orphan node stayed: {queue:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_s_node_goes_when_its_delete_is_lost_with_the_connection() {
    let zk = Zookeeper::shared().await;
    let key = unique_key("lost-delete");
    let holder = Locker::with_backend(zk.backend().await);
    let lease = holder.lock(&*key, ttl(60)).await.unwrap();
    let (link, url) = FaultProxy::in_front_of(&zk.url);
    let waiter = Locker::with_backend(backend_at(&url, SESSION).await);
    let task = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        async move {
            waiter
                .lock(&*key, ttl(60).wait(Duration::from_secs(60)))
                .await
        }
    });
    zk.until_queue_is(&key, 2).await;

    // The delete the dropped waiter sends is held on its way, then lost with the connection;
    // the client reconnects at once, on the same session.
    link.stall_open(Direction::ToServer);
    let sent = link.chunks(Direction::ToServer);
    task.abort();
    assert!(
        until_chunks_pass(&link, Direction::ToServer, sent, Duration::from_secs(5)).await,
        "the dropped waiter sent no delete"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    link.cut_all();

    lease.release().await.unwrap();
    the_key_comes_free(&zk, &key, "a waiter dropped as its delete was lost").await;
    // The waiter's session lived on throughout: only its delete could remove the node.
    drop(waiter);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_dropped_before_its_create_was_answered_leaves_no_node() {
    let zk = Zookeeper::shared().await;
    let key = unique_key("lost-create");
    let holder = Locker::with_backend(zk.backend().await);
    let lease = holder.lock(&*key, ttl(60)).await.unwrap();
    let (link, url) = FaultProxy::in_front_of(&zk.url);
    let waiter = Locker::with_backend(backend_at(&url, SESSION).await);

    // The create lands, but its answer is held: the waiter does not know its node's name.
    link.stall_open(Direction::ToClient);
    let task = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        async move {
            waiter
                .lock(&*key, ttl(60).wait(Duration::from_secs(60)))
                .await
        }
    });
    zk.until_queue_is(&key, 2).await;
    // Dropped, it looks for its node by its owner; that listing's answer is held too, and
    // lost with the connection.
    let sent = link.chunks(Direction::ToServer);
    task.abort();
    assert!(
        until_chunks_pass(&link, Direction::ToServer, sent, Duration::from_secs(5)).await,
        "the dropped waiter did not look for its node"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    link.cut_all();

    lease.release().await.unwrap();
    the_key_comes_free(&zk, &key, "a waiter dropped before its create was answered").await;
    drop(waiter);
}

/// A link that flaps past the release's patience (10 s): every new connection gets the session
/// back, then breaks on the first request it carries. A release whose delete keeps being lost
/// must keep trying after its caller was told so, for as long as the session lives, and succeed
/// once the link holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_node_goes_after_the_link_flapped_past_the_release_s_patience() {
    let zk = Zookeeper::shared().await;
    let key = unique_key("flapping-release");
    let (link, url) = FaultProxy::in_front_of(&zk.url);
    let holder = Locker::with_backend(backend_at(&url, SESSION).await);
    let lease = holder.lock(&*key, ttl(60)).await.unwrap();

    // The connection breaks; the new one carries the handshake (the connect request and a
    // ping), and the release's delete breaks it, and so on: the release is never confirmed, its
    // caller is told so when the locker's patience runs out, and the delete goes on in the
    // background.
    link.break_after(Direction::ToServer, 2);
    link.cut_all();
    let release = tokio::spawn(lease.release());

    tokio::time::sleep(Duration::from_secs(13)).await;
    assert!(
        release.is_finished(),
        "the release did not answer while the link flapped"
    );
    assert!(
        release.await.unwrap().is_err(),
        "the release's delete got through"
    );
    let cuts = link.cuts();
    assert!(cuts >= 8, "the link broke only {cuts} times");
    assert_eq!(
        zk.queue(&key).await.len(),
        1,
        "the released node went while every request was lost"
    );
    link.break_after(Direction::ToServer, 0);

    the_key_comes_free(&zk, &key, "a release whose delete was lost for 13 s").await;
    drop(holder);
}

/// Locks `key` through a link of its own, silences the link both ways (the connection stays
/// open), and releases, giving up on the answer after 200 ms once the delete is on its way: the
/// holder, and the link, to break.
async fn a_release_left_on_a_silent_link(zk: &Zookeeper, key: &str) -> (Locker, FaultProxy) {
    let (link, url) = FaultProxy::in_front_of(&zk.url);
    let holder = Locker::with_backend(backend_at(&url, SESSION).await);
    let lease = holder.lock(key, ttl(60)).await.unwrap();
    link.stall_open(Direction::Both);
    let sent = link.chunks(Direction::ToServer);
    let answered = tokio::time::timeout(Duration::from_millis(200), lease.release()).await;
    assert!(
        answered.is_err(),
        "a release was answered through a silent link: {answered:?}"
    );
    assert!(
        until_chunks_pass(&link, Direction::ToServer, sent, Duration::from_secs(5)).await,
        "the release sent no delete"
    );
    (holder, link)
}

/// A caller that stops waiting for its release (a `select!` that took another branch, an
/// aborted task) leaves the delete in flight; when the connection then breaks and the delete is
/// lost with it, the delete is sent again on the session the client reconnects to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_its_caller_stopped_waiting_for_deletes_the_node_though_the_delete_was_lost() {
    let zk = Zookeeper::shared().await;
    let key = unique_key("dropped-release");
    let (holder, link) = a_release_left_on_a_silent_link(&zk, &key).await;
    // The connection breaks with the delete on it; the client reconnects at once, on the same
    // session.
    link.cut_all();

    the_key_comes_free(&zk, &key, "a release dropped before its delete was lost").await;
    drop(holder);
}

/// A release the store does not answer is given up by the locker after 10 s, and its caller
/// told so; the delete must go on, so that once the link carries requests again the key comes
/// free, though the session never ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_given_up_unanswered_deletes_the_node_once_the_link_is_back() {
    let zk = Zookeeper::shared().await;
    let key = unique_key("unanswered-release");
    let (link, url) = FaultProxy::in_front_of(&zk.url);
    let holder = Locker::with_backend(backend_at(&url, SESSION).await);
    let lease = holder.lock(&*key, ttl(60)).await.unwrap();

    link.stall_open(Direction::Both);
    let released = tokio::time::timeout(Duration::from_secs(30), lease.release())
        .await
        .expect("a release through a silent link was never given up");
    assert!(
        released.is_err(),
        "a release was answered through a silent link"
    );
    // The client learns that the connection is gone and reconnects, on the same session.
    link.cut_all();

    the_key_comes_free(&zk, &key, "a release given up unanswered").await;
    drop(holder);
}

/// A second release of an owner whose first release's delete is still unanswered (the locker
/// sends one for a caller that stopped waiting, a shutdown one for a release in flight) does not
/// answer that the key is not held while its node is still there: it waits for that delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_release_waits_for_the_first_one_s_delete() {
    let zk = Zookeeper::shared().await;
    let key = unique_key("second-release");
    let (link, url) = FaultProxy::in_front_of(&zk.url);
    let backend = backend_at(&url, SESSION).await;
    let owner = Owner::random();
    let request = AcquireRequest::new(&key, owner, Duration::from_secs(60), Duration::ZERO);
    assert!(backend.acquire(&request).await.unwrap().is_some());

    link.stall_open(Direction::Both);
    let sent = link.chunks(Direction::ToServer);
    let release = |backend: ZookeeperBackend, key: String| {
        tokio::spawn(async move { backend.release(&key, owner).await })
    };
    let first = release(backend.clone(), key.clone());
    assert!(
        until_chunks_pass(&link, Direction::ToServer, sent, Duration::from_secs(5)).await,
        "the release sent no delete"
    );
    let second = release(backend.clone(), key.clone());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !second.is_finished(),
        "a second release answered while the node was still there: {:?}",
        second.await
    );
    assert_eq!(zk.queue(&key).await.len(), 1);

    link.cut_all();
    assert!(
        first.await.unwrap().unwrap(),
        "the first release took no node"
    );
    assert!(
        !second.await.unwrap().unwrap(),
        "the second release took a node too"
    );
    assert!(zk.queue(&key).await.is_empty());
    assert!(!backend.release(&key, owner).await.unwrap());
}

/// A shutdown waits for the delete of a release whose caller stopped waiting: once it returns,
/// the node is gone, and the process may exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_waits_for_the_delete_of_a_release_nobody_waits_for() {
    let zk = Zookeeper::shared().await;
    let key = unique_key("release-at-shutdown");
    let (holder, link) = a_release_left_on_a_silent_link(&zk, &key).await;
    let shutdown = tokio::spawn({
        let holder = holder.clone();
        async move { holder.shutdown().await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    link.cut_all();

    shutdown.await.unwrap().unwrap();
    let queue = zk.queue(&key).await;
    assert!(
        queue.is_empty(),
        "the shutdown left a node behind: {queue:?}"
    );
}
