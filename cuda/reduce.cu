// Pairwise reduce, Avg-scale, one-shot and two-shot all-reduce kernels of ringreduce.
//
// One source, two compilers: build.rs compiles it with nvcc into a fatbin (SASS for sm_80 and
// sm_90, PTX for compute_90) when nvcc is present, and src/exec/cuda/kernels/ otherwise
// compiles it with NVRTC at first use. So it includes NO header: f16 and bf16 travel as their
// 16-bit patterns (`unsigned short`) and are converted to and from f32 here.
//
// Semantics are those of the module doc of src/element.rs, bit for bit where IEEE fixes them:
// - integers: sum and prod wrap (computed in the unsigned type of the same width, so signed
//   overflow is never undefined behaviour); min/max compare in the element's own type.
// - f32, f64: IEEE `+`, `*`; min/max are IEEE 754-2019 minimumNumber / maximumNumber (a NaN
//   operand loses to a number; -0 < +0), written out below rather than fminf/fmaxf, which leave
//   the sign of a zero result unspecified.
// - f16, bf16: both operands widened to f32 (exactly), combined in f32, rounded back to
//   nearest-even after every operation; NaN stays NaN.
// - Avg: floats multiply by 1/world (f64 for f64, f32 for the others, computed from world.max(1)),
//   integers divide by world.max(1) in 64 bits, truncating, signed types as signed (the quotient
//   always fits the type; world itself may not).
//
// Every kernel symbol is spelled out in full in the RR_REDUCE / RR_SCALE / RR_ONESHOT / RR_TWOSHOT
// lines at the bottom, where a unit test in src/exec/cuda/kernels/ finds them by name.

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
// (Scale), and sum / prod / min / max / scale_param / scale.
// ---------------------------------------------------------------------------------------------

// Integers: S is the element type, U the unsigned type of the same width, W the 64-bit type of
// S's signedness, in which Avg divides.
template <typename S, typename U, typename W>
struct rr_int {
    typedef S T;
    typedef W Scale;  // the divisor
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
};

// rr_<DType::name()>: the type argument of the RR_REDUCE / RR_SCALE lines below.
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
// The peer kernels (one-shot and two-shot all-reduce): every rank reads every rank's memory
// directly (its own locally, the others over NVLink through peer access) and folds it itself;
// ranks meet at flag barriers, two in the one-shot (start, end), three in the two-shot (start,
// middle, end). The rr_peer_* pieces below serve both kernels.
//
// Flags: each rank owns one array of 3 * RR_PEER_MAX_BLOCKS * RR_PEER_MAX_RANKS words in
// its own device memory (12 KiB, zeroed once, never reset). Word
//     (phase * RR_PEER_MAX_BLOCKS + block) * RR_PEER_MAX_RANKS + from
// of rank p's array is written only by rank `from`'s block `block`, at barrier `phase` (0: start;
// 1: the one-shot's end or the two-shot's middle; 2: the two-shot's end), with the call's epoch;
// rank p's block `block` spins on it. One writer per word, so no atomics; epochs only grow (1,
// 2, 3, ... wrapping, skipping 0), so nothing is cleared — except a start signal withdrawn by a
// block that timed out (0, which no call waits for). A word has
// "reached" the call when it EQUALS the call's epoch. Equality is enough, since a peer cannot
// write the next epoch into a word this block still waits on (its next call needs this block's
// end signal first); and it is needed: a block index that the small grids of many calls left
// unused keeps an old epoch, which an ordering comparison would take for "reached" after 2^31
// calls, and a stale kernel of a failed call must not pair with the next call.
//
// Memory ordering (PTX memory model, system scope because the two sides are different GPUs):
// - signal: __syncthreads() (everything the block did is done, CTA-wide), then one thread per
//   peer `st.release.sys` of the epoch into that peer's word (the release makes this block's
//   earlier reads and writes, and what they observed, happen before the flag);
// - wait: that thread spins with `ld.acquire.sys` on its own array's word until it reaches the
//   epoch, then __syncthreads() hands the acquire on to the rest of the block.
// - Start barrier: a peer's flag is written by its kernel, which started after all earlier work
//   on its stream (which wrote its input); after the acquire, this block may read that input.
// - End barrier: a peer's flag says its block `block` has finished reading everything it reads,
//   including this rank's input. This rank's kernel ends only when all its blocks have passed,
//   i.e. when block b of every peer has signalled, for every b: so once the kernel is complete
//   on a stream, no peer reads this rank's input any more and the stream may overwrite it.
//
// Error codes written to *error (host-mapped pinned memory; a plain 32-bit `st.relaxed.sys`, so
// no PCIe atomics are needed; the last writer wins): 1 = a start barrier timed out, 2 = an end
// barrier timed out, 3 = the launch broke the kernel's assumptions (world, rank, grid, block),
// 4 = the two-shot's middle barrier timed out.
// ---------------------------------------------------------------------------------------------

