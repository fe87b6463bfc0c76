//! What `Locker::force_release` (`dlock release --force`) does on every store that can: the
//! holder named by its owner is evicted, its lease is reported lost at its next renewal, the key
//! goes to a waiter as on a release, and the next grant's fence is above the evicted one. Any
//! other holder is left alone: one that took the key after the named one left, and the waiter a
//! first copy of the call handed the key to, where the call is sent again. Each scenario takes a
//! locker on a store (and key space) of its own, and shuts it down.

use std::time::Duration;

use dlock::{LockError, LockOptions, Locker, Owner};

pub const TTL: Duration = Duration::from_secs(3);

/// How long a test waits for what must happen (a renewal comes every ttl/3): patience, not a
/// speed requirement.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// The owner of `key`'s holder, as an operator reads it before evicting it.
pub async fn holder_of(locker: &Locker, key: &str) -> Owner {
    locker.inspect(key).await.unwrap().holders()[0].owner()
}

/// Asserts that `lease` holds `key`: the store names its owner, and a rival finds it busy.
pub async fn still_holds(locker: &Locker, key: &str, lease: &dlock::Lease) {
    let state = locker.inspect(key).await.unwrap();
    assert_eq!(state.holders().len(), 1, "{state:?}");
    assert_eq!(state.holders()[0].owner(), lease.owner(), "{state:?}");
    assert!(lease.is_held());
    let rival = locker.lock(key, LockOptions::new().ttl(TTL)).await;
    assert!(
        matches!(rival, Err(LockError::Busy { .. })),
        "a rival got the key: {rival:?}"
    );
}

/// The holder an operator read (A) released the key and B took it before the eviction: the
/// eviction of A changes nothing, and B keeps the key.
pub async fn keeps_a_holder_that_took_the_key_since(locker: Locker) {
    let a = locker
        .lock("shown", LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    let shown = holder_of(&locker, "shown").await;
    assert_eq!(shown, a.owner());
    a.release().await.unwrap();
    let b = locker
        .lock("shown", LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    assert_eq!(locker.force_release("shown", shown).await.unwrap(), None);
    still_holds(&locker, "shown", &b).await;
    b.release().await.unwrap();
    locker.shutdown().await.unwrap();
}

/// The eviction sent twice (a client sends a call again after a timeout or a dropped
/// connection): the first copy hands the key to the waiter W1, the second finds it no longer
/// A's and leaves W1 holding it.
pub async fn a_copy_sent_again_leaves_the_next_holder_alone(locker: Locker) {
    let a = locker
        .lock("twice", LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    let w1 = tokio::spawn({
        let locker = locker.clone();
        async move {
            let options = LockOptions::new().ttl(TTL).wait(Duration::from_secs(30));
            locker.lock("twice", options).await
        }
    });
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while locker.inspect("twice").await.unwrap().waiters() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let evicted = a.owner();
    assert_eq!(
        locker.force_release("twice", evicted).await.unwrap(),
        Some(a.fence())
    );
    assert_eq!(locker.force_release("twice", evicted).await.unwrap(), None);
    let w1 = tokio::time::timeout(PATIENCE, w1)
        .await
        .expect("the waiter is handed the key")
        .unwrap()
        .unwrap();
    still_holds(&locker, "twice", &w1).await;
    drop(a);
    w1.release().await.unwrap();
    locker.shutdown().await.unwrap();
}

/// Evicts a holder while another task waits: the holder's lease is lost, the waiter gets the
/// key with a greater fence, and the evicted holder's release leaves the new holder alone.
pub async fn evicts_and_hands_on(locker: Locker) {
    let stuck = locker
        .lock("report", LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let locker = locker.clone();
        async move {
            let options = LockOptions::new().ttl(TTL).wait(Duration::from_secs(30));
            locker.lock("report", options).await
        }
    });
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while locker.inspect("report").await.unwrap().waiters() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    assert_eq!(
        locker
            .force_release("report", holder_of(&locker, "report").await)
            .await
            .unwrap(),
        Some(stuck.fence())
    );
    tokio::time::timeout(PATIENCE, stuck.lost())
        .await
        .expect("the evicted lease is reported lost");
    let next = tokio::time::timeout(PATIENCE, waiter)
        .await
        .expect("the waiter is handed the key")
        .unwrap()
        .unwrap();
    assert!(
        next.fence() > stuck.fence(),
        "{} after {}",
        next.fence(),
        stuck.fence()
    );
    stuck.release().await.unwrap();
    let state = locker.inspect("report").await.unwrap();
    assert_eq!(state.holders().len(), 1);
    assert_eq!(state.holders()[0].fence(), next.fence());
    assert!(next.is_held());

    // Nobody waits now: the key is freed, and the next grant's fence is greater still.
    assert_eq!(
        locker.force_release("report", next.owner()).await.unwrap(),
        Some(next.fence())
    );
    let after = locker
        .lock("report", LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    assert!(after.fence() > next.fence());
    after.release().await.unwrap();
    let gone = next.owner();
    drop(next);

    assert_eq!(locker.force_release("report", gone).await.unwrap(), None);
    assert_eq!(
        locker
            .force_release("never-held", Owner::random())
            .await
            .unwrap(),
        None
    );
    locker.shutdown().await.unwrap();
}

/// The eviction made by an operator's process (`operator`) hands the key to a waiter of the
/// holder's process (`holder`, another backend on the same store), with a greater fence.
pub async fn hands_the_key_to_a_waiter_of_another_process(holder: Locker, operator: Locker) {
    let stuck = holder
        .lock("job", LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    let waiting = holder.clone();
    let waiter = tokio::spawn(async move {
        let options = LockOptions::new().ttl(TTL).wait(Duration::from_secs(30));
        waiting.lock("job", options).await
    });
    // Counted by the waiter's own backend: a SQL store's waiters are seen by their process.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while holder.inspect("job").await.unwrap().waiters() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        operator.force_release("job", stuck.owner()).await.unwrap(),
        Some(stuck.fence())
    );
    let next = tokio::time::timeout(PATIENCE, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(next.fence() > stuck.fence());
    next.release().await.unwrap();
    holder.shutdown().await.unwrap();
    operator.shutdown().await.unwrap();
}
