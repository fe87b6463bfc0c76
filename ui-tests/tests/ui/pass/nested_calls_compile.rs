// Regression: annotated calls nested five deep, re-entrant and not, compile without raising the
// crate's recursion limit (each level's future used to nest the next one's type).
use dlock::{distributed_lock, LockError, Locker};

#[distributed_lock(key = "order:<id>", locker = locker)]
async fn level1(locker: &Locker, id: u64) -> Result<u64, LockError> {
    level2(locker, id).await
}

#[distributed_lock(key = "order:<id>", locker = locker)]
async fn level2(locker: &Locker, id: u64) -> Result<u64, LockError> {
    level3(locker, id + 1).await
}

#[distributed_lock(key = "order:<id>", locker = locker)]
async fn level3(locker: &Locker, id: u64) -> Result<u64, LockError> {
    level4(locker, id).await
}

#[distributed_lock(key = "order:<id>", locker = locker)]
async fn level4(locker: &Locker, id: u64) -> Result<u64, LockError> {
    level5(locker, id + 1).await
}

#[distributed_lock(key = "order:<id>", locker = locker)]
async fn level5(locker: &Locker, id: u64) -> Result<u64, LockError> {
    Ok(dlock::current_lease().unwrap().fence() + id)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    assert!(level1(&Locker::memory(), 1).await.unwrap() > 0);
}
