use dlock::distributed_lock;

const KEY: &str = "acct";

#[distributed_lock(key = KEY)]
async fn submit() {}

fn main() {}
