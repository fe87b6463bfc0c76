// `permits = N`: at most N bodies per key at once, each with a lease of its own, shown under
// the key written in the attribute.
use std::sync::LazyLock;

use dlock::{current_lease, distributed_lock, Locker};

static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);

#[distributed_lock(key = "exports:<tenant>", permits = 2, wait = "5s", locker = &LOCKS)]
async fn export(tenant: &str) -> Option<String> {
    Some(current_lease()?.key().to_owned())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let (a, b) = tokio::join!(export("acme"), export("acme"));
    assert_eq!(a.as_deref(), Some("exports:acme"));
    assert_eq!(b.as_deref(), Some("exports:acme"));
}
