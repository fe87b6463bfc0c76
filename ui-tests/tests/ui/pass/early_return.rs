// `?` and `return` leave the body only; the lock is still released.
use dlock::{distributed_lock, LockError, Locker};

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Parse(std::num::ParseIntError),
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError::Lock(error)
    }
}

impl From<std::num::ParseIntError> for AppError {
    fn from(error: std::num::ParseIntError) -> Self {
        AppError::Parse(error)
    }
}

#[distributed_lock(key = "parse:<text>", locker = locker)]
async fn parse(locker: &Locker, text: &str) -> Result<u32, AppError> {
    if text.is_empty() {
        return Ok(0);
    }
    let value: u32 = text.parse()?;
    Ok(value)
}

#[distributed_lock(key = "first:<n>", locker = locker)]
async fn first_even(locker: &Locker, n: u32) -> Option<u32> {
    for i in 0..n {
        if i % 2 == 1 {
            return Some(i - 1);
        }
    }
    None
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let locker = Locker::memory();
    assert_eq!(parse(&locker, "").await.unwrap(), 0);
    assert!(matches!(parse(&locker, "x").await, Err(AppError::Parse(_))));
    assert_eq!(parse(&locker, "42").await.unwrap(), 42);
    assert_eq!(first_even(&locker, 5).await, Some(0));
}
