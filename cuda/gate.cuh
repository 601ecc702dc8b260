// A part of the kernel source of ringreduce: the call gate, which compares a call across the
// ranks of a job (one process per rank) on the GPU, before the call touches any peer's memory,
// so that a rank's host never waits for its peers' hosts to enqueue a call.
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
// - `gated`, `fault`: written by this kernel on its own rank: the last call it passed, and
//   (call << 16) | (peer + 1) of a call it found different.
// The host rewrites a slot only once every peer's `gated` (or its host's check) has passed the
// call in it, so the slot read here holds the call it names.
//
// Memory ordering: a host writes the slot, then `published` (a release store; x86 keeps the
// order); the gate's acquire load of `published` orders its reads of the slot after it. The gate
// stores `gated` last, with release, after it has read every peer's slot. Every later kernel or
// copy on the stream starts after the gate has completed.
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
    unsigned compared;  // the words of a slot every rank must have alike: number and shape
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

// ---------------------------------------------------------------------------------------------
// rr_call_gate(const rr_ull* const* controls, unsigned world, unsigned rank, rr_ull seq,
//              rr_gate_layout layout, unsigned long long timeout_ns, unsigned* error)
//   (exported in instances.cuh)
// Purpose: let call `seq` of this rank run only if every peer's host has published the same
//   call under that number: spin until each peer's `published` has reached seq, then compare
//   the first `compared` words of its slot with this rank's. A difference stores the call and
//   the peer into this rank's `fault` and RR_GATE_ERR_MISMATCH into *error; a peer that failed
//   (its `abort` set), this rank's own abort, a code already in *error (the host gave the call
//   up) or the deadline ends the wait with RR_GATE_ERR_WAIT. With any code in *error the later kernels of the call return
//   at their start (rr_peer_begin, rr_ll_kernel) without touching a peer's memory. Passing,
//   stores seq into this rank's `gated`.
// Assumptions: one thread works (a grid of one block); controls[q] is rank q's control segment
//   as this GPU reaches it (registered host memory); this rank's slot of seq was written before
//   the launch; error is writable from here (host-mapped).
// Why it is fast: when the peers' hosts are ahead (the common case) one read of each peer's
//   `published` and of its slot, over PCIe or C2C, and no host waits at all.
// ---------------------------------------------------------------------------------------------
static __device__ __forceinline__ void rr_call_gate_body(const rr_ull* const* controls,
                                                         unsigned world, unsigned rank,
                                                         rr_ull seq, rr_gate_layout layout,
                                                         rr_ull timeout_ns, unsigned* error) {
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    if (rr_ld_relaxed_sys(error) != 0u) {
        return;  // the rank has failed already: nothing of this call runs
    }
    rr_ull* own = const_cast<rr_ull*>(controls[rank]);
    const rr_ull at = layout.slots + (seq % layout.call_slots) * layout.slot_words;
    const rr_ull deadline = rr_deadline(timeout_ns);
    for (unsigned q = 0; q < world; ++q) {
        if (q == rank) {
            continue;
        }
        const rr_ull* theirs = controls[q];
        unsigned spins = 0u;
        while (rr_ld_acquire_sys64(theirs + layout.published) < seq) {
            const bool failed = spins % RR_ABORT_POLL == RR_ABORT_POLL - 1u &&
                                (rr_ld_relaxed_sys64(theirs + layout.abort) != 0ull ||
                                 rr_ld_relaxed_sys64(own + layout.abort) != 0ull);
            if (failed || rr_give_up(deadline, error, spins)) {
                rr_fail(error, RR_GATE_ERR_WAIT);
                return;
            }
        }
        // A peer that failed after publishing (or this rank's abort) ends the call here, not
        // at a barrier's deadline.
        if (rr_ld_relaxed_sys64(theirs + layout.abort) != 0ull ||
            rr_ld_relaxed_sys64(own + layout.abort) != 0ull) {
            rr_fail(error, RR_GATE_ERR_WAIT);
            return;
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
    rr_st_release_sys64(own + layout.gated, seq);
}
