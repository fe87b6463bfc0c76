//! Adversarial review scratch: macro cases (compile-only).
use dlock::{distributed_lock, Locker};
use std::sync::LazyLock;

static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);

// (1) A wrapper macro: parameter name written in the macro, its type passed by the user.
macro_rules! locked_getter {
    ($name:ident, $ty:ty) => {
        #[distributed_lock(key = "g:<id>", locker = &LOCKS)]
        async fn $name(id: $ty) -> Option<String> {
            Some(id.to_string())
        }
    };
}
locked_getter!(get_u64, u64);

// (2) A shared locker reached through a trait on `Locker`: nothing is built per call.
trait Shared {
    fn shared() -> &'static Locker;
}
impl Shared for Locker {
    fn shared() -> &'static Locker {
        &LOCKS
    }
}
#[distributed_lock(key = "fp", locker = Locker::shared())]
async fn fp() -> Option<()> {
    Some(())
}

// (3) Sound shapes: macro_rules and items in the body, inner attribute, self in key.
struct Acct {
    id: u64,
    locker: Locker,
}
impl Acct {
    #[distributed_lock(key = "a:<self.id>", locker = &self.locker)]
    async fn m(&self) -> Option<u64> {
        #![allow(unused_macros)]
        macro_rules! twice {
            ($e:expr) => {
                $e * 2
            };
        }
        fn helper(x: u64) -> u64 {
            x + 1
        }
        Some(helper(twice!(self.id)))
    }
}

#[tokio::test]
async fn compiles() {
    let _ = get_u64(1).await;
    let _ = fp().await;
    let a = Acct {
        id: 1,
        locker: Locker::memory(),
    };
    assert_eq!(a.m().await, Some(3));
}
