// A part of the kernel source of ringreduce: the point-to-point channel, which runs NCCL's sends
// and receives between the ranks of a job of one process per GPU (src/exec/cuda/executor/channel.rs
// launches it). A send meets its receive per direction — the k-th send from rank p to rank q
// fills the k-th receive at q from p — whatever either rank groups with it or calls before it
// towards other ranks or in the other direction; the ranks' hosts never meet.
//
// Joined into one translation unit by build.rs, in the order of its PARTS (after peer.cuh and
// gate.cuh, whose loads, stores, deadline and call gate it uses). No part includes another.
//
// Channel region: one region of device memory per rank, zeroed once, exported to its peers (Rust:
// exec::cuda::executor::peer_words, `channel_bytes`). Words (64-bit), each an array
// [rank][lane] of RR_PEER_MAX_RANKS × RR_CH_LANES:
//   POSTED[from][lane]  chunks rank `from` has pushed into this rank's inbox on that lane
//                       (written by `from`, read here);
//   TAKEN[to][lane]     chunks rank `to` has taken out of its inbox from this rank on that lane
//                       (written by `to`, read here: a slot is free again);
//   SENT, RECVD, SENT_MSGS, RECVD_MSGS [peer][lane]: this rank's own counts of chunks and of
//                       messages per direction and lane, read at a kernel's start, written back
//                       at its end (the next kernel on the rank's stream starts from them);
//   HEADERS[from][lane][slot][4]: what rank `from` put in that slot: (message number, bytes,
//                       type code, 0), written by `from` before it raises POSTED.
// Then the inbox, at byte RR_CH_WORDS × 8: [from][lane][slot] of RR_CH_SLOT_BYTES each.
//
// A message of b bytes is n = max(1, ceil(b / RR_CH_SLOT_BYTES)) chunks; chunk c travels on lane
// c mod RR_CH_LANES, so a large message moves on every lane at once, and every message has a
// chunk 0 on lane 0 (an empty message is one chunk of no bytes: its receive still checks it).
// Every lane counts every message of its direction, with or without a chunk of it, so a lane's
// message number names the same message at both ends.
//
// Protocol, per direction and lane (the sender pushes; each side polls only its own memory):
//   sender: wait until SENT − TAKEN < RR_CH_SLOTS; copy the chunk into the receiver's inbox slot
//     SENT mod RR_CH_SLOTS; write its header there; release-store SENT + 1 into the receiver's
//     POSTED; SENT += 1.
//   receiver: wait until POSTED > RECVD; read the header of slot RECVD mod RR_CH_SLOTS: its
//     message number, bytes and type must be the receive's own (else RR_CH_ERR_MISMATCH_BIT |
//     peer, before anything is written); copy the chunk out; release-store RECVD + 1 into the
//     sender's TAKEN; RECVD += 1.
// Memory ordering (system scope, the two sides being different GPUs or processes): the block's
// copies, then __syncthreads() and thread 0's __threadfence_system() and st.release.sys of the
// counter; the other side's thread 0 ld.acquire.sys of it, then __syncthreads() before its
// threads touch the slot (their loads of the inbox bypass L1: __ldcg).
//
// A group's units: each (peer, direction) of its ops × each lane. A block serves the units
// u ≡ blockIdx.x (mod gridDim.x) and progresses whichever of them can move (thread 0 polls them
// in turn), so no unit waits behind another: a group's sends and receives progress together
// whatever the peers' grouping (NCCL's group semantics), and any grid of at least one block is
// correct. Nothing about the counters is passed from the host, so a captured launch is correct
// on every replay — ordered, like every channel kernel of the rank, after its previous one (the
// counters are read at a kernel's start and written back at its end).
//
// Gives up (RR_CH_ERR_WAIT) at the deadline, on a code in this rank's error word, or when a
// rank's control segment says it failed (`abort`, through the call gate's words when the job
// gates its calls).
// ---------------------------------------------------------------------------------------------

