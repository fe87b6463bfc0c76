//! Where a key's nodes live: the parent's name for a key (escaped so that any key can be one
//! znode name, and no two keys share one), the path limit, the characters ZooKeeper refuses, and
//! which children are lock nodes.

use std::fmt::Write as _;

use crate::LockError;

/// The longest lock node path dlock asks ZooKeeper for, in bytes (chroot, root, the escaped key
/// and the node's own name). The server answers a request larger than its `jute.maxbuffer` (by
/// default 1 MiB less one byte) by dropping the connection: every call in flight on the session
/// fails, and nothing says why. A lock node's create request is its path and about a hundred
/// bytes more, so a key whose path would be longer than this is refused up front with
/// [`LockError::InvalidKey`] naming the limit, and never cut to fit: two keys cut alike would be
/// one lock.
pub const MAX_PATH_BYTES: usize = 1_000_000;

/// `/{owner}-{attempt}-{sequence}` after the parent: 32 hex digits, an attempt number of up to
/// 20 digits, and a sequence of ten digits (eleven once the server's 32-bit counter wraps
/// negative).
const LOCK_NODE_NAME_BYTES: usize = 1 + 32 + 1 + 20 + 1 + 11;

/// The number in a lock node's name, `{owner}-{attempt}-{number}` (or any `{prefix}-{number}`,
/// such as the `{owner}-{number}` of earlier versions), where ZooKeeper wrote the number as
/// Java's `%010d` of its signed counter: ten digits, or a minus sign and ten digits (or
/// `-000000001`) once the counter wrapped. `None` for names of another shape. Only says whether
/// a child is a lock node: the queue is ordered by creation, not by this number.
pub(super) fn sequence(name: &str) -> Option<i64> {
    let digits_at = name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (head, digits) = name.split_at(digits_at);
    let (owner, number) = match head.strip_suffix("--") {
        Some(owner) => (owner, &name[digits_at - 1..]),
        None => (head.strip_suffix('-')?, digits),
    };
    if owner.is_empty() || owner.ends_with('-') || digits.is_empty() || number.len() < 10 {
        return None;
    }
    number.parse().ok()
}

/// The path of `key`'s parent under `base`, or [`LockError::InvalidKey`] when the lock nodes
/// under it would be longer than [`MAX_PATH_BYTES`].
pub(super) fn parent_path(base: &str, key: &str) -> Result<String, LockError> {
    parent_path_within(base, key, MAX_PATH_BYTES)
}

fn parent_path_within(base: &str, key: &str, max_path_bytes: usize) -> Result<String, LockError> {
    let parent = format!("{base}/{}", node_name(key)?);
    let len = parent.len() + LOCK_NODE_NAME_BYTES;
    if len > max_path_bytes {
        return Err(LockError::InvalidKey {
            key: key.to_owned(),
            reason: format!(
                "its ZooKeeper lock node path would be {len} bytes, longer than the \
                 {max_path_bytes} dlock sends (the server's jute.maxbuffer, 1 MiB by default, \
                 caps a whole request)"
            ),
        });
    }
    Ok(parent)
}

/// The parent's name for `key`: the key with `/`, `%` and what a znode name cannot hold
/// (characters above `U+FFFF` among them) percent-encoded as UTF-8 bytes, and `.` / `..`
/// escaped.
fn node_name(key: &str) -> Result<String, LockError> {
    if key.is_empty() {
        return Err(LockError::InvalidKey {
            key: String::new(),
            reason: "an empty key cannot name a ZooKeeper node".into(),
        });
    }
    let mut name = String::with_capacity(key.len());
    for c in key.chars() {
        if c == '/' || c == '%' || !allowed_in_znode(c) {
            let mut bytes = [0; 4];
            for byte in c.encode_utf8(&mut bytes).bytes() {
                let _ = write!(name, "%{byte:02X}");
            }
        } else {
            name.push(c);
        }
    }
    if name == "." || name == ".." {
        name = name.replace('.', "%2E");
    }
    Ok(name)
}

