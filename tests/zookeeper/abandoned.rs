//! Nodes nobody will use any more — a dropped waiter's, a released holder's — go even when the
//! answer to their delete is lost with the connection while the session lives on: otherwise
//! every later acquirer of the key would queue behind a node nobody deletes, for as long as
//! that session lives.
//!
//! Each test runs one client through a [`FaultProxy`] on a session of two minutes, so the
//! session surely survives the faults; the key must come free within seconds, not when the
//! session ends.

use std::time::{Duration, Instant};

use dlock::Locker;

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

/// A link that flaps for half a minute: every new connection gets the session back, then
/// breaks on the first request it carries. A release whose delete keeps being lost must keep
/// trying for as long as the session lives, and succeed once the link holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_node_goes_after_the_link_flapped_for_half_a_minute() {
    let zk = Zookeeper::shared().await;
    let key = unique_key("flapping-release");
    let (link, url) = FaultProxy::in_front_of(&zk.url);
    let holder = Locker::with_backend(backend_at(&url, SESSION).await);
    let lease = holder.lock(&*key, ttl(60)).await.unwrap();

    // The connection breaks; the new one carries the handshake (the connect request and a
    // ping), and the release's delete breaks it: the release answers an error and goes on
    // trying in the background.
    link.break_after(Direction::ToServer, 2);
    link.cut_all();
    let released = tokio::time::timeout(Duration::from_secs(10), lease.release())
        .await
        .expect("the release did not answer after its connection broke");
    assert!(released.is_err(), "the release's delete got through");

    tokio::time::sleep(Duration::from_secs(30)).await;
    let cuts = link.cuts();
    assert!(cuts >= 20, "the link broke only {cuts} times");
    assert_eq!(
        zk.queue(&key).await.len(),
        1,
        "the released node went while every request was lost"
    );
    link.break_after(Direction::ToServer, 0);

    the_key_comes_free(&zk, &key, "a release whose delete was lost for 30 s").await;
    drop(holder);
}
