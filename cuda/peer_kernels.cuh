// A part of the kernel source of ringreduce: the bodies of the peer kernels — the one-shot and
// the two-shot all-reduce, and the one-shot steps of every other collective — built from the
// pieces of peer.cuh.
//
// Joined into one translation unit by build.rs, in the order of its PARTS (error_codes.cuh
// first). No part includes another: NVRTC compiles the joined text with no include paths, so the
// kernels include NO header at all.

// The start of every peer kernel here, before its first barrier. Returns false, after thread 0
// has stored RR_PEER_ERR_LAUNCH into *error, when the launch breaks the kernels' assumptions
// (world outside 2..=RR_PEER_MAX_RANKS, rank >= world, more than RR_PEER_MAX_BLOCKS blocks,
// fewer than RR_PEER_MAX_RANKS threads a block): uniform over the grid, so either every block
// returns then or none does. Returns false too when *error holds a code — read once per block
// after the call gate (gate.cuh: rr_gate_enter, which waits until the peers published the same
// call, until `deadline`); a block that starts before the host writes one meets its barriers and
// gives up there. Otherwise thread 0 copies peers.flags into `flags`, the block's shared array
// (a kernel parameter indexed by a register would be copied to local memory by every thread),
// and advances the block's epoch in this rank's array into *epoch (shared): the previous kernel
// on this rank's stream is complete, so its store is visible, and no other block or rank
// touches this word. The opening __syncthreads() of the first barrier makes both visible to the
// block.
static __device__ __forceinline__ bool rr_peer_begin(const rr_peers& peers, unsigned world,
                                                     unsigned rank, const rr_call_gate& gate,
                                                     rr_ull deadline, unsigned* error,
                                                     unsigned** flags, unsigned* epoch) {
    if (world < 2 || world > RR_PEER_MAX_RANKS || rank >= world ||
        gridDim.x > RR_PEER_MAX_BLOCKS || blockDim.x < RR_PEER_MAX_RANKS) {
        if (threadIdx.x == 0) {
            rr_st_relaxed_sys(error, RR_PEER_ERR_LAUNCH);
        }
        return false;
    }
    __shared__ unsigned lost;
    if (threadIdx.x == 0) {
        // A code in the error word (the gate's, or the host's): the call is lost, and its shape
        // may differ from the peers': touch nothing of theirs.
        lost = rr_block_enter(gate, world, rank, deadline, error,
                              peers.flags[rank] + RR_PEER_EPOCH_BASE + blockIdx.x, epoch);
        if (lost == 0u) {
#pragma unroll
            for (unsigned r = 0; r < RR_PEER_MAX_RANKS; ++r) {
                flags[r] = peers.flags[r];
            }
        }
    }
    __syncthreads();
    return lost == 0u;
}

