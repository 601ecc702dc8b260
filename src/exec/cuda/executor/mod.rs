//! The GPU executor: the same plans as the host executor, enqueued on CUDA streams — the
//! copy-engine plans (the ring and every collective's ring form) by one host thread per rank,
//! the peer kernels' plans (one-shot, two-shot, steps and LL one-shot) by the caller's thread.
//!
//! At creation the communicator binds each rank to a GPU, decides how each ring edge moves data
//! ([`Transport`]: peer copies where `cuDeviceCanAccessPeer` allows and peer access could be
//! enabled, pinned-host staging elsewhere, or forced either way), and creates for every rank its
//! context, four non-blocking streams (Main, Send, Recv, Reduce), its kernels and its error
//! word. Per message shape it then builds a plan, checks it, decides once how it runs
//! ([`Dispatch`]) and creates what that needs — events, staging buffers, event counters — once
//! (the in-place one-shot's exposed copies excepted: they live in one region per rank, module
//! `exposure`); later calls of the same shape reuse them (`CudaPlan`). Inside a collective
//! nothing is allocated and no event is created; the host does not synchronise until the
//! optional final wait for completion.
//!
//! Between ranks there is one kind of wait, eager or captured: an event counter (module
//! `capture`), never another rank's CUDA event, so no rank's enqueue waits for another's.
//!
//! Where each part lives:
//! - this module: [`CudaConfig`], creation of a `CudaExecutor`, the plan cache, [`Dispatch`],
//!   and `run_shape_on_main`, which hands a call to the rank threads or enqueues it inline;
//! - `edges`: how each ring edge moves data ([`EdgeInfo`]), its probe, and the chunk size rule;
//! - `enqueue`: the enqueue of a plan's operations on a rank's streams, for every path (copies,
//!   reduce and scale kernels, events, counter signals and waits, peer kernel launches), the
//!   rank threads, the wait for completion and the diagnosis of a stalled call;
//! - `peer`: the peer kernels' shared flags and LL receive buffers, their launch, and what the
//!   kernels' error words report;
//! - `exposure`: the one region per rank that every in-place one-shot plan's exposed buffer
//!   lives in, so that a new message size allocates nothing;
//! - `layout`: the checks that tie a one-shot, two-shot or steps plan to its kernel;
//! - `launch`: the inline enqueue of a call from the caller's thread or the launcher threads,
//!   and the one function that enqueues one rank's program, whoever calls it;
//! - `callers`: the entry point of every call, which fences the caller's streams around Main;
//! - `capture`: the event counters between ranks, and collectives captured into CUDA graphs
//!   (what is refused, the pinned plans);
//! - `teardown`: waiting for idle streams, `synchronize`, `close`, `Drop`, and the deliberate
//!   leak of what a stuck GPU may still touch.
//!
//! Invariant: a failed enqueue never leaves a GPU waiting forever (every wait between ranks and
//! every peer kernel gives up within three quarters of the timeout, leaving a code in its
//! rank's error word), and teardown never hangs on a stuck GPU (see `enqueue`, `peer`, `launch`
//! and `teardown` for how each path keeps it).

mod callers;
mod capture;
mod edges;
mod enqueue;
mod exposure;
mod launch;
mod layout;
mod peer;
mod teardown;

pub use edges::{auto_chunk_bytes, EdgeInfo};

