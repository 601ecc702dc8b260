// A part of the kernel source of ringreduce: what the peer kernels (one-shot and two-shot
// all-reduce) share: the flag layout, the barriers, the fold over ranks, the split of the
// elements between threads and the split copy. The kernel bodies are in peer_kernels.cuh.
//
// Joined into one translation unit by build.rs, in the order of its PARTS (error_codes.cuh
// first). No part includes another: NVRTC compiles the joined text with no include paths, so the
// kernels include NO header at all.

// ---------------------------------------------------------------------------------------------
// The peer kernels (one-shot and two-shot all-reduce): every rank reads every rank's memory
// directly (its own locally, the others over NVLink through peer access) and folds it itself;
// ranks meet at flag barriers, two in the one-shot (start, end), three in the two-shot (start,
// middle, end). The rr_peer_* pieces below serve both kernels.
//
// Flags: each rank owns one array of RR_PEER_FLAG_WORDS words in its own device memory (12.5 KiB,
// zeroed once, never reset). Word
//     (phase * RR_PEER_MAX_BLOCKS + block) * RR_PEER_MAX_RANKS + from
// of rank p's array is written only by rank `from`'s block `block`, at barrier `phase` (0: start;
// 1: the one-shot's end or the two-shot's middle; 2: the two-shot's end), with the block's epoch;
// rank p's block `block` spins on it. One writer per word, so no atomics.
//
// Epochs live on the device: word RR_PEER_EPOCH_BASE + block of a rank's array is its block
// `block`'s epoch, which that block advances itself at the start of every kernel it runs (1, 2,
// 3, ... wrapping, skipping 0 with the parity kept: rr_epoch_next). The LL one-shot (ll.cuh)
// advances the same words, so calls of every peer kernel share one epoch sequence per block.
// Nothing about a call is passed in from the host, so a launch captured into a CUDA graph is
// correct on every replay. Every rank runs the same grid for the same call (the grid depends
// only on dtype and count), and a rank's peer kernels run one after another (all on its Main
// stream), so block b's epoch advances in step on every rank. Flags are
// never cleared — except a start signal withdrawn by a block that timed out (0, which no block
// waits for). A word has "reached" the call when it EQUALS the block's epoch. Equality is enough,
// since a peer cannot write the next epoch into a word this block still waits on (its next call
// needs this block's end signal first); and it is needed: a stale kernel of a failed call must
// not pair with the next call.
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
// Error codes written to *error: RR_PEER_ERR_START, _END, _MIDDLE (a barrier timed out) and
// _LAUNCH (the launch broke the kernel's assumptions), defined in error_codes.cuh.
// ---------------------------------------------------------------------------------------------

#define RR_PEER_MAX_RANKS 8
#define RR_PEER_MAX_BLOCKS 128
// Threads per block the launch uses (src/exec/cuda/kernels/peer_launch.rs: PEER_BLOCK_THREADS).
#define RR_PEER_THREADS 512
// 16-byte vectors per source a thread loads before it combines them.
#define RR_PEER_UNROLL 4

// Barrier phases (the flag array's first index): a barrier's place in its kernel. Every kernel
// starts at phase 0; the one-shot and the steps kernel end at phase 1; the two-shot meets at
// phase 1 between its reduce and its gather, and ends at phase 2. A word is written at most once per call, and calls
// of either kind share the flags and the epochs.
#define RR_PHASE_START 0u
#define RR_ONESHOT_PHASE_END 1u
#define RR_TWOSHOT_PHASE_MIDDLE 1u
#define RR_TWOSHOT_PHASE_END 2u
#define RR_STEPS_PHASE_END 1u
#define RR_PEER_PHASES 3
// Where the per-block epochs start in a rank's flag array, and the array's length in words.
#define RR_PEER_EPOCH_BASE 3072
#define RR_PEER_FLAG_WORDS 3200

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

