//! Instants stored in atomics: nanoseconds since a process-wide origin; the margins a lease's
//! validity is reckoned with; and sleeping until such an instant.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

static ORIGIN: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Sets the origin now, if it is not set yet: every `Locker` does as it is built, so that every
/// instant of its acquisitions comes after the origin. An instant before it would be stored as
/// the origin itself, later than it was: a lease's last confirmed send time, and the expiry a
/// store reckons from it, would be read late by up to the first acquisition's round trip.
pub(crate) fn start() {
    LazyLock::force(&ORIGIN);
}

/// `instant` as nanoseconds since the origin (saturating at both ends).
pub(crate) fn to_nanos(instant: Instant) -> u64 {
    u64::try_from(instant.saturating_duration_since(*ORIGIN).as_nanos()).unwrap_or(u64::MAX)
}

/// The instant `nanos` after the origin.
pub(crate) fn from_nanos(nanos: u64) -> Instant {
    *ORIGIN + Duration::from_nanos(nanos)
}

/// The safety margin taken off a lease's ttl on the client's side: the client gives up a lease
/// this long before the server would let it expire, which absorbs clock drift between the two
/// and the time a reply spends in flight.
pub(crate) fn safety_margin(ttl: Duration) -> Duration {
    ttl / 10
}

/// The renewal period of a lease: three renewals fit in one ttl, so two can fail in a row.
pub(crate) fn renew_interval(ttl: Duration) -> Duration {
    ttl / 3
}

/// Sleeps until `until`, an instant of the real clock, as a lease's validity and the in-process
/// store's expiries are. The caller's own timer first, which costs nothing to set up; it fires
/// early only where its runtime's clock is paused or moved by hand (a test's `start_paused`
/// skips to the next timer whenever the runtime is idle), and would then fire at once on every
/// turn of a caller's loop that waits for `until`: dlock's background runtime times the rest.
pub(crate) async fn sleep_until(until: Instant) {
    tokio::time::sleep_until(until.into()).await;
    if Instant::now() < until {
        crate::background::sleep_until(until).await;
    }
}
