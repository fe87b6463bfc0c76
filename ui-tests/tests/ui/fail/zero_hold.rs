use dlock::distributed_lock;

#[distributed_lock(key = "nightly-cleanup", hold_at_least = "0s")]
async fn clean_up() {}

fn main() {}
