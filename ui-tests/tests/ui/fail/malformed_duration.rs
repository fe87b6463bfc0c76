use dlock::distributed_lock;

#[distributed_lock(key = "k", ttl = "3 secs")]
async fn submit() {}

fn main() {}
