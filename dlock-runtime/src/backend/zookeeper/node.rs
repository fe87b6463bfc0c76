//! One acquisition's lock node: where it stands ([`Stage`]), the guard that deletes it when the
//! acquisition is abandoned, and the writes that confirm or delete lock nodes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use zookeeper_client::{Client, Error as ZkError, MultiWriteError, SessionId};

use super::batch::batches;
use super::cleanup::{delete_abandoned, delete_unanswered_create};
use super::describe::node_data;
use super::paths::sequence;
use super::queue::creation_zxids;
use super::session::{ends_session, Session};
use crate::cleanups::Cleanups;
use crate::Owner;

/// Where one acquisition's lock node stands. The acquisition loop (`contend`) moves it from
/// stage to stage; dropping the [`LockNode`] before it is [`Granted`](Stage::Granted) cleans up
/// by the stage it is in, so a waiter that gives up, or whose future is dropped, never leaves a
/// node that would block the key for as long as the session lives.
pub(super) enum Stage {
    /// No node of ours exists and no create is unanswered: the next step sends a create. This
    /// is where an acquisition starts, and where it comes back to when its node turned out to
    /// be gone (deleted from outside, or refused by the leader's check): it queues again, at
    /// the back. Moves on to `CreateUnanswered` as the create is sent. Dropped here, nothing is
    /// left to delete.
    NotCreated,
    /// A create was sent and its answer not seen (the connection was lost, the request failed
    /// without saying whether it landed, or the future was dropped): the node may exist. Its
    /// name starts with the owner, so the next step lists the parent and looks for it, moving
    /// on to `Queued` when it is there and to `NotCreated` when it is not. Dropped here, the
    /// guard does that search from the background and deletes what it finds, until the server
    /// confirms it or the session ends.
    CreateUnanswered,
    /// Our node exists, as far as the last answer said, and waits for the nodes created before
    /// it to go. Moves on to `Granted` when none is left ahead and the node is confirmed by a
    /// write; back to `NotCreated` when the node is gone; to `Gone` when the wait ran out and
    /// the node was deleted. Dropped here, the guard deletes the node, until the server confirms
    /// it or the session ends.
    Queued(Queued),
    /// The node holds the lock: it belongs to the lease now, which releases it. The guard lets
    /// it be. Final.
    Granted,
    /// Nothing of ours is left to delete: we deleted the node when the wait ran out, the node
    /// went with its session, or the wait ran out with no node at all. Final.
    Gone,
}

/// A lock node of ours that exists.
pub(super) struct Queued {
    /// The node's name, `{owner}-{attempt}-{sequence}`.
    pub(super) name: String,
    /// The node's `czxid`: its place in the queue, and the fence once it is granted.
    pub(super) czxid: i64,
    /// The lock nodes created before this one that were still there at the last listing, oldest
    /// first, with their `czxid`s; `None` until a listing after the create was read.
    ahead: Option<Vec<(i64, String)>>,
}

impl Queued {
    /// A node just created, or found again after its create's answer was lost.
    pub(super) fn new(name: String, czxid: i64) -> Self {
        Queued {
            name,
            czxid,
            ahead: None,
        }
    }

    /// The nodes still ahead of this one, oldest first, from `children` of `parent`: a listing
    /// read after this node was created. The first such listing holds every older node still
    /// there, so their ages are read then, once; a node missing from it is younger than this
    /// one, so later listings only drop the nodes that went.
    pub(super) async fn still_ahead(
        &mut self,
        client: &Client,
        parent: &str,
        children: &[String],
    ) -> Result<Vec<(i64, String)>, ZkError> {
        let ahead = match self.ahead.take() {
            Some(mut ahead) => {
                ahead.retain(|(_, name)| children.contains(name));
                ahead
            }
            None => {
                let others: Vec<String> = children
                    .iter()
                    .filter(|name| sequence(name).is_some() && **name != self.name)
                    .cloned()
                    .collect();
                let mut ahead: Vec<(i64, String)> = creation_zxids(client, parent, others)
                    .await?
                    .into_iter()
                    .filter(|(czxid, _)| *czxid < self.czxid)
                    .collect();
                ahead.sort_unstable();
                ahead
            }
        };
        self.ahead = Some(ahead.clone());
        Ok(ahead)
    }
}

