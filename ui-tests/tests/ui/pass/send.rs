// The returned future is `Send` when the body's is: it can be spawned.
use std::sync::LazyLock;

use dlock::{distributed_lock, LockError, Locker};

static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);

#[distributed_lock(key = "job:<id>", locker = &LOCKS)]
async fn job(id: u64) -> Result<u64, LockError> {
    tokio::task::yield_now().await;
    Ok(id)
}

fn assert_send<T: Send>(value: T) -> T {
    value
}

#[tokio::main]
async fn main() {
    let handle = tokio::spawn(assert_send(job(3)));
    assert_eq!(handle.await.unwrap().unwrap(), 3);
}
