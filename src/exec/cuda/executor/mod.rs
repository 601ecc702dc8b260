//! The GPU executor of one communicator: one rank executor per rank of this process (module
//! `rank`) over a fabric (`exec::cuda::fabric`) — every rank in this process over the in-process
//! fabric (`Communicator`), or this process's one rank over the fabric of a job with a process
//! per rank (`RankCommunicator`: memory shared by file descriptors or IPC handles, the caller's
//! buffers staged through memory the rank exports) — the same plans as the host executor, enqueued on CUDA streams.
//!
//! At creation each rank executor binds its rank to a GPU and makes its context, four
//! non-blocking streams (Main, Send, Recv, Reduce) and error word, and takes the kernels
//! (loaded once per process and GPU, `KernelModule::shared`); the ranks all-gather
//! their GPUs' identities (UUID, PCI bus id), each decides how its outgoing ring edge moves data
//! from how it reaches the receiver's GPU by that identity ([`Transport`]: peer copies where
//! `cuDeviceCanAccessPeer` allows and peer access could be enabled, pinned-host staging
//! elsewhere, or forced either way) and whether it reaches every peer, probes its halves of its
//! edges, and the ranks all-gather those too (module `edges`); where the peer kernels can run,
//! every rank makes its peer words and imports its peers'. Per message shape it builds a
//! plan, checks it, decides once how it runs (`Dispatch`) and who enqueues it (`Schedule`),
//! and has every rank prepare it: each allocates its events, staging and event counters, the
//! fabric all-gathers their export handles, each imports its peers' (the in-place one-shot's
//! exposed copies live in one region per rank, module `exposure`) — or, across processes, a
//! kernel plan whose buffers fit each rank's arena, made with the peer words, is prepared by
//! each rank alone (module `prepare`, [`crate::plan::arena`]). Later calls of the same shape
//! reuse them. Inside a collective nothing is allocated and no event is created; the host does
//! not synchronise until the optional final wait for completion.
//!
//! Between ranks there is one kind of wait, eager or captured: an event counter (module
//! `counters`), never another rank's CUDA event, so a rank's enqueue never waits for another's.
//!
//! Where each part lives:
//! - this module: the executor and its plan cache, `Dispatch`, `Schedule`, what the threads of
//!   one call share (`CudaCall`), and the grants of pool memory to the GPUs that reach it;
//! - `cuda_config`: [`CudaConfig`], the communicator's options, and their defaults;
//! - `create`: creation — each rank's GPU bound, identities and edges exchanged and probed,
//!   peer words made, rank threads and launchers started;
//! - `prepare`: a shape's plan built and checked, its `Dispatch` and `Schedule` decided, and
//!   its resources prepared on every rank;
//! - `callers`: `CudaExecutor::run`, the entry of every call — published and checked
//!   (`checked_call`), the caller's streams fenced around Main, made ready, launched;
//! - `run_on_main`: `ready_call` (the call's plan prepared and its buffers laid out) and
//!   `run_on_rank_threads`;
//! - `channel`: groups of sends and receives on the point-to-point channel, matched per
//!   direction on the GPUs (one process per GPU);
//! - `rank`: one rank's executor — its resources, and the two phases of preparing a plan;
//! - `counters`: the event counters, how one rank waits for another's event;
//! - `edges`: how each ring edge moves data ([`EdgeInfo`]), its probe, and the chunk size rule;
//! - `enqueue`: the enqueue of one rank's instructions on its streams, for every path (copies,
//!   reduce and scale kernels, events, counter signals and waits, peer kernel launches), the
//!   rank threads, the wait for completion and the diagnosis of a stalled call;
//! - `peer_words`: each rank's peer-kernel words, and which peer kernel a call launches;
//! - `peer_enqueue`: a peer call's opening, and the launch of each peer kernel from a plan;
//! - `error_words`: what the codes in the ranks' error words report, and the check that turns
//!   them into errors;
//! - `exposure`: a rank's one region that its in-place one-shot plans' exposed buffers live in,
//!   so that a new message size allocates nothing;
//! - `layout`: the checks that tie a one-shot, two-shot or steps plan to its kernel;
//! - `launch`: the enqueue of a call from the caller's thread (rank by rank, or interleaved in
//!   the checker's order) or the launcher threads, and the one function that enqueues one
//!   rank's program;
//! - `capture`: collectives captured into CUDA graphs (what is refused, the pinned plans);
//! - `teardown`: waiting for idle streams, `synchronize`, `close`, `Drop`, and the deliberate
//!   leak of what a stuck GPU may still touch.
//!
//! Invariant: a failed enqueue never leaves a GPU waiting forever (every wait between ranks and
//! every peer kernel gives up within three quarters of the timeout, leaving a code in its
//! rank's error word), and teardown never hangs on a stuck GPU (see `enqueue`, `peer_enqueue`,
//! `launch` and `teardown` for how each path keeps it).

