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
//! exposed copies live in one region per rank, module `exposure`). Later calls of the same shape
//! reuse them. Inside a collective nothing is allocated and no event is created; the host does
//! not synchronise until the optional final wait for completion.
//!
//! Between ranks there is one kind of wait, eager or captured: an event counter (module
//! `counters`), never another rank's CUDA event, so a rank's enqueue never waits for another's.
//!
//! Where each part lives:
//! - this module: [`CudaConfig`], creation, the plan cache, `Dispatch`, `Schedule`, and
//!   `run_shape_on_main`, which hands a call to the rank threads or enqueues it inline;
//! - `rank`: one rank's executor — its resources, and the two phases of preparing a plan;
//! - `counters`: the event counters, how one rank waits for another's event;
//! - `edges`: how each ring edge moves data ([`EdgeInfo`]), its probe, and the chunk size rule;
//! - `enqueue`: the enqueue of one rank's instructions on its streams, for every path (copies,
//!   reduce and scale kernels, events, counter signals and waits, peer kernel launches), the
//!   rank threads, the wait for completion and the diagnosis of a stalled call;
//! - `peer`: each rank's peer-kernel words, their launch, and what the error words report;
//! - `exposure`: a rank's one region that its in-place one-shot plans' exposed buffers live in,
//!   so that a new message size allocates nothing;
//! - `layout`: the checks that tie a one-shot, two-shot or steps plan to its kernel;
//! - `launch`: the enqueue of a call from the caller's thread (rank by rank, or interleaved in
//!   the checker's order) or the launcher threads, and the one function that enqueues one
//!   rank's program;
//! - `callers`: the entry point of every call, which fences the caller's streams around Main;
//! - `capture`: collectives captured into CUDA graphs (what is refused, the pinned plans);
//! - `teardown`: waiting for idle streams, `synchronize`, `close`, `Drop`, and the deliberate
//!   leak of what a stuck GPU may still touch.
//!
//! Invariant: a failed enqueue never leaves a GPU waiting forever (every wait between ranks and
//! every peer kernel gives up within three quarters of the timeout, leaving a code in its
//! rank's error word), and teardown never hangs on a stuck GPU (see `enqueue`, `peer`, `launch`
//! and `teardown` for how each path keeps it).

mod callers;
mod capture;
mod counters;
mod edges;
mod enqueue;
mod exposure;
mod launch;
mod layout;
mod peer;
mod rank;
mod registered;
mod teardown;

pub use edges::{auto_chunk_bytes, EdgeInfo};

use super::fabric::Identity;
use super::fabric::{Fabric, InProcess, Joined};
use super::kernels::PEER_MAX_RANKS;
use crate::device;
use crate::element::{DType, Element, ReduceOp};
use crate::error::{Error, Result};
pub use crate::exec::config::Transport;
use crate::exec::profile::{self, HostPhase};
use crate::exec::rendezvous::{Rendezvous, UniqueId};
use crate::exec::{caller_address, Algorithm, PlanCache, Shape};
use crate::plan::{BufKind, Collective, EdgeTransport, Gather, Op, Plan, StreamKind};
use crossbeam_channel::Sender;
use cudarc::driver::CudaStream;
use edges::{apply_probes, edges_from_records, probe_own, probe_target, reach_peers};
use enqueue::{gpu_rank_thread, wait_done};
use layout::{oneshot_layout, steps_layout, twoshot_segments, StepLayout};
use peer::{allocate_peer_words, connect_peer_words, peer_kernels_fit, PeerKernel};
use rank::{RankExecutor, RankPlan};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Options of the GPU communicator.
#[derive(Clone, Debug, PartialEq)]
pub struct CudaConfig {
    /// How the ring's edges move data ([`Transport`], shared with [`crate::HostConfig`]).
    pub transport: Transport,
    /// Staging slots per receiver.
    pub slots: usize,
    /// Chunk size in bytes; `None` grows it with the message (see [`auto_chunk_bytes`]).
    pub chunk_bytes: Option<usize>,
    /// How long a collective may take before it fails with [`Error::Timeout`].
    pub timeout: Duration,
    /// Let several ranks share one GPU (each rank still has its own streams, staging and thread).
    /// For testing the whole GPU path on a one-GPU machine; off by default, where a repeated
    /// device is [`Error::DuplicateDevice`].
    pub allow_shared_device: bool,
    /// Time one copy over each edge at creation and flag edges far below their link
    /// ([`EdgeInfo::slow`], module [`probe`](super::probe)). On by default; costs milliseconds.
    pub probe_edges: bool,
    /// Ring, one-shot, two-shot, or chosen by message size (`Auto`: [`Algorithm::choose`], and
    /// [`Algorithm::choose_staged`] where the GPUs do not all reach each other). The one- and
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
        }
    }
}

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
    /// one-shot or the LL one-shot, [`peer::PeerWords::oneshot_kernel`]).
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
}