#define RR_PEER_MAX_RANKS 8
#define RR_PEER_MAX_BLOCKS 128
// Threads per block the launch uses (src/exec/cuda/kernels/peer.rs: PEER_BLOCK_THREADS).
#define RR_PEER_THREADS 512
// 16-byte vectors per source a thread loads before it combines them.
#define RR_PEER_UNROLL 4

#define RR_PEER_ERR_START 1u
#define RR_PEER_ERR_END 2u
#define RR_PEER_ERR_LAUNCH 3u
#define RR_PEER_ERR_MIDDLE 4u

// Barrier phases (the flag array's first index): a barrier's place in its kernel. Both kernels
// start at phase 0; the one-shot ends at phase 1; the two-shot meets at phase 1 between its
// reduce and its gather, and ends at phase 2. A word is written at most once per call, and calls
// of either kind share the flags and the epoch counter.
#define RR_PHASE_START 0u
#define RR_ONESHOT_PHASE_END 1u
#define RR_TWOSHOT_PHASE_MIDDLE 1u
#define RR_TWOSHOT_PHASE_END 2u
#define RR_PEER_PHASES 3

// Kernel parameter, passed by value (128 bytes): the input and the flag array of every rank
// (index = rank), as device addresses usable from the launching GPU. Entries >= world unused.
struct rr_peers {
    const void* src[RR_PEER_MAX_RANKS];
    unsigned* flags[RR_PEER_MAX_RANKS];
};

// Nanoseconds of the GPU's global timer.
static __device__ __forceinline__ rr_ull rr_globaltimer() {
    rr_ull ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    return ns;
}

static __device__ __forceinline__ void rr_st_release_sys(unsigned* word, unsigned value) {
    asm volatile("st.release.sys.u32 [%0], %1;" ::"l"(word), "r"(value) : "memory");
}

static __device__ __forceinline__ void rr_st_relaxed_sys(unsigned* word, unsigned value) {
    asm volatile("st.relaxed.sys.u32 [%0], %1;" ::"l"(word), "r"(value) : "memory");
}

static __device__ __forceinline__ unsigned rr_ld_acquire_sys(const unsigned* word) {
    unsigned value;
    asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(value) : "l"(word) : "memory");
    return value;
}

// The flag word written by rank `from` for block `block` at barrier `phase`.
static __device__ __forceinline__ unsigned rr_flag_word(unsigned phase, unsigned block,
                                                        unsigned from) {
    return (phase * RR_PEER_MAX_BLOCKS + block) * RR_PEER_MAX_RANKS + from;
}

// The kernel's deadline on the global timer: timeout_ns after now (the block's start), saturating.
// Every barrier of the kernel gives up at this one deadline, so the whole kernel ends within
// timeout_ns of its start however many barriers it has.
static __device__ __forceinline__ rr_ull rr_deadline(rr_ull timeout_ns) {
    const rr_ull now = rr_globaltimer();
    return timeout_ns > ~0ull - now ? ~0ull : now + timeout_ns;
}

// The start of both peer kernels, before their first barrier. Returns false, after thread 0 has
// stored RR_PEER_ERR_LAUNCH into *error, when the launch breaks the kernels' assumptions (world
// outside 2..=RR_PEER_MAX_RANKS, rank >= world, more than RR_PEER_MAX_BLOCKS blocks, fewer than
// RR_PEER_MAX_RANKS threads a block): uniform over the grid, so either every block returns then
// or none does. Otherwise thread 0 copies peers.flags into `flags`, the block's shared array (a
// kernel parameter indexed by a register would be copied to local memory by every thread); the
// opening __syncthreads() of the first barrier makes the copy visible to the block.
static __device__ __forceinline__ bool rr_peer_begin(const rr_peers& peers, unsigned world,
                                                     unsigned rank, unsigned* error,
                                                     unsigned** flags) {
    if (world < 2 || world > RR_PEER_MAX_RANKS || rank >= world ||
        gridDim.x > RR_PEER_MAX_BLOCKS || blockDim.x < RR_PEER_MAX_RANKS) {
        if (threadIdx.x == 0) {
            rr_st_relaxed_sys(error, RR_PEER_ERR_LAUNCH);
        }
        return false;
    }
    if (threadIdx.x == 0) {
#pragma unroll
        for (unsigned r = 0; r < RR_PEER_MAX_RANKS; ++r) {
            flags[r] = peers.flags[r];
        }
    }
    return true;
}

