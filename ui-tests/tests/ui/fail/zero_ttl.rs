use dlock::distributed_lock;

#[distributed_lock(key = "k", ttl = "0ms")]
async fn submit() {}

fn main() {}
