//! The etcd store: the lock recipe of etcd's own `concurrency` package, each waiter watching
//! only its predecessor, on one etcd lease per backend.
//!
//! # The keys
//!
//! ```text
//! dlock/acct:42/3f9c…e1    the holder: the lowest create revision under the key's prefix
//! dlock/acct:42/8a02…5d    a waiter, watching the delete of …e1
//! dlock/acct:42/c7b1…90    a waiter, watching the delete of …5d
//! ```
//!
//! Each acquisition is a key `{root}/{key}/{owner}-{attempt}` (the lock key with `/` and `%` escaped, so
//! one key's range never holds another's nodes), attached to the backend's etcd lease, whose
//! value describes the holder for operators (owner, process id, host, label).
//!
//! # The calls
//!
//! - **Acquire**: one transaction creates the node where it does not exist yet
//!   (`create_revision == 0`) and reads the key's oldest node; with `wait = 0` the transaction
//!   creates it only where the key has no node at all, so a try on a busy key leaves nothing
//!   behind. The node with the lowest create revision holds the key. A waiter reads the one
//!   node just ahead of its own (`max_create_revision` = its own less one, newest first, one
//!   key) and watches for its delete, from the revision of that read, so a delete between the
//!   read and the watch is not missed; then it reads again. A release wakes one waiter, and
//!   waiters are served in the order their nodes were created. The `wait` bounds the whole
//!   wait: when it runs out the waiter deletes its node and answers busy.
//! - **Grant**: the read that finds no node ahead also reads the waiter's own node, and is sent
//!   together with a keep-alive of the etcd lease: the lease's validity is counted from that
//!   keep-alive's sending. A waiter whose node is gone because the etcd lease expired fails
//!   with [`LockError::Lost`]; one whose node was deleted by an operator queues again.
//! - **Claim**: the acquisition runs on dlock's background runtime and a grant is the caller's
//!   once its future claims it; a grant not claimed within the claim window
//!   ([`EtcdBuilder::claim_window`]) is withdrawn and its node deleted, so a caller that stopped
//!   polling (a stalled runtime, a future parked in a `select!`) holds up the line only that
//!   long. A dropped caller's node is deleted as soon as the background side notices.
//! - **Release**: deletes the owner's node in a transaction that compares its create revision,
//!   so a release can only delete the node of the grant it releases.
//! - **Renewal**: one keep-alive of the etcd lease on its one stream, and one read-only
//!   transaction of the renewed leases' nodes (a hundred per transaction, the transactions
//!   pipelined), both in flight together: a lease is held while its node exists with its create
//!   revision and the etcd lease was confirmed alive. Reads are linearizable (etcd's default):
//!   they are answered only once the leader confirmed its leadership with a quorum.
//!
//! # One etcd lease per backend, and each lock's ttl
//!
//! Every node of a backend lives on one etcd lease of [`EtcdBuilder::lease_ttl`] (30 s unless
//! set). A keep-alive confirmed after being sent at `T` means etcd keeps the lease, and so every
//! node on it, until at least `T + lease TTL`. A lock's ttl is judged by the client from the
//! last confirmation (`T + ttl − margin`), so it is kept while `ttl ≤ lease TTL`: that is the
//! backend's [`ttl_limit`](super::Backend::ttl_limit). A [`Locker`](crate::Locker) shortens a
//! longer ttl to it and renews more often, and releases every lease with `renew = false` when
//! its own ttl runs out (etcd would keep its node to the lease TTL). Each lock is judged against
//! its own ttl and its own last confirmation: a short lock on the backend never shortens the
//! time a long one is given, since one keep-alive confirms them all. The price of one lease per
//! backend: a process that dies holds its keys until the etcd lease expires, one lease TTL
//! after its last keep-alive, whatever the ttl of its locks. A driver on dlock's background
//! runtime sends a keep-alive every third of the lease TTL so that waiters' nodes live however
//! long they wait; when etcd answers that the lease is gone (or it cannot be confirmed for a
//! whole TTL), every lock under it is lost, and the next acquisition grants a new lease.
//!
//! # Confirmation through the quorum
//!
//! Reads (the grant's check of the line, the renewal's reads of the nodes) are linearizable:
//! answered once the leader confirmed its leadership with a quorum. A keep-alive is answered by
//! the leader (a follower forwards it). A leader cut off from its quorum may answer keep-alives
//! for up to an election timeout before it steps down; etcd covers that by extending every
//! lease by an election timeout beyond its TTL when a new leader takes over, so a confirmation
//! a stale leader gave does not outlast the lease the new leader keeps. A leader stuck (a slow
//! disk, a starved CPU) that does not notice it lost its leadership is another matter: etcd
//! 3.5.8 and 3.4.25 made the leader confirm its leadership with the quorum before it renews a
//! lease; run one of those or later.
//!
//! # Fences
//!
//! A fence is the create revision of the holder's node. etcd's revision counts every change of
//! the cluster's key space, in one order, and never goes back; nodes of one key are served in
//! creation order, so each holder's fence is above every earlier holder's of that key.
//!
//! # What it needs
//!
//! The `etcd` feature builds `etcd-client`, whose build generates the gRPC protocol with
//! `protoc` (Debian: `protobuf-compiler`). Exclusion holds while the cluster has a quorum.

