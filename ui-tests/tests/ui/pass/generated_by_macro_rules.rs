// Functions written by a `macro_rules!` macro, their parameter names among its arguments; and a
// `locker` expression that only reads a shared locker through a user's own trait.
use std::sync::LazyLock;

use dlock::{distributed_lock, Locker};

macro_rules! locked_getter {
    ($name:ident, $param:ident) => {
        #[distributed_lock(key = "get:<id>", locker = &LOCKS)]
        async fn $name($param: u64) -> Option<u64> {
            Some($param)
        }
    };
}

static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);

locked_getter!(get, id);

trait Shared {
    fn shared() -> &'static Locker;
}

impl Shared for Locker {
    fn shared() -> &'static Locker {
        &LOCKS
    }
}

#[distributed_lock(key = "put:<id>", locker = Locker::shared())]
async fn put(id: u64) -> Option<u64> {
    Some(id)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    assert_eq!(runtime.block_on(get(7)), Some(7));
    assert_eq!(runtime.block_on(put(8)), Some(8));
}
