//! The default locker: `set_default_locker`, the `DLOCK_URL` fallback, and the error without
//! either. One test, in its own binary, because both are process-wide.

use dlock::{distributed_lock, LockError, Locker};

#[distributed_lock(key = "job:<id>")]
async fn job(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[tokio::test]
async fn default_locker_is_set_or_built_from_dlock_url_or_named_in_the_error() {
    // SAFETY of the environment: this binary runs this one test only, on one thread.
    std::env::remove_var("DLOCK_URL");
    let error = job(1).await.unwrap_err();
    assert!(matches!(error, LockError::NoLocker));
    let message = error.to_string();
    assert!(
        message.contains("set_default_locker") && message.contains("DLOCK_URL"),
        "{message}"
    );

    std::env::set_var("DLOCK_URL", "bogus://x");
    let error = job(2).await.unwrap_err();
    assert!(matches!(error, LockError::InvalidUrl { .. }), "{error:?}");

    std::env::set_var("DLOCK_URL", "memory://");
    assert_eq!(job(3).await.unwrap(), 3);

    // An explicit default wins over the environment.
    let locker = Locker::memory();
    let held = locker.lock("job:4", Default::default()).await.unwrap();
    dlock::set_default_locker(locker.clone());
    assert!(matches!(job(4).await, Err(LockError::Busy { .. })));
    held.release().await.unwrap();
    assert_eq!(job(4).await.unwrap(), 4);
}
