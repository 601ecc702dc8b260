//! `bench --sizes random`: a workload whose message size changes on every call, as a model's
//! layers of different widths call all-reduce one after another. The sizes are drawn from
//! `-b`..`-e` log-uniformly (every power-of-two band of the range is as likely as any other, so
//! small and large messages both occur), element-aligned, no size twice in a row, from a fixed seed
//! (the same sequence on every run and for every library). Every call is timed from the call to its
//! completion; the table compares, per band of the fixed sweep's sizes, the random calls' median
//! and p99 with the fixed-size call latency at the band's lower size.
//!
//! Invariant: [`random_sizes`] depends only on its arguments (SplitMix64, no global state).

use serde::{Deserialize, Serialize};

/// The seed of `--sizes random` unless `--seed` says otherwise.
pub const DEFAULT_SEED: u64 = 0x5EED_2026;

/// One library's random-size workload: every call's size and its call-to-completion time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RandomRun {
    pub library: String,
    pub seed: u64,
    pub min_bytes: u64,
    pub max_bytes: u64,
    /// In place (each rank's one buffer) rather than out of place.
    #[serde(default)]
    pub in_place: bool,
    /// (bytes per rank, µs from the call to its completion), in call order.
    pub calls: Vec<(u64, f64)>,
    /// Wrong elements over all ranks: out of place, of the outputs after the workload (zeroed
    /// before it, compared up to the largest size called); in place, of one more call of the
    /// largest size on the inputs restored after the workload.
    pub wrong: u64,
    /// Why the workload stopped, if it did; `calls` holds the calls made before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", 2014):
/// the next state and its output.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `calls` sizes in bytes from `min..=max`, log-uniform, each a whole number of `elem_bytes`
/// elements (at least one), none equal to the one before (when the range holds two sizes).
pub fn random_sizes(
    min: usize,
    max: usize,
    calls: usize,
    elem_bytes: usize,
    seed: u64,
) -> Vec<usize> {
    let elem = elem_bytes.max(1);
    let lo = (min.max(1) / elem).max(1);
    let hi = (max / elem).max(lo);
    let (ln_lo, ln_hi) = ((lo as f64).ln(), ((hi + 1) as f64).ln());
    let mut state = seed;
    let mut out: Vec<usize> = Vec::with_capacity(calls);
    while out.len() < calls {
        // 53 random bits → a uniform f64 in [0, 1).
        let u = (splitmix64(&mut state) >> 11) as f64 / (1u64 << 53) as f64;
        let count = ((ln_lo + u * (ln_hi - ln_lo)).exp() as usize).clamp(lo, hi);
        let bytes = count * elem;
        if hi > lo && out.last() == Some(&bytes) {
            continue;
        }
        out.push(bytes);
    }
    out
}

/// Per band of the fixed sizes: the band `[sizes[i], sizes[i+1])` (the last one up to and
/// including `max`), the random calls that fell in it, and their (median, p99) in µs.
#[derive(Clone, Debug, PartialEq)]
pub struct Band {
    pub from_bytes: u64,
    pub calls: usize,
    pub median_us: f64,
    pub p99_us: f64,
}

/// The random calls of `run` sorted into the bands that start at each of `fixed_sizes`
/// (ascending); calls below the first size go to the first band. Bands without calls are left out.
pub fn bands(run: &RandomRun, fixed_sizes: &[u64]) -> Vec<Band> {
    let mut out = Vec::new();
    for (i, &from) in fixed_sizes.iter().enumerate() {
        let to = fixed_sizes.get(i + 1).copied().unwrap_or(u64::MAX);
        let mut samples: Vec<f64> = run
            .calls
            .iter()
            .filter(|(b, _)| (*b >= from || i == 0) && *b < to)
            .map(|&(_, us)| us)
            .collect();
        if samples.is_empty() {
            continue;
        }
        let stats = super::stats::Stats::of(&mut samples);
        out.push(Band {
            from_bytes: from,
            calls: samples.len(),
            median_us: stats.median,
            p99_us: stats.p99,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_reproducible_aligned_in_range_and_change_every_call() {
        let a = random_sizes(8, 32 << 20, 1000, 4, DEFAULT_SEED);
        assert_eq!(a, random_sizes(8, 32 << 20, 1000, 4, DEFAULT_SEED));
        assert_ne!(a, random_sizes(8, 32 << 20, 1000, 4, DEFAULT_SEED + 1));
        assert_eq!(a.len(), 1000);
        assert!(a.iter().all(|&s| (8..=32 << 20).contains(&s) && s % 4 == 0));
        assert!(a.windows(2).all(|w| w[0] != w[1]));
        // Log-uniform: each of the 22 power-of-two bands of 8 B..32 MiB gets about 1/22 of the
        // calls (45); every band gets some, none more than twice its share.
        for k in 3..25 {
            let n = a
                .iter()
                .filter(|&&s| s >= 1 << k && s < 1 << (k + 1))
                .count();
            assert!((10..=90).contains(&n), "band 2^{k}: {n} calls");
        }
        // The small bands hold few sizes (8..16 B: two f32 counts), so those recur; the large
        // ones almost never do.
        let distinct: std::collections::HashSet<_> = a.iter().collect();
        assert!(distinct.len() > 700, "{} distinct sizes", distinct.len());
        let large: Vec<_> = a.iter().filter(|&&s| s >= 1 << 16).collect();
        let large_distinct: std::collections::HashSet<_> = large.iter().collect();
        assert!(large_distinct.len() + 5 >= large.len());
        // A range of one element size: that size every time (nothing else to change to).
        assert_eq!(random_sizes(8, 8, 5, 8, 1), vec![8; 5]);
        // Rounded to whole elements, at least one.
        assert!(random_sizes(1, 100, 50, 8, 7)
            .iter()
            .all(|&s| s % 8 == 0 && (8..=96).contains(&s)));
    }

    #[test]
    fn calls_fall_into_the_band_of_their_fixed_size() {
        let run = RandomRun {
            library: "x".into(),
            seed: 0,
            min_bytes: 8,
            max_bytes: 64,
            in_place: false,
            calls: vec![
                (8, 1.0),
                (12, 3.0),
                (16, 10.0),
                (40, 20.0),
                (64, 30.0),
                (4, 2.0),
            ],
            wrong: 0,
            error: None,
        };
        let b = bands(&run, &[8, 16, 32, 64]);
        let got: Vec<(u64, usize, f64)> = b
            .iter()
            .map(|b| (b.from_bytes, b.calls, b.median_us))
            .collect();
        // [8,16): 8, 12 and the 4 below the first size; [16,32): 16; [32,64): 40; [64,∞): 64.
        assert_eq!(
            got,
            vec![(8, 3, 2.0), (16, 1, 10.0), (32, 1, 20.0), (64, 1, 30.0)]
        );
        assert_eq!(b[0].p99_us, 3.0);
    }
}
