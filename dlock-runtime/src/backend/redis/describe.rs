//! The holder's description stored with each lock (see "Descriptions" in common.lua): written
//! by the acquire script from `<pid>/<host>/<label>`, which this module makes, and read back
//! by `inspect`, which this module parses.
//!
//! A lock's value is `<owner>[-]` alone (an older dlock's grant) or
//! `<owner>[-]\n<pid>/<host>/<label>/<fence>/<µs>`. Host and label are percent-encoded where
//! they hold a byte that would end a field or a word: `/`, `%`, white space and control bytes.
//! The scripts read the waiter's copy of it as one word, and Lua's `%s` is ASCII white space
//! only, so other bytes (UTF-8 among them) stay as they are.

use std::sync::LazyLock;
use std::time::{Duration, UNIX_EPOCH};

use crate::inspect::bounded;
use crate::{Holder, Owner};

/// `<pid>/<host>/`, the part of the description every acquisition of this process shares: made
/// once.
static PROCESS: LazyLock<String> = LazyLock::new(|| {
    let mut process = format!("{}/", std::process::id());
    encode_into(crate::inspect::this_host(), &mut process);
    process.push('/');
    process
});

/// The description an acquisition under `label` stores with its lock: `<pid>/<host>/<label>`,
/// the label cut by [`bounded`] (the host is, where it is read), which bounds what every grant,
/// waiter poll and queue rewrite of the lock carries.
pub(super) fn holder_meta(label: &str) -> String {
    let label = bounded(label);
    let mut meta = String::with_capacity(PROCESS.len() + label.len());
    meta.push_str(&PROCESS);
    encode_into(label, &mut meta);
    meta
}

/// Whether `byte` is percent-encoded in a description's field.
fn encoded(byte: u8) -> bool {
    byte <= b' ' || byte == 0x7f || byte == b'/' || byte == b'%'
}

fn encode_into(text: &str, out: &mut String) {
    if !text.bytes().any(encoded) {
        out.push_str(text);
        return;
    }
    for c in text.chars() {
        match u8::try_from(c) {
            Ok(byte) if encoded(byte) => {
                const HEX: &[u8; 16] = b"0123456789ABCDEF";
                out.push('%');
                out.push(char::from(HEX[usize::from(byte >> 4)]));
                out.push(char::from(HEX[usize::from(byte & 0xf)]));
            }
            _ => out.push(c),
        }
    }
}

/// `field` with its percent-encoding undone; a `%` not followed by two hex digits stays as it
/// is.
fn decode(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(high), Some(low)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push(u8::try_from(high * 16 + low).unwrap_or(b'?'));
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The last line renew.lua's exact expiry (a lease's hold) adds to the lock's value.
const HOLD_MARK: &str = "\nhold";