#define RR_CH_LANES 8u
#define RR_CH_SLOTS 4u
#define RR_CH_SLOT_BYTES 65536u
#define RR_CH_MAX_OPS 64
#define RR_CH_MAX_UNITS (2u * RR_PEER_MAX_RANKS * RR_CH_LANES)
// Word arrays of the region (indices of 64-bit words).
#define RR_CH_ARRAY (RR_PEER_MAX_RANKS * RR_CH_LANES)
#define RR_CH_POSTED 0u
#define RR_CH_TAKEN (1u * RR_CH_ARRAY)
#define RR_CH_SENT (2u * RR_CH_ARRAY)
#define RR_CH_RECVD (3u * RR_CH_ARRAY)
#define RR_CH_SENT_MSGS (4u * RR_CH_ARRAY)
#define RR_CH_RECVD_MSGS (5u * RR_CH_ARRAY)
#define RR_CH_HEADERS 384u
#define RR_CH_WORDS 2048u
static_assert(RR_CH_HEADERS == 6u * RR_CH_ARRAY, "the headers follow the six word arrays");
static_assert(RR_CH_HEADERS + RR_CH_ARRAY * RR_CH_SLOTS * 4u <= RR_CH_WORDS,
              "the headers end before the inbox");

// One send or receive of a group (Rust: kernels::channel::ChannelOp, field for field).
struct rr_ch_op {
    rr_ull addr;     // this rank's buffer
    rr_ull bytes;
    unsigned peer;
    unsigned send;   // 1: a send to peer; 0: a receive from peer
    unsigned dtype;  // the element type's code, compared between the ends
    unsigned pad;
};

// Kernel parameter, passed by value (Rust: kernels::channel::ChannelParam, field for field).
struct rr_channel_args {
    rr_ull* region[RR_PEER_MAX_RANKS];  // every rank's region, as this GPU reaches it
    rr_ch_op ops[RR_CH_MAX_OPS];          // this rank's group, in call order
    unsigned ops_len;
    unsigned world;
    unsigned rank;
    unsigned pad;
};

// One unit's progress, in shared memory (thread 0 owns it).
struct rr_ch_unit {
    unsigned dir;    // index into the block's direction list
    unsigned lane;
    int op;          // the op being moved, -1 when the unit is done
    rr_ull chunk;    // its next chunk on this lane
    rr_ull count;    // chunks moved on this lane (SENT or RECVD)
    rr_ull msgs;     // messages passed on this lane (SENT_MSGS or RECVD_MSGS)
};

static __device__ __forceinline__ rr_ull rr_ch_chunks(rr_ull bytes) {
    return bytes == 0ull ? 1ull : (bytes + RR_CH_SLOT_BYTES - 1ull) / RR_CH_SLOT_BYTES;
}

static __device__ __forceinline__ char* rr_ch_slot(rr_ull* region, unsigned from, unsigned lane,
                                                   rr_ull count) {
    const rr_ull slot = ((rr_ull)from * RR_CH_LANES + lane) * RR_CH_SLOTS + count % RR_CH_SLOTS;
    return reinterpret_cast<char*>(region + RR_CH_WORDS) + slot * RR_CH_SLOT_BYTES;
}

static __device__ __forceinline__ rr_ull* rr_ch_header(rr_ull* region, unsigned from,
                                                       unsigned lane, rr_ull count) {
    return region + RR_CH_HEADERS +
           (((rr_ull)from * RR_CH_LANES + lane) * RR_CH_SLOTS + count % RR_CH_SLOTS) * 4ull;
}

// The block's threads copy n bytes; 16-byte vectors where both ends allow, loads through L2.
static __device__ __forceinline__ void rr_ch_copy(char* dst, const char* src, rr_ull n) {
    if ((((rr_ull)dst | (rr_ull)src) & 15ull) == 0ull) {
        const rr_ull vectors = n / 16ull;
        uint4* d = reinterpret_cast<uint4*>(dst);
        const uint4* s = reinterpret_cast<const uint4*>(src);
        for (rr_ull i = threadIdx.x; i < vectors; i += blockDim.x) {
            d[i] = __ldcg(s + i);
        }
        for (rr_ull i = vectors * 16ull + threadIdx.x; i < n; i += blockDim.x) {
            dst[i] = __ldcg(src + i);
        }
    } else if ((((rr_ull)dst | (rr_ull)src | n) & 3ull) == 0ull) {
        unsigned* d = reinterpret_cast<unsigned*>(dst);
        const unsigned* s = reinterpret_cast<const unsigned*>(src);
        for (rr_ull i = threadIdx.x; i < n / 4ull; i += blockDim.x) {
            d[i] = __ldcg(s + i);
        }
    } else {
        for (rr_ull i = threadIdx.x; i < n; i += blockDim.x) {
            dst[i] = __ldcg(src + i);
        }
    }
}

