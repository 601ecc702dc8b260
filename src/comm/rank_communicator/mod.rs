//! One rank of a job whose ranks each have their own communicator: [`RankCommunicator`], NCCL's
//! `ncclCommInitRank` model — rank 0 makes a [`UniqueId`](crate::UniqueId), every rank gets it
//! by any channel and joins with its rank, and each call takes this rank's buffers alone. Each
//! rank is a process of its own, as in torchrun's jobs.
//!
//! A host rank runs the host executor's plans with the others over shared memory
//! (`exec::host::process`). A GPU rank runs the GPU executor's, for its one GPU, over the
//! `Joined` fabric: its peers' memory is imported from file descriptors (`cuMemCreate` memory)
//! or legacy CUDA IPC handles, and the caller's
//! buffers its peers touch are staged through memory the rank exports, so any buffer works —
//! unless every rank registered the allocation its buffers lie in
//! ([`RankCommunicator::register`]): then the call runs on them in place.
//!
//! ```no_run
//! use ringreduce::{HostConfig, RankCommunicator, ReduceOp};
//! // In each of the job's processes, started by torchrun or `ringreduce launch`:
//! let mut comm = RankCommunicator::from_env_host(HostConfig::default())?;
//! let mut grads = vec![comm.rank() as f32; 1024];
//! comm.all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
//! # Ok::<(), ringreduce::Error>(())
//! ```
//!
//! Where each part lives: how a rank joins its job (`join.rs`); the calls that block until
//! complete (`blocking.rs`) and those ordered on the caller's stream (`enqueue_on.rs`); what
//! every call checks of this rank's buffers, and how it hands them on (`ends.rs`); registered
//! buffers (`registration.rs`); errors met between calls, closing and giving up (`abort.rs`);
//! sub-communicators (`split.rs`), NCCL's PreMulSum (`premul.rs`) and its point-to-point
//! groups (`peer_group.rs`).

use crate::error::{Error, Result};
use crate::exec::cuda::executor::CudaExecutor;
use crate::exec::hierarchy::gpu::GpuHierarchy;
use crate::exec::hierarchy::host::HostHierarchy;
use crate::exec::host::process::ProcessRank;
use crate::plan::hierarchy::Hosts;

mod abort;
mod blocking;
mod ends;
mod enqueue_on;
mod join;
mod peer_group;
mod premul;
mod registration;
mod split;

pub use abort::AbortHandle;
pub use enqueue_on::RankCall;
pub use peer_group::PeerOp;
pub use registration::Registration;

/// One rank of a job whose ranks each have a communicator (module doc). Its calls block until
/// the collective is complete on this rank (the `enqueue_*_on` calls, until enqueued), and
/// every rank must make the same calls in the same order: each call's shape is compared with
/// every peer's — by the hosts at the first call of a shape whose buffers do not fit the arenas
/// made at creation (a kernel's shape that fits, each rank prepares alone), else by the GPU
/// before the call touches
/// a peer's memory (then the error comes from the next call, `synchronize` or `async_error`) —
/// and a rank whose call differs gets [`Error::CallMismatch`], as do its peers. A call refused for its arguments (a length, a placement) changes nothing; one
/// that failed across ranks (a peer's process gone, a timeout, a mismatch) leaves the
/// communicator broken: later calls return [`Error::CommunicatorFailed`] at once; make a new
/// one with a new id.
pub struct RankCommunicator {
    rank: usize,
    world: usize,
    inner: Inner,
    /// The failure that broke this communicator: every later call returns it at once.
    broken: Option<Error>,
}

enum Inner {
    Host(ProcessRank),
    /// A host rank of a job on several hosts.
    Hosts(Box<HostHierarchy>),
    /// A GPU rank of a job on several hosts.
    GpuHosts(Box<GpuHierarchy>),
    Gpu {
        exec: CudaExecutor,
        device: usize,
    },
}

impl std::fmt::Debug for RankCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankCommunicator")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .finish()
    }
}

impl RankCommunicator {
    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// How the ranks lie on hosts (one host of every rank, but for a job on several hosts made
    /// by [`RankCommunicator::host_across`]).
    pub fn hosts(&self) -> Hosts {
        match &self.inner {
            Inner::Hosts(inner) => inner.hosts(),
            Inner::GpuHosts(inner) => inner.hosts(),
            _ => Hosts {
                hosts: 1,
                local: self.world,
            },
        }
    }

    /// What this rank's latest call ran ([`Ran`](crate::Ran)), as
    /// [`Communicator::last_ran`](crate::Communicator::last_ran) says it; `None` before the
    /// first call, after a collective of no elements across processes (which runs nothing),
    /// and for a job on several hosts (whose calls run several plans in stages).
    pub fn last_ran(&self) -> Option<crate::Ran> {
        match &self.inner {
            Inner::Host(rank) => rank.last_ran(),
            Inner::Gpu { exec, .. } => exec.last_ran(),
            Inner::Hosts(_) | Inner::GpuHosts(_) => None,
        }
    }

    /// Whether this rank prepares a shape's first call alone, so that it is enqueued like a
    /// later call whatever the peers' processes are doing: a GPU rank of a job on one host
    /// whose ranks all made their arena at creation (64 MiB each, of GPU memory, or pinned host
    /// memory where the GPUs do not all reach each other). Where not (the memory could not be
    /// had, `RINGREDUCE_CALL_GATE=off`, host ranks, several hosts), every first call waits for
    /// the peers' processes; where so, those the README lists still do (a capture, a forced
    /// ring, a first call that would evict a plan owning GPU memory).
    pub fn first_calls_alone(&self) -> bool {
        match &self.inner {
            Inner::Gpu { exec, .. } => exec.first_calls_alone(),
            Inner::Host(_) | Inner::Hosts(_) | Inner::GpuHosts(_) => false,
        }
    }

    /// The GPU this rank runs on; `None` for a host rank.
    pub fn device(&self) -> Option<usize> {
        match &self.inner {
            Inner::Gpu { device, .. } => Some(*device),
            Inner::GpuHosts(inner) => Some(inner.device()),
            Inner::Host(_) | Inner::Hosts(_) => None,
        }
    }
}

/// [`Error::CommunicatorFailed`] when a call broke the communicator (`broken`).
fn broken(broken: &Option<Error>) -> Result<()> {
    match broken {
        Some(err) => Err(Error::CommunicatorFailed(Box::new(err.clone()))),
        None => Ok(()),
    }
}

/// Runs `call` (one that crosses ranks: its arguments were checked), keeping its failure in
/// `broken`.
fn guarded<R>(broken: &mut Option<Error>, call: impl FnOnce() -> Result<R>) -> Result<R> {
    let result = call();
    if let Err(err) = &result {
        broken.get_or_insert_with(|| err.clone());
    }
    result
}
