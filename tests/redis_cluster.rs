//! SPEC's properties on a Redis Cluster of three primaries (feature `redis-cluster`): every key
//! of a lock shares a hash slot, the scripts run on the node that owns it, and the waiters' wake-
//! ups cross nodes through the cluster's pub/sub.
#![cfg(feature = "redis-cluster")]

mod support;

use std::time::Duration;

use dlock::backend::{Backend, RedisBackend};
use dlock::{LockOptions, Locker};
use support::redis_server::RedisCluster;
use support::unique_key;

struct Cluster {
    cluster: RedisCluster,
    names: RedisBackend,
}

impl Cluster {
    fn start() -> Cluster {
        let cluster = RedisCluster::start();
        let names = RedisBackend::builder(cluster.url()).build().unwrap();
        Cluster { cluster, names }
    }

    async fn raw(&self) -> redis::cluster_async::ClusterConnection {
        let client = redis::cluster::ClusterClient::new(self.cluster.node_urls()).unwrap();
        client.get_async_connection().await.unwrap()
    }
}

impl support::Store for Cluster {
    type Backend = RedisBackend;

    async fn backend(&self) -> RedisBackend {
        RedisBackend::connect(&self.cluster.url()).await.unwrap()
    }

    async fn take_away(&self, key: &str) {
        support::redis_server::steal_lock(&mut self.raw().await, &self.names.lock_key(key)).await;
    }

    async fn expire(&self, key: &str) {
        support::redis_server::delete_lock(&mut self.raw().await, &self.names.lock_key(key)).await;
    }
}

lock_properties!(Cluster::start());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_across_slots_answer_per_lease() {
    let cluster = Cluster::start();
    let backend = RedisBackend::connect(&cluster.cluster.url()).await.unwrap();
    let locker = Locker::with_backend(backend.clone());
    let keys: Vec<String> = (0..40).map(|i| unique_key(&format!("slot-{i}"))).collect();
    let mut leases = Vec::new();
    for key in &keys {
        leases.push(
            locker
                .lock(&**key, LockOptions::new().ttl(Duration::from_secs(60)))
                .await
                .unwrap(),
        );
    }
    let renewals: Vec<_> = leases
        .iter()
        .map(|lease| {
            dlock::backend::Renewal::new(lease.key(), lease.owner(), Duration::from_secs(60))
        })
        .collect();
    assert_eq!(
        backend.renew(&renewals).await.unwrap(),
        vec![true; keys.len()]
    );
    support::Store::take_away(&cluster, &keys[3]).await;
    let held = backend.renew(&renewals).await.unwrap();
    assert_eq!(held.iter().filter(|held| !**held).count(), 1);
    assert!(!held[3]);
}
