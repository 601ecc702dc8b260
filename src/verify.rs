//! Exact test data: inputs that depend on rank and index, whose reductions are exact in every
//! element type, and a checker that reports the first few mismatches.
//!
//! Used by the tests, the GPU check, the CLI and the benchmarks (the `#wrong` column), so every
//! path is verified against the same reference. All-ones inputs would hide a chunk delivered to the
//! wrong place; these values differ by rank and by index. They are small integers: float sums of up
//! to 16 ranks stay below 2^8 in magnitude, exact even in bf16, so the expected value does not
//! depend on the order of the additions. fp8 has too few bits for that: its inputs alternate in
//! sign from rank to rank with one magnitude per index (±1, ±2 or ±3), so every partial sum of
//! ranks taken in any cyclic order — the ring's folds start at every rank — stays within ±6,
//! where every integer is exact in e4m3 and e5m2. Products use ±1 and ±2 with at most one 2 in four, so
//! they stay exact (|x| ≤ 2^⌈n/4⌉). Integers wrap, which is exact by definition.
//!
//! The reference folds the inputs rank by rank on the host with [`Element::combine`] and finishes
//! `Avg` with [`Element::average`] — a sequential reduction, independent of the ring.

use crate::element::{Element, ReduceOp};

/// Rank `rank`'s input at `index` for a collective with operator `op`.
pub fn input_value<T: Element>(op: ReduceOp, rank: usize, index: usize) -> T {
    let (r, i) = (rank as i64, index as i64);
    match op {
        ReduceOp::Prod => {
            let sign = if (r * 3 + i) % 5 < 2 { -1 } else { 1 };
            let magnitude = if (r + i) % 4 == 0 { 2 } else { 1 };
            T::from_i64(sign * magnitude)
        }
        _ if T::DTYPE.is_float() && T::DTYPE.size_bytes() == 1 => {
            let sign = if (r + i) % 2 == 0 { 1 } else { -1 };
            T::from_i64(sign * (1 + i % 3))
        }
        _ if T::DTYPE.is_float() => T::from_i64((r * 7 + i * 3) % 17 - 8),
        _ => T::from_i64((r * 131 + i * 7) % 251 - 125),
    }
}

/// The correct result at `index` of an all-reduce over `world` ranks.
pub fn expected_value<T: Element>(op: ReduceOp, world: usize, index: usize) -> T {
    let mut acc = input_value::<T>(op, 0, index);
    for rank in 1..world {
        acc = T::combine(op.combine_op(), acc, input_value(op, rank, index));
    }
    if op == ReduceOp::Avg {
        acc = T::average(acc, world);
    }
    acc
}

/// Fills `buf` with rank `rank`'s inputs.
pub fn fill_input<T: Element>(op: ReduceOp, rank: usize, buf: &mut [T]) {
    for (i, v) in buf.iter_mut().enumerate() {
        *v = input_value(op, rank, i);
    }
}

/// Rank `rank`'s input buffer of `count` elements.
pub fn make_input<T: Element>(op: ReduceOp, rank: usize, count: usize) -> Vec<T> {
    (0..count).map(|i| input_value(op, rank, i)).collect()
}

/// The expected output of `count` elements (the same on every rank).
pub fn make_expected<T: Element>(op: ReduceOp, world: usize, count: usize) -> Vec<T> {
    (0..count).map(|i| expected_value(op, world, i)).collect()
}

/// One wrong element.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    /// The rank whose output holds the wrong element.
    pub rank: usize,
    /// The element's index in that output.
    pub index: usize,
    /// The value found, converted to `f64` for printing.
    pub got: f64,
    /// The value expected, converted to `f64` for printing.
    pub want: f64,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "(rank {}, index {}, got {}, want {})",
            self.rank, self.index, self.got, self.want
        )
    }
}

