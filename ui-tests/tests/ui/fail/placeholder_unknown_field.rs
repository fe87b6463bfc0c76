// A misspelt field in a placeholder's path is reported on the key, which spells it.
use dlock::{distributed_lock, LockError};

pub struct Reservation {
    pub sku: String,
    pub quantity: u32,
}

#[distributed_lock(key = "stock:<req.skuu>")]
async fn reserve(req: &Reservation) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
