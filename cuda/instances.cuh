// A part of the kernel source of ringreduce: the exported kernels, every symbol spelled out in
// full, where the unit tests in src/exec/cuda/kernels/ find them by name.
//
// Joined into one translation unit by build.rs, in the order of its PARTS (error_codes.cuh
// first). No part includes another: NVRTC compiles the joined text with no include paths, so the
// kernels include NO header at all.

// ---------------------------------------------------------------------------------------------
// The exported kernels: 4 operators x 12 types of pairwise reduce, of one-shot, of two-shot and
// of LL one-shot all-reduce and of the other collectives' one-shot steps, one scale kernel and
// one PreMulSum multiply per type, and the two counter kernels (at the end).
// RR_REDUCE(symbol, op, type), RR_ONESHOT(symbol, op, type), RR_TWOSHOT(symbol, op, type),
// RR_STEPS(symbol, op, type), RR_LL(symbol, op, type), RR_SCALE(symbol, type) and
// RR_PREMUL(symbol, type): the symbol is written out in full and must read
// rr_reduce_<op>_<type> / rr_oneshot_<op>_<type> / rr_twoshot_<op>_<type> /
// rr_steps_<op>_<type> / rr_ll_<op>_<type> / rr_scale_<type> / rr_premul_<type> (checked by the
// tests in src/exec/cuda/kernels/mod.rs).
// ---------------------------------------------------------------------------------------------
#define RR_REDUCE(symbol, op, type)                                                          \
    extern "C" __global__ void symbol(type::T* dst, const type::T* a, const type::T* b,     \
                                      unsigned long long count) {                          \
        rr_reduce_body<type, rr_op_##op>(dst, a, b, count);                                \
    }

#define RR_SCALE(symbol, type)                                                               \
    extern "C" __global__ void symbol(type::T* x, unsigned long long count,                  \
                                      unsigned long long world, const unsigned* error) {   \
        rr_scale_body<type>(x, count, world, error);                                       \
    }

#define RR_PREMUL(symbol, type)                                                              \
    extern "C" __global__ void symbol(type::T* dst, const type::T* src, unsigned long long count, \
                                      const type::T* scalar_at, unsigned long long scalar_bits) { \
        rr_premul_body<type>(dst, src, count, scalar_at, scalar_bits);                       \
    }

#define RR_ONESHOT(symbol, op, type)                                                         \
    extern "C" __global__ void __launch_bounds__(RR_PEER_THREADS, 1)                       \
        symbol(rr_peers peers, unsigned world, unsigned rank, type::T* dst,                  \
               unsigned long long count, unsigned long long timeout_ns, unsigned* error,     \
               const type::T* expose_from, rr_call_gate gate) {                              \
        rr_oneshot_kernel<type, rr_op_##op>(peers, world, rank, dst, count, timeout_ns,      \
                                            error, expose_from, gate);                       \
    }

#define RR_TWOSHOT(symbol, op, type)                                                         \
    extern "C" __global__ void __launch_bounds__(RR_PEER_THREADS, 1)                       \
        symbol(rr_peers peers, rr_twoshot_segs segs, unsigned world, unsigned rank,          \
               unsigned long long timeout_ns, unsigned* error, rr_call_gate gate) {          \
        rr_twoshot_kernel<type, rr_op_##op>(peers, segs, world, rank, timeout_ns, error,     \
                                            gate);                                           \
    }

#define RR_STEPS(symbol, op, type)                                                           \
    extern "C" __global__ void __launch_bounds__(RR_PEER_THREADS, 1)                       \
        symbol(rr_peers peers, rr_steps steps, unsigned world, unsigned rank,                \
               unsigned long long count, unsigned long long timeout_ns, unsigned* error,     \
               rr_call_gate gate) {                                                          \
        rr_steps_kernel<type, rr_op_##op>(peers, steps, world, rank, count, timeout_ns,      \
                                          error, gate);                                      \
    }

