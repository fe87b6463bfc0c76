use dlock::distributed_lock;

#[distributed_lock(key = "k")]
fn submit() {}

fn main() {}
