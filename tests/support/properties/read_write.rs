//! The properties of a read-write lock (`Mode::Read` beside writers and plain locks): readers
//! inside together, a writer alone, a waiting writer never overtaken by later readers, the key
//! handed to the head writer or the run of readers at the head, a dead reader's lease running
//! out, fences increasing across readers and writers, each reader's lease its own, and nothing
//! left behind by a reader that stops waiting. Instantiated by `read_write_properties!` for the
//! stores that take readers.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock::backend::{AcquireRequest, Backend};
use dlock::{current_lease, distributed_lock, Lease, LockError, LockOptions, Locker, Mode, Owner};

use super::super::{unique_key, Counting, Store};
use super::locker;

fn read() -> LockOptions {
    LockOptions::new().mode(Mode::Read)
}

fn write() -> LockOptions {
    LockOptions::new().mode(Mode::Write)
}

const LONG: Duration = Duration::from_secs(30);

/// Who is inside a key now, checked at every entry: a writer beside anyone, or a reader beside
/// a writer, is recorded as a violation.
#[derive(Default)]
struct Room {
    inside: Mutex<(usize, usize)>,
    violations: Mutex<Vec<String>>,
    most_readers: AtomicUsize,
}

impl Room {
    fn enter(&self, mode: Mode) {
        let mut inside = self.inside.lock().unwrap();
        let (readers, writers) = &mut *inside;
        let beside = match mode {
            Mode::Read => *writers > 0,
            _ => *readers > 0 || *writers > 0,
        };
        if beside {
            self.violations.lock().unwrap().push(format!(
                "a {mode} entered beside {readers} readers and {writers} writers"
            ));
        }
        match mode {
            Mode::Read => {
                *readers += 1;
                self.most_readers.fetch_max(*readers, Ordering::SeqCst);
            }
            _ => *writers += 1,
        }
    }

    fn leave(&self, mode: Mode) {
        let mut inside = self.inside.lock().unwrap();
        match mode {
            Mode::Read => inside.0 -= 1,
            _ => inside.1 -= 1,
        }
    }
}