use super::kernels::{KernelModule, PEER_MAX_RANKS};
use crate::device::{self, DeviceBuffer, Event, PinnedHost, Stream};
use crate::element::{DType, Element, ReduceOp};
use crate::error::{Error, Result};
pub use crate::exec::config::Transport;
use crate::exec::profile::{self, HostPhase};
use crate::exec::{caller_address, Algorithm, PlanCache, Shape};
use crate::plan::{BufKind, Collective, EdgeTransport, Op, Plan, StreamKind};
use crossbeam_channel::Sender;
use cudarc::driver::{CudaContext, CudaStream};
use edges::{decide_edges, probe_edges};
use enqueue::{gpu_rank_thread, wait_done};
use layout::{oneshot_layout, steps_layout, twoshot_segments, StepLayout};
use peer::{setup_peer_kernels, PeerKernel, PeerKernelState};
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
    /// Ring, one-shot, or chosen by message size ([`Algorithm::choose`]). The one-shot needs
    /// peer access between every pair of GPUs and at most 8 ranks; `Auto` falls back to the ring
    /// where it cannot run, `OneShot` is then an error at creation.
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
    /// [`LL_MAX_BYTES`](crate::exec::cuda::kernels::LL_MAX_BYTES) (64 KiB) per rank with the LL
    /// kernel (`cuda/ll.cuh`): each rank pushes its input into its peers' receive buffers as
    /// words that carry their own flag, and waits only on its own — one NVLink crossing per call
    /// where the read one-shot waits for three (start barrier, reads, end barrier), and no copy
    /// of the buffer in place. Same plan, same fold, same bits; costs a receive buffer of
    /// [`ll_recv_bytes`](crate::exec::cuda::kernels::ll_recv_bytes)`(world)` (512 KiB for two
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

/// A rank's GPU resources, made once per communicator.
struct RankRes {
    device: usize,
    ctx: Arc<CudaContext>,
    /// Indexed by `StreamKind::index()`.
    streams: Vec<Stream>,
    kernels: KernelModule,
    /// Recorded on Main after each call that waits for its completion, polled to learn that the
    /// rank is done (`enqueue::record_done`).
    done: Event,
    /// A call on a caller's stream: recorded there before the call, waited for by Main.
    fence_in: Event,
    /// A call on a caller's stream: recorded on Main after the call, waited for there.
    fence_out: Event,
    /// The word this rank's kernels leave a code in when they give up (a peer kernel's barrier,
    /// a counter wait): pinned host memory, mapped for the device, zeroed at creation, read by
    /// the host after calls (`CudaExecutor::check_error_words`).
    error: PinnedHost,
    /// A cudarc stream of `ctx`, never used: it puts this context handle in cudarc's multi-stream
    /// mode, the only mode in which cudarc records a slice's read and write events on a stream —
    /// so a cudarc slice's use by a collective is recorded on Main (`cudarc_buffers`).
    _tracking: Arc<CudaStream>,
}

impl RankRes {
    /// The code this rank's kernels left in its error word (0: none). Read through the host
    /// mapping; the kernels write it with a plain system-scope store.
    fn error_code(&self) -> u32 {
        // SAFETY: the pinned allocation is at least 4 bytes and page-aligned, and lives as long
        // as `self`; a volatile read, since the GPU may write the word at any time.
        unsafe { std::ptr::read_volatile(self.error.as_ptr().cast::<u32>()) }
    }

    /// The error word as a device address (its host mapping).
    fn error_word(&self) -> u64 {
        self.error.uva_ptr()
    }
}

/// Staging memory of a plan: its own, or its rank's exposure region (module `exposure`).
enum Staging {
    Device(DeviceBuffer),
    Host(PinnedHost),
    /// The address of the rank's exposure region, which the executor owns.
    Exposure(u64),
}

/// How a prepared call runs: decided once, when its plan is prepared, with what that way needs.
/// Nothing later probes the plan to find out.
enum Dispatch {
    /// Copies and reduce kernels on each rank's four streams, ordered by events on a rank's own
    /// streams and by event counters between ranks (`counters`, `None` when no event crosses
    /// ranks): the ring's all-reduce, every other collective's ring form, and any plan without
    /// peer reduces. Enqueued by the rank threads when counters cross ranks (long programs,
    /// one thread per rank), else from the caller's thread.
    CopyEngines {
        counters: Option<capture::EventCounters>,
    },
    /// The one-shot all-reduce: each rank's one peer reduce is one kernel, `kernel` (the read
    /// one-shot or the LL one-shot, [`PeerKernelState::oneshot_kernel`]).
    OneShot { kernel: PeerKernel },
    /// The two-shot all-reduce: each rank's whole program is one fused kernel, which needs each
    /// rank's segment (offset, count) (`twoshot_segments`).
    TwoShot { segments: Vec<(usize, usize)> },
    /// The one-shot form of a collective other than the all-reduce: each rank's steps run in one
    /// kernel between one start and one end barrier (`steps_layout`).
    Steps { steps: Vec<Vec<StepLayout>> },
}

