use dlock::{distributed_lock, LockError, Locker};

// A locker built in the attribute is a new store at every call: calls would never exclude each
// other.
#[distributed_lock(key = "acct:<id>", locker = &Locker::memory())]
async fn per_call_store(id: u32) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "acct:<id>", locker = &dlock::Locker::with_backend(dlock::backend::MemoryBackend::new()))]
async fn per_call_backend(id: u32) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
