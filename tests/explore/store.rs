//! The stores the explorer runs against: the in-process store, and a Redis server.

use dlock::backend::{Backend, MemoryBackend, RedisBackend};

/// A store the explorer runs against.
pub trait Store: Send + Sync {
    type Backend: Backend + Clone;

    /// A client of the store for worker `worker`: another process's connection.
    fn client(&self, worker: usize) -> Self::Backend;

    /// The name of key `index` of seed `seed`.
    fn key(&self, seed: u64, index: usize) -> String;

    /// Whether the store holds `key`, where it can say without taking it.
    fn is_held(&self, key: &str) -> Option<bool>;
}

/// A fresh in-process store.
#[derive(Default)]
pub struct MemoryStore(pub MemoryBackend);

impl Store for MemoryStore {
    type Backend = MemoryBackend;

    fn client(&self, _worker: usize) -> MemoryBackend {
        self.0.clone()
    }

    fn key(&self, seed: u64, index: usize) -> String {
        format!("s{seed}-k{index}")
    }

    fn is_held(&self, key: &str) -> Option<bool> {
        Some(self.0.is_held(key))
    }
}

/// A Redis server, one connection per worker, every key under a prefix of this run's own.
pub struct RedisStore {
    pub clients: Vec<RedisBackend>,
}

impl Store for RedisStore {
    type Backend = RedisBackend;

    fn client(&self, worker: usize) -> RedisBackend {
        self.clients[worker % self.clients.len()].clone()
    }

    fn key(&self, seed: u64, index: usize) -> String {
        format!("s{seed}-k{index}")
    }

    fn is_held(&self, _key: &str) -> Option<bool> {
        None
    }
}

/// A store lent to every seed of a run (the Redis store's connections are made once).
impl<S: Store> Store for &S {
    type Backend = S::Backend;

    fn client(&self, worker: usize) -> S::Backend {
        (**self).client(worker)
    }

    fn key(&self, seed: u64, index: usize) -> String {
        (**self).key(seed, index)
    }

    fn is_held(&self, key: &str) -> Option<bool> {
        (**self).is_held(key)
    }
}