mod callers;
mod capture;
mod channel;
mod counters;
mod create;
mod cuda_config;
mod edges;
mod enqueue;
mod error_words;
mod exposure;
mod launch;
mod layout;
mod peer_enqueue;
mod peer_words;
mod pieces;
mod prepare;
mod rank;
mod registered;
mod run_on_main;
mod teardown;
mod watch;

pub(crate) use channel::ChannelEnd;
pub use cuda_config::CudaConfig;
pub use edges::{auto_chunk_bytes, EdgeInfo};

use super::fabric::Fabric;
use super::kernels::CallGate;
use crate::device;
use crate::element::{DType, ReduceOp};
use crate::error::Result;
use crate::exec::algorithm::{Form, Ran, Reach};
pub use crate::exec::config::Transport;
use crate::exec::{Algorithm, PlanCache, Shape};
use crate::plan::{EdgeTransport, Op, Plan, StreamKind};
use crossbeam_channel::Sender;
use cudarc::driver::CudaStream;
use layout::StepLayout;
use peer_words::PeerKernel;
use rank::{RankExecutor, RankPlan};
use std::collections::HashSet;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How a prepared call runs: decided once, from the checked plan and the communicator, when the
/// plan is prepared, and shared by every rank's [`RankPlan`]. Nothing later probes the plan to
/// find out.
enum Dispatch {
    /// Copies and reduce kernels on each rank's four streams, ordered by events on a rank's own
    /// streams and by event counters between ranks (each rank's `RankPlan::counters`): the
    /// ring's all-reduce, every other collective's ring form, and any plan without peer
    /// reduces. Enqueued by the rank threads when events cross ranks (long programs, one thread
    /// per rank), else from the caller's thread.
    CopyEngines,
    /// The one-shot all-reduce: each rank's one peer reduce is one kernel, `kernel` (the read
    /// one-shot or the LL one-shot, [`peer_words::PeerWords::oneshot_kernel`]).
    OneShot { kernel: PeerKernel },
    /// The two-shot all-reduce: each rank's whole program is one fused kernel, which needs each
    /// rank's segment (offset, count) (`twoshot_segments`).
    TwoShot { segments: Vec<(usize, usize)> },
    /// The one-shot form of a collective other than the all-reduce: each rank's steps run in one
    /// kernel between one start and one end barrier (`steps_layout`), by rank.
    Steps { steps: Vec<Vec<StepLayout>> },
}

impl Dispatch {
    /// The peer kernel this way launches, if any: names it in errors, and says which caller's
    /// buffers the peers read.
    fn peer_kernel(&self) -> Option<PeerKernel> {
        match self {
            Dispatch::CopyEngines => None,
            Dispatch::OneShot { kernel } => Some(*kernel),
            Dispatch::TwoShot { .. } => Some(PeerKernel::TwoShot),
            Dispatch::Steps { .. } => Some(PeerKernel::Steps),
        }
    }

