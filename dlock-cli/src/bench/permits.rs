//! The permits workload of `dlock bench --permits N`: what a semaphore buys over a mutex where
//! the work inside takes a while (a call to a partner that takes N requests at a time).
//!
//! The same tasks take turns on one key twice, each turn `--work` long: first on the key as a
//! mutex (the baseline, in the same run), then as a semaphore of N permits. Where the store's
//! round trips are short next to the work, the semaphore does close to N times the mutex's
//! turns per second; the rest is the cost of its waiting line.

use std::time::Duration;

use dlock::Locker;
use serde::Serialize;

use super::{contended, progress, Contended, Turn};
use crate::cli::BenchArgs;
use crate::table::Table;

/// The permits workload's results.
#[derive(Debug, Serialize)]
pub(super) struct Permits {
    /// The semaphore's permits.
    permits: u32,
    /// How long each turn worked inside, in milliseconds.
    work_ms: u64,
    /// The tasks on the key as a mutex: the baseline.
    mutex: Contended,
    /// The same tasks on the key as a semaphore of `permits`.
    semaphore: Contended,
    /// The semaphore's turns per second over the mutex's.
    ratio: f64,
}

/// Runs the workload on keys under `prefix`, `length` each half.
pub(super) async fn measure(
    locker: &Locker,
    prefix: &str,
    length: Duration,
    args: &BenchArgs,
    show: bool,
) -> Permits {
    let work = Duration::from_millis(args.work);
    let mutex = contended(
        locker,
        &format!("{prefix}mutex"),
        length,
        args.tasks,
        Turn { permits: 1, work },
        progress("mutex", length, show),
    )
    .await;
    let semaphore = contended(
        locker,
        &format!("{prefix}permits"),
        length,
        args.tasks,
        Turn {
            permits: args.permits,
            work,
        },
        progress("permits", length, show),
    )
    .await;
    let ratio = match mutex.per_second {
        rate if rate > 0.0 => semaphore.per_second / rate,
        _ => 0.0,
    };
    Permits {
        permits: args.permits,
        work_ms: args.work,
        mutex,
        semaphore,
        ratio,
    }
}

/// The workload's part of the summary people read.
pub(super) fn render(permits: &Permits) -> String {
    let ms = |ms: f64| format!("{ms:.2}ms");
    let mut table = Table::new(&[
        "KEY AS",
        "TURNS>",
        "TURNS/S>",
        "P50>",
        "P99>",
        "MAX>",
        "MOST INSIDE>",
        "TASK TURNS>",
        "ERRORS>",
    ]);
    let (m, s) = (&permits.mutex, &permits.semaphore);
    for (name, run) in [
        ("mutex".to_owned(), m),
        (format!("{} permits", permits.permits), s),
    ] {
        let fewest = run.per_worker.iter().min().copied().unwrap_or(0);
        let most = run.per_worker.iter().max().copied().unwrap_or(0);
        table.row(vec![
            name,
            run.sections.to_string(),
            format!("{:.1}", run.per_second),
            ms(run.wait_ms.p50),
            ms(run.wait_ms.p99),
            ms(run.wait_ms.max),
            run.most_inside.to_string(),
            format!("{fewest}–{most}"),
            run.errors.to_string(),
        ]);
    }
    let verdict = if s.most_inside <= u64::from(permits.permits) && m.most_inside <= 1 {
        "never more inside than allowed"
    } else {
        "MORE INSIDE THAN ALLOWED"
    };
    format!(
        "permits: {} tasks, each turn working {} ms; waits are for the key\n\n{table}\n\
         {} permits: {:.2}× the mutex's turns per second ({verdict})\n",
        m.tasks, permits.work_ms, permits.permits, permits.ratio
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::stats::Spread;

    fn run(per_second: f64, most_inside: u64, per_worker: Vec<u64>) -> Contended {
        Contended {
            tasks: per_worker.len() as u64,
            sections: per_worker.iter().sum(),
            per_second,
            lost_updates: 0,
            most_inside,
            wait_ms: Spread {
                p50: 1.0,
                p99: 2.0,
                max: 3.0,
            },
            per_worker,
            errors: 0,
        }
    }

    #[test]
    fn the_section_shows_both_keys_the_ratio_and_who_was_inside() {
        let permits = Permits {
            permits: 4,
            work_ms: 5,
            mutex: run(180.0, 1, vec![90, 90]),
            semaphore: run(700.0, 4, vec![340, 360]),
            ratio: 700.0 / 180.0,
        };
        let page = render(&permits);
        assert!(
            page.starts_with("permits: 2 tasks, each turn working 5 ms"),
            "{page}"
        );
        assert!(page.contains("4 permits: 3.89× the mutex's"), "{page}");
        assert!(page.contains("never more inside than allowed"), "{page}");
        assert!(page.contains("340–360"), "{page}");
        let json = serde_json::to_value(&permits).unwrap();
        assert_eq!(json["semaphore"]["most_inside"], 4);

        let crowded = Permits {
            semaphore: run(700.0, 5, vec![340, 360]),
            ..permits
        };
        assert!(render(&crowded).contains("MORE INSIDE THAN ALLOWED"));
    }
}
