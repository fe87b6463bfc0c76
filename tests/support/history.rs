//! The history of a fault scenario and the checker that judges it.
//!
//! Every worker appends one line per event to a log of its own: `<event> <key> <fence> <micros>
//! <worker>`, where `micros` is read from one clock every worker shares (the `TIME` of the
//! scenario's data server), so the lines of different processes can be merged. The events:
//!
//! - `enter`: the body started (taken inside the body, after the lock was acquired);
//! - `exit`: the body finished, its counter increment written (taken before the release);
//! - `lost`: the call returned `LockError::Lost`, the body dropped at its last await;
//! - `accepted` / `rejected`: a fenced write was taken / refused by the data store.
//!
//! A line is one `write` to a file opened for appending, so lines of concurrent tasks never mix.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::Path;
use std::sync::Mutex;

/// One line of a log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: String,
    pub key: String,
    pub fence: u64,
    pub micros: i64,
    pub worker: String,
}

/// A log being written by one worker.
pub struct Log {
    file: Mutex<File>,
    worker: String,
}

impl Log {
    pub fn create(path: &Path, worker: &str) -> Log {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
        Log {
            file: Mutex::new(file),
            worker: worker.to_owned(),
        }
    }

    pub fn record(&self, kind: &str, key: &str, fence: u64, micros: i64) {
        let line = format!("{kind} {key} {fence} {micros} {}\n", self.worker);
        self.file
            .lock()
            .unwrap()
            .write_all(line.as_bytes())
            .expect("cannot write the history");
    }
}

/// Every event in the logs at `paths`, in no particular order. A log may be missing (a worker
/// killed before it wrote) and its last line cut short (killed mid-write): both are skipped.
pub fn read(paths: &[impl AsRef<Path>]) -> Vec<Event> {
    let mut events = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for line in text.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let [kind, key, fence, micros, worker] = fields[..] else {
                continue;
            };
            let (Ok(fence), Ok(micros)) = (fence.parse(), micros.parse()) else {
                continue;
            };
            events.push(Event {
                kind: kind.into(),
                key: key.into(),
                fence,
                micros,
                worker: worker.into(),
            });
        }
    }
    events
}

/// One run of a body: from its `enter` to its `exit` or `lost`; `end` is `None` when neither
/// came (the worker was killed), and the checker then takes the time of the kill.
#[derive(Clone, Debug)]
pub struct Section {
    pub key: String,
    pub fence: u64,
    pub worker: String,
    pub start: i64,
    pub end: Option<i64>,
    pub finished: bool,
}

/// Pairs the `enter` events with their ends.
pub fn sections(events: &[Event]) -> Vec<Section> {
    let mut open: BTreeMap<(String, u64, String), usize> = BTreeMap::new();
    let mut sections = Vec::new();
    for event in events.iter().filter(|e| e.kind == "enter") {
        open.insert(
            (event.key.clone(), event.fence, event.worker.clone()),
            sections.len(),
        );
        sections.push(Section {
            key: event.key.clone(),
            fence: event.fence,
            worker: event.worker.clone(),
            start: event.micros,
            end: None,
            finished: false,
        });
    }
    for event in events {
        if event.kind != "exit" && event.kind != "lost" {
            continue;
        }
        if let Some(&index) = open.get(&(event.key.clone(), event.fence, event.worker.clone())) {
            sections[index].end = Some(event.micros);
            sections[index].finished = event.kind == "exit";
        }
    }
    sections
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Bodies that ran (entered), and of those, finished.
    pub entered: usize,
    pub finished: usize,
    /// Pairs of bodies of one key that ran at the same time, described.
    pub overlaps: Vec<String>,
    /// Bodies entered after another of the same key but holding a smaller or equal fence.
    pub fence_inversions: Vec<String>,
    /// Counter writes that did not build on the write before them: an increment lost.
    pub lost_updates: u64,
}

impl Verdict {
    /// Panics, saying everything found, unless the history is clean.
    pub fn assert_clean(&self, scenario: &str) {
        assert!(
            self.overlaps.is_empty() && self.fence_inversions.is_empty() && self.lost_updates == 0,
            "{scenario}: the history is not safe:\n{self}"
        );
        assert!(self.finished > 0, "{scenario}: no body ever finished");
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} entered, {} finished, {} overlaps, {} fence inversions, {} lost updates",
            self.entered,
            self.finished,
            self.overlaps.len(),
            self.fence_inversions.len(),
            self.lost_updates
        )?;
        for line in self.overlaps.iter().chain(&self.fence_inversions).take(20) {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

/// One write of a key's counter, as the data server journaled it when it ran: the fence of the
/// body that wrote, the value that body had read, and the value it wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Write {
    pub fence: u64,
    pub read: u64,
    pub written: u64,
}

impl Write {
    /// The journal entry's text: `<fence> <read> <written>`.
    pub fn parse(entry: &str) -> Option<Write> {
        let mut fields = entry.split(' ').map(str::parse);
        match (fields.next(), fields.next(), fields.next()) {
            (Some(Ok(fence)), Some(Ok(read)), Some(Ok(written))) => Some(Write {
                fence,
                read,
                written,
            }),
            _ => None,
        }
    }
}

/// When `section` ended, for the checkers: its `exit` or `lost`, else the kill of its worker (a
/// killed worker's body ended then at the latest), else never (a body that neither finished
/// nor was killed is taken to be inside still).
fn end_of(section: &Section, killed: &BTreeMap<String, i64>) -> i64 {
    section
        .end
        .or_else(|| killed.get(&section.worker).copied())
        .unwrap_or(i64::MAX)
}

