//! The peer kernels on the executor's side: the one-shot and the two-shot all-reduce and the
//! steps kernel of the other collectives' one-shot form, one kernel per rank that reads the
//! other ranks' memory directly (peer access) and meets their kernels at flag barriers, and the
//! LL one-shot, which pushes each rank's input into its peers' receive buffers instead
//! ([`crate::exec::cuda::kernels`] launches them; `cuda/peer.cuh` and `cuda/ll.cuh` describe the
//! protocols). Here: each rank's words the kernels share across ranks ([`PeerWords`], made in
//! two phases around the fabric's all-gather: [`allocate_peer_words`], [`connect_peer_words`]),
//! the launch of each kernel from a plan's peer reduce (whose layout
//! module `layout` verified; module `launch` enqueues a call's ranks), and the timeouts the
//! kernels report.
//!
//! With [`CudaConfig::low_latency`](super::CudaConfig::low_latency) on, a one-shot all-reduce
//! plan's peer reduce runs the LL kernel when the message fits it
//! ([`PeerWords::oneshot_kernel`]), else the read one-shot: the plan is the same (the
//! checker proves its result; both kernels compute it, with the same fold in the same order),
//! only the executor's way of running the meeting differs.
//!
//! A failed call never leaves a kernel reading the caller's buffers after it returns: a kernel
//! whose peers never arrive gives up after three quarters of the call's timeout and leaves a code
//! in its error word, which the call (or the next one, or `synchronize`) turns into
//! [`Error::Timeout`]; a call that fails after launching some ranks waits for their kernels to
//! give up before it returns. A kernel that gives up at its start barrier (or the two-shot's
//! middle one) also withdraws its signal (the LL one-shot: the words it pushed), so that a
//! peer's kernel starting later (queued behind work that was stuck) times out too instead of
//! reading this rank's memory (or, LL, writing its own output) after the call has returned its
//! error. (A peer that passed the barrier in the instant before the withdrawal still reads; it
//! is then inside the call's deadline, a quarter of the timeout before the call returns.)
//!
//! Invariant: every rank of a peer call launches its kernel with the same grid, sources and
//! flags, on its Main stream, so that the barriers meet and each block's epoch (kept on the
//! device, advanced by the kernel) moves in step on every rank.

use super::enqueue::CudaEnqueue;
use super::layout::StepLayout;
use super::rank::{Owned, RankRes};
use super::{CudaCall, CudaExecutor, Transport};
use crate::device::{self, DeviceBuffer, Stream};
use crate::element::DType;
use crate::error::{Error, Result};
use crate::exec::cuda::fabric::Identity;
use crate::exec::cuda::fabric::{Exported, Fabric, Fields, Record};
use crate::exec::cuda::kernels::{
    ll_blocks, ll_fits, ll_recv_bytes, LlArgs, OneShotArgs, PeerStep, StepsArgs, TwoShotArgs,
    COUNTER_ERR_BIT, ERR_PEER_LOST, LL_ERR_WAIT, PEER_ERR_END, PEER_ERR_LAUNCH, PEER_ERR_MIDDLE,
    PEER_ERR_START, PEER_FLAG_BYTES, PEER_MAX_RANKS,
};
use crate::plan::{BufKind, Op, Region, StreamKind};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which peer kernel a call launches; names the kernel in its errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PeerKernel {
    OneShot,
    TwoShot,
    /// The one-shot form of a collective other than the all-reduce.
    Steps,
    /// The LL one-shot: a one-shot all-reduce plan run by pushed words, no barrier
    /// ([`PeerWords::oneshot_kernel`] says when).
    OneShotLl,
    /// The staged one-shot ([`crate::plan::staged`]): the read one-shot kernel over every
    /// rank's host copy, its barrier words in pinned host memory, for ranks whose GPUs do not
    /// reach each other.
    OneShotStaged,
}

impl fmt::Display for PeerKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PeerKernel::OneShot => "one-shot",
            PeerKernel::TwoShot => "two-shot",
            PeerKernel::Steps => "one-shot collective",
            PeerKernel::OneShotLl => "LL one-shot",
            PeerKernel::OneShotStaged => "staged one-shot",
        })
    }
}