// Barrier `phase` of this block with block blockIdx.x of every other rank; every thread of the
// block calls it. Thread p (p < world, p != rank) signals rank p and waits for rank p, so all
// peers are signalled and awaited in parallel. Returns false, after writing `code` into
// *error, when a wait ran past `deadline` (rr_deadline); with `withdraw` (every barrier but the
// last) a barrier that failed also withdraws its signals (writes 0 over them), so that a peer
// arriving later times out too instead of reading this rank's memory after the call has failed.
// `flags` is peers.flags copied to shared memory (rr_peer_begin).
static __device__ __forceinline__ bool rr_peer_barrier(unsigned* const* flags, unsigned world,
                                                       unsigned rank, unsigned phase,
                                                       unsigned code, bool withdraw,
                                                       unsigned epoch, rr_ull deadline,
                                                       unsigned* error) {
    __syncthreads();  // everything the block did before is done before any thread signals
    const unsigned peer = threadIdx.x;
    int timed_out = 0;
    if (peer < world && peer != rank) {
        rr_st_release_sys(flags[peer] + rr_flag_word(phase, blockIdx.x, rank), epoch);
        const unsigned* word = flags[rank] + rr_flag_word(phase, blockIdx.x, peer);
        while (rr_ld_acquire_sys(word) != epoch) {
            if (rr_globaltimer() > deadline) {
                rr_st_relaxed_sys(error, code);
                timed_out = 1;
                break;
            }
        }
    }
    const bool met = __syncthreads_or(timed_out) == 0;
    if (!met && withdraw && peer < world && peer != rank) {
        // Withdraw the signal: a peer whose kernel arrives later (queued behind other work) must
        // not pass this barrier and read this rank's memory after this call has given up. Zero
        // is never an epoch; the next call's signal overwrites it.
        rr_st_relaxed_sys(flags[peer] + rr_flag_word(phase, blockIdx.x, rank), 0u);
    }
    return met;
}

// src[0][i] ⊕ src[1][i] ⊕ ... ⊕ src[world - 1][i], folded in rank order. The sources are
// indexed by unrolled constants (kernel parameter reads, no local copy), and the loads are
// independent of each other, so they can all be in flight at once.
template <class D, class Op>
static __device__ __forceinline__ typename D::T rr_peer_fold(const rr_peers& peers,
                                                             unsigned world, rr_ull i) {
    typedef typename D::T T;
    T acc = static_cast<const T*>(peers.src[0])[i];
#pragma unroll
    for (unsigned r = 1; r < RR_PEER_MAX_RANKS; ++r) {
        if (r < world) {
            acc = Op::template apply<D>(acc, static_cast<const T*>(peers.src[r])[i]);
        }
    }
    return acc;
}

// Vectors base + u * blockDim.x (u < RR_PEER_UNROLL; those below vecs) of one source whose
// vectors start at element `head`: independent 16-byte loads, all in flight at once.
template <typename T>
static __device__ __forceinline__ void rr_peer_load(rr_vec16<T> (&x)[RR_PEER_UNROLL],
                                                    const void* src, rr_ull head, rr_ull base,
                                                    rr_ull vecs) {
    const uint4* src_vec = reinterpret_cast<const uint4*>(static_cast<const T*>(src) + head);
#pragma unroll
    for (unsigned u = 0; u < RR_PEER_UNROLL; ++u) {
        const rr_ull v = base + (rr_ull)u * blockDim.x;
        if (v < vecs) {
            x[u].v = src_vec[v];
        }
    }
}

// How a peer kernel's `count` elements are split between threads: elements [0, head) and
// [tail, count) one by one (grid-stride from `first`), [head, tail) as `vecs` 16-byte vectors;
// sources with different offsets within 16 bytes: head = count, everything one by one. It depends
// only on count, the grid and the sources' offsets, equal on every rank — so block b covers the
// same indices everywhere — and rr_peer_reduce_body, rr_split_copy (the two-shot's gather) and
// rr_oneshot_expose share it, so a copy writes exactly the indices the fold reads.
template <typename T>
struct rr_peer_split {
    rr_ull first, stride, head, vecs, tail;
    unsigned misalign;
    __device__ __forceinline__ rr_peer_split(const rr_peers& peers, unsigned world,
                                             rr_ull count) {
        first = (rr_ull)blockIdx.x * blockDim.x + threadIdx.x;
        stride = (rr_ull)gridDim.x * blockDim.x;
        misalign = rr_misalign(peers.src[0]);
        bool shared = true;
#pragma unroll
        for (unsigned r = 1; r < RR_PEER_MAX_RANKS; ++r) {
            if (r < world) {
                shared = shared && rr_misalign(peers.src[r]) == misalign;
            }
        }
        head = shared ? rr_head<T>(misalign, count) : count;
        vecs = (count - head) / (16 / sizeof(T));
        tail = head + vecs * (16 / sizeof(T));
    }
};

