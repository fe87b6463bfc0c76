use dlock::{distributed_lock, LockError};

#[distributed_lock(key = "acct:<user_id>")]
async fn submit(open_id: &str, local_id: &str) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
