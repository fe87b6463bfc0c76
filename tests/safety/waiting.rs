//! Waiters leave no key held by nobody: a wait of `Duration::MAX`, a waiter that gives up as
//! the key is handed to it, and a head waiter that leaves while the holder's lease runs out.

use std::time::Duration;

use dlock::backend::MemoryBackend;
use dlock::{LockError, LockOptions, Locker};

use crate::support::unique_key;

#[tokio::test]
async fn waiting_for_duration_max_waits_without_overflowing() {
    let locker = Locker::memory();
    let key = unique_key("wait-max");
    let holder = locker.lock(&*key, LockOptions::new()).await.unwrap();
    let waiter = {
        let (locker, key) = (locker.clone(), key.clone());
        tokio::spawn(async move {
            locker
                .lock(key, LockOptions::new().wait(Duration::MAX))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    holder.release().await.unwrap();
    let lease = waiter.await.expect("the waiter panicked").unwrap();
    assert!(lease.is_held());
    let mut options = LockOptions::new();
    options.wait = Duration::MAX;
    options.ttl = Duration::from_secs(1);
    drop(lease);
    assert!(locker.lock(&*key, options).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_as_the_key_is_handed_over_leaves_it_free() {
    // The holder's release and the waiter's deadline fall at the same instant, over and over:
    // a hand-off that reaches a waiter which has just given up must not leave the key held.
    let store = MemoryBackend::new();
    let locker = Locker::with_backend(store.clone());
    let mut stuck = 0;
    for round in 0..2_000u32 {
        let key = format!("handoff-race-{round}");
        let holder = locker.lock(&*key, LockOptions::new()).await.unwrap();
        let waiter = {
            let (locker, key) = (locker.clone(), key.clone());
            tokio::spawn(async move {
                locker
                    .lock(key, LockOptions::new().wait(Duration::from_micros(200)))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_micros(u64::from(round % 7) * 40)).await;
        holder.release().await.unwrap();
        match waiter.await.unwrap() {
            Ok(lease) => lease.release().await.unwrap(),
            Err(LockError::Busy { .. }) => {}
            Err(other) => panic!("{other:?}"),
        }
        if store.is_held(&key) {
            stuck += 1;
        }
    }
    assert_eq!(
        stuck, 0,
        "keys held by nobody after a hand-off met a give-up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_head_waiter_leaves_the_next_one_watches_the_expiry() {
    let store = MemoryBackend::new();
    let locker = Locker::with_backend(store.clone());
    let key = unique_key("head-leaves");
    // A holder that neither renews nor releases: only its expiry frees the key.
    let holder = locker
        .lock(
            &*key,
            LockOptions::new()
                .ttl(Duration::from_millis(300))
                .renew(false),
        )
        .await
        .unwrap();
    let wait = |locker: Locker, key: String| async move {
        locker
            .lock(key, LockOptions::new().wait(Duration::from_secs(30)))
            .await
    };
    let first = tokio::spawn(wait(locker.clone(), key.clone()));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = tokio::spawn(wait(locker.clone(), key.clone()));
    tokio::time::sleep(Duration::from_millis(20)).await;
    first.abort();
    let lease = tokio::time::timeout(Duration::from_secs(2), second)
        .await
        .expect("the key expired 300 ms in, but the waiter left at the head slept on")
        .unwrap()
        .unwrap();
    assert!(lease.is_held());
    std::mem::forget(holder);
}
