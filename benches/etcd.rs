//! The etcd backend against a hand-written etcd lock, in one run.
//!
//! ```text
//! cargo bench --features etcd --bench etcd
//! ```
//!
//! `DLOCK_ETCD_URL` (`etcd://host:port`) names a server to use; without it a private member is
//! started on free ports (Debian's `etcd-server`) and stopped at the end.
//!
//! Uncontended: sequential acquire + release on distinct keys, through `Locker::lock` and
//! `Lease::release` (its grant read together with a keep-alive of the backend's etcd lease),
//! against the raw recipe: one lease granted up front, then per key a transaction that puts the
//! key with the lease where it does not exist, and a delete. Pairs per second, the best of
//! interleaved rounds.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dlock::backend::EtcdBackend;
use dlock::{LockOptions, Locker, Owner};
use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};

const PAIRS: usize = 500;
const ROUNDS: usize = 3;

/// A private member, killed on drop.
struct Member {
    child: Child,
    dir: std::path::PathBuf,
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// The server to measure against: `DLOCK_ETCD_URL`'s, else a private member's.
fn server() -> (String, Option<Member>) {
    if let Ok(url) = std::env::var("DLOCK_ETCD_URL") {
        return (url, None);
    }
    let (port, peer) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("dlock-bench-etcd-{}", std::process::id()));
    let (client, peers) = (
        format!("http://127.0.0.1:{port}"),
        format!("http://127.0.0.1:{peer}"),
    );
    let child = Command::new("etcd")
        .args(["--name", "n", "--data-dir"])
        .arg(&dir)
        .args([
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
        ])
        .args([
            "--listen-peer-urls",
            &peers,
            "--initial-advertise-peer-urls",
            &peers,
        ])
        .args(["--initial-cluster", &format!("n={peers}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("cannot start etcd (apt-get install etcd-server)");
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        std::thread::sleep(Duration::from_millis(20));
    }
    (
        format!("etcd://127.0.0.1:{port}"),
        Some(Member { child, dir }),
    )
}

async fn dlock_pairs(locker: &Locker, round: usize) -> Duration {
    let options = LockOptions::new().ttl(Duration::from_secs(10));
    let started = Instant::now();
    for pair in 0..PAIRS {
        let lease = locker
            .lock(format!("bench-dlock-{round}-{pair}"), options)
            .await
            .unwrap();
        lease.release().await.unwrap();
    }
    started.elapsed()
}

async fn raw_pairs(client: &Client, lease: i64, round: usize) -> Duration {
    let mut kv = client.kv_client();
    let owner = Owner::random().to_string();
    let started = Instant::now();
    for pair in 0..PAIRS {
        let key = format!("bench-raw/{round}-{pair}/{owner}");
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                owner.as_str(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        assert!(kv.txn(txn).await.unwrap().succeeded());
        kv.delete(key.as_str(), None).await.unwrap();
    }
    started.elapsed()
}

fn per_second(elapsed: Duration) -> f64 {
    PAIRS as f64 / elapsed.as_secs_f64()
}

fn main() {
    let (url, _member) = server();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let backend = EtcdBackend::builder(&url)
            .unwrap()
            .root("dlock-bench")
            .connect()
            .await
            .unwrap();
        let locker = Locker::with_backend(backend);
        let endpoint = url.trim_start_matches("etcd://");
        let client = Client::connect([format!("http://{endpoint}")], None)
            .await
            .unwrap();
        let lease = client.lease_client().grant(30, None).await.unwrap().id();
        let (mut best_dlock, mut best_raw) = (Duration::MAX, Duration::MAX);
        for round in 0..ROUNDS {
            best_dlock = best_dlock.min(dlock_pairs(&locker, round).await);
            best_raw = best_raw.min(raw_pairs(&client, lease, round).await);
        }
        let (dlock, raw) = (per_second(best_dlock), per_second(best_raw));
        println!("uncontended acquire + release, {PAIRS} pairs, best of {ROUNDS} rounds:");
        println!("| contender | pairs/s |");
        println!("| --- | --- |");
        println!("| dlock (etcd) | {dlock:.0} |");
        println!("| raw lease + txn | {raw:.0} |");
        println!("dlock / raw: {:.2}", dlock / raw);
        locker.shutdown().await.unwrap();
    });
}
