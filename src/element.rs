//! Element types and reduction operators.
//!
//! A collective moves elements of one [`Element`] type and combines them with one [`ReduceOp`].
//! Every element type is plain old data (`bytemuck::Pod`), so buffers can be viewed as bytes for
//! copies and handed to CUDA kernels without conversion.
//!
//! Semantics, the same on every executor (host and GPU):
//! - integers: `Sum` and `Prod` wrap on overflow (two's complement, like CUDA's `+` and `*`);
//!   `Avg` is the wrapped sum divided by the world size as integers of unbounded width, truncated
//!   toward zero (so `i8` avg over 128 ranks of a wrapped sum of −128 is −1, and over 200 ranks
//!   of 100 is 0): the quotient always fits the type, whatever the world size.
//! - floats (f16, bf16, f32, f64): IEEE arithmetic; f16 and bf16 are combined in f32 and rounded
//!   back to nearest-even after every step. `Min`/`Max` are IEEE 754-2019 `minimumNumber` /
//!   `maximumNumber`: a NaN operand loses to a number (like C's `fmin`/`fmax`), and −0 is
//!   smaller than +0 (`min(−0, +0) = −0`, `max(−0, +0) = +0`, in either order), so the result's
//!   bits never depend on which operand came first. `Avg` is the sum multiplied by `1/world`.

use half::{bf16, f16};
use std::fmt;

/// The element types ringreduce reduces, as a runtime tag (used by plans, kernels and the CLI).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE half precision ([`half::f16`]), 2 bytes.
    F16,
    /// bfloat16 ([`half::bf16`]), 2 bytes.
    BF16,
    /// IEEE single precision, 4 bytes.
    F32,
    /// IEEE double precision, 8 bytes.
    F64,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
}

impl DType {
    /// Every type, in a fixed order (tests and the CLI iterate over it).
    pub const ALL: [DType; 10] = [
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
    ];

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// The short name used in kernel symbols, CLI flags and reports (`f32`, `bf16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::U64 => "u64",
        }
    }

    /// True for f16, bf16, f32 and f64.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// Parses a name produced by [`DType::name`].
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|t| t.name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How contributions are combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ReduceOp {
    /// Sum of the contributions (wrapping for integers); the default.
    #[default]
    Sum,
    /// Product of the contributions (wrapping for integers).
    Prod,
    /// Smallest contribution (for floats, a NaN loses to a number; see the module doc).
    Min,
    /// Largest contribution (for floats, a NaN loses to a number; see the module doc).
    Max,
    /// Sum, then divided by the number of ranks (see the module doc for integers).
    Avg,
}

impl ReduceOp {
    /// Every operator, in a fixed order.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// The short name used in kernel symbols, CLI flags and reports.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    /// Parses a name produced by [`ReduceOp::name`].
    pub fn from_name(name: &str) -> Option<ReduceOp> {
        ReduceOp::ALL.into_iter().find(|o| o.name() == name)
    }

    /// The pairwise operator applied at each ring step (`Avg` combines as `Sum`).
    pub const fn combine_op(self) -> ReduceOp {
        match self {
            ReduceOp::Avg => ReduceOp::Sum,
            op => op,
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An element type that ringreduce can reduce.
///
/// Implemented for `f16`, `bf16`, `f32`, `f64`, `i8`, `u8`, `i32`, `u32`, `i64`, `u64`; sealed.
pub trait Element: bytemuck::Pod + Send + Sync + PartialEq + fmt::Debug + sealed::Sealed {
    /// The runtime tag of this type.
    const DTYPE: DType;
    /// `a ⊕ b` for a pairwise operator (`Sum`, `Prod`, `Min`, `Max`; `Avg` is never passed).
    fn combine(op: ReduceOp, a: Self, b: Self) -> Self;
    /// The final step of `Avg`: `x / world`, as the module doc defines it.
    fn average(x: Self, world: usize) -> Self;
    /// `v` converted like an `as` cast (integers wrap; floats round to nearest). Small integers
    /// are exact in every type, which is what tests and benchmarks build their inputs from.
    fn from_i64(v: i64) -> Self;
    /// The value as f64 (exact for every type but 64-bit integers beyond 2^53), for reports.
    fn to_f64(self) -> f64;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! int_element {
    ($($t:ty => $d:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            #[inline]
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                }
            }
            #[inline]
            fn average(x: Self, world: usize) -> Self {
                // In i128 every value of every integer type and every world size fit, and
                // |x / world| ≤ |x|, so the quotient casts back to the type exactly.
                (x as i128 / world.max(1) as i128) as $t
            }
            #[inline]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            #[inline]
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    )*};
}
int_element!(i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64);

macro_rules! ieee_min_max {
    ($($t:ty),*) => {$(
        impl MinMaxNumber for $t {
            #[inline]
            fn minimum_number(a: $t, b: $t) -> $t {
                if a.is_nan() {
                    b
                } else if b.is_nan() || a < b || (a == b && a.is_sign_negative()) {
                    a
                } else {
                    b
                }
            }
            #[inline]
            fn maximum_number(a: $t, b: $t) -> $t {
                if a.is_nan() {
                    b
                } else if b.is_nan() || a > b || (a == b && a.is_sign_positive()) {
                    a
                } else {
                    b
                }
            }
        }
    )*};
}

/// IEEE 754-2019 `minimumNumber` / `maximumNumber` (the module doc's `Min` / `Max` for floats).
trait MinMaxNumber: Sized {
    fn minimum_number(a: Self, b: Self) -> Self;
    fn maximum_number(a: Self, b: Self) -> Self;
}
ieee_min_max!(f32, f64);

#[inline]
fn minimum_number<T: MinMaxNumber>(a: T, b: T) -> T {
    T::minimum_number(a, b)
}

#[inline]
fn maximum_number<T: MinMaxNumber>(a: T, b: T) -> T {
    T::maximum_number(a, b)
}

macro_rules! float_element {
    ($($t:ty => $d:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            #[inline]
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a + b,
                    ReduceOp::Prod => a * b,
                    ReduceOp::Min => minimum_number(a, b),
                    ReduceOp::Max => maximum_number(a, b),
                }
            }
            #[inline]
            fn average(x: Self, world: usize) -> Self {
                x * (1.0 / world.max(1) as $t)
            }
            #[inline]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            #[inline]
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    )*};
}
float_element!(f32 => F32, f64 => F64);