mod acquire;
mod builder;
mod keys;
mod lease;
mod operator;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};

pub use self::builder::EtcdBuilder;
use self::lease::{Confirmation, EtcdLease};
pub use super::claim::DEFAULT_CLAIM_WINDOW;
use super::{AcquireRequest, Acquired, Backend, Renewal};
use crate::cleanups::{Cleanups, CLEANUP_PATIENCE};
use crate::{KeyState, LockError, Owner};

/// The prefix of every lock node's etcd key, unless [`EtcdBuilder::root`] says otherwise.
pub const DEFAULT_ROOT: &str = "dlock";

/// The TTL of a backend's etcd lease, unless [`EtcdBuilder::lease_ttl`] says otherwise.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);

/// How many reads one renewal transaction carries: etcd refuses a transaction of more than
/// 128 operations by default (`--max-txn-ops`).
const READS_PER_TXN: usize = 100;

/// A lock store on an etcd cluster. Clones share one connection and one etcd lease.
///
/// ```no_run
/// # async fn demo() -> Result<(), dlock::LockError> {
/// use std::time::Duration;
/// use dlock::{backend::EtcdBackend, Locker};
///
/// let backend = EtcdBackend::builder("etcd://etcd1:2379,etcd2:2379,etcd3:2379")?
///     .lease_ttl(Duration::from_secs(15))
///     .connect()
///     .await?;
/// let locker = Locker::with_backend(backend);
/// // or simply: Locker::connect("etcd://etcd1:2379,etcd2:2379,etcd3:2379").await?
/// # Ok(()) }
/// ```
///
/// Each acquisition is a key under the lock key's prefix, attached to the backend's one etcd
/// lease; the lowest create revision holds the lock and each waiter watches only the key just
/// ahead of its own, so a release wakes one waiter and waiters are served first come, first
/// served. Fences are the keys' create revisions. A lock's ttl may be at most the etcd lease's
/// TTL ([`ttl_limit`](Self::ttl_limit)): a [`Locker`](crate::Locker) shortens a longer ttl to
/// it. Mutual exclusion holds while the cluster has a quorum.
#[derive(Clone)]
pub struct EtcdBackend {
    shared: Arc<Shared>,
}

struct Shared {
    client: Client,
    root: String,
    lease_ttl: Duration,
    /// How long one request may take.
    timeout: Duration,
    claim_window: Duration,
    /// The etcd lease every node of this backend is attached to; granted by the first
    /// acquisition, and again after it is gone.
    lease: tokio::sync::Mutex<Option<Arc<EtcdLease>>>,
    /// Each owner's node, from its claimed grant until its release is answered.
    held: Mutex<HashMap<Owner, Held>>,
    /// Deletes of nodes nobody waits for any more: `close` waits for them.
    cleanups: Arc<Cleanups>,
}

/// A node this backend holds a lock through.
#[derive(Debug, Clone)]
struct Held {
    path: String,
    /// Its create revision: the fence, and what every delete of it compares.
    revision: i64,
    /// The etcd lease it is attached to.
    lease: i64,
}

/// Whether `error` says the connection broke under the request (so it may or may not have
/// reached etcd), rather than that etcd answered it.
fn is_broken_connection(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::TransportError(_) => true,
        // gRPC's codes: 1 cancelled, 2 unknown (hyper's broken pipes), 14 unavailable.
        etcd_client::Error::GRpcStatus(status) => matches!(i32::from(status.code()), 1 | 2 | 14),
        _ => false,
    }
}

/// A failure of etcd, or of the way to it.
fn etcd_error(error: etcd_client::Error) -> LockError {
    LockError::backend(format!("etcd: {error}"))
}