/// The lock node of one acquisition in progress, on one session. Dropped before it was granted
/// (the waiter gave up or its future was dropped), it deletes the node at once, from the
/// background, trying again until the deletion is confirmed or the session has ended (see
/// [`cleanup`](super::cleanup)).
pub(super) struct LockNode {
    pub(super) client: Client,
    pub(super) session: SessionId,
    pub(super) parent: String,
    /// `{owner}-{attempt}-`: the start of the node's name, this attempt's alone (see
    /// [`attempt_prefix`]).
    pub(super) own_prefix: String,
    /// `{parent}/{owner}-{attempt}-`: what the sequential create is given.
    pub(super) prefix: String,
    /// The node's data: its holder's description (see [`describe`](super::describe)).
    pub(super) data: String,
    /// The parent was seen missing: from then on, every create of the node is preceded by one
    /// of the parent (refused harmlessly where the parent exists again).
    pub(super) parent_missing: bool,
    pub(super) stage: Stage,
    /// The backend's clean-ups, which its `close` waits for: the drop's delete is one.
    cleanups: Arc<Cleanups>,
}

impl LockNode {
    pub(super) fn new(
        session: &Session,
        parent: String,
        owner: Owner,
        label: &str,
        cleanups: &Arc<Cleanups>,
    ) -> Self {
        let own_prefix = attempt_prefix(owner);
        LockNode {
            cleanups: cleanups.clone(),
            client: session.client.clone(),
            session: session.id,
            prefix: format!("{parent}/{own_prefix}"),
            parent,
            own_prefix,
            data: node_data(owner, label),
            parent_missing: false,
            stage: Stage::NotCreated,
        }
    }

    /// Whether `name` is this attempt's lock node.
    pub(super) fn is_ours(&self, name: &str) -> bool {
        name.starts_with(&self.own_prefix) && sequence(name).is_some()
    }

    /// Deletes a queued node now, which makes it [`Gone`](Stage::Gone); if that fails, it stays
    /// [`Queued`](Stage::Queued), and dropping the guard goes on from the background until the
    /// deletion is confirmed, so the waiter's answer does not wait for the connection.
    pub(super) async fn remove(&mut self) {
        let Stage::Queued(queued) = &self.stage else {
            return;
        };
        let path = format!("{}/{}", self.parent, queued.name);
        match delete_node(&self.client, &path, &self.parent).await {
            Ok(_) => self.stage = Stage::Gone,
            Err(error) if ends_session(&error) => self.stage = Stage::Gone,
            Err(error) => {
                tracing::debug!(%path, %error, "distributed_lock: deleting an abandoned ZooKeeper node failed; retrying");
            }
        }
    }
}

/// The start of the name of a new attempt's lock node: `{owner}-{attempt}-`, the attempt a
/// number no other lock node of this process was given.
///
/// The owner alone would not do. One owner's acquisition can make several nodes under one
/// parent: it queues again when its grant was withdrawn (see [`claim`](super::claim)), or when
/// it moved to a new session. The sequence number does not tell them apart: it restarts when an
/// idle key's parent is deleted and created again, so a later node can get an earlier one's very
/// path. A delete of the earlier node that is sent again after a lost answer, or a search for it
/// after a create whose answer was lost, would then take the later one — a lock node held by a
/// caller who goes on believing it holds the key, while the next waiter gets it too.
pub(super) fn attempt_prefix(owner: Owner) -> String {
    static ATTEMPTS: AtomicU64 = AtomicU64::new(0);
    let attempt = ATTEMPTS.fetch_add(1, Ordering::Relaxed);
    format!("{owner}-{attempt}-")
}

