// Every receiver form, in an inherent impl.
use std::sync::Arc;

use dlock::{distributed_lock, LockError, Locker};

struct Account {
    id: u64,
    locker: Locker,
    balance: u64,
}

impl Account {
    #[distributed_lock(key = "acct:<self.id>", locker = &self.locker)]
    async fn by_ref(&self) -> Result<u64, LockError> {
        Ok(self.balance)
    }

    #[distributed_lock(key = "acct:<self.id>", locker = &self.locker)]
    async fn by_mut(&mut self, amount: u64) -> Result<u64, LockError> {
        self.balance += amount;
        Ok(self.balance)
    }

    #[distributed_lock(key = "acct:<self.id>", locker = &self.locker)]
    async fn by_value(self) -> Result<Self, LockError> {
        Ok(self)
    }

    #[distributed_lock(key = "acct:<self.id>", locker = &self.locker)]
    async fn by_arc(self: Arc<Self>) -> Result<u64, LockError> {
        Ok(self.balance)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut account = Account { id: 7, locker: Locker::memory(), balance: 1 };
    assert_eq!(account.by_ref().await.unwrap(), 1);
    assert_eq!(account.by_mut(2).await.unwrap(), 3);
    let account = Arc::new(account.by_value().await.unwrap());
    assert_eq!(account.by_arc().await.unwrap(), 3);
}
