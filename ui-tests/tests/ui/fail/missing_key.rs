use dlock::distributed_lock;

#[distributed_lock(ttl = "3s")]
async fn submit() {}

fn main() {}
