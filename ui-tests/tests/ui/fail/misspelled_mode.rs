use dlock::distributed_lock;

#[distributed_lock(key = "catalog", mode = "reed")]
async fn read_catalog() {}

fn main() {}