// The next op of direction (peer, send) after op `after` (-1: the first), or -1.
static __device__ __forceinline__ int rr_ch_next_op(const rr_channel_args& a, unsigned peer,
                                                    unsigned send, int after) {
    for (int k = after + 1; k < (int)a.ops_len; ++k) {
        if (a.ops[k].peer == peer && a.ops[k].send == send) {
            return k;
        }
    }
    return -1;
}

// Moves unit `u` past messages with no chunk on its lane (counting them) to its next chunk, or
// marks it done (op = -1).
static __device__ __forceinline__ void rr_ch_settle(const rr_channel_args& a, rr_ch_unit& u,
                                                    unsigned peer, unsigned send) {
    while (u.op >= 0 && u.chunk >= rr_ch_chunks(a.ops[u.op].bytes)) {
        u.msgs += 1ull;
        u.op = rr_ch_next_op(a, peer, send, u.op);
        u.chunk = u.lane;
    }
}

// ---------------------------------------------------------------------------------------------
// rr_channel_kernel: the body of rr_channel (instances.cuh).
// Purpose: move this rank's group of sends and receives (a.ops, call order) through the
//   regions, per direction and lane (file comment).
// Assumptions: RR_PEER_THREADS threads a block; a.ops_len <= RR_CH_MAX_OPS; every op's peer is
//   below world and not this rank; the previous channel kernel on this rank's stream has
//   completed (its counters written back); every rank's region zeroed at creation and touched
//   only by channel kernels.
// Errors: RR_CH_ERR_MISMATCH_BIT | peer (a receive found its send of another message, size or
//   type), RR_CH_ERR_WAIT (gave up), RR_PEER_ERR_LAUNCH (the arguments break the assumptions).
// ---------------------------------------------------------------------------------------------
static __device__ __forceinline__ void rr_channel_kernel(const rr_channel_args& a,
                                                         rr_ull timeout_ns, unsigned* error,
                                                         const rr_call_gate& gate) {
    __shared__ unsigned dirs[2u * RR_PEER_MAX_RANKS];
    __shared__ rr_ch_unit units[RR_CH_MAX_UNITS];
    __shared__ unsigned n_units;
    __shared__ int chosen;  // the unit to move, -1: all done, -2: stop
    rr_ull* own = a.region[a.rank];
    if (threadIdx.x == 0) {
        bool launchable = a.ops_len <= RR_CH_MAX_OPS && a.world <= RR_PEER_MAX_RANKS &&
                          a.rank < a.world && blockDim.x == RR_PEER_THREADS;
        // The directions in order of first appearance; this block's units of them.
        unsigned n_dirs = 0u;
        for (unsigned k = 0; launchable && k < a.ops_len; ++k) {
            const unsigned key = a.ops[k].peer * 2u + a.ops[k].send;
            launchable = a.ops[k].peer < a.world && a.ops[k].peer != a.rank;
            bool seen = false;
            for (unsigned d = 0; d < n_dirs; ++d) {
                seen |= dirs[d] == key;
            }
            if (!seen && launchable) {
                dirs[n_dirs++] = key;
            }
        }
        n_units = 0u;
        for (unsigned g = blockIdx.x; launchable && g < n_dirs * RR_CH_LANES; g += gridDim.x) {
            rr_ch_unit& u = units[n_units++];
            u.dir = g / RR_CH_LANES;
            u.lane = g % RR_CH_LANES;
            const unsigned peer = dirs[u.dir] / 2u, send = dirs[u.dir] % 2u;
            const unsigned at = peer * RR_CH_LANES + u.lane;
            u.op = rr_ch_next_op(a, peer, send, -1);
            u.chunk = u.lane;
            u.count = own[(send ? RR_CH_SENT : RR_CH_RECVD) + at];
            u.msgs = own[(send ? RR_CH_SENT_MSGS : RR_CH_RECVD_MSGS) + at];
            rr_ch_settle(a, u, peer, send);
        }
        if (!launchable) {
            rr_fail(error, RR_PEER_ERR_LAUNCH);
            n_units = 0u;
        }
    }
    __syncthreads();
    const rr_ull deadline = rr_deadline(timeout_ns);
    unsigned spins = 0u, next = 0u;
    for (;;) {
        if (threadIdx.x == 0) {
            chosen = -1;
            while (chosen == -1) {
                bool pending = false;
                for (unsigned i = 0; i < n_units && chosen == -1; ++i) {
                    const unsigned j = (next + i) % n_units;
                    rr_ch_unit& u = units[j];
                    if (u.op < 0) {
                        continue;
                    }
                    pending = true;
                    const unsigned peer = dirs[u.dir] / 2u, send = dirs[u.dir] % 2u;
                    const unsigned at = peer * RR_CH_LANES + u.lane;
                    if (send) {
                        const rr_ull taken = rr_ld_acquire_sys64(own + RR_CH_TAKEN + at);
                        if (u.count - taken < RR_CH_SLOTS) {
                            chosen = (int)j;
                        }
                    } else if (rr_ld_acquire_sys64(own + RR_CH_POSTED + at) > u.count) {
                        const rr_ull* h = rr_ch_header(own, peer, u.lane, u.count);
                        const rr_ch_op& op = a.ops[u.op];
                        if (rr_ld_relaxed_sys64(h) != u.msgs ||
                            rr_ld_relaxed_sys64(h + 1) != op.bytes ||
                            rr_ld_relaxed_sys64(h + 2) != op.dtype) {
                            rr_fail(error, RR_CH_ERR_MISMATCH_BIT | peer);
                            chosen = -2;
                        } else {
                            chosen = (int)j;
                        }
                    }
                }
                if (!pending || chosen != -1) {
                    break;
                }
                bool failed = rr_give_up(deadline, error, spins);
                if (!failed && gate.controls != nullptr && spins % RR_ABORT_POLL == 0u) {
                    for (unsigned q = 0; q < a.world; ++q) {
                        failed |= rr_ld_relaxed_sys64(gate.controls[q] + gate.layout.abort) != 0ull;
                    }
                }
                if (failed) {
                    rr_fail(error, RR_CH_ERR_WAIT);
                    chosen = -2;
                }
            }
        }
        __syncthreads();
        const int c = chosen;
        if (c < 0) {
            break;
        }
        rr_ch_unit& u = units[c];
        const unsigned peer = dirs[u.dir] / 2u, send = dirs[u.dir] % 2u;
        const rr_ch_op& op = a.ops[u.op];
        const rr_ull from = u.chunk * RR_CH_SLOT_BYTES;
        const rr_ull n = op.bytes - from < RR_CH_SLOT_BYTES ? op.bytes - from : RR_CH_SLOT_BYTES;
        char* user = reinterpret_cast<char*>(op.addr) + from;
        if (send) {
            rr_ch_copy(rr_ch_slot(a.region[peer], a.rank, u.lane, u.count), user, n);
        } else {
            rr_ch_copy(user, rr_ch_slot(own, peer, u.lane, u.count), n);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            const unsigned at = a.rank * RR_CH_LANES + u.lane;
            if (send) {
                rr_ull* h = rr_ch_header(a.region[peer], a.rank, u.lane, u.count);
                h[0] = u.msgs;
                h[1] = op.bytes;
                h[2] = op.dtype;
                __threadfence_system();
                rr_st_release_sys64(a.region[peer] + RR_CH_POSTED + at, u.count + 1ull);
            } else {
                __threadfence_system();
                rr_st_release_sys64(a.region[peer] + RR_CH_TAKEN + at, u.count + 1ull);
            }
            u.count += 1ull;
            u.chunk += RR_CH_LANES;
            rr_ch_settle(a, u, peer, send);
            next = (unsigned)c + 1u;
            spins = 0u;
        }
    }
    // The counters for the next kernel on this stream (a failed call leaves its communicator
    // broken: they are not used again).
    if (threadIdx.x == 0) {
        for (unsigned i = 0; i < n_units; ++i) {
            const rr_ch_unit& u = units[i];
            const unsigned peer = dirs[u.dir] / 2u, send = dirs[u.dir] % 2u;
            const unsigned at = peer * RR_CH_LANES + u.lane;
            own[(send ? RR_CH_SENT : RR_CH_RECVD) + at] = u.count;
            own[(send ? RR_CH_SENT_MSGS : RR_CH_RECVD_MSGS) + at] = u.msgs;
        }
    }
}
