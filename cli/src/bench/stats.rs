//! The arithmetic of a bench row: algbw and busbw as nccl-tests defines them (decimal GB/s), the
//! sweep's sizes, and the statistics of a set of timings (min, median, mean, p99). Pure
//! functions: every other bench module may use them, and this one uses none of theirs.

/// min, median, mean and p99 of a set of samples (µs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    pub min: f64,
    pub median: f64,
    pub mean: f64,
    pub p99: f64,
}

impl Stats {
    /// The statistics of `samples` (sorted in place); zeros when empty.
    pub fn of(samples: &mut [f64]) -> Stats {
        let (min, median, p99) = percentiles(samples);
        let mean = if samples.is_empty() {
            0.0
        } else {
            samples.iter().sum::<f64>() / samples.len() as f64
        };
        Stats {
            min,
            median,
            mean,
            p99,
        }
    }
}

/// algbw in GB/s (10⁹ B/s): one rank's buffer over the time of one all-reduce.
pub fn algbw_gbps(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

/// busbw = algbw · 2(n−1)/n: in a ring all-reduce each rank sends (and receives) 2(n−1)/n of the
/// buffer, so this is the bandwidth every link carried; comparable with the link's speed and
/// across world sizes. For n = 1 nothing moves: 0.
pub fn busbw_gbps(algbw: f64, world: usize) -> f64 {
    if world == 0 {
        return 0.0;
    }
    algbw * 2.0 * (world as f64 - 1.0) / world as f64
}

/// Sizes in bytes: `min` up to `max`, ×`factor` per row (at least ×2), each rounded down to whole
/// elements of `elem_bytes` and at least one element; duplicates after rounding dropped.
pub fn sizes(min: usize, max: usize, factor: usize, elem_bytes: usize) -> Vec<usize> {
    let factor = factor.max(2);
    let mut out: Vec<usize> = std::iter::successors(Some(min.max(1)), |s| s.checked_mul(factor))
        .take_while(|&s| s <= max)
        .map(|s| (s / elem_bytes).max(1) * elem_bytes)
        .collect();
    out.dedup();
    out
}

/// (min, median, p99) of `samples` (sorted in place); zeros when empty.
pub fn percentiles(samples: &mut [f64]) -> (f64, f64, f64) {
    if samples.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    let median = if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    };
    let p99 = samples[((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1];
    (samples[0], median, p99)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_bytes;

    #[test]
    fn sizes_parse_and_sweep() {
        assert_eq!(parse_bytes("8").unwrap(), 8);
        assert_eq!(parse_bytes("64K").unwrap(), 65536);
        assert_eq!(parse_bytes("256M").unwrap(), 256 << 20);
        assert_eq!(parse_bytes("1G").unwrap(), 1 << 30);
        assert!(parse_bytes("1X").is_err());
        let s = sizes(8, 1 << 30, 2, 4);
        assert_eq!(s.first(), Some(&8));
        assert_eq!(s.last(), Some(&(1 << 30)));
        assert_eq!(s.len(), 28);
        // Rounded to whole elements, at least one, no duplicates.
        assert_eq!(sizes(1, 64, 2, 8), vec![8, 16, 32, 64]);
        assert_eq!(sizes(6, 100, 4, 4), vec![4, 24, 96]);
    }

    #[test]
    fn busbw_formula() {
        assert_eq!(algbw_gbps(1_000_000_000, 1.0), 1.0);
        assert_eq!(busbw_gbps(100.0, 2), 100.0);
        assert_eq!(busbw_gbps(100.0, 4), 150.0);
        assert_eq!(busbw_gbps(100.0, 8), 175.0);
        assert_eq!(busbw_gbps(100.0, 1), 0.0);
    }

    #[test]
    fn percentiles_of_samples() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentiles(&mut v), (1.0, 50.5, 99.0));
        assert_eq!(percentiles(&mut [3.0]), (3.0, 3.0, 3.0));
        assert_eq!(percentiles(&mut [2.0, 1.0, 3.0]), (1.0, 2.0, 3.0));
        assert_eq!(percentiles(&mut []), (0.0, 0.0, 0.0));
    }
}
