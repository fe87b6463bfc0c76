// Behind `impl Trait`, the body's type cannot carry a lock failure: reported on the return type,
// without naming the hidden type, with the way to write it (`Result<impl Trait, E>`).
use dlock::distributed_lock;

pub trait IntoResponse {}

impl IntoResponse for (u16, &'static str) {}

#[distributed_lock(key = "acct:<id>")]
async fn handler(id: u32) -> impl IntoResponse {
    let _ = id;
    (200, "ok")
}

fn main() {}
