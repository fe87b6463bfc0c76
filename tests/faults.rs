//! Correct under failure: scenarios that break the network, the server or a client while several
//! OS processes run critical sections on shared keys, and a checker that judges what they did.
//!
//! Each scenario ([`scenario`]) starts its worker processes (this test binary again, running the
//! ignored test [`worker::fault_worker`]), each with a `Locker` of its own whose connections pass
//! through a [`FaultProxy`](support::fault_proxy::FaultProxy) of its own. A worker's body reads a counter, pauses, writes it back plus one
//! (a lost update if two bodies overlap), and logs when it entered and left by the clock of a
//! private Redis all processes share (the *data server*, never faulted). The checker
//! ([`support::history`]) then asserts: no two bodies of one key overlapped, fences increased in
//! the order of entry, no increment was lost. Each scenario prints a row of the table in
//! docs/correctness.md (`./scripts/write-docs.sh` collects them).

mod support;

// A test crate's root resolves modules beside it, in tests/; these two are its own.
#[path = "faults/scenario.rs"]
mod scenario;
#[path = "faults/worker.rs"]
mod worker;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use dlock::Locker;
use scenario::{longest_pause, millis, ms, LockServer, Scenario};
use support::fault_proxy::{Direction, FaultProxy};
use support::history::{self, Log, Section, Write};
use worker::{run_bodies, Backend, Body, Context};

/// The lease of every worker's body (the attribute's `ttl` in `worker.rs` says the same).
const TTL: Duration = Duration::from_secs(2);

/// The renewal period: the longest a dead holder's lease can have been renewed before its death.
const RENEW_PERIOD: Duration = Duration::from_millis(667);

// ---------------------------------------------------------------------------------------------
// The scenarios, each a function of the backend

/// Three processes of two tasks each run bodies on two keys for `run_for` while every
/// connection of theirs is cut, at random, once in a hundred chunks forwarded.
fn random_cuts(backend: Backend, run_for: Duration) {
    let mut scenario = Scenario::new("random-cuts", backend, 2);
    for name in ["a", "b", "c"] {
        let mut spec = scenario.spec(name, run_for);
        spec.tasks = 2;
        let worker = scenario.spawn(spec, &[]);
        scenario.proxy(worker).cut_randomly(0.01);
    }
    let (sections, verdict) = scenario.finish(run_for + Duration::from_secs(60));
    let cuts: u64 = (0..3).map(|w| scenario.proxy(w).cuts()).sum();
    scenario.report(
        &verdict,
        &format!(
            "{cuts} connections cut; longest pause {}",
            ms(longest_pause(&sections))
        ),
    );
    verdict.assert_clean(scenario.name);
    assert!(
        cuts > 0,
        "no connection was cut: the scenario tested nothing"
    );
}

