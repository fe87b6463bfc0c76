use dlock::distributed_lock;

#[distributed_lock(key = "k", wait = "99999999999999999999h")]
async fn submit() {}

fn main() {}
