//! The peer kernels on the executor's side: the one-shot and the two-shot all-reduce, one kernel
//! per rank that reads the other ranks' memory directly (peer access) and meets their kernels at
//! flag barriers ([`crate::exec::cuda::kernels`] launches them; `cuda/peer.cuh` describes the
//! protocol). Here: the state both kernels share across ranks ([`PeerKernelState`], made by
//! [`setup_peer_kernels`]), the checks that a plan has exactly the layout its kernel implements
//! ([`oneshot_layout`], [`twoshot_segments`]), the launch of each kernel from a plan's peer
//! reduce, the inline enqueue of plans without events, and the barrier timeouts the kernels
//! report.
//!
//! Plans without events skip the rank threads: the caller's thread binds each rank's context in
//! turn, launches, and puts its own context back. The kernels meet on the GPUs whenever each
//! starts.
//!
//! A failed call never leaves a kernel reading the caller's buffers after it returns: a kernel
//! whose peers never arrive gives up after three quarters of the call's timeout and leaves a code
//! in its error word, which the call (or the next one, or `synchronize`) turns into
//! [`Error::Timeout`]; a call that fails after launching some ranks waits for their kernels to
//! give up before it returns. A kernel that gives up at its start barrier (or the two-shot's
//! middle one) also withdraws its signal, so that a peer's kernel starting later (queued behind
//! work that was stuck) times out too instead of reading this rank's memory after the call has
//! returned its error. (A peer that passed the barrier in the instant before the withdrawal still
//! reads; it is then inside the call's deadline, a quarter of the timeout before the call
//! returns.)
//!
//! Invariant: every rank of a peer call launches its kernel with the same grid, sources and
//! flags, on its Main stream, so that the barriers meet and each block's epoch (kept on the
//! device, advanced by the kernel) moves in step on every rank.

use super::ring::{wait_done, CudaEnqueue};
use super::{CudaCall, CudaExecutor, RankRes, Transport};
use crate::device::{self, DeviceBuffer, PinnedHost, Stream};
use crate::error::{Error, Result};
use crate::exec::cuda::kernels::{
    OneShotArgs, PeerStep, StepsArgs, TwoShotArgs, HANDOFF_ERR_BIT, PEER_FLAG_BYTES, PEER_MAX_RANKS,
};
use crate::exec::{panic_message, Enqueue};
use crate::plan::{BufKind, Op, Plan, Ranks, Region, StreamKind};
use cudarc::driver::CudaContext;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which peer kernel a call launches; names the kernel in its errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PeerKernel {
    OneShot,
    TwoShot,
    /// The one-shot form of a collective other than the all-reduce.
    Steps,
}

impl fmt::Display for PeerKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PeerKernel::OneShot => "one-shot",
            PeerKernel::TwoShot => "two-shot",
            PeerKernel::Steps => "one-shot collective",
        })
    }
}

/// What the peer kernels (one-shot and two-shot) share across ranks, made once per communicator:
/// per rank, the flag words its peers write at the barriers (device memory, zeroed, reached
/// through peer access), and a pinned word its kernel sets when a barrier times out. Calls of
/// either kernel share the flags and the epochs in them.
pub(super) struct PeerKernelState {
    flags: Vec<DeviceBuffer>,
    errors: Vec<PinnedHost>,
    /// The smallest SM count of the ranks' GPUs: the grid cap that keeps every block resident.
    max_blocks: u32,
    /// Every rank, whose `done` event follows its latest call on Main: what the gate waits for.
    ranks: Vec<Arc<RankRes>>,
    /// The communicator's timeout: a peer kernel gives up within it of its launch.
    timeout: Duration,
    /// When the latest call's kernels were launched (under the gate, `device::gate::launching`).
    last_launch: std::sync::Mutex<Option<Instant>>,
}

