// A hand-written method returning a boxed future: what runs before its `Box::pin` would run
// when the method is called, before the lock is taken. The attribute says to move it.
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};

use dlock::{distributed_lock, LockError};

pub struct Service {
    calls: AtomicU32,
}

impl Service {
    #[distributed_lock(key = "acct:<open_id>")]
    pub fn submit<'a>(
        &'a self,
        open_id: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<u32, LockError>> + Send + 'a>> {
        let calls = self.calls.fetch_add(1, Ordering::SeqCst);
        println!("submitting {open_id}");
        Box::pin(async move { Ok(calls) })
    }
}

fn main() {}
