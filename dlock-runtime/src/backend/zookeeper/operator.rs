//! The operator's view of a key: who holds it and who waits ([`ZookeeperBackend::queue`]), and
//! taking it from a holder that hangs ([`ZookeeperBackend::force_release`]).

use zookeeper_client::Error as ZkError;

use super::queue::queue_in_creation_order;
use super::session::zk_error;
use super::ZookeeperBackend;
use crate::LockError;

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

    /// Deletes the node of `key`'s holder, whoever it is, as an operator's `delete` in `zkCli`
    /// would: the holder sees the loss at its next renewal, and the next waiter gets the key.
    /// Returns whether the key was held.
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
        Ok(self.evict(key).await?.is_some())
    }

    /// Deletes the node of `key`'s holder, whoever it is: its fence (the node's `czxid`), or
    /// `None` where nobody held the key. [`Backend::force_release`](crate::backend::Backend::force_release)
    /// for [`Locker::force_release`](crate::Locker::force_release). The next holder's fence is
    /// the `czxid` of a node created after the evicted one, so it is greater: zxids only grow.
    pub(super) async fn evict(&self, key: &str) -> Result<Option<u64>, LockError> {
        let parent = self.shared.parent(key)?;
        let session = self.session().await?;
        // A holder that leaves between the listing and the delete hands the key on by itself:
        // the next holder is then the one to evict. A few rounds, not a loop a busy key could
        // keep going.
        for _ in 0..3 {
            let queue = queue_in_creation_order(&session.client, &parent)
                .await
                .map_err(zk_error)?;
            let Some(holder) = queue.into_iter().next() else {
                return Ok(None);
            };
            let path = format!("{parent}/{holder}");
            let stat = match session.client.check_stat(&path).await {
                Ok(Some(stat)) => stat,
                Ok(None) => continue,
                Err(error) => return Err(zk_error(error)),
            };
            match session.client.delete(&path, None).await {
                Ok(()) => return Ok(Some(u64::try_from(stat.czxid).unwrap_or(0))),
                Err(ZkError::NoNode) => continue,
                Err(error) => return Err(zk_error(error)),
            }
        }
        Ok(None)
    }
}
