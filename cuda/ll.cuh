// A part of the kernel source of ringreduce: the LL ("low-latency") one-shot all-reduce, which
// pushes every rank's input into every other rank's receive buffer as self-validating words
// instead of reading it across NVLink between two barriers. The executor runs it for one-shot
// all-reduces of at most RR_LL_MAX_BYTES per rank when the communicator asks for it
// (CudaConfig::low_latency, src/exec/cuda/executor/peer_words.rs: PeerWords::oneshot_kernel).
//
// Joined into one translation unit by build.rs, in the order of its PARTS (error_codes.cuh
// first). No part includes another: NVRTC compiles the joined text with no include paths, so the
// kernels include NO header at all.

// ---------------------------------------------------------------------------------------------
// The LL protocol. The read one-shot (peer_kernels.cuh) costs a start barrier (a flag written
// over NVLink, then a spin), then reads of every peer's input (an NVLink round trip each), then
// an end barrier: three NVLink latencies in a row. Here each rank WRITES its input into every
// peer's memory and each rank waits only on its OWN memory: one one-way NVLink crossing per
// call, no barrier at all.
//
// LL word: 8 bytes, stored and loaded as one access: the low 4 bytes are 4 bytes of data, the
// high 4 bytes the flag, the sending block's epoch for this call. A word whose flag equals the
// receiver's epoch for this call carries this call's data: the 8 bytes are written by one
// morally strong 64-bit store (st.relaxed.sys) and read by one 64-bit load (ld.relaxed.sys),
// which the PTX memory model makes single-copy atomic, so the data half can never be older than
// the flag half. No fence and no flag of its own is needed: every word validates itself. (A
// vector access .v2.u64 is two such 64-bit accesses, in an unspecified order; each is checked.)
//
// Payload: the message is raw bytes, cut into 8-byte chunks (RR_LL_CHUNK_BYTES); chunk c is
// elements [c * 8 / sizeof(T), ...), whole elements since sizeof(T) divides 8. Thread t of
// block b handles chunk b * RR_LL_THREADS + t: the last chunk is padded with zero bytes (never
// stored to dst). One chunk is two LL words, sent with one 16-byte store.
//
// Receive buffer of rank p (2 x world x RR_LL_MAX_BLOCKS x 2 x RR_LL_THREADS words of 8 bytes,
// device memory on p's GPU, zeroed once, never reset): word
//     ((set * world + from) * RR_LL_MAX_BLOCKS + block) * 2 * RR_LL_THREADS + 2 * thread + half
// is written only by rank `from`'s block `block`, thread `thread`, during calls whose epoch has
// parity `set` (epoch & 1), and read only by rank p's block `block`, thread `thread`. A block
// has its own region whatever the grid, so a region is only ever touched by blocks of one
// index, whose epochs (the per-block epoch words of the flag array, peer.cuh, shared with the
// other peer kernels: the read one-shot, the two-shot and the steps kernel) advance in step on
// every rank. 2 sets x world x RR_LL_MAX_BYTES x 2 (flag overhead) bytes per rank.
//
// Why the two sets need no barrier. Say rank q's block b writes region (set, q, b) of rank p in
// its call of epoch e. Rank p's block b last read that region in its call of epoch e - 2 or
// earlier (same parity; rr_epoch_next keeps the parity alternating across the wrap). Rank q's
// block b ran a call of epoch e - 1 before this one, and every peer kernel (this one, the read
// one-shot, the two-shot, the steps kernel) makes block b wait for something block b of every
// other rank does in its call of the same epoch (here: p's words of epoch e - 1, which at least
// the block's thread 0 waits for, since every block has a chunk there; there: p's start flag).
// Rank p's
// call e - 1 started only after its call e - 2 had completed (one stream, kernels in order). So
// q's call e starts after p has finished reading the region: the set is free. The same argument
// makes a word carrying a flag equal to e mean "written in call e" (the region held at most
// epochs e - 2, e - 4, ... before), up to the wrap of the 32-bit epoch: a word not rewritten for
// 2^32 - 2 calls of its block (it lies beyond every message of those calls) could then match.
//
// Residency: a thread spins until its partner threads on every other rank have pushed, so every
// block of every rank's kernel must be resident at once. Ranks on distinct GPUs each have at
// most RR_LL_MAX_BLOCKS blocks on their own GPU; ranks sharing one GPU (the test-only shared
// mode) share its SMs, so the executor runs this kernel only when its grid fits the peer
// kernels' grid cap (SMs / ranks per GPU, the cap that keeps the other peer kernels resident)
// and takes the read one-shot otherwise. The protocol itself does not care where the receive
// buffers live: on one GPU the pushes are plain stores to its own memory.
//
// Memory ordering:
// - the sender's input was written by work that completed before its kernel started (its
//   stream); its thread reads it with plain loads, then stores the LL words;
// - the receiver's thread loads its own words with ld.relaxed.sys until every flag matches
//   (system scope: the writer is another GPU; .relaxed so every poll goes to memory); the data
//   comes in the same atomic access as its flag;
// - peers never read this rank's input or output, so once this rank's kernel is complete the
//   stream may overwrite both (no end barrier), and in place needs no exposed copy;
// - the reuse of a set (above) is ordered by kernel boundaries only: p's loads of call e - 2
//   have returned their values before p's kernel of e - 2 completes, and q issues its stores of
//   call e only after it saw words p wrote in its call e - 1, which started after that
//   completion. No fence is needed inside the kernel.
//
// Error codes written to *error (error_codes.cuh): RR_PEER_ERR_LAUNCH, the launch broke the
// kernel's assumptions; RR_LL_ERR_WAIT, a thread waited past the deadline for a peer's words.
// A thread that gives up withdraws the words it pushed (overwrites them with flag 0), as the
// read one-shot withdraws its start signal: a peer's kernel of the same call that starts later
// then times out too instead of completing — and writing its caller's output — after the call
// has failed. (A peer thread that took the words in the instant before still completes, within
// the call's deadline.)
// ---------------------------------------------------------------------------------------------

