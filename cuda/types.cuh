// A part of the kernel source of ringreduce: the element types and their operations.
//
// Joined into one translation unit by build.rs, in the order of its PARTS (error_codes.cuh
// first). No part includes another: NVRTC compiles the joined text with no include paths, so the
// kernels include NO header at all.
//
// The kernels (pairwise reduce, Avg-scale, one-shot and two-shot all-reduce) are compiled by
// one of two compilers: build.rs compiles the joined text with nvcc into a fatbin (SASS for sm_80
// and sm_90, PTX for compute_90) when nvcc is present, and src/exec/cuda/kernels/ otherwise
// compiles the same text with NVRTC at first use. So f16 and bf16 travel as their 16-bit
// patterns (`unsigned short`) and are converted to and from f32 here.
//
// Semantics are those of the module doc of src/element.rs, bit for bit where IEEE fixes them:
// - integers: sum and prod wrap (computed in the unsigned type of the same width, so signed
//   overflow is never undefined behaviour); min/max compare in the element's own type.
// - f32, f64: IEEE `+`, `*`; min/max are IEEE 754-2019 minimumNumber / maximumNumber (a NaN
//   operand loses to a number; -0 < +0), written out below rather than fminf/fmaxf, which leave
//   the sign of a zero result unspecified.
// - f16, bf16: both operands widened to f32 (exactly), combined in f32, rounded back to
//   nearest-even after every operation; NaN stays NaN.
// - fp8 (e4m3, e5m2): widened to f32 exactly; a pairwise operation rounds once, and a fold of
//   many sources (the peer kernels) accumulates in f32 and rounds once at the end (each type's
//   AccD). Rounding to nearest even, saturating: beyond the largest finite value, infinities
//   included, gives that value with its sign; a NaN gives 0x7f. The same code as src/element.rs.
// - Avg: floats multiply by 1/world (f64 for f64, f32 for the others, computed from world.max(1)),
//   integers divide by world.max(1) in 64 bits, truncating, signed types as signed (the quotient
//   always fits the type; world itself may not).
//
// This part holds the element conversions, the per-type operation structs (rr_<type>), the four
// pairwise operators (rr_op_<op>) and the small helpers every kernel body shares.

typedef unsigned long long rr_ull;  // counts and addresses

// ---------------------------------------------------------------------------------------------
// Element conversions for the 16-bit float types.
// ---------------------------------------------------------------------------------------------

struct rr_cvt_f16 {
    typedef unsigned short Bits;
    // Exact: every f16 is an f32.
    static __device__ __forceinline__ float to_f32(unsigned short h) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return f;
    }
    // Round to nearest even; subnormals kept (no .ftz); NaN gives a NaN.
    static __device__ __forceinline__ unsigned short from_f32(float f) {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return h;
    }
};

struct rr_cvt_bf16 {
    typedef unsigned short Bits;
    // Exact: a bf16 is the top half of an f32.
    static __device__ __forceinline__ float to_f32(unsigned short h) {
        return __uint_as_float(((unsigned)h) << 16);
    }
    // Round to nearest even (add 0x7fff plus the kept lowest bit, then truncate); a NaN keeps
    // its top mantissa bits and gets the quiet bit, as half::bf16::from_f32 does on the host.
    static __device__ __forceinline__ unsigned short from_f32(float f) {
        const unsigned x = __float_as_uint(f);
        if ((x & 0x7fffffffu) > 0x7f800000u) {
            return (unsigned short)((x >> 16) | 0x0040u);
        }
        return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
    }
};

