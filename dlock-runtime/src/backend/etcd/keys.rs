//! Where a lock lives in etcd's key space, and what its key holds.
//!
//! ```text
//! dlock/acct:42/3f9c…e1      holder (lowest create revision), value: owner, pid, host, label
//! dlock/acct:42/8a02…5d      waiter, watching the delete of …e1
//! ```
//!
//! The lock key's part is escaped (`%` → `%25`, `/` → `%2F`), so that no key's prefix
//! (`dlock/a/`) is the start of another key's nodes (`dlock/a/b/…` would be, unescaped): the
//! range of one key holds that key's nodes only.

use crate::inspect::bounded;
use crate::Owner;

/// The prefix every node of `key` starts with: `{root}/{escaped key}/`.
pub(super) fn key_prefix(root: &str, key: &str) -> String {
    format!("{root}/{}/", escape(key))
}

/// The node of `owner`'s `attempt` at the key whose prefix is `prefix`. Each attempt has a
/// node of its own: an acquisition that tries again after its grant was withdrawn must never
/// find, and take as its own, the node of the withdrawn grant, whose delete may still be on its
/// way (it would be deleted from under the new grant).
pub(super) fn node_path(prefix: &str, owner: Owner, attempt: u64) -> String {
    format!("{prefix}{owner}-{attempt}")
}

/// The start of every key whose name starts with `prefix`, for a listing.
pub(super) fn listing_prefix(root: &str, prefix: &str) -> String {
    format!("{root}/{}", escape(prefix))
}

/// The lock key a node's etcd key belongs to, with its escapes undone; `None` for a key of
/// another layout under the root.
pub(super) fn key_of(root: &str, node: &[u8]) -> Option<String> {
    let node = std::str::from_utf8(node).ok()?;
    let rest = node.strip_prefix(root)?.strip_prefix('/')?;
    let (escaped, _owner) = rest.rsplit_once('/')?;
    unescape(escaped)
}

fn escape(key: &str) -> String {
    let mut escaped = String::with_capacity(key.len());
    for c in key.chars() {
        match c {
            '%' => escaped.push_str("%25"),
            '/' => escaped.push_str("%2F"),
            c => escaped.push(c),
        }
    }
    escaped
}

fn unescape(escaped: &str) -> Option<String> {
    let mut key = String::with_capacity(escaped.len());
    let mut rest = escaped;
    while let Some(at) = rest.find('%') {
        key.push_str(&rest[..at]);
        match rest.get(at..at + 3)? {
            "%25" => key.push('%'),
            "%2F" => key.push('/'),
            _ => return None,
        }
        rest = &rest[at + 3..];
    }
    key.push_str(rest);
    Some(key)
}

/// The value of `owner`'s node: `{owner}\n{pid}\n{host}\n{created}\n{label}`, `created` the
/// microseconds since the epoch by this process's clock (etcd keeps no time with a key), the
/// label last so it may hold any character.
pub(super) fn node_value(owner: Owner, label: &str) -> String {
    let host = bounded(crate::inspect::this_host());
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_micros());
    format!(
        "{owner}\n{}\n{host}\n{created}\n{}",
        std::process::id(),
        bounded(label)
    )
}

/// What a node's value says of its holder.
pub(super) struct NodeValue {
    pub(super) owner: String,
    pub(super) pid: Option<u32>,
    pub(super) host: Option<String>,
    /// Microseconds since the epoch, by the creating process's clock.
    pub(super) created_us: i64,
    pub(super) label: Option<String>,
}

/// Reads a node's value.
pub(super) fn parse_node_value(value: &[u8]) -> NodeValue {
    let value = String::from_utf8_lossy(value);
    let mut fields = value.splitn(5, '\n');
    NodeValue {
        owner: fields.next().unwrap_or_default().to_owned(),
        pid: fields.next().and_then(|pid| pid.parse().ok()),
        host: fields.next().map(str::to_owned),
        created_us: fields.next().and_then(|us| us.parse().ok()).unwrap_or(0),
        label: fields.next().map(str::to_owned),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_key_s_nodes_fall_in_another_key_s_range() {
        let owner = Owner::random();
        let nested = node_path(&key_prefix("dlock", "a/b"), owner, 1);
        assert!(!nested.starts_with(&key_prefix("dlock", "a")), "{nested}");
        assert_eq!(key_of("dlock", nested.as_bytes()).as_deref(), Some("a/b"));
        let percent = node_path(&key_prefix("dlock", "a%2Fb"), owner, 1);
        assert_eq!(
            key_of("dlock", percent.as_bytes()).as_deref(),
            Some("a%2Fb")
        );
        assert_ne!(percent, nested);
        assert!(nested.starts_with(&listing_prefix("dlock", "a/")));
    }

    #[test]
    fn a_node_s_value_describes_its_holder() {
        let owner = Owner::random();
        let read = parse_node_value(node_value(owner, "night\nreport").as_bytes());
        assert_eq!(read.owner, owner.to_string());
        assert_eq!(read.pid, Some(std::process::id()));
        assert_eq!(read.label.as_deref(), Some("night\nreport"));
    }
}
