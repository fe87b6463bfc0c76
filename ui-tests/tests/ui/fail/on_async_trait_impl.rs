// Above `#[async_trait]` on the impl block, the attribute says to put it on the method.
use async_trait::async_trait;
use dlock::{distributed_lock, LockError};

#[async_trait]
pub trait Accounts {
    async fn submit(&self, open_id: &str) -> Result<(), LockError>;
}

pub struct Service;

#[distributed_lock(key = "acct:<open_id>")]
#[async_trait]
impl Accounts for Service {
    async fn submit(&self, open_id: &str) -> Result<(), LockError> {
        let _ = open_id;
        Ok(())
    }
}

fn main() {}
