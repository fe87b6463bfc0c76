//! Scenarios of a three-server ZooKeeper ensemble (and a three-member etcd cluster) whose faults
//! are the servers' own: the leader killed, a follower cut off from the other two.

use std::time::Duration;

use crate::scenario::{longest_pause, millis, ms, Scenario};
use crate::support::history::Section;
use crate::worker::Backend;

/// Three processes of two tasks each run bodies on two keys against an ensemble of three
/// servers, each process's URL naming all three; after a few seconds the leader is killed
/// (SIGKILL), the other two elect a new one, and later the killed server comes back and
/// rejoins. Leases that cannot be confirmed through a quorum in time are cancelled, never
/// shared; bodies go on once the new leader serves.
pub fn leader_killed(backend: Backend) {
    let mut scenario = Scenario::new("leader-killed", backend, 2);
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
    let leader = Servers::leader(&mut scenario).expect("the ensemble has a leader");
    let killed_at = scenario.now();
    Servers::kill(&mut scenario, leader);
    let Some(next_leader) = Servers::wait_for_leader(&mut scenario, Duration::from_secs(30)) else {
        panic!(
            "no new leader within 30 s of the kill\n{}",
            scenario.outputs()
        );
    };
    let elected_at = scenario.now();
    // The run goes on without the killed server for a while, then with it again.
    std::thread::sleep(Duration::from_secs(4));
    Servers::restart(&mut scenario, leader);
    let back_at = scenario.now();
    let Some((sections, verdict)) = scenario.finish(run_for + Duration::from_secs(60)) else {
        return;
    };
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
/// processes on the quorum's side. One process reaches that follower only, one the other two
/// servers only, and one all three. Then the partition heals.
pub fn follower_partitioned() {
    let mut scenario = Scenario::new("follower-partitioned", Backend::ZookeeperEnsemble, 2);
    let run_for = Duration::from_secs(20);
    for name in ["a", "b", "c"] {
        let mut spec = scenario.spec(name, run_for);
        spec.tasks = 2;
        if name == "a" {
            // Pinned to the follower that will be cut off (a client picks among the servers
            // its URL names at random, so a process may be there or not).
            spec.lock_url = scenario.ensemble().url_of(&[0]);
        } else if name == "b" {
            // Pinned to the quorum's side, so that side has a process for certain: with every
            // process free to pick, all three were on the cut-off follower about one run in
            // nine, and nothing could run until it dropped them.
            spec.lock_url = scenario.ensemble().url_of(&[1, 2]);
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
    let Some((sections, verdict)) = scenario.finish(run_for + Duration::from_secs(60)) else {
        return;
    };
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

/// The servers of a scenario's ensemble, ZooKeeper's or etcd's.
struct Servers;

impl Servers {
    fn leader(scenario: &mut Scenario) -> Option<usize> {
        match scenario.backend {
            Backend::EtcdCluster => scenario.etcd_cluster().leader(),
            _ => scenario.ensemble().leader(),
        }
    }

    fn wait_for_leader(scenario: &mut Scenario, patience: Duration) -> Option<usize> {
        match scenario.backend {
            Backend::EtcdCluster => scenario.etcd_cluster().wait_for_leader(patience),
            _ => scenario.ensemble().wait_for_leader(patience),
        }
    }

    fn kill(scenario: &mut Scenario, index: usize) {
        match scenario.backend {
            Backend::EtcdCluster => scenario.etcd_cluster().kill(index),
            _ => scenario.ensemble().kill(index),
        }
    }

    fn restart(scenario: &mut Scenario, index: usize) {
        match scenario.backend {
            Backend::EtcdCluster => scenario.etcd_cluster().restart(index),
            _ => scenario.ensemble().restart(index),
        }
    }
}