static __device__ __forceinline__ unsigned rr_ld_relaxed_sys(const unsigned* word) {
    unsigned value;
    asm volatile("ld.relaxed.sys.u32 %0, [%1];" : "=r"(value) : "l"(word) : "memory");
    return value;
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

// The epoch after `epoch`: epoch + 1, skipping 0 (never an epoch: a zeroed or withdrawn word)
// and keeping the parity alternating across the wrap (0xffffffff is followed by 2, not 1), since
// the LL one-shot (ll.cuh) picks its receive set by the epoch's parity.
static __device__ __forceinline__ unsigned rr_epoch_next(unsigned epoch) {
    const unsigned next = epoch + 1u;
    return next == 0u ? 2u : next;
}

// Spins of a waiting loop between two looks at the rank's error word (a read of host memory
// over PCIe, ~1 µs): the host or another waiter gives up a call within a few microseconds.
#define RR_ABORT_POLL 256u

// Whether a spinning wait must give up: its deadline has passed, or (looked at every
// RR_ABORT_POLL spins) the rank's error word holds a code — the host gave the call up (a peer is
// lost: RR_ERR_PEER_LOST), or another wait of this rank already has. `spins` counts the loop's
// iterations.
static __device__ __forceinline__ bool rr_give_up(rr_ull deadline, const unsigned* error,
                                                  unsigned& spins) {
    if (rr_globaltimer() > deadline) {
        return true;
    }
    return (++spins % RR_ABORT_POLL) == 0u && rr_ld_relaxed_sys(error) != 0u;
}

// Stores `code` into the error word unless a code is there already (the first cause stays: a
// host's RR_ERR_PEER_LOST is not overwritten by the timeouts it causes).
static __device__ __forceinline__ void rr_fail(unsigned* error, unsigned code) {
    if (rr_ld_relaxed_sys(error) == 0u) {
        rr_st_relaxed_sys(error, code);
    }
}

// The kernel's deadline on the global timer: timeout_ns after now (the block's start), saturating.
// Every barrier of the kernel gives up at this one deadline, so the whole kernel ends within
// timeout_ns of its start however many barriers it has.
static __device__ __forceinline__ rr_ull rr_deadline(rr_ull timeout_ns) {
    const rr_ull now = rr_globaltimer();
    return timeout_ns > ~0ull - now ? ~0ull : now + timeout_ns;
}

// Barrier `phase` of this block with block blockIdx.x of every other rank; every thread of the
// block calls it. Thread p (p < world, p != rank) signals rank p and waits for rank p, so all
// peers are signalled and awaited in parallel. Returns false, after writing `code` into
// *error, when a wait ran past `deadline` (rr_deadline) or the call was given up (rr_give_up);
// with `withdraw` (every barrier but the
// last) a barrier that failed also withdraws its signals (writes 0 over them), so that a peer
// arriving later times out too instead of reading this rank's memory after the call has failed.
// `flags` is peers.flags copied to shared memory and `epoch` the block's epoch (rr_peer_begin).
static __device__ __forceinline__ bool rr_peer_barrier(unsigned* const* flags, unsigned world,
                                                       unsigned rank, unsigned phase,
                                                       unsigned code, bool withdraw,
                                                       const unsigned* epoch_shared,
                                                       rr_ull deadline,
                                                       unsigned* error) {
    __syncthreads();  // everything the block did before is done before any thread signals
    const unsigned peer = threadIdx.x;
    const unsigned epoch = *epoch_shared;
    int timed_out = 0;
    if (peer < world && peer != rank) {
        rr_st_release_sys(flags[peer] + rr_flag_word(phase, blockIdx.x, rank), epoch);
        const unsigned* word = flags[rank] + rr_flag_word(phase, blockIdx.x, peer);
        unsigned spins = 0u;
        while (rr_ld_acquire_sys(word) != epoch) {
            if (rr_give_up(deadline, error, spins)) {
                rr_fail(error, code);
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

// src[0][i] ⊕ src[1][i] ⊕ ... ⊕ src[world - 1][i], folded in rank order in D's accumulating
// type (D::AccD: f32 for fp8, D itself otherwise) and narrowed once. The sources are indexed by
// unrolled constants (kernel parameter reads, no local copy), and the loads are independent of
// each other, so they can all be in flight at once.
template <class D, class Op>
static __device__ __forceinline__ typename D::T rr_peer_fold(const rr_peers& peers,
                                                             unsigned world, rr_ull i) {
    typedef typename D::T T;
    typedef typename D::AccD A;
    typename A::T acc = D::widen(static_cast<const T*>(peers.src[0])[i]);
#pragma unroll
    for (unsigned r = 1; r < RR_PEER_MAX_RANKS; ++r) {
        if (r < world) {
            acc = Op::template apply<A>(acc, D::widen(static_cast<const T*>(peers.src[r])[i]));
        }
    }
    return D::narrow(acc);
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
        // The fold accumulates in Fold::Acc: the vectors themselves, or (fp8) their elements
        // widened to f32, narrowed into acc once before the store.
        typedef rr_fold<D, Op, rr_vec16<T> > Fold;
        rr_vec16<T> acc[RR_PEER_UNROLL], next[RR_PEER_UNROLL];
        rr_peer_load<T>(acc, peers.src[0], head, base, vecs);
        rr_peer_load<T>(next, peers.src[1], head, base, vecs);
        typename Fold::Acc sum[RR_PEER_UNROLL];
#pragma unroll
        for (unsigned u = 0; u < RR_PEER_UNROLL; ++u) {
            Fold::start(sum[u], acc[u]);
        }
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
                    Fold::add(sum[u], x[u]);
                }
            }
        }
#pragma unroll
        for (unsigned u = 0; u < RR_PEER_UNROLL; ++u) {
            Fold::finish(acc[u], sum[u]);
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