/// One rank's peer-kernel words, made once per communicator: the flag words its peers write at
/// the barriers (zeroed; device memory reached through peer access, or pinned host memory where
/// the GPUs do not reach each other) and the LL kernel's receive
/// buffer (with `low_latency` only) — its own, and every rank's as imported through the fabric;
/// a kernel that gives up leaves its code in its rank's error word (`RankRes::error`). Calls of
/// every kernel share the flags and the per-block epochs in them.
pub(super) struct PeerWords {
    /// Kept alive for the peers that write into them; reached through `flags_of[rank]`.
    /// Device memory, or pinned host memory where the GPUs do not reach each other (the
    /// staged one-shot; the kernels' flag accesses are system-scope either way, `cuda/peer.cuh`).
    _flags: Owned,
    _ll_recv: Option<DeviceBuffer>,
    /// Every rank's flag words, as this rank reaches them (its own among them).
    flags_of: Vec<u64>,
    /// With [`CudaConfig::low_latency`](super::CudaConfig::low_latency): every rank's
    /// [`ll_recv_bytes`]`(world)` bytes of receive buffer (layout in `cuda/ll.cuh`), as this rank
    /// reaches them. `None` otherwise, and then the LL kernel never runs.
    ll_recv_of: Option<Vec<u64>>,
    /// The smallest SM count of the ranks' GPUs, divided by the ranks sharing each: the grid cap
    /// that keeps every block of every rank resident.
    max_blocks: u32,
    /// This rank's resources: its Main stream runs its peer kernels (what the gate waits for).
    res: Arc<RankRes>,
    /// The communicator's timeout: a peer kernel gives up within it of its launch.
    timeout: Duration,
    /// When the latest call's kernels were launched (under the gate, `device::gate::launching`).
    last_launch: std::sync::Mutex<Option<Instant>>,
}

impl device::gate::InFlight for PeerWords {
    /// Waits for this rank's latest call to complete on Main, or until the latest launch's
    /// timeout has passed (its kernel has given up by then, or never started).
    fn settle(&self) {
        let launched = *self.last_launch.lock().unwrap_or_else(|p| p.into_inner());
        let Some(launched) = launched else {
            return;
        };
        let deadline = launched + self.timeout;
        let Ok(saved) = device::save_current() else {
            return;
        };
        let main = self.res.stream(StreamKind::Main);
        while Instant::now() < deadline && matches!(device::stream_query(main), Ok(false)) {
            std::thread::sleep(Duration::from_micros(20));
        }
        // (Restoring can only fail if the driver does; the blocking call that follows reports it.)
        let _ = saved.restore();
    }
}

impl PeerWords {
    /// Notes that a call's kernels were launched at `at` (under the gate,
    /// `device::gate::launching`): what `settle` waits from.
    pub(super) fn launched_at(&self, at: Instant) {
        *self.last_launch.lock().unwrap_or_else(|p| p.into_inner()) = Some(at);
    }

    /// The kernel that runs a one-shot all-reduce plan of `count` elements of `dtype`: the LL
    /// one-shot when the communicator has its receive buffers (`low_latency`), the message fits
    /// it ([`ll_fits`]) and its grid fits the grid cap `max_blocks` (every block of every rank
    /// resident at once, also with ranks sharing a GPU; on an H200 it always does), else the
    /// read one-shot. A function of the communicator and (dtype, count) only, so every rank
    /// decides alike: the executor's one rule for it.
    pub(super) fn oneshot_kernel(&self, dtype: DType, count: usize) -> PeerKernel {
        oneshot_kernel_for(self.ll_recv_of.is_some(), self.max_blocks, dtype, count)
    }
}

