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
//! - fp8 ([`F8E4M3`], [`F8E5M2`]: NVIDIA's and NCCL's `e4m3`/`e5m2`, as in the OCP 8-bit float
//!   formats): widened to f32 exactly; a fold of many contributions at once (the one-shot, the
//!   two-shot, the LL kernel, the host's meetings) **accumulates in f32 and rounds once**, a
//!   pairwise step (the ring's reduce) rounds after its one operation — every buffer between two
//!   steps holds fp8. Rounding is to nearest, ties to even, and **saturating**: a result beyond
//!   the largest finite value (±448 for e4m3, ±57344 for e5m2), infinities included, becomes that
//!   value with its sign, as CUDA's fp8 types convert by default (`__NV_SATFINITE`); a NaN
//!   result is `0x7f`, whatever its sign. e4m3 has no infinity; an e5m2 infinity in an input saturates
//!   at the first step that rounds it. `Prod` is defined (f32 products, rounded as above) but
//!   rarely meaningful at 3–4 bits of precision. Min/Max as for the other floats.

use half::{bf16, f16};
use std::fmt;

/// Runs `$body` with `$t` the element type of the runtime [`DType`] `$dtype`: the one place a
/// runtime type meets the generic calls (the CLI, the C library and the Python package use it).
///
/// ```
/// let bytes = ringreduce::with_element!(ringreduce::DType::BF16, T => std::mem::size_of::<T>());
/// assert_eq!(bytes, 2);
/// ```
#[macro_export]
macro_rules! with_element {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            $crate::DType::F16 => {
                type $t = $crate::half::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $t = $crate::half::bf16;
                $body
            }
            $crate::DType::F32 => {
                type $t = f32;
                $body
            }
            $crate::DType::F64 => {
                type $t = f64;
                $body
            }
            $crate::DType::I8 => {
                type $t = i8;
                $body
            }
            $crate::DType::U8 => {
                type $t = u8;
                $body
            }
            $crate::DType::I32 => {
                type $t = i32;
                $body
            }
            $crate::DType::U32 => {
                type $t = u32;
                $body
            }
            $crate::DType::I64 => {
                type $t = i64;
                $body
            }
            $crate::DType::U64 => {
                type $t = u64;
                $body
            }
            $crate::DType::F8E4M3 => {
                type $t = $crate::F8E4M3;
                $body
            }
            $crate::DType::F8E5M2 => {
                type $t = $crate::F8E5M2;
                $body
            }
        }
    };
}

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
    /// 8-bit float, 4 exponent bits, 3 mantissa bits, no infinity ([`F8E4M3`]; NCCL's
    /// `ncclFloat8e4m3`).
    F8E4M3,
    /// 8-bit float, 5 exponent bits, 2 mantissa bits ([`F8E5M2`]; NCCL's `ncclFloat8e5m2`).
    F8E5M2,
}