/// Three processes run bodies on two keys while the lock server restarts (down for a second);
/// for MySQL, whose server the tests share, every connection is cut and none accepted for that
/// second instead.
fn restart_under_load(backend: Backend) {
    let mut scenario = Scenario::new("server-restart", backend, 2);
    // Long enough for a JVM to come back on a loaded machine and bodies to run after it.
    let run_for = Duration::from_secs(16);
    for name in ["a", "b", "c"] {
        let mut spec = scenario.spec(name, run_for);
        spec.tasks = 2;
        scenario.spawn(spec, &[]);
    }
    std::thread::sleep(Duration::from_secs(4));
    let before = scenario.events().len();
    assert!(
        before > 0,
        "nothing ran before the restart\n{}",
        scenario.outputs()
    );
    let down_at = scenario.now();
    match &mut scenario.lock_server {
        LockServer::Redis(server) => {
            server.stop();
            std::thread::sleep(Duration::from_secs(1));
            server.restart();
        }
        LockServer::Zookeeper(server) => {
            server.stop();
            std::thread::sleep(Duration::from_secs(1));
            server.start();
        }
        LockServer::None => unreachable!("processes cannot share the memory store"),
        LockServer::ZookeeperEnsemble(_) => unreachable!("an ensemble has scenarios of its own"),
        LockServer::Mysql { .. } => {
            for worker in 0..scenario.workers.len() {
                scenario.proxy(worker).refuse_connections(true);
                scenario.proxy(worker).cut_all();
            }
            std::thread::sleep(Duration::from_secs(1));
            for worker in 0..scenario.workers.len() {
                scenario.proxy(worker).refuse_connections(false);
            }
        }
    }
    let back_at = scenario.now();
    let (sections, verdict) = scenario.finish(run_for + Duration::from_secs(60));
    let first_after = sections
        .iter()
        .map(|s| s.start)
        .filter(|&start| start > back_at)
        .min();
    let Some(first_after) = first_after else {
        panic!("no body ran after the restart\n{}", scenario.outputs());
    };
    let outage = if backend == Backend::Mysql {
        "connections cut and refused"
    } else {
        "server down"
    };
    scenario.report(
        &verdict,
        &format!(
            "{outage} {}; first body {} after it was back",
            millis(back_at - down_at),
            millis(first_after - back_at)
        ),
    );
    verdict.assert_clean(scenario.name);
}

/// Three processes of two tasks each run bodies on two keys against an ensemble of three
/// servers, each process's URL naming all three; after a few seconds the leader is killed
/// (SIGKILL), the other two elect a new one, and later the killed server comes back and
/// rejoins. Leases that cannot be confirmed through a quorum in time are cancelled, never
/// shared; bodies go on once the new leader serves.
fn leader_killed() {
    let mut scenario = Scenario::new("leader-killed", Backend::ZookeeperEnsemble, 2);
    let run_for = Duration::from_secs(16);
    for name in ["a", "b", "c"] {
        let mut spec = scenario.spec(name, run_for);
        spec.tasks = 2;
        scenario.spawn(spec, &[]);
    }
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        !scenario.sections().is_empty(),
        "nothing ran before the kill\n{}",
        scenario.outputs()
    );
    let leader = scenario
        .ensemble()
        .leader()
        .expect("the ensemble has a leader");
    let killed_at = scenario.now();
    scenario.ensemble().kill(leader);
    let Some(next_leader) = scenario.ensemble().wait_for_leader(Duration::from_secs(30)) else {
        panic!(
            "no new leader within 30 s of the kill\n{}",
            scenario.outputs()
        );
    };
    let elected_at = scenario.now();
    // The run goes on without the killed server for a while, then with it again.
    std::thread::sleep(Duration::from_secs(4));
    scenario.ensemble().restart(leader);
    let back_at = scenario.now();
    let (sections, verdict) = scenario.finish(run_for + Duration::from_secs(60));
    let Some(first_after) = sections
        .iter()
        .map(|s| s.start)
        .filter(|&start| start > killed_at)
        .min()
    else {
        panic!("no body ran after the kill\n{}", scenario.outputs());
    };
    let after_rejoin = sections.iter().filter(|s| s.start > back_at).count();
    let lost = scenario
        .events()
        .iter()
        .filter(|e| e.kind == "lost")
        .count();
    scenario.report(
        &verdict,
        &format!(
            "leader killed; server {} led {} later; first body {} after the kill; {lost} \
             leases cancelled; longest pause {}; killed server back {} after the kill, \
             {after_rejoin} bodies after",
            next_leader + 1,
            millis(elected_at - killed_at),
            millis(first_after - killed_at),
            ms(longest_pause(&sections)),
            millis(back_at - killed_at),
        ),
    );
    verdict.assert_clean(scenario.name);
}

