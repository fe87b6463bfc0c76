//! `init_from_env` after the default locker was already built from `DLOCK_URL` on first use:
//! one locker from the environment per process, so a call through either excludes the other.
//! In its own binary, as the environment and the default locker are process-wide.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dlock::{distributed_lock, LockError};
use tokio::sync::Notify;

#[distributed_lock(key = "<key>")]
async fn holds_for_a_while(key: &str, entered: &Notify) -> Result<(), LockError> {
    entered.notify_one();
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(())
}

#[distributed_lock(key = "<key>")]
async fn enters(key: &str) -> Result<(), LockError> {
    Ok(())
}

/// Holds `key` through work inside one poll (blocking code after an `.await`), then says so.
#[distributed_lock(key = "<key>")]
async fn works_in_one_poll(
    key: &str,
    entered: &Notify,
    done: &AtomicBool,
) -> Result<(), LockError> {
    entered.notify_one();
    tokio::time::sleep(Duration::from_millis(50)).await;
    std::thread::sleep(Duration::from_secs(2));
    done.store(true, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_from_env_after_a_lazily_built_default_keeps_one_locker_from_the_environment() {
    // SAFETY of the environment: this binary runs this one test only.
    std::env::set_var("DLOCK_URL", "memory://");
    let entered = std::sync::Arc::new(Notify::new());
    let first = tokio::spawn({
        let entered = entered.clone();
        async move { holds_for_a_while("report", &entered).await }
    });
    entered.notified().await;

    // Boot code that runs after the first locked call (a service that serves before it).
    let locker = dlock::init_from_env().await.unwrap();

    assert!(
        matches!(enters("report").await, Err(LockError::Busy { .. })),
        "a second call entered while the first held the key: init_from_env replaced the default \
         with a locker on another store"
    );
    first.await.unwrap().unwrap();
    enters("report").await.unwrap();
    // The locker returned is the default one: what it holds, the attribute's calls wait for.
    let held = locker
        .lock("report", dlock::LockOptions::new())
        .await
        .unwrap();
    assert!(matches!(
        enters("report").await,
        Err(LockError::Busy { .. })
    ));
    held.release().await.unwrap();

    // A locker shut down is not handed out again: a new one is connected.
    locker.shutdown().await.unwrap();
    let again = dlock::init_from_env().await.unwrap();
    enters("report").await.unwrap();

    // Shut down while a body works inside one poll: the shutdown waits for it to rest before it
    // releases the key, and the next locker from the environment (with `memory://`, a store of
    // its own) is connected only after, so it cannot let the key in beside that body.
    let (entered, done) = (Arc::new(Notify::new()), Arc::new(AtomicBool::new(false)));
    let working = tokio::spawn({
        let (entered, done) = (entered.clone(), done.clone());
        async move { works_in_one_poll("report", &entered, &done).await }
    });
    entered.notified().await;
    // Slept on the test's own thread: the runtime's timers may wait for the worker the body
    // blocks.
    std::thread::sleep(Duration::from_millis(200));
    let shutting_down = tokio::spawn(async move { again.shutdown().await });
    std::thread::sleep(Duration::from_millis(50));
    let next = dlock::init_from_env().await.unwrap();
    assert!(
        done.load(Ordering::SeqCst),
        "a locker from the environment was connected while a body of the one shutting down still          worked under its key"
    );
    let _ = working.await.unwrap();
    shutting_down.await.unwrap().unwrap();
    next.shutdown().await.unwrap();
}