// fp8 with M mantissa bits and exponent bias BIAS: MAXF is the largest finite pattern (no sign);
// IEEE says whether the top exponent holds infinities and NaNs (e5m2) or only the NaN 0x7f
// (e4m3). Mirrors Fp8Format in src/element.rs step by step.
template <unsigned M, int BIAS, unsigned MAXF, bool IEEE>
struct rr_cvt_fp8 {
    typedef unsigned char Bits;
    // 2^k for -126 <= k <= 127, exactly.
    static __device__ __forceinline__ float pow2(int k) {
        return __uint_as_float((unsigned)(k + 127) << 23);
    }
    static __device__ __forceinline__ float to_f32(unsigned char b) {
        const float sign = (b & 0x80u) ? -1.0f : 1.0f;
        const unsigned mag = b & 0x7fu;
        const int e = (int)(mag >> M);
        const float m = (float)(mag & ((1u << M) - 1u));
        if (IEEE && e == (int)(0x7fu >> M)) {
            return m == 0.0f ? sign * __uint_as_float(0x7f800000u) : __uint_as_float(0x7fc00000u);
        }
        if (!IEEE && mag == 0x7fu) {
            return __uint_as_float(0x7fc00000u);
        }
        if (e == 0) {
            return sign * m * pow2(1 - BIAS - (int)M);
        }
        return sign * ((float)(1u << M) + m) * pow2(e - BIAS - (int)M);
    }
    static __device__ __forceinline__ unsigned char from_f32(float x) {
        const unsigned xb = __float_as_uint(x);
        const unsigned sign = (xb >> 24) & 0x80u;
        const unsigned abits = xb & 0x7fffffffu;
        if (abits > 0x7f800000u) {
            return 0x7fu;
        }
        if (abits == 0x7f800000u) {
            return (unsigned char)(sign | MAXF);
        }
        // The binade of |x| (or the subnormals'), its quantum 2^(binade - M), and |x| in quanta
        // (an exact power-of-two scaling), rounded to nearest even.
        const int e = (int)(abits >> 23) - 127;
        const int min_normal = 1 - BIAS;
        const int binade = e > min_normal ? e : min_normal;
        const unsigned steps = __float2uint_rn(__uint_as_float(abits) * pow2((int)M - binade));
        const unsigned bits = ((unsigned)(binade - min_normal) << M) + steps;
        return (unsigned char)(sign | (bits < MAXF ? bits : MAXF));
    }
};
typedef rr_cvt_fp8<3, 7, 0x7eu, false> rr_cvt_e4m3;
typedef rr_cvt_fp8<2, 15, 0x7bu, true> rr_cvt_e5m2;

// minimumNumber / maximumNumber, the same decisions as src/element.rs in the same order.
static __device__ __forceinline__ bool rr_negative(float a) { return __float_as_int(a) < 0; }
static __device__ __forceinline__ bool rr_negative(double a) { return __double_as_longlong(a) < 0; }
template <typename F>
static __device__ __forceinline__ F rr_fmin(F a, F b) {
    if (a != a) return b;
    return (b != b || a < b || (a == b && rr_negative(a))) ? a : b;
}
template <typename F>
static __device__ __forceinline__ F rr_fmax(F a, F b) {
    if (a != a) return b;
    return (b != b || a > b || (a == b && !rr_negative(a))) ? a : b;
}

// ---------------------------------------------------------------------------------------------
// Per-type operations. Each type struct names its storage type T, the type of the Avg factor
// (Scale), sum / prod / min / max / scale_param / scale, and the type struct a fold of many
// sources accumulates in (AccD: itself, but f32 for fp8) with widen / narrow between the two.
// ---------------------------------------------------------------------------------------------

// Integers: S is the element type, U the unsigned type of the same width, W the 64-bit type of
// S's signedness, in which Avg divides.
template <typename S, typename U, typename W>
struct rr_int {
    typedef S T;
    typedef W Scale;  // the divisor
    typedef rr_int AccD;
    static __device__ __forceinline__ T widen(T x) { return x; }
    static __device__ __forceinline__ T narrow(T x) { return x; }
    static __device__ __forceinline__ T sum(T a, T b) { return (T)(U)((U)a + (U)b); }
    static __device__ __forceinline__ T prod(T a, T b) { return (T)(U)((U)a * (U)b); }
    static __device__ __forceinline__ T min(T a, T b) { return b < a ? b : a; }
    static __device__ __forceinline__ T max(T a, T b) { return a < b ? b : a; }
    // world.max(1) in 64 bits (worlds are at most 128 ranks, so the signed cast is exact): the
    // quotient's magnitude is at most x's, so it casts back to T exactly.
    static __device__ __forceinline__ Scale scale_param(rr_ull world) {
        return (W)(world < 1 ? 1 : world);
    }
    static __device__ __forceinline__ T scale(T x, Scale divisor) { return (T)((W)x / divisor); }
    // PreMulSum's factor, an element itself: multiplied as prod is, wrapping.
    typedef U Mul;
    static __device__ __forceinline__ Mul mul_param(T s) { return (U)s; }
    static __device__ __forceinline__ T mul(T x, Mul m) { return (T)(U)((U)x * m); }
};

