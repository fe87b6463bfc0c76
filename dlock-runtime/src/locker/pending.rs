//! The guard that finishes what a dropped acquisition started: the store may have granted it,
//! so it is released from the background runtime. (A release needs no such guard: it runs on
//! the background runtime from the start.)

use super::Locker;
use crate::Owner;

/// Releases a key whose acquisition was abandoned mid-flight: the store may have granted it.
pub(super) struct PendingAcquire<'a> {
    pub(super) locker: &'a Locker,
    pub(super) key: &'a str,
    pub(super) owner: Owner,
    pub(super) armed: bool,
}

impl Drop for PendingAcquire<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.locker.queue_release(self.key.to_owned(), self.owner);
        }
    }
}
