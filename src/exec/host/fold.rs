//! The host executor's element folds: `dst = a ⊕ b`, a meeting's fold of every rank's source,
//! and the `Avg` finish, on the CPU.
//!
//! [`HostFolds`] holds them type-erased, monomorphised once per call for its element type, so the
//! stream workers run on bytes and regions like the GPU kernels do. A large fold is split across
//! the rayon pool; every element is combined exactly as [`Element::combine`] says (a meeting's
//! fold in [`Element::Acc`], as the peer kernels accumulate), so the result is the same bits
//! whichever worker computes it.

use crate::element::{Element, ReduceOp};
use rayon::prelude::*;

/// The element folds of one call, type-erased, monomorphised for the call's element type.
#[derive(Clone, Copy)]
pub(super) struct HostFolds {
    reduce_fn: unsafe fn(ReduceOp, *mut u8, *const u8, *const u8, usize, usize),
    fold_fn: unsafe fn(ReduceOp, &[*mut u8], &[*const u8], usize, usize),
    scale_fn: unsafe fn(*mut u8, usize, usize),
    /// The fewest elements a reduction splits across the rayon pool: [`PARALLEL_MIN`] where a
    /// call's ranks leave cores idle (fewer ranks than cores), never otherwise. Every rank of a
    /// call reduces at the same time, so with as many ranks as cores the cores are busy already,
    /// and handing a rank's reduction to the pool only adds its hand-offs and wake-ups (measured
    /// in docs/PERFORMANCE.md, "Host executor").
    parallel_min: usize,
}

impl HostFolds {
    /// The folds for elements of type `T`, for a call of `world` ranks.
    pub(super) fn of<T: Element>(world: usize) -> HostFolds {
        HostFolds {
            reduce_fn: reduce_raw::<T>,
            fold_fn: fold_raw::<T>,
            scale_fn: scale_raw::<T>,
            parallel_min: if world < super::cores() {
                PARALLEL_MIN
            } else {
                usize::MAX
            },
        }
    }

    /// `dst[i] = a[i] ⊕ b[i]` for `count` elements.
    ///
    /// # Safety
    /// [`reduce_raw`]'s contract.
    pub(super) unsafe fn reduce(
        &self,
        op: ReduceOp,
        dst: *mut u8,
        a: *const u8,
        b: *const u8,
        count: usize,
    ) {
        // SAFETY: the caller's contract.
        unsafe { (self.reduce_fn)(op, dst, a, b, count, self.parallel_min) }
    }

    /// A meeting's fold of every source into every destination.
    ///
    /// # Safety
    /// [`fold_raw`]'s contract.
    pub(super) unsafe fn fold(
        &self,
        op: ReduceOp,
        destinations: &[*mut u8],
        sources: &[*const u8],
        count: usize,
    ) {
        // SAFETY: the caller's contract.
        unsafe { (self.fold_fn)(op, destinations, sources, count, self.parallel_min) }
    }

    /// The `Avg` finish of `count` elements over `world` ranks.
    ///
    /// # Safety
    /// [`scale_raw`]'s contract.
    pub(super) unsafe fn scale(&self, x: *mut u8, count: usize, world: usize) {
        // SAFETY: the caller's contract.
        unsafe { (self.scale_fn)(x, count, world) }
    }
}

/// A pairwise operator as a type: each fold below is compiled once per operator, so its inner
/// loop has no branch on the operator and vectorises (the operator's `match` inside
/// [`Element::combine`] folds away).
trait PairOp: Send + Sync {
    const OP: ReduceOp;
}
struct SumOp;
struct ProdOp;
struct MinOp;
struct MaxOp;
impl PairOp for SumOp {
    const OP: ReduceOp = ReduceOp::Sum;
}
impl PairOp for ProdOp {
    const OP: ReduceOp = ReduceOp::Prod;
}
impl PairOp for MinOp {
    const OP: ReduceOp = ReduceOp::Min;
}
impl PairOp for MaxOp {
    const OP: ReduceOp = ReduceOp::Max;
}

/// `$f::<T, O>(args)` for the operator type `O` of `$op` (`Avg` combines as `Sum`).
macro_rules! by_op {
    ($op:expr, $f:ident::<$t:ty>($($arg:expr),* $(,)?)) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => $f::<$t, SumOp>($($arg),*),
            ReduceOp::Prod => $f::<$t, ProdOp>($($arg),*),
            ReduceOp::Min => $f::<$t, MinOp>($($arg),*),
            ReduceOp::Max => $f::<$t, MaxOp>($($arg),*),
        }
    };
}