impl Drop for LockNode {
    fn drop(&mut self) {
        let client = self.client.clone();
        let parent = self.parent.clone();
        match &self.stage {
            Stage::Queued(queued) => {
                let path = format!("{parent}/{}", queued.name);
                self.cleanups.spawn(delete_abandoned(client, path, parent));
            }
            Stage::CreateUnanswered => {
                // The create's answer was never seen: the node is found by its owner prefix.
                let own_prefix = self.own_prefix.clone();
                self.cleanups
                    .spawn(delete_unanswered_create(client, parent, own_prefix));
            }
            Stage::NotCreated | Stage::Granted | Stage::Gone => {}
        }
    }
}

/// Whether each node of `paths` exists, in the leader's word: a `multi` of version checks (any
/// version), as many nodes to a request as the server accepts (see [`batch`](super::batch)),
/// the requests pipelined. A `multi` is a write, so its
/// answer is the leader's, committed by a quorum, never a stale copy's: a server cut off from
/// the leader cannot answer it, which leaves the leases unconfirmed until the client's own
/// deadline. A `multi` fails whole when one check fails and names that check: the node is
/// gone, and the rest are checked again without it.
pub(super) async fn confirm_nodes(client: &Client, paths: &[&str]) -> Result<Vec<bool>, ZkError> {
    let mut found = vec![true; paths.len()];
    let indices: Vec<usize> = (0..paths.len()).collect();
    // A request that fails one check is sent again without it: smaller, so it still fits.
    let mut pending: Vec<Vec<usize>> = batches(&indices, |&i| paths[i].len())
        .into_iter()
        .map(<[usize]>::to_vec)
        .collect();
    while !pending.is_empty() {
        let mut commits = Vec::with_capacity(pending.len());
        for chunk in &pending {
            let mut writer = client.new_multi_writer();
            for &i in chunk {
                writer.add_check_version(paths[i], -1)?;
            }
            commits.push(writer.commit());
        }
        // Every request is sent before any answer is awaited: one round trip in all.
        let mut again = Vec::new();
        for (chunk, commit) in pending.iter().zip(commits) {
            match commit.await {
                Ok(_) => {}
                Err(MultiWriteError::OperationFailed {
                    index,
                    source: ZkError::NoNode | ZkError::BadVersion,
                }) => {
                    found[chunk[index]] = false;
                    let rest: Vec<usize> = chunk
                        .iter()
                        .copied()
                        .filter(|&i| i != chunk[index])
                        .collect();
                    if !rest.is_empty() {
                        again.push(rest);
                    }
                }
                Err(MultiWriteError::OperationFailed { source, .. }) => return Err(source),
                Err(MultiWriteError::RequestFailed { source }) => return Err(source),
            }
        }
        pending = again;
    }
    Ok(found)
}

/// Deletes the lock node at `path` and, pipelined after it, its `parent` if that is left empty
/// (the server refuses with `NotEmpty` otherwise). Returns whether the node existed.
pub(super) async fn delete_node(
    client: &Client,
    path: &str,
    parent: &str,
) -> Result<bool, ZkError> {
    let node = client.delete(path, None);
    let tidy = client.delete(parent, None);
    let (node, _) = tokio::join!(node, tidy);
    match node {
        Ok(()) => Ok(true),
        Err(ZkError::NoNode) => Ok(false),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::attempt_prefix;
    use crate::backend::zookeeper::paths::sequence;
    use crate::Owner;

    /// Two attempts of one owner never share a node name, even where ZooKeeper gives both the
    /// same sequence number (the parent deleted and created again in between).
    #[test]
    fn every_attempt_of_an_owner_names_its_node_apart() {
        let owner = Owner::random();
        let first = attempt_prefix(owner);
        let second = attempt_prefix(owner);
        assert_ne!(first, second);
        assert!(first.starts_with(&format!("{owner}-")), "{first}");
        let (a, b) = (format!("{first}0000000000"), format!("{second}0000000000"));
        assert_ne!(a, b);
        assert!(sequence(&a).is_some() && sequence(&b).is_some());
        // Neither attempt's prefix takes the other's node.
        assert!(!b.starts_with(&first) && !a.starts_with(&second));
    }
}