impl Dispatch {
    /// The peer kernel this way launches, if any: names it in errors, and says which caller's
    /// buffers the peers read.
    fn peer_kernel(&self) -> Option<PeerKernel> {
        match self {
            Dispatch::CopyEngines { .. } => None,
            Dispatch::OneShot { kernel } => Some(*kernel),
            Dispatch::TwoShot { .. } => Some(PeerKernel::TwoShot),
            Dispatch::Steps { .. } => Some(PeerKernel::Steps),
        }
    }

    /// Whether the caller's thread enqueues every rank (nothing crosses ranks through counters,
    /// or the kernels meet on the GPUs) rather than the rank threads.
    fn inline(&self) -> bool {
        !matches!(self, Dispatch::CopyEngines { counters: Some(_) })
    }

    fn counters(&self) -> Option<&capture::EventCounters> {
        match self {
            Dispatch::CopyEngines { counters } => counters.as_ref(),
            _ => None,
        }
    }
}

/// A checked plan with the way it runs, its events and its staging buffers.
struct CudaPlan {
    plan: Plan,
    /// Names the plan in a counter wait's error code (`capture::wait_code`): a number per plan
    /// prepared by this executor, modulo 2^15.
    serial: usize,
    dispatch: Dispatch,
    /// Every event of the plan, made in its recording rank's context. Waited for only on that
    /// rank's streams: a wait of another rank is a counter wait (`Dispatch::CopyEngines`).
    events: Vec<Event>,
    staging: Vec<Option<Staging>>,
}

impl CudaPlan {
    /// Whether dropping the plan frees anything the GPUs may still use: events, staging, or
    /// event counters.
    fn owns_gpu_resources(&self) -> bool {
        !self.events.is_empty()
            || self
                .staging
                .iter()
                .any(|s| matches!(s, Some(Staging::Device(_) | Staging::Host(_))))
            || self.dispatch.counters().is_some()
    }
}

/// Plans kept per communicator; older ones are dropped beyond this (after a device sync).
const CACHED_PLANS: usize = 8;

/// What the threads of one call share.
struct CudaCall {
    prepared: Arc<CudaPlan>,
    /// Base address of every plan buffer.
    addrs: Vec<u64>,
    dtype: DType,
    op: ReduceOp,
    wait_complete: bool,
    deadline: Instant,
    timeout: Duration,
    abort: AtomicBool,
    done: Sender<(usize, Result<()>)>,
    /// The peer kernels' flags and error words (peer calls, and captured rings, whose counter
    /// waits report their timeouts there).
    peer: Option<Arc<PeerKernelState>>,
    /// Captured into a CUDA graph: the plan's pin in `CudaExecutor::pinned`. Cross-GPU waits are
    /// counter kernels then, and nothing is recorded for the host to poll.
    captured: Option<usize>,
}

