// The future is `Send` exactly when the body's is: an `Rc` held across an await is not.
use std::rc::Rc;

use dlock::distributed_lock;

#[distributed_lock(key = "k")]
async fn submit() {
    let shared = Rc::new(1);
    tokio::task::yield_now().await;
    drop(shared);
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    assert_send(submit());
}
