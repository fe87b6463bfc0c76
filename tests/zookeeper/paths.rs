//! Where a key's lock nodes go on ZooKeeper: under the chroot a URL names (created if missing),
//! and only if their path fits what the server accepts.

use std::time::Duration;

use dlock::backend::{ZookeeperBackend, ZOOKEEPER_MAX_PATH_BYTES};
use dlock::{LockError, LockOptions, Locker, Owner};

use crate::support::{unique_key, zk_server};
use crate::{ttl, Zookeeper};

/// ZooKeeper answers a request over its `jute.maxbuffer` (1 MiB by default) by dropping the
/// connection, so a key whose lock node path would pass `ZOOKEEPER_MAX_PATH_BYTES` is refused up
/// front, whole; the longest key allowed is served; neither disturbs the session's other leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_key_is_served_and_a_longer_one_refused_naming_the_limit() {
    let zk = Zookeeper::shared().await;
    let locker = Locker::with_backend(zk.backend().await);
    let bystander = locker.lock(unique_key("bystander"), ttl(10)).await.unwrap();
    // root + "/" + key + "/" + owner (32) + "-" + attempt (up to 20) + "-" + sequence (up to 11).
    let longest = ZOOKEEPER_MAX_PATH_BYTES - zk.admin.root().len() - 1 - 66;
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

/// ZooKeeper checks a path's UTF-16 code units and refuses surrogates, so a character above
/// U+FFFF (an emoji, CJK Extension B) cannot stand in a node name as it is: the key is locked
/// all the same (its parent's name escapes the character), read back by `inspect` and `list` as
/// given, and released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_with_characters_above_u_ffff_is_locked_listed_and_released() {
    let zk = Zookeeper::shared().await;
    let locker = Locker::with_backend(zk.backend().await);
    let prefix = unique_key("emoji:");
    let key = format!("{prefix}🔒\u{20000}");
    let lease = tokio::time::timeout(
        Duration::from_secs(30),
        locker.lock(&*key, LockOptions::new().wait(Duration::from_secs(1))),
    )
    .await
    .expect("the lock must answer within its wait")
    .unwrap();
    assert_eq!(lease.key(), key);
    assert_eq!(zk.queue(&key).await.len(), 1);
    let state = locker.inspect(&key).await.unwrap();
    assert!(state.is_held(), "{state:?}");
    assert_eq!(state.holders()[0].owner(), lease.owner());
    assert_eq!(locker.list(&prefix).await.unwrap(), vec![key.clone()]);
    lease.release().await.unwrap();
    assert!(!locker.inspect(&key).await.unwrap().is_held());
    assert!(locker.list(&prefix).await.unwrap().is_empty());

    // A chroot or root, which is not escaped, says which character ZooKeeper would refuse.
    match Locker::connect(&format!("{}/apps/🔒", zk.url)).await {
        Err(LockError::InvalidUrl { reason, .. }) => {
            assert!(reason.contains("U+1F512"), "{reason}");
        }
        other => panic!("expected InvalidUrl, got {:?}", other.err()),
    }
    let root = ZookeeperBackend::builder(&zk.url).unwrap().root("/🔒");
    match root.connect().await {
        Err(LockError::InvalidOptions { reason }) => {
            assert!(reason.contains("U+1F512"), "{reason}");
        }
        other => panic!("expected InvalidOptions, got {:?}", other.err()),
    }
}