// f32 and f64: F is the element type and its compute type.
template <typename F>
struct rr_float {
    typedef F T;
    typedef F Scale;  // 1/world
    typedef rr_float AccD;
    static __device__ __forceinline__ T widen(T x) { return x; }
    static __device__ __forceinline__ T narrow(T x) { return x; }
    static __device__ __forceinline__ T sum(T a, T b) { return a + b; }
    static __device__ __forceinline__ T prod(T a, T b) { return a * b; }
    static __device__ __forceinline__ T min(T a, T b) { return rr_fmin(a, b); }
    static __device__ __forceinline__ T max(T a, T b) { return rr_fmax(a, b); }
    static __device__ __forceinline__ Scale scale_param(rr_ull world) {
        return (F)1 / (F)(world < 1 ? 1 : world);
    }
    static __device__ __forceinline__ T scale(T x, Scale inv) { return x * inv; }
    // PreMulSum's factor, an element itself.
    typedef F Mul;
    static __device__ __forceinline__ Mul mul_param(T s) { return s; }
    static __device__ __forceinline__ T mul(T x, Mul m) { return x * m; }
};

// f16 and bf16: 16-bit patterns, computed in f32 and rounded back after every operation (a fold
// of many sources too: AccD is the type itself).
template <class Cvt>
struct rr_half {
    typedef typename Cvt::Bits T;
    typedef float Scale;  // 1/world in f32
    typedef rr_half AccD;
    static __device__ __forceinline__ T widen(T x) { return x; }
    static __device__ __forceinline__ T narrow(T x) { return x; }
    static __device__ __forceinline__ T sum(T a, T b) {
        return Cvt::from_f32(Cvt::to_f32(a) + Cvt::to_f32(b));
    }
    static __device__ __forceinline__ T prod(T a, T b) {
        return Cvt::from_f32(Cvt::to_f32(a) * Cvt::to_f32(b));
    }
    static __device__ __forceinline__ T min(T a, T b) {
        return Cvt::from_f32(rr_fmin(Cvt::to_f32(a), Cvt::to_f32(b)));
    }
    static __device__ __forceinline__ T max(T a, T b) {
        return Cvt::from_f32(rr_fmax(Cvt::to_f32(a), Cvt::to_f32(b)));
    }
    static __device__ __forceinline__ Scale scale_param(rr_ull world) {
        return 1.0f / (float)(world < 1 ? 1 : world);
    }
    static __device__ __forceinline__ T scale(T x, Scale inv) {
        return Cvt::from_f32(Cvt::to_f32(x) * inv);
    }
    // PreMulSum's factor, an element itself, widened to f32 (exactly); the product rounds once.
    typedef float Mul;
    static __device__ __forceinline__ Mul mul_param(T s) { return Cvt::to_f32(s); }
    static __device__ __forceinline__ T mul(T x, Mul m) { return Cvt::from_f32(Cvt::to_f32(x) * m); }
};

// fp8: 8-bit patterns, each operation computed in f32 and rounded back like rr_half, but a fold
// of many sources accumulates in f32 (AccD) and rounds once.
template <class Cvt>
struct rr_fp8 : rr_half<Cvt> {
    typedef typename Cvt::Bits T;
    typedef rr_float<float> AccD;
    static __device__ __forceinline__ float widen(T x) { return Cvt::to_f32(x); }
    static __device__ __forceinline__ T narrow(float x) { return Cvt::from_f32(x); }
};

// rr_<DType::name()>: the type argument of the RR_* lines of instances.cuh.
typedef rr_half<rr_cvt_f16> rr_f16;
typedef rr_half<rr_cvt_bf16> rr_bf16;
typedef rr_float<float> rr_f32;
typedef rr_float<double> rr_f64;
typedef rr_int<signed char, unsigned char, long long> rr_i8;
typedef rr_int<unsigned char, unsigned char, rr_ull> rr_u8;
typedef rr_int<int, unsigned, long long> rr_i32;
typedef rr_int<unsigned, unsigned, rr_ull> rr_u32;
typedef rr_int<long long, rr_ull, long long> rr_i64;
typedef rr_int<rr_ull, rr_ull, rr_ull> rr_u64;
typedef rr_fp8<rr_cvt_e4m3> rr_f8e4m3;
typedef rr_fp8<rr_cvt_e5m2> rr_f8e5m2;