// The data part of the one-shot kernel: dst[i] = fold over ranks of src[r][i], i < count.
//
// Which block handles which index depends only on count, the grid and the sources' offsets
// within 16 bytes, which are the same on every rank (same peers struct, count and grid); dst,
// which differs between ranks, decides only how results are stored. So block b covers the
// same indices on every rank. (The end barrier's guarantee for the whole kernel does not need
// this, but it makes "block b of every rank is done with indices I_b" true per block.)
template <class D, class Op>
static __device__ __forceinline__ void rr_peer_reduce_body(const rr_peers& peers, unsigned world,
                                                           typename D::T* dst, rr_ull count) {
    typedef typename D::T T;
    const unsigned per_vec = 16 / sizeof(T);
    const rr_peer_split<T> split(peers, world, count);
    const rr_ull first = split.first, stride = split.stride;
    const rr_ull head = split.head, vecs = split.vecs, tail = split.tail;
    // dst at another offset: the vectors' elements are stored one by one (same partition).
    const bool dst_vector = rr_misalign(dst) == split.misalign;

    for (rr_ull i = first; i < head; i += stride) {
        dst[i] = rr_peer_fold<D, Op>(peers, world, i);
    }

    // Vector v = base + u * blockDim.x for u < RR_PEER_UNROLL: each u is a coalesced 8 KiB
    // (512 threads x 16 B) per source.
    const rr_ull vec_stride = stride * RR_PEER_UNROLL;
    for (rr_ull base = (rr_ull)blockIdx.x * blockDim.x * RR_PEER_UNROLL + threadIdx.x;
         base < vecs; base += vec_stride) {
        // Sources 0 and 1 are loaded together; while source r is combined, the loads of
        // source r + 1 are already in flight (2 x RR_PEER_UNROLL loads per thread).
        rr_vec16<T> acc[RR_PEER_UNROLL], next[RR_PEER_UNROLL];
        rr_peer_load<T>(acc, peers.src[0], head, base, vecs);
        rr_peer_load<T>(next, peers.src[1], head, base, vecs);
#pragma unroll
        for (unsigned r = 1; r < RR_PEER_MAX_RANKS; ++r) {
            if (r < world) {
                rr_vec16<T> x[RR_PEER_UNROLL];
#pragma unroll
                for (unsigned u = 0; u < RR_PEER_UNROLL; ++u) {
                    x[u] = next[u];
                }
                if (r + 1 < world) {  // never true for r + 1 == RR_PEER_MAX_RANKS
                    rr_peer_load<T>(next, peers.src[(r + 1) % RR_PEER_MAX_RANKS], head,
                                    base, vecs);
                }
#pragma unroll
                for (unsigned u = 0; u < RR_PEER_UNROLL; ++u) {
#pragma unroll
                    for (unsigned k = 0; k < per_vec; ++k) {
                        acc[u].e[k] = Op::template apply<D>(acc[u].e[k], x[u].e[k]);
                    }
                }
            }
        }
#pragma unroll
        for (unsigned u = 0; u < RR_PEER_UNROLL; ++u) {
            const rr_ull v = base + (rr_ull)u * blockDim.x;
            if (v < vecs) {
                if (dst_vector) {
                    reinterpret_cast<uint4*>(dst + head)[v] = acc[u].v;
                } else {
#pragma unroll
                    for (unsigned k = 0; k < per_vec; ++k) {
                        dst[head + v * per_vec + k] = acc[u].e[k];
                    }
                }
            }
        }
    }

    for (rr_ull i = tail + first; i < count; i += stride) {
        dst[i] = rr_peer_fold<D, Op>(peers, world, i);
    }
}

// to[i] = from[i] for this thread's indices i < count of `split` (head and tail one by one, the
// vectors as 16-byte copies when both sides sit at the split's offset within 16 bytes, else one
// by one): the same indices rr_peer_reduce_body folds for the same split.
template <typename T>
static __device__ __forceinline__ void rr_split_copy(const rr_peer_split<T>& split,
                                                     const T* from, T* to, rr_ull count) {
    const unsigned per_vec = 16 / sizeof(T);
    const rr_ull first = split.first, stride = split.stride;
    const rr_ull head = split.head, vecs = split.vecs, tail = split.tail;
    const bool vector = rr_misalign(from) == split.misalign && rr_misalign(to) == split.misalign;

    for (rr_ull i = first; i < head; i += stride) {
        to[i] = from[i];
    }
    const rr_ull vec_stride = stride * RR_PEER_UNROLL;
    for (rr_ull base = (rr_ull)blockIdx.x * blockDim.x * RR_PEER_UNROLL + threadIdx.x;
         base < vecs; base += vec_stride) {
#pragma unroll
        for (unsigned u = 0; u < RR_PEER_UNROLL; ++u) {
            const rr_ull v = base + (rr_ull)u * blockDim.x;
            if (v < vecs) {
                if (vector) {
                    reinterpret_cast<uint4*>(to + head)[v] =
                        reinterpret_cast<const uint4*>(from + head)[v];
                } else {
#pragma unroll
                    for (unsigned k = 0; k < per_vec; ++k) {
                        to[head + v * per_vec + k] = from[head + v * per_vec + k];
                    }
                }
            }
        }
    }
    for (rr_ull i = tail + first; i < count; i += stride) {
        to[i] = from[i];
    }
}