/// [`PeerWords::oneshot_kernel`]'s rule, for a communicator with (`low_latency`) or without the
/// LL receive buffers and the peer kernels' grid cap `max_blocks`.
fn oneshot_kernel_for(
    low_latency: bool,
    max_blocks: u32,
    dtype: DType,
    count: usize,
) -> PeerKernel {
    // (`ll_fits` first: then the byte count cannot overflow.)
    if low_latency && ll_fits(dtype, count) && ll_blocks(count * dtype.size_bytes()) <= max_blocks {
        PeerKernel::OneShotLl
    } else {
        PeerKernel::OneShot
    }
}

/// Whether the peer kernels can run on `world` ranks with `transport`: 2 to
/// [`PEER_MAX_RANKS`] ranks, not forced through host staging. (Peer access between every pair
/// is the other condition, which the in-process fabric checks and enables:
/// `CudaExecutor::enable_all_peer_access`.)
pub(super) fn peer_kernels_fit(world: usize, transport: Transport) -> bool {
    (2..=PEER_MAX_RANKS).contains(&world) && transport != Transport::Staged
}

/// Phase 1 of one rank's peer words: its flags (in pinned host memory with `host_flags`: the
/// staged one-shot's, for GPUs that do not reach each other) and (with `low_latency`) its LL
/// receive buffer, zeroed, and its record (each one's export handle, length first).
pub(super) fn allocate_peer_words(
    res: &RankRes,
    fabric: &dyn Fabric,
    low_latency: bool,
    host_flags: bool,
) -> Result<((Owned, Option<DeviceBuffer>), Record)> {
    let zeroed = |bytes: usize| -> Result<DeviceBuffer> {
        let mut buffer = fabric.exportable(&res.ctx, bytes)?;
        buffer.fill_zero()?;
        Ok(buffer)
    };
    let flags = match host_flags {
        // Pinned host memory comes zeroed.
        true => Owned::Host(fabric.exportable_host(&res.ctx, PEER_FLAG_BYTES)?),
        false => Owned::Device(zeroed(PEER_FLAG_BYTES)?),
    };
    let ll_recv = match low_latency {
        true => Some(zeroed(ll_recv_bytes(fabric.world()))?),
        false => None,
    };
    let mut record = Vec::new();
    let ll_exported = ll_recv.iter().map(|b| Exported::Device {
        addr: b.ptr(),
        bytes: b.len_bytes(),
    });
    for exported in std::iter::once(flags.exported()).chain(ll_exported) {
        let handle = fabric.export(res.rank, exported)?;
        record.push(handle.len() as u64);
        record.extend(handle);
    }
    Ok(((flags, ll_recv), record))
}

/// Phase 2: imports every rank's flags and receive buffers from `records` (phase 1's, by rank)
/// and registers the words with the gate. `identities` are every rank's GPU identity: ranks
/// that share a GPU (the test-only shared mode) run their kernels side by side on it, and a
/// block spinning for a partner block that has no SM would wait until the timeout — so the grid
/// cap is each GPU's SM count divided by the ranks on it (one block fits per SM), the smallest
/// over the GPUs, which keeps every block of every rank resident at once.
pub(super) fn connect_peer_words(
    res: &Arc<RankRes>,
    fabric: &dyn Fabric,
    own: (Owned, Option<DeviceBuffer>),
    records: &[Record],
    identities: &[Identity],
    timeout: Duration,
) -> Result<Arc<PeerWords>> {
    let (flags, ll_recv) = own;
    let mut flags_of = Vec::with_capacity(records.len());
    let mut ll_recv_of = Vec::with_capacity(records.len());
    for (from, record) in records.iter().enumerate() {
        let mut fields = Fields::new(from, record);
        let mut next = || -> Result<u64> {
            let len = fields.word()? as usize;
            fabric.import(res.rank, from, fields.take(len)?)
        };
        flags_of.push(next()?);
        if ll_recv.is_some() {
            ll_recv_of.push(next()?);
        }
        fields.finish()?;
    }
    let max_blocks = identities
        .iter()
        .map(|id| {
            let sharing = identities.iter().filter(|o| o.uuid == id.uuid).count() as u32;
            id.sm_count / sharing.max(1)
        })
        .min()
        .unwrap_or(1)
        .max(1);
    let words = Arc::new(PeerWords {
        ll_recv_of: ll_recv.is_some().then_some(ll_recv_of),
        _flags: flags,
        _ll_recv: ll_recv,
        flags_of,
        max_blocks,
        res: res.clone(),
        timeout,
        last_launch: std::sync::Mutex::new(None),
    });
    let weak: std::sync::Weak<dyn device::gate::InFlight> = Arc::downgrade(&words) as _;
    device::gate::register(weak);
    Ok(words)
}

