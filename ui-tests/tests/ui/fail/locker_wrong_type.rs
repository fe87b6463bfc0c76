// A `locker` expression of the wrong type is reported on the expression, with the fix.
use dlock::{distributed_lock, LockError, Locker};

pub struct Service {
    locker: Locker,
}

impl Service {
    #[distributed_lock(key = "acct:<id>", locker = self.locker)]
    async fn submit(&self, id: u32) -> Result<(), LockError> {
        Ok(())
    }
}

fn main() {}