// The in-place one-shot's exposure, fused into the kernel: before the start barrier, this block
// copies ITS indices of the rank's in-place buffer `from` into the rank's exposed buffer
// peers.src[rank], with exactly the partition rr_peer_reduce_body uses (it depends only on count,
// the grid and the sources' offsets within 16 bytes, equal on every rank). After the barrier,
// block b of every rank reads only block b's indices of each exposed buffer — the indices the
// matching block copied before it signalled — and then overwrites those indices of `from`
// (its dst), which no peer reads. One launch instead of a copy-engine copy and a launch.
template <typename T>
static __device__ __forceinline__ void rr_oneshot_expose(const rr_peers& peers, unsigned world,
                                                         unsigned rank, const T* from,
                                                         rr_ull count) {
    const rr_peer_split<T> split(peers, world, count);
    rr_split_copy<T>(split, from, static_cast<T*>(const_cast<void*>(peers.src[rank])), count);
}

// ---------------------------------------------------------------------------------------------
// rr_oneshot_<op>_<type>(rr_peers peers, unsigned world, unsigned rank, T* dst,
//                        unsigned long long count, unsigned epoch,
//                        unsigned long long timeout_ns, unsigned* error, const T* expose_from)
//
// Purpose: the whole all-reduce in one kernel per rank, for small and medium messages:
//   dst[i] = src[0][i] ⊕ src[1][i] ⊕ ... ⊕ src[world - 1][i] for i < count, folded in rank
//   order on every rank (so floats come out bit-identical everywhere), between a start barrier
//   (every rank's inputs are ready) and an end barrier (no rank reads this rank's input any
//   more when this kernel is complete). Avg is sum here, then rr_scale_<type>.
// Assumptions: all `world` ranks (2..=8) launch the kernel of the same op and type, with the same
//   grid (<= RR_PEER_MAX_BLOCKS blocks of 8..=RR_PEER_THREADS threads), peers, count and
//   epoch, on their own GPUs, free to run at the same time; every block of every rank gets an
//   SM within the timeout (a block waits only for the blocks of its own index on the other
//   ranks, never for another block of its own grid, so blocks that start late only delay
//   their partners). peers.src[r] (r < world) is readable and peers.flags[r] readable and
//   writable from this GPU (peer access on), aligned to sizeof(T) and 4; src[r] is valid for
//   `count` elements, written before rank r's kernel starts and not again until rank r's
//   kernel is complete (its end barrier waits for every reader). dst is
//   writable from this GPU, valid for `count` elements and disjoint from every source (peers
//   read src[rank] while this rank writes dst). In place, src[rank] is the rank's exposed
//   buffer and expose_from its in-place buffer (== dst): each block first copies its indices
//   of expose_from into src[rank] (rr_oneshot_expose); otherwise expose_from is null. epoch is
//   the previous call's epoch + 1 on these flags (the first call: 1; 0 may be skipped on
//   wrapping), the flag arrays started at zero, and every call on them is made by all ranks.
//   error points to a word this GPU can write (host-mapped pinned, so the host can watch it).
//   On any error code the result is undefined on every rank, a peer may still be reading
//   src[rank], and the flags are out of step: the caller must stop using these flags (or
//   re-zero them on every rank once everything is idle and restart at epoch 1).
// Why it is fast: no copy engines and no host between the ranks: one launch per rank, two
//   barriers of a few µs each (one flag write over NVLink and one spin on local memory per
//   peer, all peers in parallel), and the data read once from every source and written once.
//   16-byte vector loads when all sources share their offset within 16 bytes (scalar head and
//   tail), coalesced per warp, 2 x RR_PEER_UNROLL of them in flight per thread (the next
//   source's loads are issued before the current one is combined): NVLink's latency is hidden
//   by loads in flight rather than by threads. The grid is sized by the caller to the message
//   (about 1 block per 32 KiB of one rank's input), at most RR_PEER_MAX_BLOCKS: with at most
//   128 registers a thread (__launch_bounds__(512, 1); 8-bit min/max spill a few dozen bytes,
//   to L1) one block fits on an SM, so the whole grid is resident at once on a 132-SM H200.
// ---------------------------------------------------------------------------------------------
template <class D, class Op>
static __device__ __forceinline__ void rr_oneshot_kernel(const rr_peers& peers, unsigned world,
                                                         unsigned rank, typename D::T* dst,
                                                         rr_ull count, unsigned epoch,
                                                         rr_ull timeout_ns, unsigned* error,
                                                         const typename D::T* expose_from) {
    __shared__ unsigned* flags[RR_PEER_MAX_RANKS];
    if (!rr_peer_begin(peers, world, rank, error, flags)) {
        return;
    }
    const rr_ull deadline = rr_deadline(timeout_ns);
    if (expose_from != nullptr) {
        rr_oneshot_expose<typename D::T>(peers, world, rank, expose_from, count);
    }
    // (The barrier's opening __syncthreads() makes `flags` visible to the block, and orders the
    // block's exposure copy before its signal.)
    if (!rr_peer_barrier(flags, world, rank, RR_PHASE_START, RR_PEER_ERR_START, true, epoch,
                         deadline, error)) {
        return;  // a peer is missing: read nothing of it
    }
    rr_peer_reduce_body<D, Op>(peers, world, dst, count);
    rr_peer_barrier(flags, world, rank, RR_ONESHOT_PHASE_END, RR_PEER_ERR_END, false, epoch,
                    deadline, error);
}

