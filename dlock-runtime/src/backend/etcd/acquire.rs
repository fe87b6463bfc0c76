//! Acquiring a key: the node created in a transaction, the wait behind the node just ahead,
//! the grant confirmed with a keep-alive, and the claim of the grant by its caller.
//!
//! The acquisition runs on dlock's background runtime, not in the caller's future, so the line
//! moves on whether or not the caller is polled; a grant is the caller's once its future claims
//! it, and one nobody claims within the claim window is withdrawn and its node deleted (see
//! [`claim`](crate::backend::claim)). Without it a node does not expire while the backend's
//! etcd lease lives: a caller that stopped polling would hold the key for nobody.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse, WatchOptions,
};
use tokio::sync::oneshot;

use super::keys::{key_prefix, node_path, node_value};
use super::lease::{Confirmation, EtcdLease};
use super::{EtcdBackend, Held};
use crate::backend::claim::{Caller, Claim};
use crate::backend::{AcquireRequest, Acquired};
use crate::{LockError, Owner};

/// Numbers the attempts of this process: each names a node of its own (see `node_path`).
static ATTEMPTS: AtomicU64 = AtomicU64::new(1);

/// A node that holds the key, won by a background acquisition and not yet claimed.
pub(super) struct Grant {
    acquired: Acquired,
    held: Held,
}

/// What a background acquisition answers its caller.
type Outcome = Result<Option<Grant>, LockError>;

/// One acquisition's names and lease, for the steps of [`EtcdBackend::contend`].
struct Attempt<'a> {
    key: &'a str,
    prefix: String,
    path: String,
    value: String,
    lease: Arc<EtcdLease>,
    deadline: Option<Instant>,
    claim: &'a Claim,
}

impl EtcdBackend {
    /// Acquires `request`'s key on the background runtime and claims the grant. A grant
    /// withdrawn before this future came to claim it is tried for again, at the back of the
    /// line, while the wait lasts.
    pub(super) async fn acquire_and_claim(
        &self,
        request: &AcquireRequest<'_>,
    ) -> Result<Option<Acquired>, LockError> {
        if request.ttl > self.shared.lease_ttl {
            return Err(LockError::InvalidOptions {
                reason: format!(
                    "a ttl of {:?} is longer than the etcd lease's TTL, {:?}",
                    request.ttl, self.shared.lease_ttl
                ),
            });
        }
        let deadline = Instant::now().checked_add(request.wait);
        let mut wait = request.wait;
        loop {
            let (caller, claim) = Caller::new();
            let (answer, outcome) = oneshot::channel();
            // Counted as a clean-up from the start: a caller dropped before the grant leaves its
            // node to this task, which `close` must wait for.
            self.shared.cleanups.spawn(self.clone().acquire_for(
                request.key.to_owned(),
                request.owner,
                request.label.to_owned(),
                request.ttl,
                wait,
                claim,
                answer,
            ));
            let Some(grant) = outcome.await.unwrap_or_else(|_| {
                Err(LockError::backend(
                    "the etcd acquisition ended without an answer (dlock's background runtime stopped)",
                ))
            })?
            else {
                return Ok(None);
            };
            if caller.claim() {
                self.shared.held().insert(request.owner, grant.held);
                return Ok(Some(grant.acquired));
            }
            // Withdrawn: this future was not polled within the claim window after the grant.
            let now = Instant::now();
            match deadline {
                Some(deadline) if now >= deadline => return Ok(None),
                Some(deadline) => wait = deadline - now,
                None => {}
            }
            tracing::debug!(key = %request.key, "distributed_lock: an etcd grant was withdrawn before its caller claimed it; queueing again");
        }
    }

    /// The background side of one acquisition: acquires, answers the caller, and withdraws a
    /// grant the caller did not claim within the claim window (or the ttl, where shorter),
    /// deleting its node.
    #[allow(clippy::too_many_arguments)] // The request's parts, owned, and the two channels.
    async fn acquire_for(
        self,
        key: String,
        owner: Owner,
        label: String,
        ttl: Duration,
        wait: Duration,
        claim: Arc<Claim>,
        answer: oneshot::Sender<Outcome>,
    ) {
        let outcome = self.contend(&key, owner, &label, wait, &claim).await;
        let Ok(Some(grant)) = outcome else {
            let _ = answer.send(outcome);
            return;
        };
        let (path, revision, lease) = (
            grant.held.path.clone(),
            grant.held.revision,
            grant.held.lease,
        );
        // Sent or not (the caller's future may be gone), the claim says who has the node.
        let _ = answer.send(Ok(Some(grant)));
        let window = self.shared.claim_window.min(ttl);
        if claim.withdrawn_after(window).await {
            tracing::debug!(%key, %path, "distributed_lock: etcd grant not claimed within the claim window; withdrawn");
            self.shared.delete_abandoned(path, revision, lease);
        }
    }

