// A method of a trait impl, with native async fn in traits.
use dlock::{distributed_lock, LockError, Locker};

trait Repository {
    async fn save(&self, id: u64) -> Result<(), LockError>;
}

struct Rows {
    locker: Locker,
}

impl Repository for Rows {
    #[distributed_lock(key = "row:<id>", locker = &self.locker)]
    async fn save(&self, id: u64) -> Result<(), LockError> {
        Ok(())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Rows { locker: Locker::memory() }.save(1).await.unwrap();
}
