//! One table, one notification channel, however its name is written: a release made through a
//! backend that names the table `locks` wakes the waiters of one that names it `public.locks`,
//! and the other way round.

use std::time::{Duration, Instant};

use dlock::backend::PostgresBackend;
use dlock::{LockOptions, Locker};
use sqlx::postgres::PgConnection;
use sqlx::{Connection, Row};

use crate::support::fault_proxy::{Direction, FaultProxy};
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

/// A listening connection that goes silent right after its handshake (a half-open connection:
/// its `LISTEN` is never answered, and TCP does not give up for many minutes) is given up on
/// after the connect timeout, and the listener connects again: until it does, nobody listens,
/// every waiting head polls, and a release's notification is not heard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_whose_listen_goes_unanswered_connects_again() {
    let db = Postgres::fresh().await;
    // How many chunks a client sends the server to set a connection up (TLS request, startup,
    // authentication): the listener's next chunk is its `LISTEN`.
    let handshake = {
        let (proxy, url) = FaultProxy::in_front_of(&postgres_url());
        let connection = PgConnection::connect(&url).await.unwrap();
        let chunks = proxy.chunks(Direction::ToServer);
        connection.close().await.unwrap();
        chunks
    };
    let (proxy, listen_url) = FaultProxy::in_front_of(&postgres_url());
    proxy.stall_new_connections_after(Direction::ToServer, handshake);
    let backend = PostgresBackend::builder(&postgres_url())
        .unwrap()
        .table(&db.table)
        .listen_url(&listen_url)
        .unwrap()
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    // The listener's first connection is set up, and holds its `LISTEN`; from now on new
    // connections go through (that one stays silent).
    proxy.stall_new_connections_after(Direction::ToServer, 0);
    let listening = || async {
        sqlx::query(
            "SELECT COUNT(*) FROM pg_stat_activity \
             WHERE application_name = 'dlock listener' AND query LIKE '%LISTEN%' AND query LIKE $1",
        )
        .bind(format!("%{}%", backend.channel()))
        .fetch_one(&db.admin)
        .await
        .unwrap()
        .get::<i64, _>(0)
    };
    let started = Instant::now();
    while listening().await == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "nobody listens {:?} after the listener's LISTEN went unanswered ({handshake} chunks of handshake)",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Listening again: a release's notification wakes a waiter.
    let (holder, waiter) = (db.locker().await, Locker::with_backend(backend));
    let key = support::unique_key("silent-listen");
    a_release_through_one_spelling_wakes_a_waiter_through_the_other(&holder, &waiter, &key).await;
}
