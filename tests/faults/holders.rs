//! Scenarios of one holder that fails in its body — its connection stalled, deaf to the store,
//! its clock skewed, killed, or paused past its ttl — and the processes that come after it.

use std::path::Path;
use std::time::Duration;

use crate::scenario::{millis, ms, Scenario};
use crate::support::fault_proxy::Direction;
use crate::worker::{Backend, Body};

/// The lease of every worker's body (the attribute's `ttl` in `worker.rs` says the same).
const TTL: Duration = Duration::from_secs(2);

/// The renewal period: the longest a dead holder's lease can have been renewed before its death.
const RENEW_PERIOD: Duration = Duration::from_millis(667);

/// A holder's connection stalls (bytes held both ways, connection open) for twice the ttl: it
/// must be cancelled with `Lost` before a waiter in another process gets in. When the stall
/// ends, the held bytes arrive late — the holder's renewals and its release — while the waiter
/// still holds the key: a third process must not get in before the waiter leaves. `wrapper`
/// runs the holder under another clock (`faketime`). Stalled one way only ([`Direction::ToClient`]),
/// the store keeps hearing the holder — its renewals succeed there — but the holder hears
/// nothing back: it must give up all the same, and only then may the waiter enter.
///
/// Every process runs `body`: a locked body, or under [`Body::Lead`] a leader's term.
///
/// Returns how long the holder trusted its lease, by the data server's clock.
pub fn stalled_holder(
    backend: Backend,
    name: &'static str,
    direction: Direction,
    wrapper: &[&str],
    body: Body,
) -> Duration {
    let mut scenario = Scenario::new(name, backend, 1);
    let mut holder = scenario.spec("holder", Duration::from_secs(60));
    holder.sections = 1;
    holder.body = body;
    holder.work = Duration::from_secs(30);
    let holder = scenario.spawn(holder, wrapper);
    let entered = scenario.wait_for(holder, "enter", Duration::from_secs(60));
    let mut waiter = scenario.spec("waiter", Duration::from_secs(60));
    waiter.sections = 1;
    waiter.body = body;
    waiter.work = 2 * TTL;
    let waiter = scenario.spawn(waiter, &[]);
    std::thread::sleep(Duration::from_millis(300));
    scenario.proxy(holder).stall_for(direction, 2 * TTL);
    let lost = scenario.wait_for(holder, "lost", Duration::from_secs(30));
    let next = scenario.wait_for(waiter, "enter", Duration::from_secs(30));
    let mut third = scenario.spec("third", Duration::from_secs(60));
    third.sections = 1;
    third.body = body;
    scenario.spawn(third, &[]);
    let Some((_, verdict)) = scenario.finish(Duration::from_secs(60)) else {
        return Duration::MAX; // a void run: nothing was measured
    };
    let margin = next.micros - lost.micros;
    scenario.report(
        &verdict,
        &format!(
            "holder cancelled {} after it entered; waiter entered {} later",
            millis(lost.micros - entered.micros),
            millis(margin)
        ),
    );
    verdict.assert_clean(scenario.name);
    assert_eq!(
        verdict.finished, 2,
        "the waiter and the third finish\n{verdict}"
    );
    assert!(
        margin > 0,
        "the waiter entered {} before the stalled holder was cancelled",
        millis(-margin)
    );
    Duration::from_micros((lost.micros - entered.micros) as u64)
}

/// The stalled holder again, its clock two hours ahead and running 5 % slow (`faketime`): a
/// wall-clock offset means nothing to dlock, which only measures intervals; a slow clock eats
/// into the safety margin (ttl/10) but, at 5 %, leaves it positive.
pub fn skewed_clock_holder(backend: Backend) {
    assert!(
        Path::new(FAKETIME).exists(),
        "{FAKETIME} is missing: install Debian's `faketime` package (scripts/test.sh does)"
    );
    let trusted = stalled_holder(
        backend,
        "skewed-clock",
        Direction::Both,
        &[FAKETIME, "-m", "-f", "+2h x0.95"],
        Body::Count,
    );
    // On a true clock the holder gives up at 1.8 s; a clock 5 % slow makes it 1.89 s. Less
    // than 1.85 s means the skew never took effect and this was the plain stall again.
    assert!(
        trusted >= Duration::from_millis(1850),
        "the holder gave up after {trusted:?}: was its clock skewed at all?"
    );
}