impl EtcdBackend {
    /// Connects with the default options, or those the URL's query sets (see [`EtcdBuilder`]).
    ///
    /// # Errors
    ///
    /// As [`EtcdBuilder::connect`], and [`LockError::InvalidUrl`] for a malformed URL.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = dlock::backend::EtcdBackend::connect("etcd://127.0.0.1:2379").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<EtcdBackend, LockError> {
        Self::builder(url)?.connect().await
    }

    /// Options for a connection to `url`: `etcd://[user:password@]host:port[,host:port…][?settings]`;
    /// the settings are [`EtcdBuilder`]'s.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidUrl`] for a URL that is not `etcd://`, names no endpoint, or has a
    /// setting that does not parse.
    ///
    /// ```
    /// # use dlock::backend::EtcdBackend;
    /// let builder = EtcdBackend::builder("etcd://etcd1:2379,etcd2:2379?lease_ttl=15s")?;
    /// assert!(EtcdBackend::builder("redis://etcd1:2379").is_err());
    /// # Ok::<(), dlock::LockError>(())
    /// ```
    pub fn builder(url: &str) -> Result<EtcdBuilder, LockError> {
        EtcdBuilder::from_url(url)
    }

    /// The prefix every lock node's etcd key starts with.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// # let backend = dlock::backend::EtcdBackend::connect("etcd://127.0.0.1:2379").await?;
    /// assert_eq!(backend.root(), "dlock");
    /// # Ok(()) }
    /// ```
    pub fn root(&self) -> &str {
        &self.shared.root
    }

    /// The longest ttl a lock may have: the etcd lease's TTL. A [`Locker`](crate::Locker)
    /// shortens a longer ttl to this, and renews it more often.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// # let backend = dlock::backend::EtcdBackend::connect("etcd://127.0.0.1:2379").await?;
    /// assert_eq!(backend.ttl_limit(), dlock::backend::ETCD_DEFAULT_LEASE_TTL);
    /// # Ok(()) }
    /// ```
    pub fn ttl_limit(&self) -> Duration {
        self.shared.lease_ttl
    }
}

impl Shared {
    fn held(&self) -> MutexGuard<'_, HashMap<Owner, Held>> {
        // Nothing panics while the map is locked, and it is consistent between statements.
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs one request to etcd, bounded by the backend's time-out.
    async fn within<T>(
        &self,
        request: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, LockError> {
        tokio::time::timeout(self.timeout, request)
            .await
            .map_err(|_| {
                LockError::backend(format!("etcd did not answer within {:?}", self.timeout))
            })?
            .map_err(etcd_error)
    }

    /// Runs `txn`, sent once more where the connection broke under it: every transaction of
    /// this backend is one a second copy cannot harm (a create that finds the node the first
    /// made, an owner-checked delete that finds it gone, reads).
    async fn txn(&self, txn: Txn) -> Result<TxnResponse, LockError> {
        let mut kv = self.client.kv_client();
        match tokio::time::timeout(self.timeout, kv.txn(txn.clone())).await {
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(error)) if !is_broken_connection(&error) => return Err(etcd_error(error)),
            Ok(Err(_)) | Err(_) => {}
        }
        let mut kv = self.client.kv_client();
        self.within(kv.txn(txn)).await
    }

    /// The backend's etcd lease while it lives, granting a new one where there is none.
    async fn live_lease(&self) -> Result<Arc<EtcdLease>, LockError> {
        let mut lease = self.lease.lock().await;
        if let Some(live) = lease.as_ref().filter(|lease| !lease.is_gone()) {
            return Ok(live.clone());
        }
        let granted =
            tokio::time::timeout(self.timeout, EtcdLease::grant(&self.client, self.lease_ttl))
                .await
                .map_err(|_| {
                    LockError::backend(format!(
                        "etcd did not grant a lease within {:?}",
                        self.timeout
                    ))
                })??;
        let granted = Arc::new(granted);
        *lease = Some(granted.clone());
        Ok(granted)
    }

    /// The backend's etcd lease, if it has one that is not known gone; grants none.
    async fn current_lease(&self) -> Option<Arc<EtcdLease>> {
        self.lease
            .lock()
            .await
            .as_ref()
            .filter(|lease| !lease.is_gone())
            .cloned()
    }

    /// Deletes `path` where its create revision is `revision`; whether it did.
    async fn delete_node(&self, path: &str, revision: i64) -> Result<bool, LockError> {
        let txn = Txn::new()
            .when([Compare::create_revision(path, CompareOp::Equal, revision)])
            .and_then([TxnOp::delete(path, None)]);
        Ok(self.txn(txn).await?.succeeded())
    }

