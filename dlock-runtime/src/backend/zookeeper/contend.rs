//! Acquisition: create a lock node, wait for the nodes ahead of it to go, watching only the one
//! just ahead, and take the key when none is left. It moves a [`LockNode`] through its
//! [`Stage`]s; the stage is what its guard cleans up by when the acquisition is abandoned. It
//! runs on dlock's background runtime, and its grant is handed to the caller to claim (see
//! [`claim`](super::claim)).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use zookeeper_client::{Client, Error as ZkError, EventType};

use super::claim::Grant;
use super::cleanup::synced_listing;
use super::node::{confirm_nodes, LockNode, Queued, Stage};
use super::paths::sequence;
use super::queue::list_or_empty;
use super::session::{ends_session, is_retryable, zk_error, Session};
use super::{Held, ZookeeperBackend, EPHEMERAL_SEQUENTIAL, PERSISTENT};
use crate::backend::{AcquireRequest, Acquired};
use crate::LockError;

/// How often an acquisition recreates a parent that a concurrent release deleted before giving
/// up. Each time needs a release to slip in between two of our requests.
const PARENT_RETRIES: usize = 16;

/// The children of the parent as listed in the create's round trip, and when the create was
/// sent.
type ListedWithCreate = (Vec<String>, Instant);

/// How often one acquisition tries again after an error that a retry may not meet: a few lost
/// connections (the client reconnects by itself, often to another server), and one ended
/// session (the backend opens a new one). Counted apart, so that the connection lost as a
/// session ends does not use up the move to a new session. Lost connections are counted within
/// a spell of trouble only: one more than [`FORGET_LOSSES_AFTER`] after the last is a new spell,
/// so that a long wait outlives an ensemble's rolling restart, a server at a time.
#[derive(Default)]
struct Retries {
    lost_connections: u8,
    last_loss: Option<Instant>,
    new_sessions: u8,
}

/// How long after a lost connection a next one starts the count again.
const FORGET_LOSSES_AFTER: Duration = Duration::from_secs(10);

impl Retries {
    const LOST_CONNECTIONS: u8 = 3;
    const NEW_SESSIONS: u8 = 1;

    /// Whether to try again after `error`, met at `now`, counting the try.
    fn allow(&mut self, error: &ZkError, now: Instant) -> bool {
        let (used, limit) = if ends_session(error) {
            (&mut self.new_sessions, Self::NEW_SESSIONS)
        } else if is_retryable(error) {
            if self
                .last_loss
                .is_some_and(|last| now.saturating_duration_since(last) > FORGET_LOSSES_AFTER)
            {
                self.lost_connections = 0;
            }
            self.last_loss = Some(now);
            (&mut self.lost_connections, Self::LOST_CONNECTIONS)
        } else {
            return false;
        };
        if *used >= limit {
            return false;
        }
        *used += 1;
        true
    }
}

impl ZookeeperBackend {
    /// One acquisition, bounded by its wait plus a session timeout (the ensemble may not
    /// answer). Runs on the background runtime (see [`claim`](super::claim)); a grant is not
    /// the caller's until claimed.
    pub(super) async fn acquire_bounded(
        &self,
        request: &AcquireRequest<'_>,
    ) -> Result<Option<Grant>, LockError> {
        let parent = self.shared.parent(request.key)?;
        let session = self.session().await?;
        self.check_ttl(request.ttl, &session)?;
        let limit = request.wait.saturating_add(session.timeout);
        match tokio::time::timeout(limit, self.acquire_on(session, request, parent)).await {
            Ok(acquired) => acquired,
            // The node guard of the dropped attempt deletes whatever it created.
            Err(_) => Err(LockError::backend(format!(
                "ZooKeeper did not answer within {limit:?}"
            ))),
        }
    }