impl CudaExecutor {
    /// Opens a call of a peer kernel: reports a barrier timeout an earlier call left, and opens
    /// pool memory to every other GPU — out of place every GPU reads every other GPU's input
    /// (but in the LL one-shot, which reads only its own), the two-shot also every other GPU's
    /// output, and an in-place one-shot collective the caller's one buffer of every GPU.
    pub(super) fn open_peer_call(
        &mut self,
        kernel: PeerKernel,
        inputs: Option<&[u64]>,
        outputs: &[u64],
    ) -> Result<()> {
        self.check_error_words()?;
        // The two-shot gathers from outputs; an in-place one-shot collective reads the caller's
        // one buffer (passed as the outputs).
        // The LL and the staged one-shot read no other rank's input (the one pushes it, the
        // other reads host copies).
        let inputs_read = inputs
            .filter(|_| kernel != PeerKernel::OneShotLl && kernel != PeerKernel::OneShotStaged);
        let outputs_read = (kernel == PeerKernel::TwoShot
            || kernel == PeerKernel::Steps && inputs.is_none())
        .then_some(outputs);
        for ranked in inputs_read.into_iter().chain(outputs_read) {
            // (A rank without such a buffer — a broadcast's non-root input — has address 0.)
            for (rank, &addr) in ranked.iter().enumerate().filter(|(_, &a)| a != 0) {
                let own = self.ranks[rank].res.device;
                let peers: Vec<usize> = self.ranks.iter().map(|r| r.res.device).collect();
                for peer in peers.into_iter().filter(|&p| p != own) {
                    self.grant_once(addr, peer)?;
                }
            }
        }
        Ok(())
    }

    /// The first code any rank's kernel left in its error word (the kernel then returned
    /// early, so that call's output is incomplete): an error naming the rank, the kernel and
    /// where it waited — a peer kernel's barrier, or a counter wait's event. Checked after every
    /// blocking call, before the next call, and by `synchronize`. A peer kernel named is the
    /// latest peer call's (the words are checked before every call, so a code is that call's
    /// unless non-blocking calls overlapped), except for the codes only one kernel writes
    /// ([`kernel_failure`]).
    pub(super) fn check_error_words(&self) -> Result<()> {
        for (local, r) in self.ranks.iter().enumerate() {
            let (rank, code) = (r.rank(), r.res.error_code());
            let device = r.res.device;
            match kernel_failure(code) {
                None => {}
                Some(KernelFailure::CounterWait) => return Err(self.counter_timeout(local, code)),
                Some(KernelFailure::PeerLost) => {
                    return Err(self.fabric.lost_peer().unwrap_or(Error::RankFailed {
                        rank,
                        during: "a collective across processes".into(),
                        message: "a peer was lost; this rank gave the call up".into(),
                    }));
                }
                Some(KernelFailure::GaveUp { kernel, at }) => {
                    let kernel = kernel.unwrap_or(self.last_peer_kernel);
                    let waiting_on = format!(
                        "GPU {device}'s {kernel} kernel gave up {at}: a peer's kernel never arrived"
                    );
                    return Err(self.name_blocked_launch(Error::Timeout {
                        rank,
                        waiting_on,
                        after: self.config.timeout,
                    }));
                }
                Some(KernelFailure::Launch | KernelFailure::Unknown) => {
                    let kernel = self.last_peer_kernel;
                    return Err(Error::RankFailed {
                        rank,
                        during: format!("the {kernel} peer reduce"),
                        message: format!(
                            "GPU {device}'s {kernel} kernel found its launch inconsistent \
                             (code {code})"
                        ),
                    });
                }
            }
        }
        Ok(())
    }
}

