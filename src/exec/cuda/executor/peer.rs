//! The peer kernels on the executor's side: the one-shot and the two-shot all-reduce, one kernel
//! per rank that reads the other ranks' memory directly (peer access) and meets their kernels at
//! flag barriers, and the LL one-shot, which pushes each rank's input into its peers' receive
//! buffers instead ([`crate::exec::cuda::kernels`] launches them; `cuda/peer.cuh` and
//! `cuda/ll.cuh` describe the protocols). Here: the state the kernels share across ranks
//! ([`PeerKernelState`], made by [`setup_peer_kernels`]), the launch of each kernel from a plan's
//! peer reduce (whose layout module `layout` verified), the inline enqueue of plans without
//! events, and the timeouts the kernels report.
//!
//! A one-shot plan's peer reduce runs the LL kernel when the message fits
//! ([`crate::exec::cuda::kernels::ll_fits`]: at most
//! [`LL_MAX_BYTES`](crate::exec::cuda::kernels::LL_MAX_BYTES) per rank), else the read one-shot:
//! the plan is the same (the checker proves its result; both kernels compute it, with the same
//! fold in the same order), only the executor's way of running the meeting differs.
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
//! middle one) also withdraws its signal (the LL one-shot: the words it pushed), so that a peer's
//! kernel starting later (queued behind work that was stuck) times out too instead of reading
//! this rank's memory (or, LL, writing its own output) after the call has returned its error. (A
//! peer that passed the barrier in the instant before the withdrawal still reads; it is then
//! inside the call's deadline, a quarter of the timeout before the call returns.)
//!
//! Invariant: every rank of a peer call launches its kernel with the same grid, sources and
//! flags, on its Main stream, so that the barriers meet and each block's epoch (kept on the
//! device, advanced by the kernel) moves in step on every rank.

use super::ring::{wait_done, CudaEnqueue};
use super::{CudaCall, CudaExecutor, RankRes, Transport};
use crate::device::{self, DeviceBuffer, PinnedHost, Stream};
use crate::error::{Error, Result};
use crate::exec::cuda::kernels::{
    ll_fits, ll_recv_bytes, LlArgs, OneShotArgs, TwoShotArgs, HANDOFF_ERR_BIT, LL_ERR_WAIT,
    PEER_FLAG_BYTES, PEER_MAX_RANKS,
};
use crate::exec::{panic_message, Enqueue};
use crate::plan::{BufKind, Op, Region, StreamKind};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which peer kernel a call launches; names the kernel in its errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PeerKernel {
    OneShot,
    TwoShot,
    /// The LL one-shot: a one-shot plan whose message fits [`ll_fits`].
    OneShotLl,
}

impl PeerKernel {
    /// The kernel that runs a one-shot plan of `count` elements of `dtype`: the LL one-shot when
    /// the message fits it, else the read one-shot. The executor's one rule for it.
    pub(super) fn oneshot_for(dtype: crate::element::DType, count: usize) -> PeerKernel {
        if ll_fits(dtype, count) {
            PeerKernel::OneShotLl
        } else {
            PeerKernel::OneShot
        }
    }
}

impl fmt::Display for PeerKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PeerKernel::OneShot => "one-shot",
            PeerKernel::TwoShot => "two-shot",
            PeerKernel::OneShotLl => "LL one-shot",
        })
    }
}

/// What the peer kernels (one-shot, two-shot, LL one-shot) share across ranks, made once per
/// communicator: per rank, the flag words its peers write at the barriers (device memory,
/// zeroed, reached through peer access), the LL kernel's receive buffer, and a pinned word its
/// kernel sets when it times out. Calls of every kernel share the flags and the per-block epochs
/// in them.
pub(super) struct PeerKernelState {
    flags: Vec<DeviceBuffer>,
    /// Per rank, [`ll_recv_bytes`]`(world)` bytes of device memory, zeroed once: the LL words its
    /// peers push (layout in `cuda/ll.cuh`).
    ll_recv: Vec<DeviceBuffer>,
    errors: Vec<PinnedHost>,
    /// The smallest SM count of the ranks' GPUs: the grid cap that keeps every block resident.
    max_blocks: u32,
}

