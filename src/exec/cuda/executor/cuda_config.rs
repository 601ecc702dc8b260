//! The options of the GPU communicator ([`CudaConfig`]) and their defaults: how edges move data,
//! the ring's chunk and slots, the timeout, the algorithm and the opt-in paths (launcher threads,
//! the LL one-shot, host profiling). The executor reads them at creation (module `create`) and
//! per shape (module `prepare`); `exec::config` checks them against its limits first.

use crate::exec::config::Transport;
use crate::exec::Algorithm;
use std::time::Duration;

/// Options of the GPU communicator.
#[derive(Clone, Debug, PartialEq)]
pub struct CudaConfig {
    /// How the ring's edges move data ([`Transport`], shared with [`crate::HostConfig`]).
    pub transport: Transport,
    /// Staging slots per receiver.
    pub slots: usize,
    /// Chunk size in bytes; `None` grows it with the message (see [`auto_chunk_bytes`]).
    ///
    /// [`auto_chunk_bytes`]: super::auto_chunk_bytes
    pub chunk_bytes: Option<usize>,
    /// How long a collective may take before it fails with [`Error::Timeout`].
    ///
    /// [`Error::Timeout`]: crate::Error::Timeout
    pub timeout: Duration,
    /// Let several ranks share one GPU (each rank still has its own streams, staging and thread).
    /// For testing the whole GPU path on a one-GPU machine; off by default, where a repeated
    /// device is [`Error::DuplicateDevice`].
    ///
    /// [`Error::DuplicateDevice`]: crate::Error::DuplicateDevice
    pub allow_shared_device: bool,
    /// Time one copy over each edge at creation and flag edges far below their link
    /// ([`EdgeInfo::slow`], module [`probe`]). On by default; costs milliseconds.
    ///
    /// [`EdgeInfo::slow`]: super::EdgeInfo::slow
    /// [`probe`]: super::super::probe
    pub probe_edges: bool,
    /// Ring, one-shot, two-shot, or chosen by message size (`Auto`: the selection,
    /// [`crate::exec::algorithm::select`], which takes the staged algorithms where the GPUs do
    /// not all reach each other). The one- and
    /// two-shot kernels read peer memory: 2 to 8 ranks, peer access between every pair of GPUs.
    /// On 2 to 8 ranks without it (or with [`Transport::Staged`]) `OneShot` runs the staged
    /// one-shot, through pinned host memory, and `TwoShot` is an error at creation; on one rank
    /// or more than 8 both are errors at creation, and `Auto` runs the ring.
    pub algorithm: Algorithm,
    /// Fold every element of a reducing collective (all-reduce, reduce-scatter, reduce) in rank
    /// order on every algorithm and size, so results do not depend on which algorithm runs (see
    /// [`crate::exec::algorithm::deterministic_needs_peers`] for what it costs and what it
    /// refuses, and docs/guide/07-other-collectives.md, "Fold order"). Off by default.
    pub deterministic: bool,
    /// Launch a peer call's kernels on every GPU at once, from a launcher thread per rank (rank
    /// 0's from the caller's thread), instead of one GPU after the other from the caller's
    /// thread. A launcher spins for 200 µs after each call, then sleeps. Off by default until
    /// it is measured on two GPUs (docs/PERFORMANCE.md, "Where the host time of a call goes").
    pub launch_threads: bool,
    /// Run the one-shot all-reduce of messages up to
    /// [`LL_MAX_BYTES`](crate::exec::cuda::LL_MAX_BYTES) (64 KiB) per rank with the LL
    /// kernel (`cuda/ll.cuh`): each rank pushes its input into its peers' receive buffers as
    /// words that carry their own flag, and waits only on its own — one NVLink crossing per call
    /// where the read one-shot waits for three (start barrier, reads, end barrier), and no copy
    /// of the buffer in place. Same plan, same fold, same bits; costs a receive buffer of
    /// [`ll_recv_bytes`](crate::exec::cuda::ll_recv_bytes)`(world)` (512 KiB for two
    /// ranks) per rank. Changes nothing where the one-shot does not run (`Auto` above its
    /// limits, the other collectives). Off by default until it is measured on two GPUs
    /// (docs/PERFORMANCE.md, "Small messages, CUDA graphs and the other competitors").
    pub low_latency: bool,
    /// Time the phases of every call on the calling thread — validation, lock, plan lookup,
    /// set-up, each rank's launch, completion wait, error check, return — and keep them for
    /// [`Communicator::host_profile`](crate::Communicator::host_profile) (module
    /// [`crate::exec::profile`]; `ringreduce bench --profile-host`). Off by default: on, each call
    /// keeps a few hundred bytes until they are taken.
    pub profile_host: bool,
    /// Give each rank of a job of one process per GPU (whose GPUs reach each other) the
    /// point-to-point channel's region, `2 MiB × world` of GPU memory, so that
    /// [`RankCommunicator::enqueue_peer_group`](crate::RankCommunicator::enqueue_peer_group)
    /// runs: sends and receives matched per direction on the GPUs (`cuda/channel.cuh`). On by
    /// default (run so far with ranks sharing one GPU only); off saves that memory, and the
    /// group calls are then refused.
    pub peer_groups: bool,
}

impl Default for CudaConfig {
    fn default() -> Self {
        CudaConfig {
            transport: Transport::Auto,
            slots: 3,
            chunk_bytes: None,
            timeout: Duration::from_secs(60),
            allow_shared_device: false,
            probe_edges: true,
            algorithm: Algorithm::Auto,
            deterministic: false,
            launch_threads: false,
            low_latency: false,
            profile_host: false,
            peer_groups: true,
        }
    }
}