/// Below this many elements a reduction runs on the calling worker alone (above, across the rayon
/// pool, where [`HostFolds`] allows it).
const PARALLEL_MIN: usize = 1 << 18;

/// `dst[i] = a[i] ⊕ b[i]` for `count` elements of `T`, across the rayon pool from
/// `parallel_min` elements.
///
/// # Safety
/// `dst`, `a`, `b` point to `count` aligned elements of `T`; `dst == a` or `dst` is disjoint from
/// both; `b` is disjoint from `dst`; no other thread accesses them during the call.
unsafe fn reduce_raw<T: Element>(
    op: ReduceOp,
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    count: usize,
    parallel_min: usize,
) {
    // SAFETY: the caller's contract.
    unsafe { by_op!(op, reduce_with::<T>(dst, a, b, count, parallel_min)) }
}

/// [`reduce_raw`] for the operator `O`.
///
/// # Safety
/// [`reduce_raw`]'s contract.
unsafe fn reduce_with<T: Element, O: PairOp>(
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    count: usize,
    parallel_min: usize,
) {
    let (dst, a, b) = (dst as *mut T, a as *const T, b as *const T);
    // SAFETY: the caller guarantees validity and that `b` does not alias `dst`.
    let (out, b) = unsafe {
        (
            std::slice::from_raw_parts_mut(dst, count),
            std::slice::from_raw_parts(b, count),
        )
    };
    if std::ptr::eq(dst, a) {
        let fold = |(d, s): (&mut T, &T)| *d = T::combine(O::OP, *d, *s);
        if count >= parallel_min {
            out.par_iter_mut().zip(b.par_iter()).for_each(fold);
        } else {
            out.iter_mut().zip(b).for_each(fold);
        }
    } else {
        // SAFETY: `a` is disjoint from `dst` (caller's contract), so a shared slice is sound.
        let a = unsafe { std::slice::from_raw_parts(a, count) };
        let combine = |((d, x), y): ((&mut T, &T), &T)| *d = T::combine(O::OP, *x, *y);
        if count >= parallel_min {
            out.par_iter_mut()
                .zip(a.par_iter())
                .zip(b.par_iter())
                .for_each(combine);
        } else {
            out.iter_mut().zip(a).zip(b).for_each(combine);
        }
    }
}

/// Elements a meeting's fold accumulates at a time (on the stack, in `T::Acc`).
const FOLD_BLOCK: usize = 1024;

/// `dst[i] = sources[0][i] ⊕ sources[1][i] ⊕ … ⊕ sources[n − 1][i]` for every `dst` of
/// `destinations`, folded in source order in `T::Acc` and rounded to `T` once (a meeting: the
/// one-shot's and the two-shot's peer reduction, as the peer kernels fold; the pushed two-shot
/// writes every rank's copy of the segment), its blocks across the rayon pool from `parallel_min`
/// elements.
///
/// Block by block, every source's block is read before the block of any destination is
/// written, and the block is written to every destination while it is in cache; so a
/// destination may be one of the sources (the two-shot in place: every rank's copy of the
/// segment).
///
/// # Safety
/// Every destination and source points to `count` aligned elements of `T`; each destination is
/// disjoint from every other and from every source it is not equal to; no other thread
/// accesses the destinations or writes the sources during the call.
unsafe fn fold_raw<T: Element>(
    op: ReduceOp,
    destinations: &[*mut u8],
    sources: &[*const u8],
    count: usize,
    parallel_min: usize,
) {
    // Addresses, not raw pointers (which are not Send): the workers share them, one block each.
    let destinations: Vec<usize> = destinations.iter().map(|&d| d as usize).collect();
    let sources: Vec<usize> = sources.iter().map(|&s| s as usize).collect();
    let block = |start: usize| {
        // SAFETY: the caller's contract; each block of each destination is written by one call.
        unsafe { by_op!(op, fold_block::<T>(&destinations, &sources, count, start)) }
    };
    let blocks = 0..count.div_ceil(FOLD_BLOCK);
    if count >= parallel_min {
        blocks.into_par_iter().for_each(|b| block(b * FOLD_BLOCK));
    } else {
        blocks.for_each(|b| block(b * FOLD_BLOCK));
    }
}