    /// The form this way runs in, as a record of what ran says it ([`Ran`]).
    fn form(&self) -> Form {
        match self {
            Dispatch::CopyEngines => Form::CopyEngines,
            Dispatch::OneShot { kernel } => match kernel {
                PeerKernel::OneShotLl => Form::LlKernel,
                PeerKernel::OneShotStaged => Form::StagedKernel,
                _ => Form::OneShotKernel,
            },
            Dispatch::TwoShot { .. } => Form::TwoShotKernel,
            Dispatch::Steps { .. } => Form::StepsKernel,
        }
    }
}

/// A prepared shape, as the process sees it: the checked plan, how it runs, and every rank's
/// resources of it (in this process, every rank is local).
struct Prepared {
    plan: Arc<Plan>,
    /// The selection's algorithm, which the plan is of.
    algorithm: Algorithm,
    dispatch: Arc<Dispatch>,
    /// Names the plan in a counter wait's error code (`counters::wait_code`): a number per plan
    /// prepared by this communicator, modulo 2^15 (every rank numbers alike).
    serial: usize,
    /// By rank.
    ranks: Vec<Arc<RankPlan>>,
    /// Who enqueues a call's ranks, and in what order.
    schedule: Schedule,
    /// The caller's buffers staged (`rank::Staged`).
    staged: rank::Staged,
}

/// Who enqueues the ranks of a call, and in what order: decided once per plan, from its
/// dispatch and the communicator's placement. Every schedule enqueues each rank's instructions
/// with the same code (`enqueue::CudaEnqueue`), in its program order; they differ only in how
/// the ranks interleave.
enum Schedule {
    /// The caller's thread, one rank after the other (or the launcher threads, all at once):
    /// the peer kernels meet on the GPUs whenever each is launched, and a plan whose events do
    /// not cross ranks has no wait between them.
    RankByRank,
    /// The caller's thread, every rank's instructions interleaved in the checker's enqueue
    /// order (`check::enqueue_order`), which puts every counter wait after its signal: for
    /// copy-engine plans on a communicator whose ranks share a GPU (`launch::enqueue_in_order`
    /// says why).
    Checked(Vec<(usize, usize)>),
    /// The rank threads, each its own rank's program, all at once: copy-engine plans whose
    /// events cross ranks, on ranks with a GPU each (no hardware queue is shared between
    /// ranks, so the order between them does not matter).
    RankThreads,
}

/// Plans kept per communicator; older ones are dropped beyond this (after a device sync).
const CACHED_PLANS: usize = 8;

/// What the threads of one call share.
struct CudaCall {
    /// The communicator's fabric, which a waiting rank asks for a lost peer.
    fabric: Arc<dyn Fabric>,
    /// The resources of the call's plan of every rank in this process, in rank order
    /// ([`CudaCall::plan_of`]).
    plans: Vec<Arc<RankPlan>>,
    /// The first rank in this process.
    first: usize,
    /// The caller's buffers' base addresses, by plan buffer (0 for the buffers the ranks own).
    callers: Vec<u64>,
    /// Where the caller's buffers are staged (`Prepared::staged`): the copies this process's
    /// rank enqueues on its Main stream before its program, (destination, source, bytes) — the
    /// caller's buffers into the memory it exported for them — and after it, back (the written
    /// ones).
    copies_in: Vec<(u64, u64, usize)>,
    copies_out: Vec<(u64, u64, usize)>,
    /// The plan's number (`Prepared::serial`).
    serial: usize,
    dtype: DType,
    op: ReduceOp,
    wait_complete: bool,
    deadline: Instant,
    timeout: Duration,
    abort: AtomicBool,
    done: Sender<(usize, Result<()>)>,
    /// The call launches peer kernels.
    peer_call: bool,
    /// Captured into a CUDA graph: nothing is recorded for the host to poll.
    captured: bool,
    /// The call gate this process's rank's peer kernel passes first (a call across processes
    /// checked on the GPU, `CudaExecutor::run`), else [`CallGate::NONE`].
    gate: CallGate,
}

