//! Acquisition: create a lock node, wait for the nodes ahead of it to go, watching only the one
//! just ahead, and take the key when none is left.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use zookeeper_client::{Error as ZkError, EventType};

use super::node::{confirm_nodes, LockNode};
use super::paths::sequence;
use super::queue::list_or_empty;
use super::session::{is_retryable, zk_error, Session};
use super::{Held, ZookeeperBackend, EPHEMERAL_SEQUENTIAL, PERSISTENT};
use crate::backend::{AcquireRequest, Acquired};
use crate::{LockError, Owner};

/// How often an acquisition recreates a parent that a concurrent release deleted before giving
/// up. Each time needs a release to slip in between two of our requests.
const PARENT_RETRIES: usize = 16;

impl ZookeeperBackend {
    /// Acquires on `session`, trying once more on a lost connection or an ended session.
    pub(super) async fn acquire_on(
        &self,
        mut session: Session,
        request: &AcquireRequest<'_>,
        parent: String,
    ) -> Result<Option<Acquired>, LockError> {
        let now = Instant::now();
        // A wait too long to add is a wait without end.
        let deadline = now
            .checked_add(request.wait)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600));
        let mut retried = false;
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
                    Err(error) if !retried && is_retryable(&error) => {
                        retried = true;
                        session = self.session().await?;
                    }
                    Err(error) => return Err(zk_error(error)),
                }
            }
        }
        let mut node = LockNode::new(&session, parent, request.owner);
        node.parent_missing = parent_missing;
        loop {
            match self.contend(&mut node, request.owner, deadline).await {
                Ok(acquired) => return Ok(acquired),
                Err(error) if !retried && is_retryable(&error) => {
                    retried = true;
                    let fresh = self.session().await?;
                    if fresh.id != node.session {
                        // Our node, if any, went with the old session.
                        node.disarm();
                        node = LockNode::new(&fresh, node.parent.clone(), request.owner);
                    }
                }
                Err(error) => return Err(zk_error(error)),
            }
        }
    }

    /// Creates `node` if it does not exist yet and waits, watching its predecessor, until it is
    /// the lowest (granted) or `deadline` passes (`None`, the node deleted).
    async fn contend(
        &self,
        node: &mut LockNode,
        owner: Owner,
        deadline: Instant,
    ) -> Result<Option<Acquired>, ZkError> {
        let client = node.client.clone();
        // A listing that came with the create, and the create's send time: the create was a
        // write, so its success confirms the session and the node through the quorum.
        let mut listed: Option<(Vec<String>, Instant)> = None;
        let mut parents_made = 0;
        loop {
            if node.name.is_none() && node.in_flight {
                // A create whose reply was lost may have landed: find it by its owner prefix.
                let children = list_or_empty(&client, &node.parent).await?;
                if let Some(name) = children.iter().find(|c| node.is_ours(c)) {
                    let path = format!("{}/{name}", node.parent);
                    if let Some(stat) = client.check_stat(&path).await? {
                        node.adopt(name.clone(), stat.czxid);
                    }
                }
                node.in_flight = false;
            }
            if node.name.is_none() {
                node.in_flight = true;
                let sent_at = Instant::now();
                // Pipelined, one round trip: the session's requests are served in order, so the
                // create finds the parent made just before it (when it was seen missing), and
                // the list includes the node the create makes.
                let make_parent = node
                    .parent_missing
                    .then(|| client.create(&node.parent, &[], &PERSISTENT));
                let create =
                    client.create(&node.prefix, node.data.as_bytes(), &EPHEMERAL_SEQUENTIAL);
                let list = client.list_children(&node.parent);
                let make_parent = async move {
                    match make_parent {
                        Some(made) => made.await.map(drop),
                        None => Ok(()),
                    }
                };
                let (made, created, children) = tokio::join!(make_parent, create, list);
                match created {
                    Ok((stat, sequence)) => {
                        node.adopt(format!("{}{sequence}", node.own_prefix), stat.czxid);
                        listed = Some((children?, sent_at));
                    }
                    Err(ZkError::NoNode) if parents_made < PARENT_RETRIES => {
                        // The parent is missing, or a release deleted it between our steps.
                        node.in_flight = false;
                        parents_made += 1;
                        if node.parent_missing && matches!(made, Err(ZkError::NoNode)) {
                            // The root itself is gone.
                            client.mkdir(&node.parent, &PERSISTENT).await?;
                        }
                        node.parent_missing = true;
                        continue;
                    }
                    Err(ZkError::NoNode) => {
                        node.in_flight = false;
                        return Err(ZkError::UnexpectedError(format!(
                            "the parent {} kept vanishing",
                            node.parent
                        )));
                    }
                    Err(error) => return Err(error),
                }
            }
            let (children, confirmed_at) = match listed.take() {
                Some((children, sent_at)) => (children, Some(sent_at)),
                None => (list_or_empty(&client, &node.parent).await?, None),
            };
            if !children.iter().any(|name| node.is(name)) {
                // Deleted from outside (an operator, or a forced release of a waiter).
                node.name = None;
                if Instant::now() >= deadline {
                    node.disarm();
                    return Ok(None);
                }
                continue;
            }
            let ahead = node.still_ahead(&children).await?;
            if ahead.is_empty() {
                // No node is ahead any more, and none can come ahead: that holds whoever served
                // the listing. Whether our node and session still live is the leader's word,
                // which a server cut off from it would answer from a stale copy: unless the
                // create just confirmed it, a write does.
                let valid_from = match confirmed_at {
                    Some(sent_at) => sent_at,
                    None => {
                        let sent_at = Instant::now();
                        let path = format!(
                            "{}/{}",
                            node.parent,
                            node.name.as_deref().unwrap_or_default()
                        );
                        if !confirm_nodes(&client, &[path.as_str()]).await?[0] {
                            node.name = None;
                            continue;
                        }
                        sent_at
                    }
                };
                let path = node.grant();
                let fence = u64::try_from(node.fence).unwrap_or(0);
                self.shared.held().insert(
                    owner,
                    Held {
                        path,
                        parent: node.parent.clone(),
                        session: node.session,
                    },
                );
                return Ok(Some(Acquired { fence, valid_from }));
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
