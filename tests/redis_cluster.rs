//! The lock's properties on a Redis Cluster of three primaries (feature `redis-cluster`): every key
//! of a lock shares a hash slot, the scripts run on the node that owns it, and the waiters' wake-
//! ups cross nodes through the cluster's pub/sub.
#![cfg(feature = "redis-cluster")]

mod support;

use std::time::Duration;

use dlock::backend::{Backend, RedisBackend, Renewal};
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
        let names = RedisBackend::builder(&cluster.url())
            .unwrap()
            .build()
            .unwrap();
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

/// A short lease never shortens the time a long lease's renewal is given: with every node
/// answering 300 ms late, the renewal of a 30 s lease (a 10 s renewal period) is confirmed,
/// though a 300 ms lease in the same batch, on another slot, is not (its 100 ms period is over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lease_in_the_batch_does_not_cut_a_long_lease_renewal_short() {
    let cluster = Cluster::start();
    let backend = RedisBackend::connect(&cluster.cluster.url()).await.unwrap();
    let (short, long) = (unique_key("short"), unique_key("long"));
    let (short_ttl, long_ttl) = (Duration::from_millis(300), Duration::from_secs(30));
    let (short_owner, long_owner) = (dlock::Owner::random(), dlock::Owner::random());
    for (key, owner, ttl) in [
        (&short, short_owner, short_ttl),
        (&long, long_owner, long_ttl),
    ] {
        let request = dlock::backend::AcquireRequest::new(key, owner, ttl, Duration::ZERO);
        assert!(backend.acquire(&request).await.unwrap().is_some());
    }
    let renewals = [
        Renewal::new(&short, short_owner, short_ttl),
        Renewal::new(&long, long_owner, long_ttl),
    ];
    // Scripts loaded: the renewals below are one round trip per slot.
    assert_eq!(backend.renew(&renewals).await.unwrap(), vec![true, true]);
    for url in cluster.cluster.node_urls() {
        let mut node = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(300)
            .query_async(&mut node)
            .await
            .unwrap();
    }
    let held = backend.renew_each(&renewals).await;
    assert!(
        matches!(held.as_deref(), Ok([None, Some(true)])),
        "the long lease's renewal was given up with the short one's: {held:?}"
    );
}

/// A primary that goes down costs the leases on its slots, and only those: the renewals of the
/// leases on the other primaries are confirmed all the same, round after round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_down_loses_only_the_leases_on_its_slots() {
    let mut cluster = Cluster::start();
    let locker = Locker::connect(&cluster.cluster.url()).await.unwrap();
    let ttl = Duration::from_secs(3);
    let keys: Vec<String> = (0..30).map(|i| unique_key(&format!("down-{i}"))).collect();
    let mut leases = Vec::new();
    for key in &keys {
        leases.push(
            locker
                .lock(&**key, LockOptions::new().ttl(ttl))
                .await
                .unwrap(),
        );
    }
    // Which leases the first node holds: it answers for its own slots and redirects the rest.
    let mut first_node = redis::Client::open(cluster.cluster.node_urls()[0].clone())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut on_first = Vec::new();
    for key in &keys {
        let answer: redis::RedisResult<bool> = redis::cmd("EXISTS")
            .arg(cluster.names.lock_key(key))
            .query_async(&mut first_node)
            .await;
        on_first.push(answer.is_ok());
    }
    assert!(on_first.iter().any(|&on| on) && on_first.iter().any(|&on| !on));
    cluster.cluster.kill_node(0);
    // Two ttls: every lease has been renewed several times over, or lost.
    tokio::time::sleep(2 * ttl).await;
    let lost_elsewhere: Vec<&str> = leases
        .iter()
        .zip(&on_first)
        .filter(|(lease, &on_first)| !on_first && !lease.is_held())
        .map(|(lease, _)| lease.key())
        .collect();
    assert!(
        lost_elsewhere.is_empty(),
        "{} of {} leases on the primaries still up were lost with the one that went down",
        lost_elsewhere.len(),
        on_first.iter().filter(|&&on| !on).count()
    );
    for (lease, &on_first) in leases.iter().zip(&on_first) {
        if on_first {
            assert!(
                !lease.is_held(),
                "a lease on the node that went down is held"
            );
        }
    }
}

