// Pairwise reduce and Avg-scale kernels of ringreduce.
//
// One source, two compilers: build.rs compiles it with nvcc into a fatbin (SASS for sm_80 and
// sm_90, PTX for compute_90) when nvcc is present, and src/exec/cuda/kernels.rs otherwise
// compiles it with NVRTC at first use. So it includes NO header: f16 and bf16 travel as their
// 16-bit patterns (`unsigned short`) and are converted to and from f32 here.
//
// Semantics are those of the module doc of src/element.rs, bit for bit where IEEE fixes them:
// - integers: sum and prod wrap (computed in the unsigned type of the same width, so signed
//   overflow is never undefined behaviour); min/max compare in the element's own type.
// - f32, f64: IEEE `+`, `*`; min/max are fminf/fmin (a NaN operand loses to a number).
// - f16, bf16: both operands widened to f32 (exactly), combined in f32, rounded back to
//   nearest-even after every operation; NaN stays NaN.
// - Avg: floats multiply by 1/world (f64 for f64, f32 for the others, computed from world.max(1)),
//   integers divide by (world as T).max(1), truncating, signed types as signed.
//
// Every kernel symbol is spelled out in full in the RR_REDUCE / RR_SCALE lines at the bottom,
// where a unit test in kernels.rs finds them by name.

typedef unsigned long long rr_ull;  // counts and addresses

// ---------------------------------------------------------------------------------------------
// Element conversions for the 16-bit float types.
// ---------------------------------------------------------------------------------------------

