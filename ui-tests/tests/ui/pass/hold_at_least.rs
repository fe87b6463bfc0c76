// `hold_at_least` as a literal and as a `Duration` constant: a job scheduled on every replica
// runs once per window; a second run in the window finds the key held and is skipped.
use std::sync::LazyLock;
use std::time::Duration;

use dlock::{distributed_lock, Locker};

static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);

const WINDOW: Duration = Duration::from_secs(60);

#[distributed_lock(key = "nightly-cleanup", hold_at_least = "1h", locker = &LOCKS)]
async fn clean_up() -> Option<()> {
    Some(())
}

#[distributed_lock(key = "report:<day>", hold_at_least = WINDOW, ttl = "1m", renew = false, locker = &LOCKS)]
async fn report(day: &str) -> Option<&str> {
    Some(day)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    assert_eq!(clean_up().await, Some(()));
    assert_eq!(clean_up().await, None, "ran twice in one window");
    assert_eq!(report("2026-12-02").await, Some("2026-12-02"));
    assert_eq!(report("2026-12-02").await, None, "ran twice in one window");
}