/// The GPU executor of one communicator.
pub(crate) struct CudaExecutor {
    ranks: Vec<Arc<RankRes>>,
    threads: Vec<(Sender<Arc<CudaCall>>, JoinHandle<()>)>,
    edges: Vec<EdgeInfo>,
    config: CudaConfig,
    cache: PlanCache<CudaPlan>,
    pool_granted: HashSet<(u64, usize)>,
    /// Plans prepared so far (numbers each plan: `CudaPlan::serial`).
    prepared_plans: usize,
    /// Present when the peer kernels (one-shot, two-shot, steps, LL one-shot) can run here:
    /// every pair of GPUs reaches the other.
    peer: Option<Arc<PeerKernelState>>,
    /// Every plan ever captured into a CUDA graph, kept for the communicator's life: a graph
    /// holds its staging and counters. A pin is an index here.
    pinned: Vec<(Shape, Arc<CudaPlan>)>,
    /// The peer kernel of the latest peer call, which names the kernel in a barrier timeout.
    last_peer_kernel: PeerKernel,
    /// Every rank's context, by rank (for enqueuing from the caller's thread).
    contexts: Vec<Arc<CudaContext>>,
    /// The latest peer call whose launches were held up between ranks: the rank whose launch
    /// came late and by how much (`LaunchBlocked` names it when that call then fails).
    launch_blocked: std::sync::Mutex<Option<(usize, Duration)>>,
    /// The launcher threads of ranks 1, 2, … (peer calls launched on every GPU at once), when the
    /// peer kernels can run and `launch_threads` is on.
    launchers: Option<Box<launch::Launchers>>,
    /// Every rank's exposure region, shared by the in-place one-shot plans (module `exposure`).
    exposure: exposure::Exposure,
}

