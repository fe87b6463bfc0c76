// `#[async_trait]` methods, called through `dyn Trait`: the attribute on a method of the
// `#[async_trait]` impl, and on a default method of the `#[async_trait]` trait. Both take the
// lock (a held key makes them return the failure), keep `?` and `return`, and stay `Send`.
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use dlock::{distributed_lock, LockError, LockOptions, Locker};

static LOCKS: LazyLock<Locker> = LazyLock::new(Locker::memory);

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Empty,
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError::Lock(error)
    }
}

struct Order {
    id: u64,
}

#[async_trait]
trait Accounts: Send + Sync {
    async fn submit(&self, open_id: &str, local_id: String) -> Result<u32, AppError>;

    async fn touch(&self, order: &Order);

    #[distributed_lock(key = "default:<open_id>", locker = &LOCKS)]
    async fn provided(&self, open_id: &str) -> Option<u32> {
        Some(open_id.len() as u32)
    }
}

struct Service {
    calls: AtomicU32,
}

#[async_trait]
impl Accounts for Service {
    #[distributed_lock(key = "acct:<open_id>", ttl = "3s", locker = &LOCKS)]
    async fn submit(&self, open_id: &str, mut local_id: String) -> Result<u32, AppError> {
        local_id.push_str(open_id);
        if local_id.is_empty() {
            return Err(AppError::Empty);
        }
        let calls = self.calls.fetch_add(1, Ordering::SeqCst);
        ready().await?;
        Ok(calls + 1)
    }

    // `order` is used only by the key: no "unused variable" warning for it.
    #[distributed_lock(key = "order:<order.id>", locker = &LOCKS)]
    async fn touch(&self, order: &Order) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

async fn ready() -> Result<(), AppError> {
    Ok(())
}

// `?Send` traits too.
#[async_trait(?Send)]
trait Local {
    async fn run(&self, id: u32) -> Result<u32, LockError>;
}

#[async_trait(?Send)]
impl Local for Service {
    #[distributed_lock(key = "local:<id>", locker = &LOCKS)]
    async fn run(&self, id: u32) -> Result<u32, LockError> {
        Ok(id)
    }
}

async fn held(key: &str) -> dlock::Lease {
    let options = LockOptions::new().ttl(Duration::from_secs(5));
    LOCKS.lock(key, options).await.unwrap()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let service = Arc::new(Service {
        calls: AtomicU32::new(0),
    });
    let accounts: Arc<dyn Accounts> = service.clone();

    assert_eq!(accounts.submit("oX7f", "device-1".into()).await.unwrap(), 1);
    accounts.touch(&Order { id: 7 }).await;
    assert_eq!(accounts.provided("oX7f").await, Some(4));
    assert_eq!((&*service as &dyn Local).run(3).await.unwrap(), 3);

    // The boxed future is still `Send`: it runs on a spawned task.
    let spawned = accounts.clone();
    let calls = tokio::spawn(async move { spawned.submit("b", "c".into()).await.unwrap() });
    assert_eq!(calls.await.unwrap(), 3);

    // Each takes its lock: with the key held elsewhere, the body does not run.
    let lease = held("acct:oX7f").await;
    let busy = accounts.submit("oX7f", "device-2".into()).await;
    assert!(matches!(busy, Err(AppError::Lock(LockError::Busy { .. }))), "{busy:?}");
    lease.release().await.unwrap();

    let lease = held("order:7").await;
    accounts.touch(&Order { id: 7 }).await;
    lease.release().await.unwrap();

    let lease = held("default:oX7f").await;
    assert_eq!(accounts.provided("oX7f").await, None);
    lease.release().await.unwrap();

    assert_eq!(service.calls.load(Ordering::SeqCst), 3);
}
