//! `init_from_env` after the default locker was already built from `DLOCK_URL` on first use:
//! one locker from the environment per process, so a call through either excludes the other.
//! In its own binary, as the environment and the default locker are process-wide.

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
    again.shutdown().await.unwrap();
}
