//! Claiming a grant. An acquisition runs on dlock's background runtime, not in the caller's
//! future, and a grant it wins is the caller's only once the caller claims it; a grant nobody
//! claims within the claim window is withdrawn, its node deleted, and the next waiter gets the
//! key.
//!
//! A lock node does not expire: run in the caller's future, an acquisition whose caller stopped
//! polling it (a runtime stalled by blocking code, a future parked in a `select!` that polls it
//! no more) would keep its node, and once the nodes ahead went, the key would be held by nobody
//! for as long as the caller stays away, while the session lives on dlock's background runtime.
//!
//! The caller and the background task share one [`Claim`](crate::backend::claim) (see there):
//! a claimed grant is the caller's lease, which its release deletes; a withdrawn one's node is
//! deleted by the background task alone. A caller that comes back to a withdrawn grant queues
//! again, with what is left of its wait, under a node name of its own (see
//! [`attempt_prefix`](super::node::attempt_prefix)).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use zookeeper_client::Client;

use super::cleanup::delete_abandoned;
use super::release::Holding;
use super::{Held, ZookeeperBackend};
use crate::backend::claim::{Caller, Claim};
use crate::backend::{AcquireRequest, Acquired};
use crate::{LockError, Owner};

/// The shortest claim window: below it, a caller that is polled promptly could lose its grants
/// to the time its runtime takes to wake it.
pub(super) const MIN_CLAIM_WINDOW: Duration = Duration::from_millis(30);

/// A lock node that holds the key, won by a background acquisition and not yet claimed.
pub(super) struct Grant {
    pub(super) acquired: Acquired,
    pub(super) held: Held,
    /// The client of the node's session, for deleting it if the grant is withdrawn.
    pub(super) client: Client,
}

/// What a background acquisition answers its caller.
type Outcome = Result<Option<Grant>, LockError>;

impl ZookeeperBackend {
    /// Acquires `request`'s key on the background runtime and claims the grant. A grant
    /// withdrawn before this future came to claim it is tried for again, at the back of the
    /// queue, while the wait lasts.
    pub(super) async fn acquire_and_claim(
        &self,
        request: &AcquireRequest<'_>,
    ) -> Result<Option<Acquired>, LockError> {
        // A wait too long to add is a wait without end.
        let deadline = Instant::now().checked_add(request.wait);
        let mut wait = request.wait;
        loop {
            let (caller, claim) = Caller::new();
            let (answer, outcome) = oneshot::channel();
            // Counted as a clean-up from the start: a caller dropped before the grant leaves its
            // node to this task's guard, which `close` must wait for.
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
                    "the ZooKeeper acquisition ended without an answer (dlock's background runtime stopped)",
                ))
            })?
            else {
                return Ok(None);
            };
            if caller.claim() {
                self.shared
                    .held()
                    .insert(request.owner, Holding::Held(grant.held));
                return Ok(Some(grant.acquired));
            }
            // Withdrawn: this future was not polled within the claim window after the grant.
            // The node is the background task's to delete; the key may be someone else's now.
            let now = Instant::now();
            match deadline {
                Some(deadline) if now >= deadline => return Ok(None),
                Some(deadline) => wait = deadline - now,
                None => {}
            }
            tracing::debug!(key = %request.key, "distributed_lock: a ZooKeeper grant was withdrawn before its caller claimed it; queueing again");
        }
    }

    /// The background side of one acquisition: acquires, answers the caller, and withdraws a
    /// grant the caller did not claim within the claim window (or the ttl, where shorter),
    /// deleting its node. Stops, deleting what it made, as soon as the caller's future is
    /// dropped.
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
        let request = AcquireRequest::new(&key, owner, ttl, wait).label(&label);
        let outcome = tokio::select! {
            biased;
            // The caller is gone: dropping the acquisition lets its node's guard delete what
            // it made.
            () = claim.until_settled() => return,
            outcome = self.acquire_bounded(&request) => outcome,
        };
        let grant = match outcome {
            Ok(Some(grant)) => grant,
            other => {
                let _ = answer.send(other);
                return;
            }
        };
        let (client, path, parent) = (
            grant.client.clone(),
            grant.held.path.clone(),
            grant.held.parent.clone(),
        );
        // Sent or not (the caller's future may be gone), the claim says who has the node.
        let _ = answer.send(Ok(Some(grant)));
        let window = self.shared.claim_window.min(ttl);
        if claim.withdrawn_after(window).await {
            tracing::debug!(%key, %path, "distributed_lock: ZooKeeper grant not claimed within the claim window; withdrawn");
            self.shared
                .cleanups
                .spawn(delete_abandoned(client, path, parent));
        }
    }
}
