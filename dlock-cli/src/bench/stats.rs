//! Percentiles of measured durations.

use std::time::Duration;

use serde::Serialize;

/// The spread of a set of durations, in milliseconds: what the summary table and the JSON show.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// The median.
    pub p50: f64,
    /// The 99th percentile.
    pub p99: f64,
    /// The longest.
    pub max: f64,
}

impl Spread {
    /// The spread of `samples` (by nearest rank); zeros for none.
    pub fn of(samples: &mut [Duration]) -> Spread {
        samples.sort_unstable();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        Spread {
            p50: ms(percentile(samples, 50)),
            p99: ms(percentile(samples, 99)),
            max: ms(samples.last().copied().unwrap_or_default()),
        }
    }
}

/// The `p`th percentile of sorted `samples` by nearest rank: the smallest sample with at least
/// `p` percent of the samples at or below it.
fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut samples: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let spread = Spread::of(&mut samples);
        assert_eq!((spread.p50, spread.p99, spread.max), (50.0, 99.0, 100.0));
        let mut one = [Duration::from_millis(3)];
        assert_eq!(Spread::of(&mut one).p50, 3.0);
        assert_eq!(Spread::of(&mut []).max, 0.0);
    }
}