#define RR_LL(symbol, op, type)                                                              \
    extern "C" __global__ void __launch_bounds__(RR_LL_THREADS, 1)                         \
        symbol(rr_ll_peers peers, unsigned* flags, unsigned world, unsigned rank,             \
               const type::T* src, type::T* dst, unsigned long long count,                   \
               unsigned long long timeout_ns, unsigned* error, rr_call_gate gate) {          \
        rr_ll_kernel<type, rr_op_##op>(peers, flags, world, rank, src, dst, count,           \
                                       timeout_ns, error, gate);                             \
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
RR_REDUCE(rr_reduce_sum_f8e4m3, sum, rr_f8e4m3)
RR_REDUCE(rr_reduce_sum_f8e5m2, sum, rr_f8e5m2)

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
RR_REDUCE(rr_reduce_prod_f8e4m3, prod, rr_f8e4m3)
RR_REDUCE(rr_reduce_prod_f8e5m2, prod, rr_f8e5m2)

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
RR_REDUCE(rr_reduce_min_f8e4m3, min, rr_f8e4m3)
RR_REDUCE(rr_reduce_min_f8e5m2, min, rr_f8e5m2)

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
RR_REDUCE(rr_reduce_max_f8e4m3, max, rr_f8e4m3)
RR_REDUCE(rr_reduce_max_f8e5m2, max, rr_f8e5m2)

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
RR_SCALE(rr_scale_f8e4m3, rr_f8e4m3)
RR_SCALE(rr_scale_f8e5m2, rr_f8e5m2)

RR_PREMUL(rr_premul_f16, rr_f16)
RR_PREMUL(rr_premul_bf16, rr_bf16)
RR_PREMUL(rr_premul_f32, rr_f32)
RR_PREMUL(rr_premul_f64, rr_f64)
RR_PREMUL(rr_premul_i8, rr_i8)
RR_PREMUL(rr_premul_u8, rr_u8)
RR_PREMUL(rr_premul_i32, rr_i32)
RR_PREMUL(rr_premul_u32, rr_u32)
RR_PREMUL(rr_premul_i64, rr_i64)
RR_PREMUL(rr_premul_u64, rr_u64)
RR_PREMUL(rr_premul_f8e4m3, rr_f8e4m3)
RR_PREMUL(rr_premul_f8e5m2, rr_f8e5m2)

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
RR_ONESHOT(rr_oneshot_sum_f8e4m3, sum, rr_f8e4m3)
RR_ONESHOT(rr_oneshot_sum_f8e5m2, sum, rr_f8e5m2)

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
RR_ONESHOT(rr_oneshot_prod_f8e4m3, prod, rr_f8e4m3)
RR_ONESHOT(rr_oneshot_prod_f8e5m2, prod, rr_f8e5m2)

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
RR_ONESHOT(rr_oneshot_min_f8e4m3, min, rr_f8e4m3)
RR_ONESHOT(rr_oneshot_min_f8e5m2, min, rr_f8e5m2)

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
RR_ONESHOT(rr_oneshot_max_f8e4m3, max, rr_f8e4m3)
RR_ONESHOT(rr_oneshot_max_f8e5m2, max, rr_f8e5m2)

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
RR_TWOSHOT(rr_twoshot_sum_f8e4m3, sum, rr_f8e4m3)
RR_TWOSHOT(rr_twoshot_sum_f8e5m2, sum, rr_f8e5m2)
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
RR_TWOSHOT(rr_twoshot_prod_f8e4m3, prod, rr_f8e4m3)
RR_TWOSHOT(rr_twoshot_prod_f8e5m2, prod, rr_f8e5m2)
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
RR_TWOSHOT(rr_twoshot_min_f8e4m3, min, rr_f8e4m3)
RR_TWOSHOT(rr_twoshot_min_f8e5m2, min, rr_f8e5m2)
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
RR_TWOSHOT(rr_twoshot_max_f8e4m3, max, rr_f8e4m3)
RR_TWOSHOT(rr_twoshot_max_f8e5m2, max, rr_f8e5m2)

