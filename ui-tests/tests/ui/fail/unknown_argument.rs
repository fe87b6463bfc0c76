use dlock::distributed_lock;

#[distributed_lock(key = "k", timeout = "3s")]
async fn submit() {}

fn main() {}
