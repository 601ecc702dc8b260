// A part of the kernel source of ringreduce: the call gate, which compares a call across the
// ranks of a job (one process per rank) on the GPU, at the start of the call's peer kernel
// (rr_peer_begin, peer_kernels.cuh; rr_ll_kernel, ll.cuh) before it touches any peer's memory,
// so that a rank's host never waits for its peers' hosts to enqueue a call, and the call costs
// its host one launch.
//
// Joined into one translation unit by build.rs, in the order of its PARTS (error_codes.cuh
// first). No part includes another.
//
// Words (64-bit, in every rank's control segment: host memory shared between the processes and
// registered with the driver in each, so this GPU reads every rank's at the host's address;
// src/exec/job.rs and src/exec/job/calls.rs lay them out and pass the layout as rr_gate_layout):
// - `published`: the last call whose slot the rank's host has written (then released).
// - a slot per call number mod call_slots: the call's number, its shape, its buffers.
// - `abort`: nonzero once the rank has failed a call (written by its host).
// - `gated`, `fault`: written by block 0 of a gated kernel on its own rank: the last call it
//   passed, and (call << 16) | (peer + 1) of a call it found different.
// The host rewrites a slot only once every peer's `gated` (or its host's check) has passed the
// call in it, so the slot read here holds the call it names.
//
// Memory ordering: a host writes the slot, then `published` (a release store; x86 keeps the
// order); the gate's acquire load of `published` orders its reads of the slot after it. Block 0
// stores `gated` last, with release, after it has read every peer's slot; the kernel's other
// blocks wait for that store (or a code in the error word) before they touch a peer's memory.
// They are resident together with block 0 (every peer kernel's grid is, for its barriers).
// ---------------------------------------------------------------------------------------------

// Where the words lie: indices of 64-bit words in a control segment (Rust: exec::job::GateLayout,
// field for field).
struct rr_gate_layout {
    unsigned published;
    unsigned abort;
    unsigned gated;
    unsigned fault;
    unsigned slots;
    unsigned slot_words;
    unsigned call_slots;
    unsigned compared;  // the slot words every rank must have alike: number, shape (+ refs: symmetric)
};

static __device__ __forceinline__ rr_ull rr_ld_acquire_sys64(const rr_ull* word) {
    rr_ull value;
    asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(value) : "l"(word) : "memory");
    return value;
}

static __device__ __forceinline__ rr_ull rr_ld_relaxed_sys64(const rr_ull* word) {
    rr_ull value;
    asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(value) : "l"(word) : "memory");
    return value;
}

static __device__ __forceinline__ void rr_st_release_sys64(rr_ull* word, rr_ull value) {
    asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(word), "l"(value) : "memory");
}

// Kernel parameter, passed by value (48 bytes; Rust: kernels::GateCall, field for field): the
// call a peer kernel checks before it touches a peer's memory. controls == null: no check (every
// rank in one process, or the call was checked on the host).
struct rr_call_gate {
    const rr_ull* const* controls;  // rank q's control segment, as this GPU reaches it
    rr_ull seq;                     // the call's number
    rr_gate_layout layout;
};