/// Judges a history: `killed` gives, per killed worker, the time of the kill (its unfinished
/// body ended then at the latest); `journals` each key's counter writes in the order the data
/// server ran them — including writes of bodies stopped before they could log their exit.
///
/// A write that did not read what the write before it wrote is a lost update: exact, whatever
/// the clocks say, because the data server journals each write with the value it replaced in
/// one step. Fences must also never go back in the order of the writes (they may repeat: a
/// leader's term writes many times with one fence, and two sections entered with one fence are
/// caught as they enter).
pub fn check(
    sections: &[Section],
    killed: &BTreeMap<String, i64>,
    journals: &BTreeMap<String, Vec<Write>>,
) -> Verdict {
    let mut verdict = Verdict {
        entered: sections.len(),
        finished: sections.iter().filter(|s| s.finished).count(),
        ..Verdict::default()
    };
    let mut by_key: BTreeMap<&str, Vec<&Section>> = BTreeMap::new();
    for section in sections {
        by_key.entry(&section.key).or_default().push(section);
    }
    for (key, mut runs) in by_key {
        runs.sort_by_key(|s| (s.start, s.fence));
        // The body that, of those started so far, ends last: a later start before its end is
        // an overlap, however many bodies lie between.
        let mut latest: Option<(&Section, i64)> = None;
        for pair in runs.windows(2) {
            if pair[1].fence <= pair[0].fence {
                verdict.fence_inversions.push(format!(
                    "{key}: {} entered at {} with fence {} after {} entered at {} with fence {}",
                    pair[1].worker,
                    pair[1].start,
                    pair[1].fence,
                    pair[0].worker,
                    pair[0].start,
                    pair[0].fence
                ));
            }
        }
        for run in &runs {
            if let Some((previous, end)) = latest {
                if run.start < end {
                    verdict.overlaps.push(format!(
                        "{key}: {} (fence {}) entered at {}, {} µs before {} (fence {}) left",
                        run.worker,
                        run.fence,
                        run.start,
                        end - run.start,
                        previous.worker,
                        previous.fence
                    ));
                }
            }
            let end = end_of(run, killed);
            if latest.is_none_or(|(_, latest_end)| end > latest_end) {
                latest = Some((run, end));
            }
        }
    }
    for (key, writes) in journals {
        let mut previous = Write {
            fence: 0,
            read: 0,
            written: 0,
        };
        for write in writes {
            if write.read != previous.written {
                verdict.lost_updates += 1;
            }
            if write.fence < previous.fence {
                verdict.fence_inversions.push(format!(
                    "{key}: a write with fence {} ran after one with fence {}",
                    write.fence, previous.fence
                ));
            }
            previous = *write;
        }
    }
    verdict
}

/// What [`check_permits`] found: the [`Verdict`] (its `overlaps` are the moments a key had more
/// bodies inside than permits; no fences or writes judged) and how full the keys were.
#[derive(Debug, Default)]
pub struct PermitVerdict {
    pub verdict: Verdict,
    /// The most bodies of one key inside at once.
    pub most_inside: usize,
    /// How many entries filled a key to exactly its permits.
    pub filled: usize,
}

/// Judges a history of bodies on keys of `permits` permits each (a semaphore): never more than
/// `permits` bodies of one key inside at once. A sweep over the sections' `[start, end)`
/// intervals, each ended as [`check`] ends it (an unfinished body of a killed worker at the
/// kill, of another worker never); a body that leaves at the instant another enters is not
/// inside with it, as [`check`] counts no overlap there.
///
/// Fences are not judged: a permit's fence is its own (two holders at once may carry one fence
/// value, and a holder cannot tell which permit it holds), so the order of entries says nothing
/// about fences. Nor are counter writes: up to `permits` bodies legitimately overlap.
pub fn check_permits(
    sections: &[Section],
    killed: &BTreeMap<String, i64>,
    permits: usize,
) -> PermitVerdict {
    let mut found = PermitVerdict {
        verdict: Verdict {
            entered: sections.len(),
            finished: sections.iter().filter(|s| s.finished).count(),
            ..Verdict::default()
        },
        ..PermitVerdict::default()
    };
    let mut by_key: BTreeMap<&str, Vec<&Section>> = BTreeMap::new();
    for section in sections {
        by_key.entry(&section.key).or_default().push(section);
    }
    for (key, runs) in by_key {
        // (time, 0 for a leave and 1 for an entry — leaves first at one instant —, section).
        let mut moments: Vec<(i64, u8, usize)> = Vec::new();
        for (index, run) in runs.iter().enumerate() {
            moments.push((run.start, 1, index));
            moments.push((end_of(run, killed), 0, index));
        }
        moments.sort_unstable();
        let mut inside: Vec<usize> = Vec::new();
        for (at, entry, index) in moments {
            if entry == 0 {
                inside.retain(|&i| i != index);
                continue;
            }
            inside.push(index);
            found.most_inside = found.most_inside.max(inside.len());
            if inside.len() == permits {
                found.filled += 1;
            }
            if inside.len() > permits {
                let who: Vec<String> = inside
                    .iter()
                    .map(|&i| {
                        format!(
                            "{} #{} from {}",
                            runs[i].worker, runs[i].fence, runs[i].start
                        )
                    })
                    .collect();
                found.verdict.overlaps.push(format!(
                    "{key}: {} inside at {at} (permits {permits}): {}",
                    inside.len(),
                    who.join(", ")
                ));
            }
        }
    }
    found
}
