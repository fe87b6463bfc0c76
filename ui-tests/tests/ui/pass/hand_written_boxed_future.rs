// A method written by hand in the shape `#[async_trait]` gives its methods: the boxed future is
// locked, and an item declared before the `Box::pin` (it runs nothing) is accepted.
use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::time::Duration;

use dlock::{distributed_lock, LockError, LockOptions, Locker};

static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);

struct Service;

impl Service {
    #[distributed_lock(key = "acct:<open_id>", locker = &LOCKS)]
    fn submit<'a>(
        &'a self,
        open_id: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<usize, LockError>> + Send + 'a>> {
        fn weight(open_id: &str) -> usize {
            open_id.len()
        }
        Box::pin(async move { Ok(weight(open_id)) })
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    assert_eq!(Service.submit("oX7f").await.unwrap(), 4);
    let held = LOCKS.lock("acct:oX7f", LockOptions::new().ttl(Duration::from_secs(5))).await.unwrap();
    let busy = Service.submit("oX7f").await;
    assert!(matches!(busy, Err(LockError::Busy { .. })), "{busy:?}");
    held.release().await.unwrap();
}
