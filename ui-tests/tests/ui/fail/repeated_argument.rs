use dlock::distributed_lock;

#[distributed_lock(key = "k", ttl = "3s", ttl = "5s")]
async fn submit() {}

fn main() {}
