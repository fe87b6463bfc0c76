//! The operator's view of a key (its holder and waiters), the held keys, and taking a key from a
//! holder that hangs.

use etcd_client::{GetOptions, SortOrder, SortTarget};

use super::keys::{key_of, key_prefix, listing_prefix, parse_node_value};
use super::EtcdBackend;
use crate::backend::description::Described;
use crate::{KeyState, LockError, Owner};

/// How many etcd keys one read of a listing returns.
const LIST_PAGE: i64 = 1000;

impl EtcdBackend {
    /// `key`'s holder, described by its oldest node, and its waiters (the nodes behind it).
    pub(super) async fn inspect_key(&self, key: &str) -> Result<KeyState, LockError> {
        let prefix = key_prefix(&self.shared.root, key);
        let mut kv = self.shared.client.kv_client();
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let read = self.shared.within(kv.get(prefix, Some(options))).await?;
        let Some(first) = read.kvs().first() else {
            return Ok(KeyState::new(key, Vec::new(), 0));
        };
        let value = parse_node_value(first.value());
        let holder = Described {
            owner: value.owner,
            fence: u64::try_from(first.create_revision()).unwrap_or(0),
            acquired_us: value.created_us,
            // The node lives as long as the backend's etcd lease: its ttl is its holder's to count.
            left_us: None,
            label: value.label,
            host: value.host,
            pid: value.pid,
        }
        .holder("etcd", key)?;
        let waiters = usize::try_from(read.count()).unwrap_or(1).saturating_sub(1);
        Ok(KeyState::new(key, vec![holder], waiters))
    }

    /// The keys that start with `prefix` and have a node, read a page of etcd keys at a time.
    pub(super) async fn list_keys(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        let root = &self.shared.root;
        let start = listing_prefix(root, prefix).into_bytes();
        let end = prefix_end(&start);
        let mut from = start.clone();
        let mut keys: Vec<String> = Vec::new();
        loop {
            let mut kv = self.shared.client.kv_client();
            let mut options = GetOptions::new().with_keys_only().with_limit(LIST_PAGE);
            options = match &end {
                Some(end) => options.with_range(end.clone()),
                None => options.with_from_key(),
            };
            let page = self
                .shared
                .within(kv.get(from.clone(), Some(options)))
                .await?;
            for node in page.kvs() {
                if let Some(key) = key_of(root, node.key()) {
                    if key.starts_with(prefix) && keys.last() != Some(&key) {
                        keys.push(key);
                    }
                }
            }
            match page.kvs().last() {
                Some(last) if page.more() => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok(keys),
            }
        }
    }

    /// Deletes the node of `key`'s holder where it is `owner`: its fence, or `None` where nobody
    /// holds the key or another owner does. The next holder's node was created after it, so its
    /// fence is greater.
    pub(super) async fn evict(&self, key: &str, owner: Owner) -> Result<Option<u64>, LockError> {
        let prefix = key_prefix(&self.shared.root, key);
        let mut kv = self.shared.client.kv_client();
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let read = self.shared.within(kv.get(prefix, Some(options))).await?;
        let Some(holder) = read.kvs().first() else {
            return Ok(None);
        };
        if parse_node_value(holder.value()).owner != owner.to_string() {
            return Ok(None);
        }
        let path = String::from_utf8_lossy(holder.key()).into_owned();
        let deleted = self
            .shared
            .delete_node(&path, holder.create_revision())
            .await?;
        Ok(deleted.then(|| u64::try_from(holder.create_revision()).unwrap_or(0)))
    }
}

/// The end of the range of keys that start with `prefix`; `None` for every key from it on.
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}