/// What a rank's error word reports: one arm per code of
/// [`ERROR_CODES`](crate::exec::cuda::kernels::ERROR_CODES) (a test holds it to that list).
#[derive(Clone, Copy, Debug, PartialEq)]
enum KernelFailure {
    /// A peer kernel gave up waiting, `at` where ("at the start barrier"); `kernel` is the one
    /// kernel that writes the code, `None` where several do (the latest peer call's is meant).
    GaveUp {
        kernel: Option<PeerKernel>,
        at: &'static str,
    },
    /// A peer kernel refused its launch ([`PEER_ERR_LAUNCH`]).
    Launch,
    /// A captured ring's counter wait timed out ([`COUNTER_ERR_BIT`]; the other bits name the
    /// wait: `CudaExecutor::counter_timeout`).
    CounterWait,
    /// The host gave the call up: a peer is lost ([`ERR_PEER_LOST`]).
    PeerLost,
    /// A nonzero code no kernel writes.
    Unknown,
}

/// What error word `code` reports; `None` for 0, no failure.
fn kernel_failure(code: u32) -> Option<KernelFailure> {
    let gave_up = |kernel, at| Some(KernelFailure::GaveUp { kernel, at });
    match code {
        0 => None,
        _ if code & COUNTER_ERR_BIT != 0 => Some(KernelFailure::CounterWait),
        PEER_ERR_START => gave_up(None, "at the start barrier"),
        PEER_ERR_END => gave_up(None, "at the end barrier"),
        PEER_ERR_MIDDLE => gave_up(Some(PeerKernel::TwoShot), "at the middle barrier"),
        LL_ERR_WAIT => gave_up(
            Some(PeerKernel::OneShotLl),
            "waiting for a peer's pushed data",
        ),
        PEER_ERR_LAUNCH => Some(KernelFailure::Launch),
        ERR_PEER_LOST => Some(KernelFailure::PeerLost),
        _ => Some(KernelFailure::Unknown),
    }
}

impl CudaEnqueue<'_> {
    /// This rank's peer words, which every peer plan's launch needs.
    fn peer_words(&self, kernel: PeerKernel) -> Result<&PeerWords> {
        self.peer.ok_or_else(|| Error::Internal {
            what: format!("a {kernel} plan on a communicator without peer-kernel resources"),
        })
    }
}

impl CudaCall {
    /// How long after its start a peer kernel of this call waits at its barriers: three
    /// quarters of the call's timeout, so that a barrier that never meets ends the kernel, with
    /// its code in the error word, before the host gives up waiting.
    pub(super) fn kernel_timeout_ns(&self) -> u64 {
        u64::try_from(self.timeout.as_nanos() / 4 * 3).unwrap_or(u64::MAX)
    }
}

