//! SPEC's properties on the in-memory backend.

mod support;

use dlock::backend::MemoryBackend;

/// The in-process store; `take_away` hands the key to a stranger.
#[derive(Clone, Default)]
struct Memory(MemoryBackend);

impl support::Store for Memory {
    type Backend = MemoryBackend;

    async fn backend(&self) -> MemoryBackend {
        self.0.clone()
    }

    async fn take_away(&self, key: &str) {
        assert!(self.0.steal(key), "`{key}` was not held");
    }

    async fn expire(&self, key: &str) {
        assert!(self.0.expire(key), "`{key}` was not held");
    }
}

lock_properties!(Memory::default());
