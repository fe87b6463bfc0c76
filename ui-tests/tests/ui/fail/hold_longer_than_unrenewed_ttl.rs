use dlock::distributed_lock;

// A lease without renewal ends at its ttl, 5 s here: a hold of a minute could not be kept.
#[distributed_lock(key = "nightly-cleanup", ttl = "5s", renew = false, hold_at_least = "1m")]
async fn clean_up() {}

fn main() {}
