use dlock::distributed_lock;

#[distributed_lock(key = "acct:<>")]
async fn submit(open_id: &str) {}

fn main() {}
