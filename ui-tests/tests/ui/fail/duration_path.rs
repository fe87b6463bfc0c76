// `ttl`/`wait` take a literal or the path of a `Duration` constant: another type, a value that
// is no constant, and an expression that is no path are each reported on what was written.
use std::time::Duration;

use dlock::{distributed_lock, LockError};

const LOCK_TTL_SECS: u64 = 3;

#[distributed_lock(key = "acct:<id>", ttl = LOCK_TTL_SECS)]
async fn wrong_type(id: u32) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "acct:<id>", wait = wait)]
async fn not_a_constant(id: u32, wait: Duration) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "acct:<id>", ttl = Duration::from_secs(3))]
async fn not_a_path(id: u32) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