    /// Creates `owner`'s node for `key` and waits until it is the oldest, or `wait` runs out
    /// (`None`, the node deleted), or the caller is gone (the node deleted).
    async fn contend(
        &self,
        key: &str,
        owner: Owner,
        label: &str,
        wait: Duration,
        claim: &Claim,
    ) -> Outcome {
        let lease = self.shared.live_lease().await?;
        let prefix = key_prefix(&self.shared.root, key);
        let attempt = Attempt {
            key,
            path: node_path(&prefix, owner, ATTEMPTS.fetch_add(1, Ordering::Relaxed)),
            prefix,
            value: node_value(owner, label),
            lease,
            deadline: Instant::now().checked_add(wait),
            claim,
        };
        if wait.is_zero() {
            return self.try_once(&attempt).await;
        }
        let mut own: Option<i64> = None;
        loop {
            if attempt.claim.is_withdrawn() {
                if let Some(revision) = own {
                    self.shared
                        .delete_abandoned(attempt.path.clone(), revision, attempt.lease.id);
                }
                return Ok(None);
            }
            let revision = match own {
                Some(revision) => revision,
                None => {
                    let (revision, grant) = self.create(&attempt).await?;
                    if grant.is_some() {
                        return Ok(grant);
                    }
                    own = Some(revision);
                    revision
                }
            };
            match self.check(&attempt, revision).await? {
                Checked::Granted(grant) => return Ok(Some(grant)),
                Checked::Recreate => {
                    own = None;
                    if attempt.deadline.is_some_and(|d| Instant::now() >= d) {
                        return Ok(None);
                    }
                }
                Checked::Behind { node, at } => {
                    if attempt.deadline.is_some_and(|d| Instant::now() >= d) {
                        if let Err(error) = self.shared.delete_node(&attempt.path, revision).await {
                            self.shared.delete_abandoned(
                                attempt.path.clone(),
                                revision,
                                attempt.lease.id,
                            );
                            return Err(error);
                        }
                        return Ok(None);
                    }
                    self.until_deleted(&attempt, node, at).await;
                }
            }
        }
    }

    /// `wait = 0`: creates the node only where the key has none, so a try on a busy key leaves
    /// nothing behind; sent with a keep-alive that the grant's validity counts from.
    async fn try_once(&self, attempt: &Attempt<'_>) -> Outcome {
        let txn = Txn::new()
            .when([
                Compare::create_revision(attempt.prefix.as_str(), CompareOp::Equal, 0)
                    .with_prefix(),
            ])
            .and_then([self.put(attempt)])
            // A copy sent again after a lost answer finds the node the first one made (which,
            // made on a key with no node, is the oldest).
            .or_else([TxnOp::get(
                attempt.path.as_str(),
                Some(GetOptions::new().with_keys_only()),
            )]);
        let (created, confirmed) = tokio::join!(
            self.shared.txn(txn),
            attempt.lease.confirm(self.shared.timeout)
        );
        let created = match created {
            Ok(created) => created,
            Err(error) => {
                self.shared
                    .forget_node(attempt.path.clone(), attempt.lease.id);
                return Err(error);
            }
        };
        let revision = if created.succeeded() {
            revision_of(&created)
        } else {
            match first_kv(created.op_responses().first()) {
                Some((_, revision)) => revision,
                None => return Ok(None),
            }
        };
        self.granted(attempt, revision, confirmed)
    }