// ---------------------------------------------------------------------------------------------
// The two-shot all-reduce (src/plan/twoshot.rs): rank r reduces its own segment s_r from every
// rank's source into its own output, then copies every other segment s_q from its owner q's
// output. Three barriers: start (sources ready), middle (every segment reduced; every rank done
// reading the sources), end (every rank done reading every output).
//
// Kernel parameter: every rank's output and the segment bounds, in elements (segment q =
// [off[q], off[q] + len[q]), the same on every rank).
struct rr_twoshot_segs {
    void* out[RR_PEER_MAX_RANKS];
    rr_ull off[RR_PEER_MAX_RANKS];
    rr_ull len[RR_PEER_MAX_RANKS];
};

// `peers` with every source moved `offset` elements on.
template <typename T>
static __device__ __forceinline__ rr_peers rr_peers_at(const rr_peers& peers, rr_ull offset) {
    rr_peers moved = peers;
#pragma unroll
    for (unsigned r = 0; r < RR_PEER_MAX_RANKS; ++r) {
        moved.src[r] = static_cast<const T*>(peers.src[r]) + offset;
    }
    return moved;
}

// rr_twoshot_<op>_<type>(rr_peers peers, rr_twoshot_segs segs, unsigned world, unsigned rank,
//                        unsigned epoch, unsigned long long timeout_ns, unsigned* error)
// Purpose: this rank's part of a two-shot all-reduce: segs.out[rank][s_rank] = fold over ranks r
//   (in rank order) of peers.src[r][s_rank]; then segs.out[rank][s_q] = segs.out[q][s_q] for
//   every q != rank.
// Assumptions: as rr_oneshot_<op>_<type> for world, rank, the grid, flags, epoch, timeout and
//   error, and: every rank launches with the same peers.src, segs and grid. The segments tile
//   the buffer without overlap. In place, peers.src[r] == segs.out[r] (no exposed copy): rank r
//   writes only s_r of its buffer before MIDDLE — which no other rank reads before MIDDLE (each
//   reads s_p of everyone) and which rank r reads itself element by element, each element in
//   the same thread just before writing it — and only the other segments after MIDDLE, which no
//   rank reads after MIDDLE (the gather reads each segment from its owner only).
// Per block: block b of rank q reduces the indices of s_q that the split of (peers moved to
//   s_q, len[q]) gives block b; block b of rank r copies exactly those indices of s_q (the same
//   split, computed from the same peers and segs) after its MIDDLE barrier with block b of every
//   rank. So each block needs only its partner blocks, as in the one-shot.
// Why it is fast: each rank reads 2(n-1)/n of the message over NVLink, like the ring, and (for
//   two ranks) as much as the one-shot — but in place it needs no copy of the buffer, and it
//   reads half as much local memory. One launch per rank; the gather is a plain 16-byte copy.
// ---------------------------------------------------------------------------------------------
template <class D, class Op>
static __device__ __forceinline__ void rr_twoshot_kernel(const rr_peers& peers,
                                                         const rr_twoshot_segs& segs,
                                                         unsigned world, unsigned rank,
                                                         unsigned epoch, rr_ull timeout_ns,
                                                         unsigned* error) {
    typedef typename D::T T;
    __shared__ unsigned* flags[RR_PEER_MAX_RANKS];
    if (!rr_peer_begin(peers, world, rank, error, flags)) {
        return;
    }
    T* out = static_cast<T*>(segs.out[rank]);
    const rr_ull deadline = rr_deadline(timeout_ns);
    if (!rr_peer_barrier(flags, world, rank, RR_PHASE_START, RR_PEER_ERR_START, true, epoch,
                         deadline, error)) {
        return;  // a peer is missing: read nothing of it
    }
    {
        const rr_ull off = segs.off[rank];
        rr_peer_reduce_body<D, Op>(rr_peers_at<T>(peers, off), world, out + off, segs.len[rank]);
    }
    if (!rr_peer_barrier(flags, world, rank, RR_TWOSHOT_PHASE_MIDDLE, RR_PEER_ERR_MIDDLE, true,
                         epoch, deadline, error)) {
        return;  // a segment may be unfinished: copy nothing
    }
    for (unsigned j = 1; j < world; ++j) {
        const unsigned q = (rank + j) % world;
        const rr_ull off = segs.off[q];
        const rr_peer_split<T> split(rr_peers_at<T>(peers, off), world, segs.len[q]);
        rr_split_copy<T>(split, static_cast<const T*>(segs.out[q]) + off, out + off,
                         segs.len[q]);
    }
    rr_peer_barrier(flags, world, rank, RR_TWOSHOT_PHASE_END, RR_PEER_ERR_END, false, epoch,
                    deadline, error);
}