    /// Acquires on `session`, trying once more on a lost connection or an ended session. The
    /// ttl was checked against `session`; a new session is checked again, since the ensemble
    /// may grant it a shorter timeout (another server, another `maxSessionTimeout`), and a
    /// lease must not outlast what its own session can vouch for.
    pub(super) async fn acquire_on(
        &self,
        mut session: Session,
        request: &AcquireRequest<'_>,
        parent: String,
    ) -> Result<Option<Grant>, LockError> {
        let now = Instant::now();
        // A wait too long to add is a wait without end.
        let deadline = now
            .checked_add(request.wait)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600));
        let mut retries = Retries::default();
        let mut parent_missing = false;
        if request.wait.is_zero() {
            // A try that is sure to fail creates nothing: no churn of nodes and watches on a
            // busy key.
            loop {
                match session.client.list_children(&parent).await {
                    Ok(children) if children.iter().any(|c| sequence(c).is_some()) => {
                        return Ok(None)
                    }
                    Ok(_) => break,
                    Err(ZkError::NoNode) => {
                        parent_missing = true;
                        break;
                    }
                    Err(error @ ZkError::BadArguments(_)) => {
                        return Err(refused_path(request.key, &parent, &error))
                    }
                    Err(error) if retries.allow(&error, Instant::now()) => {
                        session = self.session().await?;
                        self.check_ttl(request.ttl, &session)?;
                    }
                    Err(error) => return Err(zk_error(error)),
                }
            }
        }
        let mut node = LockNode::new(
            &session,
            parent,
            request.owner,
            request.label,
            &self.shared.cleanups,
        );
        node.parent_missing = parent_missing;
        loop {
            match self.contend(&mut node, deadline).await {
                Ok(acquired) => return Ok(acquired),
                Err(error @ ZkError::BadArguments(_)) => {
                    // Nothing was created: the server refused the path, as it would again.
                    return Err(refused_path(request.key, &node.parent, &error));
                }
                Err(error) if retries.allow(&error, Instant::now()) => {
                    let fresh = self.session().await?;
                    if fresh.id != node.session {
                        // Our node, if any, went with the old session.
                        node.stage = Stage::Gone;
                        self.check_ttl(request.ttl, &fresh)?;
                        node = LockNode::new(
                            &fresh,
                            node.parent.clone(),
                            request.owner,
                            request.label,
                            &self.shared.cleanups,
                        );
                    }
                    // On the same session the node goes on from its stage: a create whose
                    // answer the lost connection took is looked for before another is sent.
                }
                Err(error) => return Err(zk_error(error)),
            }
        }
    }

    /// Moves `node` on from its stage until it is granted or `deadline` passes (`None`, the
    /// node deleted): creates it if it does not exist yet, and waits, watching its predecessor,
    /// until it is the oldest. An error leaves the node in the stage it reached, for a retry on
    /// the same session or for its guard. A grant is not yet the caller's: it is theirs once
    /// claimed (see [`claim`](super::claim)).
    async fn contend(
        &self,
        node: &mut LockNode,
        deadline: Instant,
    ) -> Result<Option<Grant>, ZkError> {
        let client = node.client.clone();
        // A listing that came with the create, and the create's send time: the create was a
        // write, so its success confirms the session and the node through the quorum. Set
        // only as the node becomes queued, and taken by the very next step.
        let mut listed: Option<ListedWithCreate> = None;
        let mut parents_made = 0;
        loop {
            let queued = match &mut node.stage {
                Stage::CreateUnanswered => {
                    node.stage = find_unanswered_create(&client, node).await?;
                    continue;
                }
                Stage::NotCreated => {
                    listed = create(&client, node, &mut parents_made).await?;
                    continue;
                }
                Stage::Queued(queued) => queued,
                Stage::Granted | Stage::Gone => {
                    unreachable!("a granted or deleted lock node contends no more")
                }
            };
            let (children, confirmed_at) = match listed.take() {
                Some((children, sent_at)) => (children, Some(sent_at)),
                None => (list_or_empty(&client, &node.parent).await?, None),
            };
            if !children.contains(&queued.name) {
                // Deleted from outside (an operator, or a forced release of a waiter).
                node.stage = Stage::NotCreated;
                if Instant::now() >= deadline {
                    node.stage = Stage::Gone;
                    return Ok(None);
                }
                continue;
            }
            let ahead = queued.still_ahead(&client, &node.parent, &children).await?;
            if ahead.is_empty() {
                // No node is ahead any more, and none can come ahead: that holds whoever served
                // the listing. Whether our node and session still live is the leader's word,
                // which a server cut off from it would answer from a stale copy: unless the
                // create just confirmed it, a write does.
                let path = format!("{}/{}", node.parent, queued.name);
                let valid_from = match confirmed_at {
                    Some(sent_at) => sent_at,
                    None => {
                        let sent_at = Instant::now();
                        if !confirm_nodes(&client, &[path.as_str()]).await?[0] {
                            node.stage = Stage::NotCreated;
                            continue;
                        }
                        sent_at
                    }
                };
                let fence = u64::try_from(queued.czxid).unwrap_or(0);
                node.stage = Stage::Granted;
                return Ok(Some(Grant {
                    acquired: Acquired { fence, valid_from },
                    held: Held {
                        path,
                        parent: node.parent.clone(),
                        session: node.session,
                    },
                    client,
                }));
            }
            if Instant::now() >= deadline {
                node.remove().await;
                return Ok(None);
            }
            let (_, just_ahead) = &ahead[ahead.len() - 1];
            let predecessor = format!("{}/{just_ahead}", node.parent);
            let (stat, watcher) = client.check_and_watch_stat(&predecessor).await?;
            if stat.is_none() {
                // Gone between the list and the watch: list again.
                continue;
            }
            tokio::select! {
                event = watcher.changed() => {
                    if event.event_type == EventType::NodeDeleted {
                        self.shared.watch_events.fetch_add(1, Ordering::Relaxed);
                    }
                    // A session event ends the session's requests: the next one says so.
                }
                () = tokio::time::sleep_until(deadline.into()) => {}
            }
        }
    }
}