impl CudaEnqueue<'_> {
    /// Launches this rank's two-shot kernel: the plan's step 0 and every gather round of this
    /// rank, over every rank's `segments` (verified by `twoshot_segments` when the plan was
    /// prepared).
    pub(super) fn launch_twoshot(&self, rank: usize, segments: &[(usize, usize)]) -> Result<()> {
        let call = self.call;
        let plan = &*self.plan.plan;
        let shared = self.peer_words(PeerKernel::TwoShot)?;
        let src_kind = if plan.in_place {
            BufKind::Output
        } else {
            BufKind::Input
        };
        let base = |r: usize, kind: BufKind| -> Result<u64> {
            let buf = plan.buffer(r, kind).ok_or_else(|| Error::Internal {
                what: format!("the two-shot plan has no {kind:?} for rank {r}"),
            })?;
            Ok(self.base(buf))
        };
        let mut args = TwoShotArgs {
            srcs: [0; PEER_MAX_RANKS],
            outs: [0; PEER_MAX_RANKS],
            flags: [0; PEER_MAX_RANKS],
            seg_off: [0; PEER_MAX_RANKS],
            seg_len: [0; PEER_MAX_RANKS],
            world: plan.world as u32,
            rank: rank as u32,
            count: plan.count as u64,
            timeout_ns: call.kernel_timeout_ns(),
            error: self.res.error_word(),
            max_blocks: shared.max_blocks,
        };
        for (r, &(offset, count)) in segments.iter().enumerate() {
            args.srcs[r] = base(r, src_kind)?;
            args.outs[r] = base(r, BufKind::Output)?;
            args.flags[r] = shared.flags_of[r];
            args.seg_off[r] = offset as u64;
            args.seg_len[r] = count as u64;
        }
        // SAFETY: the plan is the checked two-shot plan whose layout `twoshot_segments`
        // verified: every rank's sources and outputs are the caller's validated buffers (or, in
        // place, the outputs themselves), on their ranks' GPUs, reachable from this one (peer
        // access between all pairs at creation, pool access granted per input and output); the
        // outputs are disjoint from each other and from other ranks' sources (validation);
        // every rank launches with the same arguments but its rank, so the barriers meet; the flags outlive the communicator's streams.
        unsafe {
            self.res.kernels.twoshot(
                call.dtype,
                call.op,
                &args,
                &self.res.streams[StreamKind::Main.index()],
            )
        }
    }

    /// Launches this rank's steps kernel: every step of the rank's one-shot collective, `layout`
    /// (verified by `steps_layout` when the plan was prepared).
    pub(super) fn launch_steps(&self, rank: usize, layout: &[StepLayout]) -> Result<()> {
        let call = self.call;
        let plan = &*self.plan.plan;
        let shared = self.peer_words(PeerKernel::Steps)?;
        let eb = call.dtype.size_bytes() as u64;
        let source = |q: usize, kind: BufKind, offset: usize| -> Result<u64> {
            let buf = plan.buffer(q, kind).ok_or_else(|| Error::Internal {
                what: format!("the one-shot plan has no {kind:?} for rank {q}"),
            })?;
            Ok(self.base(buf) + offset as u64 * eb)
        };
        let mut steps = Vec::with_capacity(layout.len());
        for step in layout {
            let mut srcs = [0; PEER_MAX_RANKS];
            match step.from {
                Some(q) => srcs[q] = source(q, step.src, step.offset)?,
                None => {
                    for (q, src) in srcs.iter_mut().enumerate().take(plan.world) {
                        *src = source(q, step.src, step.offset)?;
                    }
                }
            }
            steps.push(PeerStep {
                srcs,
                dst: self.addr(step.dst),
                from: step.from,
            });
        }
        let mut flags = [0; PEER_MAX_RANKS];
        for (r, f) in flags.iter_mut().enumerate().take(plan.world) {
            *f = shared.flags_of[r];
        }
        let args = StepsArgs {
            steps,
            flags,
            world: plan.world as u32,
            rank: rank as u32,
            count: plan.count as u64,
            timeout_ns: call.kernel_timeout_ns(),
            error: self.res.error_word(),
            max_blocks: shared.max_blocks,
        };
        // SAFETY: the plan is a checked one-shot collective plan whose layout `steps_layout`
        // verified (no meeting writes what another reads or writes); every source is a
        // caller's validated buffer on its rank's GPU, reachable from this one (peer access
        // between all pairs at creation, pool access granted in `open_peer_call`); every rank
        // launches with the same count, flags and grid, so the barriers meet; the flags outlive
        // the communicator's streams.
        unsafe {
            self.res.kernels.steps(
                call.dtype,
                call.op,
                &args,
                &self.res.streams[StreamKind::Main.index()],
            )
        }
    }

    /// Launches this rank's one-shot kernel for the peer reduce `op` into `dst` (a plan whose
    /// layout `oneshot_layout` verified): `kernel`, the LL one-shot or the read one-shot
    /// ([`PeerWords::oneshot_kernel`] chose it when the plan was prepared), or the staged
    /// one-shot (the read kernel over host copies, its flags in host memory). `expose_from`
    /// is the fused exposure copy's source (see `CudaEnqueue::held`): the in-place buffer, or
    /// for the staged one-shot also the input out of place.
    pub(super) fn launch_oneshot(
        &self,
        kernel: PeerKernel,
        op: Op,
        dst: Region,
        expose_from: Option<u64>,
        stream: &Stream,
    ) -> Result<()> {
        let call = self.call;
        let plan = &*self.plan.plan;
        let shared = self.peer_words(kernel)?;
        let rank = plan.decl(dst.buf).rank;
        let sources = crate::check::peer_sources(plan, &op);
        if kernel == PeerKernel::OneShotLl {
            // This rank's input: out of place, its Input; in place with the exposure copy fused
            // (`expose_from`, the in-place buffer itself), that buffer, and the copy is dropped:
            // the plan's Exposed buffer exists only for peers to read in the read one-shot, and
            // the LL kernel's peers never read this rank's memory (they are sent its words), so
            // the copy has no reader. The kernel reads each chunk of the in-place buffer before
            // the same thread overwrites it with the result. In place with the copy enqueued on
            // its own (not fused), the Exposed buffer holds the input by then, on this stream.
            let src = match expose_from {
                Some(in_place) => in_place,
                None => self.addr(sources[rank]),
            };
            return self.launch_ll(shared, rank, src, dst, stream);
        }
        let mut args = OneShotArgs {
            srcs: [0; PEER_MAX_RANKS],
            flags: [0; PEER_MAX_RANKS],
            world: plan.world as u32,
            rank: rank as u32,
            dst: self.addr(dst),
            count: dst.count as u64,
            timeout_ns: call.kernel_timeout_ns(),
            error: self.res.error_word(),
            expose_from: expose_from.unwrap_or(0),
            max_blocks: shared.max_blocks,
        };
        for (r, src) in sources.into_iter().enumerate() {
            args.srcs[r] = self.addr(src);
            args.flags[r] = shared.flags_of[r];
        }
        // SAFETY: every source lies in a buffer of its rank (checked plan; the caller's validated
        // inputs or our exposed copies), reachable from this GPU — on its rank's GPU over the
        // peer access enabled between all pairs at creation (pool access granted per input),
        // or, staged, in pinned host memory every GPU maps (`check_staged` proved the plan
        // reads nothing else of another rank, and the flags are host memory too); `dst` is
        // this rank's output, disjoint from every source; every rank launches the same grid
        // (`peer_blocks` of dtype and count), so the barriers meet; the flags outlive the
        // communicator's streams.
        unsafe { self.res.kernels.oneshot(call.dtype, call.op, &args, stream) }
    }

    /// Launches this rank's LL one-shot kernel: this rank's input `src` (device memory of this
    /// rank, `dst.count` elements) folded with every peer's into `dst`.
    fn launch_ll(
        &self,
        shared: &PeerWords,
        rank: usize,
        src: u64,
        dst: Region,
        stream: &Stream,
    ) -> Result<()> {
        let call = self.call;
        let recv = shared.ll_recv_of.as_ref().ok_or_else(|| Error::Internal {
            what: "an LL one-shot launch on a communicator without low_latency".into(),
        })?;
        let mut args = LlArgs {
            recvs: [0; PEER_MAX_RANKS],
            flags: shared.flags_of[rank],
            world: self.plan.plan.world as u32,
            rank: rank as u32,
            src,
            dst: self.addr(dst),
            count: dst.count as u64,
            timeout_ns: call.kernel_timeout_ns(),
            error: self.res.error_word(),
        };
        for (r, buffer) in recv.iter().enumerate() {
            args.recvs[r] = *buffer;
        }
        // SAFETY: `src` is this rank's input (the caller's validated input, its in-place buffer,
        // or our exposed copy of it, filled earlier on this stream) and `dst` its output, both on
        // this GPU, equal (in place) or disjoint (validated buffers); the receive buffers are
        // ours (ll_recv_bytes(world), zeroed at creation, reached over the peer access enabled
        // between all pairs, or on this GPU when ranks share it) and the flags this rank's, both
        // used only by this communicator's peer kernels, all on Main; every rank launches with
        // the same dtype, op and count (`oneshot_kernel` decides alike on every rank), so the
        // grids and epochs match, and the grid fits the cap that keeps every rank's blocks
        // resident; all outlive the communicator's streams.
        unsafe { self.res.kernels.ll(call.dtype, call.op, &args, stream) }
    }
}

