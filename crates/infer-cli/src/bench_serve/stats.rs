//! Percentiles of latency samples.
//!
//! A percentile is interpolated linearly between the two nearest ranks of
//! the sorted samples (rank `q/100 · (n − 1)`, counting from 0): numpy's
//! default (`method="linear"`), which also gives the median of an even
//! count as the mean of the middle two. No samples: no percentile (`None`,
//! printed as `null` and `-`).

use serde::Serialize;

/// The percentile `q` (0 to 100) of `sorted`, which must be sorted and
/// free of NaN.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let q = q.clamp(0.0, 100.0);
    let rank = q / 100.0 * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let frac = rank - lo as f64;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * frac)
}

/// Mean, p50, p90 and p99 of a set of samples, and how many there were.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub mean: Option<f64>,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
}

impl Summary {
    /// Summarizes `samples` (any order; NaN samples are dropped).
    pub fn of(samples: &[f64]) -> Summary {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        Summary {
            n,
            mean: (n > 0).then(|| v.iter().sum::<f64>() / n as f64),
            p50: percentile(&v, 50.0),
            p90: percentile(&v, 90.0),
            p99: percentile(&v, 99.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_has_no_percentiles() {
        assert_eq!(percentile(&[], 50.0), None);
        let s = Summary::of(&[]);
        assert_eq!(s, Summary { n: 0, mean: None, p50: None, p90: None, p99: None });
    }

    #[test]
    fn one_sample_is_every_percentile() {
        for q in [0.0, 50.0, 90.0, 99.0, 100.0] {
            assert_eq!(percentile(&[7.0], q), Some(7.0));
        }
    }

    #[test]
    fn interpolates_between_ranks_as_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        // numpy.percentile([1,2,3,4], [0,50,90,99,100]) = 1, 2.5, 3.7, 3.97, 4
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 50.0), Some(2.5));
        assert!((percentile(&v, 90.0).unwrap() - 3.7).abs() < 1e-12);
        assert!((percentile(&v, 99.0).unwrap() - 3.97).abs() < 1e-12);
        assert_eq!(percentile(&v, 100.0), Some(4.0));
        // Out-of-range quantiles clamp to the ends.
        assert_eq!(percentile(&v, -5.0), Some(1.0));
        assert_eq!(percentile(&v, 150.0), Some(4.0));
    }

    #[test]
    fn summary_sorts_and_drops_nan() {
        let xs: Vec<f64> = (1..=100).rev().map(f64::from).chain([f64::NAN]).collect();
        let s = Summary::of(&xs);
        assert_eq!(s.n, 100);
        assert_eq!(s.mean, Some(50.5));
        assert_eq!(s.p50, Some(50.5));
        assert!((s.p90.unwrap() - 90.1).abs() < 1e-9);
        assert!((s.p99.unwrap() - 99.01).abs() < 1e-9);
    }
}