// Threads per block (src/exec/cuda/kernels/ll.rs: LL_BLOCK_THREADS).
#define RR_LL_THREADS 512
// Data bytes per thread: one chunk, two LL words.
#define RR_LL_CHUNK_BYTES 8
// Data bytes per block: RR_LL_THREADS x RR_LL_CHUNK_BYTES.
#define RR_LL_BLOCK_BYTES 4096
// The largest message (bytes per rank) the kernel takes (src/exec/cuda/kernels/ll.rs:
// LL_MAX_BYTES), and so the most blocks: RR_LL_MAX_BYTES / RR_LL_BLOCK_BYTES.
#define RR_LL_MAX_BYTES 65536
#define RR_LL_MAX_BLOCKS 16

// Kernel parameter, passed by value (64 bytes): every rank's receive buffer (index = rank), as a
// device address usable from the launching GPU. Entries >= world unused.
struct rr_ll_peers {
    rr_ull* recv[RR_PEER_MAX_RANKS];
};

// 8 bytes of the message seen as the raw 32-bit halves that travel in LL words, or as elements.
template <typename T>
union rr_ll_chunk {
    uint2 v;
    T e[RR_LL_CHUNK_BYTES / sizeof(T)];
};

// Blocks of the grid for a message of `bytes` (<= RR_LL_MAX_BYTES): one per RR_LL_BLOCK_BYTES,
// at least one. The launch (ll.rs: ll_blocks) computes the same.
static __device__ __forceinline__ unsigned rr_ll_blocks(rr_ull bytes) {
    const rr_ull blocks = (bytes + RR_LL_BLOCK_BYTES - 1) / RR_LL_BLOCK_BYTES;
    return blocks == 0 ? 1u : (unsigned)blocks;
}

// This thread's first word in region (set, from, blockIdx.x) of a receive buffer (layout above).
static __device__ __forceinline__ rr_ull rr_ll_word(unsigned set, unsigned world,
                                                    unsigned from) {
    return ((rr_ull)(set * world + from) * RR_LL_MAX_BLOCKS + blockIdx.x) * (2 * RR_LL_THREADS) +
           2 * threadIdx.x;
}

// peers.recv[rank], picked by selects over unrolled constants: a kernel parameter indexed by a
// register would be copied to local memory by every thread (the asm keeps the compiler from
// turning the selects back into an index).
static __device__ __forceinline__ const rr_ull* rr_ll_inbox(const rr_ll_peers& peers,
                                                           unsigned rank) {
    const rr_ull* inbox = peers.recv[0];
#pragma unroll
    for (unsigned p = 1; p < RR_PEER_MAX_RANKS; ++p) {
        asm("{\n\t.reg .pred take;\n\tsetp.eq.u32 take, %2, %3;\n\t"
            "selp.b64 %0, %1, %0, take;\n\t}"
            : "+l"(inbox)
            : "l"(peers.recv[p]), "r"(rank), "r"(p));
    }
    return inbox;
}