impl device::gate::InFlight for PeerKernelState {
    /// Waits for every rank's latest call to complete on Main, or until the latest launch's
    /// timeout has passed (its kernels have given up by then, or never started).
    fn settle(&self) {
        let launched = *self.last_launch.lock().unwrap_or_else(|p| p.into_inner());
        let Some(launched) = launched else {
            return;
        };
        let deadline = launched + self.timeout;
        let Ok(saved) = device::save_current() else {
            return;
        };
        for res in &self.ranks {
            while Instant::now() < deadline && matches!(device::event_query(&res.done), Ok(false)) {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        // (Restoring can only fail if the driver does; the blocking call that follows reports it.)
        let _ = saved.restore();
    }
}

impl PeerKernelState {
    /// The code rank `rank`'s kernel left (1: start barrier timed out, 2: end barrier, 3: a launch
    /// it could not accept, 4: the two-shot's middle barrier), 0 when none. Read through the host
    /// mapping; the kernel writes it with a plain system-scope store.
    fn error(&self, rank: usize) -> u32 {
        // SAFETY: the pinned allocation is at least 4 bytes and page-aligned, and lives as long
        // as `self`; a volatile read, since the GPU may write the word at any time.
        unsafe { std::ptr::read_volatile(self.errors[rank].as_ptr().cast::<u32>()) }
    }

    /// Rank `rank`'s error word as a device address (its host mapping).
    pub(super) fn error_word(&self, rank: usize) -> u64 {
        self.errors[rank].uva_ptr()
    }
}

/// Makes the peer kernels' flags and error words, after enabling peer access between every pair
/// of GPUs (each rank's kernel reads every rank's memory). `None` where they cannot run:
/// one rank, more than [`PEER_MAX_RANKS`], forced staging, or a pair of GPUs without peer access.
///
/// Ranks that share a GPU (the test-only shared mode) run their kernels side by side on it, and
/// a block spinning for a partner block that has no SM would wait until the timeout: so the grid
/// cap is each GPU's SM count divided by the ranks on it (one block fits per SM), the smallest
/// over the GPUs, which keeps every block of every rank resident at once.
pub(super) fn setup_peer_kernels(
    ranks: &[Arc<RankRes>],
    transport: Transport,
    timeout: Duration,
) -> Result<Option<Arc<PeerKernelState>>> {
    let n = ranks.len();
    if !(2..=PEER_MAX_RANKS).contains(&n) || transport == Transport::Staged {
        return Ok(None);
    }
    for a in ranks {
        for b in ranks {
            if a.device != b.device && !device::can_access_peer(a.device, b.device)? {
                return Ok(None);
            }
        }
    }
    for a in ranks {
        for b in ranks {
            // A pair the ring never uses may refuse (e.g. more than 8 peers of one device):
            // then the peer kernels cannot run here, and the ring still can.
            if device::enable_peer_access(&a.ctx, &b.ctx).is_err() {
                return Ok(None);
            }
        }
    }
    let flags = ranks
        .iter()
        .map(|r| DeviceBuffer::zeroed(&r.ctx, PEER_FLAG_BYTES))
        .collect::<Result<Vec<_>>>()?;
    let errors = ranks
        .iter()
        .map(|r| {
            let mut word = PinnedHost::new(&r.ctx, 4)?;
            word.as_mut_slice().fill(0);
            Ok(word)
        })
        .collect::<Result<Vec<_>>>()?;
    let sm_counts = device::devices()?;
    let max_blocks = ranks
        .iter()
        .map(|r| {
            let sharing = ranks.iter().filter(|o| o.device == r.device).count() as u32;
            sm_counts.get(r.device).map_or(1, |d| d.sm_count) / sharing
        })
        .min()
        .unwrap_or(1)
        .max(1);
    let state = Arc::new(PeerKernelState {
        flags,
        errors,
        max_blocks,
        ranks: ranks.to_vec(),
        timeout,
        last_launch: std::sync::Mutex::new(None),
    });
    let weak: std::sync::Weak<dyn device::gate::InFlight> = Arc::downgrade(&state) as _;
    device::gate::register(weak);
    Ok(Some(state))
}

/// A launch of a later rank's peer kernel this long after the first rank's counts as held up:
/// a launch takes microseconds, so this much is the driver blocked by another thread's call.
const LAUNCH_BLOCKED_AFTER: Duration = Duration::from_millis(100);

impl CudaExecutor {
    /// Opens a call of a peer kernel: reports a barrier timeout an earlier call left, and opens
    /// pool memory to every other GPU — out of place every GPU reads every other GPU's input,
    /// the two-shot also every other GPU's output, and an in-place one-shot collective the
    /// caller's one buffer of every GPU.
    pub(super) fn open_peer_call(
        &mut self,
        kernel: PeerKernel,
        inputs: Option<&[u64]>,
        outputs: &[u64],
    ) -> Result<()> {
        self.check_peer_errors()?;
        self.last_peer_kernel = kernel;
        // The two-shot gathers from outputs; an in-place one-shot collective reads the caller's
        // one buffer (passed as the outputs).
        let outputs_read = (kernel == PeerKernel::TwoShot
            || kernel == PeerKernel::Steps && inputs.is_none())
        .then_some(outputs);
        for ranked in inputs.into_iter().chain(outputs_read) {
            // (A rank without such a buffer — a broadcast's non-root input — has address 0.)
            for (rank, &addr) in ranked.iter().enumerate().filter(|(_, &a)| a != 0) {
                let own = self.ranks[rank].device;
                let peers: Vec<usize> = self.ranks.iter().map(|r| r.device).collect();
                for peer in peers.into_iter().filter(|&p| p != own) {
                    self.grant_once(addr, peer)?;
                }
            }
        }
        Ok(())
    }

    /// Enqueues a plan without events on every rank — from the calling thread for rank 0 and, where
    /// the communicator has them, from the launcher threads for the others at the same time
    /// (module `launch`), else from the calling thread rank after rank (each rank's work goes on
    /// its own streams, so the order between ranks does not matter: the peer kernels meet on the
    /// GPUs, whenever each is launched) — then waits for completion if asked. A panic is caught
    /// and returned as an error, as on the rank threads.
    pub(super) fn run_inline(&mut self, call: &Arc<CudaCall>) -> Result<()> {
        let saved = device::save_current()?;
        // No blocking CUDA call of this crate runs between the ranks' launches, and each waits
        // for these kernels (module `device::gate`).
        let launching = device::gate::launching();
        let started = Instant::now();
        if let Some(peer) = &call.peer {
            *peer.last_launch.lock().unwrap_or_else(|p| p.into_inner()) = Some(started);
        }
        // Each rank's result and when its launch ended.
        let mut launched: Vec<(Result<()>, Instant)> = Vec::with_capacity(self.ranks.len());
        match self.launchers.as_mut() {
            Some(launchers) => {
                launchers.post(call);
                launched.push(self.enqueue_rank_caught(0, call));
                let launchers = self.launchers.as_ref().expect("posted above");
                launched.extend(launchers.wait(call.deadline));
            }
            None => {
                for rank in 0..self.ranks.len() {
                    let outcome = self.enqueue_rank_caught(rank, call);
                    let failed = outcome.0.is_err();
                    launched.push(outcome);
                    if failed {
                        break;
                    }
                }
            }
        }
        drop(launching);
        // A later rank's launch that ended long after the first: its kernel waited that long.
        let mut blocked: Option<(usize, Duration)> = None;
        let first = launched.iter().map(|(_, at)| *at).min().unwrap_or(started);
        for (rank, (_, at)) in launched.iter().enumerate() {
            let late = *at - first;
            if late >= LAUNCH_BLOCKED_AFTER && blocked.is_none_or(|(_, d)| late > d) {
                blocked = Some((rank, late));
            }
        }
        *self
            .launch_blocked
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = blocked;
        let result = match launched.into_iter().find_map(|(r, _)| r.err()) {
            Some(err) => {
                // Ranks already launched spin at their barriers until the kernel's timeout
                // (shorter than the call's deadline); wait for them, so that nothing on a GPU
                // touches the caller's buffers after this call has returned its error.
                // (Bounded by the deadline: a stuck stream must not hold the caller.)
                for res in &self.ranks {
                    let main = &res.streams[StreamKind::Main.index()];
                    while matches!(device::stream_query(main), Ok(false))
                        && Instant::now() < call.deadline
                    {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                }
                Err(err)
            }
            None if call.wait_complete => {
                self.ranks.iter().enumerate().try_for_each(|(rank, res)| {
                    wait_done(res, rank, call).map_err(|err| self.name_blocked_launch(err))
                })
            }
            None => Ok(()),
        };
        result.and(saved.restore())
    }

    /// [`enqueue_rank_inline`] for rank `rank` from the calling thread, a panic caught as an
    /// error; with the time its launch ended.
    fn enqueue_rank_caught(&self, rank: usize, call: &CudaCall) -> (Result<()>, Instant) {
        let result = catch_unwind(AssertUnwindSafe(|| {
            enqueue_rank_inline(rank, &self.ranks[rank], &self.contexts, call)
        }))
        .unwrap_or_else(|payload| {
            Err(Error::RankFailed {
                rank,
                during: "enqueue".into(),
                message: panic_message(&*payload),
            })
        });
        (result, Instant::now())
    }

    /// A timeout of a peer call whose launches were held up between ranks is that, by name:
    /// [`Error::LaunchBlocked`] instead of a timeout that blames a GPU. Any other timeout of a
    /// peer call says what else holds a peer kernel back: another thread's blocking CUDA calls
    /// on these GPUs make the driver hold a kernel's start on the GPU, not its launch (measured,
    /// docs/runs/2026-12-01-s4-d3835ae), which the host cannot tell from a stuck GPU.
    fn name_blocked_launch(&self, err: Error) -> Error {
        let blocked = *self
            .launch_blocked
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match (err, blocked) {
            (Error::Timeout { .. }, Some((rank, late))) => Error::LaunchBlocked {
                rank,
                device: self.ranks[rank].device,
                late,
            },
            (
                Error::Timeout {
                    rank,
                    waiting_on,
                    after,
                },
                None,
            ) => Error::Timeout {
                rank,
                waiting_on: format!(
                    "{waiting_on} (a peer kernel waited for another that did not start: a stuck GPU, a peer's CUDA graph that was not replayed, or another thread's blocking CUDA call on these GPUs outside ringreduce — an allocation, a free, a pageable copy — during the call; docs/ERRORS.md, \"Several threads\")"
                ),
                after,
            },
            (err, _) => err,
        }
    }

    /// The first barrier timeout any rank's peer kernel reported (its kernel then returned
    /// early, so that call's output is incomplete): an error naming the rank, the kernel and the
    /// barrier. Checked after every blocking peer call, before the next peer call, and by
    /// `synchronize`. The kernel named is the latest peer call's (the words are checked before
    /// every peer call, so a code is that call's unless non-blocking calls overlapped); a middle
    /// barrier is always the two-shot's.
    pub(super) fn check_peer_errors(&self) -> Result<()> {
        let Some(shared) = &self.peer else {
            return Ok(());
        };
        for (rank, r) in self.ranks.iter().enumerate() {
            let code = shared.error(rank);
            if code & HANDOFF_ERR_BIT != 0 {
                return Err(self.handoff_timeout(rank, code));
            }
            if code != 0 {
                let kernel = if code == 4 {
                    PeerKernel::TwoShot
                } else {
                    self.last_peer_kernel
                };
                let barrier = match code {
                    1 => Some("start"),
                    2 => Some("end"),
                    4 => Some("middle"),
                    _ => None,
                };
                let waiting_on = match barrier {
                    Some(barrier) => format!(
                        "GPU {}'s {kernel} kernel gave up at the {barrier} barrier: a peer's kernel never arrived",
                        r.device,
                    ),
                    _ => {
                        return Err(Error::RankFailed {
                            rank,
                            during: format!("the {kernel} peer reduce"),
                            message: format!(
                                "GPU {}'s {kernel} kernel found its launch inconsistent (code {code})",
                                r.device
                            ),
                        })
                    }
                };
                return Err(self.name_blocked_launch(Error::Timeout {
                    rank,
                    waiting_on,
                    after: self.config.timeout,
                }));
            }
        }
        Ok(())
    }
}

/// Enqueues rank `rank`'s whole program of a plan without events on its own streams (binding its
/// context), then its completion record: what the calling thread or a launcher thread does for
/// one rank of a peer call.
pub(super) fn enqueue_rank_inline(
    rank: usize,
    res: &RankRes,
    contexts: &[Arc<CudaContext>],
    call: &CudaCall,
) -> Result<()> {
    device::bind(&res.ctx)?;
    let mut backend = CudaEnqueue {
        rank,
        res,
        contexts,
        call,
        fuse_exposure: true,
        held: None,
        steps_launched: false,
    };
    for (index, instr) in call.prepared.plan.ranks[rank].iter().enumerate() {
        backend.enqueue(index, instr)?;
    }
    backend.flush()?;
    super::ring::record_done(res, call)
}

impl CudaCall {
    /// The peer kernels' state, which every peer plan's launch needs.
    fn peer_state(&self, kernel: PeerKernel) -> Result<&PeerKernelState> {
        self.peer.as_deref().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "a {kernel} plan on a communicator without peer-kernel resources"
            ))
        })
    }

    /// How long after its start a peer kernel of this call waits at its barriers: three
    /// quarters of the call's timeout, so that a barrier that never meets ends the kernel, with
    /// its code in the error word, before the host gives up waiting.
    pub(super) fn kernel_timeout_ns(&self) -> u64 {
        u64::try_from(self.timeout.as_nanos() / 4 * 3).unwrap_or(u64::MAX)
    }
}

