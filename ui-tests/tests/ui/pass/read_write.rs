// `mode = "read"`: readers of a key run side by side; `mode = "write"` (the default) alone.
use std::sync::LazyLock;

use dlock::{current_lease, distributed_lock, Locker};

static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);

#[distributed_lock(key = "catalog:<shop>", mode = "read", wait = "5s", locker = &LOCKS)]
async fn read_catalog(shop: &str) -> Option<u64> {
    Some(current_lease()?.fence())
}

#[distributed_lock(key = "catalog:<shop>", mode = "write", wait = "5s", locker = &LOCKS)]
async fn write_catalog(shop: &str) -> Option<u64> {
    // A read nested in a writer's body re-enters its lease.
    read_catalog(shop).await
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let (a, b) = tokio::join!(read_catalog("acme"), read_catalog("acme"));
    assert!(a.is_some() && b.is_some());
    assert!(write_catalog("acme").await.is_some());
}
