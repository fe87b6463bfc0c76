use dlock::distributed_lock;

#[distributed_lock(key = "")]
async fn submit() {}

fn main() {}