/// The same load as [`leader_killed`], but a follower is cut off from the other two servers
/// (every connection between them held open, its bytes held) for longer than it keeps following
/// a silent leader, while its clients still reach it: whatever it answers from its own copy
/// confirms no lease, the leader expires the sessions it serves, and their keys go to the
/// processes on the quorum's side. One process reaches that follower only; the other two reach
/// all three servers. Then the partition heals.
fn follower_partitioned() {
    let mut scenario = Scenario::new("follower-partitioned", Backend::ZookeeperEnsemble, 2);
    let run_for = Duration::from_secs(20);
    for name in ["a", "b", "c"] {
        let mut spec = scenario.spec(name, run_for);
        spec.tasks = 2;
        if name == "a" {
            // Pinned to the follower that will be cut off (a client picks among the servers
            // its URL names at random, so a process may be there or not).
            spec.lock_url = scenario.ensemble().url_of(&[0]);
        }
        scenario.spawn(spec, &[]);
    }
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        !scenario.sections().is_empty(),
        "nothing ran before the partition\n{}",
        scenario.outputs()
    );
    assert_eq!(
        scenario.ensemble().server(0).mode(),
        "follower",
        "the first server leads: the partition would cut off a leader"
    );
    let cut_at = scenario.now();
    scenario.ensemble().cut_off_first();
    // Past `syncLimit` (10 s): the follower gives up its leader and drops its clients.
    std::thread::sleep(Duration::from_secs(12));
    scenario.ensemble().reconnect_first();
    let healed_at = scenario.now();
    let (sections, verdict) = scenario.finish(run_for + Duration::from_secs(60));
    let meanwhile: Vec<&Section> = sections
        .iter()
        .filter(|s| s.start > cut_at && s.start < healed_at)
        .collect();
    let during = meanwhile.len();
    // A process whose session was on the cut-off follower enters nothing until it has moved
    // to another server: its own longest pause shows how long that took.
    let (slowest, its_pause) = scenario
        .workers
        .iter()
        .map(|w| {
            let own: Vec<Section> = sections
                .iter()
                .filter(|s| s.worker == w.spec.name)
                .cloned()
                .collect();
            (w.spec.name.clone(), longest_pause(&own))
        })
        .max_by_key(|(_, pause)| *pause)
        .expect("three processes");
    let lost = scenario
        .events()
        .iter()
        .filter(|e| e.kind == "lost")
        .count();
    scenario.report(
        &verdict,
        &format!(
            "a follower cut off for {}; {during} bodies entered meanwhile; {lost} leases \
             cancelled; longest pause {}, of one process ({slowest}) {}",
            millis(healed_at - cut_at),
            ms(longest_pause(&sections)),
            ms(its_pause)
        ),
    );
    verdict.assert_clean(scenario.name);
    assert!(
        during > 0,
        "no body ran while the follower was cut off: the quorum's side stood still"
    );
}

