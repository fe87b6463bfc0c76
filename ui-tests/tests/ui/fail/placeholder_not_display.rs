use dlock::distributed_lock;

struct OpenId(u64);

#[distributed_lock(key = "acct:<open_id>")]
async fn submit(open_id: OpenId) {}

fn main() {}
