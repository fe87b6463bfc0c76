use dlock::distributed_lock;

#[distributed_lock(key = "exports", permits = 5000)]
async fn export() {}

fn main() {}
