// `ttl`/`wait` given as paths of `Duration` constants: a constant, an associated constant, a
// path through a module, and a static; and the bounds: the shortest and the longest ttl, and a
// wait of `Duration::MAX` (wait until the key is free).
use std::sync::LazyLock;
use std::time::Duration;

use dlock::{distributed_lock, LockError, Locker};

static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);

const LOCK_TTL: Duration = Duration::from_secs(3);

mod config {
    pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(50);
}

static STATIC_TTL: Duration = Duration::from_millis(1500);

const SHORTEST_TTL: Duration = Duration::from_millis(1);
const LONGEST_TTL: Duration = Duration::from_millis(i64::MAX as u64);
const FOREVER: Duration = Duration::MAX;

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

#[distributed_lock(key = "short:<id>", ttl = SHORTEST_TTL, wait = FOREVER, locker = &LOCKS)]
async fn shortest(id: u32) -> Option<u32> {
    Some(id)
}

#[distributed_lock(key = "long:<id>", ttl = LONGEST_TTL, locker = &LOCKS)]
async fn longest(id: u32) -> Option<u32> {
    Some(id)
}

#[distributed_lock(key = "long:<id>", ttl = "9223372036854775807ms", wait = "18446744073709551615ms", locker = &LOCKS)]
async fn longest_literal(id: u32) -> Option<u32> {
    Some(id)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    assert_eq!(submit(1).await.unwrap(), 1);
    assert_eq!(Jobs.run(2).await.unwrap(), 2);
    assert_eq!(tick(3).await, Some(3));
    assert_eq!(shortest(4).await, Some(4));
    // Compiled, not run: a lease that long is for the compiler's check only.
    let _ = (longest(5), longest_literal(6));
}