impl CudaCall {
    /// Rank `rank`'s resources of the call's plan (a rank of this process).
    fn plan_of(&self, rank: usize) -> &Arc<RankPlan> {
        &self.plans[rank - self.first]
    }
}

/// The GPU executor of one communicator: the executors of its ranks in this process (all of
/// them, over the in-process fabric; or one, over the fabric of a job whose ranks met at a
/// rendezvous).
pub(crate) struct CudaExecutor {
    fabric: Arc<dyn Fabric>,
    /// The number of ranks, in this process or not.
    world: usize,
    /// This process's ranks' executors, in rank order (`ranks[0].rank()` is the first).
    ranks: Vec<RankExecutor>,
    threads: Vec<(Sender<Arc<CudaCall>>, JoinHandle<()>)>,
    edges: Vec<EdgeInfo>,
    config: CudaConfig,
    /// The checked plans by shape, with the proofs that make a new size cheap; each rank keeps
    /// its own resources of each.
    cache: PlanCache<Prepared>,
    pool_granted: HashSet<(u64, usize)>,
    /// Plans prepared so far (numbers each plan: `Prepared::serial`).
    prepared_plans: usize,
    /// Whether the peer kernels (one-shot, two-shot, steps, LL one-shot) can run here: every
    /// pair of GPUs reaches the other, and every rank has its peer words.
    peers_ok: bool,
    /// The GPUs do not all reach each other, and the all-reduce takes the staged algorithms
    /// ([`Reach::Staged`]: the staged one-shot for small messages, with its barrier words in
    /// host memory).
    staged_oneshot: bool,
    /// Whether two ranks share a GPU (and so a context, whose streams share the GPU's hardware
    /// queues): then copy-engine calls are enqueued in the checker's order (`Schedule`).
    shared_gpu: bool,
    /// Every plan ever captured into a CUDA graph, kept for the communicator's life: a graph
    /// holds its staging and counters.
    pinned: Vec<(Shape, Arc<Prepared>)>,
    /// The peer kernel of the latest peer call, which names the kernel in a barrier timeout.
    last_peer_kernel: PeerKernel,
    /// The latest peer call whose launches were held up between ranks: the rank whose launch
    /// came late and by how much (`LaunchBlocked` names it when that call then fails).
    launch_blocked: std::sync::Mutex<Option<(usize, Duration)>>,
    /// The launcher threads of ranks 1, 2, … (peer calls launched on every GPU at once), when the
    /// peer kernels can run and `launch_threads` is on.
    launchers: Option<Box<launch::Launchers>>,
    /// The caller's allocations registered so far (module `registered`).
    registrations: registered::Registrations,
    /// What the latest call ran (set once its plan is prepared).
    last_ran: Option<Ran>,
    /// With peers in other processes: the thread that stops this process's kernels once a peer
    /// is lost, between calls too (module `watch`).
    watcher: Option<watch::Watcher>,
}

impl CudaExecutor {
    /// Whether the caller's buffers of a call run as `dispatch` that a peer touches are staged
    /// through memory each rank exports (copied in before the call, out after: `rank::Staged`):
    /// when some ranks live in other processes, which cannot reach them — unless every rank registered its buffers
    /// (`registered`), or the call runs the LL one-shot, whose peers reach only this rank's
    /// receive buffer (they are sent its words, `cuda/ll.cuh`), never a buffer of the plan.
    fn stages_callers(&self, registered: bool, dispatch: &Dispatch) -> bool {
        !self.in_one_process()
            && !registered
            && dispatch.peer_kernel() != Some(PeerKernel::OneShotLl)
    }

    /// How this communicator's ranks reach each other, for the selection
    /// ([`crate::exec::algorithm::select`]).
    pub(crate) fn reach(&self) -> Reach {
        match (self.peers_ok, self.staged_oneshot) {
            (true, _) => Reach::Peers,
            (false, true) => Reach::Staged,
            (false, false) => Reach::Apart,
        }
    }

