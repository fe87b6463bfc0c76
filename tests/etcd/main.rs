//! The etcd backend against a private one-member cluster, started once per test process: the
//! shared properties, then by topic [`leases`] (the etcd lease under every node: revoked, its
//! holders lose their locks and its waiters fail) and [`operator`] (inspect, list, force).

// The support every test crate shares, one directory up.
#[path = "../support/mod.rs"]
mod support;

mod leases;
mod operator;
mod restart;

use std::time::Duration;

use dlock::backend::{Backend, EtcdBackend};
use support::etcd_server;

/// The tests' root, so nothing of another run is in the way.
const ROOT: &str = "dlock-test";

/// The etcd lease's TTL, the longest ttl a lock may have: long enough for the properties'
/// leases of a minute, asked of the backend directly (a `Locker` would shorten them).
const LEASE_TTL: Duration = Duration::from_secs(60);

async fn backend_at(url: &str) -> EtcdBackend {
    EtcdBackend::builder(url)
        .unwrap()
        .root(ROOT)
        .lease_ttl(LEASE_TTL)
        .connect()
        .await
        .unwrap()
}

/// The shared member, and a client of its own that plays the operator.
struct Etcd {
    url: String,
    admin: EtcdBackend,
}

impl Etcd {
    async fn shared() -> Etcd {
        let url = etcd_server::shared_url().await;
        let admin = backend_at(&url).await;
        Etcd { url, admin }
    }
}

impl support::Store for Etcd {
    type Backend = EtcdBackend;

    async fn backend(&self) -> EtcdBackend {
        backend_at(&self.url).await
    }

    /// Deletes the holder's node from another client.
    async fn take_away(&self, key: &str) {
        let state = self.admin.inspect(key).await.unwrap();
        let holder = state.holders().first().expect("the key was not held");
        assert!(
            self.admin
                .force_release(key, holder.owner())
                .await
                .unwrap()
                .is_some(),
            "`{key}` changed hands"
        );
    }

    /// The same: a lock on etcd ends when its node goes.
    async fn expire(&self, key: &str) {
        self.take_away(key).await;
    }
}

lock_properties!(Etcd::shared().await);

/// A plain etcd client on `url` (`etcd://host:port`), for what no dlock client does.
async fn raw_client(url: &str) -> etcd_client::Client {
    let endpoint = url.trim_start_matches("etcd://").replace("etcd://", "");
    etcd_client::Client::connect([format!("http://{endpoint}")], None)
        .await
        .unwrap()
}
