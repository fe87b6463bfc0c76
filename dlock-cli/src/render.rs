//! The tables people read: one key (`inspect`), the held keys (`list`, `watch`).

use std::fmt::Write;
use std::time::Duration;

use crate::report::{human_duration, human_utc, HolderReport, KeyReport};
use crate::table::Table;

/// `inspect`'s page: the key, the store (its URL masked by the caller), the waiters, and a row
/// per holder.
pub fn inspect(store: &str, report: &KeyReport) -> String {
    let mut page = String::new();
    let holders = match report.holders.len() {
        0 => "none: the key is free".to_owned(),
        n => n.to_string(),
    };
    let _ = writeln!(page, "key      {}", report.key);
    let _ = writeln!(page, "store    {store}");
    let _ = writeln!(page, "holders  {holders}");
    let _ = writeln!(page, "waiters  {}", report.waiters);
    if report.holders.is_empty() {
        return page;
    }
    let mut table = Table::new(&[
        "LABEL",
        "HOST",
        "PID>",
        "FENCE>",
        "ACQUIRED (UTC)",
        "TIME LEFT",
        "OWNER",
    ]);
    for holder in &report.holders {
        table.row(vec![
            label(holder),
            host(holder),
            pid(holder),
            holder.fence.to_string(),
            human_utc(Duration::from_millis(holder.acquired_at_unix_ms)),
            time_left(holder),
            holder.owner.clone(),
        ]);
    }
    page.push('\n');
    page.push_str(&table.to_string());
    page
}

/// `list`'s page (and each of `watch`'s): a line that says what was listed, and a row per
/// holder of each held key.
pub fn list(store: &str, prefix: &str, keys: &[KeyReport]) -> String {
    let under = if prefix.is_empty() {
        String::new()
    } else {
        format!(" under `{prefix}`")
    };
    let held = keys.iter().filter(|key| key.held).count();
    let mut page = match held {
        0 => format!("no held keys{under} on {store}\n"),
        1 => format!("1 held key{under} on {store}\n"),
        n => format!("{n} held keys{under} on {store}\n"),
    };
    if held == 0 {
        return page;
    }
    let mut table = Table::new(&[
        "KEY",
        "LABEL",
        "HOST",
        "PID>",
        "FENCE>",
        "TIME LEFT",
        "WAITERS>",
    ]);
    for key in keys {
        for holder in &key.holders {
            table.row(vec![
                key.key.clone(),
                label(holder),
                host(holder),
                pid(holder),
                holder.fence.to_string(),
                time_left(holder),
                key.waiters.to_string(),
            ]);
        }
    }
    page.push('\n');
    page.push_str(&table.to_string());
    page
}

/// A holder's label; `-` where it has none (an acquisition that gave none, or an older dlock's).
fn label(holder: &HolderReport) -> String {
    if holder.label.is_empty() {
        "-".to_owned()
    } else {
        holder.label.clone()
    }
}

/// A holder's host; `-` where the store does not know it.
fn host(holder: &HolderReport) -> String {
    holder.host.clone().unwrap_or_else(|| "-".to_owned())
}

/// A holder's process id; `-` where the store does not know it.
fn pid(holder: &HolderReport) -> String {
    holder
        .pid
        .map_or_else(|| "-".to_owned(), |pid| pid.to_string())
}

/// A holder's time left; `-` for a lease the store keeps with no expiry (a session's).
fn time_left(holder: &HolderReport) -> String {
    holder
        .time_left()
        .map_or_else(|| "-".to_owned(), human_duration)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    fn holder(label: &str, fence: u64, left: Option<u64>) -> HolderReport {
        HolderReport::new(
            label,
            Some("web-1".into()),
            Some(4242),
            "3f2a9c0d5e7b41a8b6c2d9e0f1a3b5c7",
            fence,
            UNIX_EPOCH + Duration::from_secs(1_796_161_526),
            left.map(Duration::from_millis),
        )
    }

    #[test]
    fn inspect_shows_each_holder_and_the_waiters() {
        let report = KeyReport::new(
            "acct:42",
            vec![holder("billing::submit", 17, Some(2_500))],
            1,
        );
        let page = inspect("redis://:***@10.0.0.7:6379", &report);
        assert_eq!(
            page,
            "key      acct:42\n\
             store    redis://:***@10.0.0.7:6379\n\
             holders  1\n\
             waiters  1\n\
             \n\
             LABEL            HOST    PID  FENCE  ACQUIRED (UTC)       TIME LEFT  OWNER\n\
             billing::submit  web-1  4242     17  2026-12-01 21:45:26  2.5s       3f2a9c0d5e7b41a8b6c2d9e0f1a3b5c7\n"
        );
    }

    #[test]
    fn inspect_of_a_free_key_says_so() {
        let page = inspect("memory://", &KeyReport::new("acct:42", Vec::new(), 0));
        assert!(page.contains("holders  none: the key is free\n"), "{page}");
        assert!(!page.contains("LABEL"), "{page}");
    }

    #[test]
    fn list_shows_a_row_per_holder() {
        let keys = [
            KeyReport::new("acct:42", vec![holder("billing::submit", 17, None)], 0),
            KeyReport::new(
                "old",
                vec![HolderReport::new(
                    "",
                    None,
                    None,
                    "00ff",
                    2,
                    UNIX_EPOCH,
                    Some(Duration::from_secs(5)),
                )],
                0,
            ),
            KeyReport::new(
                "pool",
                vec![
                    holder("worker", 3, Some(61_000)),
                    holder("worker", 4, Some(900)),
                ],
                2,
            ),
        ];
        let page = list("zk://zk1:2181", "", &keys);
        assert_eq!(
            page,
            "3 held keys on zk://zk1:2181\n\
             \n\
             KEY      LABEL            HOST    PID  FENCE  TIME LEFT  WAITERS\n\
             acct:42  billing::submit  web-1  4242     17  -                0\n\
             old      -                -         -      2  5.0s             0\n\
             pool     worker           web-1  4242      3  1m01s            2\n\
             pool     worker           web-1  4242      4  900ms            2\n"
        );
        assert_eq!(
            list("memory://", "acct:", &[]),
            "no held keys under `acct:` on memory://\n"
        );
    }
}
