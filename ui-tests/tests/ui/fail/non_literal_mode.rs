use dlock::distributed_lock;

#[distributed_lock(key = "catalog", mode = read)]
async fn read_catalog() {}

fn main() {}
