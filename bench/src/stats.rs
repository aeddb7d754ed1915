//! Summaries of repeated measurements.

use serde::Serialize;

/// Median, p95 and range of a set of samples (in the unit the caller chose).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Median (nearest rank).
    pub median: f64,
    /// 95th percentile (nearest rank).
    pub p95: f64,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
    /// Arithmetic mean.
    pub mean: f64,
}

impl Summary {
    /// The summary of `samples`; `None` when there are none.
    pub fn of(samples: &[f64]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        Some(Self {
            n,
            median: nearest_rank(&sorted, 50.0),
            p95: nearest_rank(&sorted, 95.0),
            min: sorted[0],
            max: sorted[n - 1],
            mean: sorted.iter().sum::<f64>() / n as f64,
        })
    }
}

/// The nearest-rank percentile of sorted, non-empty samples.
fn nearest_rank(sorted: &[f64], percentile: f64) -> f64 {
    let rank = ((percentile / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<f64> = (1..=20).map(f64::from).collect();
        let s = Summary::of(&samples).unwrap();
        assert_eq!(
            (s.n, s.median, s.p95, s.min, s.max),
            (20, 10.0, 19.0, 1.0, 20.0)
        );
        assert_eq!(Summary::of(&[3.0]).unwrap().p95, 3.0);
        assert!(Summary::of(&[]).is_none());
    }
}
