// The return types that carry a lock failure, also when spelt through `impl Trait` and aliases.
use std::fmt::Display;

use dlock::{distributed_lock, LockError};

#[derive(Debug)]
struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

type AppResult<T> = Result<T, AppError>;

#[distributed_lock(key = "a:<id>")]
async fn through_alias(id: u32) -> AppResult<u32> {
    Ok(id)
}

#[distributed_lock(key = "b:<id>")]
async fn impl_in_result(id: u32) -> Result<impl Display, AppError> {
    Ok(id)
}

#[distributed_lock(key = "c:<id>")]
async fn impl_in_option(id: u32) -> Option<impl Display> {
    Some(id)
}

// The type behind `impl Trait` is an `Option`: it carries the failure itself.
#[distributed_lock(key = "d:<id>")]
async fn impl_of_option(id: u32) -> impl std::fmt::Debug {
    Some(id)
}

#[distributed_lock(key = "e:<id>")]
async fn boxed_error(id: u32) -> Result<u32, Box<dyn std::error::Error + Send + Sync>> {
    Ok(id)
}

#[distributed_lock(key = "f:<id>")]
async fn unit(id: u32) -> () {
    let _ = id;
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    dlock::set_default_locker(dlock::Locker::memory());
    assert_eq!(through_alias(1).await.unwrap(), 1);
    assert_eq!(impl_in_result(2).await.unwrap().to_string(), "2");
    assert_eq!(impl_in_option(3).await.unwrap().to_string(), "3");
    assert_eq!(format!("{:?}", impl_of_option(4).await), "Some(4)");
    assert_eq!(boxed_error(5).await.unwrap(), 5);
    unit(6).await;
}