// ---------------------------------------------------------------------------------------------
// The exported kernels: 4 operators x 10 types of pairwise reduce, of one-shot and of two-shot
// all-reduce, and one scale kernel per type. RR_REDUCE(symbol, op, type), RR_ONESHOT(symbol, op,
// type), RR_TWOSHOT(symbol, op, type) and RR_SCALE(symbol, type): the symbol is written out in
// full and must read rr_reduce_<op>_<type> / rr_oneshot_<op>_<type> / rr_twoshot_<op>_<type> /
// rr_scale_<type> (checked by the tests in kernels.rs).
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

#define RR_ONESHOT(symbol, op, type)                                                         \
    extern "C" __global__ void __launch_bounds__(RR_PEER_THREADS, 1)                       \
        symbol(rr_peers peers, unsigned world, unsigned rank, type::T* dst,                  \
               unsigned long long count, unsigned epoch, unsigned long long timeout_ns,      \
               unsigned* error, const type::T* expose_from) {                                \
        rr_oneshot_kernel<type, rr_op_##op>(peers, world, rank, dst, count, epoch,           \
                                            timeout_ns, error, expose_from);                 \
    }

#define RR_TWOSHOT(symbol, op, type)                                                         \
    extern "C" __global__ void __launch_bounds__(RR_PEER_THREADS, 1)                       \
        symbol(rr_peers peers, rr_twoshot_segs segs, unsigned world, unsigned rank,          \
               unsigned epoch, unsigned long long timeout_ns, unsigned* error) {             \
        rr_twoshot_kernel<type, rr_op_##op>(peers, segs, world, rank, epoch, timeout_ns,     \
                                            error);                                          \
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

RR_ONESHOT(rr_oneshot_sum_f16, sum, rr_f16)
RR_ONESHOT(rr_oneshot_sum_bf16, sum, rr_bf16)
RR_ONESHOT(rr_oneshot_sum_f32, sum, rr_f32)
RR_ONESHOT(rr_oneshot_sum_f64, sum, rr_f64)
RR_ONESHOT(rr_oneshot_sum_i8, sum, rr_i8)
RR_ONESHOT(rr_oneshot_sum_u8, sum, rr_u8)
RR_ONESHOT(rr_oneshot_sum_i32, sum, rr_i32)
RR_ONESHOT(rr_oneshot_sum_u32, sum, rr_u32)
RR_ONESHOT(rr_oneshot_sum_i64, sum, rr_i64)
RR_ONESHOT(rr_oneshot_sum_u64, sum, rr_u64)

RR_ONESHOT(rr_oneshot_prod_f16, prod, rr_f16)
RR_ONESHOT(rr_oneshot_prod_bf16, prod, rr_bf16)
RR_ONESHOT(rr_oneshot_prod_f32, prod, rr_f32)
RR_ONESHOT(rr_oneshot_prod_f64, prod, rr_f64)
RR_ONESHOT(rr_oneshot_prod_i8, prod, rr_i8)
RR_ONESHOT(rr_oneshot_prod_u8, prod, rr_u8)
RR_ONESHOT(rr_oneshot_prod_i32, prod, rr_i32)
RR_ONESHOT(rr_oneshot_prod_u32, prod, rr_u32)
RR_ONESHOT(rr_oneshot_prod_i64, prod, rr_i64)
RR_ONESHOT(rr_oneshot_prod_u64, prod, rr_u64)

