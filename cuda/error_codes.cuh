// A part of the kernel source of ringreduce: the codes a kernel stores into its error word, the
// one definition of them. build.rs also turns every define below into a Rust constant of the
// same name without its `RR_` (RR_LL_ERR_WAIT → LL_ERR_WAIT, in $OUT_DIR/error_codes.rs, included
// by src/exec/cuda/kernels/error_codes.rs), the comment above it becoming its doc; the host
// decodes a word in src/exec/cuda/executor/error_words.rs (`kernel_failure`).
//
// Joined into one translation unit by build.rs, first of its PARTS, so that every later part
// sees these. No part includes another: NVRTC compiles the joined text with no include
// paths, so the kernels include NO header at all.
//
// The error word: one 32-bit word per rank, in host-mapped pinned memory, 0 while no kernel has
// failed. A kernel writes it with a plain 32-bit `st.relaxed.sys` (no PCIe atomics needed); the
// last writer wins. Each code is nonzero and distinct (build.rs refuses the build otherwise), one
// line `#define RR_<NAME> <value>u` with its meaning in the `//` lines right above it: the shape
// build.rs reads.

// A peer kernel (one-shot, two-shot, steps) gave up at its start barrier: a peer's kernel never
// arrived.
#define RR_PEER_ERR_START 1u
// A peer kernel gave up at its end barrier.
#define RR_PEER_ERR_END 2u
// A peer kernel (the LL one-shot too) refused its launch: it breaks the kernel's assumptions
// (world, rank, grid, block, the steps).
#define RR_PEER_ERR_LAUNCH 3u
// The two-shot gave up at its middle barrier, between its reduce and its gather.
#define RR_PEER_ERR_MIDDLE 4u
// An LL one-shot thread waited past the deadline for a peer's pushed words.
#define RR_LL_ERR_WAIT 5u
// The host gave up the call: a peer rank is lost (its process is gone). Written by the host
// into the rank's error word; every spinning wait of the rank's kernels gives up on seeing a
// code there.
#define RR_ERR_PEER_LOST 6u
// The call gate (gate.cuh) found a peer's call of the same number different (the rank's
// control segment's `fault` word names the call and the peer).
#define RR_GATE_ERR_MISMATCH 7u
// The call gate gave up waiting for a peer to publish the call: the peer failed, the host gave
// the call up, or the deadline passed.
#define RR_GATE_ERR_WAIT 8u
// The point-to-point channel (channel.cuh) gave up waiting for a peer's chunk or free slot: the
// deadline passed, the host gave the call up, or a rank of the job failed.
#define RR_CH_ERR_WAIT 9u
// A channel receive found its peer's send of another message, size or type; the low 16 bits
// are the peer.
#define RR_CH_ERR_MISMATCH_BIT 0x40000000u
// The top bit of a captured ring's counter wait that timed out; the low 31 bits are the code the
// wait was launched with: the plan's pin in bits 16..31, the event in bits 0..16
// (src/exec/cuda/executor/capture.rs: wait_code, counter_timeout).
#define RR_COUNTER_ERR_BIT 0x80000000u