/// Keys whose hash tag would be empty — the empty key, keys that start with `}` — still keep
/// all of a lock's Redis keys in one slot: acquire, a contended hand-off and release work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_with_an_empty_hash_tag_keep_to_one_slot() {
    let cluster = Cluster::start();
    let locker = Locker::connect(&cluster.cluster.url()).await.unwrap();
    for key in ["", "}", "}abc", "}{x}", "{}"] {
        let holder = locker
            .lock(key, LockOptions::new())
            .await
            .unwrap_or_else(|error| panic!("`{key}`: {error}"));
        let waiter = tokio::spawn({
            let locker = locker.clone();
            async move {
                locker
                    .lock(key, LockOptions::new().wait(Duration::from_secs(10)))
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let holder_fence = holder.fence();
        holder.release().await.unwrap();
        let lease = waiter
            .await
            .unwrap()
            .unwrap_or_else(|error| panic!("`{key}`, waiting: {error}"));
        assert!(lease.fence() > holder_fence, "`{key}`");
        lease.release().await.unwrap();
    }
}

/// With `min_replicas`, each grant's `WAIT` goes to the primary that ran its script, in the
/// same pipeline: on a cluster whose primaries have no replica, no grant counts — each is
/// released, and the call says how many replicas acknowledged it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_on_primaries_without_replicas_refuses_every_grant_and_leaves_none() {
    let cluster = Cluster::start();
    let backend = support::redis_acknowledged_by(&cluster.cluster.url(), 1).await;
    let locker = Locker::with_backend(backend);
    let mut raw = cluster.raw().await;
    for i in 0..6 {
        let key = unique_key(&format!("unreplicated-{i}"));
        let error = locker
            .lock(&*key, LockOptions::new().ttl(Duration::from_secs(2)))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("min_replicas") && error.contains("0 of the 1"),
            "{error}"
        );
        let holder: Option<String> = redis::cmd("GET")
            .arg(cluster.names.lock_key(&key))
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(holder, None, "{key}: the grant was not undone");
    }
}

/// With `min_replicas(1)` on a cluster whose primaries have a replica each, grants and renewals
/// on every node's slots are acknowledged by that node's replica and count; asking for more
/// replicas than a primary has fails, naming how many acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_counts_the_replica_of_the_primary_that_granted() {
    let cluster = RedisCluster::start_with_replicas();
    let backend = support::redis_acknowledged_by(&cluster.url(), 1).await;
    let locker = Locker::with_backend(backend.clone());
    let keys: Vec<String> = (0..12)
        .map(|i| unique_key(&format!("replicated-{i}")))
        .collect();
    let mut leases = Vec::new();
    for key in &keys {
        leases.push(locker.lock(&**key, LockOptions::new()).await.unwrap());
    }
    let renewals: Vec<Renewal<'_>> = leases
        .iter()
        .map(|lease| Renewal::new(lease.key(), lease.owner(), Duration::from_secs(30)))
        .collect();
    let held = backend.renew_each(&renewals).await.unwrap();
    assert_eq!(held, vec![Some(true); keys.len()]);
    for lease in leases {
        lease.release().await.unwrap();
    }

    let greedy = support::redis_acknowledged_by(&cluster.url(), 2).await;
    let error = Locker::with_backend(greedy)
        .lock(&*keys[0], LockOptions::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("1 of the 2"), "{error}");
}

/// The acquire script as the backend sends it: acquire.lua with grant.lua and common.lua spliced
/// in where it says so (as scripts.rs does).
fn acquire_script() -> String {
    include_str!("../dlock-runtime/src/backend/redis/acquire.lua")
        .replacen(
            "--!grant\n",
            include_str!("../dlock-runtime/src/backend/redis/grant.lua"),
            1,
        )
        .replacen(
            "--!common\n",
            include_str!("../dlock-runtime/src/backend/redis/common.lua"),
            1,
        )
}

/// On a cluster, redis-rs sends a command again by itself after its connection dropped (or after
/// a redirection), and does not say so: any acquire call may have a first copy still on its way
/// when the lease is released. That copy, landing after the release, takes no effect — it would
/// otherwise find the key free and grant it to nobody for a full ttl. Replayed here by hand: the
/// acquisition's first try, with the keys and arguments the backend sent, after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_an_acquire_call_after_the_release_takes_no_effect() {
    let cluster = Cluster::start();
    let locker = Locker::connect(&cluster.cluster.url()).await.unwrap();
    let mut raw = cluster.raw().await;
    let key = unique_key("late-copy");
    let ttl = Duration::from_secs(30);
    let lease = locker
        .lock(&*key, LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let lock_key = cluster.names.lock_key(&key);
    let prefix = lock_key
        .strip_suffix(&format!("{{{key}}}"))
        .expect("the lock key is the prefix and the hash-tagged key");
    // Granted while nobody waited: the owner's token, marked `-`, on the value's first line.
    let stored: String = redis::cmd("GET")
        .arg(&lock_key)
        .query_async(&mut raw)
        .await
        .unwrap();
    let owner = stored
        .lines()
        .next()
        .unwrap_or_default()
        .trim_end_matches('-')
        .to_owned();
    assert_eq!(owner.len(), 32, "{stored}");
    lease.release().await.unwrap();

    // The late first copy: KEYS the lock, its fence counter, its queue; ARGV the owner, the ttl
    // in ms, the prefix and the holder's description, as a first try sends them.
    let _: redis::Value = redis::cmd("EVAL")
        .arg(acquire_script())
        .arg(3)
        .arg(&lock_key)
        .arg(cluster.names.fence_key(&key))
        .arg(cluster.names.queue_key(&key))
        .arg(&owner)
        .arg(ttl.as_millis() as u64)
        .arg(prefix)
        .arg(format!("{}/host/late-copy", std::process::id()))
        .query_async(&mut raw)
        .await
        .unwrap();
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&lock_key)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(
        pttl, -2,
        "a late copy of the acquire call granted the released key to nobody, for {pttl} ms"
    );
}