impl PeerKernelState {
    /// The code rank `rank`'s kernel left (1: start barrier timed out, 2: end barrier, 3: a launch
    /// it could not accept, 4: the two-shot's middle barrier, [`LL_ERR_WAIT`]: the LL one-shot
    /// waited in vain for a peer's words), 0 when none. Read through the host
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

/// Makes the peer kernels' flags, LL receive buffers and error words, after enabling peer access between every pair
/// of GPUs (each rank's kernel reads every rank's memory). `None` where they cannot run:
/// one rank, more than [`PEER_MAX_RANKS`], forced staging, two ranks on one GPU, or a pair
/// without peer access.
pub(super) fn setup_peer_kernels(
    ranks: &[Arc<RankRes>],
    transport: Transport,
) -> Result<Option<Arc<PeerKernelState>>> {
    let n = ranks.len();
    if !(2..=PEER_MAX_RANKS).contains(&n) || transport == Transport::Staged {
        return Ok(None);
    }
    // Two ranks on one GPU (the test-only shared mode) would need both grids resident on one
    // device at once; a block of one spinning for a block of the other that has no SM is a
    // deadlock until the timeout. The peer kernels are for distinct GPUs.
    if (1..n).any(|i| ranks[..i].iter().any(|r| r.device == ranks[i].device)) {
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
    let ll_recv = ranks
        .iter()
        .map(|r| DeviceBuffer::zeroed(&r.ctx, ll_recv_bytes(n)))
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
        .filter_map(|r| sm_counts.get(r.device).map(|d| d.sm_count))
        .min()
        .unwrap_or(1)
        .max(1);
    Ok(Some(Arc::new(PeerKernelState {
        flags,
        ll_recv,
        errors,
        max_blocks,
    })))
}

/// A launch of a later rank's peer kernel this long after the first rank's counts as held up:
/// a launch takes microseconds, so this much is the driver blocked by another thread's call.
const LAUNCH_BLOCKED_AFTER: Duration = Duration::from_millis(100);

impl CudaExecutor {
    /// Opens a call of a peer kernel: reports a barrier timeout an earlier call left, and opens
    /// pool memory to every other GPU — out of place every GPU reads every other GPU's input
    /// (but in the LL one-shot, which reads only its own), and the two-shot also reads every
    /// other GPU's output.
    pub(super) fn open_peer_call(
        &mut self,
        kernel: PeerKernel,
        inputs: Option<&[u64]>,
        outputs: &[u64],
    ) -> Result<()> {
        self.check_peer_errors()?;
        self.last_peer_kernel = kernel;
        let inputs_read = inputs.filter(|_| kernel != PeerKernel::OneShotLl);
        let outputs_read = (kernel == PeerKernel::TwoShot).then_some(outputs);
        for ranked in inputs_read.into_iter().chain(outputs_read) {
            for (rank, &addr) in ranked.iter().enumerate() {
                let own = self.ranks[rank].device;
                let peers: Vec<usize> = self.ranks.iter().map(|r| r.device).collect();
                for peer in peers.into_iter().filter(|&p| p != own) {
                    self.grant_once(addr, peer)?;
                }
            }
        }
        Ok(())
    }

    /// Enqueues a plan without events from the calling thread, rank after rank (each rank's
    /// work goes on its own streams, so the order between ranks does not matter: the peer
    /// kernels meet on the GPUs, whenever each is launched), then waits for completion if asked.
    /// A panic is caught and returned as an error, as on the rank threads.
    pub(super) fn run_inline(&self, call: &CudaCall) -> Result<()> {
        let saved = device::save_current()?;
        let current = std::cell::Cell::new(0usize);
        // When the first rank's kernel was launched: its kernel now waits at a barrier for the
        // others' kernels, so a later rank's launch that takes long is a kernel left waiting.
        let mut first_launched: Option<Instant> = None;
        let mut blocked: Option<(usize, Duration)> = None;
        let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<()> {
            for (rank, res) in self.ranks.iter().enumerate() {
                current.set(rank);
                let enqueued = (|| {
                    device::bind(&res.ctx)?;
                    let mut backend = CudaEnqueue {
                        rank,
                        res,
                        contexts: &self.contexts,
                        call,
                        fuse_exposure: true,
                        held: None,
                    };
                    for (index, instr) in call.prepared.plan.ranks[rank].iter().enumerate() {
                        backend.enqueue(index, instr)?;
                    }
                    backend.flush()?;
                    super::ring::record_done(res, call)
                })();
                let now = Instant::now();
                let late = now - *first_launched.get_or_insert(now);
                if late >= LAUNCH_BLOCKED_AFTER && blocked.is_none_or(|(_, d)| late > d) {
                    blocked = Some((rank, late));
                }
                if let Err(err) = enqueued {
                    // Ranks already launched spin at their barriers until the kernel's timeout
                    // (shorter than the call's deadline); wait for them, so that nothing on a GPU
                    // touches the caller's buffers after this call has returned its error.
                    // (Bounded by the deadline: a stuck stream must not hold the caller.)
                    for earlier in &self.ranks[..=rank] {
                        let main = &earlier.streams[StreamKind::Main.index()];
                        while matches!(device::stream_query(main), Ok(false))
                            && Instant::now() < call.deadline
                        {
                            std::thread::sleep(Duration::from_micros(50));
                        }
                    }
                    return Err(err);
                }
            }
            *self
                .launch_blocked
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = blocked;
            if call.wait_complete {
                for (rank, res) in self.ranks.iter().enumerate() {
                    current.set(rank);
                    wait_done(res, rank, call).map_err(|err| self.name_blocked_launch(err))?;
                }
            }
            Ok(())
        }));
        let restored = saved.restore();
        let result = outcome.unwrap_or_else(|payload| {
            Err(Error::RankFailed {
                rank: current.get(),
                during: "enqueue".into(),
                message: panic_message(&*payload),
            })
        });
        result.and(restored)
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
                    "{waiting_on} (a peer kernel waited for another that did not start: a stuck GPU, a peer's CUDA graph that was not replayed, or another thread's blocking CUDA call on these GPUs — an allocation, a free, a pageable copy — during the call; docs/ERRORS.md, \"Several threads\")"
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
                let (named, gave_up) = peer_timeout(code);
                let kernel = named.unwrap_or(self.last_peer_kernel);
                let Some(gave_up) = gave_up else {
                    let device = r.device;
                    return Err(Error::RankFailed {
                        rank,
                        during: format!("the {kernel} peer reduce"),
                        message: format!(
                            "GPU {device}'s {kernel} kernel found its launch inconsistent \
                             (code {code})"
                        ),
                    });
                };
                let waiting_on = format!(
                    "GPU {}'s {kernel} kernel gave up {gave_up}: a peer's kernel never arrived",
                    r.device,
                );
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

/// What a peer kernel's error code (not a handoff's) says: the kernel it names, when only one
/// kernel writes it (4: the two-shot, [`LL_ERR_WAIT`]: the LL one-shot; otherwise the latest
/// peer call's), and where that kernel gave up waiting — `None` for a launch the kernel refused
/// (3) or a code no kernel writes.
fn peer_timeout(code: u32) -> (Option<PeerKernel>, Option<&'static str>) {
    match code {
        1 => (None, Some("at the start barrier")),
        2 => (None, Some("at the end barrier")),
        4 => (Some(PeerKernel::TwoShot), Some("at the middle barrier")),
        LL_ERR_WAIT => (
            Some(PeerKernel::OneShotLl),
            Some("waiting for a peer's pushed data"),
        ),
        _ => (None, None),
    }
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

    /// Launches this rank's one-shot kernel for the peer reduce `op` into `dst` (a plan whose
    /// layout `oneshot_layout` verified): the LL one-shot when the message fits it
    /// ([`PeerKernel::oneshot_for`]), else the read one-shot. `expose_from` is the fused exposure
    /// copy's source (see `CudaEnqueue::fuse_exposure`).
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
        let sources = crate::check::peer_sources(plan, &op);
        if PeerKernel::oneshot_for(call.dtype, dst.count) == PeerKernel::OneShotLl {
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
            error: shared.errors[rank].uva_ptr(),
            expose_from: expose_from.unwrap_or(0),
            max_blocks: shared.max_blocks,
        };
        for (r, src) in sources.into_iter().enumerate() {
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

    /// Launches this rank's LL one-shot kernel: this rank's input `src` (device memory of this
    /// rank, `dst.count` elements) folded with every peer's into `dst`.
    fn launch_ll(
        &self,
        shared: &PeerKernelState,
        rank: usize,
        src: u64,
        dst: Region,
        stream: &Stream,
    ) -> Result<()> {
        let call = self.call;
        let world = call.prepared.plan.world;
        let mut args = LlArgs {
            recvs: [0; PEER_MAX_RANKS],
            flags: shared.flags[rank].ptr(),
            world: world as u32,
            rank: rank as u32,
            src,
            dst: self.addr(dst),
            count: dst.count as u64,
            timeout_ns: call.kernel_timeout_ns(),
            error: shared.errors[rank].uva_ptr(),
        };
        for (r, recv) in shared.ll_recv.iter().enumerate() {
            args.recvs[r] = recv.ptr();
        }
        // SAFETY: `src` is this rank's input (the caller's validated input, its in-place buffer,
        // or our exposed copy of it, filled earlier on this stream) and `dst` its output, both on
        // this GPU, equal (in place) or disjoint (validated buffers); the receive buffers are
        // ours (ll_recv_bytes(world), zeroed at creation, reached over the peer access enabled
        // between all pairs) and the flags this rank's, both used only by this communicator's
        // peer kernels, all on Main; every rank launches with the same dtype, op and count, so
        // the grids and epochs match; all outlive the communicator's streams.
        unsafe { self.res.kernels.ll(call.dtype, call.op, &args, stream) }
    }
}

#[cfg(test)]
mod tests {
    use super::{peer_timeout, PeerKernel, LL_ERR_WAIT};
    use crate::element::DType;
    use crate::exec::cuda::kernels::LL_MAX_BYTES;

    #[test]
    fn every_peer_code_is_named() {
        assert_eq!(peer_timeout(1), (None, Some("at the start barrier")));
        assert_eq!(peer_timeout(2), (None, Some("at the end barrier")));
        assert_eq!(peer_timeout(4).0, Some(PeerKernel::TwoShot));
        let (kernel, gave_up) = peer_timeout(LL_ERR_WAIT);
        assert_eq!(kernel, Some(PeerKernel::OneShotLl));
        assert_eq!(kernel.unwrap().to_string(), "LL one-shot");
        assert!(gave_up.unwrap().contains("pushed data"));
        assert_eq!(peer_timeout(3), (None, None));
        assert_eq!(peer_timeout(99), (None, None));
    }

    #[test]
    fn the_oneshot_runs_the_ll_kernel_up_to_its_limit() {
        for dtype in DType::ALL {
            let most = LL_MAX_BYTES / dtype.size_bytes();
            assert_eq!(PeerKernel::oneshot_for(dtype, 1), PeerKernel::OneShotLl);
            assert_eq!(PeerKernel::oneshot_for(dtype, most), PeerKernel::OneShotLl);
            assert_eq!(
                PeerKernel::oneshot_for(dtype, most + 1),
                PeerKernel::OneShot
            );
        }
    }
}
