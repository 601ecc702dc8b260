// A part of the kernel source of ringreduce: the bodies of the copy-engine ring's kernels, the
// pairwise reduce (one ring step) and the Avg-scale (the last step of Avg).
//
// Joined into one translation unit by build.rs, in the order of its PARTS (error_codes.cuh
// first). No part includes another: NVRTC compiles the joined text with no include paths, so the
// kernels include NO header at all.

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
// rr_scale_<type>(T* x, unsigned long long count, unsigned long long world,
//                 const unsigned* error)
//
// Purpose: the last step of Avg: x[i] = x[i] / world as src/element.rs defines it (floats times
//   1/world, integers divided by world, truncating), in place, for i < count — unless `error`
//   (the rank's error word; null: none) holds a code: the call's peer kernel, before it on the
//   stream, failed or found the call different from a peer's, and x must stay as it was.
// Assumptions: x is a device address aligned to sizeof(T), valid for `count` elements, written
//   by no one else meanwhile. Any grid and block size works; world == 0 acts as 1.
// Why it is fast: the factor (1/world, or the divisor) is computed once per thread, outside the
//   loop; a grid-stride loop over 16-byte vectors from x's first 16-byte boundary, with the
//   elements before it and after the last whole vector done one by one.
// ---------------------------------------------------------------------------------------------
template <class D>
static __device__ __forceinline__ void rr_scale_body(typename D::T* x, rr_ull count, rr_ull world,
                                                     const unsigned* error) {
    typedef typename D::T T;
    if (error != nullptr && *(const volatile unsigned*)error != 0) {
        return;
    }
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
// rr_premul_<type>(T* dst, const T* src, unsigned long long count, const T* scalar_at,
//                  unsigned long long scalar_bits)
//
// Purpose: the first step of NCCL's PreMulSum: dst[i] = src[i] * s for i < count, where s is
//   one element of the type — read from device memory at scalar_at when it is not null (read
//   when the kernel runs, so work queued before it on the stream may write it), else held in
//   the low bytes of scalar_bits (a value the host read when the operator was made). Floats
//   multiply as prod does (f16/bf16/fp8 in f32, rounded once); integers wrap.
// Assumptions: src and dst are device addresses aligned to sizeof(T), valid for `count`
//   elements; they are equal or do not overlap; scalar_at, when set, is a device address of one
//   element aligned to sizeof(T). Any grid and block size works.
// Why it is fast: the factor is read once per thread; a grid-stride loop of coalesced element
//   accesses (memory-bound; src and dst may differ in their 16-byte alignment, so no vectors).
// ---------------------------------------------------------------------------------------------
template <class D>
static __device__ __forceinline__ void rr_premul_body(typename D::T* dst, const typename D::T* src,
                                                      rr_ull count, const typename D::T* scalar_at,
                                                      rr_ull scalar_bits) {
    typedef typename D::T T;
    const T s = scalar_at != 0 ? *scalar_at : *reinterpret_cast<const T*>(&scalar_bits);
    const typename D::Mul m = D::mul_param(s);
    const rr_ull stride = (rr_ull)gridDim.x * blockDim.x;
    for (rr_ull i = (rr_ull)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        dst[i] = D::mul(src[i], m);
    }
}