/// The error for a key whose parent's path ZooKeeper refused (`BadArguments`): the key is
/// escaped so that this should not happen, and it would happen again on every retry.
fn refused_path(key: &str, parent: &str, error: &ZkError) -> LockError {
    LockError::InvalidKey {
        key: key.to_owned(),
        reason: format!("ZooKeeper refused the path of its lock nodes, under {parent}: {error}"),
    }
}

/// The stage after a create whose answer was lost: it may have landed, so the node is looked
/// for by its owner prefix. [`Queued`](Stage::Queued) when it is there, else
/// [`NotCreated`](Stage::NotCreated). An error leaves the question open.
async fn find_unanswered_create(client: &Client, node: &LockNode) -> Result<Stage, ZkError> {
    let children = synced_listing(client, &node.parent).await?;
    if let Some(name) = children.iter().find(|c| node.is_ours(c)) {
        let path = format!("{}/{name}", node.parent);
        if let Some(stat) = client.check_stat(&path).await? {
            return Ok(Stage::Queued(Queued::new(name.clone(), stat.czxid)));
        }
    }
    Ok(Stage::NotCreated)
}

/// Sends the create of `node`, which is [`NotCreated`](Stage::NotCreated), making it
/// [`CreateUnanswered`](Stage::CreateUnanswered) until the answer comes:
/// [`Queued`](Stage::Queued) with the listing and the create's send time when it was created;
/// `NotCreated` again, with `None`, when the parent was missing (it is made now, and the create
/// is to be sent again); an error otherwise, `CreateUnanswered` unless the answer said the
/// parent kept vanishing or the server refused the path (`BadArguments`, for the parent's
/// create or the node's: nothing was created, and a retry would meet the same answer).
async fn create(
    client: &Client,
    node: &mut LockNode,
    parents_made: &mut usize,
) -> Result<Option<ListedWithCreate>, ZkError> {
    node.stage = Stage::CreateUnanswered;
    let sent_at = Instant::now();
    // Pipelined, one round trip: the session's requests are served in order, so the create
    // finds the parent made just before it (when it was seen missing), and the list includes
    // the node the create makes.
    let make_parent = node
        .parent_missing
        .then(|| client.create(&node.parent, &[], &PERSISTENT));
    let create = client.create(&node.prefix, node.data.as_bytes(), &EPHEMERAL_SEQUENTIAL);
    let list = client.list_children(&node.parent);
    let make_parent = async move {
        match make_parent {
            Some(made) => made.await.map(drop),
            None => Ok(()),
        }
    };
    let (made, created, children) = tokio::join!(make_parent, create, list);
    // A refused parent fails its node's create with `NoNode`, which is not the parent
    // vanishing: say what the server said.
    if let Err(error @ ZkError::BadArguments(_)) = made {
        node.stage = Stage::NotCreated;
        return Err(error);
    }
    match created {
        Ok((stat, sequence)) => {
            let name = format!("{}{sequence}", node.own_prefix);
            node.stage = Stage::Queued(Queued::new(name, stat.czxid));
            Ok(Some((children?, sent_at)))
        }
        Err(ZkError::NoNode) if *parents_made < PARENT_RETRIES => {
            // The parent is missing, or a release deleted it between our steps.
            node.stage = Stage::NotCreated;
            *parents_made += 1;
            if node.parent_missing && matches!(made, Err(ZkError::NoNode)) {
                // The root itself is gone.
                client.mkdir(&node.parent, &PERSISTENT).await?;
            }
            node.parent_missing = true;
            Ok(None)
        }
        Err(error @ ZkError::BadArguments(_)) => {
            node.stage = Stage::NotCreated;
            Err(error)
        }
        Err(ZkError::NoNode) => {
            node.stage = Stage::NotCreated;
            Err(ZkError::UnexpectedError(format!(
                "the parent {} kept vanishing",
                node.parent
            )))
        }
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A long wait through a rolling restart meets a lost connection per server restarted, far
    /// apart: each is tried again. Four in quick succession are not.
    #[test]
    fn lost_connections_far_apart_are_each_tried_again() {
        let start = Instant::now();
        let mut spread = Retries::default();
        for server in 0..5 {
            let at = start + Duration::from_secs(30) * server;
            assert!(spread.allow(&ZkError::ConnectionLoss, at), "loss {server}");
        }
        let mut bunched = Retries::default();
        let allowed: Vec<bool> = (0..4)
            .map(|n| bunched.allow(&ZkError::ConnectionLoss, start + Duration::from_secs(n)))
            .collect();
        assert_eq!(allowed, [true, true, true, false]);
        assert!(bunched.allow(&ZkError::SessionExpired, start));
        assert!(!bunched.allow(&ZkError::SessionExpired, start));
    }
}
