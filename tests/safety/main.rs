//! The safety rules of the runtime itself, on the in-process store: a body never runs on a lease
//! the client knows is invalid, siblings inside a body never run at once, and each lease is
//! judged against its own deadline. Each test reproduces a way two bodies once ran at once, or a
//! key was once held by nobody.
//!
//! By rule: [`validity`] (no body runs on a lease known to be invalid), [`siblings`] (calls
//! joined inside a body take turns on its lease), [`tasks`] (no other task runs under a body's
//! lease), [`moved`] (a started call is inside the bodies it is polled in now), [`deadlines`]
//! (each lease judged against its own deadline), [`waiting`] (no key held by nobody when a
//! waiter leaves) and [`holds`] (a lease's hold lasts to its end whatever follows its release).

// The support every test crate shares, one directory up.
#[path = "../support/mod.rs"]
mod support;

mod deadlines;
mod holds;
mod moved;
mod siblings;
mod tasks;
mod validity;
mod waiting;

use std::time::Duration;

use dlock::backend::{AcquireRequest, Acquired, Backend, MemoryBackend, Renewal};
use dlock::{LockError, LockOptions, Locker, Owner};

/// The in-process store, with a reply that reaches its caller late: `acquire_delay` after the
/// store granted, `renew_delay` after it renewed. A late reply is what a stalled caller, a slow
/// network or a garbage-collection pause all look like to the lease.
#[derive(Clone, Default)]
struct Late {
    store: MemoryBackend,
    acquire_delay: Duration,
    /// Blocks the caller's thread instead of yielding: the caller's runtime is stalled.
    acquire_blocks: bool,
    renew_delay: Duration,
}

impl Backend for Late {
    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Option<Acquired>, LockError> {
        let granted = self.store.acquire(request).await;
        if self.acquire_blocks {
            std::thread::sleep(self.acquire_delay);
        } else {
            tokio::time::sleep(self.acquire_delay).await;
        }
        granted
    }

    async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        self.store.release(key, owner).await
    }

    async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        let renewed = self.store.renew(leases).await;
        tokio::time::sleep(self.renew_delay).await;
        renewed
    }

    fn release_now(&self, key: &str, owner: Owner) -> bool {
        self.store.release_now(key, owner)
    }

    fn expires_at_a_set_time(&self) -> bool {
        true
    }

    fn shares_reads(&self) -> bool {
        self.store.shares_reads()
    }

    async fn expire_after(
        &self,
        key: &str,
        owner: Owner,
        after: Duration,
    ) -> Result<bool, LockError> {
        self.store.expire_after(key, owner, after).await
    }
}

#[test]
fn a_forked_child_draws_owner_tokens_of_its_own() {
    // Draw once so that whatever per-process state the generator keeps exists before the fork.
    let _ = Owner::random();
    let mut fds = [0; 2];
    // SAFETY: plain POSIX calls; the child only draws a token, writes it and exits.
    unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        let pid = libc::fork();
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let token = Owner::random().as_u128().to_le_bytes();
            libc::write(fds[1], token.as_ptr().cast(), token.len());
            libc::_exit(0);
        }
        let parent = Owner::random().as_u128();
        let mut child = [0u8; 16];
        assert_eq!(libc::read(fds[0], child.as_mut_ptr().cast(), 16), 16);
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
        assert_ne!(
            u128::from_le_bytes(child),
            parent,
            "parent and child drew the same owner token after fork"
        );
    }
}

#[tokio::test]
async fn a_key_longer_than_the_limit_is_refused_before_it_reaches_the_store() {
    let store = MemoryBackend::new();
    let locker = Locker::with_backend(store.clone());
    let at_limit = "k".repeat(Locker::MAX_KEY_BYTES);
    drop(locker.lock(&*at_limit, LockOptions::new()).await.unwrap());
    for len in [Locker::MAX_KEY_BYTES + 1, 100 << 20] {
        match locker.lock("k".repeat(len), LockOptions::new()).await {
            Err(LockError::InvalidKey { key, reason }) => {
                assert!(key.len() < 200, "the error repeats the whole key");
                assert!(reason.contains("1048576"), "{reason}");
            }
            other => panic!("a {len}-byte key: {other:?}"),
        }
    }
    assert_eq!(
        store.acquire_calls(),
        1,
        "an oversized key reached the store"
    );
}