// The four pairwise operators (Avg combines as sum; its final step is the scale kernels).
struct rr_op_sum {
    template <class D>
    static __device__ __forceinline__ typename D::T apply(typename D::T a, typename D::T b) {
        return D::sum(a, b);
    }
};
struct rr_op_prod {
    template <class D>
    static __device__ __forceinline__ typename D::T apply(typename D::T a, typename D::T b) {
        return D::prod(a, b);
    }
};
struct rr_op_min {
    template <class D>
    static __device__ __forceinline__ typename D::T apply(typename D::T a, typename D::T b) {
        return D::min(a, b);
    }
};
struct rr_op_max {
    template <class D>
    static __device__ __forceinline__ typename D::T apply(typename D::T a, typename D::T b) {
        return D::max(a, b);
    }
};

// ---------------------------------------------------------------------------------------------
// Shared pieces of the kernel bodies.
// ---------------------------------------------------------------------------------------------

// 16 bytes seen either as one vector access or as its elements.
template <typename T>
union rr_vec16 {
    uint4 v;
    T e[16 / sizeof(T)];
};

static __device__ __forceinline__ unsigned rr_misalign(const void* p) {
    return (unsigned)(reinterpret_cast<rr_ull>(p) & 15u);
}

// Elements before the first 16-byte boundary of a pointer misaligned by `misalign` bytes
// (a multiple of sizeof(T) for element-aligned pointers), at most `count`.
template <typename T>
static __device__ __forceinline__ rr_ull rr_head(unsigned misalign, rr_ull count) {
    const rr_ull head = ((16u - misalign) & 15u) / sizeof(T);
    return head < count ? head : count;
}

// How a fold of many sources accumulates a chunk of elements (Chunk: a union of raw words and
// `T e[]`, as rr_vec16 and rr_ll_chunk): in T itself, in place (every type but fp8: AccD is D),
// or widened to AccD's type and narrowed once at the end (fp8). rr_fold<D, Op, Chunk>::Acc is
// the accumulator; start / add / finish are the fold's three steps.
template <class D, class Op, class Chunk, class AccD>
struct rr_fold_in {
    typedef typename D::T T;
    enum { N = sizeof(Chunk) / sizeof(T) };
    struct Acc {
        typename AccD::T e[N];
    };
    static __device__ __forceinline__ void start(Acc& acc, const Chunk& x) {
#pragma unroll
        for (unsigned k = 0; k < N; ++k) {
            acc.e[k] = D::widen(x.e[k]);
        }
    }
    static __device__ __forceinline__ void add(Acc& acc, const Chunk& x) {
#pragma unroll
        for (unsigned k = 0; k < N; ++k) {
            acc.e[k] = Op::template apply<AccD>(acc.e[k], D::widen(x.e[k]));
        }
    }
    static __device__ __forceinline__ void finish(Chunk& out, const Acc& acc) {
#pragma unroll
        for (unsigned k = 0; k < N; ++k) {
            out.e[k] = D::narrow(acc.e[k]);
        }
    }
};
template <class D, class Op, class Chunk>
struct rr_fold_in<D, Op, Chunk, D> {
    typedef Chunk Acc;
    enum { N = sizeof(Chunk) / sizeof(typename D::T) };
    static __device__ __forceinline__ void start(Acc& acc, const Chunk& x) { acc = x; }
    static __device__ __forceinline__ void add(Acc& acc, const Chunk& x) {
#pragma unroll
        for (unsigned k = 0; k < N; ++k) {
            acc.e[k] = Op::template apply<D>(acc.e[k], x.e[k]);
        }
    }
    static __device__ __forceinline__ void finish(Chunk& out, const Acc& acc) { out = acc; }
};
template <class D, class Op, class Chunk>
struct rr_fold : rr_fold_in<D, Op, Chunk, typename D::AccD> {};
