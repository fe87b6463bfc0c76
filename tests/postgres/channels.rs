//! One table, one notification channel, however its name is written: a release made through a
//! backend that names the table `locks` wakes the waiters of one that names it `public.locks`,
//! and the other way round.

use std::time::{Duration, Instant};

use dlock::backend::PostgresBackend;
use dlock::{LockOptions, Locker};

use crate::support::{self, postgres_url};
use crate::Postgres;

async fn locker_on(table: &str) -> Locker {
    Locker::with_backend(
        PostgresBackend::builder(&postgres_url())
            .unwrap()
            .table(table)
            .connect()
            .await
            .unwrap(),
    )
}

/// The holder's lease outlasts the waiter's wait: only the release's notification gets the
/// waiter in.
async fn a_release_through_one_spelling_wakes_a_waiter_through_the_other(
    holder: &Locker,
    waiter: &Locker,
    key: &str,
) {
    let held = LockOptions::new().ttl(Duration::from_secs(60)).renew(false);
    let lease = holder.lock(key, held).await.unwrap();
    let waiting = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.to_owned());
        async move {
            let got = waiter.lock(&*key, held.wait(Duration::from_secs(5))).await;
            (Instant::now(), got)
        }
    });
    // The waiter tried once, found the key busy and sleeps until it hears of a release.
    tokio::time::sleep(Duration::from_millis(300)).await;
    lease.release().await.unwrap();
    let released = Instant::now();
    let (answered, got) = waiting.await.unwrap();
    let after = answered.saturating_duration_since(released);
    assert!(
        got.is_ok() && after < Duration::from_secs(1),
        "the waiter got {:?} {after:?} after the release (its last try at the end of its wait): it did not hear of it",
        got.as_ref().map(|lease| lease.fence())
    );
    got.unwrap().release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_named_with_and_without_its_schema_has_one_channel() {
    let db = Postgres::fresh().await;
    let bare = locker_on(&db.table).await;
    let qualified = locker_on(&format!("public.{}", db.table)).await;
    let key = support::unique_key("spellings");
    a_release_through_one_spelling_wakes_a_waiter_through_the_other(&bare, &qualified, &key).await;
    a_release_through_one_spelling_wakes_a_waiter_through_the_other(&qualified, &bare, &key).await;
}
