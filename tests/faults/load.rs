//! Scenarios of many bodies on two keys from several processes (or tasks) while a fault
//! strikes them all: connections cut at random, the lock server restarted, tasks aborted.

use std::time::{Duration, Instant};

use dlock::Locker;

use crate::scenario::{longest_pause, millis, ms, LockServer, Scenario};
use crate::support::history::{self, Log};
use crate::worker::{run_bodies, Backend, Body, Context, PERMITS};

/// Three processes of two tasks each run bodies on two keys for `run_for` while every
/// connection of theirs is cut, at random, once in a hundred chunks forwarded.
pub fn random_cuts(backend: Backend, run_for: Duration) {
    let mut scenario = Scenario::new("random-cuts", backend, 2);
    for name in ["a", "b", "c"] {
        let mut spec = scenario.spec(name, run_for);
        spec.tasks = 2;
        let worker = scenario.spawn(spec, &[]);
        scenario.proxy(worker).cut_randomly(0.01);
    }
    let Some((sections, verdict)) = scenario.finish(run_for + Duration::from_secs(60)) else {
        return;
    };
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

/// Three processes of three tasks each hold permits of ONE key of [`PERMITS`] permits (a
/// semaphore: nine callers, two inside at a time) for `run_for`, while every connection of
/// theirs is cut, at random, once in a hundred chunks forwarded. The verdict: never more than
/// two bodies inside at once (`history::check_permits`), and two at once reached, or the run
/// tested nothing of a semaphore. Fence order is not checked here: a permit's fence is its own,
/// and a lease does not say which permit it holds, so entries of one key carry fences of
/// different permits in no order; nor are counter writes, which two bodies may interleave.
pub fn permit_cuts(backend: Backend, run_for: Duration) {
    let mut scenario = Scenario::new("permits-cuts", backend, 1);
    for name in ["a", "b", "c"] {
        let mut spec = scenario.spec(name, run_for);
        spec.tasks = 3;
        spec.body = Body::Permit;
        let worker = scenario.spawn(spec, &[]);
        scenario.proxy(worker).cut_randomly(0.01);
    }
    let Some((sections, _)) = scenario.finish(run_for + Duration::from_secs(60)) else {
        return;
    };
    let found = history::check_permits(&sections, &scenario.killed, PERMITS);
    let cuts: u64 = (0..3).map(|w| scenario.proxy(w).cuts()).sum();
    scenario.report(
        &found.verdict,
        &format!(
            "{PERMITS} permits, 9 callers: at most {} inside at once, {PERMITS} reached {} times; \
             {cuts} connections cut; longest pause {}",
            found.most_inside,
            found.filled,
            ms(longest_pause(&sections))
        ),
    );
    found.verdict.assert_clean(scenario.name);
    assert!(
        found.most_inside == PERMITS,
        "{}: never {PERMITS} bodies inside at once (at most {}): the scenario tested nothing \
         of a semaphore",
        scenario.name,
        found.most_inside
    );
    assert!(
        cuts > 0,
        "no connection was cut: the scenario tested nothing"
    );
}

/// Three processes run bodies on two keys while the lock server restarts (down for a second);
/// for MySQL, whose server the tests share, every connection is cut and none accepted for that
/// second instead.
pub fn restart_under_load(backend: Backend) {
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
        LockServer::Postgres(server) => {
            server.stop();
            std::thread::sleep(Duration::from_secs(1));
            server.start();
        }
        LockServer::Etcd(server) => {
            server.stop();
            std::thread::sleep(Duration::from_secs(1));
            server.start();
        }
        LockServer::None => unreachable!("processes cannot share the memory store"),
        LockServer::ZookeeperEnsemble(_) | LockServer::EtcdCluster(_) => {
            unreachable!("an ensemble has scenarios of its own")
        }
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
    let Some((sections, verdict)) = scenario.finish(run_for + Duration::from_secs(60)) else {
        return;
    };
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

/// The in-process store: tasks sharing one memory `Locker` run bodies on two keys while, every
/// 20 ms, one of them is aborted (cancelled mid-body, as a dropped request would be) and
/// replaced by a new task.
pub async fn memory_with_aborted_tasks(run_for: Duration) {
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