/// A prepared shape, as the process sees it: the checked plan, how it runs, and every rank's
/// resources of it (in this process, every rank is local).
struct Prepared {
    plan: Arc<Plan>,
    dispatch: Arc<Dispatch>,
    /// Names the plan in a counter wait's error code (`counters::wait_code`): a number per plan
    /// prepared by this communicator, modulo 2^15 (every rank numbers alike).
    serial: usize,
    /// By rank.
    ranks: Vec<Arc<RankPlan>>,
    /// Who enqueues a call's ranks, and in what order.
    schedule: Schedule,
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
    /// Where the caller's buffers are staged (`CudaExecutor::copy_callers`): the copies this
    /// process's rank enqueues on its Main stream before its program, (destination, source,
    /// bytes) — the caller's buffers into the memory it exported for them — and after it, back.
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
    /// ([`Algorithm::choose_staged`]: the staged one-shot for small messages, with its barrier
    /// words in host memory).
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
    /// Calls that ran on registered buffers, without copies.
    registered_calls: u64,
}

impl CudaExecutor {
    /// Sets up rank `r` on GPU `devices[r]`; the ring follows the order given. The world and the
    /// options were checked against `exec::config`'s limits by the caller.
    pub(crate) fn new(devices: &[usize], config: CudaConfig) -> Result<CudaExecutor> {
        debug_assert!(!devices.is_empty());
        device::driver_available()?;
        check_devices(devices)?;
        let fabric = InProcess::new(devices.len());
        CudaExecutor::build(Arc::new(fabric), devices, config)
    }

    /// Sets up this process's one rank of a job whose ranks met at `rendezvous`, each in a
    /// process of its own, on its GPU `device`: the same executor over
    /// the [`Joined`] fabric. The caller's buffers are staged through memory this rank exports
    /// (`copy_callers`), since no peer can reach them.
    pub(crate) fn for_rank(
        rendezvous: Rendezvous,
        id: &UniqueId,
        device: usize,
        config: CudaConfig,
    ) -> Result<CudaExecutor> {
        device::driver_available()?;
        check_devices(&[device])?;
        let fabric = Joined::new(rendezvous, id, device)?;
        CudaExecutor::build(Arc::new(fabric), &[device], config)
    }

