//! Each lease is judged against its own deadline: a short lease never shortens the patience a
//! long one is given, and a slow grant does not push the first renewal past the lease's end.

use std::time::{Duration, Instant};

use dlock::{LockOptions, Locker};

use crate::support::unique_key;
use crate::Late;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lease_never_shortens_the_patience_given_to_long_ones() {
    // Every renewal is answered 500 ms after the store renewed: slower than a 300 ms lease can
    // wait, well within what a 3 s lease can.
    let late = Late {
        renew_delay: Duration::from_millis(500),
        ..Late::default()
    };
    let locker = Locker::with_backend(late);
    let long = locker
        .lock(
            unique_key("long"),
            LockOptions::new().ttl(Duration::from_secs(3)),
        )
        .await
        .unwrap();
    // A stream of 300 ms leases, each held across a renewal or two, so that renewal batches
    // mix them with the long lease.
    let started = Instant::now();
    let mut shorts = Vec::new();
    while started.elapsed() < Duration::from_secs(4) {
        let locker = locker.clone();
        shorts.push(tokio::spawn(async move {
            let short = locker
                .lock(
                    unique_key("short"),
                    LockOptions::new().ttl(Duration::from_millis(300)),
                )
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(250)).await;
            drop(short);
        }));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for short in shorts {
        short.await.unwrap();
    }
    assert!(
        long.is_held(),
        "the 3 s lease was lost though its renewals were confirmed in 500 ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_renewal_counts_from_the_grant_not_from_a_slow_reply() {
    // The grant reaches the caller 2 s after the store gave it: 0.7 s of the 3 s lease is left.
    let late = Late {
        acquire_delay: Duration::from_secs(2),
        ..Late::default()
    };
    let locker = Locker::with_backend(late);
    let lease = locker
        .lock(
            unique_key("slow-grant"),
            LockOptions::new().ttl(Duration::from_secs(3)),
        )
        .await
        .unwrap();
    assert!(lease.is_held());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        lease.is_held(),
        "the lease was lost: its first renewal was due 1 s after the grant arrived"
    );
}