/// A holder's connection stalls (bytes held both ways, connection open) for twice the ttl: it
/// must be cancelled with `Lost` before a waiter in another process gets in. When the stall
/// ends, the held bytes arrive late — the holder's renewals and its release — while the waiter
/// still holds the key: a third process must not get in before the waiter leaves. `wrapper`
/// runs the holder under another clock (`faketime`). Stalled one way only ([`Direction::ToClient`]),
/// the store keeps hearing the holder — its renewals succeed there — but the holder hears
/// nothing back: it must give up all the same, and only then may the waiter enter.
///
/// Returns how long the holder trusted its lease, by the data server's clock.
fn stalled_holder(
    backend: Backend,
    name: &'static str,
    direction: Direction,
    wrapper: &[&str],
) -> Duration {
    let mut scenario = Scenario::new(name, backend, 1);
    let mut holder = scenario.spec("holder", Duration::from_secs(60));
    holder.sections = 1;
    holder.work = Duration::from_secs(30);
    let holder = scenario.spawn(holder, wrapper);
    let entered = scenario.wait_for(holder, "enter", Duration::from_secs(60));
    let mut waiter = scenario.spec("waiter", Duration::from_secs(60));
    waiter.sections = 1;
    waiter.work = 2 * TTL;
    let waiter = scenario.spawn(waiter, &[]);
    std::thread::sleep(Duration::from_millis(300));
    scenario.proxy(holder).stall_for(direction, 2 * TTL);
    let lost = scenario.wait_for(holder, "lost", Duration::from_secs(30));
    let next = scenario.wait_for(waiter, "enter", Duration::from_secs(30));
    let mut third = scenario.spec("third", Duration::from_secs(60));
    third.sections = 1;
    scenario.spawn(third, &[]);
    let (_, verdict) = scenario.finish(Duration::from_secs(60));
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
fn skewed_clock_holder(backend: Backend) {
    assert!(
        Path::new(FAKETIME).exists(),
        "{FAKETIME} is missing: install Debian's `faketime` package (scripts/test.sh does)"
    );
    let trusted = stalled_holder(
        backend,
        "skewed-clock",
        Direction::Both,
        &[FAKETIME, "-m", "-f", "+2h x0.95"],
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
/// expired — not before, and soon after (docs/correctness.md has the figures).
fn killed_holder(backend: Backend) {
    let mut scenario = Scenario::new("killed-holder", backend, 1);
    let mut holder = scenario.spec("holder", Duration::from_secs(60));
    holder.sections = 1;
    holder.work = Duration::from_secs(30);
    let holder = scenario.spawn(holder, &[]);
    scenario.wait_for(holder, "enter", Duration::from_secs(60));
    let mut waiter = scenario.spec("waiter", Duration::from_secs(60));
    waiter.sections = 1;
    let waiter = scenario.spawn(waiter, &[]);
    // Let the holder renew at least once, and the waiter queue up.
    std::thread::sleep(Duration::from_millis(1000));
    let killed_at = scenario.kill(holder);
    let next = scenario.wait_for(waiter, "enter", Duration::from_secs(30));
    let (_, verdict) = scenario.finish(Duration::from_secs(60));
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
fn paused_holder_is_fenced_off(backend: Backend) {
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
    let (_, verdict) = scenario.finish(Duration::from_secs(60));
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

/// The in-process store: tasks sharing one memory `Locker` run bodies on two keys while, every
/// 20 ms, one of them is aborted (cancelled mid-body, as a dropped request would be) and
/// replaced by a new task.
async fn memory_with_aborted_tasks(run_for: Duration) {
    let mut scenario = Scenario::new("aborted-tasks", Backend::Memory, 2);
    let locker = Locker::memory();
    let data = redis::Client::open(scenario.data_server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let log = scenario.dir.join("tasks.log");
    let deadline = Instant::now() + run_for;
    let template = scenario.spec("t", run_for);
    let start_task = |index: usize| {
        let name = format!("t{index}");
        let context = Context {
            data: data.clone(),
            log: Log::create(&log, &name),
            work: Duration::from_millis(2),
            worker: name.clone(),
        };
        let spec = template.clone();
        let locker = locker.clone();
        let task = tokio::spawn(async move {
            run_bodies(&locker, &context, &spec, index, deadline).await;
        });
        (name, task)
    };
    let mut tasks: Vec<_> = (0..6).map(start_task).collect();
    let mut started = tasks.len();
    let mut aborted = 0;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let victim = started % tasks.len();
        // The body ends when its task is dropped, between this reading and the end of the
        // abort; its lease is released at that drop and the next body may enter at once, before
        // a reading taken after the abort reaches the data server. So the end is read first: the
        // body can act after it only by finishing a poll already under way, whose commands
        // reach the data server before the release lets anyone in.
        let at = scenario.now();
        let (name, task) = std::mem::replace(&mut tasks[victim], start_task(started));
        started += 1;
        task.abort();
        let _ = task.await;
        aborted += 1;
        scenario.killed.insert(name, at);
    }
    for (_, task) in tasks {
        task.await.unwrap();
    }
    let events = history::read(&[&log]);
    let sections = history::sections(&events);
    let journals = scenario.journals();
    let verdict = history::check(&sections, &scenario.killed, &journals);
    scenario.report(
        &verdict,
        &format!(
            "{aborted} tasks aborted mid-body; longest pause {}",
            ms(longest_pause(&sections))
        ),
    );
    verdict.assert_clean(scenario.name);
    assert!(
        sections.iter().any(|s| !s.finished),
        "no body was aborted mid-way: the scenario tested nothing"
    );
}

// ---------------------------------------------------------------------------------------------
// The tests

/// The control: the same workers without the lock. The checker must see overlaps and lost
/// updates, or the scenarios' clean verdicts would prove nothing.
#[test]
fn without_the_lock_the_checker_sees_overlaps_and_lost_updates() {
    let mut scenario = Scenario::new("no-lock", Backend::Redis, 1);
    for name in ["a", "b", "c"] {
        let mut spec = scenario.spec(name, Duration::from_secs(2));
        spec.body = Body::CountUnlocked;
        scenario.spawn(spec, &[]);
    }
    let (_, verdict) = scenario.finish(Duration::from_secs(60));
    scenario.report(&verdict, "(no lock: the control)");
    assert!(!verdict.overlaps.is_empty(), "{verdict}");
    assert!(verdict.lost_updates > 0, "{verdict}");
}

mod with_memory {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tasks_aborted_mid_body_lose_nothing() {
        memory_with_aborted_tasks(Duration::from_secs(5)).await;
    }
}

/// How long the random-cut runs last: `DLOCK_FAULT_SECONDS`, else 30 s.
fn cut_run() -> Duration {
    let seconds = std::env::var("DLOCK_FAULT_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    Duration::from_secs(seconds)
}

macro_rules! scenarios {
    ($($backend:ident: $variant:expr;)*) => {
        $(
            mod $backend {
                use super::*;

                #[test]
                fn random_connection_cuts_lose_nothing() {
                    random_cuts($variant, cut_run());
                }

                #[test]
                fn a_server_restart_under_load_loses_nothing() {
                    restart_under_load($variant);
                }

                #[test]
                fn a_stalled_holder_is_cancelled_before_anyone_enters() {
                    stalled_holder($variant, "stalled-holder", Direction::Both, &[]);
                }

                #[test]
                fn a_holder_that_cannot_hear_the_store_gives_up_before_anyone_enters() {
                    stalled_holder($variant, "deaf-holder", Direction::ToClient, &[]);
                }

                #[test]
                fn a_holder_whose_clock_is_off_and_slow_still_leaves_first() {
                    skewed_clock_holder($variant);
                }

                #[test]
                fn a_killed_holder_is_replaced_after_its_ttl_not_before() {
                    killed_holder($variant);
                }

                #[test]
                fn a_paused_holder_s_stale_write_is_rejected_by_its_fence() {
                    paused_holder_is_fenced_off($variant);
                }
            }
        )*
    };
}

scenarios! {
    with_redis: Backend::Redis;
    with_mysql: Backend::Mysql;
    with_zookeeper: Backend::Zookeeper;
}

/// A three-server ensemble, its faults the servers' own: a leader killed, a follower cut off.
mod with_zookeeper_ensemble {
    use super::*;

    #[test]
    fn the_leader_killed_under_load_loses_nothing() {
        leader_killed();
    }

    #[test]
    fn a_follower_cut_off_under_load_loses_nothing() {
        follower_partitioned();
    }
}

/// The proxy itself, against an echo server: latency delays each direction, a one-way stall
/// holds only that way's bytes, a cut closes the connection.
#[test]
fn the_fault_proxy_delays_stalls_and_cuts_per_direction() {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    let echo = TcpListener::bind("127.0.0.1:0").unwrap();
    let target = echo.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in echo.incoming() {
            let mut stream = stream.unwrap();
            std::thread::spawn(move || {
                let mut buffer = [0; 64];
                while let Ok(read @ 1..) = stream.read(&mut buffer) {
                    let _ = stream.write_all(&buffer[..read]);
                }
            });
        }
    });
    let proxy = FaultProxy::start(&target);
    let mut client = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let round_trip = |client: &mut TcpStream| {
        let started = Instant::now();
        client.write_all(b"ping").unwrap();
        let mut reply = [0; 4];
        client.read_exact(&mut reply).map(|()| started.elapsed())
    };
    round_trip(&mut client).expect("the proxy forwards");

    proxy.set_latency(Direction::ToServer, Duration::from_millis(150));
    proxy.set_latency(Direction::ToClient, Duration::from_millis(100));
    let slow = round_trip(&mut client).unwrap();
    assert!(
        slow >= Duration::from_millis(250),
        "latency not added: {slow:?}"
    );
    proxy.set_latency(Direction::Both, Duration::ZERO);

    // Stalled towards the client: the server hears the ping, its echo is held until resumed.
    proxy.stall_for(Direction::ToClient, Duration::from_millis(300));
    let held = round_trip(&mut client).unwrap();
    assert!(
        held >= Duration::from_millis(300),
        "the stall held nothing: {held:?}"
    );

    proxy.cut_all();
    assert_eq!(proxy.cuts(), 1);
    let mut reply = [0; 4];
    let after_cut = client
        .write_all(b"ping")
        .and_then(|()| client.read(&mut reply));
    assert!(
        matches!(after_cut, Ok(0) | Err(_)),
        "the cut connection still answered: {after_cut:?}"
    );
}

#[test]
fn the_checker_finds_what_it_looks_for() {
    fn run(key: &str, fence: u64, worker: &str, start: i64, end: Option<i64>) -> Section {
        Section {
            key: key.into(),
            fence,
            worker: worker.into(),
            start,
            end,
            finished: end.is_some(),
        }
    }
    fn journal(writes: &[(u64, u64, u64)]) -> BTreeMap<String, Vec<Write>> {
        let writes = writes.iter().map(|&(fence, read, written)| Write {
            fence,
            read,
            written,
        });
        BTreeMap::from([("k".to_owned(), writes.collect())])
    }
    let none = BTreeMap::new();
    let no_kills: BTreeMap<String, i64> = BTreeMap::new();
    let clean = [
        run("k", 1, "a", 0, Some(10)),
        run("k", 2, "b", 10, Some(20)),
        run("k", 5, "a", 30, Some(40)),
    ];
    let writes = journal(&[(1, 0, 1), (2, 1, 2), (5, 2, 3)]);
    let verdict = history::check(&clean, &no_kills, &writes);
    assert!(verdict.overlaps.is_empty() && verdict.fence_inversions.is_empty());
    assert_eq!(verdict.lost_updates, 0);

    // A long body overlapping one two places after it; a fence going back, on entry and on
    // write; a write that read what the one before it had read: a lost update.
    let bad = [
        run("k", 1, "a", 0, Some(50)),
        run("k", 2, "b", 10, Some(20)),
        run("k", 2, "c", 30, Some(40)),
    ];
    let writes = journal(&[(1, 0, 1), (2, 1, 2), (2, 1, 2)]);
    let verdict = history::check(&bad, &no_kills, &writes);
    assert_eq!(verdict.overlaps.len(), 2, "{verdict}");
    assert_eq!(verdict.fence_inversions.len(), 2, "{verdict}");
    assert_eq!(verdict.lost_updates, 1);

    // A killed worker's body lasts until the kill.
    let killed = BTreeMap::from([("a".to_owned(), 25)]);
    let sections = [run("k", 1, "a", 0, None), run("k", 2, "b", 20, Some(30))];
    assert_eq!(history::check(&sections, &killed, &none).overlaps.len(), 1);
    let sections = [run("k", 1, "a", 0, None), run("k", 2, "b", 26, Some(30))];
    assert!(history::check(&sections, &killed, &none)
        .overlaps
        .is_empty());
}