struct rr_cvt_f16 {
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

static __device__ __forceinline__ float rr_fmin(float a, float b) { return fminf(a, b); }
static __device__ __forceinline__ float rr_fmax(float a, float b) { return fmaxf(a, b); }
static __device__ __forceinline__ double rr_fmin(double a, double b) { return fmin(a, b); }
static __device__ __forceinline__ double rr_fmax(double a, double b) { return fmax(a, b); }

// ---------------------------------------------------------------------------------------------
// Per-type operations. Each type struct names its storage type T, the type of the Avg factor
// (Scale), and sum / prod / min / max / scale_param / scale.
// ---------------------------------------------------------------------------------------------

// Integers: S is the element type, U the unsigned type of the same width.
template <typename S, typename U>
struct rr_int {
    typedef S T;
    typedef S Scale;  // the divisor
    static __device__ __forceinline__ T sum(T a, T b) { return (T)(U)((U)a + (U)b); }
    static __device__ __forceinline__ T prod(T a, T b) { return (T)(U)((U)a * (U)b); }
    static __device__ __forceinline__ T min(T a, T b) { return b < a ? b : a; }
    static __device__ __forceinline__ T max(T a, T b) { return a < b ? b : a; }
    // (world as T).max(1): the cast wraps like Rust's `as`, and the floor of 1 also catches the
    // negative values an 8-bit signed cast can give, so the division never traps.
    static __device__ __forceinline__ Scale scale_param(rr_ull world) {
        const T w = (T)world;
        return w < (T)1 ? (T)1 : w;
    }
    static __device__ __forceinline__ T scale(T x, Scale divisor) { return (T)(x / divisor); }
};

// f32 and f64: F is the element type and its compute type.
template <typename F>
struct rr_float {
    typedef F T;
    typedef F Scale;  // 1/world
    static __device__ __forceinline__ T sum(T a, T b) { return a + b; }
    static __device__ __forceinline__ T prod(T a, T b) { return a * b; }
    static __device__ __forceinline__ T min(T a, T b) { return rr_fmin(a, b); }
    static __device__ __forceinline__ T max(T a, T b) { return rr_fmax(a, b); }
    static __device__ __forceinline__ Scale scale_param(rr_ull world) {
        return (F)1 / (F)(world < 1 ? 1 : world);
    }
    static __device__ __forceinline__ T scale(T x, Scale inv) { return x * inv; }
};

// f16 and bf16: 16-bit patterns, computed in f32 and rounded back after every operation.
template <class Cvt>
struct rr_half {
    typedef unsigned short T;
    typedef float Scale;  // 1/world in f32
    static __device__ __forceinline__ T sum(T a, T b) {
        return Cvt::from_f32(Cvt::to_f32(a) + Cvt::to_f32(b));
    }
    static __device__ __forceinline__ T prod(T a, T b) {
        return Cvt::from_f32(Cvt::to_f32(a) * Cvt::to_f32(b));
    }
    static __device__ __forceinline__ T min(T a, T b) {
        return Cvt::from_f32(fminf(Cvt::to_f32(a), Cvt::to_f32(b)));
    }
    static __device__ __forceinline__ T max(T a, T b) {
        return Cvt::from_f32(fmaxf(Cvt::to_f32(a), Cvt::to_f32(b)));
    }
    static __device__ __forceinline__ Scale scale_param(rr_ull world) {
        return 1.0f / (float)(world < 1 ? 1 : world);
    }
    static __device__ __forceinline__ T scale(T x, Scale inv) {
        return Cvt::from_f32(Cvt::to_f32(x) * inv);
    }
};

// rr_<DType::name()>: the type argument of the RR_REDUCE / RR_SCALE lines below.
typedef rr_half<rr_cvt_f16> rr_f16;
typedef rr_half<rr_cvt_bf16> rr_bf16;
typedef rr_float<float> rr_f32;
typedef rr_float<double> rr_f64;
typedef rr_int<signed char, unsigned char> rr_i8;
typedef rr_int<unsigned char, unsigned char> rr_u8;
typedef rr_int<int, unsigned> rr_i32;
typedef rr_int<unsigned, unsigned> rr_u32;
typedef rr_int<long long, unsigned long long> rr_i64;
typedef rr_int<unsigned long long, unsigned long long> rr_u64;

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

// ---------------------------------------------------------------------------------------------
// rr_reduce_<op>_<type>(T* dst, const T* a, const T* b, unsigned long long count)
//
// Purpose: dst[i] = a[i] ⊕ b[i] for i < count: one step of the ring, combining the local
//   partial sum with the segment received from the previous rank.
// Assumptions: the three pointers are device addresses (local, or a peer's with peer access on)
//   aligned to sizeof(T), each valid for `count` elements; a and b are each either equal to dst
//   or disjoint from dst's range (in-place accumulate is dst == a), since element i is read and
//   written by one thread in one iteration and by no other. Any grid and block size works.
// Why it is fast: a grid-stride loop sized to fill the GPU once; when dst, a and b share their
//   offset within 16 bytes (always so for equal offsets into 16-byte-aligned buffers) the body
//   moves 16 bytes per pointer per thread (uint4 loads/stores, coalesced 512 B per warp) with
//   the few elements before the first boundary and after the last done one by one; otherwise
//   every element is done one by one (correct, slower). Nothing is kept in shared memory: the
//   kernel is bound by memory bandwidth, with two loads in flight per thread per iteration.
// ---------------------------------------------------------------------------------------------
template <class D, class Op>
static __device__ __forceinline__ void rr_reduce_body(typename D::T* dst, const typename D::T* a,
                                                      const typename D::T* b, rr_ull count) {
    typedef typename D::T T;
    const unsigned per_vec = 16 / sizeof(T);
    const rr_ull first = (rr_ull)blockIdx.x * blockDim.x + threadIdx.x;
    const rr_ull stride = (rr_ull)gridDim.x * blockDim.x;

    // Elements [0, head) and [head + vecs * per_vec, count) one by one, the rest as vectors.
    // Different misalignments: head = count, so everything goes one by one.
    const unsigned misalign = rr_misalign(a);
    const bool shared = rr_misalign(dst) == misalign && rr_misalign(b) == misalign;
    const rr_ull head = shared ? rr_head<T>(misalign, count) : count;
    const rr_ull vecs = (count - head) / per_vec;
    const rr_ull tail = head + vecs * per_vec;

    for (rr_ull i = first; i < head; i += stride) {
        dst[i] = Op::template apply<D>(a[i], b[i]);
    }
    uint4* dst_vec = reinterpret_cast<uint4*>(dst + head);
    const uint4* a_vec = reinterpret_cast<const uint4*>(a + head);
    const uint4* b_vec = reinterpret_cast<const uint4*>(b + head);
    for (rr_ull v = first; v < vecs; v += stride) {
        rr_vec16<T> x, y;
        x.v = a_vec[v];
        y.v = b_vec[v];
#pragma unroll
        for (unsigned k = 0; k < per_vec; ++k) {
            x.e[k] = Op::template apply<D>(x.e[k], y.e[k]);
        }
        dst_vec[v] = x.v;
    }
    for (rr_ull i = tail + first; i < count; i += stride) {
        dst[i] = Op::template apply<D>(a[i], b[i]);
    }
}

// ---------------------------------------------------------------------------------------------
// rr_scale_<type>(T* x, unsigned long long count, unsigned long long world)
//
// Purpose: the last step of Avg: x[i] = x[i] / world as src/element.rs defines it (floats times
//   1/world, integers divided by world, truncating), in place, for i < count.
// Assumptions: x is a device address aligned to sizeof(T), valid for `count` elements, written
//   by no one else meanwhile. Any grid and block size works; world == 0 acts as 1.
// Why it is fast: the factor (1/world, or the divisor) is computed once per thread, outside the
//   loop; a grid-stride loop over 16-byte vectors from x's first 16-byte boundary, with the
//   elements before it and after the last whole vector done one by one.
// ---------------------------------------------------------------------------------------------
template <class D>
static __device__ __forceinline__ void rr_scale_body(typename D::T* x, rr_ull count, rr_ull world) {
    typedef typename D::T T;
    const unsigned per_vec = 16 / sizeof(T);
    const rr_ull first = (rr_ull)blockIdx.x * blockDim.x + threadIdx.x;
    const rr_ull stride = (rr_ull)gridDim.x * blockDim.x;
    const typename D::Scale factor = D::scale_param(world);

    const rr_ull head = rr_head<T>(rr_misalign(x), count);
    const rr_ull vecs = (count - head) / per_vec;
    const rr_ull tail = head + vecs * per_vec;

    for (rr_ull i = first; i < head; i += stride) {
        x[i] = D::scale(x[i], factor);
    }
    uint4* x_vec = reinterpret_cast<uint4*>(x + head);
    for (rr_ull v = first; v < vecs; v += stride) {
        rr_vec16<T> y;
        y.v = x_vec[v];
#pragma unroll
        for (unsigned k = 0; k < per_vec; ++k) {
            y.e[k] = D::scale(y.e[k], factor);
        }
        x_vec[v] = y.v;
    }
    for (rr_ull i = tail + first; i < count; i += stride) {
        x[i] = D::scale(x[i], factor);
    }
}

// ---------------------------------------------------------------------------------------------
// The exported kernels: 4 operators x 10 types, and one scale kernel per type.
// RR_REDUCE(symbol, op, type) and RR_SCALE(symbol, type): the symbol is written out in full and
// must read rr_reduce_<op>_<type> / rr_scale_<type> (checked by the tests in kernels.rs).
// ---------------------------------------------------------------------------------------------
#define RR_REDUCE(symbol, op, type)                                                          \
    extern "C" __global__ void symbol(type::T* dst, const type::T* a, const type::T* b,     \
                                      unsigned long long count) {                          \
        rr_reduce_body<type, rr_op_##op>(dst, a, b, count);                                \
    }

#define RR_SCALE(symbol, type)                                                               \
    extern "C" __global__ void symbol(type::T* x, unsigned long long count,                  \
                                      unsigned long long world) {                          \
        rr_scale_body<type>(x, count, world);                                              \
    }

RR_REDUCE(rr_reduce_sum_f16, sum, rr_f16)
RR_REDUCE(rr_reduce_sum_bf16, sum, rr_bf16)
RR_REDUCE(rr_reduce_sum_f32, sum, rr_f32)
RR_REDUCE(rr_reduce_sum_f64, sum, rr_f64)
RR_REDUCE(rr_reduce_sum_i8, sum, rr_i8)
RR_REDUCE(rr_reduce_sum_u8, sum, rr_u8)
RR_REDUCE(rr_reduce_sum_i32, sum, rr_i32)
RR_REDUCE(rr_reduce_sum_u32, sum, rr_u32)
RR_REDUCE(rr_reduce_sum_i64, sum, rr_i64)
RR_REDUCE(rr_reduce_sum_u64, sum, rr_u64)

RR_REDUCE(rr_reduce_prod_f16, prod, rr_f16)
RR_REDUCE(rr_reduce_prod_bf16, prod, rr_bf16)
RR_REDUCE(rr_reduce_prod_f32, prod, rr_f32)
RR_REDUCE(rr_reduce_prod_f64, prod, rr_f64)
RR_REDUCE(rr_reduce_prod_i8, prod, rr_i8)
RR_REDUCE(rr_reduce_prod_u8, prod, rr_u8)
RR_REDUCE(rr_reduce_prod_i32, prod, rr_i32)
RR_REDUCE(rr_reduce_prod_u32, prod, rr_u32)
RR_REDUCE(rr_reduce_prod_i64, prod, rr_i64)
RR_REDUCE(rr_reduce_prod_u64, prod, rr_u64)

RR_REDUCE(rr_reduce_min_f16, min, rr_f16)
RR_REDUCE(rr_reduce_min_bf16, min, rr_bf16)
RR_REDUCE(rr_reduce_min_f32, min, rr_f32)
RR_REDUCE(rr_reduce_min_f64, min, rr_f64)
RR_REDUCE(rr_reduce_min_i8, min, rr_i8)
RR_REDUCE(rr_reduce_min_u8, min, rr_u8)
RR_REDUCE(rr_reduce_min_i32, min, rr_i32)
RR_REDUCE(rr_reduce_min_u32, min, rr_u32)
RR_REDUCE(rr_reduce_min_i64, min, rr_i64)
RR_REDUCE(rr_reduce_min_u64, min, rr_u64)

RR_REDUCE(rr_reduce_max_f16, max, rr_f16)
RR_REDUCE(rr_reduce_max_bf16, max, rr_bf16)
RR_REDUCE(rr_reduce_max_f32, max, rr_f32)
RR_REDUCE(rr_reduce_max_f64, max, rr_f64)
RR_REDUCE(rr_reduce_max_i8, max, rr_i8)
RR_REDUCE(rr_reduce_max_u8, max, rr_u8)
RR_REDUCE(rr_reduce_max_i32, max, rr_i32)
RR_REDUCE(rr_reduce_max_u32, max, rr_u32)
RR_REDUCE(rr_reduce_max_i64, max, rr_i64)
RR_REDUCE(rr_reduce_max_u64, max, rr_u64)

RR_SCALE(rr_scale_f16, rr_f16)
RR_SCALE(rr_scale_bf16, rr_bf16)
RR_SCALE(rr_scale_f32, rr_f32)
RR_SCALE(rr_scale_f64, rr_f64)
RR_SCALE(rr_scale_i8, rr_i8)
RR_SCALE(rr_scale_u8, rr_u8)
RR_SCALE(rr_scale_i32, rr_i32)
RR_SCALE(rr_scale_u32, rr_u32)
RR_SCALE(rr_scale_i64, rr_i64)
RR_SCALE(rr_scale_u64, rr_u64)
