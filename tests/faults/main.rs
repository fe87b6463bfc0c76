//! Correct under failure: scenarios that break the network, the server or a client while several
//! OS processes run critical sections on shared keys, and a checker that judges what they did.
//!
//! Each scenario ([`scenario`]) starts its worker processes (this test binary again, running the
//! ignored test [`worker::fault_worker`]), each with a `Locker` of its own whose connections pass
//! through a [`FaultProxy`](support::fault_proxy::FaultProxy) of its own. A worker's body reads
//! a counter, pauses, writes it back plus one (a lost update if two bodies overlap), and logs
//! when it entered and left by the clock of a private Redis all processes share (the *data
//! server*, never faulted). The checker ([`support::history`]) then asserts: no two bodies of
//! one key overlapped, fences increased in the order of entry, no increment was lost. Each
//! scenario prints a row of the table in docs/correctness.md (`./scripts/write-docs.sh` collects
//! them).
//!
//! The scenarios: [`load`] (many bodies through random cuts, a restart, aborted tasks; and a
//! semaphore's bodies through random cuts, judged by [`history::check_permits`]: never more
//! inside than permits),
//! [`holders`] (one holder stalled, deaf, skewed, killed or paused, and who gets in after it)
//! and [`ensemble`] (a ZooKeeper ensemble losing its leader or a follower, an etcd cluster its
//! leader). Below them, the
//! tests that run each on each backend.

// The support every test crate shares, one directory up.
#[path = "../support/mod.rs"]
mod support;

mod ensemble;
mod holders;
mod load;
mod scenario;
mod worker;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ensemble::{follower_partitioned, leader_killed};
use holders::{killed_holder, paused_holder_is_fenced_off, skewed_clock_holder, stalled_holder};
use load::{memory_with_aborted_tasks, permit_cuts, random_cuts, restart_under_load};
use scenario::Scenario;
use support::fault_proxy::{Direction, FaultProxy};
use support::history::{self, Section, Write};
use worker::{Backend, Body};

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
    let Some((_, verdict)) = scenario.finish(Duration::from_secs(60)) else {
        return;
    };
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

