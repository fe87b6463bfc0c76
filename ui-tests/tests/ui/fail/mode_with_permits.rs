use dlock::distributed_lock;

#[distributed_lock(key = "exports", permits = 3, mode = "read")]
async fn export() {}

fn main() {}
