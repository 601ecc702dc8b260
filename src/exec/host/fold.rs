//! The host executor's element folds: `dst = a ⊕ b` and the `Avg` finish, on the CPU.
//!
//! [`HostFolds`] holds them type-erased, monomorphised once per call for its element type, so the
//! stream workers run on bytes and regions like the GPU kernels do. A large fold is split across
//! the rayon pool; every element is combined exactly as [`Element::combine`] says, so the result is
//! the same bits whichever worker computes it.

use crate::element::{Element, ReduceOp};
use rayon::prelude::*;

/// The element folds of one call, type-erased, monomorphised for the call's element type.
#[derive(Clone, Copy)]
pub(super) struct HostFolds {
    /// `reduce(op, dst, a, b, count)`: see [`reduce_raw`].
    pub(super) reduce: unsafe fn(ReduceOp, *mut u8, *const u8, *const u8, usize),
    /// `scale(x, count, world)`: see [`scale_raw`].
    pub(super) scale: unsafe fn(*mut u8, usize, usize),
}

impl HostFolds {
    /// The folds for elements of type `T`.
    pub(super) fn of<T: Element>() -> HostFolds {
        HostFolds {
            reduce: reduce_raw::<T>,
            scale: scale_raw::<T>,
        }
    }
}

/// Below this many elements a reduction runs on the calling worker alone.
const PARALLEL_MIN: usize = 1 << 18;

/// `dst[i] = a[i] ⊕ b[i]` for `count` elements of `T`.
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
        let fold = |(d, s): (&mut T, &T)| *d = T::combine(op, *d, *s);
        if count >= PARALLEL_MIN {
            out.par_iter_mut().zip(b.par_iter()).for_each(fold);
        } else {
            out.iter_mut().zip(b).for_each(fold);
        }
    } else {
        // SAFETY: `a` is disjoint from `dst` (caller's contract), so a shared slice is sound.
        let a = unsafe { std::slice::from_raw_parts(a, count) };
        let combine = |((d, x), y): ((&mut T, &T), &T)| *d = T::combine(op, *x, *y);
        if count >= PARALLEL_MIN {
            out.par_iter_mut()
                .zip(a.par_iter())
                .zip(b.par_iter())
                .for_each(combine);
        } else {
            out.iter_mut().zip(a).zip(b).for_each(combine);
        }
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