/// What a lock's value says of its holder: `None` where it holds no owner dlock wrote (a value
/// set from outside).
///
/// `pttl` is the lock's PTTL (negative where it has none); `counter` the fence counter's value,
/// which an older dlock's grant (the owner alone) is described by: its fence, and the time the
/// fence was counted, which the counter floors by the server's clock in µs.
pub(super) fn parse_holder(value: &str, pttl: i64, counter: Option<u64>) -> Option<Holder> {
    // A lease's hold marks its lock with a last line (see "The hold's mark" in renew.lua): the
    // lease is released, the key kept to the hold's end; the holder is described all the same.
    let value = value.strip_suffix(HOLD_MARK).unwrap_or(value);
    let (first_line, meta) = match value.split_once('\n') {
        Some((first_line, meta)) => (first_line, Some(meta)),
        None => (value, None),
    };
    let owner = first_line.strip_suffix('-').unwrap_or(first_line);
    if owner.len() != 32 || !owner.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let owner = Owner::from_u128(u128::from_str_radix(owner, 16).ok()?);
    let micros = |us: u64| UNIX_EPOCH + Duration::from_micros(us);
    let mut holder = match meta {
        Some(meta) => {
            // <pid>/<host>/<label>/<fence>/<µs>: host and label hold no raw `/`.
            let mut fields = meta.split('/');
            let (pid, host, label, fence, at) = (
                fields.next()?,
                fields.next()?,
                fields.next()?,
                fields.next()?,
                fields.next()?,
            );
            if fields.next().is_some() {
                return None;
            }
            let mut holder = Holder::new(owner, fence.parse().ok()?, micros(at.parse().ok()?))
                .with_label(decode(label));
            if let Ok(pid) = pid.parse() {
                holder = holder.with_pid(pid);
            }
            if !host.is_empty() {
                holder = holder.with_host(decode(host));
            }
            holder
        }
        None => {
            let fence = counter.unwrap_or(0);
            Holder::new(owner, fence, micros(fence))
        }
    };
    if let Ok(left) = u64::try_from(pttl) {
        holder = holder.with_time_left(Duration::from_millis(left));
    }
    Some(holder)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions_keep_their_fields_whatever_they_hold() {
        for label in ["", "billing::charge", "a/b c%d\n\te", "ünïcode / 100%"] {
            let meta = holder_meta(label);
            assert!(
                !meta.bytes().any(|b| b.is_ascii_whitespace()),
                "a description is one word: {meta:?}"
            );
            assert_eq!(meta.matches('/').count(), 2, "{meta:?}");
            let owner = Owner::random();
            let value = format!("{owner}-\n{meta}/17/1764633600000000");
            let holder = parse_holder(&value, 2500, None).unwrap();
            assert_eq!(holder.owner(), owner);
            assert_eq!(holder.label(), label);
            assert_eq!(holder.pid(), Some(std::process::id()));
            assert_eq!(holder.fence(), 17);
            assert_eq!(
                holder.acquired_at(),
                UNIX_EPOCH + Duration::from_micros(1_764_633_600_000_000)
            );
            assert_eq!(holder.time_left(), Some(Duration::from_millis(2500)));
        }
    }

    #[test]
    fn a_lock_kept_for_its_hold_is_described_as_before() {
        let owner = Owner::random();
        let meta = holder_meta("job");
        let value = format!("{owner}\n{meta}/17/1764633600000000");
        let unmarked = parse_holder(&value, 200, None).unwrap();
        let marked = parse_holder(&format!("{value}{HOLD_MARK}"), 200, None).unwrap();
        assert_eq!(marked, unmarked);
        assert!(include_str!("renew.lua").contains("local held = '\\nhold'\n"));
        let older = parse_holder(&format!("{owner}{HOLD_MARK}"), -1, Some(5)).unwrap();
        assert_eq!((older.owner(), older.fence()), (owner, 5));
    }

    #[test]
    fn an_older_grant_is_described_by_its_fence() {
        let owner = Owner::random();
        let holder = parse_holder(&owner.to_string(), -1, Some(1_764_633_600_000_001)).unwrap();
        assert_eq!(holder.owner(), owner);
        assert_eq!(
            (holder.label(), holder.host(), holder.pid()),
            ("", None, None)
        );
        assert_eq!(holder.fence(), 1_764_633_600_000_001);
        assert_eq!(
            holder.acquired_at(),
            UNIX_EPOCH + Duration::from_micros(1_764_633_600_000_001)
        );
        assert_eq!(holder.time_left(), None, "no PTTL, no time left");
    }

    #[test]
    fn values_no_dlock_wrote_describe_no_holder() {
        let owner = Owner::random();
        for value in [
            "a-stranger".to_owned(),
            format!("{owner}0"),
            format!("{owner}--"),
            format!("{owner}\n1/h/l/2"),
            format!("{owner}\n1/h/l/2/3/4"),
        ] {
            assert!(parse_holder(&value, 1000, None).is_none(), "{value:?}");
        }
    }

    #[test]
    fn stray_percents_stay() {
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%zz%2F"), "%zz/");
    }
}