impl CudaExecutor {
    /// Sets up rank `r` on GPU `devices[r]`; the ring follows the order given. The world and the
    /// options were checked against `exec::config`'s limits by the caller.
    pub(crate) fn new(devices: &[usize], config: CudaConfig) -> Result<CudaExecutor> {
        debug_assert!(!devices.is_empty() && config.slots >= 1 && config.chunk_bytes != Some(0));
        device::driver_available()?;
        // Loading kernels, creating streams, enabling peer access and probing edges may wait for
        // the GPUs: none of it overlaps another communicator's peer kernels (`device::gate`).
        let _quiet = device::gate::quiet();
        for (second, d) in devices.iter().enumerate() {
            match devices[..second].iter().position(|x| x == d) {
                Some(first) if !config.allow_shared_device => {
                    return Err(Error::DuplicateDevice {
                        device: *d,
                        first,
                        second,
                    })
                }
                _ => {}
            }
        }
        let count = device::device_count()?;
        if let Some(&bad) = devices.iter().find(|&&d| d >= count) {
            return Err(Error::InvalidArgument(format!(
                "device {bad} does not exist ({count} visible)"
            )));
        }
        let ranks = devices
            .iter()
            .map(|&d| {
                let ctx = device::context(d)?;
                let streams = StreamKind::ALL
                    .iter()
                    .map(|_| Stream::new(&ctx))
                    .collect::<Result<Vec<_>>>()?;
                let kernels = KernelModule::new(&ctx)?;
                let done = Event::new(&ctx)?;
                let (fence_in, fence_out) = (Event::new(&ctx)?, Event::new(&ctx)?);
                let mut error = PinnedHost::new(&ctx, 4)?;
                error.as_mut_slice().fill(0);
                // The first cudarc stream of a context handle synchronizes the context once.
                let tracking = ctx.new_stream().map_err(device::check("cuStreamCreate"))?;
                Ok(Arc::new(RankRes {
                    device: d,
                    ctx,
                    streams,
                    kernels,
                    done,
                    fence_in,
                    fence_out,
                    error,
                    _tracking: tracking,
                }))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut edges = decide_edges(&ranks, config.transport)?;
        if config.probe_edges && !edges.is_empty() {
            probe_edges(&ranks, &mut edges)?;
        }
        // Also for a forced ring: a captured ring reports its counter waits' timeouts in the error words.
        let peer =
            setup_peer_kernels(&ranks, config.transport, config.timeout, config.low_latency)?;
        if config.algorithm.reads_peers() && peer.is_none() {
            return Err(Error::InvalidArgument(format!(
                "Algorithm::{:?} needs 2 to {PEER_MAX_RANKS} ranks on GPUs that all reach each \
                 other over peer access, and a transport other than Staged",
                config.algorithm
            )));
        }
        let threads = ranks
            .iter()
            .enumerate()
            .map(|(rank, res)| {
                let res = res.clone();
                let contexts = ranks.iter().map(|r| r.ctx.clone()).collect();
                let (tx, rx) = crossbeam_channel::unbounded();
                let handle = std::thread::Builder::new()
                    .name(format!("ringreduce-gpu-{}", res.device))
                    .spawn(move || gpu_rank_thread(rank, res, contexts, rx))
                    .map_err(|e| Error::Resource {
                        what: format!("cannot start a rank thread: {e}"),
                    })?;
                Ok((tx, handle))
            })
            .collect::<Result<Vec<_>>>()?;
        let contexts = ranks.iter().map(|r| r.ctx.clone()).collect();
        let launchers = match &peer {
            Some(_) if config.launch_threads => Some(Box::new(launch::Launchers::start(&ranks)?)),
            _ => None,
        };
        Ok(CudaExecutor {
            ranks,
            threads,
            edges,
            config,
            cache: PlanCache::new(CACHED_PLANS),
            pool_granted: HashSet::new(),
            prepared_plans: 0,
            peer,
            pinned: Vec::new(),
            last_peer_kernel: PeerKernel::OneShot,
            contexts,
            launch_blocked: std::sync::Mutex::new(None),
            launchers,
            exposure: exposure::Exposure::new(),
        })
    }

    pub(crate) fn devices(&self) -> Vec<usize> {
        self.ranks.iter().map(|r| r.device).collect()
    }

    /// Each rank's Main stream, as cudarc sees it (for buffers that track their uses).
    pub(crate) fn main_streams(&self) -> Vec<&CudaStream> {
        self.ranks
            .iter()
            .map(|r| r.streams[StreamKind::Main.index()].cudarc())
            .collect()
    }

    /// Whether the peer kernels can run here (every pair of GPUs reaches the other).
    pub(crate) fn peers_ok(&self) -> bool {
        self.peer.is_some()
    }

    pub(crate) fn edges(&self) -> &[EdgeInfo] {
        &self.edges
    }

    /// The raw handle of rank `rank`'s Main stream, on which each collective starts and ends.
    pub(crate) fn main_stream(&self, rank: usize) -> Option<cudarc::driver::sys::CUstream> {
        self.ranks
            .get(rank)
            .map(|r| r.streams[StreamKind::Main.index()].raw())
    }

    /// The pool trap, handled: an output from a stream-ordered pool gets its pool opened to the
    /// GPU that pushes into it (once per buffer address). Without this the push would silently
    /// run through the host at a tenth of the link's speed. Staged edges touch only our own
    /// staging memory, and inputs are only read locally.
    pub(crate) fn prepare_buffers(&mut self, outputs: &[u64]) -> Result<()> {
        let n = self.ranks.len();
        for (rank, &addr) in outputs.iter().enumerate() {
            let sender = (rank + n - 1) % n;
            if n == 1 || addr == 0 || self.edges[sender].transport != EdgeTransport::Peer {
                continue;
            }
            self.grant_once(addr, self.ranks[sender].device)?;
        }
        Ok(())
    }

    /// [`CudaExecutor::prepare_buffers`] for any collective's plan: every caller's buffer that
    /// another rank's copy engine writes into (a peer push) gets its pool opened to that rank's
    /// GPU, once per buffer address. `addrs` are the plan's buffer addresses for this call.
    fn grant_pushers(&mut self, plan: &Plan, addrs: &[u64]) -> Result<()> {
        for (rank, program) in plan.ranks.iter().enumerate() {
            for instr in program {
                let Op::Copy { dst, .. } = instr.op else {
                    continue;
                };
                let decl = plan.decl(dst.buf);
                if decl.rank != rank && decl.kind.is_callers() && addrs[dst.buf.0] != 0 {
                    self.grant_once(addrs[dst.buf.0], self.ranks[rank].device)?;
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

    /// The prepared plan of `shape` (for elements of `dtype`): cached, or built, proven and given
    /// its resources and its way of running ([`Dispatch`]) now.
    fn prepare(&mut self, shape: Shape, dtype: DType) -> Result<Arc<CudaPlan>> {
        if let Some(p) = self.prepared(&shape) {
            return Ok(p);
        }
        let n = self.ranks.len();
        let bytes = shape.count.saturating_mul(shape.elem_bytes);
        let algorithm = self.config.algorithm.choose_for(
            &shape.collective,
            bytes,
            n,
            shape.in_place,
            self.peer.is_some(),
            self.config.deterministic,
        );
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
        } else if algorithm == Algorithm::OneShot {
            self.cache.checked_oneshot_plan(&shape, n)?
        } else if algorithm == Algorithm::TwoShot {
            shape.checked_twoshot_plan(n, align_elems)?
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
        let events = plan
            .events
            .iter()
            .map(|decl| Event::new(&self.ranks[decl.rank].ctx))
            .collect::<Result<Vec<_>>>()?;
        let exposed_bytes = plan
            .buffers
            .iter()
            .filter(|decl| decl.kind == BufKind::Exposed)
            .map(|decl| decl.len * shape.elem_bytes)
            .max();
        if let Some(bytes) = exposed_bytes {
            self.exposure.reserve(&self.ranks, bytes)?;
        }
        let staging = plan
            .buffers
            .iter()
            .map(|decl| {
                let bytes = decl.len * shape.elem_bytes;
                let ctx = &self.ranks[decl.rank].ctx;
                match decl.kind {
                    BufKind::Input
                    | BufKind::Output
                    | BufKind::SendBuf(_)
                    | BufKind::RecvBuf(_) => Ok(None),
                    BufKind::Exposed => {
                        Ok(Some(Staging::Exposure(self.exposure.address(decl.rank))))
                    }
                    BufKind::Slots | BufKind::Scratch => {
                        DeviceBuffer::new(ctx, bytes.max(1)).map(|b| Some(Staging::Device(b)))
                    }
                    BufKind::HostSlots => {
                        PinnedHost::new(ctx, bytes.max(1)).map(|b| Some(Staging::Host(b)))
                    }
                }
            })
            .collect::<Result<Vec<_>>>()?;
        if self
            .cache
            .oldest()
            .is_some_and(|p| self.cache.is_full() && p.owns_gpu_resources())
        {
            // The oldest plan's events and buffers may still be in use by enqueued work. (A
            // plan without any — the one-shot all-reduce, whose in-place exposed copies live in
            // the exposure regions — is dropped without waiting.)
            self.synchronize()?;
        }
        let dispatch = self.dispatch(&plan, algorithm, dtype)?;
        self.prepared_plans += 1;
        let prepared = Arc::new(CudaPlan {
            serial: self.prepared_plans % 0x8000,
            dispatch,
            plan,
            events,
            staging,
        });
        self.cache.insert(shape, prepared.clone());
        Ok(prepared)
    }

    /// How `plan` (of `algorithm`, for elements of `dtype`) runs here, with what that needs: the
    /// kernel layouts verified against the plan, or the ring's event counters.
    fn dispatch(&self, plan: &Plan, algorithm: Algorithm, dtype: DType) -> Result<Dispatch> {
        let meets = plan
            .ranks
            .iter()
            .flatten()
            .any(|i| matches!(i.op, Op::PeerReduce { .. }));
        let copy_engines = || -> Result<Dispatch> {
            let counters = capture::EventCounters::new(&self.ranks, plan, self.peer.is_some())?;
            Ok(Dispatch::CopyEngines { counters })
        };
        if !meets {
            return copy_engines();
        }
        let Some(peer) = &self.peer else {
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
                Dispatch::OneShot {
                    kernel: peer.oneshot_kernel(dtype, plan.count),
                }
            }
        })
    }

    /// The plan prepared for `shape` earlier, if any: cached, or pinned by a capture.
    fn prepared(&self, shape: &Shape) -> Option<Arc<CudaPlan>> {
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
        if self.ranks.len() == 1 {
            return vec![EdgeTransport::Peer];
        }
        self.edges.iter().map(|e| e.transport).collect()
    }

    /// Runs one call of any collective's plan on the Main streams; `inputs` and `outputs` are
    /// the caller's buffers' addresses as [`crate::exec::caller_address`] lays them out
    /// (`inputs` empty in place); `captured` is the plan's pin when the call is being captured
    /// into CUDA graphs (module `capture`).
    ///
    /// # Safety
    /// Every caller's buffer the plan of `shape` declares is a device address on its rank's GPU,
    /// valid for the declared length; written buffers overlap nothing else in the call; nothing
    /// else touches them (or writes the ones read) until the call is complete — when this returns
    /// if `wait_complete`, else once each rank's Main stream has passed the call.
    pub(super) unsafe fn run_shape_on_main<T: Element>(
        &mut self,
        shape: Shape,
        inputs: &[u64],
        outputs: &[u64],
        op: ReduceOp,
        wait_complete: bool,
        captured: Option<usize>,
    ) -> Result<()> {
        let prepared = self.prepare(shape, T::DTYPE)?;
        profile::mark(HostPhase::Plan);
        let peer_kernel = prepared.dispatch.peer_kernel();
        if let Some(kernel) = peer_kernel {
            let inputs = (!prepared.plan.in_place).then_some(inputs);
            self.open_peer_call(kernel, inputs, outputs)?;
        } else {
            // Codes left by an earlier call's counter waits are that call's failure, reported
            // before this one runs.
            self.check_error_words()?;
        }
        let addrs = prepared
            .plan
            .buffers
            .iter()
            .zip(&prepared.staging)
            .map(
                |(decl, staging)| match (caller_address(decl, inputs, outputs), staging) {
                    (Some(addr), _) => addr,
                    (None, Some(Staging::Device(b))) => b.ptr(),
                    (None, Some(Staging::Host(h))) => h.uva_ptr(),
                    (None, Some(Staging::Exposure(addr))) => *addr,
                    (None, None) => 0,
                },
            )
            .collect::<Vec<u64>>();
        if prepared.plan.collective != Collective::AllReduce {
            // The all-reduce's caller grants its pools (`prepare_buffers`) before the call.
            self.grant_pushers(&prepared.plan, &addrs)?;
        }
        // A call that crosses no counters between ranks is enqueued from this thread (module
        // `launch`); its peer kernels are launched under the gate (module `device::gate`): no
        // blocking CUDA call of this crate runs between the ranks' launches. Taken before the
        // call's deadline starts, and waited for at most the timeout (another thread's blocking
        // call waits for a stuck kernel at most that long): past it, nothing is launched and
        // the call fails by name.
        let launching = match prepared.dispatch.inline() {
            true => Some(device::gate::launching(self.config.timeout).ok_or_else(|| {
                Error::Timeout {
                    rank: 0,
                    waiting_on: "another thread's blocking call of ringreduce (an allocation, \
                                 copy or free of a GpuBuffer) to finish, before launching"
                        .into(),
                    after: self.config.timeout,
                }
            })?),
            false => None,
        };
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let call = Arc::new(CudaCall {
            prepared,
            addrs,
            dtype: T::DTYPE,
            op,
            wait_complete,
            deadline: Instant::now() + self.config.timeout,
            timeout: self.config.timeout,
            abort: AtomicBool::new(false),
            done: done_tx,
            peer: self.peer.clone().filter(|_| peer_kernel.is_some()),
            captured,
        });
        profile::mark(HostPhase::Open);
        if let Some(launching) = launching {
            // The caller's thread enqueues every rank itself — a channel round trip per rank
            // thread saved, ~10 µs of a ~20 µs small call.
            self.run_inline(&call, launching)?;
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
            let waited = self
                .ranks
                .iter()
                .enumerate()
                .try_for_each(|(rank, res)| wait_done(res, rank, &call));
            waited.and(saved.restore())?;
            profile::mark(HostPhase::Wait);
            self.check_error_words()?;
            profile::mark(HostPhase::Check);
        }
        Ok(())
    }
}
