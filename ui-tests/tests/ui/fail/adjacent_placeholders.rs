use dlock::distributed_lock;

#[distributed_lock(key = "acct:<a><b>")]
async fn submit(a: &str, b: &str) {}

fn main() {}
