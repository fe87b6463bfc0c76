// Generic functions, `impl Trait` arguments, `mut` and destructured parameters.
use std::fmt::Display;

use dlock::{distributed_lock, LockError, Locker};

#[distributed_lock(key = "item:<id>", locker = locker)]
async fn generic<T: Display + Send, U>(locker: &Locker, id: T, payload: U) -> Result<U, LockError> {
    Ok(payload)
}

#[distributed_lock(key = "item:<id>", locker = locker)]
async fn impl_trait(locker: &Locker, id: impl Display, items: impl IntoIterator<Item = u32>) -> Result<u32, LockError> {
    Ok(items.into_iter().sum())
}

#[distributed_lock(key = "item:<id>", locker = locker)]
async fn mut_and_pattern(locker: &Locker, mut id: u32, (a, b): (u32, u32)) -> Result<u32, LockError> {
    id += a + b;
    Ok(id)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let locker = Locker::memory();
    assert_eq!(generic(&locker, 1, "x").await.unwrap(), "x");
    assert_eq!(impl_trait(&locker, "k", vec![1, 2]).await.unwrap(), 3);
    assert_eq!(mut_and_pattern(&locker, 1, (2, 3)).await.unwrap(), 6);
}