/// [`fold_raw`] of the block of at most [`FOLD_BLOCK`] elements from `start` (the
/// destinations and sources as addresses).
///
/// # Safety
/// [`fold_raw`]'s contract, `start < count`, and no other thread accesses this block of any
/// destination.
unsafe fn fold_block<T: Element, O: PairOp>(
    destinations: &[usize],
    sources: &[usize],
    count: usize,
    start: usize,
) {
    let (Some((&first, rest)), Some((&dst, copies))) =
        (sources.split_first(), destinations.split_first())
    else {
        return;
    };
    let len = FOLD_BLOCK.min(count - start);
    // SAFETY: every source holds `count` elements of T and [start, start + len) lies inside; no
    // source is written during the call but `dst`'s own block, written below after its last read.
    let read =
        |src: usize| unsafe { std::slice::from_raw_parts((src as *const T).add(start), len) };
    let mut acc = [<T::Acc as bytemuck::Zeroable>::zeroed(); FOLD_BLOCK];
    let acc = &mut acc[..len];
    for (a, &x) in acc.iter_mut().zip(read(first)) {
        *a = x.to_acc();
    }
    for &src in rest {
        for (a, &x) in acc.iter_mut().zip(read(src)) {
            *a = T::Acc::combine(O::OP, *a, x.to_acc());
        }
    }
    // SAFETY: every destination holds `count` elements, this block of each is this call's
    // alone, and the destinations are disjoint from each other.
    let block =
        |at: usize| unsafe { std::slice::from_raw_parts_mut((at as *mut T).add(start), len) };
    let out = block(dst);
    for (d, &a) in out.iter_mut().zip(acc.iter()) {
        *d = T::from_acc(a);
    }
    for &copy in copies {
        block(copy).copy_from_slice(out);
    }
}

/// `x[i] = x[i] / world` (the `Avg` finish).
///
/// # Safety
/// `x` points to `count` aligned elements of `T` that no other thread accesses during the call.
unsafe fn scale_raw<T: Element>(x: *mut u8, count: usize, world: usize) {
    // SAFETY: the caller's contract.
    let xs = unsafe { std::slice::from_raw_parts_mut(x as *mut T, count) };
    for v in xs {
        *v = T::average(*v, world);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three sources of `count` f32, distinct per rank and element, exact in f32.
    fn sources(count: usize) -> Vec<Vec<f32>> {
        (0..3)
            .map(|r| {
                (0..count)
                    .map(|i| ((i * 7 + r * 3) % 1000) as f32)
                    .collect()
            })
            .collect()
    }

    /// The sequential and the pool's fold give the same bits, and the sums, for a count that is
    /// not a multiple of a block; a destination that is a source (in place) included.
    #[test]
    fn folds_on_the_pool_and_alone_agree() {
        let count = 3 * FOLD_BLOCK + 17;
        let want: Vec<f32> = (0..count)
            .map(|i| sources(count).iter().map(|s| s[i]).sum())
            .collect();
        for parallel_min in [0, usize::MAX] {
            let mut srcs = sources(count);
            let mut other = vec![0f32; count];
            let destinations = [srcs[1].as_mut_ptr().cast::<u8>(), other.as_mut_ptr().cast()];
            let sources: Vec<*const u8> = srcs.iter().map(|s| s.as_ptr().cast()).collect();
            // SAFETY: every pointer holds `count` f32; the destinations are disjoint, and the
            // one that is a source is exactly that source.
            unsafe { fold_raw::<f32>(ReduceOp::Sum, &destinations, &sources, count, parallel_min) };
            assert_eq!(srcs[1], want, "in place, parallel from {parallel_min}");
            assert_eq!(other, want, "pushed copy, parallel from {parallel_min}");
        }
    }

    /// The pairwise reduction on the pool and alone, in place and out of place.
    #[test]
    fn reductions_on_the_pool_and_alone_agree() {
        let count = 5 * 1024 + 3;
        let [a, b, _] = <[Vec<f32>; 3]>::try_from(sources(count)).unwrap();
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x.max(*y)).collect();
        for parallel_min in [0, usize::MAX] {
            let mut out = vec![0f32; count];
            let mut inplace = a.clone();
            // SAFETY: each holds `count` f32; `out` is disjoint from `a` and `b`, and `inplace`
            // is `dst == a`, disjoint from `b`.
            unsafe {
                let (o, x, y) = (
                    out.as_mut_ptr().cast(),
                    a.as_ptr().cast(),
                    b.as_ptr().cast(),
                );
                reduce_raw::<f32>(ReduceOp::Max, o, x, y, count, parallel_min);
                let d = inplace.as_mut_ptr().cast::<u8>();
                reduce_raw::<f32>(ReduceOp::Max, d, d.cast_const(), y, count, parallel_min);
            }
            assert_eq!(out, want, "out of place, parallel from {parallel_min}");
            assert_eq!(inplace, want, "in place, parallel from {parallel_min}");
        }
    }
}
