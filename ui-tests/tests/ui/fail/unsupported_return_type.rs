use dlock::distributed_lock;

#[distributed_lock(key = "k")]
async fn count() -> u32 {
    1
}

fn main() {}
