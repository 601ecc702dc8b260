//! A peer call on the executor's side: its opening (`CudaExecutor::open_peer_call`: codes an
//! earlier call left reported, pool memory opened to the GPUs that read it), the launch of the
//! two-shot and the steps kernel from a plan's peer reduce, and the arguments of the read, staged
//! or LL one-shot, which `CudaEnqueue::enqueue` launches (their layout verified by module
//! `layout`; module `launch` enqueues a call's ranks), with the time its kernels wait at their
//! barriers (`CudaCall::kernel_timeout_ns`). The words the kernels share are module `peer_words`'.
//!
//! A failed call never leaves a kernel reading the caller's buffers after it returns: a kernel
//! whose peers never arrive gives up after three quarters of the call's timeout and leaves a code
//! in its error word, which the call (or the next one, or `synchronize`) turns into
//! [`Error::Timeout`] (module `error_words`); a call that fails after launching some ranks waits
//! for their kernels to give up before it returns. A kernel that gives up at its start barrier
//! (or the two-shot's middle one) also withdraws its signal (the LL one-shot: the words it
//! pushed), so that a peer's kernel starting later (queued behind work that was stuck) times out
//! too instead of reading this rank's memory (or, LL, writing its own output) after the call has
//! returned its error. (A peer that passed the barrier in the instant before the withdrawal still
//! reads; it is then inside the call's deadline, a quarter of the timeout before the call
//! returns.)
//!
//! Invariant: every rank of a peer call launches its kernel with the same grid, sources and
//! flags, on its Main stream, so that the barriers meet and each block's epoch (kept on the
//! device, advanced by the kernel) moves in step on every rank.

use super::enqueue::CudaEnqueue;
use super::layout::StepLayout;
use super::peer_words::{PeerKernel, PeerWords};
use super::{CudaCall, CudaExecutor};
use crate::error::{Error, Result};
use crate::exec::cuda::kernels::{
    LlArgs, OneShotArgs, PeerStep, StepsArgs, TwoShotArgs, PEER_MAX_RANKS,
};
use crate::plan::{BufKind, Op, Region, StreamKind};

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
            gate: call.gate,
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
                count: step.dst.count as u64,
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
            gate: call.gate,
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

    /// This rank's arguments of the one-shot kernel for the peer reduce `op` into `dst` (a plan
    /// whose layout `oneshot_layout` verified): `kernel`, the read one-shot or the staged
    /// one-shot (the read kernel over host copies, its flags in host memory). `expose_from` is
    /// the fused exposure copy's source (see `CudaEnqueue`'s `expose_from`): the in-place buffer,
    /// or for the staged one-shot also the input out of place. `CudaEnqueue::enqueue` launches
    /// the kernel with them.
    pub(super) fn oneshot_args(
        &self,
        kernel: PeerKernel,
        op: Op,
        dst: Region,
        expose_from: Option<u64>,
    ) -> Result<OneShotArgs> {
        if kernel == PeerKernel::OneShotLl {
            return Err(Error::Internal {
                what: "the read one-shot's arguments asked for the LL one-shot (`ll_args` builds those)"
                    .into(),
            });
        }
        let call = self.call;
        let plan = &*self.plan.plan;
        let shared = self.peer_words(kernel)?;
        let rank = plan.decl(dst.buf).rank;
        let sources = crate::check::peer_sources(plan, &op);
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
            gate: call.gate,
        };
        for (r, src) in sources.into_iter().enumerate() {
            args.srcs[r] = self.addr(src);
            args.flags[r] = shared.flags_of[r];
        }
        Ok(args)
    }

    /// This rank's arguments of the LL one-shot kernel for the peer reduce `op` into `dst`: this
    /// rank's input folded with every peer's, which the kernel pushes to and receives from the
    /// peers' LL buffers.
    ///
    /// This rank's input: out of place, its Input; in place with the exposure copy fused
    /// (`expose_from`, the in-place buffer itself), that buffer, and the copy is dropped: the
    /// plan's Exposed buffer exists only for peers to read in the read one-shot, and the LL
    /// kernel's peers never read this rank's memory (they are sent its words), so the copy has
    /// no reader. The kernel reads each chunk of the in-place buffer before the same thread
    /// overwrites it with the result. In place with the copy enqueued on its own (not fused),
    /// the Exposed buffer holds the input by then, on this stream.
    pub(super) fn ll_args(&self, op: Op, dst: Region, expose_from: Option<u64>) -> Result<LlArgs> {
        let shared = self.peer_words(PeerKernel::OneShotLl)?;
        let rank = self.plan.plan.decl(dst.buf).rank;
        let src = match expose_from {
            Some(in_place) => in_place,
            None => self.addr(crate::check::peer_sources(&self.plan.plan, &op)[rank]),
        };
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
            gate: call.gate,
        };
        for (r, buffer) in recv.iter().enumerate() {
            args.recvs[r] = *buffer;
        }
        Ok(args)
    }
}