#[cfg(test)]
mod tests {
    use super::{kernel_failure, oneshot_kernel_for, KernelFailure, PeerKernel, LL_ERR_WAIT};
    use crate::element::DType;
    use crate::exec::cuda::kernels::{ll_blocks, LL_MAX_BYTES};
    use crate::exec::cuda::kernels::{COUNTER_ERR_BIT, ERROR_CODES};

    #[test]
    fn the_oneshot_runs_the_ll_kernel_only_when_asked_and_up_to_its_limit() {
        for dtype in DType::ALL {
            let most = LL_MAX_BYTES / dtype.size_bytes();
            for count in [1, 7, most - 1, most, most + 1, 1 << 24] {
                let fits = count <= most;
                let want = if fits {
                    PeerKernel::OneShotLl
                } else {
                    PeerKernel::OneShot
                };
                // H200: 132 SMs, or 66 with two ranks on it.
                for max_blocks in [132, 66] {
                    assert_eq!(oneshot_kernel_for(true, max_blocks, dtype, count), want);
                    // Off: the read one-shot at every size, as without the LL kernel.
                    assert_eq!(
                        oneshot_kernel_for(false, max_blocks, dtype, count),
                        PeerKernel::OneShot
                    );
                }
            }
        }
        // A grid cap below the LL grid (a small GPU shared by several ranks): the read one-shot,
        // whose grid is capped instead; up to the cap, the LL kernel.
        let bytes = LL_MAX_BYTES;
        let blocks = ll_blocks(bytes);
        assert!(blocks > 1);
        assert_eq!(
            oneshot_kernel_for(true, blocks - 1, DType::U8, bytes),
            PeerKernel::OneShot
        );
        assert_eq!(
            oneshot_kernel_for(true, blocks, DType::U8, bytes),
            PeerKernel::OneShotLl
        );
        assert_eq!(
            oneshot_kernel_for(true, 1, DType::U8, 4096),
            PeerKernel::OneShotLl
        );
        assert_eq!(
            oneshot_kernel_for(true, 1, DType::U8, 4097),
            PeerKernel::OneShot
        );
        assert_eq!(
            oneshot_kernel_for(true, 132, DType::F64, usize::MAX),
            PeerKernel::OneShot
        );
    }