/// Waits until `key` has `waiters` waiting, as the store tells it.
async fn until_waiting(locker: &Locker, key: &str, waiters: usize) {
    for _ in 0..3000 {
        if locker.inspect(key).await.unwrap().waiters() == waiters {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("`{key}` never had {waiters} waiters");
}

/// Four readers over four lockers are all inside at once: each waits inside for the other three,
/// which only ends if the store lets them in together.
pub async fn readers_are_inside_together<S: Store>(store: &S) {
    let key = unique_key("readers-together");
    let together = Arc::new(tokio::sync::Barrier::new(4));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (locker, key, together) = (locker(store).await, key.clone(), together.clone());
        tasks.push(tokio::spawn(async move {
            let lease = locker.lock(&*key, read().wait(LONG)).await.unwrap();
            tokio::time::timeout(LONG, together.wait())
                .await
                .expect("the four readers were never inside at once");
            lease.release().await.unwrap();
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// Readers, writers and plain locks on one key, over three lockers: a writer (or a plain lock)
/// is never inside beside anyone, nor a reader beside a writer, every caller gets in, and
/// readers do share the key.
pub async fn a_writer_is_never_inside_beside_anyone<S: Store>(store: &S) {
    let key = unique_key("rw-mix");
    let room = Arc::new(Room::default());
    let mut lockers = Vec::new();
    for _ in 0..3 {
        lockers.push(locker(store).await);
    }
    let mut tasks = Vec::new();
    for i in 0..60 {
        let (locker, key, room) = (lockers[i % 3].clone(), key.clone(), room.clone());
        // One in five a writer, one in ten a plain lock, the rest readers.
        let options = match i % 10 {
            0 | 5 => write(),
            3 => LockOptions::new(),
            _ => read(),
        };
        tasks.push(tokio::spawn(async move {
            let lease = locker.lock(&*key, options.wait(LONG)).await.unwrap();
            room.enter(options.mode);
            tokio::time::sleep(Duration::from_millis(3)).await;
            room.leave(options.mode);
            lease.release().await.unwrap();
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let violations = room.violations.lock().unwrap();
    assert!(violations.is_empty(), "{violations:?}");
    assert!(
        room.most_readers.load(Ordering::SeqCst) > 1,
        "readers never shared the key"
    );
}

/// A plain lock is the writer: it keeps readers out, and readers keep it out.
pub async fn a_plain_lock_and_readers_exclude_each_other<S: Store>(store: &S) {
    let key = unique_key("rw-plain");
    let (first, second) = (locker(store).await, locker(store).await);
    let plain = first.lock(&*key, LockOptions::new()).await.unwrap();
    let refused = second.lock(&*key, read()).await;
    assert!(
        matches!(refused, Err(LockError::Busy { .. })),
        "{refused:?}"
    );
    plain.release().await.unwrap();
    let reader = second.lock(&*key, read()).await.unwrap();
    let refused = first.lock(&*key, LockOptions::new()).await;
    assert!(
        matches!(refused, Err(LockError::Busy { .. })),
        "{refused:?}"
    );
    reader.release().await.unwrap();
    let _writer = first.lock(&*key, LockOptions::new()).await.unwrap();
}

/// A writer waits behind a reader while two loops of readers keep taking the key: the readers
/// that ask after the writer queued all wait for it, so it gets in as soon as the reader it
/// found leaves, without a single later reader granted first.
pub async fn a_waiting_writer_is_not_overtaken_by_later_readers<S: Store>(store: &S) {
    let key = unique_key("rw-starve");
    let locker = locker(store).await;
    let first_reader = locker.lock(&*key, read()).await.unwrap();
    let writer_waiting = Arc::new(AtomicBool::new(false));
    let writer_in = Arc::new(AtomicBool::new(false));
    let overtook = Arc::new(AtomicUsize::new(0));
    let after_writer = Arc::new(AtomicUsize::new(0));
    let writer = {
        let (locker, key, writer_in) = (locker.clone(), key.clone(), writer_in.clone());
        tokio::spawn(async move {
            let lease = locker.lock(&*key, write().wait(LONG)).await.unwrap();
            writer_in.store(true, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
            lease.release().await.unwrap();
        })
    };
    until_waiting(&locker, &key, 1).await;
    writer_waiting.store(true, Ordering::SeqCst);
    let mut streams = Vec::new();
    for _ in 0..2 {
        let (locker, key) = (locker.clone(), key.clone());
        let (writer_in, overtook, after_writer) =
            (writer_in.clone(), overtook.clone(), after_writer.clone());
        streams.push(tokio::spawn(async move {
            // Each reader asks after the writer queued, and leaves a few ms later.
            // Bounded, so that a store that lets readers overtake fails the assertion below
            // rather than starving the writer for the whole wait.
            while after_writer.load(Ordering::SeqCst) < 10 && overtook.load(Ordering::SeqCst) < 200
            {
                let lease = locker.lock(&*key, read().wait(LONG)).await.unwrap();
                if writer_in.load(Ordering::SeqCst) {
                    after_writer.fetch_add(1, Ordering::SeqCst);
                } else {
                    overtook.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                lease.release().await.unwrap();
            }
        }));
    }
    // Readers pile up behind the writer while the first reader stays (or, on a store that lets
    // them overtake it, get in at once).
    for _ in 0..3000 {
        if overtook.load(Ordering::SeqCst) > 0 || locker.inspect(&key).await.unwrap().waiters() == 3
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    first_reader.release().await.unwrap();
    writer.await.unwrap();
    for stream in streams {
        stream.await.unwrap();
    }
    assert_eq!(
        overtook.load(Ordering::SeqCst),
        0,
        "readers that came after the waiting writer got the key before it"
    );
}

/// When a writer leaves, the readers at the head of the queue get the key together, up to the
/// first writer; the reader behind that writer waits for it.
pub async fn a_release_hands_the_key_to_the_run_of_readers_at_the_head<S: Store>(store: &S) {
    let key = unique_key("rw-run");
    let locker = locker(store).await;
    let writer = locker.lock(&*key, write()).await.unwrap();
    let mut waiting = Vec::new();
    let (granted_tx, mut granted) = tokio::sync::mpsc::unbounded_channel::<(usize, Lease)>();
    for (i, options) in [read(), read(), read(), write(), read()]
        .into_iter()
        .enumerate()
    {
        let (waiter, waited, granted_tx) = (locker.clone(), key.clone(), granted_tx.clone());
        waiting.push(tokio::spawn(async move {
            let lease = waiter.lock(&*waited, options.wait(LONG)).await.unwrap();
            let _ = granted_tx.send((i, lease));
        }));
        // One at a time, so the queue's order is the order above.
        until_waiting(&locker, &key, i + 1).await;
    }
    writer.release().await.unwrap();
    let mut first_in = Vec::new();
    for _ in 0..3 {
        first_in.push(granted.recv().await.unwrap());
    }
    let mut ids: Vec<usize> = first_in.iter().map(|(i, _)| *i).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        [0, 1, 2],
        "the three readers at the head were not let in together"
    );
    let state = locker.inspect(&key).await.unwrap();
    assert_eq!(state.holders().len(), 3);
    assert!(state
        .holders()
        .iter()
        .all(|holder| holder.mode() == Mode::Read));
    assert_eq!(
        state.waiters(),
        2,
        "the writer and the reader behind it wait"
    );
    for (_, lease) in first_in {
        lease.release().await.unwrap();
    }
    let (next, writer) = granted.recv().await.unwrap();
    assert_eq!(next, 3, "the writer comes next");
    assert_eq!(locker.inspect(&key).await.unwrap().waiters(), 1);
    writer.release().await.unwrap();
    let (last, reader) = granted.recv().await.unwrap();
    assert_eq!(last, 4);
    reader.release().await.unwrap();
    for task in waiting {
        task.await.unwrap();
    }
}

/// A reader that dies (never renews, never releases) keeps the key from a writer only until its
/// ttl runs out on the store; the writer's fence is above the dead reader's.
pub async fn a_dead_readers_lease_runs_out_and_a_writer_gets_the_key<S: Store>(store: &S) {
    let key = unique_key("rw-dead");
    let backend = store.backend().await;
    let dead = AcquireRequest::new(
        &key,
        Owner::random(),
        Duration::from_millis(300),
        Duration::ZERO,
    )
    .mode(Mode::Read);
    let dead_fence = backend.acquire(&dead).await.unwrap().expect("free").fence;
    let locker = locker(store).await;
    let refused = locker.lock(&*key, write()).await;
    assert!(
        matches!(refused, Err(LockError::Busy { .. })),
        "{refused:?}"
    );
    let writer = locker.lock(&*key, write().wait(LONG)).await.unwrap();
    assert!(writer.fence() > dead_fence);
    assert_eq!(locker.inspect(&key).await.unwrap().holders().len(), 1);
}

/// Every grant of a key, to a reader or a writer, has a fence above every earlier one.
pub async fn fences_increase_across_readers_and_writers<S: Store>(store: &S) {
    let key = unique_key("rw-fence");
    let locker = locker(store).await;
    let mut fences = Vec::new();
    for _ in 0..3 {
        let (first, second) = (
            locker.lock(&*key, read()).await.unwrap(),
            locker.lock(&*key, read()).await.unwrap(),
        );
        fences.extend([first.fence(), second.fence()]);
        let writer = {
            let (locker, key) = (locker.clone(), key.clone());
            tokio::spawn(async move { locker.lock(&*key, write().wait(LONG)).await.unwrap() })
        };
        until_waiting(&locker, &key, 1).await;
        first.release().await.unwrap();
        second.release().await.unwrap();
        let writer = writer.await.unwrap();
        fences.push(writer.fence());
        writer.release().await.unwrap();
        let plain = locker.lock(&*key, LockOptions::new()).await.unwrap();
        fences.push(plain.fence());
        plain.release().await.unwrap();
    }
    assert!(
        fences.windows(2).all(|pair| pair[0] < pair[1]),
        "fences not strictly increasing in grant order: {fences:?}"
    );
}

/// Each reader's lease is its own: inspected apart, renewed apart, released or evicted apart,
/// the other readers keeping theirs.
pub async fn each_readers_lease_is_its_own<S: Store>(store: &S) {
    let key = unique_key("rw-own");
    let locker = locker(store).await;
    let first = locker.lock(&*key, read()).await.unwrap();
    let second = locker.lock(&*key, read()).await.unwrap();
    let third = locker.lock(&*key, read()).await.unwrap();
    let state = locker.inspect(&key).await.unwrap();
    let mut shown: Vec<_> = state
        .holders()
        .iter()
        .map(|holder| (holder.owner(), holder.fence(), holder.mode()))
        .collect();
    shown.sort_by_key(|(_, fence, _)| *fence);
    assert_eq!(
        shown,
        [&first, &second, &third].map(|lease| (lease.owner(), lease.fence(), Mode::Read))
    );
    let evicted = locker.force_release(&key, second.owner()).await.unwrap();
    assert_eq!(evicted, Some(second.fence()));
    let backend = store.backend().await;
    let ttl = Duration::from_secs(30);
    let renewed = backend
        .renew(&[
            dlock::backend::Renewal::new(&key, first.owner(), ttl),
            dlock::backend::Renewal::new(&key, second.owner(), ttl),
        ])
        .await
        .unwrap();
    assert_eq!(
        renewed,
        [true, false],
        "only the evicted reader lost its lease"
    );
    first.release().await.unwrap();
    assert!(third.is_held());
    let state = locker.inspect(&key).await.unwrap();
    assert_eq!(state.holders().len(), 1);
    assert_eq!(state.holders()[0].owner(), third.owner());
    let refused = locker.lock(&*key, write()).await;
    assert!(
        matches!(refused, Err(LockError::Busy { .. })),
        "{refused:?}"
    );
    third.release().await.unwrap();
    let _writer = locker.lock(&*key, write()).await.unwrap();
}

/// A reader that stops waiting leaves the queue: nothing of it is left, and a writer that
/// stops waiting lets the readers behind it join the readers holding the key at once.
pub async fn a_reader_or_writer_that_stops_waiting_leaves_nothing_behind<S: Store>(store: &S) {
    let key = unique_key("rw-cancel");
    let locker = locker(store).await;
    let writer = locker.lock(&*key, write()).await.unwrap();
    let reader = {
        let (locker, key) = (locker.clone(), key.clone());
        tokio::spawn(async move { locker.lock(&*key, read().wait(LONG)).await })
    };
    until_waiting(&locker, &key, 1).await;
    reader.abort();
    assert!(reader.await.unwrap_err().is_cancelled());
    until_waiting(&locker, &key, 0).await;
    writer.release().await.unwrap();
    let state = locker.inspect(&key).await.unwrap();
    assert!(!state.is_held(), "{state:?}");
    // A writer queued between readers: when it gives up, the reader behind it joins the holder.
    let holder = locker.lock(&*key, read()).await.unwrap();
    let writer = {
        let (locker, key) = (locker.clone(), key.clone());
        tokio::spawn(async move { locker.lock(&*key, write().wait(LONG)).await })
    };
    until_waiting(&locker, &key, 1).await;
    let behind = {
        let (locker, key) = (locker.clone(), key.clone());
        tokio::spawn(async move { locker.lock(&*key, read().wait(LONG)).await.unwrap() })
    };
    until_waiting(&locker, &key, 2).await;
    writer.abort();
    let behind = tokio::time::timeout(LONG, behind)
        .await
        .expect("the reader behind a writer that gave up was not let in")
        .unwrap();
    let state = locker.inspect(&key).await.unwrap();
    assert_eq!((state.holders().len(), state.waiters()), (2, 0));
    holder.release().await.unwrap();
    behind.release().await.unwrap();
    assert!(!locker.inspect(&key).await.unwrap().is_held());
}

/// A read mode with permits, or a campaign in read mode, is refused before the store is asked.
pub async fn a_read_mode_with_permits_or_a_campaign_is_refused<S: Store>(store: &S) {
    let key = unique_key("rw-refused");
    let locker = locker(store).await;
    let semaphore = locker.lock(&*key, read().permits(2)).await;
    assert!(
        matches!(semaphore, Err(LockError::InvalidOptions { .. })),
        "{semaphore:?}"
    );
    let campaign = locker.campaign(&*key, read()).await;
    assert!(
        matches!(campaign, Err(LockError::InvalidOptions { .. })),
        "{:?}",
        campaign.err()
    );
    assert!(!locker.inspect(&key).await.unwrap().is_held());
}

#[distributed_lock(key = "<key>", mode = "read", locker = locker)]
async fn nested_read(locker: &Locker, key: &str) -> Result<u64, LockError> {
    Ok(current_lease().unwrap().fence())
}

#[distributed_lock(key = "<key>", mode = "write", locker = locker)]
async fn nested_write(locker: &Locker, key: &str) -> Result<u64, LockError> {
    Ok(current_lease().unwrap().fence())
}

#[distributed_lock(key = "<key>", locker = locker)]
async fn nested_plain(locker: &Locker, key: &str) -> Result<u64, LockError> {
    Ok(current_lease().unwrap().fence())
}

/// The body of a reader, calling `inner` on its key: the reader's fence, and what `inner`
/// answered.
#[distributed_lock(key = "<key>", mode = "read", locker = locker)]
async fn reading_then(
    locker: &Locker,
    key: &str,
    inner: Inner,
) -> Result<(u64, Result<u64, LockError>), LockError> {
    let fence = current_lease().unwrap().fence();
    Ok((fence, inner.call(locker, key).await))
}

/// As [`reading_then`], in the body of a writer.
#[distributed_lock(key = "<key>", mode = "write", locker = locker)]
async fn writing_then(
    locker: &Locker,
    key: &str,
    inner: Inner,
) -> Result<(u64, Result<u64, LockError>), LockError> {
    let fence = current_lease().unwrap().fence();
    Ok((fence, inner.call(locker, key).await))
}

#[derive(Clone, Copy)]
enum Inner {
    Read,
    Write,
    Plain,
}

impl Inner {
    async fn call(self, locker: &Locker, key: &str) -> Result<u64, LockError> {
        match self {
            Inner::Read => nested_read(locker, key).await,
            Inner::Write => nested_write(locker, key).await,
            Inner::Plain => nested_plain(locker, key).await,
        }
    }
}

/// A read call nested in a reader's body, or in a writer's, re-enters the outer lease (its fence,
/// no acquisition); a write call (or a plain one) nested in a reader's body is refused, as an
/// upgrade would wait for ever beside another reader doing the same.
pub async fn a_nested_read_reenters_and_a_nested_write_in_a_reader_is_refused<S: Store>(store: &S) {
    let backend = Counting::new(store.backend().await);
    let locker = Locker::with_backend(backend.clone());
    let key = unique_key("rw-nested");
    let (outer, inner) = reading_then(&locker, &key, Inner::Read).await.unwrap();
    assert_eq!(
        inner.unwrap(),
        outer,
        "a read in a reader re-enters its lease"
    );
    let (outer, inner) = writing_then(&locker, &key, Inner::Read).await.unwrap();
    assert_eq!(
        inner.unwrap(),
        outer,
        "a read in a writer re-enters its lease"
    );
    let (outer, inner) = writing_then(&locker, &key, Inner::Write).await.unwrap();
    assert_eq!(
        inner.unwrap(),
        outer,
        "a write in a writer re-enters its lease"
    );
    assert_eq!(backend.acquires(), 3, "one acquisition per outer call");
    for upgrade in [Inner::Write, Inner::Plain] {
        let (_, inner) = reading_then(&locker, &key, upgrade).await.unwrap();
        match inner {
            Err(LockError::InvalidOptions { reason }) => {
                assert!(
                    reason.contains("a reader never becomes a writer"),
                    "{reason}"
                )
            }
            other => panic!("an upgrade was not refused: {other:?}"),
        }
    }
    assert_eq!(
        backend.acquires(),
        5,
        "a refused upgrade asks the store nothing"
    );
    // Every outer call released: the key is free for a writer.
    let _writer = locker.lock(&*key, write()).await.unwrap();
}

/// `hold_at_least` works per lease for a reader as for a writer: a reader that ends at once keeps
/// its lease to the hold's end, so a writer waits for it, while other readers may join.
pub async fn a_readers_hold_keeps_writers_out_to_its_end<S: Store>(store: &S) {
    let key = unique_key("rw-hold");
    let locker = locker(store).await;
    let hold = Duration::from_millis(300);
    let reader = locker
        .lock(&*key, read().hold_at_least(hold))
        .await
        .unwrap();
    let held_from = std::time::Instant::now();
    reader.release().await.unwrap();
    let state = locker.inspect(&key).await.unwrap();
    assert_eq!(
        state.holders().len(),
        1,
        "the reader's lease is kept for its hold"
    );
    let refused = locker.lock(&*key, write()).await;
    assert!(
        matches!(refused, Err(LockError::Busy { .. })),
        "{refused:?}"
    );
    let joined = locker.lock(&*key, read()).await.unwrap();
    joined.release().await.unwrap();
    let writer = locker.lock(&*key, write().wait(LONG)).await.unwrap();
    assert!(
        held_from.elapsed() >= hold - Duration::from_millis(50),
        "the writer got in before the reader's hold ended"
    );
    writer.release().await.unwrap();
}