// Two LL words in one 16-byte store (16-byte aligned: an even word of a 256-byte aligned buffer).
static __device__ __forceinline__ void rr_ll_store(rr_ull* word, rr_ull lo, rr_ull hi) {
    asm volatile("st.relaxed.sys.v2.u64 [%0], {%1, %2};" ::"l"(word), "l"(lo), "l"(hi)
                 : "memory");
}

static __device__ __forceinline__ void rr_ll_load(const rr_ull* word, rr_ull& lo, rr_ull& hi) {
    asm volatile("ld.relaxed.sys.v2.u64 {%0, %1}, [%2];" : "=l"(lo), "=l"(hi) : "l"(word)
                 : "memory");
}

// Waits until both words at `word` carry `epoch`, then returns their data in `data`; false when
// the wait gives up first (the global timer passes `deadline`, or the call was given up:
// rr_give_up).
static __device__ __forceinline__ bool rr_ll_receive(const rr_ull* word, unsigned epoch,
                                                     rr_ull deadline, const unsigned* error,
                                                     uint2& data) {
    rr_ull lo, hi;
    unsigned spins = 0u;
    for (;;) {
        rr_ll_load(word, lo, hi);
        if ((unsigned)(lo >> 32) == epoch && (unsigned)(hi >> 32) == epoch) {
            break;
        }
        if (rr_give_up(deadline, error, spins)) {
            return false;
        }
    }
    data.x = (unsigned)lo;
    data.y = (unsigned)hi;
    return true;
}

// The `elems` (<= 8 / sizeof(T)) elements at `at`, zero-padded to 8 bytes: one 8-byte load when
// the chunk is whole and 8-byte aligned, else element by element.
template <typename T>
static __device__ __forceinline__ rr_ll_chunk<T> rr_ll_read_chunk(const T* at, unsigned elems) {
    const unsigned per_chunk = RR_LL_CHUNK_BYTES / sizeof(T);
    rr_ll_chunk<T> chunk;
    chunk.v = make_uint2(0u, 0u);
    if (elems == per_chunk && (reinterpret_cast<rr_ull>(at) & 7u) == 0) {
        chunk.v = *reinterpret_cast<const uint2*>(at);
    } else {
#pragma unroll
        for (unsigned k = 0; k < per_chunk; ++k) {
            if (k < elems) {
                chunk.e[k] = at[k];
            }
        }
    }
    return chunk;
}