/// As above, for a lease whose release came before the end of its hold: the key is left to
/// expire by itself at that end, and a late first copy of the acquisition's call, landing after
/// that, takes no effect either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_an_acquire_call_after_a_hold_ended_takes_no_effect() {
    let cluster = Cluster::start();
    let locker = Locker::connect(&cluster.cluster.url()).await.unwrap();
    let mut raw = cluster.raw().await;
    let key = unique_key("late-copy-hold");
    let ttl = Duration::from_secs(30);
    let lease = locker
        .lock(
            &*key,
            LockOptions::new()
                .ttl(ttl)
                .hold_at_least(Duration::from_millis(200)),
        )
        .await
        .unwrap();
    let lock_key = cluster.names.lock_key(&key);
    let prefix = lock_key
        .strip_suffix(&format!("{{{key}}}"))
        .expect("the lock key is the prefix and the hash-tagged key");
    let stored: String = redis::cmd("GET")
        .arg(&lock_key)
        .query_async(&mut raw)
        .await
        .unwrap();
    let owner = stored
        .lines()
        .next()
        .unwrap_or_default()
        .trim_end_matches('-')
        .to_owned();
    assert_eq!(owner.len(), 32, "{stored}");
    // Released within the hold: the key expires at the hold's end.
    lease.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&lock_key)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(pttl, -2, "the hold did not end");

    let _: redis::Value = redis::cmd("EVAL")
        .arg(acquire_script())
        .arg(3)
        .arg(&lock_key)
        .arg(cluster.names.fence_key(&key))
        .arg(cluster.names.queue_key(&key))
        .arg(&owner)
        .arg(ttl.as_millis() as u64)
        .arg(prefix)
        .arg(format!("{}/host/late-copy", std::process::id()))
        .query_async(&mut raw)
        .await
        .unwrap();
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&lock_key)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(
        pttl, -2,
        "a late copy of the acquire call granted the key, its hold over, to nobody, for {pttl} ms"
    );
}

/// On a cluster `inspect` reads a lock on the node that owns it, wherever its slot is, and
/// `list` walks every primary: twelve keys spread over the three primaries are all listed,
/// each once, and a prefix lists only its keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_reads_each_node_and_list_walks_every_primary() {
    let cluster = Cluster::start();
    let locker = Locker::connect(&cluster.cluster.url()).await.unwrap();
    let mut keys: Vec<String> = (0..12)
        .map(|i| unique_key(&format!("inspect-{i}")))
        .collect();
    let mut leases = Vec::new();
    for key in &keys {
        leases.push(locker.lock(key.as_str(), LockOptions::new()).await.unwrap());
    }
    for (key, lease) in keys.iter().zip(&leases) {
        let state = locker.inspect(key).await.unwrap();
        let [holder] = state.holders() else {
            panic!("not one holder: {state:?}");
        };
        assert_eq!(holder.owner(), lease.owner());
        assert_eq!(holder.fence(), lease.fence());
        assert_eq!(holder.pid(), Some(std::process::id()));
    }
    keys.sort();
    assert_eq!(locker.list("").await.unwrap(), keys);
    assert_eq!(locker.list(&keys[5]).await.unwrap(), [keys[5].clone()]);
    for lease in leases {
        lease.release().await.unwrap();
    }
    assert_eq!(locker.list("").await.unwrap(), Vec::<String>::new());
}

/// An acquisition answered "busy" on a cluster leaves nothing that a late copy of its call can
/// turn into a grant: redis-rs's cluster client may have sent the call twice without saying so,
/// the copy that answered busy reaching the node before the first. Replayed by hand: the first
/// try of a known owner, answered busy while another holds the key; that holder releases; the
/// first copy of the try lands then, and must take no effect — it would otherwise grant the key
/// to nobody for a full ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_an_acquire_call_answered_busy_takes_no_effect() {
    a_late_copy_of_a_call_not_granted_takes_no_effect(
        Duration::ZERO,
        "an acquire call answered busy",
    )
    .await;
}

