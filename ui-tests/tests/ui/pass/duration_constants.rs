// `ttl`/`wait` given as paths of `Duration` constants: a constant, an associated constant, a
// path through a module, and a static.
use std::sync::LazyLock;
use std::time::Duration;

use dlock::{distributed_lock, LockError, Locker};

static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);

const LOCK_TTL: Duration = Duration::from_secs(3);

mod config {
    pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(50);
}

static STATIC_TTL: Duration = Duration::from_millis(1500);

struct Jobs;

impl Jobs {
    const TTL: Duration = Duration::from_secs(10);

    #[distributed_lock(key = "job:<id>", ttl = Self::TTL, wait = config::LOCK_WAIT, locker = &LOCKS)]
    async fn run(&self, id: u32) -> Result<u32, LockError> {
        Ok(dlock::current_lease().map_or(0, |_| id))
    }
}

#[distributed_lock(key = "acct:<id>", ttl = LOCK_TTL, locker = &LOCKS)]
async fn submit(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(key = "tick:<id>", ttl = STATIC_TTL, wait = "10ms", locker = &LOCKS)]
async fn tick(id: u32) -> Option<u32> {
    Some(id)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    assert_eq!(submit(1).await.unwrap(), 1);
    assert_eq!(Jobs.run(2).await.unwrap(), 2);
    assert_eq!(tick(3).await, Some(3));
}
