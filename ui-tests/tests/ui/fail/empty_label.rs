use dlock::distributed_lock;

#[distributed_lock(key = "k", label = "")]
async fn submit() {}

fn main() {}