    /// The executor of the fabric's local ranks, on `devices` (one per local rank, in order).
    fn build(
        fabric: Arc<dyn Fabric>,
        devices: &[usize],
        config: CudaConfig,
    ) -> Result<CudaExecutor> {
        debug_assert!(config.slots >= 1 && config.chunk_bytes != Some(0));
        // Loading kernels, creating streams, enabling peer access and probing edges may wait for
        // the GPUs: none of it overlaps another communicator's peer kernels (`device::gate`).
        let _quiet = device::gate::quiet();
        let world = fabric.world();
        let mut ranks = fabric
            .local_ranks()
            .zip(devices)
            .map(|(rank, &device)| RankExecutor::new(rank, device))
            .collect::<Result<Vec<_>>>()?;
        // Every rank learns every rank's GPU by identity; two ranks on one GPU are refused
        // unless shared GPUs are allowed.
        let records = fabric.all_gather(ranks.iter().map(|r| r.identity.record()).collect())?;
        let identities = records
            .iter()
            .enumerate()
            .map(|(from, r)| Identity::from_record(from, r))
            .collect::<Result<Vec<_>>>()?;
        for (second, id) in identities.iter().enumerate() {
            match identities[..second].iter().position(|o| o.uuid == id.uuid) {
                Some(first) if !config.allow_shared_device => {
                    return Err(Error::DuplicateDevice {
                        device: identities[second].ordinal,
                        first,
                        second,
                    })
                }
                _ => {}
            }
        }
        let shared_gpu = identities
            .iter()
            .enumerate()
            .any(|(i, id)| identities[..i].iter().any(|o| o.uuid == id.uuid));
        // Every rank decides its own edge from how its context reaches its peers' GPUs (the
        // fabric's reach, asked by identity), and whether it reaches all of them directly; the
        // records tell every rank every edge.
        let all_pairs = peer_kernels_fit(world, config.transport);
        let records = ranks
            .iter()
            .map(|r| reach_peers(&r.res, &*fabric, &identities, config.transport, all_pairs))
            .collect::<Result<Vec<_>>>()?;
        let (mut edges, all_direct) =
            edges_from_records(&fabric.all_gather(records)?, &identities)?;
        let peers_ok = all_pairs && all_direct;
        if config.probe_edges && !edges.is_empty() {
            // Each rank times its own halves of its two edges (a push into a target its
            // receiver exported, or its half of a staged edge); the targets live until every
            // figure is in.
            let links = edges::links(&edges, &identities);
            let mut targets = Vec::with_capacity(ranks.len());
            let mut records = Vec::with_capacity(ranks.len());
            for r in &ranks {
                let (target, record) = probe_target(&r.res, &*fabric, &edges, &identities)?;
                targets.push(target);
                records.push(record);
            }
            let records = fabric.all_gather(records)?;
            let figures = ranks
                .iter()
                .map(|r| probe_own(&r.res, &*fabric, &edges, &identities, &links, &records))
                .collect::<Result<Vec<_>>>()?;
            let figures = fabric.all_gather(figures)?;
            drop(targets);
            apply_probes(&mut edges, &identities, &links, &figures)?;
        }
        // Ranks whose GPUs do not all reach each other run the staged one-shot: its barrier
        // words in pinned host memory, as its host copies are.
        let staged_oneshot = !peers_ok && (2..=PEER_MAX_RANKS).contains(&world);
        if peers_ok || staged_oneshot {
            let mut own = Vec::with_capacity(ranks.len());
            let mut records = Vec::with_capacity(ranks.len());
            for r in &ranks {
                let low_latency = config.low_latency && peers_ok;
                let (words, record) =
                    allocate_peer_words(&r.res, &*fabric, low_latency, staged_oneshot)?;
                own.push(words);
                records.push(record);
            }
            let records = fabric.all_gather(records)?;
            for (r, words) in ranks.iter_mut().zip(own) {
                let connected = connect_peer_words(
                    &r.res,
                    &*fabric,
                    words,
                    &records,
                    &identities,
                    config.timeout,
                )?;
                r.peer = Some(connected);
            }
        }
        // The one-shot has a staged form (host copies); the two-shot reads its peers' GPUs.
        let runs_staged = staged_oneshot && config.algorithm == Algorithm::OneShot;
        if config.algorithm.reads_peers() && !peers_ok && !runs_staged {
            return Err(Error::InvalidArgument(format!(
                "Algorithm::{:?} needs 2 to {PEER_MAX_RANKS} ranks on GPUs that all reach each \
                 other over peer access, and a transport other than Staged (the one-shot runs \
                 staged, through host copies, from 2 to {PEER_MAX_RANKS} ranks)",
                config.algorithm
            )));
        }
        let threads = ranks
            .iter()
            .map(|r| {
                let (res, peer) = (r.res.clone(), r.peer.clone());
                let (tx, rx) = crossbeam_channel::unbounded();
                let handle = std::thread::Builder::new()
                    .name(format!("ringreduce-gpu-{}", res.device))
                    .spawn(move || gpu_rank_thread(res, peer, rx))
                    .map_err(|e| Error::Resource {
                        what: format!("cannot start a rank thread: {e}"),
                    })?;
                Ok((tx, handle))
            })
            .collect::<Result<Vec<_>>>()?;
        // Launcher threads launch the other local ranks' peer kernels beside the caller's.
        let launchers = match peers_ok && config.launch_threads && ranks.len() > 1 {
            true => {
                let parts: Vec<_> = ranks
                    .iter()
                    .map(|r| (r.res.clone(), r.peer.clone()))
                    .collect();
                Some(Box::new(launch::Launchers::start(&parts)?))
            }
            false => None,
        };
        Ok(CudaExecutor {
            fabric,
            world,
            ranks,
            threads,
            edges,
            config,
            cache: PlanCache::new(CACHED_PLANS),
            pool_granted: HashSet::new(),
            prepared_plans: 0,
            peers_ok,
            staged_oneshot,
            shared_gpu,
            pinned: Vec::new(),
            last_peer_kernel: PeerKernel::OneShot,
            launch_blocked: std::sync::Mutex::new(None),
            launchers,
            registrations: registered::Registrations::default(),
            registered_calls: 0,
        })
    }