RR_ONESHOT(rr_oneshot_min_f16, min, rr_f16)
RR_ONESHOT(rr_oneshot_min_bf16, min, rr_bf16)
RR_ONESHOT(rr_oneshot_min_f32, min, rr_f32)
RR_ONESHOT(rr_oneshot_min_f64, min, rr_f64)
RR_ONESHOT(rr_oneshot_min_i8, min, rr_i8)
RR_ONESHOT(rr_oneshot_min_u8, min, rr_u8)
RR_ONESHOT(rr_oneshot_min_i32, min, rr_i32)
RR_ONESHOT(rr_oneshot_min_u32, min, rr_u32)
RR_ONESHOT(rr_oneshot_min_i64, min, rr_i64)
RR_ONESHOT(rr_oneshot_min_u64, min, rr_u64)

RR_ONESHOT(rr_oneshot_max_f16, max, rr_f16)
RR_ONESHOT(rr_oneshot_max_bf16, max, rr_bf16)
RR_ONESHOT(rr_oneshot_max_f32, max, rr_f32)
RR_ONESHOT(rr_oneshot_max_f64, max, rr_f64)
RR_ONESHOT(rr_oneshot_max_i8, max, rr_i8)
RR_ONESHOT(rr_oneshot_max_u8, max, rr_u8)
RR_ONESHOT(rr_oneshot_max_i32, max, rr_i32)
RR_ONESHOT(rr_oneshot_max_u32, max, rr_u32)
RR_ONESHOT(rr_oneshot_max_i64, max, rr_i64)
RR_ONESHOT(rr_oneshot_max_u64, max, rr_u64)

RR_TWOSHOT(rr_twoshot_sum_f16, sum, rr_f16)
RR_TWOSHOT(rr_twoshot_sum_bf16, sum, rr_bf16)
RR_TWOSHOT(rr_twoshot_sum_f32, sum, rr_f32)
RR_TWOSHOT(rr_twoshot_sum_f64, sum, rr_f64)
RR_TWOSHOT(rr_twoshot_sum_i8, sum, rr_i8)
RR_TWOSHOT(rr_twoshot_sum_u8, sum, rr_u8)
RR_TWOSHOT(rr_twoshot_sum_i32, sum, rr_i32)
RR_TWOSHOT(rr_twoshot_sum_u32, sum, rr_u32)
RR_TWOSHOT(rr_twoshot_sum_i64, sum, rr_i64)
RR_TWOSHOT(rr_twoshot_sum_u64, sum, rr_u64)
RR_TWOSHOT(rr_twoshot_prod_f16, prod, rr_f16)
RR_TWOSHOT(rr_twoshot_prod_bf16, prod, rr_bf16)
RR_TWOSHOT(rr_twoshot_prod_f32, prod, rr_f32)
RR_TWOSHOT(rr_twoshot_prod_f64, prod, rr_f64)
RR_TWOSHOT(rr_twoshot_prod_i8, prod, rr_i8)
RR_TWOSHOT(rr_twoshot_prod_u8, prod, rr_u8)
RR_TWOSHOT(rr_twoshot_prod_i32, prod, rr_i32)
RR_TWOSHOT(rr_twoshot_prod_u32, prod, rr_u32)
RR_TWOSHOT(rr_twoshot_prod_i64, prod, rr_i64)
RR_TWOSHOT(rr_twoshot_prod_u64, prod, rr_u64)
RR_TWOSHOT(rr_twoshot_min_f16, min, rr_f16)
RR_TWOSHOT(rr_twoshot_min_bf16, min, rr_bf16)
RR_TWOSHOT(rr_twoshot_min_f32, min, rr_f32)
RR_TWOSHOT(rr_twoshot_min_f64, min, rr_f64)
RR_TWOSHOT(rr_twoshot_min_i8, min, rr_i8)
RR_TWOSHOT(rr_twoshot_min_u8, min, rr_u8)
RR_TWOSHOT(rr_twoshot_min_i32, min, rr_i32)
RR_TWOSHOT(rr_twoshot_min_u32, min, rr_u32)
RR_TWOSHOT(rr_twoshot_min_i64, min, rr_i64)
RR_TWOSHOT(rr_twoshot_min_u64, min, rr_u64)
RR_TWOSHOT(rr_twoshot_max_f16, max, rr_f16)
RR_TWOSHOT(rr_twoshot_max_bf16, max, rr_bf16)
RR_TWOSHOT(rr_twoshot_max_f32, max, rr_f32)
RR_TWOSHOT(rr_twoshot_max_f64, max, rr_f64)
RR_TWOSHOT(rr_twoshot_max_i8, max, rr_i8)
RR_TWOSHOT(rr_twoshot_max_u8, max, rr_u8)
RR_TWOSHOT(rr_twoshot_max_i32, max, rr_i32)
RR_TWOSHOT(rr_twoshot_max_u32, max, rr_u32)
RR_TWOSHOT(rr_twoshot_max_i64, max, rr_i64)
RR_TWOSHOT(rr_twoshot_max_u64, max, rr_u64)
