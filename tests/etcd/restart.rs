//! A restart of etcd under a backend that was idle through it: the first call after it succeeds
//! (a call whose connection broke since the last one is sent again on a fresh connection), and
//! the locks taken before are still judged by their etcd lease, which the restart kept.

use std::time::Duration;

use dlock::{LockOptions, Locker};

use crate::backend_at;
use crate::support::etcd_server::EtcdMember;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_call_after_a_restart_succeeds() {
    let mut member = tokio::task::spawn_blocking(EtcdMember::start_new)
        .await
        .unwrap();
    let locker = Locker::with_backend(backend_at(&member.url()).await);
    let options = LockOptions::new().ttl(Duration::from_secs(5));
    let before = locker.lock("restarted", options).await.unwrap();
    let fence = before.fence();
    before.release().await.unwrap();
    let mut member = tokio::task::spawn_blocking(move || {
        member.stop();
        member.start();
        member.wait_until_serving();
        member
    })
    .await
    .unwrap();
    let after = locker
        .lock("restarted", options)
        .await
        .expect("the first call after the restart failed");
    assert!(after.fence() > fence);
    after.release().await.unwrap();
    tokio::task::spawn_blocking(move || member.stop())
        .await
        .unwrap();
}