// ---------------------------------------------------------------------------------------------
// rr_oneshot_<op>_<type>(rr_peers peers, unsigned world, unsigned rank, T* dst,
//                        unsigned long long count, unsigned long long timeout_ns,
//                        unsigned* error, const T* expose_from, rr_call_gate gate)
//
// Purpose: the whole all-reduce in one kernel per rank, for small and medium messages:
//   dst[i] = src[0][i] ⊕ src[1][i] ⊕ ... ⊕ src[world - 1][i] for i < count, folded in rank
//   order on every rank (so floats come out bit-identical everywhere), between a start barrier
//   (every rank's inputs are ready) and an end barrier (no rank reads this rank's input any
//   more when this kernel is complete). Avg is sum here, then rr_scale_<type>.
// Assumptions: all `world` ranks (2..=8) launch the kernel of the same op and type, with the same
//   grid (<= RR_PEER_MAX_BLOCKS blocks of 8..=RR_PEER_THREADS threads), peers and count, on
//   their own GPUs, free to run at the same time; every block of every rank gets an
//   SM within the timeout (a block waits only for the blocks of its own index on the other
//   ranks, never for another block of its own grid, so blocks that start late only delay
//   their partners). peers.src[r] (r < world) is readable and peers.flags[r] readable and
//   writable from this GPU (peer access on; or, for the staged one-shot of GPUs that do not
//   reach each other, both in pinned host memory every GPU maps), aligned to sizeof(T) and 4;
//   src[r] is valid for
//   `count` elements, written before rank r's kernel starts and not again until rank r's
//   kernel is complete (its end barrier waits for every reader). dst is
//   writable from this GPU, valid for `count` elements and disjoint from every source (peers
//   read src[rank] while this rank writes dst). In place, src[rank] is the rank's exposed
//   buffer and expose_from its in-place buffer (== dst); staged, src[rank] is the rank's host
//   copy and expose_from its source (the in-place buffer, or the input): each block first
//   copies its indices of expose_from into src[rank] (rr_oneshot_expose); otherwise
//   expose_from is null. The flag
//   arrays (and the epochs in them) started at zero, every call on them is made by all ranks,
//   and a rank's calls on them run one after another.
//   error points to a word this GPU can write (host-mapped pinned, so the host can watch it).
//   On any error code the result is undefined on every rank, a peer may still be reading
//   src[rank], and the flags are out of step: the caller must stop using these flags (or
//   re-zero them on every rank once everything is idle).
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
                                                         rr_ull count, rr_ull timeout_ns,
                                                         unsigned* error,
                                                         const typename D::T* expose_from,
                                                         const rr_call_gate& gate) {
    __shared__ unsigned* flags[RR_PEER_MAX_RANKS];
    __shared__ unsigned epoch;
    const rr_ull deadline = rr_deadline(timeout_ns);
    if (!rr_peer_begin(peers, world, rank, gate, deadline, error, flags, &epoch)) {
        return;
    }
    if (expose_from != nullptr) {
        rr_oneshot_expose<typename D::T>(peers, world, rank, expose_from, count);
    }
    // (The barrier's opening __syncthreads() makes `flags` and `epoch` visible to the block, and
    // orders the block's exposure copy before its signal.)
    if (!rr_peer_barrier(flags, world, rank, RR_PHASE_START, RR_PEER_ERR_START, true, &epoch,
                         deadline, error)) {
        return;  // a peer is missing: read nothing of it
    }
    rr_peer_reduce_body<D, Op>(peers, world, dst, count);
    rr_peer_barrier(flags, world, rank, RR_ONESHOT_PHASE_END, RR_PEER_ERR_END, false, &epoch,
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
//                        unsigned long long timeout_ns, unsigned* error)
// Purpose: this rank's part of a two-shot all-reduce: segs.out[rank][s_rank] = fold over ranks r
//   (in rank order) of peers.src[r][s_rank]; then segs.out[rank][s_q] = segs.out[q][s_q] for
//   every q != rank.
// Assumptions: as rr_oneshot_<op>_<type> for world, rank, the grid, flags, timeout and
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
                                                         rr_ull timeout_ns,
                                                         unsigned* error,
                                                         const rr_call_gate& gate) {
    typedef typename D::T T;
    __shared__ unsigned* flags[RR_PEER_MAX_RANKS];
    __shared__ unsigned epoch;
    const rr_ull deadline = rr_deadline(timeout_ns);
    if (!rr_peer_begin(peers, world, rank, gate, deadline, error, flags, &epoch)) {
        return;
    }
    T* out = static_cast<T*>(segs.out[rank]);
    if (!rr_peer_barrier(flags, world, rank, RR_PHASE_START, RR_PEER_ERR_START, true, &epoch,
                         deadline, error)) {
        return;  // a peer is missing: read nothing of it
    }
    {
        const rr_ull off = segs.off[rank];
        rr_peer_reduce_body<D, Op>(rr_peers_at<T>(peers, off), world, out + off, segs.len[rank]);
    }
    if (!rr_peer_barrier(flags, world, rank, RR_TWOSHOT_PHASE_MIDDLE, RR_PEER_ERR_MIDDLE, true,
                         &epoch, deadline, error)) {
        return;  // a segment may be unfinished: copy nothing
    }
    for (unsigned j = 1; j < world; ++j) {
        const unsigned q = (rank + j) % world;
        const rr_ull off = segs.off[q];
        const rr_peer_split<T> split(rr_peers_at<T>(peers, off), world, segs.len[q]);
        rr_split_copy<T>(split, static_cast<const T*>(segs.out[q]) + off, out + off,
                         segs.len[q]);
    }
    rr_peer_barrier(flags, world, rank, RR_TWOSHOT_PHASE_END, RR_PEER_ERR_END, false, &epoch,
                    deadline, error);
}

// ---------------------------------------------------------------------------------------------
// The one-shot form of every other collective (src/plan/oneshot.rs): a list of steps between one
// start and one end barrier. A step is a fold (dst = src[0] ⊕ ... ⊕ src[world - 1], in rank
// order) or a copy (dst = src[from]) of its own count of elements, at most the kernel's `count`
// (a send/recv's transfers differ; every other collective's steps move `count`).
//
// Kernel parameter: the steps of this rank. src[s][r] is step s's source in rank r's memory (a
// copy reads src[s][from[s]] only), dst[s] its destination in this rank's memory, count[s] the
// elements it moves.
// At most one step per rank (an all-gather or all-to-all reads every rank once): RR_PEER_MAX_RANKS.
#define RR_STEPS_MAX 8
#define RR_STEP_FOLD 0xffffffffu
struct rr_steps {
    const void* src[RR_STEPS_MAX][RR_PEER_MAX_RANKS];
    void* dst[RR_STEPS_MAX];
    rr_ull count[RR_STEPS_MAX];
    unsigned from[RR_STEPS_MAX];
    unsigned steps;
};

// A rr_peers whose every source is `p`: the split of a copy from one rank (rr_peer_split then
// sees one offset within 16 bytes).
static __device__ __forceinline__ rr_peers rr_peers_all(const rr_peers& peers, const void* p) {
    rr_peers one = peers;
#pragma unroll
    for (unsigned r = 0; r < RR_PEER_MAX_RANKS; ++r) {
        one.src[r] = p;
    }
    return one;
}

// rr_steps_<op>_<type>(rr_peers peers, rr_steps steps, unsigned world, unsigned rank,
//                      unsigned long long count, unsigned long long timeout_ns, unsigned* error)
// Purpose: this rank's part of a one-shot reduce-scatter, all-gather, broadcast, reduce or
//   all-to-all: start barrier; each step in order (a fold over every rank's src[s][r], or a
//   copy of src[s][from[s]]) into dst[s]; end barrier. A rank with no step (a reduce's non-root,
//   an in-place broadcast's root) only takes part in the barriers.
// Assumptions: as rr_oneshot_<op>_<type> for world, rank, the grid (every rank launches the
//   grid of `count`, whatever its steps), peers.flags, timeout and error; peers.src is unused.
//   steps.steps <= RR_STEPS_MAX and every steps.count[s] <= count (else RR_PEER_ERR_LAUNCH):
//   `count` sizes the grid, the same on every rank. No step writes what any step of any rank reads,
//   except a fold whose dst is exactly this rank's own source of that step (read element by
//   element before it is written, by the same thread): the planner's invariant, verified by
//   the executor before launch (steps_layout in src/exec/cuda/executor/layout.rs). So the steps
//   need no barrier between them; sources are ready at the start barrier (written before their
//   rank's kernel started) and nobody reads them after the end barrier. Nothing here depends on
//   which block handles which index, so a rank's steps may differ from its peers'.
// Why it is fast: one launch per rank and two barriers whatever the collective; every byte read
//   once over NVLink (or locally) and written once, with the one-shot's 16-byte vector loads.
// ---------------------------------------------------------------------------------------------
template <class D, class Op>
static __device__ __forceinline__ void rr_steps_kernel(const rr_peers& peers,
                                                       const rr_steps& steps, unsigned world,
                                                       unsigned rank, rr_ull count,
                                                       rr_ull timeout_ns, unsigned* error,
                                                       const rr_call_gate& gate) {
    typedef typename D::T T;
    __shared__ unsigned* flags[RR_PEER_MAX_RANKS];
    __shared__ unsigned epoch;
    bool launchable = steps.steps <= RR_STEPS_MAX;
    for (unsigned s = 0; launchable && s < steps.steps; ++s) {
        launchable = steps.count[s] <= count;
    }
    if (!launchable) {
        if (threadIdx.x == 0) {
            rr_st_relaxed_sys(error, RR_PEER_ERR_LAUNCH);
        }
        return;
    }
    const rr_ull deadline = rr_deadline(timeout_ns);
    if (!rr_peer_begin(peers, world, rank, gate, deadline, error, flags, &epoch)) {
        return;
    }
    if (!rr_peer_barrier(flags, world, rank, RR_PHASE_START, RR_PEER_ERR_START, true, &epoch,
                         deadline, error)) {
        return;  // a peer is missing: read nothing of it
    }
    for (unsigned s = 0; s < steps.steps; ++s) {
        T* dst = static_cast<T*>(steps.dst[s]);
        const rr_ull n = steps.count[s];
        if (steps.from[s] == RR_STEP_FOLD) {
            rr_peers sources = peers;
#pragma unroll
            for (unsigned r = 0; r < RR_PEER_MAX_RANKS; ++r) {
                sources.src[r] = steps.src[s][r];
            }
            rr_peer_reduce_body<D, Op>(sources, world, dst, n);
        } else {
            const T* from = static_cast<const T*>(steps.src[s][steps.from[s]]);
            const rr_peer_split<T> split(rr_peers_all(peers, from), world, n);
            rr_split_copy<T>(split, from, dst, n);
        }
    }
    rr_peer_barrier(flags, world, rank, RR_STEPS_PHASE_END, RR_PEER_ERR_END, false, &epoch,
                    deadline, error);
}