// Stores the first `elems` elements of `chunk` at `at` (the mirror of rr_ll_read_chunk).
template <typename T>
static __device__ __forceinline__ void rr_ll_write_chunk(T* at, unsigned elems,
                                                         const rr_ll_chunk<T>& chunk) {
    const unsigned per_chunk = RR_LL_CHUNK_BYTES / sizeof(T);
    if (elems == per_chunk && (reinterpret_cast<rr_ull>(at) & 7u) == 0) {
        *reinterpret_cast<uint2*>(at) = chunk.v;
    } else {
#pragma unroll
        for (unsigned k = 0; k < per_chunk; ++k) {
            if (k < elems) {
                at[k] = chunk.e[k];
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// rr_ll_<op>_<type>(rr_ll_peers peers, unsigned* flags, unsigned world, unsigned rank,
//                   const T* src, T* dst, unsigned long long count,
//                   unsigned long long timeout_ns, unsigned* error, rr_call_gate gate)
//
// Purpose: the whole all-reduce of a small message in one kernel per rank, without barriers:
//   dst[i] = src_0[i] ⊕ src_1[i] ⊕ ... ⊕ src_{world-1}[i] for i < count, where src_r is rank
//   r's `src`, folded in rank order with this rank's own input taken locally — the same fold, in
//   the same order, as the read one-shot, so the bits are the same on every rank and for both
//   kernels. Avg is sum here, then rr_scale_<type>.
// Assumptions: all `world` ranks (2..=RR_PEER_MAX_RANKS) launch the kernel of the same op and
//   type with the same count (count x sizeof(T) <= RR_LL_MAX_BYTES) and the grid
//   rr_ll_blocks(count x sizeof(T)) of RR_LL_THREADS threads, on their own GPUs, free to run at
//   the same time (a thread waits only for the threads of its own index on the other ranks).
//   peers.recv[r] (r < world) is rank r's receive buffer (layout above; writable from this GPU
//   through peer access, 16-byte aligned), and `flags` this rank's flag array of peer.cuh
//   (its per-block epoch words; the same array the read one-shot and two-shot of these ranks
//   use); both started at zero, every call on them is made by all ranks, and a rank's calls run
//   one after another. src and dst are this GPU's memory, aligned to sizeof(T), valid for
//   `count` elements; dst == src (in place) or disjoint from it. src is written before the
//   kernel starts and not during it. error as for the other peer kernels; after any error code
//   the result is undefined on every rank and the receive buffers and epochs are out of step.
// Why it is fast: one NVLink crossing per call (the push), where the read one-shot waits for
//   three in a row (start flag, read round trip, end flag). Each thread sends its 8 bytes to
//   every peer with one 16-byte store each, all in flight at once, then polls its own words in
//   local memory; 16 blocks at most, one chunk per thread, no __syncthreads after the epoch.
// ---------------------------------------------------------------------------------------------
template <class D, class Op>
static __device__ __forceinline__ void rr_ll_kernel(const rr_ll_peers& peers, unsigned* flags,
                                                    unsigned world, unsigned rank,
                                                    const typename D::T* src,
                                                    typename D::T* dst, rr_ull count,
                                                    rr_ull timeout_ns, unsigned* error,
                                                    const rr_call_gate& gate) {
    typedef typename D::T T;
    const unsigned per_chunk = RR_LL_CHUNK_BYTES / sizeof(T);
    __shared__ unsigned epoch_shared;
    // Uniform over the grid: either every block returns here or none does.
    if (world < 2 || world > RR_PEER_MAX_RANKS || rank >= world ||
        blockDim.x != RR_LL_THREADS || count > RR_LL_MAX_BYTES / sizeof(T) ||
        gridDim.x != rr_ll_blocks(count * sizeof(T))) {
        if (threadIdx.x == 0) {
            rr_st_relaxed_sys(error, RR_PEER_ERR_LAUNCH);
        }
        return;
    }
    // The block's epoch, advanced by rr_block_enter (gate.cuh) as in rr_peer_begin. A code in
    // the error word (the host's, or the call gate's): push nothing to the peers.
    const rr_ull deadline = rr_deadline(timeout_ns);
    __shared__ unsigned lost;
    if (threadIdx.x == 0) {
        lost = rr_block_enter(gate, world, rank, deadline, error,
                              flags + RR_PEER_EPOCH_BASE + blockIdx.x, &epoch_shared);
    }
    __syncthreads();
    if (lost != 0u) {
        return;
    }
    const unsigned epoch = epoch_shared;

    const rr_ull first = ((rr_ull)blockIdx.x * RR_LL_THREADS + threadIdx.x) * per_chunk;
    if (first >= count) {
        return;  // past the message's last chunk (only in the last block)
    }
    const unsigned elems = count - first < per_chunk ? (unsigned)(count - first) : per_chunk;
    const rr_ll_chunk<T> own = rr_ll_read_chunk<T>(src + first, elems);

    // Push: this chunk to every peer, region (epoch parity, this rank, this block).
    const unsigned set = epoch & 1u;
    const rr_ull tag = (rr_ull)epoch << 32;
    const rr_ull lo = tag | own.v.x, hi = tag | own.v.y;
    const rr_ull at = rr_ll_word(set, world, rank);
#pragma unroll
    for (unsigned p = 0; p < RR_PEER_MAX_RANKS; ++p) {
        if (p < world && p != rank) {
            rr_ll_store(peers.recv[p] + at, lo, hi);
        }
    }

    // Receive and fold in rank order 0..world-1, this rank's own chunk in its place.
    const rr_ull* inbox = rr_ll_inbox(peers, rank);
    // Folded in D's accumulating type (f32 for fp8, D itself otherwise), narrowed once.
    typedef rr_fold<D, Op, rr_ll_chunk<T> > Fold;
    typename Fold::Acc sum;
#pragma unroll
    for (unsigned r = 0; r < RR_PEER_MAX_RANKS; ++r) {
        if (r < world) {
            rr_ll_chunk<T> x = own;
            if (r != rank &&
                !rr_ll_receive(inbox + rr_ll_word(set, world, r), epoch, deadline, error,
                               x.v)) {
                rr_fail(error, RR_LL_ERR_WAIT);
                // Withdraw the words this thread pushed (flag 0, never an epoch): a peer whose
                // kernel of this call arrives later (queued behind stuck work) must time out
                // too, not complete and write its output after this call has failed.
#pragma unroll
                for (unsigned p = 0; p < RR_PEER_MAX_RANKS; ++p) {
                    if (p < world && p != rank) {
                        rr_ll_store(peers.recv[p] + at, 0ull, 0ull);
                    }
                }
                return;  // a peer is missing: dst stays as it is
            }
            if (r == 0) {
                Fold::start(sum, x);
            } else {
                Fold::add(sum, x);
            }
        }
    }
    rr_ll_chunk<T> acc;
    Fold::finish(acc, sum);
    rr_ll_write_chunk<T>(dst + first, elems, acc);
}