    /// Whether the caller's buffers of a call of `shape` are staged through memory each rank
    /// exports (copied in before the call, out after): when some ranks live in other processes,
    /// which cannot reach them unless every rank registered its buffers (`shape.registered`).
    fn copy_callers(&self, shape: &Shape) -> bool {
        !self.in_one_process() && !shape.registered
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

    /// Whether the all-reduce takes the staged algorithms (`staged_oneshot`'s doc).
    pub(crate) fn staged_oneshot(&self) -> bool {
        self.staged_oneshot
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

    /// The prepared plan of `shape` (for elements of `dtype`): cached, or built, proven, given
    /// its way of running ([`Dispatch`]) and prepared on every rank now — each rank allocates
    /// its resources, the fabric all-gathers their records, each rank imports its peers'.
    fn prepare(&mut self, shape: Shape, dtype: DType) -> Result<Arc<Prepared>> {
        if let Some(p) = self.prepared(&shape) {
            return Ok(p);
        }
        let n = self.world;
        let bytes = shape.count.saturating_mul(shape.elem_bytes);
        let staged = self.staged_oneshot && shape.collective == Collective::AllReduce;
        let algorithm = match staged {
            true => self
                .config
                .algorithm
                .choose_staged(bytes, n, self.config.deterministic),
            false => self.config.algorithm.choose_for(
                &shape.collective,
                bytes,
                n,
                shape.in_place,
                self.peers_ok,
                self.config.deterministic,
            ),
        };
        // 16-byte boundaries keep every chunk and segment vector-aligned for the kernels and
        // copies.
        let align_elems = (16 / shape.elem_bytes).max(1);
        let chunk_elems = || {
            let chunk_bytes = self.config.chunk_bytes.unwrap_or_else(|| {
                let staged = self
                    .edges
                    .iter()
                    .any(|e| e.transport == EdgeTransport::Staged);
                auto_chunk_bytes(shape.chunking_count(n), n, shape.elem_bytes, staged)
            });
            (chunk_bytes / shape.elem_bytes).max(1)
        };
        let plan = if shape.collective != Collective::AllReduce && algorithm == Algorithm::OneShot {
            shape.checked_oneshot_collective_plan(n)?
        } else if shape.collective != Collective::AllReduce {
            // The ring's form: a copy-engine plan (pushes, pairwise reduces, events).
            shape.checked_collective_plan(
                chunk_elems(),
                self.config.slots,
                align_elems,
                self.edge_transports(),
            )?
        } else if algorithm == Algorithm::OneShot && staged {
            shape.checked_staged_oneshot_plan(n)?
        } else if algorithm == Algorithm::OneShot {
            self.cache.checked_oneshot_plan(&shape, n)?
        } else if algorithm == Algorithm::TwoShot {
            shape.checked_twoshot_plan(n, align_elems, Gather::Pull)?
        } else {
            let (chunk, transports) = (chunk_elems(), self.edge_transports());
            self.cache.checked_ring_plan(
                &shape,
                chunk,
                self.config.slots,
                align_elems,
                transports,
            )?
        };
        if !self.in_one_process() {
            // Peers in other processes: every buffer this plan has a rank touch of another's
            // must be one its owner exports (`rank::owned`) — or, registered, the caller's.
            let registered = shape.registered;
            crate::check::check_exports(&plan, |kind| {
                rank::owned(kind, !registered) || registered && kind.is_callers()
            })?;
        }
        let plan = Arc::new(plan);
        let dispatch = Arc::new(self.dispatch(&plan, algorithm, dtype)?);
        let exposed_bytes = plan
            .buffers
            .iter()
            .filter(|decl| decl.kind == BufKind::Exposed)
            .map(|decl| decl.len * shape.elem_bytes)
            .max();
        if let Some(bytes) = exposed_bytes {
            for r in &mut self.ranks {
                r.reserve_exposure(&*self.fabric, bytes)?;
            }
        }
        if self
            .ranks
            .iter()
            .any(|r| r.oldest_owns_gpu_resources(CACHED_PLANS))
        {
            // The oldest plan's events and buffers may still be in use by enqueued work. (A
            // plan without any — the one-shot all-reduce, whose in-place exposed copies live in
            // the exposure regions — is dropped without waiting.)
            self.drain()?;
        }
        let mut allocated = Vec::with_capacity(n);
        let mut records = Vec::with_capacity(n);
        for r in &self.ranks {
            let (part, record) = r.allocate(
                &*self.fabric,
                &plan,
                &dispatch,
                shape.elem_bytes,
                self.peers_ok,
                self.copy_callers(&shape),
            )?;
            allocated.push(part);
            records.push(record);
        }
        let records = self.fabric.all_gather(records)?;
        let mut ranks = Vec::with_capacity(n);
        for (r, part) in self.ranks.iter_mut().zip(allocated) {
            ranks.push(r.connect(&self.fabric, shape.clone(), part, &records, CACHED_PLANS)?);
        }
        let crosses = ranks.iter().any(|r| r.counters.is_some());
        let schedule = match *dispatch {
            // This process's one rank: enqueued from the caller's thread.
            _ if self.ranks.len() == 1 => Schedule::RankByRank,
            Dispatch::CopyEngines if crosses && self.shared_gpu => {
                Schedule::Checked(crate::check::enqueue_order(&plan)?)
            }
            Dispatch::CopyEngines if crosses => Schedule::RankThreads,
            _ => Schedule::RankByRank,
        };
        self.prepared_plans += 1;
        let prepared = Arc::new(Prepared {
            plan,
            dispatch,
            serial: self.prepared_plans % 0x8000,
            ranks,
            schedule,
        });
        self.cache.insert(shape, prepared.clone());
        Ok(prepared)
    }

    /// How `plan` (of `algorithm`, for elements of `dtype`) runs here: the kernel layouts
    /// verified against the plan, or the copy engines.
    fn dispatch(&self, plan: &Plan, algorithm: Algorithm, dtype: DType) -> Result<Dispatch> {
        let meets = plan
            .ranks
            .iter()
            .flatten()
            .any(|i| matches!(i.op, Op::PeerReduce { .. }));
        if !meets {
            return Ok(Dispatch::CopyEngines);
        }
        let Some(peer) = self.ranks.first().and_then(|r| r.peer.as_ref()) else {
            return Err(Error::Internal {
                what: "a plan with peer reduces on a communicator without peer kernels".into(),
            });
        };
        let unexpected = || Error::Internal {
            what: format!("a {algorithm:?} plan with peer reduces but no meetings"),
        };
        Ok(match algorithm {
            Algorithm::TwoShot => Dispatch::TwoShot {
                segments: twoshot_segments(plan)?.ok_or_else(unexpected)?,
            },
            _ if plan.collective != Collective::AllReduce => Dispatch::Steps {
                steps: steps_layout(plan)?.ok_or_else(unexpected)?,
            },
            _ => {
                oneshot_layout(plan)?;
                let staged = plan.buffers.iter().any(|d| d.kind == BufKind::HostExposed);
                Dispatch::OneShot {
                    kernel: match staged {
                        true => PeerKernel::OneShotStaged,
                        false => peer.oneshot_kernel(dtype, plan.count),
                    },
                }
            }
        })
    }

    /// The plan prepared for `shape` earlier, if any: cached, or pinned by a capture.
    fn prepared(&self, shape: &Shape) -> Option<Arc<Prepared>> {
        self.cache.get(shape).or_else(|| {
            self.pinned
                .iter()
                .find(|(s, _)| s == shape)
                .map(|(_, p)| p.clone())
        })
    }

    /// Each ring edge's transport, by sending rank. One rank has no edge (`decide_edges` makes
    /// none); its plan still names one, which it never uses.
    fn edge_transports(&self) -> Vec<EdgeTransport> {
        if self.world == 1 {
            return vec![EdgeTransport::Peer];
        }
        self.edges.iter().map(|e| e.transport).collect()
    }

    /// Runs one call of any collective's plan on the Main streams; `inputs` and `outputs` are
    /// the caller's buffers' addresses as [`crate::exec::caller_address`] lays them out
    /// (`inputs` empty in place); `captured` when the call is being captured into CUDA graphs
    /// (module `capture`).
    ///
    /// # Safety
    /// Every caller's buffer the plan of `shape` declares is a device address on its rank's GPU,
    /// valid for the declared length; written buffers overlap nothing else in the call; nothing
    /// else touches them (or writes the ones read) until the call is complete — when this returns
    /// if `wait_complete`, else once each rank's Main stream has passed the call.
    pub(crate) unsafe fn run_shape_on_main<T: Element>(
        &mut self,
        shape: Shape,
        inputs: &[u64],
        outputs: &[u64],
        op: ReduceOp,
        wait_complete: bool,
        captured: bool,
    ) -> Result<()> {
        let copy_callers = self.copy_callers(&shape);
        let prepared = self.prepare(shape, T::DTYPE)?;
        profile::mark(HostPhase::Plan);
        let peer_kernel = prepared.dispatch.peer_kernel();
        if let Some(kernel) = peer_kernel {
            self.last_peer_kernel = kernel;
        }
        if let (Some(kernel), true) = (peer_kernel, self.in_one_process()) {
            let inputs = (!prepared.plan.in_place).then_some(inputs);
            self.open_peer_call(kernel, inputs, outputs)?;
        } else {
            // Codes left by an earlier call's kernels are that call's failure, reported before
            // this one runs.
            self.check_error_words()?;
        }
        // The caller's buffers, as the plan's buffers: in one process every rank's are at hand,
        // in one address space; staged (`copy_callers`), this rank's are copied into the memory
        // it exported for them, and back.
        let callers = prepared
            .plan
            .buffers
            .iter()
            .map(|decl| caller_address(decl, inputs, outputs).unwrap_or(0))
            .collect::<Vec<u64>>();
        let (mut copies_in, mut copies_out) = (Vec::new(), Vec::new());
        if copy_callers {
            let (rank, own) = (self.ranks[0].rank(), &prepared.ranks[0]);
            for (buf, decl) in prepared.plan.buffers.iter().enumerate() {
                if decl.rank != rank || !decl.kind.is_callers() || callers[buf] == 0 {
                    continue;
                }
                let (staged, caller) = (own.addrs[buf], callers[buf]);
                let bytes = decl.len * T::DTYPE.size_bytes();
                copies_in.push((staged, caller, bytes));
                if !decl.kind.is_read_only() {
                    copies_out.push((caller, staged, bytes));
                }
            }
        } else if prepared.plan.collective != Collective::AllReduce && self.in_one_process() {
            // The all-reduce's caller grants its pools (`prepare_buffers`) before the call.
            // (Registered buffers across processes are never pool memory: nothing to grant.)
            self.grant_pushers(&prepared.plan, &callers)?;
        }
        // A call whose ranks do not cross through counters is enqueued from this thread (module
        // `launch`); its peer kernels are launched under the gate (module `device::gate`): no
        // blocking CUDA call of this crate runs between the ranks' launches. Taken before the
        // call's deadline starts, and waited for at most the timeout (another thread's blocking
        // call waits for a stuck kernel at most that long): past it, nothing is launched and
        // the call fails by name.
        let launching = match prepared.schedule {
            Schedule::RankByRank | Schedule::Checked(_) => {
                Some(device::gate::launching(self.config.timeout).ok_or_else(|| {
                    Error::Timeout {
                        rank: 0,
                        waiting_on: "another thread's blocking call of ringreduce (an allocation, \
                                 copy or free of a GpuBuffer) to finish, before launching"
                            .into(),
                        after: self.config.timeout,
                    }
                })?)
            }
            Schedule::RankThreads => None,
        };
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let call = Arc::new(CudaCall {
            fabric: self.fabric.clone(),
            plans: prepared.ranks.clone(),
            first: self.ranks[0].rank(),
            callers,
            copies_in,
            copies_out,
            serial: prepared.serial,
            dtype: T::DTYPE,
            op,
            wait_complete,
            deadline: Instant::now() + self.config.timeout,
            timeout: self.config.timeout,
            abort: AtomicBool::new(false),
            done: done_tx,
            peer_call: peer_kernel.is_some(),
            captured,
        });
        profile::mark(HostPhase::Open);
        if let Some(launching) = launching {
            // The caller's thread enqueues every rank itself — a channel round trip per rank
            // thread saved, ~10 µs of a ~20 µs small call.
            let order = match &prepared.schedule {
                Schedule::Checked(order) => Some(&order[..]),
                _ => None,
            };
            self.run_inline(&call, launching, order)?;
            if wait_complete {
                self.check_error_words()?;
                profile::mark(HostPhase::Check);
            }
            return Ok(());
        }
        for (tx, _) in &self.threads {
            tx.send(call.clone()).map_err(|_| Error::Closed)?;
        }
        let mut first_error: Option<Error> = None;
        let mut pending: Vec<usize> = (0..self.ranks.len()).collect();
        let backstop = call.deadline + Duration::from_millis(250);
        while !pending.is_empty() {
            match done_rx.recv_deadline(backstop) {
                Ok((rank, result)) => {
                    pending.retain(|&r| r != rank);
                    if let Err(err) = result {
                        call.abort.store(true, Ordering::Release);
                        first_error.get_or_insert(err);
                    }
                }
                Err(_) => {
                    call.abort.store(true, Ordering::Release);
                    self.settle_streams(call.deadline);
                    if let Some(lost) = self.fabric.lost_peer() {
                        first_error.get_or_insert(lost);
                    }
                    return Err(
                        first_error.unwrap_or(Error::Timeout {
                            rank: pending[0],
                            waiting_on:
                                "did not finish its part of the collective (its GPU may be hung)"
                                    .into(),
                            after: self.config.timeout,
                        }),
                    );
                }
            }
        }
        profile::mark(HostPhase::Launch);
        if let Some(err) = first_error {
            // The ranks that enqueued their part wait at counters that will never be signalled,
            // until their kernels give up: wait for that (bounded by the deadline), so that
            // nothing on a GPU touches the caller's buffers after this call has returned.
            self.settle_streams(call.deadline);
            return Err(err);
        }
        if wait_complete {
            // The caller's thread polls completion itself: the rank threads reported as soon as
            // they had enqueued (while the GPUs work), so no thread wake-up sits between the
            // GPUs finishing and this call returning.
            let saved = device::save_current()?;
            let waited = self.ranks.iter().try_for_each(|r| wait_done(&r.res, &call));
            waited.and(saved.restore())?;
            profile::mark(HostPhase::Wait);
            self.check_error_words()?;
            profile::mark(HostPhase::Check);
        }
        Ok(())
    }
}

/// Every ordinal names a device of this process.
fn check_devices(devices: &[usize]) -> Result<()> {
    let count = device::device_count()?;
    match devices.iter().find(|&&d| d >= count) {
        Some(&bad) => Err(Error::InvalidArgument(format!(
            "device {bad} does not exist ({count} visible)"
        ))),
        None => Ok(()),
    }
}