    /// The LL one-shot kernel's room for the selection ([`crate::exec::algorithm::Ask`]): the
    /// peer kernels' grid cap where the ranks have the LL receive buffers (`low_latency`).
    pub(crate) fn ll_grid(&self) -> Option<u32> {
        let peer = self.ranks.first()?.peer.as_ref()?;
        peer.ll_grid()
    }

    /// What the latest call ran, once its plan was prepared ([`Ran`]).
    pub(crate) fn last_ran(&self) -> Option<Ran> {
        self.last_ran
    }

    /// Whether a shape's first call across processes is prepared by this rank alone and gated
    /// like a later one: every rank made its arena (`prepare_alone`).
    pub(crate) fn first_calls_alone(&self) -> bool {
        !self.in_one_process() && self.arenas_everywhere()
    }

    /// Whether every rank lives in this process (the in-process fabric).
    fn in_one_process(&self) -> bool {
        self.ranks.len() == self.world
    }

    pub(crate) fn devices(&self) -> Vec<usize> {
        self.ranks.iter().map(|r| r.res.device).collect()
    }

    /// Each rank's Main stream, as cudarc sees it (for buffers that track their uses).
    pub(crate) fn main_streams(&self) -> Vec<&CudaStream> {
        self.ranks
            .iter()
            .map(|r| r.res.stream(StreamKind::Main).cudarc())
            .collect()
    }

    /// Whether the peer kernels can run here (every pair of GPUs reaches the other).
    pub(crate) fn peers_ok(&self) -> bool {
        self.peers_ok
    }

    pub(crate) fn edges(&self) -> &[EdgeInfo] {
        &self.edges
    }

    /// The raw handle of rank `rank`'s Main stream, on which each collective starts and ends.
    pub(crate) fn main_stream(&self, rank: usize) -> Option<cudarc::driver::sys::CUstream> {
        self.ranks
            .get(rank)
            .map(|r| r.res.stream(StreamKind::Main).raw())
    }

    /// The pool trap, handled: an output from a stream-ordered pool gets its pool opened to the
    /// GPU that pushes into it (once per buffer address). Without this the push would silently
    /// run through the host at a tenth of the link's speed. Staged edges touch only our own
    /// staging memory, and inputs are only read locally.
    pub(crate) fn prepare_buffers(&mut self, outputs: &[u64]) -> Result<()> {
        if !self.in_one_process() {
            // Staged through our own memory, or registered (never pool memory).
            return Ok(());
        }
        let n = self.ranks.len();
        for (rank, &addr) in outputs.iter().enumerate() {
            let sender = (rank + n - 1) % n;
            if n == 1 || addr == 0 || self.edges[sender].transport != EdgeTransport::Peer {
                continue;
            }
            self.grant_once(addr, self.ranks[sender].res.device)?;
        }
        Ok(())
    }

    /// [`CudaExecutor::prepare_buffers`] for any collective's plan: every caller's buffer that
    /// another rank's copy engine writes into (a peer push) gets its pool opened to that rank's
    /// GPU, once per buffer address. `callers` are the plan's caller-buffer addresses for this
    /// call.
    fn grant_pushers(&mut self, plan: &Plan, callers: &[u64]) -> Result<()> {
        for (rank, program) in plan.ranks.iter().enumerate() {
            for instr in program {
                let Op::Copy { dst, .. } = instr.op else {
                    continue;
                };
                let decl = plan.decl(dst.buf);
                if decl.rank != rank && decl.kind.is_callers() && callers[dst.buf.0] != 0 {
                    self.grant_once(callers[dst.buf.0], self.ranks[rank].res.device)?;
                }
            }
        }
        Ok(())
    }

    /// Grants `peer` access to the pool behind `addr` unless that was done already; remembered
    /// only once it succeeded, so a failed grant is tried again on the next call.
    fn grant_once(&mut self, addr: u64, peer: usize) -> Result<()> {
        if !self.pool_granted.contains(&(addr, peer)) {
            device::grant_pointer_pool_access(addr, peer)?;
            self.pool_granted.insert((addr, peer));
        }
        Ok(())
    }
}
