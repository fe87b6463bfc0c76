//! The locker built from `DLOCK_URL`: callers that arrive while it connects share that one
//! attempt instead of queueing one attempt each. In its own binary, as the environment is
//! process-wide.

mod support;

use std::time::{Duration, Instant};

use dlock::{distributed_lock, LockError};

#[distributed_lock(key = "job:<id>")]
async fn job(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_callers_share_one_failed_connect() {
    std::env::set_var(
        "DLOCK_URL",
        format!("redis://127.0.0.1:{}", support::black_hole()),
    );

    let started = Instant::now();
    assert!(matches!(job(0).await, Err(LockError::Backend(_))));
    let one_attempt = started.elapsed();

    // Not cached: the next callers try again, together.
    let started = Instant::now();
    let calls: Vec<_> = (1..=3).map(|id| tokio::spawn(job(id))).collect();
    let mut slowest = Duration::ZERO;
    for call in calls {
        assert!(matches!(call.await.unwrap(), Err(LockError::Backend(_))));
        slowest = slowest.max(started.elapsed());
    }
    assert!(
        slowest < one_attempt * 3 / 2,
        "three callers took {slowest:?} where one attempt takes {one_attempt:?}: \
         they waited for each other's attempts"
    );
}