impl DType {
    /// Every type, in a fixed order (tests and the CLI iterate over it).
    pub const ALL: [DType; 12] = [
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
        DType::F8E4M3,
        DType::F8E5M2,
    ];

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::F8E4M3 | DType::F8E5M2 => 1,
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
            DType::F8E4M3 => "f8e4m3",
            DType::F8E5M2 => "f8e5m2",
        }
    }

    /// True for the floating-point types (f16, bf16, f32, f64 and the two fp8 types).
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::F8E4M3 | DType::F8E5M2
        )
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
/// Implemented for `f16`, `bf16`, `f32`, `f64`, `i8`, `u8`, `i32`, `u32`, `i64`, `u64`,
/// [`F8E4M3`] and [`F8E5M2`]; sealed.
pub trait Element: bytemuck::Pod + Send + Sync + PartialEq + fmt::Debug + sealed::Sealed {
    /// The runtime tag of this type.
    const DTYPE: DType;
    /// The type a fold of many contributions accumulates in: `f32` for the fp8 types, the type
    /// itself for every other (see the module doc).
    type Acc: Element;
    /// `self` in the accumulating type (exact).
    fn to_acc(self) -> Self::Acc;
    /// An accumulated value rounded back to this type (see the module doc).
    fn from_acc(acc: Self::Acc) -> Self;
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
            type Acc = $t;
            #[inline]
            fn to_acc(self) -> $t {
                self
            }
            #[inline]
            fn from_acc(acc: $t) -> $t {
                acc
            }
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
            type Acc = $t;
            #[inline]
            fn to_acc(self) -> $t {
                self
            }
            #[inline]
            fn from_acc(acc: $t) -> $t {
                acc
            }
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
            type Acc = $t;
            #[inline]
            fn to_acc(self) -> $t {
                self
            }
            #[inline]
            fn from_acc(acc: $t) -> $t {
                acc
            }
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

/// The bit layout of one fp8 format: mantissa bits, exponent bias, the largest finite pattern
/// and the NaN pattern (both without the sign), and the exponent field of infinity and NaN where
/// the format has IEEE specials (e5m2) — e4m3 has only one NaN pattern per sign and no infinity.
struct Fp8Format {
    mantissa_bits: u32,
    bias: i32,
    max_finite: u8,
    nan: u8,
    ieee_specials: bool,
}

const E4M3: Fp8Format = Fp8Format {
    mantissa_bits: 3,
    bias: 7,
    max_finite: 0x7e,
    nan: 0x7f,
    ieee_specials: false,
};

const E5M2: Fp8Format = Fp8Format {
    mantissa_bits: 2,
    bias: 15,
    max_finite: 0x7b,
    nan: 0x7f,
    ieee_specials: true,
};

/// 2^k for a k whose power is a normal f32 (−126 ≤ k ≤ 127), exactly.
fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

impl Fp8Format {
    /// The value of `bits` (exact: every fp8 value is an f32).
    fn decode(&self, bits: u8) -> f32 {
        let sign = if bits & 0x80 != 0 { -1.0f32 } else { 1.0 };
        let magnitude = bits & 0x7f;
        let exponent = (magnitude >> self.mantissa_bits) as i32;
        let mantissa = (magnitude & ((1 << self.mantissa_bits) - 1)) as f32;
        let top = 0x7f >> self.mantissa_bits;
        if self.ieee_specials && exponent == top {
            return if mantissa == 0.0 {
                sign * f32::INFINITY
            } else {
                f32::NAN
            };
        }
        if !self.ieee_specials && magnitude == self.nan {
            return f32::NAN;
        }
        let quantum = |e: i32| pow2(e - self.bias - self.mantissa_bits as i32);
        if exponent == 0 {
            // Subnormal: mantissa × 2^(1 − bias − mantissa_bits).
            sign * mantissa * quantum(1)
        } else {
            sign * ((1 << self.mantissa_bits) as f32 + mantissa) * quantum(exponent)
        }
    }

    /// `x` rounded to nearest, ties to even, saturating (see the module doc).
    fn encode(&self, x: f32) -> u8 {
        if x.is_nan() {
            // One NaN, whatever the sign: f32 arithmetic on the host and on the GPU disagrees
            // on the sign of a NaN it makes (∞ − ∞), so the sign cannot be kept alike.
            return self.nan;
        }
        let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
        let a = x.abs();
        if a.is_infinite() {
            return sign | self.max_finite;
        }
        // a = 2^e × 1.f with e its unbiased exponent (f32 subnormals have e = −127 here, far
        // below every fp8 value: they round to zero below). The quantum of the fp8 binade holding
        // a — or of the subnormals, below the smallest normal — is 2^(e − mantissa_bits), and
        // a / quantum is exact (a power-of-two scaling of an f32 that stays normal).
        let e = ((a.to_bits() >> 23) & 0xff) as i32 - 127;
        let min_normal = 1 - self.bias;
        let binade = e.max(min_normal);
        let quantum = pow2(binade - self.mantissa_bits as i32);
        let steps = (a / quantum).round_ties_even() as u32;
        // steps counts quanta: for a normal result 2^m ≤ steps ≤ 2^(m+1) (the top end carries
        // into the next binade, which the encoding below absorbs: exponent field + 1, mantissa 0);
        // for a subnormal one steps < 2^m, or = 2^m for the smallest normal — the same encoding.
        let field = (binade - min_normal) as u32; // 0 for subnormals and the smallest binade
        let bits = (field << self.mantissa_bits) + steps;
        sign | bits.min(self.max_finite as u32) as u8
    }
}

macro_rules! fp8_element {
    ($($(#[$doc:meta])* $t:ident => $d:ident, $format:ident;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
        #[repr(transparent)]
        pub struct $t(u8);

        impl $t {
            /// The element whose bit pattern is `bits`.
            pub const fn from_bits(bits: u8) -> $t {
                $t(bits)
            }
            /// The bit pattern.
            pub const fn to_bits(self) -> u8 {
                self.0
            }
            /// `x` rounded to nearest, ties to even, saturating (the module doc).
            pub fn from_f32(x: f32) -> $t {
                $t($format.encode(x))
            }
            /// The value, exactly.
            pub fn to_f32(self) -> f32 {
                $format.decode(self.0)
            }
        }

        /// Equality of values, as for the other floats: a NaN equals nothing, −0 equals +0.
        impl PartialEq for $t {
            fn eq(&self, other: &$t) -> bool {
                self.to_f32() == other.to_f32()
            }
        }

        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:#04x} = {})", stringify!($t), self.0, self.to_f32())
            }
        }

        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            type Acc = f32;
            #[inline]
            fn to_acc(self) -> f32 {
                self.to_f32()
            }
            #[inline]
            fn from_acc(acc: f32) -> $t {
                $t::from_f32(acc)
            }
            #[inline]
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                $t::from_f32(f32::combine(op, a.to_f32(), b.to_f32()))
            }
            #[inline]
            fn average(x: Self, world: usize) -> Self {
                $t::from_f32(f32::average(x.to_f32(), world))
            }
            #[inline]
            fn from_i64(v: i64) -> Self {
                $t::from_f32(v as f32)
            }
            #[inline]
            fn to_f64(self) -> f64 {
                self.to_f32() as f64
            }
        }
    )*};
}

