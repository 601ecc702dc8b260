//! The communicator API: built once for a set of ranks, then used for many collectives.
//!
//! A [`Communicator`] owns an executor (host threads now; GPUs through [`crate::exec::cuda`]) and
//! a cache of checked plans, one per shape. Every call validates its arguments for real before
//! anything is enqueued — buffer count, lengths compared across all ranks, placement, overlap —
//! and returns a clear [`Error`] naming the rank. A call that fails inside the executor marks the
//! communicator failed: later calls return that error at once ([`Error::CommunicatorFailed`]);
//! make a new communicator to continue.
//!
//! Where each part lives: making a communicator, `init.rs`, and what it is once made (its GPUs,
//! its edges, what a call of a size runs), `facts.rs`; the all-reduce's methods and
//! [`ring_allreduce`], `all_reduce.rs`; every other collective — reduce-scatter, all-gather,
//! broadcast, reduce, all-to-all, grouped send/recv — with its methods and its one generic
//! entry, [`Communicator::enqueue_collective`], `collectives.rs`; the checks of every call,
//! `validate.rs`, and of a configuration, `config_checks.rs`; the one submit of every call
//! (`submit_collective`: the way every call reaches the executor) and the profile of host
//! phases it leaves, `dispatch.rs`; waiting, health, abort and
//! close, `health.rs`; [`Scope`], `scope.rs`. This file holds the communicator's state: the
//! [`Communicator`] and what its calls pass between those files. One rank per process, NCCL's
//! `ncclCommInitRank` model, is [`RankCommunicator`], in `rank_communicator/`.
//!
//! A communicator is `Send + Sync`: calls from several threads are serialised, each holding it
//! for its whole length. Other threads may use `GpuBuffer`s meanwhile (ringreduce's own blocking
//! calls wait for its peer kernels: [`crate::device::gate`]), but must not make CUDA calls outside
//! ringreduce that wait for its GPUs (allocations, frees, pageable copies): docs/ERRORS.md,
//! "Several threads", and [`Error::LaunchBlocked`].
//!
//! ```
//! use ringreduce::{Communicator, ReduceOp};
//!
//! let comm = Communicator::host(3)?;
//! let mut bufs = vec![vec![1.0f32, 2.0], vec![10.0, 20.0], vec![100.0, 200.0]];
//! comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum)?;
//! assert!(bufs.iter().all(|b| b == &[111.0, 222.0]));
//!
//! let inputs = vec![vec![4i32, -1], vec![2, 7], vec![9, 0]];
//! let mut outputs = vec![vec![0i32; 2]; 3];
//! comm.all_reduce(&inputs, &mut outputs, ReduceOp::Max)?;
//! assert_eq!(outputs[1], [9, 7]);
//! # Ok::<(), ringreduce::Error>(())
//! ```

use crate::error::Error;
use crate::exec::cuda::executor::{CudaExecutor, EdgeInfo};
use crate::exec::host::HostExecutor;
use crate::exec::profile::CallProfile;
use crate::exec::Algorithm;
use std::sync::{Mutex, OnceLock};

mod all_reduce;
mod collectives;
mod config_checks;
mod dispatch;
mod facts;
mod health;
mod init;
mod rank_communicator;
mod scope;
mod validate;

pub use all_reduce::ring_allreduce;
pub(crate) use config_checks::{check_cuda_config, check_deterministic_if, check_host_config};
pub use dispatch::PROFILED_CALLS_KEPT;
pub use rank_communicator::{AbortHandle, PeerOp, RankCall, RankCommunicator, Registration};
pub use scope::Scope;

// Boxed: the two executors differ in size by hundreds of bytes.
enum Executor {
    Host(Box<HostExecutor>),
    Cuda(Box<CudaExecutor>),
}

struct State {
    exec: Option<Executor>,
}

/// What a communicator is, fixed when it is made: read without waiting for a running call.
struct Facts {
    devices: Vec<usize>,
    edges: Vec<EdgeInfo>,
    algorithm: Algorithm,
    /// How the ranks reach each other, for the selection ([`crate::exec::algorithm::select`]).
    reach: crate::exec::algorithm::Reach,
    deterministic: bool,
    /// The LL one-shot's room, for the selection ([`crate::exec::algorithm::Ask::ll_grid`]).
    ll_grid: Option<u32>,
}

/// A set of ranks that run collectives together.
///
/// # A failed or timed-out call
///
/// Every call has a deadline (the config's `timeout`), and a blocking call returns by it, with
/// [`Error::Timeout`] naming the rank and what it waited for, even when a GPU is stuck (a hung
/// kernel, or work queued before the call that never finishes). Returning does not stop the GPU:
/// the part of the call already queued on a stuck GPU runs whenever that GPU moves again, and
/// then reads the call's inputs and writes its outputs — after the borrow of the buffers has
/// ended. (Host ranks stop touching the buffers before a call returns.) So after a call on GPUs
/// failed:
///
/// 1. do not free, reuse or read the call's buffers yet;
/// 2. [`Communicator::abort`] the communicator (or drop it): it waits for its GPUs up to the
///    timeout and releases them, leaking rather than freeing what a stuck GPU may still touch;
/// 3. then wait until the GPUs are idle — a device-wide synchronize
///    (`ringreduce::device::context(gpu)?.synchronize()`; [`crate::GpuBuffer`]'s copies do one)
///    — or keep the buffers alive until the process ends.
///
/// docs/ERRORS.md ("What bounds every wait") says what each algorithm does at its deadline.
pub struct Communicator {
    world: usize,
    facts: Facts,
    state: Mutex<State>,
    /// The first error a collective hit. Outside `state`, whose lock a running call holds, so
    /// that `health` never waits for a call.
    failed: OnceLock<Error>,
    /// With [`CudaConfig::profile_host`](crate::CudaConfig::profile_host): each call's host phases,
    /// until [`Communicator::host_profile`] takes them (module [`crate::exec::profile`]).
    profile: Option<Mutex<Vec<CallProfile>>>,
}