macro_rules! half_element {
    ($($t:ty => $d:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            #[inline]
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                <$t>::from_f32(f32::combine(op, a.to_f32(), b.to_f32()))
            }
            #[inline]
            fn average(x: Self, world: usize) -> Self {
                <$t>::from_f32(f32::average(x.to_f32(), world))
            }
            #[inline]
            fn from_i64(v: i64) -> Self {
                <$t>::from_f32(v as f32)
            }
            #[inline]
            fn to_f64(self) -> f64 {
                self.to_f64()
            }
        }
    )*};
}
half_element!(f16 => F16, bf16 => BF16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in DType::ALL {
            assert_eq!(DType::from_name(t.name()), Some(t));
        }
        for o in ReduceOp::ALL {
            assert_eq!(ReduceOp::from_name(o.name()), Some(o));
        }
        assert_eq!(DType::from_name("f128"), None);
    }

    #[test]
    fn integer_semantics_wrap_and_truncate() {
        assert_eq!(u8::combine(ReduceOp::Sum, 250, 10), 4);
        assert_eq!(i8::combine(ReduceOp::Prod, 64, 4), 0);
        assert_eq!(i32::average(-7, 2), -3);
        assert_eq!(u32::combine(ReduceOp::Min, 3, 9), 3);
    }

    #[test]
    fn integer_avg_divides_in_full_width_for_any_world() {
        // 128 ranks of 1 wrap to −128 in i8: −128 / 128 = −1, not −128 / (128 as i8).
        assert_eq!(i8::average(-128, 128), -1);
        // [100, 0, …] over 128 ranks: 100 / 128 truncates to 0.
        assert_eq!(i8::average(100, 128), 0);
        assert_eq!(u8::average(255, 256), 0);
        assert_eq!(u8::average(255, 255), 1);
        assert_eq!(i64::average(i64::MIN, 1), i64::MIN);
        assert_eq!(i64::average(i64::MIN, usize::MAX), 0);
        assert_eq!(u64::average(u64::MAX, 1), u64::MAX);
        assert_eq!(i32::average(7, 0), 7);
    }

    #[test]
    fn float_min_max_order_signed_zeros_and_skip_nan() {
        let bits = |x: f32| x.to_bits();
        for (a, b) in [(-0.0f32, 0.0f32), (0.0, -0.0)] {
            assert_eq!(bits(f32::combine(ReduceOp::Min, a, b)), bits(-0.0));
            assert_eq!(bits(f32::combine(ReduceOp::Max, a, b)), bits(0.0));
            assert_eq!(
                f64::combine(ReduceOp::Min, a as f64, b as f64).to_bits(),
                (-0.0f64).to_bits()
            );
            assert_eq!(
                f64::combine(ReduceOp::Max, a as f64, b as f64).to_bits(),
                0.0f64.to_bits()
            );
            let (ha, hb) = (f16::from_f32(a), f16::from_f32(b));
            assert_eq!(
                f16::combine(ReduceOp::Min, ha, hb).to_bits(),
                f16::NEG_ZERO.to_bits()
            );
            assert_eq!(
                bf16::combine(ReduceOp::Max, bf16::from_f32(a), bf16::from_f32(b)).to_bits(),
                bf16::ZERO.to_bits()
            );
        }
        assert_eq!(f32::combine(ReduceOp::Min, f32::NAN, 2.0), 2.0);
        assert_eq!(f32::combine(ReduceOp::Max, 2.0, f32::NAN), 2.0);
        assert!(f32::combine(ReduceOp::Min, f32::NAN, f32::NAN).is_nan());
        assert_eq!(f32::combine(ReduceOp::Max, -1.0, 3.0), 3.0);
        assert_eq!(f32::combine(ReduceOp::Min, -1.0, 3.0), -1.0);
    }

    #[test]
    fn half_types_round_through_f32() {
        let a = bf16::from_f32(1.0);
        let b = bf16::from_f32(2.0);
        assert_eq!(bf16::combine(ReduceOp::Sum, a, b), bf16::from_f32(3.0));
        assert_eq!(f16::average(f16::from_f32(6.0), 3), f16::from_f32(2.0));
    }
}
