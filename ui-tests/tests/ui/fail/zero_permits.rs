use dlock::distributed_lock;

#[distributed_lock(key = "exports", permits = 0)]
async fn export() {}

fn main() {}