const FAKETIME: &str = "/usr/bin/faketime";

/// A holder is killed (SIGKILL) in its body: the next process gets in once its lease has
/// expired — not before, and soon after (docs/correctness.md has the figures). Every process
/// runs `body` (a leader's term under [`Body::Lead`]).
pub fn killed_holder(backend: Backend, name: &'static str, body: Body) {
    let mut scenario = Scenario::new(name, backend, 1);
    let mut holder = scenario.spec("holder", Duration::from_secs(60));
    holder.sections = 1;
    holder.body = body;
    holder.work = Duration::from_secs(30);
    let holder = scenario.spawn(holder, &[]);
    scenario.wait_for(holder, "enter", Duration::from_secs(60));
    let mut waiter = scenario.spec("waiter", Duration::from_secs(60));
    waiter.sections = 1;
    waiter.body = body;
    let waiter = scenario.spawn(waiter, &[]);
    // Let the holder renew at least once, and the waiter queue up.
    std::thread::sleep(Duration::from_millis(1000));
    let killed_at = scenario.kill(holder);
    let next = scenario.wait_for(waiter, "enter", Duration::from_secs(30));
    let Some((_, verdict)) = scenario.finish(Duration::from_secs(60)) else {
        return;
    };
    let recovery = Duration::from_micros((next.micros - killed_at).max(0) as u64);
    scenario.report(
        &verdict,
        &format!("next holder in {} after the kill", ms(recovery)),
    );
    verdict.assert_clean(scenario.name);
    // The lease was renewed at most a renewal period before the kill, so it lasts at least
    // ttl − period past it; the clock of the data server reads in µs, allow it 50 ms.
    let earliest = TTL - RENEW_PERIOD - Duration::from_millis(50);
    assert!(
        recovery >= earliest,
        "the waiter got in {recovery:?} after the kill: before the lease could have expired"
    );
    assert!(
        recovery <= TTL + Duration::from_secs(3),
        "the waiter took {recovery:?} to get in after the lease expired"
    );
}

/// A holder is frozen (SIGSTOP, as in a long GC pause) past its ttl; another process takes the
/// key and writes with its fence; the first resumes, still in its body (`on_lost =
/// "continue"`), and writes with its stale fence: the data store rejects it.
pub fn paused_holder_is_fenced_off(backend: Backend) {
    let mut scenario = Scenario::new("fenced-pause", backend, 1);
    let mut holder = scenario.spec("holder", Duration::from_secs(60));
    holder.sections = 1;
    holder.body = Body::WriteFenced;
    // Time enough to be stopped before it writes, even on a loaded machine; stopped, it does
    // not count down (the sleep ends on the monotonic clock, which runs on).
    holder.work = Duration::from_secs(3);
    let holder = scenario.spawn(holder, &[]);
    let entered = scenario.wait_for(holder, "enter", Duration::from_secs(60));
    scenario.signal(holder, "STOP");
    let mut next = scenario.spec("next", Duration::from_secs(60));
    next.sections = 1;
    next.body = Body::WriteFenced;
    let next = scenario.spawn(next, &[]);
    let accepted = scenario.wait_for(next, "accepted", Duration::from_secs(30));
    scenario.signal(holder, "CONT");
    let rejected = scenario.wait_for(holder, "rejected", Duration::from_secs(30));
    scenario.wait_for(holder, "unheld", Duration::from_secs(5));
    let Some((_, verdict)) = scenario.finish(Duration::from_secs(60)) else {
        return;
    };
    assert!(entered.fence < accepted.fence && rejected.fence == entered.fence);
    let stored: (u64, String) = redis::cmd("HMGET")
        .arg(format!("fenced:{}", scenario.keys[0]))
        .arg("fence")
        .arg("value")
        .query(&mut scenario.data)
        .unwrap();
    assert_eq!(stored, (accepted.fence, "next".to_owned()));
    // The paused holder's body ran on after its lease was gone — the overlap fencing exists
    // for — and was told so (`is_held() == false`); nothing else may be wrong.
    assert_eq!(verdict.overlaps.len(), 1, "{verdict}");
    assert!(verdict.fence_inversions.is_empty(), "{verdict}");
    scenario.report(
        &verdict,
        &format!(
            "stale write (fence {}) rejected after fence {}",
            rejected.fence, accepted.fence
        ),
    );
}
