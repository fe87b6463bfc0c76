use dlock::distributed_lock;

#[distributed_lock(key = "pair:<left>")]
async fn submit((left, right): (u32, u32)) {}

fn main() {}
