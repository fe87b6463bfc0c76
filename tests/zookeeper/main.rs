//! The ZooKeeper backend against a private server, started once per test process (or the server
//! `DLOCK_ZK_URL` names, which must tick every 500 ms and grant session timeouts of two
//! minutes); the outage test starts one of its own, to stop it.
//!
//! By topic: [`queue`] (waiters in line, one woken per release, nodes cleaned up), [`claim`]
//! (a grant its waiter does not claim goes to the next one after the claim window), [`abandoned`]
//! (nodes nobody uses go though their deletes are lost with the connection, and though nobody
//! waits for their answer), [`requests`] (requests carrying many paths stay within what the
//! server accepts), [`sessions`] (leases within what the session guarantees:
//! partitions, outages, a follower cut off) and [`paths`] (the URL's chroot, the longest key).

// The support every test crate shares, one directory up.
#[path = "../support/mod.rs"]
mod support;

mod abandoned;
mod claim;
mod inspect;
mod operator;
mod paths;
mod queue;
mod requests;
mod sessions;

use std::time::{Duration, Instant};

use dlock::backend::ZookeeperBackend;
use dlock::LockOptions;
use support::zk_server;

/// The tests' root, so a shared server's `/dlock` is left alone.
const ROOT: &str = "/dlock-test";

/// Long enough for the properties' leases of a minute: a ttl may be two thirds of the session
/// timeout less a tick.
const SESSION: Duration = Duration::from_secs(120);

/// The tick of the tests' servers.
const TICK: Duration = Duration::from_millis(500);

async fn backend_at(url: &str, session: Duration) -> ZookeeperBackend {
    ZookeeperBackend::builder(url)
        .unwrap()
        .root(ROOT)
        .session_timeout(session)
        .tick_time(TICK)
        .connect()
        .await
        .unwrap()
}

/// The shared server, and a client of its own that plays the operator.
struct Zookeeper {
    url: String,
    admin: ZookeeperBackend,
}

impl Zookeeper {
    async fn shared() -> Zookeeper {
        let url = zk_server::shared_url().await;
        let admin = backend_at(&url, SESSION).await;
        Zookeeper { url, admin }
    }

    /// A backend on a session of its own, as another process would have.
    async fn backend(&self) -> ZookeeperBackend {
        backend_at(&self.url, SESSION).await
    }

    async fn queue(&self, key: &str) -> Vec<String> {
        self.admin.queue(key).await.unwrap()
    }

    /// Waits until `key` has `len` lock nodes.
    async fn until_queue_is(&self, key: &str, len: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let queue = self.queue(key).await;
            if queue.len() == len {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the queue of `{key}` stayed {queue:?}, not {len} long"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl support::Store for Zookeeper {
    type Backend = ZookeeperBackend;

    async fn backend(&self) -> ZookeeperBackend {
        Zookeeper::backend(self).await
    }

    /// Deletes the holder's node from another session.
    async fn take_away(&self, key: &str) {
        assert!(
            self.admin.force_release(key).await.unwrap(),
            "`{key}` was not held"
        );
    }

    /// The same: a lease on ZooKeeper ends when its node goes.
    async fn expire(&self, key: &str) {
        self.take_away(key).await;
    }
}

lock_properties!(Zookeeper::shared().await);

fn ttl(secs: u64) -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(secs))
}
