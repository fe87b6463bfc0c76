use dlock::distributed_lock;

#[distributed_lock(key = "acct:open_id>")]
async fn submit(open_id: &str) {}

fn main() {}