    /// Creates the node where it does not exist yet (a retry of the same owner finds it), and
    /// reads the key's oldest node in the same transaction, sent with a keep-alive: its create
    /// revision, and the grant where it is the oldest.
    async fn create(&self, attempt: &Attempt<'_>) -> Result<(i64, Option<Grant>), LockError> {
        let path = attempt.path.as_str();
        let oldest = TxnOp::get(
            attempt.prefix.as_str(),
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(1)
                    .with_keys_only(),
            ),
        );
        let txn = Txn::new()
            .when([Compare::create_revision(path, CompareOp::Equal, 0)])
            .and_then([self.put(attempt), oldest.clone()])
            .or_else([
                TxnOp::get(path, Some(GetOptions::new().with_keys_only())),
                oldest,
            ]);
        let (created, confirmed) = tokio::join!(
            self.shared.txn(txn),
            attempt.lease.confirm(self.shared.timeout)
        );
        let created = match created {
            Ok(created) => created,
            Err(error) => {
                self.shared
                    .forget_node(attempt.path.clone(), attempt.lease.id);
                return Err(error);
            }
        };
        let reads = created.op_responses();
        let revision = if created.succeeded() {
            revision_of(&created)
        } else {
            first_kv(reads.first()).map_or(0, |(_, revision)| revision)
        };
        let oldest_is_ours =
            first_kv(reads.get(1)).is_some_and(|(node, _)| node == path.as_bytes());
        if oldest_is_ours && matches!(confirmed, Ok(Confirmation::Alive { .. })) {
            return Ok((
                revision,
                Some(
                    self.granted(attempt, revision, confirmed)?
                        .expect("granted"),
                ),
            ));
        }
        Ok((revision, None))
    }

    /// Reads the node just ahead of ours and our own in one transaction, sent with a
    /// keep-alive.
    async fn check(&self, attempt: &Attempt<'_>, revision: i64) -> Result<Checked, LockError> {
        let ahead = TxnOp::get(
            attempt.prefix.as_str(),
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_max_create_revision(revision - 1)
                    .with_sort(SortTarget::Create, SortOrder::Descend)
                    .with_limit(1)
                    .with_keys_only(),
            ),
        );
        let own = TxnOp::get(
            attempt.path.as_str(),
            Some(GetOptions::new().with_keys_only()),
        );
        let (read, confirmed) = tokio::join!(
            self.shared.txn(Txn::new().and_then([ahead, own])),
            attempt.lease.confirm(self.shared.timeout)
        );
        let read = match read {
            Ok(read) => read,
            Err(error) => {
                self.shared
                    .delete_abandoned(attempt.path.clone(), revision, attempt.lease.id);
                return Err(error);
            }
        };
        let reads = read.op_responses();
        if first_kv(reads.get(1)).map(|(_, r)| r) != Some(revision) {
            // Our node is gone: with the etcd lease, or deleted by an operator.
            if attempt.lease.is_gone() || matches!(confirmed, Ok(Confirmation::Gone)) {
                return Err(LockError::Lost {
                    key: attempt.key.to_owned(),
                });
            }
            return Ok(Checked::Recreate);
        }
        match first_kv(reads.first()) {
            None => Ok(Checked::Granted(
                self.granted(attempt, revision, confirmed)?
                    .expect("granted"),
            )),
            Some((node, _)) => Ok(Checked::Behind {
                node,
                at: revision_of(&read),
            }),
        }
    }

    /// The grant of the node of `revision`, where the keep-alive sent with its last read
    /// confirmed the etcd lease; the node is deleted otherwise.
    fn granted(
        &self,
        attempt: &Attempt<'_>,
        revision: i64,
        confirmed: Result<Confirmation, LockError>,
    ) -> Outcome {
        match confirmed {
            Ok(Confirmation::Alive { sent_at, .. }) => Ok(Some(Grant {
                acquired: Acquired {
                    fence: u64::try_from(revision).unwrap_or(0),
                    valid_from: sent_at,
                },
                held: Held {
                    path: attempt.path.clone(),
                    revision,
                    lease: attempt.lease.id,
                },
            })),
            Ok(Confirmation::Gone) => Err(LockError::Lost {
                key: attempt.key.to_owned(),
            }),
            Err(error) => {
                self.shared
                    .delete_abandoned(attempt.path.clone(), revision, attempt.lease.id);
                Err(error)
            }
        }
    }

    /// Waits until `node` or our own node is deleted after revision `at`, the wait runs out,
    /// the etcd lease is gone or the caller is.
    async fn until_deleted(&self, attempt: &Attempt<'_>, node: Vec<u8>, at: i64) {
        let deleted = async {
            let mut watches = self.shared.client.watch_client();
            let options = WatchOptions::new().with_start_revision(at + 1);
            let Ok(mut stream) = self
                .shared
                .within(watches.watch(node, Some(options.clone())))
                .await
            else {
                // Read again after a pause: the next read says what became of it.
                tokio::time::sleep(Duration::from_millis(100)).await;
                return;
            };
            // Our own node too, on the same stream: deleted with an expired etcd lease (the
            // waiter is then lost at once, not at the driver's next keep-alive) or by an
            // operator (it queues again).
            if stream
                .watch(attempt.path.as_str(), Some(options))
                .await
                .is_ok()
            {
                while let Ok(Some(answer)) = stream.message().await {
                    if answer.canceled() {
                        break;
                    }
                    let deleted = answer.events().iter();
                    if deleted
                        .into_iter()
                        .any(|event| event.event_type() == EventType::Delete)
                    {
                        return;
                    }
                }
            }
            // The watch failed, was cancelled (compacted, refused) or its stream ended: read
            // again after a pause, not at once, which a server refusing every watch would turn
            // into a loop of reads for the whole wait.
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let deadline = async {
            match attempt.deadline {
                Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = deleted => {}
            () = deadline => {}
            () = attempt.lease.until_gone() => {}
            () = attempt.claim.until_settled() => {}
        }
    }

    fn put(&self, attempt: &Attempt<'_>) -> TxnOp {
        TxnOp::put(
            attempt.path.as_str(),
            attempt.value.as_str(),
            Some(PutOptions::new().with_lease(attempt.lease.id)),
        )
    }
}

/// What a read of the line said.
enum Checked {
    Granted(Grant),
    /// Our node is gone while the etcd lease lives: create it again, at the back of the line.
    Recreate,
    /// `node` is just ahead of ours, as of revision `at`.
    Behind {
        node: Vec<u8>,
        at: i64,
    },
}

/// The revision a transaction's answer was made at (for one that put, the node's create
/// revision).
fn revision_of(answer: &TxnResponse) -> i64 {
    answer.header().map_or(0, |header| header.revision())
}

/// The key and create revision of the first node a read of a transaction found.
fn first_kv(read: Option<&TxnOpResponse>) -> Option<(Vec<u8>, i64)> {
    match read? {
        TxnOpResponse::Get(got) => got
            .kvs()
            .first()
            .map(|kv| (kv.key().to_vec(), kv.create_revision())),
        _ => None,
    }
}