    /// Deletes `path` on the background, where its create revision is `revision`, trying again
    /// while etcd cannot be reached, until it is done or the node's etcd lease `lease` is no
    /// longer the backend's live one (gone, the node with it). A node left behind would hold
    /// the key for as long as the lease is kept alive: for good.
    fn delete_abandoned(self: &Arc<Self>, path: String, revision: i64, lease: i64) {
        let shared = self.clone();
        self.cleanups.spawn(async move {
            let mut pause = Duration::from_millis(50);
            while shared.delete_node(&path, revision).await.is_err() {
                if !shared.lease_lives(lease).await {
                    return;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        });
    }

    /// Whether `lease` is the backend's etcd lease and not known gone.
    async fn lease_lives(&self, lease: i64) -> bool {
        self.current_lease()
            .await
            .is_some_and(|current| current.id == lease)
    }
}

impl Shared {
    /// Deletes `path` on the background, whatever its create revision, where it is on the etcd
    /// lease `lease`: for a create whose answer was lost, which may or may not have landed.
    fn forget_node(self: &Arc<Self>, path: String, lease: i64) {
        let shared = self.clone();
        self.cleanups.spawn(async move {
            let mut pause = Duration::from_millis(50);
            loop {
                let mut kv = shared.client.kv_client();
                let found = shared.within(kv.get(path.as_str(), None)).await;
                let done = match found {
                    Ok(found) => match found.kvs().first() {
                        Some(node) if node.lease() == lease => shared
                            .delete_node(&path, node.create_revision())
                            .await
                            .is_ok(),
                        _ => true,
                    },
                    Err(_) => false,
                };
                if done || !shared.lease_lives(lease).await {
                    return;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        });
    }
}

impl Backend for EtcdBackend {
    fn ttl_limit(&self) -> Option<Duration> {
        Some(self.shared.lease_ttl)
    }

    async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<Option<Acquired>, LockError> {
        self.acquire_and_claim(request).await
    }

    async fn release(&self, key: &str, owner: Owner) -> Result<bool, LockError> {
        let _ = key; // the node is found by its owner
        let Some(held) = self.shared.held().get(&owner).cloned() else {
            return Ok(false);
        };
        let deleted = self.shared.delete_node(&held.path, held.revision).await;
        if deleted.is_err() {
            // Not left for a ttl to end, as on a store that expires keys: the node lives as
            // long as the etcd lease, which the backend keeps alive.
            self.shared
                .delete_abandoned(held.path.clone(), held.revision, held.lease);
        }
        let mut map = self.shared.held();
        if map.get(&owner).is_some_and(|h| h.revision == held.revision) {
            map.remove(&owner);
        }
        deleted
    }

    async fn renew(&self, leases: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        let Some(lease) = self.shared.current_lease().await else {
            return Ok(vec![false; leases.len()]);
        };
        let held: Vec<Option<Held>> = {
            let map = self.shared.held();
            leases
                .iter()
                .map(|renewal| {
                    map.get(&renewal.owner)
                        .filter(|held| held.lease == lease.id)
                        .cloned()
                })
                .collect()
        };
        let asked: Vec<&Held> = held.iter().flatten().collect();
        if asked.is_empty() {
            return Ok(vec![false; leases.len()]);
        }
        let reads = asked.chunks(READS_PER_TXN).map(|chunk| {
            let reads: Vec<TxnOp> = chunk
                .iter()
                .map(|held| {
                    TxnOp::get(held.path.as_str(), Some(GetOptions::new().with_keys_only()))
                })
                .collect();
            self.shared.txn(Txn::new().and_then(reads))
        });
        let (confirmed, read) = tokio::join!(
            lease.confirm(self.shared.timeout),
            futures_util::future::try_join_all(reads)
        );
        let ttl = match confirmed? {
            Confirmation::Alive { ttl, .. } => ttl,
            Confirmation::Gone => return Ok(vec![false; leases.len()]),
        };
        let mut found =
            read?
                .into_iter()
                .flat_map(|txn| txn.op_responses())
                .map(|read| match read {
                    TxnOpResponse::Get(got) => got.kvs().first().map(|kv| kv.create_revision()),
                    _ => None,
                });
        Ok(leases
            .iter()
            .zip(&held)
            .map(|(renewal, held)| match held {
                Some(held) => {
                    let revision = found.next().flatten();
                    revision == Some(held.revision) && renewal.ttl <= ttl
                }
                None => false,
            })
            .collect())
    }

    /// Reads one key: one linearizable round trip to the cluster. (The default, a release for
    /// an owner that holds nothing, is answered here without asking anyone.)
    async fn health(&self) -> Result<(), LockError> {
        let mut kv = self.shared.client.kv_client();
        self.shared
            .within(kv.get(
                self.shared.root.as_str(),
                Some(GetOptions::new().with_count_only()),
            ))
            .await
            .map(drop)
    }

    /// Waits for the deletes of nodes nobody uses any more. The etcd lease is revoked when the
    /// last clone of the backend is dropped, which deletes whatever is left on it.
    async fn close(&self) {
        self.shared.cleanups.done(CLEANUP_PATIENCE).await;
    }

    /// The lowest node's holder and the nodes behind it.
    async fn inspect(&self, key: &str) -> Result<KeyState, LockError> {
        self.inspect_key(key).await
    }

    /// The keys that have a node.
    async fn list(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        self.list_keys(prefix).await
    }

    /// Deletes the holder's node where `owner` holds the key, answering its fence.
    async fn force_release(&self, key: &str, owner: Owner) -> Result<Option<u64>, LockError> {
        self.evict(key, owner).await
    }
}