RR_STEPS(rr_steps_sum_f16, sum, rr_f16)
RR_STEPS(rr_steps_sum_bf16, sum, rr_bf16)
RR_STEPS(rr_steps_sum_f32, sum, rr_f32)
RR_STEPS(rr_steps_sum_f64, sum, rr_f64)
RR_STEPS(rr_steps_sum_i8, sum, rr_i8)
RR_STEPS(rr_steps_sum_u8, sum, rr_u8)
RR_STEPS(rr_steps_sum_i32, sum, rr_i32)
RR_STEPS(rr_steps_sum_u32, sum, rr_u32)
RR_STEPS(rr_steps_sum_i64, sum, rr_i64)
RR_STEPS(rr_steps_sum_u64, sum, rr_u64)
RR_STEPS(rr_steps_sum_f8e4m3, sum, rr_f8e4m3)
RR_STEPS(rr_steps_sum_f8e5m2, sum, rr_f8e5m2)
RR_STEPS(rr_steps_prod_f16, prod, rr_f16)
RR_STEPS(rr_steps_prod_bf16, prod, rr_bf16)
RR_STEPS(rr_steps_prod_f32, prod, rr_f32)
RR_STEPS(rr_steps_prod_f64, prod, rr_f64)
RR_STEPS(rr_steps_prod_i8, prod, rr_i8)
RR_STEPS(rr_steps_prod_u8, prod, rr_u8)
RR_STEPS(rr_steps_prod_i32, prod, rr_i32)
RR_STEPS(rr_steps_prod_u32, prod, rr_u32)
RR_STEPS(rr_steps_prod_i64, prod, rr_i64)
RR_STEPS(rr_steps_prod_u64, prod, rr_u64)
RR_STEPS(rr_steps_prod_f8e4m3, prod, rr_f8e4m3)
RR_STEPS(rr_steps_prod_f8e5m2, prod, rr_f8e5m2)
RR_STEPS(rr_steps_min_f16, min, rr_f16)
RR_STEPS(rr_steps_min_bf16, min, rr_bf16)
RR_STEPS(rr_steps_min_f32, min, rr_f32)
RR_STEPS(rr_steps_min_f64, min, rr_f64)
RR_STEPS(rr_steps_min_i8, min, rr_i8)
RR_STEPS(rr_steps_min_u8, min, rr_u8)
RR_STEPS(rr_steps_min_i32, min, rr_i32)
RR_STEPS(rr_steps_min_u32, min, rr_u32)
RR_STEPS(rr_steps_min_i64, min, rr_i64)
RR_STEPS(rr_steps_min_u64, min, rr_u64)
RR_STEPS(rr_steps_min_f8e4m3, min, rr_f8e4m3)
RR_STEPS(rr_steps_min_f8e5m2, min, rr_f8e5m2)
RR_STEPS(rr_steps_max_f16, max, rr_f16)
RR_STEPS(rr_steps_max_bf16, max, rr_bf16)
RR_STEPS(rr_steps_max_f32, max, rr_f32)
RR_STEPS(rr_steps_max_f64, max, rr_f64)
RR_STEPS(rr_steps_max_i8, max, rr_i8)
RR_STEPS(rr_steps_max_u8, max, rr_u8)
RR_STEPS(rr_steps_max_i32, max, rr_i32)
RR_STEPS(rr_steps_max_u32, max, rr_u32)
RR_STEPS(rr_steps_max_i64, max, rr_i64)
RR_STEPS(rr_steps_max_u64, max, rr_u64)
RR_STEPS(rr_steps_max_f8e4m3, max, rr_f8e4m3)
RR_STEPS(rr_steps_max_f8e5m2, max, rr_f8e5m2)

