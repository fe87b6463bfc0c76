// No `locker`: the default locker; `()` and `Option` return types; `crate = "…"`.
mod reexport {
    pub use dlock;
}

use dlock::distributed_lock;

#[distributed_lock(key = "tick")]
async fn tick(counter: &mut u32) {
    *counter += 1;
}

#[distributed_lock(key = "maybe", ttl = "1m30s", wait = "250ms", renew = false, on_lost = "continue", crate = "reexport::dlock")]
async fn maybe() -> Option<&'static str> {
    Some("yes")
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    dlock::set_default_locker(dlock::Locker::memory());
    let mut counter = 0;
    tick(&mut counter).await;
    assert_eq!(counter, 1);
    assert_eq!(maybe().await, Some("yes"));
}
