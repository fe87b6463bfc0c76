// A `ttl` constant is checked at compile time against the bounds every call would check: at
// least 1 ms, at most `i64::MAX` milliseconds. Out of them, every call would fail with
// `LockError::InvalidOptions` (and a `()` function would skip every call). The error points at
// the constant's path, in a method of a generic impl and in a generic function too.
use std::time::Duration;

use dlock::{distributed_lock, LockError};

const LOCK_TTL: Duration = Duration::ZERO;

mod config {
    pub const UNDER_A_MILLISECOND: std::time::Duration = std::time::Duration::from_micros(999);
}

const FOREVER: Duration = Duration::MAX;

#[distributed_lock(key = "k", ttl = LOCK_TTL)]
async fn zero() {}

#[distributed_lock(key = "k", ttl = config::UNDER_A_MILLISECOND)]
async fn too_short() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "k", ttl = FOREVER)]
async fn too_long() -> Option<()> {
    Some(())
}

struct Jobs<T>(T);

impl<T: Send + Sync> Jobs<T> {
    #[distributed_lock(key = "job:<id>", ttl = self::LOCK_TTL)]
    async fn run(&self, id: u32) {}
}

#[distributed_lock(key = "item:<item>", ttl = crate::LOCK_TTL)]
async fn generic<T: std::fmt::Display>(item: T) {}

fn main() {}