RR_LL(rr_ll_sum_f16, sum, rr_f16)
RR_LL(rr_ll_sum_bf16, sum, rr_bf16)
RR_LL(rr_ll_sum_f32, sum, rr_f32)
RR_LL(rr_ll_sum_f64, sum, rr_f64)
RR_LL(rr_ll_sum_i8, sum, rr_i8)
RR_LL(rr_ll_sum_u8, sum, rr_u8)
RR_LL(rr_ll_sum_i32, sum, rr_i32)
RR_LL(rr_ll_sum_u32, sum, rr_u32)
RR_LL(rr_ll_sum_i64, sum, rr_i64)
RR_LL(rr_ll_sum_u64, sum, rr_u64)
RR_LL(rr_ll_sum_f8e4m3, sum, rr_f8e4m3)
RR_LL(rr_ll_sum_f8e5m2, sum, rr_f8e5m2)

RR_LL(rr_ll_prod_f16, prod, rr_f16)
RR_LL(rr_ll_prod_bf16, prod, rr_bf16)
RR_LL(rr_ll_prod_f32, prod, rr_f32)
RR_LL(rr_ll_prod_f64, prod, rr_f64)
RR_LL(rr_ll_prod_i8, prod, rr_i8)
RR_LL(rr_ll_prod_u8, prod, rr_u8)
RR_LL(rr_ll_prod_i32, prod, rr_i32)
RR_LL(rr_ll_prod_u32, prod, rr_u32)
RR_LL(rr_ll_prod_i64, prod, rr_i64)
RR_LL(rr_ll_prod_u64, prod, rr_u64)
RR_LL(rr_ll_prod_f8e4m3, prod, rr_f8e4m3)
RR_LL(rr_ll_prod_f8e5m2, prod, rr_f8e5m2)

RR_LL(rr_ll_min_f16, min, rr_f16)
RR_LL(rr_ll_min_bf16, min, rr_bf16)
RR_LL(rr_ll_min_f32, min, rr_f32)
RR_LL(rr_ll_min_f64, min, rr_f64)
RR_LL(rr_ll_min_i8, min, rr_i8)
RR_LL(rr_ll_min_u8, min, rr_u8)
RR_LL(rr_ll_min_i32, min, rr_i32)
RR_LL(rr_ll_min_u32, min, rr_u32)
RR_LL(rr_ll_min_i64, min, rr_i64)
RR_LL(rr_ll_min_u64, min, rr_u64)
RR_LL(rr_ll_min_f8e4m3, min, rr_f8e4m3)
RR_LL(rr_ll_min_f8e5m2, min, rr_f8e5m2)

RR_LL(rr_ll_max_f16, max, rr_f16)
RR_LL(rr_ll_max_bf16, max, rr_bf16)
RR_LL(rr_ll_max_f32, max, rr_f32)
RR_LL(rr_ll_max_f64, max, rr_f64)
RR_LL(rr_ll_max_i8, max, rr_i8)
RR_LL(rr_ll_max_u8, max, rr_u8)
RR_LL(rr_ll_max_i32, max, rr_i32)
RR_LL(rr_ll_max_u32, max, rr_u32)
RR_LL(rr_ll_max_i64, max, rr_i64)
RR_LL(rr_ll_max_u64, max, rr_u64)
RR_LL(rr_ll_max_f8e4m3, max, rr_f8e4m3)
RR_LL(rr_ll_max_f8e5m2, max, rr_f8e5m2)
// The event counter kernels of captured rings (counters.cuh).
extern "C" __global__ void rr_counter_signal(unsigned* sent, unsigned* mailbox) {
    rr_counter_signal_body(sent, mailbox);
}
extern "C" __global__ void rr_counter_wait(const unsigned* mailbox, unsigned* seen,
                                           unsigned long long timeout_ns, unsigned* error,
                                           unsigned code) {
    rr_counter_wait_body(mailbox, seen, timeout_ns, error, code);
}
// The point-to-point channel (channel.cuh).
extern "C" __global__ void __launch_bounds__(RR_PEER_THREADS, 1)
    rr_channel(rr_channel_args args, unsigned long long timeout_ns, unsigned* error,
               rr_call_gate gate) {
    rr_channel_kernel(args, timeout_ns, error, gate);
}