/// How many elements of `out` differ from `want` (bitwise equality of the element type, so
/// `-0.0 != 0.0` is not forgiven but NaN never appears in these inputs), with the first few.
pub fn compare<T: Element>(
    rank: usize,
    out: &[T],
    want: &[T],
    report: usize,
) -> (usize, Vec<Mismatch>) {
    let mut wrong = 0;
    let mut first = Vec::new();
    for (index, (got, want)) in out.iter().zip(want).enumerate() {
        if bytemuck::bytes_of(got) != bytemuck::bytes_of(want) {
            wrong += 1;
            if first.len() < report {
                first.push(Mismatch {
                    rank,
                    index,
                    got: got.to_f64(),
                    want: want.to_f64(),
                });
            }
        }
    }
    wrong += out.len().abs_diff(want.len());
    (wrong, first)
}

/// f32 test data whose sum depends on the fold order: values of magnitudes 10⁴ apart on odd and
/// even ranks, by rank and index only (element `index` is the same in every message size). Not
/// exact like [`make_input`]: for comparing the bits of two folds, never with a hand-written sum.
pub fn order_sensitive_input(rank: usize, index: usize) -> f32 {
    let h = (index as u64).wrapping_mul(2_654_435_761) ^ (rank as u64).wrapping_mul(40_503);
    let v = (h % 1_000_003) as f32 * 1e-3;
    if rank % 2 == 1 {
        v * 1e4
    } else {
        v + 0.1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    fn exact_in<T: Element>() {
        for world in 1..=16 {
            for op in ReduceOp::ALL {
                for index in 0..64 {
                    // The f64 fold of the same inputs must agree with the typed fold: no rounding.
                    let mut acc = input_value::<T>(op, 0, index).to_f64();
                    for rank in 1..world {
                        let x = input_value::<T>(op, rank, index).to_f64();
                        acc = match op.combine_op() {
                            ReduceOp::Sum => acc + x,
                            ReduceOp::Prod => acc * x,
                            ReduceOp::Min => acc.min(x),
                            _ => acc.max(x),
                        };
                    }
                    if op != ReduceOp::Avg {
                        assert_eq!(
                            expected_value::<T>(op, world, index).to_f64(),
                            acc,
                            "{op} world {world} index {index}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn float_inputs_reduce_exactly() {
        exact_in::<f32>();
        exact_in::<f64>();
        exact_in::<f16>();
        exact_in::<bf16>();
        exact_in::<crate::F8E4M3>();
        exact_in::<crate::F8E5M2>();
    }

    #[test]
    fn fp8_inputs_stay_exact_in_every_cyclic_order() {
        // The ring folds a segment starting at any rank and going round: every run of ranks
        // r, r + 1, … (mod world) must sum exactly in fp8.
        for world in 1..=16 {
            for index in 0..12 {
                for start in 0..world {
                    let mut acc = 0i64;
                    for k in 0..world {
                        let x =
                            input_value::<crate::F8E5M2>(ReduceOp::Sum, (start + k) % world, index);
                        acc += x.to_f64() as i64;
                        let fp8 = crate::F8E5M2::from_f32(acc as f32);
                        assert_eq!(fp8.to_f64(), acc as f64, "world {world} index {index}");
                    }
                }
            }
        }
    }

    #[test]
    fn inputs_differ_by_rank_and_index() {
        let a: Vec<f32> = make_input(ReduceOp::Sum, 0, 8);
        let b: Vec<f32> = make_input(ReduceOp::Sum, 1, 8);
        assert_ne!(a, b);
        assert!(a.windows(2).all(|w| w[0] != w[1]));
    }

    #[test]
    fn compare_reports_the_first_mismatches() {
        let want = vec![1u32, 2, 3, 4];
        let got = vec![1u32, 9, 3, 8];
        let (wrong, first) = compare(2, &got, &want, 1);
        assert_eq!(wrong, 2);
        assert_eq!(
            first,
            vec![Mismatch {
                rank: 2,
                index: 1,
                got: 9.0,
                want: 2.0
            }]
        );
    }
}