/// How long the random-cut runs last: `DLOCK_FAULT_SECONDS`, else 10 s, a few hundred cuts per
/// store, so that the whole suite stays within a quarter of an hour on two cores.
/// `scripts/write-docs.sh` runs them 30 s for the results table.
fn cut_run() -> Duration {
    let seconds = std::env::var("DLOCK_FAULT_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
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
                fn random_connection_cuts_never_let_in_more_than_the_permits() {
                    permit_cuts($variant, cut_run());
                }

                #[test]
                fn a_server_restart_under_load_loses_nothing() {
                    restart_under_load($variant);
                }

                #[test]
                fn a_stalled_holder_is_cancelled_before_anyone_enters() {
                    stalled_holder($variant, "stalled-holder", Direction::Both, &[], Body::Count);
                }

                #[test]
                fn a_holder_that_cannot_hear_the_store_gives_up_before_anyone_enters() {
                    stalled_holder($variant, "deaf-holder", Direction::ToClient, &[], Body::Count);
                }

                #[test]
                fn a_stalled_leader_stops_before_another_is_elected() {
                    stalled_holder($variant, "stalled-leader", Direction::Both, &[], Body::Lead);
                }

                #[test]
                fn a_holder_whose_clock_is_off_and_slow_still_leaves_first() {
                    skewed_clock_holder($variant);
                }

                #[test]
                fn a_killed_holder_is_replaced_after_its_ttl_not_before() {
                    killed_holder($variant, "killed-holder", Body::Count);
                }

                #[test]
                fn a_killed_leader_is_replaced_after_its_ttl_not_before() {
                    killed_holder($variant, "killed-leader", Body::Lead);
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
    with_postgres: Backend::Postgres;
    with_zookeeper: Backend::Zookeeper;
    with_etcd: Backend::Etcd;
}

/// A three-server ensemble, its faults the servers' own: a leader killed, a follower cut off.
mod with_zookeeper_ensemble {
    use super::*;

    #[test]
    fn the_leader_killed_under_load_loses_nothing() {
        leader_killed(Backend::ZookeeperEnsemble);
    }

    #[test]
    fn a_follower_cut_off_under_load_loses_nothing() {
        follower_partitioned();
    }
}

/// A three-member etcd cluster, its leader killed under load.
mod with_etcd_cluster {
    use super::*;

    #[test]
    fn the_leader_killed_under_load_loses_nothing() {
        leader_killed(Backend::EtcdCluster);
    }
}

/// The proxy itself, against an echo server: latency delays each direction, a one-way stall
/// holds only that way's bytes, each chunk is counted, a cut closes the connection.
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

    // Three round trips, each a chunk of four bytes one way and its echo the other.
    assert_eq!(proxy.chunks(Direction::ToServer), 3);
    assert_eq!(proxy.chunks(Direction::Both), 6);

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

/// A run during which the host's wall clock stepped is void, either way; a steady clock's is
/// judged.
#[test]
fn a_step_of_the_wall_clock_voids_the_run() {
    use std::time::SystemTime;

    let (now, wall) = (Instant::now(), SystemTime::now());
    assert_eq!(scenario::wall_clock_step(now, wall), None);
    let ahead = wall - Duration::from_secs(28);
    assert_eq!(
        scenario::wall_clock_step(now, ahead).as_deref(),
        Some("+28.0 s")
    );
    let behind = wall + Duration::from_secs(5);
    assert_eq!(
        scenario::wall_clock_step(now, behind).as_deref(),
        Some("-5.0 s")
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

    // A long body overlapping one two places after it; a fence repeated on entry, and going
    // back on write; a write that read what the one before it had read: a lost update.
    let bad = [
        run("k", 1, "a", 0, Some(50)),
        run("k", 2, "b", 10, Some(20)),
        run("k", 2, "c", 30, Some(40)),
    ];
    let writes = journal(&[(1, 0, 1), (2, 1, 2), (1, 1, 2)]);
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

/// The semaphore's checker: two inside at once is within two permits, a third is not, however
/// the bodies interleave; a body that leaves as another enters is not inside with it; a killed
/// worker's body lasts until the kill, another's unfinished body for ever.
#[test]
fn the_permits_checker_counts_bodies_inside_at_once() {
    fn run(worker: &str, body: u64, start: i64, end: Option<i64>) -> Section {
        Section {
            key: "k".into(),
            fence: body,
            worker: worker.into(),
            start,
            end,
            finished: end.is_some(),
        }
    }
    let no_kills: BTreeMap<String, i64> = BTreeMap::new();
    // Two at a time, in a chain: each enters as the oldest leaves.
    let chain = [
        run("a", 1, 0, Some(20)),
        run("b", 1, 10, Some(30)),
        run("c", 1, 20, Some(40)),
        run("a", 2, 30, Some(50)),
    ];
    let found = history::check_permits(&chain, &no_kills, 2);
    assert!(found.verdict.overlaps.is_empty(), "{}", found.verdict);
    assert_eq!((found.most_inside, found.filled), (2, 3));
    // The same bodies under one permit: every second one is one too many.
    assert_eq!(
        history::check_permits(&chain, &no_kills, 1)
            .verdict
            .overlaps
            .len(),
        3
    );

    // A long body under two short ones: three inside while the second short one runs.
    let three = [
        run("a", 1, 0, Some(100)),
        run("b", 1, 10, Some(30)),
        run("c", 1, 20, Some(40)),
        run("b", 2, 50, Some(60)),
    ];
    let found = history::check_permits(&three, &no_kills, 2);
    assert_eq!(found.verdict.overlaps.len(), 1, "{}", found.verdict);
    assert_eq!(found.most_inside, 3);

    // Unfinished bodies: a killed worker's ends at the kill, another's never.
    let killed = BTreeMap::from([("a".to_owned(), 25)]);
    let sections = [
        run("a", 1, 0, None),
        run("b", 1, 10, Some(100)),
        run("c", 1, 30, Some(40)),
    ];
    assert!(history::check_permits(&sections, &killed, 2)
        .verdict
        .overlaps
        .is_empty());
    assert_eq!(
        history::check_permits(&sections, &no_kills, 2)
            .verdict
            .overlaps
            .len(),
        1
    );
}