    #[test]
    fn every_error_code_has_a_message() {
        for (name, code) in ERROR_CODES {
            let said = kernel_failure(code);
            assert!(
                said.is_some_and(|f| f != KernelFailure::Unknown),
                "{name} = {code:#x} is decoded as {said:?}"
            );
        }
    }

    #[test]
    fn every_peer_code_is_named() {
        let gave_up = |code| match kernel_failure(code) {
            Some(KernelFailure::GaveUp { kernel, at }) => (kernel, Some(at)),
            _ => (None, None),
        };
        assert_eq!(gave_up(1), (None, Some("at the start barrier")));
        assert_eq!(gave_up(2), (None, Some("at the end barrier")));
        assert_eq!(gave_up(4).0, Some(PeerKernel::TwoShot));
        let (kernel, at) = gave_up(LL_ERR_WAIT);
        assert_eq!(kernel, Some(PeerKernel::OneShotLl));
        assert_eq!(kernel.unwrap().to_string(), "LL one-shot");
        assert!(at.unwrap().contains("pushed data"));
        assert_eq!(kernel_failure(3), Some(KernelFailure::Launch));
        assert_eq!(kernel_failure(99), Some(KernelFailure::Unknown));
        assert_eq!(kernel_failure(0), None);
        assert_eq!(
            kernel_failure(COUNTER_ERR_BIT | 0x0001_0002),
            Some(KernelFailure::CounterWait)
        );
    }
}