impl CudaEnqueue<'_> {
    /// Launches this rank's two-shot kernel: the plan's step 0 and every gather round of this
    /// rank (their layout was verified by `twoshot_segments` when the plan was prepared).
    pub(super) fn launch_twoshot(&self, rank: usize) -> Result<()> {
        let call = self.call;
        let plan = &call.prepared.plan;
        let segments = call.prepared.twoshot.as_ref().expect("a two-shot plan");
        let shared = call.peer_state(PeerKernel::TwoShot)?;
        let src_kind = if plan.in_place {
            BufKind::Output
        } else {
            BufKind::Input
        };
        let base = |r: usize, kind: BufKind| -> Result<u64> {
            let buf = plan.buffer(r, kind).ok_or_else(|| {
                Error::PlanRejected(format!("the two-shot plan has no {kind:?} for rank {r}"))
            })?;
            Ok(call.addrs[buf.0])
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
            error: shared.errors[rank].uva_ptr(),
            max_blocks: shared.max_blocks,
        };
        for (r, &(offset, count)) in segments.iter().enumerate() {
            args.srcs[r] = base(r, src_kind)?;
            args.outs[r] = base(r, BufKind::Output)?;
            args.flags[r] = shared.flags[r].ptr();
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

    /// Launches this rank's steps kernel: every step of the rank's one-shot collective (their
    /// layout was verified by `steps_layout` when the plan was prepared).
    pub(super) fn launch_steps(&self, rank: usize) -> Result<()> {
        let call = self.call;
        let plan = &call.prepared.plan;
        let layout = call
            .prepared
            .steps
            .as_ref()
            .expect("a one-shot collective plan");
        let shared = call.peer_state(PeerKernel::Steps)?;
        let eb = call.dtype.size_bytes() as u64;
        let source = |q: usize, kind: BufKind, offset: usize| -> Result<u64> {
            let buf = plan.buffer(q, kind).ok_or_else(|| {
                Error::PlanRejected(format!("the one-shot plan has no {kind:?} for rank {q}"))
            })?;
            Ok(call.addrs[buf.0] + offset as u64 * eb)
        };
        let mut steps = Vec::with_capacity(layout[rank].len());
        for step in &layout[rank] {
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
            *f = shared.flags[r].ptr();
        }
        let args = StepsArgs {
            steps,
            flags,
            world: plan.world as u32,
            rank: rank as u32,
            count: plan.count as u64,
            timeout_ns: call.kernel_timeout_ns(),
            error: shared.errors[rank].uva_ptr(),
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
    /// layout `oneshot_layout` verified); `expose_from` is the fused exposure copy's source
    /// (see `CudaEnqueue::fuse_exposure`).
    pub(super) fn launch_oneshot(
        &self,
        op: Op,
        dst: Region,
        expose_from: Option<u64>,
        stream: &Stream,
    ) -> Result<()> {
        let call = self.call;
        let plan = &call.prepared.plan;
        let shared = call.peer_state(PeerKernel::OneShot)?;
        let rank = plan.decl(dst.buf).rank;
        let mut args = OneShotArgs {
            srcs: [0; PEER_MAX_RANKS],
            flags: [0; PEER_MAX_RANKS],
            world: plan.world as u32,
            rank: rank as u32,
            dst: self.addr(dst),
            count: dst.count as u64,
            timeout_ns: call.kernel_timeout_ns(),
            error: shared.errors[rank].uva_ptr(),
            expose_from: expose_from.unwrap_or(0),
            max_blocks: shared.max_blocks,
        };
        for (r, src) in crate::check::peer_sources(plan, &op)
            .into_iter()
            .enumerate()
        {
            args.srcs[r] = self.addr(src);
            args.flags[r] = shared.flags[r].ptr();
        }
        // SAFETY: every source lies in a buffer of its rank's GPU (checked plan; the caller's
        // validated inputs or our exposed copies), reachable from this GPU (peer access enabled
        // between all pairs at creation, pool access granted per input); `dst` is this rank's
        // output, disjoint from every source; every rank launches the same grid (`peer_blocks`
        // of dtype and count), so the barriers meet; the flags outlive the
        // communicator's streams.
        unsafe { self.res.kernels.oneshot(call.dtype, call.op, &args, stream) }
    }
}

/// One step of a rank's one-shot collective, read from its plan (`steps_layout`): a fold over
/// every rank (`from: None`) or a copy from rank `from`, of elements `offset..offset + count` of
/// each source rank's `src` buffer, into `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct StepLayout {
    pub(super) from: Option<usize>,
    pub(super) src: BufKind,
    pub(super) offset: usize,
    pub(super) dst: Region,
}

/// Each rank's steps for the steps kernel, after verifying that the plan has the layout it
/// implements: every rank's work is peer reduces on Main (and a final `Scale`), each reading
/// every rank or exactly one, moving the plan's count or nothing (a rank that only joins), at
/// most [`PEER_MAX_RANKS`] that move data per rank; and no meeting writes anything another
/// meeting — of any rank — reads or writes, which is what lets one kernel run all of a rank's
/// meetings between a single start and end barrier (the checker proves each meeting with
/// barriers of its own). `None` for a plan without meetings (one rank, or zero elements).
pub(super) fn steps_layout(plan: &Plan) -> Result<Option<Vec<Vec<StepLayout>>>> {
    let bad = |why: String| {
        Err(Error::PlanRejected(format!(
            "not a one-shot collective plan: {why}"
        )))
    };
    let n = plan.world;
    let mut all: Vec<Vec<StepLayout>> = Vec::with_capacity(n);
    // Per meeting (rank, its k-th peer reduce): what it writes and what it reads.
    let mut accesses: Vec<(usize, usize, Region, Vec<Region>)> = Vec::new();
    let mut meetings = 0;
    for rank in 0..n {
        let program = &plan.ranks[rank];
        let mut steps = Vec::new();
        let mut k = 0;
        for (i, instr) in program.iter().enumerate() {
            let op = instr.op;
            match op {
                _ if instr.stream != StreamKind::Main => {
                    return bad(format!("rank {rank} has work off its Main stream"))
                }
                Op::Scale { .. } if i + 1 == program.len() => {}
                Op::PeerReduce {
                    dst,
                    src,
                    offset,
                    count,
                    ranks,
                } => {
                    let readers = (0..n).filter(|&q| ranks.contains(q)).count();
                    let from = match (ranks, readers) {
                        (Ranks::ALL, _) => None,
                        (_, 1) => (0..n).find(|&q| ranks.contains(q)),
                        _ => {
                            return bad(format!(
                                "rank {rank}'s peer reduce {k} reads {readers} of {n} ranks"
                            ))
                        }
                    };
                    if count != 0 && count != plan.count {
                        return bad(format!(
                            "rank {rank}'s peer reduce {k} moves {count} elements, not {}",
                            plan.count
                        ));
                    }
                    if count > 0 {
                        steps.push(StepLayout {
                            from,
                            src,
                            offset,
                            dst,
                        });
                        accesses.push((rank, k, dst, crate::check::peer_sources(plan, &op)));
                    }
                    k += 1;
                }
                _ => {
                    return bad(format!(
                        "rank {rank} has work besides peer reduces and a final scale"
                    ))
                }
            }
        }
        if steps.len() > PEER_MAX_RANKS {
            return bad(format!(
                "rank {rank} has {} steps; the kernel runs at most {PEER_MAX_RANKS}",
                steps.len()
            ));
        }
        meetings = meetings.max(k);
        all.push(steps);
    }
    if meetings == 0 {
        return Ok(None);
    }
    for (rank, k, dst, _) in &accesses {
        for (other, k2, dst2, reads) in &accesses {
            if k == k2 {
                continue; // one meeting: the checker proved its ranks' accesses race-free
            }
            if dst.overlaps(dst2) || reads.iter().any(|r| r.overlaps(dst)) {
                return bad(format!(
                    "rank {rank}'s meeting {k} writes what rank {other}'s meeting {k2} reads or writes: \
                     they would need a barrier between them"
                ));
            }
        }
    }
    Ok(Some(all))
}

/// Each rank's segment (offset, count) of a two-shot plan, after verifying that the plan has
/// exactly the layout the fused two-shot kernel implements: on every rank, a peer reduce of
/// every rank's sources into its own output segment, then one peer reduce per other rank q — in
/// the order `twoshot::gather_from` gives — copying q's output segment from q alone, and nothing
/// else but a final `Scale`; the segments tile the buffer in rank order. `None` for an empty
/// plan (one rank, or zero elements).
pub(super) fn twoshot_segments(plan: &Plan) -> Result<Option<Vec<(usize, usize)>>> {
    let n = plan.world;
    let peer_ops = |rank: usize| -> Vec<Op> {
        plan.ranks[rank]
            .iter()
            .map(|i| i.op)
            .filter(|op| matches!(op, Op::PeerReduce { .. }))
            .collect()
    };
    if (0..n).all(|r| peer_ops(r).is_empty()) {
        return Ok(None);
    }
    let bad = |why: String| Err(Error::PlanRejected(format!("not a two-shot plan: {why}")));
    let src_kind = if plan.in_place {
        BufKind::Output
    } else {
        BufKind::Input
    };
    let mut segments = Vec::with_capacity(n);
    for rank in 0..n {
        match peer_ops(rank).first() {
            Some(&Op::PeerReduce {
                dst,
                src,
                offset,
                count,
                ranks: Ranks::ALL,
            }) if dst.offset == offset
                && src == src_kind
                && plan.decl(dst.buf).rank == rank
                && plan.decl(dst.buf).kind == BufKind::Output =>
            {
                segments.push((offset, count))
            }
            _ => {
                return bad(format!(
                    "rank {rank} does not start by reducing its own segment"
                ))
            }
        }
    }
    let mut end = 0;
    for (q, &(offset, count)) in segments.iter().enumerate() {
        if offset != end {
            return bad(format!("segment {q} starts at {offset}, not at {end}"));
        }
        end += count;
    }
    if end != plan.count {
        return bad(format!("the segments end at {end}, not at {}", plan.count));
    }
    for rank in 0..n {
        let ops = peer_ops(rank);
        if ops.len() != n {
            return bad(format!(
                "rank {rank} has {} peer reduces, not {n}",
                ops.len()
            ));
        }
        for (round, op) in ops.iter().enumerate().skip(1) {
            let owner = crate::plan::twoshot::gather_from(rank, round, n);
            let (offset, count) = segments[owner];
            let fits = matches!(*op, Op::PeerReduce { dst, src: BufKind::Output, offset: o, count: c, ranks }
                if ranks == Ranks::only(owner)
                    && (o, c) == (offset, count)
                    && (dst.offset, dst.count) == (offset, count)
                    && plan.decl(dst.buf).rank == rank
                    && plan.decl(dst.buf).kind == BufKind::Output);
            if !fits {
                return bad(format!(
                    "rank {rank}'s gather round {round} does not copy segment {owner} from rank {owner}"
                ));
            }
        }
        let program = &plan.ranks[rank];
        let others_ok = program.iter().enumerate().all(|(i, instr)| {
            instr.stream == StreamKind::Main
                && match instr.op {
                    Op::PeerReduce { .. } => true,
                    Op::Scale { .. } => i + 1 == program.len(),
                    _ => false,
                }
        });
        if !others_ok {
            return bad(format!(
                "rank {rank} has work besides its peer reduces and a final scale on Main"
            ));
        }
    }
    Ok(Some(segments))
}

/// Verifies that a one-shot plan has the layout the one-shot kernel assumes: in every meeting,
/// every rank reads every rank (`Ranks::ALL`) over the same source kind and range, so that all
/// ranks launch the same grid and every source is known. (The checker allows more: ranks of a
/// meeting reading different ranges or a subset of ranks, as the two-shot does.)
pub(super) fn oneshot_layout(plan: &Plan) -> Result<()> {
    let meetings = |rank: usize| -> Vec<Op> {
        plan.ranks[rank]
            .iter()
            .map(|i| i.op)
            .filter(|op| matches!(op, Op::PeerReduce { .. }))
            .collect()
    };
    let first = meetings(0);
    for rank in 0..plan.world {
        let mine = meetings(rank);
        if mine.len() != first.len() {
            return Err(Error::PlanRejected(format!(
                "not a one-shot plan: rank {rank} has {} peer reduces, rank 0 {}",
                mine.len(),
                first.len()
            )));
        }
        for (k, (op, op0)) in mine.iter().zip(&first).enumerate() {
            let same = match (*op, *op0) {
                (
                    Op::PeerReduce {
                        src,
                        offset,
                        count,
                        ranks,
                        ..
                    },
                    Op::PeerReduce {
                        src: src0,
                        offset: offset0,
                        count: count0,
                        ..
                    },
                ) => ranks == Ranks::ALL && (src, offset, count) == (src0, offset0, count0),
                _ => false,
            };
            if !same {
                return Err(Error::PlanRejected(format!(
                    "not a one-shot plan: rank {rank}'s peer reduce {k} does not read every rank \
                     over rank 0's range"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{oneshot_layout, twoshot_segments};
    use crate::element::ReduceOp;
    use crate::plan::{BufKind, OneShotSpec, Op, Ranks, TwoShotSpec};

    fn twoshot(world: usize, count: usize, in_place: bool) -> crate::plan::Plan {
        TwoShotSpec {
            world,
            count,
            in_place,
            op: ReduceOp::Avg,
            align: 4,
        }
        .build()
        .unwrap()
    }

    #[test]
    fn twoshot_layout_is_read_from_the_plan_and_tiles_the_buffer() {
        for world in 2..=8 {
            for count in [1, 7, 64, 1001] {
                for in_place in [false, true] {
                    let segments = twoshot_segments(&twoshot(world, count, in_place))
                        .unwrap()
                        .expect("a collective");
                    assert_eq!(segments.len(), world);
                    assert_eq!(segments[0].0, 0);
                    for pair in segments.windows(2) {
                        assert_eq!(pair[0].0 + pair[0].1, pair[1].0);
                    }
                    let (last_offset, last_count) = segments[world - 1];
                    assert_eq!(last_offset + last_count, count);
                }
            }
        }
        assert_eq!(twoshot_segments(&twoshot(1, 10, true)).unwrap(), None);
        assert_eq!(twoshot_segments(&twoshot(3, 0, false)).unwrap(), None);
    }

    #[test]
    fn every_one_shot_collective_has_the_steps_kernels_layout() {
        use crate::plan::Collective;
        for world in 2..=8 {
            let mut all = vec![
                Collective::ReduceScatter,
                Collective::AllGather,
                Collective::AllToAll,
            ];
            for root in [0, world - 1] {
                all.push(Collective::Broadcast { root });
                all.push(Collective::Reduce { root });
            }
            for c in &all {
                for in_place in [false, true] {
                    if in_place && !c.has_in_place() {
                        continue;
                    }
                    let plan = OneShotSpec {
                        world,
                        count: 13,
                        in_place,
                        op: ReduceOp::Avg,
                    }
                    .build_collective(c)
                    .unwrap();
                    let steps = super::steps_layout(&plan)
                        .unwrap_or_else(|e| panic!("{c:?} {world} {in_place}: {e}"))
                        .expect("a collective");
                    // Every rank reads each rank at most once; a gather reads all of them.
                    let most = steps.iter().map(Vec::len).max().unwrap();
                    let want = match c {
                        Collective::AllGather if in_place => world - 1,
                        Collective::AllGather | Collective::AllToAll => world,
                        _ => 1,
                    };
                    assert_eq!(most, want, "{c:?} {world} {in_place}");
                }
            }
        }
        // Two meetings where the second reads what the first wrote: refused.
        let mut plan = OneShotSpec {
            world: 2,
            count: 4,
            in_place: false,
            op: ReduceOp::Sum,
        }
        .build_collective(&Collective::AllGather)
        .unwrap();
        let written = match plan.ranks[0][0].op {
            Op::PeerReduce { dst, .. } => dst,
            _ => unreachable!(),
        };
        if let Op::PeerReduce { src, offset, .. } = &mut plan.ranks[1][1].op {
            *src = BufKind::Output;
            *offset = written.offset;
        }
        assert!(super::steps_layout(&plan).is_err());
    }

    #[test]
    fn plans_the_kernels_do_not_implement_are_refused() {
        // A gather round that copies from the wrong rank.
        let mut wrong_owner = twoshot(3, 12, true);
        if let Op::PeerReduce { ranks, .. } = &mut wrong_owner.ranks[0][1].op {
            *ranks = Ranks::only(2);
        }
        assert!(twoshot_segments(&wrong_owner).is_err());
        // Step 0 reading the input of an in-place plan.
        let mut wrong_source = twoshot(2, 12, true);
        if let Op::PeerReduce { src, .. } = &mut wrong_source.ranks[1][0].op {
            *src = BufKind::Input;
        }
        assert!(twoshot_segments(&wrong_source).is_err());
        // A one-shot plan is not a two-shot plan, and the reverse.
        let oneshot = OneShotSpec {
            world: 2,
            count: 12,
            in_place: false,
            op: ReduceOp::Sum,
        }
        .build()
        .unwrap();
        oneshot_layout(&oneshot).unwrap();
        assert!(twoshot_segments(&oneshot).is_err());
        assert!(oneshot_layout(&twoshot(2, 12, false)).is_err());
    }
}
