//! What the commands print, as values: one key's state, and its holders. These are the JSON
//! documents `--json` prints (field names are part of the tool's interface, listed in the
//! README), and what the tables are drawn from.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// One key: who holds it and how many wait for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyReport {
    /// The key, as the application rendered it.
    pub key: String,
    /// Whether anyone holds the key.
    pub held: bool,
    /// The holders: one for a lock, up to N for a semaphore, many for a read lock.
    pub holders: Vec<HolderReport>,
    /// How many callers wait for the key.
    pub waiters: u64,
}

impl KeyReport {
    /// The report of `key`, held by `holders`.
    pub fn new(key: impl Into<String>, holders: Vec<HolderReport>, waiters: u64) -> KeyReport {
        KeyReport {
            key: key.into(),
            held: !holders.is_empty(),
            holders,
            waiters,
        }
    }
}

/// One holder of a key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HolderReport {
    /// The holder's name for operators: the `label` of the attribute, by default the locked
    /// function's path.
    pub label: String,
    /// The host the holder runs on; `null` where the store does not know it.
    pub host: Option<String>,
    /// The holder's process id; `null` where the store does not know it.
    pub pid: Option<u32>,
    /// The holder's owner token, as the store keeps it (hex).
    pub owner: String,
    /// The fencing token of the holder's acquisition.
    pub fence: u64,
    /// When the holder acquired the key, RFC 3339 in UTC with milliseconds.
    pub acquired_at: String,
    /// The same instant, in milliseconds since the Unix epoch.
    pub acquired_at_unix_ms: u64,
    /// How long the lease has left by the store's clock, in milliseconds; `null` where the store
    /// keeps no expiry (a lease tied to a session).
    pub time_left_ms: Option<u64>,
}

impl HolderReport {
    /// A holder as the runtime describes it.
    #[allow(clippy::too_many_arguments)] // One argument per column: a builder would only hide that.
    pub fn new(
        label: impl Into<String>,
        host: Option<String>,
        pid: Option<u32>,
        owner: impl Into<String>,
        fence: u64,
        acquired_at: SystemTime,
        time_left: Option<Duration>,
    ) -> HolderReport {
        let since_epoch = acquired_at
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        HolderReport {
            label: label.into(),
            host,
            pid,
            owner: owner.into(),
            fence,
            acquired_at: rfc3339(since_epoch),
            acquired_at_unix_ms: millis(since_epoch),
            time_left_ms: time_left.map(millis),
        }
    }

    /// The time left, as a duration.
    pub fn time_left(&self) -> Option<Duration> {
        self.time_left_ms.map(Duration::from_millis)
    }
}

/// `duration` in whole milliseconds, saturating.
pub fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// An instant `since_epoch` after the Unix epoch as RFC 3339 in UTC, to the millisecond:
/// `2026-12-01T21:45:26.123Z`. Written out here rather than with a date crate: UTC needs no time
/// zone data, only the civil calendar.
pub fn rfc3339(since_epoch: Duration) -> String {
    let (date, time) = utc(since_epoch);
    format!("{date}T{time}.{:03}Z", since_epoch.subsec_millis())
}

/// The same instant as people read it in a table: `2026-12-01 21:45:26`.
pub fn human_utc(since_epoch: Duration) -> String {
    let (date, time) = utc(since_epoch);
    format!("{date} {time}")
}

/// The UTC date (`YYYY-MM-DD`) and time of day (`HH:MM:SS`) of an instant after the epoch.
fn utc(since_epoch: Duration) -> (String, String) {
    let secs = since_epoch.as_secs();
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2);
    let of_day = secs % 86_400;
    // Days to a civil date (Howard Hinnant's `civil_from_days`), in the proleptic Gregorian
    // calendar, counted in 400-year eras from 0000-03-01.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        format!("{year:04}-{month:02}-{day:02}"),
        format!(
            "{:02}:{:02}:{:02}",
            of_day / 3_600,
            of_day / 60 % 60,
            of_day % 60
        ),
    )
}

/// A duration as people read it in a table: `850ms`, `12.3s`, `4m05s`, `2h03m`.
pub fn human_duration(duration: Duration) -> String {
    let ms = millis(duration);
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{:.1}s", duration.as_secs_f64()),
        60_000..=3_599_999 => format!("{}m{:02}s", ms / 60_000, ms / 1_000 % 60),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms / 60_000 % 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_read_as_utc() {
        assert_eq!(rfc3339(Duration::ZERO), "1970-01-01T00:00:00.000Z");
        // 2000-02-29 (a leap day of a century year that is a leap year) 12:34:56.789
        assert_eq!(
            rfc3339(Duration::from_millis(951_827_696_789)),
            "2000-02-29T12:34:56.789Z"
        );
        assert_eq!(
            human_utc(Duration::from_secs(1_796_161_526)),
            "2026-12-01 21:45:26"
        );
        assert_eq!(
            human_utc(Duration::from_secs(4_107_542_399)),
            "2100-02-28 23:59:59"
        );
        assert_eq!(
            human_utc(Duration::from_secs(4_107_542_400)),
            "2100-03-01 00:00:00"
        );
    }

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(human_duration(Duration::from_millis(850)), "850ms");
        assert_eq!(human_duration(Duration::from_millis(12_345)), "12.3s");
        assert_eq!(human_duration(Duration::from_secs(245)), "4m05s");
        assert_eq!(human_duration(Duration::from_secs(7_380)), "2h03m");
    }

    #[test]
    fn holders_serialise_with_their_documented_names() {
        let at = UNIX_EPOCH + Duration::from_millis(1_796_161_526_123);
        let holder = HolderReport::new(
            "billing::submit",
            Some("web-1".into()),
            Some(4242),
            "00ff",
            7,
            at,
            Some(Duration::from_millis(2_500)),
        );
        let report = KeyReport::new("acct:42", vec![holder], 1);
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "key": "acct:42",
                "held": true,
                "holders": [{
                    "label": "billing::submit",
                    "host": "web-1",
                    "pid": 4242,
                    "owner": "00ff",
                    "fence": 7,
                    "acquired_at": "2026-12-01T21:45:26.123Z",
                    "acquired_at_unix_ms": 1_796_161_526_123_u64,
                    "time_left_ms": 2500,
                }],
                "waiters": 1,
            })
        );
        let unknown = HolderReport::new("", None, None, "00ff", 8, at, None);
        let json = serde_json::to_value(&unknown).unwrap();
        assert_eq!(
            (&json["host"], &json["pid"], &json["time_left_ms"]),
            (
                &serde_json::Value::Null,
                &serde_json::Value::Null,
                &serde_json::Value::Null
            )
        );
        let free = serde_json::to_value(KeyReport::new("acct:43", Vec::new(), 0)).unwrap();
        assert_eq!(free["held"], false);
        assert_eq!(free["holders"], serde_json::json!([]));
    }
}