/// The key a parent's name stands for: [`node_name`] undone (every `%` starts an escape of a
/// byte); `None` for a name no key gives (a stray node under the root).
pub(super) fn key_of(name: &str) -> Option<String> {
    let bytes = name.as_bytes();
    let mut key = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = bytes.get(at + 1..at + 3)?;
            key.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            at += 3;
        } else {
            key.push(bytes[at]);
            at += 1;
        }
    }
    let key = String::from_utf8(key).ok()?;
    (node_name(&key).ok()? == name).then_some(key)
}

/// Whether ZooKeeper accepts `c` in a node name (its `PathUtils.validatePath`). The server
/// checks the path's UTF-16 code units, refusing `U+D800`–`U+F8FF` among others, so a character
/// above `U+FFFF`, which Java holds as a surrogate pair (`U+D800`–`U+DFFF`), is refused too.
fn allowed_in_znode(c: char) -> bool {
    let c = u32::from(c);
    c <= 0xffff
        && ![
            0x0000..=0x001f,
            0x007f..=0x009f,
            0xd800..=0xf8ff,
            0xfff0..=0xffff,
        ]
        .iter()
        .any(|range| range.contains(&c))
}

/// Checks an absolute node path given as an option: `/a/b`, no empty, `.` or `..` segment, no
/// trailing `/`, no character ZooKeeper refuses.
pub(super) fn check_path(path: &str) -> Result<(), String> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err(format!("`{path}` must start with `/`"));
    };
    for segment in rest.split('/') {
        if segment.is_empty() || segment == "." || segment == ".." {
            return Err(format!(
                "`{path}` must be `/`-separated names, none empty, `.` or `..`"
            ));
        }
        if let Some(c) = segment.chars().find(|&c| !allowed_in_znode(c)) {
            let why = if u32::from(c) > 0xffff {
                " (ZooKeeper refuses every character above U+FFFF: Java holds it as a surrogate \
                 pair, and a path may hold no surrogate)"
            } else {
                ""
            };
            return Err(format!(
                "`{}` has a character ZooKeeper refuses, {c:?} (U+{:04X}){why}",
                path.escape_debug(),
                u32::from(c)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{
        check_path, key_of, node_name, parent_path, parent_path_within, sequence, MAX_PATH_BYTES,
    };
    use crate::LockError;

    #[test]
    fn the_path_limit_is_exact() {
        // "/dlock" + "/" + key + "/" + 32 + "-" + 20 + "-" + 11 bytes.
        let longest = MAX_PATH_BYTES - 6 - 1 - 66;
        assert!(parent_path("/dlock", &"k".repeat(longest)).is_ok());
        let error = parent_path("/dlock", &"k".repeat(longest + 1)).unwrap_err();
        assert!(
            matches!(&error, LockError::InvalidKey { reason, .. }
                if reason.contains("1000001 bytes") && reason.contains("1000000")),
            "{error}"
        );
        // The limit counts the escaped name: `/` becomes `%2F`.
        let slashes = "/".repeat(longest / 3);
        assert!(parent_path("/dlock", &format!("{slashes}{}", "k".repeat(longest % 3))).is_ok());
        assert!(parent_path("/dlock", &format!("{slashes}/")).is_err());
    }

    #[test]
    fn a_parent_name_reads_back_as_its_key() {
        for key in [
            "acct:a%3Ab",
            "a/b",
            ".",
            "..",
            "a.b",
            "é\u{1}x",
            "%",
            "emoji:🔒",
            "\u{20000}\u{10FFFF}",
        ] {
            assert_eq!(
                key_of(&node_name(key).unwrap()).as_deref(),
                Some(key),
                "{key}"
            );
        }
        // Names no key gives: a stray `%`, an escape of what needs none, `.`.
        for name in ["a%", "a%2", "%61", ".", "a%zz"] {
            assert_eq!(key_of(name), None, "{name}");
        }
    }

    #[test]
    fn node_names_escape_what_a_znode_cannot_hold() {
        assert_eq!(node_name("acct:a%3Ab").unwrap(), "acct:a%253Ab");
        assert_eq!(node_name("a/b").unwrap(), "a%2Fb");
        assert_eq!(node_name(".").unwrap(), "%2E");
        assert_eq!(node_name("..").unwrap(), "%2E%2E");
        assert_eq!(node_name("...").unwrap(), "...");
        assert_eq!(node_name("tab\there").unwrap(), "tab%09here");
        assert_eq!(node_name("\u{fff0}").unwrap(), "%EF%BF%B0");
        assert_eq!(node_name("zookeeper").unwrap(), "zookeeper");
        assert_eq!(node_name("ключ").unwrap(), "ключ");
        // ZooKeeper checks UTF-16 code units and refuses surrogates: a character above U+FFFF
        // (an emoji, CJK Extension B) is two of them, so it is escaped, as its UTF-8 bytes.
        assert_eq!(node_name("🔒").unwrap(), "%F0%9F%94%92");
        assert_eq!(node_name("emoji:🔒").unwrap(), "emoji:%F0%9F%94%92");
        assert_eq!(node_name("\u{20000}").unwrap(), "%F0%A0%80%80");
        assert_eq!(node_name("\u{10000}").unwrap(), "%F0%90%80%80");
        assert_eq!(node_name("\u{ffef}").unwrap(), "\u{ffef}");
        assert!(node_name("").is_err());
        // Injective: `%` is always an escape.
        assert_ne!(node_name("a/b").unwrap(), node_name("a%2Fb").unwrap());
        assert_ne!(node_name(".").unwrap(), node_name("%2E").unwrap());
    }

    #[test]
    fn lock_node_names_are_an_owner_an_attempt_and_ten_digits() {
        let owner = "3f9c0a1b2c3d4e5f60718293a4b5c6e1";
        assert_eq!(sequence(&format!("{owner}-17-0000000003")), Some(3));
        assert_eq!(
            sequence(&format!("{owner}-18446744073709551615--2147483648")),
            Some(-2147483648)
        );
        assert_eq!(sequence("x-y-0000000003"), Some(3));
        assert_eq!(sequence("x-003"), None);
        assert_eq!(sequence("x-17-003"), None);
    }

    /// ZooKeeper writes a lock node's number as Java's `%010d` of a signed 32-bit counter, so
    /// past 2^31 changes to a key's children the names go on with a minus sign.
    #[test]
    fn node_names_past_the_counter_wrap_are_lock_nodes() {
        assert_eq!(sequence("a-2147483647"), Some(2147483647));
        assert_eq!(sequence("a--2147483648"), Some(-2147483648));
        assert_eq!(sequence("a--000000001"), Some(-1));
        assert_eq!(sequence("a-0000000000"), Some(0));
        assert_eq!(sequence("a--"), None);
        assert_eq!(sequence("a---000000001"), None);
    }

    #[test]
    fn option_paths_are_checked() {
        assert!(check_path("/dlock").is_ok());
        for bad in ["dlock", "/", "/a/../b", "/a/"] {
            assert!(check_path(bad).is_err(), "{bad}");
        }
        // A character ZooKeeper refuses is named, and one above U+FFFF is said to be refused
        // for its surrogate pair.
        let refused = check_path("/locks/🔒").unwrap_err();
        assert!(
            refused.contains("U+1F512") && refused.contains("surrogate"),
            "{refused}"
        );
        let refused = check_path("/a\u{7f}").unwrap_err();
        assert!(refused.contains("U+007F"), "{refused}");
    }

    proptest! {
        /// A key is refused exactly when its path would pass the limit, and one that is taken is
        /// taken whole. (With a small limit, so that each case is quick; `the_path_limit_is_exact`
        /// checks the real one.)
        #[test]
        fn keys_near_the_path_limit_are_taken_whole_or_refused(
            base in "(/[a-z]{1,8}){1,3}",
            key in "[k/é\u{1}%.🔒]{1,60}",
        ) {
            const LIMIT: usize = 120;
            let len = base.len() + 1 + node_name(&key).unwrap().len() + 66;
            match parent_path_within(&base, &key, LIMIT) {
                Ok(parent) => {
                    prop_assert!(len <= LIMIT);
                    prop_assert_eq!(parent, format!("{base}/{}", node_name(&key).unwrap()));
                }
                Err(LockError::InvalidKey { key: refused, reason }) => {
                    prop_assert!(len > LIMIT);
                    prop_assert!(refused == key, "the refused key was cut");
                    prop_assert!(reason.contains(&format!("{len} bytes")), "{}", reason);
                    prop_assert!(reason.contains(&format!("the {LIMIT} dlock sends")), "{}", reason);
                }
                Err(other) => prop_assert!(false, "unexpected {other}"),
            }
        }
    }
}
