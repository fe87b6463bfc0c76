use dlock::distributed_lock;

const EXPORTERS: u32 = 3;

#[distributed_lock(key = "exports", permits = "3")]
async fn export() {}

#[distributed_lock(key = "imports", permits = EXPORTERS)]
async fn import() {}

#[distributed_lock(key = "uploads", permits = 2.5)]
async fn upload() {}

fn main() {}
