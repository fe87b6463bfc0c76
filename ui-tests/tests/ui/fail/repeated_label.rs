use dlock::distributed_lock;

#[distributed_lock(key = "k", label = "billing::submit", label = "billing::retry")]
async fn submit() {}

fn main() {}