// ---------------------------------------------------------------------------------------------
// rr_gate_check: block 0's thread 0 of a gated peer kernel.
// Purpose: let call `seq` of this rank run only if every peer's host has published the same
//   call under that number: spin until each peer's `published` has reached seq, then compare
//   the first `compared` words of its slot with this rank's. A difference stores the call and
//   the peer into this rank's `fault` and RR_GATE_ERR_MISMATCH into *error — every peer is
//   compared before any abort is looked at, so a call that differs is named as such on every
//   rank even when a peer that found it first has failed since. A peer that failed before
//   publishing (its `abort` set), this rank's own abort, a code already in *error (the host gave
//   the call up) or the deadline ends the wait with RR_GATE_ERR_WAIT; so does an abort seen once
//   every slot compared equal (the call cannot complete). Passing, stores seq into this rank's
//   `gated`.
// Assumptions: controls[q] is rank q's control segment as this GPU reaches it (registered host
//   memory); this rank's slot of seq was written before the launch; error is writable from here
//   (host-mapped).
// Why it is fast: when the peers' hosts are ahead (the common case) one read of each peer's
//   `published` and of its slot, over PCIe or C2C, and no host waits at all.
// ---------------------------------------------------------------------------------------------
static __device__ __forceinline__ void rr_gate_check(const rr_call_gate& gate, unsigned world,
                                                     unsigned rank, rr_ull deadline,
                                                     unsigned* error) {
    const rr_gate_layout& layout = gate.layout;
    const rr_ull seq = gate.seq;
    rr_ull* own = const_cast<rr_ull*>(gate.controls[rank]);
    const rr_ull at = layout.slots + (seq % layout.call_slots) * layout.slot_words;
    for (unsigned q = 0; q < world; ++q) {
        if (q == rank) {
            continue;
        }
        const rr_ull* theirs = gate.controls[q];
        unsigned spins = 0u;
        while (rr_ld_acquire_sys64(theirs + layout.published) < seq) {
            const bool failed = spins % RR_ABORT_POLL == RR_ABORT_POLL - 1u &&
                                (rr_ld_relaxed_sys64(theirs + layout.abort) != 0ull ||
                                 rr_ld_relaxed_sys64(own + layout.abort) != 0ull);
            // (A peer that published, then failed: its slot is compared below.)
            if (failed && rr_ld_acquire_sys64(theirs + layout.published) >= seq) {
                break;
            }
            if (failed || rr_give_up(deadline, error, spins)) {
                rr_fail(error, RR_GATE_ERR_WAIT);
                return;
            }
        }
        for (unsigned w = 0; w < layout.compared; ++w) {
            if (rr_ld_relaxed_sys64(theirs + at + w) != rr_ld_relaxed_sys64(own + at + w)) {
                asm volatile("st.relaxed.sys.u64 [%0], %1;" ::"l"(own + layout.fault),
                             "l"((seq << 16) | (rr_ull)(q + 1u))
                             : "memory");
                __threadfence_system();  // the host that sees the code sees the fault
                rr_fail(error, RR_GATE_ERR_MISMATCH);
                return;
            }
        }
    }
    // The same call everywhere, but a failed rank cannot complete it: ended here, not at a
    // barrier's deadline.
    for (unsigned q = 0; q < world; ++q) {
        if (rr_ld_relaxed_sys64(gate.controls[q] + layout.abort) != 0ull) {
            rr_fail(error, RR_GATE_ERR_WAIT);
            return;
        }
    }
    rr_st_release_sys64(own + layout.gated, seq);
}

// Thread 0 of every block of a peer kernel, before the block touches a peer's memory: block 0
// checks the call (rr_gate_check), every other block waits until block 0 has passed it (this
// rank's `gated` reaches seq) or a code is in *error, or the deadline passes (RR_GATE_ERR_WAIT).
// Returns the code in *error afterwards: 0 to go on. Without a gate (controls null), returns 0
// at once.
static __device__ __forceinline__ unsigned rr_gate_enter(const rr_call_gate& gate,
                                                         unsigned world, unsigned rank,
                                                         rr_ull deadline, unsigned* error) {
    if (gate.controls == nullptr) {
        return 0u;
    }
    if (blockIdx.x == 0) {
        rr_gate_check(gate, world, rank, deadline, error);
    } else {
        const rr_ull* gated = gate.controls[rank] + gate.layout.gated;
        unsigned spins = 0u;
        while (rr_ld_acquire_sys64(gated) < gate.seq) {
            if (rr_give_up(deadline, error, spins)) {
                rr_fail(error, RR_GATE_ERR_WAIT);
                break;
            }
        }
    }
    return rr_ld_relaxed_sys(error);
}

// ---------------------------------------------------------------------------------------------
// rr_block_enter: thread 0 of every block of a peer kernel (rr_peer_begin, peer_kernels.cuh;
//   rr_ll_kernel, ll.cuh), once, before the block touches a peer's memory.
// Purpose: decide whether the block goes on — no code in *error (the host's, or an earlier
//   block's), then the call gate passed (rr_gate_enter) — and if it does, advance the block's
//   epoch (*epoch_word, this rank's word RR_PEER_EPOCH_BASE + block; peer.cuh) and return the
//   new one in *epoch. Returns 0 to go on, else the code that ends the call.
// Assumptions: the previous kernel on this rank's stream is complete, so its store of
//   *epoch_word is visible, and no other block or rank writes the word.
// Why not inlined: one copy serves every peer kernel instance (one per collective, operator and
//   type); inlined into each, the gate added about a quarter to the kernels' build time. It runs
//   once per block, so the call costs nothing measurable.
// ---------------------------------------------------------------------------------------------
static __device__ __noinline__ unsigned rr_block_enter(const rr_call_gate gate, unsigned world,
                                                      unsigned rank, rr_ull deadline,
                                                      unsigned* error, unsigned* epoch_word,
                                                      unsigned* epoch) {
    unsigned lost = rr_ld_relaxed_sys(error);
    if (lost == 0u) {
        lost = rr_gate_enter(gate, world, rank, deadline, error);
    }
    if (lost == 0u) {
        const unsigned next = rr_epoch_next(*epoch_word);
        *epoch_word = next;
        *epoch = next;
    }
    return lost;
}