/// As above, for a waiter that gave up at its deadline: a late copy of one of its queueing
/// calls, landing after the holder released, takes no effect either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_queueing_call_of_a_waiter_that_gave_up_takes_no_effect() {
    a_late_copy_of_a_call_not_granted_takes_no_effect(
        Duration::from_millis(300),
        "a queueing call of a waiter that gave up",
    )
    .await;
}

/// An acquisition of a known owner, waiting `wait`, is not granted while another holds the key;
/// the holder releases; then a late copy of the acquisition's call (`what`) lands: a first try's,
/// or for a waiter one of its queueing calls. It must leave the key free.
async fn a_late_copy_of_a_call_not_granted_takes_no_effect(wait: Duration, what: &str) {
    let cluster = Cluster::start();
    let backend = RedisBackend::connect(&cluster.cluster.url()).await.unwrap();
    let locker = Locker::connect(&cluster.cluster.url()).await.unwrap();
    let mut raw = cluster.raw().await;
    let key = unique_key("late-copy-not-granted");
    let ttl = Duration::from_secs(30);
    let holder = locker
        .lock(&*key, LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let owner = dlock::Owner::random();
    let request = dlock::backend::AcquireRequest::new(&key, owner, ttl, wait);
    assert!(backend.acquire(&request).await.unwrap().is_none());
    holder.release().await.unwrap();

    // A first try's arguments, as the backend sent them; a queueing call's add the liveness
    // window in ms, the waiter's backend's id and the call's number.
    let lock_key = cluster.names.lock_key(&key);
    let prefix = lock_key
        .strip_suffix(&format!("{{{key}}}"))
        .expect("the lock key is the prefix and the hash-tagged key");
    let mut call = redis::cmd("EVAL");
    call.arg(acquire_script())
        .arg(3)
        .arg(&lock_key)
        .arg(cluster.names.fence_key(&key))
        .arg(cluster.names.queue_key(&key))
        .arg(owner.to_string())
        .arg(ttl.as_millis() as u64)
        .arg(prefix)
        .arg(format!("{}/host/late-copy", std::process::id()));
    if !wait.is_zero() {
        call.arg(5_000).arg("late-copy-instance").arg(1);
    }
    let _: redis::Value = call.query_async(&mut raw).await.unwrap();
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&lock_key)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(
        pttl, -2,
        "a late copy of {what} granted the released key to nobody, for {pttl} ms"
    );
    locker
        .lock(&*key, LockOptions::new())
        .await
        .expect("the key is free")
        .release()
        .await
        .unwrap();
}

/// On a cluster, the backend gives up on a slot's renewal after its bound while the client may
/// keep trying it: a copy landing after the lease's release set the hold's expiry must not
/// stretch the hold to a whole ttl. Replayed here by hand: the renew script, with the keys and
/// arguments a plain renewal of the owner sends, after the hold (which on a cluster leaves the
/// owner's cancel marker too) was set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_renewal_after_the_hold_was_set_does_not_stretch_it() {
    use dlock::backend::AcquireRequest;
    use dlock::Owner;

    let cluster = Cluster::start();
    let backend = RedisBackend::connect(&cluster.cluster.url()).await.unwrap();
    let mut raw = cluster.raw().await;
    let (key, owner) = (unique_key("late-renewal"), Owner::random());
    let ttl = Duration::from_secs(30);
    let request = AcquireRequest::new(&key, owner, ttl, Duration::ZERO);
    backend.acquire(&request).await.unwrap().expect("free");
    let lock_key = cluster.names.lock_key(&key);
    let hold = Duration::from_millis(300);
    assert!(backend.expire_after(&key, owner, hold).await.unwrap());

    let renewed: i64 = redis::cmd("EVAL")
        .arg(include_str!("../dlock-runtime/src/backend/redis/renew.lua"))
        .arg(1)
        .arg(&lock_key)
        .arg(owner.to_string())
        .arg(ttl.as_millis() as u64)
        .query_async(&mut raw)
        .await
        .unwrap();
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&lock_key)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(
        pttl <= hold.as_millis() as i64,
        "a late renewal stretched the hold to {pttl} ms (renewal answered {renewed})"
    );
    assert_eq!(renewed, 0, "a lease whose hold was set is not renewed");
    tokio::time::sleep(hold + Duration::from_millis(200)).await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&lock_key)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(pttl, -2, "the key outlived its hold");
}