fp8_element! {
    /// An 8-bit float with 4 exponent bits (bias 7) and 3 mantissa bits: NVIDIA's
    /// `__nv_fp8_e4m3`, NCCL's `ncclFloat8e4m3`, PyTorch's `float8_e4m3fn`. Largest finite
    /// ±448, smallest subnormal 2⁻⁹, no infinity, NaN `0x7f`/`0xff`. Conversions and arithmetic:
    /// the module doc.
    F8E4M3 => F8E4M3, E4M3;
    /// An 8-bit float with 5 exponent bits (bias 15) and 2 mantissa bits: NVIDIA's
    /// `__nv_fp8_e5m2`, NCCL's `ncclFloat8e5m2`, PyTorch's `float8_e5m2`. Largest finite
    /// ±57344, smallest subnormal 2⁻¹⁶, infinities `0x7c`/`0xfc`. Conversions and arithmetic:
    /// the module doc.
    F8E5M2 => F8E5M2, E5M2;
}

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

    /// Every finite fp8 value in increasing order, with its pattern (from the decoding).
    fn finite_ascending(decode: fn(u8) -> f32) -> Vec<(f32, u8)> {
        let mut values: Vec<(f32, u8)> = (0..=255u8)
            .map(|b| (decode(b), b))
            .filter(|(v, b)| v.is_finite() && *b != 0x80)
            .collect();
        values.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
        values
    }

    #[test]
    fn fp8_decodes_the_formats_anchor_values() {
        let e4 = |b: u8| F8E4M3::from_bits(b).to_f32();
        let e5 = |b: u8| F8E5M2::from_bits(b).to_f32();
        assert_eq!(e4(0x7e), 448.0);
        assert_eq!(e4(0xfe), -448.0);
        assert_eq!(e4(0x01), 2f32.powi(-9));
        assert_eq!(e4(0x08), 2f32.powi(-6));
        assert_eq!(e4(0x38), 1.0);
        assert_eq!(e4(0x3c), 1.5);
        assert!(e4(0x7f).is_nan() && e4(0xff).is_nan());
        assert_eq!(e5(0x7b), 57344.0);
        assert_eq!(e5(0x01), 2f32.powi(-16));
        assert_eq!(e5(0x04), 2f32.powi(-14));
        assert_eq!(e5(0x3c), 1.0);
        assert_eq!(e5(0x7c), f32::INFINITY);
        assert_eq!(e5(0xfc), f32::NEG_INFINITY);
        assert!(e5(0x7d).is_nan() && e5(0x7e).is_nan() && e5(0x7f).is_nan());
        // 254 finite non-NaN patterns (±0 counted twice) in e4m3, 248 in e5m2 (±inf, 6 NaNs).
        assert_eq!((0..=255u8).filter(|&b| e4(b).is_finite()).count(), 254);
        assert_eq!((0..=255u8).filter(|&b| e5(b).is_finite()).count(), 248);
    }

    fn fp8_rounds_to_nearest_even_and_saturates(
        decode: fn(u8) -> f32,
        encode: fn(f32) -> u8,
        max: f32,
    ) {
        let values = finite_ascending(decode);
        // Every value round-trips (−0 included).
        for b in 0..=255u8 {
            if decode(b).is_finite() {
                assert_eq!(encode(decode(b)), b, "{b:#04x}");
            }
        }
        // Between neighbours: just above the lower one and just below the upper one go to the
        // nearer; the midpoint goes to the one whose pattern is even.
        for w in values.windows(2) {
            let ((lo, lo_bits), (hi, mut hi_bits)) = (w[0], w[1]);
            if hi == 0.0 {
                hi_bits = 0x80; // a negative value rounding to zero keeps its sign
            }
            let mid = (lo + hi) / 2.0; // exact: both have few bits
            let even = if lo_bits & 1 == 0 { lo_bits } else { hi_bits };
            assert_eq!(encode(mid), even, "midpoint of {lo} and {hi}");
            let nudge = |x: f32, up: bool| {
                let b = x.to_bits() as i64;
                let step = if (x > 0.0) == up { 1 } else { -1 };
                f32::from_bits((b + step) as u32)
            };
            if mid != 0.0 {
                assert_eq!(encode(nudge(mid, false)), lo_bits, "below {mid}");
                assert_eq!(encode(nudge(mid, true)), hi_bits, "above {mid}");
            }
        }
        // Saturation: beyond the largest finite value, infinities included; NaN stays NaN.
        let (max_bits, min_bits) = (encode(max), encode(-max));
        for x in [max * 1.0625, max * 2.0, 1e30, f32::MAX, f32::INFINITY] {
            assert_eq!(encode(x), max_bits, "{x}");
            assert_eq!(encode(-x), min_bits, "-{x}");
        }
        assert_eq!(encode(f32::NAN), 0x7f);
        assert_eq!(encode(-f32::NAN), 0x7f);
        // Far below the smallest subnormal: a signed zero.
        assert_eq!(encode(1e-30), 0x00);
        assert_eq!(encode(-1e-30), 0x80);
        assert_eq!(encode(f32::from_bits(1)), 0x00);
    }

    #[test]
    fn fp8_rounds_to_nearest_even_and_saturates_e4m3() {
        fp8_rounds_to_nearest_even_and_saturates(
            |b| F8E4M3::from_bits(b).to_f32(),
            |x| F8E4M3::from_f32(x).to_bits(),
            448.0,
        );
    }

    #[test]
    fn fp8_rounds_to_nearest_even_and_saturates_e5m2() {
        fp8_rounds_to_nearest_even_and_saturates(
            |b| F8E5M2::from_bits(b).to_f32(),
            |x| F8E5M2::from_f32(x).to_bits(),
            57344.0,
        );
    }

    #[test]
    fn fp8_steps_round_once_and_accumulate_in_f32() {
        let e4 = F8E4M3::from_f32;
        // 16 + 1 = 17 is a tie between 16 and 18 in e4m3: ties go to 16 (even pattern).
        assert_eq!(F8E4M3::combine(ReduceOp::Sum, e4(16.0), e4(1.0)), e4(16.0));
        // A fold in f32: 16 + 1 + 1 = 18, exactly; pairwise it would stay at 16.
        let acc = [e4(16.0), e4(1.0), e4(1.0)]
            .into_iter()
            .map(Element::to_acc)
            .reduce(|a, b| f32::combine(ReduceOp::Sum, a, b))
            .unwrap();
        assert_eq!(F8E4M3::from_acc(acc), e4(18.0));
        assert_eq!(
            F8E4M3::combine(ReduceOp::Max, e4(-0.0), e4(0.0)).to_bits(),
            0x00
        );
        assert_eq!(
            F8E4M3::combine(ReduceOp::Min, e4(0.0), e4(-0.0)).to_bits(),
            0x80
        );
        assert_eq!(F8E4M3::average(e4(6.0), 4), e4(1.5));
        assert_eq!(
            F8E4M3::combine(ReduceOp::Prod, e4(300.0), e4(2.0)),
            e4(448.0)
        );
        // e5m2: an infinity saturates at the first rounding step.
        let inf = F8E5M2::from_bits(0x7c);
        assert_eq!(
            F8E5M2::combine(ReduceOp::Sum, inf, F8E5M2::from_f32(1.0)).to_bits(),
            0x7b
        );
    }
}
