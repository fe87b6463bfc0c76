//! The operator's view of a key: who holds it and who waits ([`ZookeeperBackend::queue`]), and
//! taking it from a holder that hangs ([`ZookeeperBackend::force_release`]).

use std::time::{Duration, UNIX_EPOCH};

use zookeeper_client::{Error as ZkError, MultiReadResult};

use super::batch::batches;
use super::describe::parse_node_data;
use super::node::delete_node;
use super::paths::{key_of, sequence};
use super::queue::{list_or_empty, queue_in_creation_order, read_lock_nodes};
use super::session::zk_error;
use super::ZookeeperBackend;
use crate::backend::description::Described;
use crate::{KeyState, LockError, Owner};

impl ZookeeperBackend {
    /// The lock nodes of `key` in queue order, the holder first, as
    /// `{owner}-{attempt}-{sequence}`. Empty
    /// when nobody holds or waits for the key.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidKey`] for a key too long for a ZooKeeper path;
    /// [`LockError::Backend`] when the ensemble cannot be read.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// # let backend = dlock::backend::ZookeeperBackend::connect("zk://zk1:2181/apps").await?;
    /// let queue = backend.queue("nightly-report").await?;
    /// match queue.first() {
    ///     Some(holder) => println!("held by {holder}, {} waiting", queue.len() - 1),
    ///     None => println!("free"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn queue(&self, key: &str) -> Result<Vec<String>, LockError> {
        let parent = self.shared.parent(key)?;
        let session = self.session().await?;
        queue_in_creation_order(&session.client, &parent)
            .await
            .map_err(zk_error)
    }

    /// `key`'s holder, described by its lock node (the oldest), and its waiters (the nodes
    /// behind it), for [`Backend::inspect`](crate::backend::Backend::inspect).
    pub(super) async fn inspect_key(&self, key: &str) -> Result<KeyState, LockError> {
        let Ok(parent) = self.shared.parent(key) else {
            // Never acquired: an acquire refuses such a key before sending anything.
            return Ok(KeyState::new(key, Vec::new(), 0));
        };
        let session = self.session().await?;
        let children = list_or_empty(&session.client, &parent)
            .await
            .map_err(zk_error)?;
        let mut nodes = read_lock_nodes(&session.client, &parent, children)
            .await
            .map_err(zk_error)?;
        nodes.sort_unstable_by_key(|node| node.stat.czxid);
        let Some(first) = nodes.first() else {
            return Ok(KeyState::new(key, Vec::new(), 0));
        };
        let data = parse_node_data(&first.data);
        let owner = node_owner(&first.name, &data.owner);
        let created =
            UNIX_EPOCH + Duration::from_millis(u64::try_from(first.stat.ctime).unwrap_or(0));
        let holder = Described {
            owner,
            fence: u64::try_from(first.stat.czxid).unwrap_or(0),
            acquired_us: created
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| i64::try_from(since.as_micros()).unwrap_or(0)),
            // The node lives as long as its session: nothing on the ensemble counts a ttl.
            left_us: None,
            label: data.label,
            host: data.host,
            pid: data.pid,
        }
        .holder("ZooKeeper", key)?;
        Ok(KeyState::new(key, vec![holder], nodes.len() - 1))
    }

    /// The keys under the root that start with `prefix` and have a lock node, for
    /// [`Backend::list`](crate::backend::Backend::list): the root's children, read at once, and
    /// the children of those whose key starts with `prefix`, in pipelined `multiRead`s.
    pub(super) async fn list_keys(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        let session = self.session().await?;
        let base = &self.shared.base;
        let candidates: Vec<(String, String)> = list_or_empty(&session.client, base)
            .await
            .map_err(zk_error)?
            .into_iter()
            .filter_map(|name| key_of(&name).map(|key| (name, key)))
            .filter(|(_, key)| key.starts_with(prefix))
            .collect();
        let mut reads = Vec::new();
        for chunk in batches(&candidates, |(name, _)| base.len() + 1 + name.len()) {
            let mut reader = session.client.new_multi_reader();
            for (name, _) in chunk {
                reader
                    .add_get_children(&format!("{base}/{name}"))
                    .map_err(zk_error)?;
            }
            reads.push(reader.commit());
        }
        let mut keys = Vec::new();
        let mut candidates = candidates.into_iter();
        for read in reads {
            for result in read.await.map_err(zk_error)? {
                let (_, key) = candidates.next().unwrap_or_default();
                match result {
                    MultiReadResult::Children { children } => {
                        if children.iter().any(|child| sequence(child).is_some()) {
                            keys.push(key);
                        }
                    }
                    // Deleted since the listing: released.
                    MultiReadResult::Error {
                        err: ZkError::NoNode,
                    } => {}
                    MultiReadResult::Error { err } => return Err(zk_error(err)),
                    _ => {
                        return Err(LockError::backend(
                            "ZooKeeper answered a read of children with something else",
                        ))
                    }
                }
            }
        }
        Ok(keys)
    }

    /// Deletes the node of `key`'s holder, whoever it is, as an operator's `delete` in `zkCli`
    /// would: the holder sees the loss at its next renewal, and the next waiter gets the key.
    /// Returns whether the key was held.
    ///
    /// No owner is checked: a key that changed hands since it was looked at loses its new
    /// holder. [`Locker::force_release`](crate::Locker::force_release) names the owner to evict
    /// and leaves any other alone.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidKey`] for a key too long for a ZooKeeper path;
    /// [`LockError::Backend`] when the ensemble cannot be reached.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// # let backend = dlock::backend::ZookeeperBackend::connect("zk://zk1:2181/apps").await?;
    /// // A holder that hangs without losing its session keeps the key: an operator steps in.
    /// if backend.force_release("nightly-report").await? {
    ///     println!("released; the holder learns of it at its next renewal");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        Ok(self.evict(key, None).await?.is_some())
    }

    /// Deletes the node of `key`'s holder where it is `owner` (`None`: whoever it is): its fence
    /// (the node's `czxid`), or `None` where nobody held the key, or another owner does.
    /// [`Backend::force_release`](crate::backend::Backend::force_release) for
    /// [`Locker::force_release`](crate::Locker::force_release), which names the owner that
    /// [`inspect`](crate::backend::Backend::inspect) showed, compared as `inspect` names it: a
    /// key that changed hands since keeps its new holder, and a call made again leaves the
    /// waiter the first one handed the key to. The next holder's fence is the `czxid` of a
    /// node created after the evicted one, so it is greater: zxids only grow.
    pub(super) async fn evict(
        &self,
        key: &str,
        owner: Option<Owner>,
    ) -> Result<Option<u64>, LockError> {
        let parent = self.shared.parent(key)?;
        let session = self.session().await?;
        // A holder that leaves between the listing and the delete hands the key on by itself:
        // the next holder is then the one to evict (where no owner is named). A few rounds, not
        // a loop a busy key could keep going.
        for _ in 0..3 {
            let children = list_or_empty(&session.client, &parent)
                .await
                .map_err(zk_error)?;
            let nodes = read_lock_nodes(&session.client, &parent, children)
                .await
                .map_err(zk_error)?;
            let Some(holder) = nodes.into_iter().min_by_key(|node| node.stat.czxid) else {
                return Ok(None);
            };
            if let Some(owner) = owner {
                let data = parse_node_data(&holder.data);
                if node_owner(&holder.name, &data.owner) != owner.to_string() {
                    return Ok(None);
                }
            }
            let path = format!("{parent}/{}", holder.name);
            // With the parent, as a release deletes it: refused while anyone queues, it does
            // not stay empty under the root once the last node goes.
            match delete_node(&session.client, &path, &parent).await {
                Ok(true) => return Ok(Some(u64::try_from(holder.stat.czxid).unwrap_or(0))),
                Ok(false) => continue,
                Err(error) => return Err(zk_error(error)),
            }
        }
        Ok(None)
    }
}

/// The owner of the lock node `name` whose data names `data_owner`: that one, or, for a node
/// whose data is no owner (made by hand), the one its name starts with (`{owner}-…`).
fn node_owner(name: &str, data_owner: &str) -> String {
    if data_owner.len() == 32 {
        data_owner.to_owned()
    } else {
        name.split('-').next().unwrap_or_default().to_owned()
    }
}
