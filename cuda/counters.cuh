// A part of the kernel source of ringreduce: the event counter kernels, which carry the ring's
// cross-GPU "record on one GPU, wait on another" when the collective is captured into CUDA
// graphs.
//
// Joined into one translation unit by build.rs, in the order of its PARTS (error_codes.cuh
// first). No part includes another.
//
// Why kernels: an event wait across two captures (one graph per GPU, as one process per GPU
// would make) is not allowed, and a wait captured on a stream memory operation cannot time out.
// So a captured ring replaces each cross-GPU event by a counter: the recording rank's stream runs
// rr_counter_signal after its record, the waiting rank's stream runs rr_counter_wait where it
// would have waited. Counts, not values from the host, so every replay of the graphs pairs the
// k-th signal with the k-th wait, whatever was replayed before.
//
// Words (device memory, zeroed once, all 32-bit; src/exec/cuda/executor/capture.rs lays them
// out per plan):
// - `sent`: in the recording rank's memory, one per (event, waiting rank): how many signals it
//   has sent. Written only by rr_counter_signal on the recording stream.
// - `mailbox`: in the waiting rank's memory, one per event: the latest count the recorder sent.
//   Written only by the recorder's rr_counter_signal (a peer store over NVLink).
// - `seen`: in the waiting rank's memory, one per (event, waiting stream): how many signals that
//   stream has consumed. Written only by rr_counter_wait on that stream.
// Counts wrap; "reached" is a signed difference, so 2^31 signals may be in flight at most.
//
// Memory ordering: the signal runs after the work it publishes has completed on its stream (a
// kernel starts after everything before it on the stream), then issues a system-scope fence and
// a release store; the wait's acquire load then orders everything after it on the waiting
// stream (the next kernel or copy starts after the wait kernel has completed).
// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// rr_counter_signal(unsigned* sent, unsigned* mailbox)   (exported in instances.cuh)
// Purpose: one more signal of an event to one waiting rank: *sent += 1, then *mailbox = *sent.
// Assumptions: one thread (a grid of one block of one thread); `sent` is this GPU's memory,
//   `mailbox` the waiting rank's (peer access on), both 4-byte aligned; launches on `sent` are
//   ordered (one recording stream), and only this kernel writes `mailbox`.
// Why it is fast: one load, two stores; no host involvement.
// ---------------------------------------------------------------------------------------------
static __device__ __forceinline__ void rr_counter_signal_body(unsigned* sent,
                                                              unsigned* mailbox) {
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    const unsigned next = *sent + 1u;
    *sent = next;
    __threadfence_system();
    rr_st_release_sys(mailbox, next);
}

// ---------------------------------------------------------------------------------------------
// rr_counter_wait(const unsigned* mailbox, unsigned* seen, unsigned long long timeout_ns,
//                 unsigned* error, unsigned code)   (exported in instances.cuh)
// Purpose: wait for the next signal: spin until *mailbox has reached *seen + 1, then consume it
//   (*seen += 1). Gives up once timeout_ns have passed since the kernel started, storing
//   RR_COUNTER_ERR_BIT | code into *error (error_codes.cuh; and still consumes, so the counts
//   stay paired with the signals already sent; the communicator is failed then anyway); does
//   not wait at all when *error already holds a code.
// Assumptions: one thread; `mailbox` and `seen` are this GPU's memory, `error` writable from
//   here (host-mapped); launches on `seen` are ordered (one waiting stream).
// Why it is fast: one thread spinning on local memory that the peer writes over NVLink.
// ---------------------------------------------------------------------------------------------
static __device__ __forceinline__ void rr_counter_wait_body(const unsigned* mailbox,
                                                            unsigned* seen, rr_ull timeout_ns,
                                                            unsigned* error, unsigned code) {
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    const unsigned target = *seen + 1u;
    const rr_ull deadline = rr_deadline(timeout_ns);
    // A rank whose earlier wait (or peer kernel) has failed waits no more: the call is lost, and
    // each further wait would otherwise add a whole timeout.
    const bool failed = rr_ld_relaxed_sys(error) != 0u;
    unsigned spins = 0u;
    while (!failed && (int)(rr_ld_acquire_sys(mailbox) - target) < 0) {
        if (rr_give_up(deadline, error, spins)) {
            rr_fail(error, RR_COUNTER_ERR_BIT | code);
            break;
        }
    }
    *seen = target;
}
