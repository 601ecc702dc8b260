//! A collective on the caller's streams: the entry point of every GPU call, which fences the
//! caller's streams (when given) around the communicator's own Main streams. Main then stands for
//! the caller's stream: the checker's start and completion rules make every access to a caller's
//! buffer follow the work queued before the call and precede the work queued after it.

use super::{capture, pieces, registered, CudaExecutor, Dispatch};
use crate::device::{self, CallerStream};
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::cuda::kernels::CallGate;
use crate::exec::job::{BufferRef, CallShape, CallerRefs};
use crate::exec::Shape;
use crate::plan::{Collective, StreamKind};
use std::borrow::Cow;
use std::time::Instant;

/// A call's streams of the caller, one per rank of the executor, each of its rank's GPU and
/// context: made only by [`CudaExecutor::check_caller_streams`], so that a call's streams are
/// checked once, by whoever begins the call.
#[derive(Clone, Copy)]
pub(crate) struct CallerStreams<'a>(&'a [CallerStream]);

impl<'a> CallerStreams<'a> {
    /// Whether the caller's streams are being captured into a CUDA graph (module `capture`).
    pub(super) fn capturing(self) -> Result<bool> {
        capture::capturing(self.0)
    }

    /// The streams, by rank of the executor.
    pub(super) fn streams(self) -> &'a [CallerStream] {
        self.0
    }
}

/// How a call is made, beside its shape and buffers: its operator, whether it returns only once
/// complete, and the caller's streams it is ordered on (none: the communicator's own).
#[derive(Clone, Copy)]
pub(super) struct CallMode<'a> {
    pub(super) op: ReduceOp,
    pub(super) wait_complete: bool,
    pub(super) caller: Option<CallerStreams<'a>>,
}

/// A call published and checked ([`CudaExecutor::run`]'s first step): the shape it runs
/// (registered where every rank's buffers are), every buffer's address as this rank reaches it
/// (laid out as [`crate::exec::caller_address`] lays them out), and the gate its peer kernel
/// passes first ([`CallGate::NONE`] where nothing is checked on the GPU).
pub(super) struct Checked<'a> {
    pub(super) shape: Shape,
    pub(super) inputs: Cow<'a, [u64]>,
    pub(super) outputs: Cow<'a, [u64]>,
    pub(super) gate: CallGate,
}

impl CudaExecutor {
    /// Runs one collective of `shape` over device buffers (addresses laid out as
    /// [`crate::exec::caller_address`] lays them out; `inputs` empty in place).
    ///
    /// # Safety
    /// Every caller's buffer the plan of `shape` declares is a device address on its rank's GPU,
    /// valid for the declared length; written buffers overlap nothing else in the call; nothing
    /// else touches them (or writes the ones read) until the call is complete — when this returns
    /// if `wait_complete`, else once each rank's Main stream has passed the call.
    ///
    /// With `caller` streams (one per rank, enqueue only), the call starts after the work already
    /// queued on each and later work there waits for it: an event recorded on the caller's
    /// stream that Main waits for, and one recorded on Main after the call that the caller's
    /// stream waits for — Main stands for the caller's stream, which the checker's start and
    /// completion rules make exact. Events made once per rank; no host synchronisation. When the
    /// caller's streams are being captured, the collective becomes part of the caller's
    /// graph(s) (module `capture`).
    ///
    /// Over a fabric between processes the call is published to the peers
    /// (`Fabric::publish_call`) and checked against theirs before anything touches their
    /// memory: on the GPU, by the call gate at the start of the call's peer kernel
    /// (`Fabric::gate`, `kernels::CallGate`: the kernel returns before touching a peer's memory
    /// when the gate fails; copies could not), when the shape is prepared as a peer kernel (by
    /// an earlier call, or alone: `prepare_alone`) and the call is not being captured — so the
    /// call returns once enqueued, one launch, whatever the peers' hosts are doing (on symmetric
    /// registrations it runs on them, the gate comparing every rank's refs; on others it
    /// copies: module `registered`); else on the host (`Fabric::meet_call`), which waits for
    /// every peer to publish it (a shape's first call is then prepared with the peers;
    /// registered buffers are exchanged; a capture is checked once, for every replay). Either way ranks that make different calls all get
    /// [`Error::CallMismatch`] — from the call itself, or from the communicator's next call,
    /// `synchronize` or async error when the gate found it. A failure is told to the peers
    /// (`Fabric::fail`), and a blocking call's completion too.
    ///
    /// A call too large for the arenas, which every rank would otherwise prepare with its
    /// peers, runs as pieces that fit them (module `pieces`); a collective of no elements
    /// across processes runs nothing and meets no one.
    ///
    /// The call in three steps, each a function: `checked_call` (published and checked),
    /// `ready_call` (its plan prepared, its buffers laid out: module `run_on_main`), then the
    /// launch — `run_inline` (from this thread: module `launch`) or `run_on_rank_threads`.
    pub(crate) unsafe fn run<T: Element>(
        &mut self,
        shape: Shape,
        inputs: &[u64],
        outputs: &[u64],
        op: ReduceOp,
        wait_complete: bool,
        caller: Option<CallerStreams<'_>>,
    ) -> Result<()> {
        // A collective of no elements moves nothing: across processes it returns at once,
        // published to no peer (as NCCL discards empty collectives), so ranks that all make it
        // stay in step without meeting.
        let empty = shape.count == 0 && !matches!(shape.collective, Collective::SendRecv { .. });
        if empty && !self.in_one_process() {
            self.last_ran = None;
            return Ok(());
        }
        let mode = CallMode {
            op,
            wait_complete,
            caller,
        };
        match self.pieces_of(&shape, inputs, outputs) {
            // SAFETY: our caller's contract, passed on.
            Some(all) => unsafe { self.run_in_pieces::<T>(all, mode) },
            // SAFETY: as above.
            None => unsafe { self.run_one::<T>(shape, inputs, outputs, mode) },
        }
    }

    /// [`CudaExecutor::run`] of one call, whole or a piece of one (`Shape::piece_of`).
    ///
    /// # Safety
    /// As for [`CudaExecutor::run`].
    pub(super) unsafe fn run_one<T: Element>(
        &mut self,
        shape: Shape,
        inputs: &[u64],
        outputs: &[u64],
        mode: CallMode<'_>,
    ) -> Result<()> {
        let CallMode {
            op,
            wait_complete,
            caller,
        } = mode;
        let caller = caller.map(|streams| streams.0);
        let captured = match caller {
            Some(streams) => capture::capturing(streams)?,
            None => false,
        };
        let result = self
            .checked_call::<T>(shape, inputs, outputs, op, captured)
            .and_then(|checked| {
                // A capture: the plan (prepared by an earlier call) is refused if it cannot be
                // captured before any stream joins the capture, and pinned, since the graph
                // will hold its memory.
                if captured {
                    self.pin_for_capture(checked.shape.clone())?;
                }
                let saved = caller.map(|_| device::save_current()).transpose()?;
                let launched = caller
                    .map_or(Ok(()), |streams| self.fence_in(streams))
                    // SAFETY: our caller's contract for this rank's buffers; a registered call's
                    // peer buffers as `checked_call` says.
                    .and_then(|()| unsafe {
                        self.ready_call::<T>(checked, op, wait_complete, captured)
                    })
                    .and_then(|ready| match ready.launching {
                        Some(launching) => {
                            self.run_inline(&ready.call, launching, &ready.prepared.schedule)
                        }
                        None => self.run_on_rank_threads(&ready.call, &ready.done),
                    });
                // Also after a failure: the caller's stream must not run ahead of what was
                // enqueued.
                let fenced = caller.map_or(Ok(()), |streams| self.fence_out(streams));
                launched
                    .and(fenced)
                    .and(saved.map_or(Ok(()), |saved| saved.restore()))
            });
        match &result {
            Err(err) => self.fabric.fail(err),
            Ok(()) if wait_complete => self.fabric.finished(),
            Ok(()) => {}
        }
        result
    }

    /// The first step of [`CudaExecutor::run`]: the call published to the peers and checked —
    /// gated (the GPU checks it: the returned gate) or met on the host — and, where every rank's
    /// buffers are registered, the shape and addresses it runs on them with.
    ///
    /// The peers' buffers in the returned addresses are their callers' buffers of this same call
    /// (published for it — met, or, gated, at refs the gate finds equal to this rank's before the
    /// kernel touches any), in memory they registered and this rank mapped, valid for the plan's
    /// lengths (`Registrations::address`), and borrowed by their callers until their part of the
    /// call is complete — which waits for every rank's reads and writes of them (the plan's
    /// completion rule).
    fn checked_call<'a, T: Element>(
        &mut self,
        shape: Shape,
        inputs: &'a [u64],
        outputs: &'a [u64],
        op: ReduceOp,
        captured: bool,
    ) -> Result<Checked<'a>> {
        let timeout = self.config.timeout;
        let deadline = Instant::now() + timeout;
        let refs = self.own_refs(&shape, inputs, outputs);
        let symmetric = self.symmetric_at(&shape, &refs);
        let gated_shape = Shape {
            registered: symmetric,
            ..shape.clone()
        };
        let call = CallShape::of(&gated_shape, T::DTYPE, op).captured(captured);
        // The gate stops kernels only: a plan of the copy engines (the ring, send/recv) meets,
        // as does a capture (checked once, for every replay). A shape's first call that every
        // rank prepares alone (a kernel plan across processes that fits the arenas, which exist
        // only where every process gates its calls: `prepare_alone`) is prepared here, before
        // it is published, and gated like any later call — it meets no peer. A capture is
        // prepared alike, so the ranks' plan caches move in step whoever captures.
        let prepared = match self.prepared(&gated_shape) {
            Some(prepared) => Some(prepared),
            None => self.prepare_alone(&gated_shape)?,
        };
        let gate = prepared
            .filter(|p| !captured && !matches!(*p.dispatch, Dispatch::CopyEngines))
            .and_then(|_| self.fabric.gate());
        // A gated call publishes refs every rank's gate compares: its registered buffers', or
        // "unregistered" for every buffer (a call that copies needs no peer to know where its
        // buffers lie; a peer that meets instead reads that it copies).
        let refs = match (&gate, symmetric) {
            (Some(_), false) => CallerRefs {
                input: BufferRef::Unregistered,
                output: BufferRef::Unregistered,
            },
            _ => refs,
        };
        // A failure an earlier call's kernels left is reported (and told to the peers, by
        // `run`) before this call is published — or, where it is the peers giving this very
        // call up because their gates found it different, that mismatch.
        if !self.in_one_process() {
            self.check_error_words().map_err(|err| match err {
                Error::CallMismatch { .. } => err,
                _ => self.fabric.mismatch_of_next(call).unwrap_or(err),
            })?;
        }
        let seq = self
            .fabric
            .publish_call(call, refs, gate.is_some(), deadline, timeout)?;
        let gated = gate.map(|gate| CallGate {
            seq,
            layout: match symmetric {
                true => gate.layout.with_refs(),
                false => gate.layout,
            },
            ..gate
        });
        // A gated call is checked on the GPU; on registered memory, every rank's buffers lie
        // where this rank's do (the gate compares the refs).
        let all = match gated {
            Some(_) if symmetric => vec![refs; self.world],
            Some(_) => Vec::new(),
            None => {
                let all = self.fabric.meet_call(seq, call, deadline, timeout)?;
                self.symmetric_refs(all, refs, symmetric, call)?
            }
        };
        let gate = self.call_gate(gated);
        // (A strided piece's blocks are copied, whatever they lie in: module `pieces`.)
        if pieces::strided(&shape) || !registered::runs_registered(&all) {
            return Ok(Checked {
                shape,
                inputs: Cow::Borrowed(inputs),
                outputs: Cow::Borrowed(outputs),
                gate,
            });
        }
        // Every rank's buffers are registered: the call runs on them, peers' included.
        let (inputs, outputs) = self.registered_addresses(&shape, &all, inputs, outputs)?;
        Ok(Checked {
            shape: Shape {
                registered: true,
                ..shape
            },
            inputs: Cow::Owned(inputs),
            outputs: Cow::Owned(outputs),
            gate,
        })
    }

    /// Orders each rank's Main stream after the work queued on the caller's stream so far.
    pub(super) fn fence_in(&self, streams: &[CallerStream]) -> Result<()> {
        for (res, stream) in self.ranks.iter().map(|r| &*r.res).zip(streams) {
            // SAFETY: the stream is live (borrowed) and of the rank's context (checked by
            // `check_caller_streams`, the one maker of `CallerStreams`).
            unsafe { device::record_on_raw_stream(&res.fence_in, stream.raw()) }?;
            device::wait(&res.streams[StreamKind::Main.index()], &res.fence_in)?;
        }
        Ok(())
    }

    /// Orders the work queued on each caller's stream from now on after the rank's Main stream.
    pub(super) fn fence_out(&self, streams: &[CallerStream]) -> Result<()> {
        for (res, stream) in self.ranks.iter().map(|r| &*r.res).zip(streams) {
            device::record(&res.fence_out, &res.streams[StreamKind::Main.index()])?;
            // SAFETY: as in `fence_in`.
            unsafe { device::wait_on_raw_stream(&res.ctx, stream.raw(), &res.fence_out) }?;
        }
        Ok(())
    }

    /// The call gate that this process's one rank's peer kernel passes first, when `gated` (the
    /// fabric's gate with the call's number): the kernel's blocks touch no peer's
    /// memory unless every peer published the same call (`cuda/gate.cuh`).
    fn call_gate(&self, gated: Option<CallGate>) -> CallGate {
        match (gated, &self.ranks[..]) {
            (Some(gate), [_]) => gate,
            _ => CallGate::NONE,
        }
    }

    /// The refs a met call runs by: every rank's as published, while a registration is not
    /// symmetric; under symmetric registrations (every rank's decision alike: the shapes the
    /// meeting compared carry it) none where the call copies, and where it runs on them, every
    /// rank's — which must be this rank's `refs`, as the gate would demand of a later call
    /// (else [`Error::CallMismatch`], naming the first rank that differs).
    fn symmetric_refs(
        &self,
        all: Vec<CallerRefs>,
        refs: CallerRefs,
        symmetric: bool,
        call: CallShape,
    ) -> Result<Vec<CallerRefs>> {
        if !self.registrations.all_symmetric() {
            return Ok(all);
        }
        if !symmetric {
            return Ok(Vec::new());
        }
        match all.iter().position(|r| *r != refs) {
            None => Ok(all),
            Some(q) => Err(Error::CallMismatch {
                rank: q,
                theirs: format!("{}, {}", call.describe(), all[q].describe()),
                this: self.ranks[0].rank(),
                ours: format!("{}, {}", call.describe(), refs.describe()),
            }),
        }
    }

    /// Whether a call of `shape` on `inputs` and `outputs` runs on symmetric registrations.
    pub(super) fn runs_symmetric(&self, shape: &Shape, inputs: &[u64], outputs: &[u64]) -> bool {
        self.symmetric_at(shape, &self.own_refs(shape, inputs, outputs))
    }

    /// Whether a call of `shape` whose buffers lie at `refs` runs on symmetric registrations:
    /// this rank decides alone that it does (its peers' buffers at its own offsets:
    /// `Registrations::symmetric_call`). The decision is part of the call's shape, so ranks that
    /// decide differently make different calls (named by the meeting or the gate, before
    /// anything is prepared or touched), and the gate then compares the refs too. (A
    /// broadcast's or reduce's ranks pass different buffers: they copy; so does a strided
    /// piece, whose blocks lie beyond the run its refs describe: module `pieces`; and every
    /// call where the GPUs do not all reach each other, whose peers reach only host memory.)
    fn symmetric_at(&self, shape: &Shape, refs: &CallerRefs) -> bool {
        self.peers_ok
            && !pieces::strided(shape)
            && !matches!(
                shape.collective,
                Collective::Broadcast { .. } | Collective::Reduce { .. }
            )
            && self.registrations.symmetric_call(refs)
    }

    /// Where this process's rank's buffers of a call of `shape` lie ([`CallerRefs`]); with
    /// every rank in this process, nothing to publish.
    fn own_refs(&self, shape: &Shape, inputs: &[u64], outputs: &[u64]) -> CallerRefs {
        if self.in_one_process() {
            return CallerRefs::default();
        }
        if matches!(shape.collective, Collective::SendRecv { .. }) {
            // A buffer per transfer: copied (registration covers the collectives).
            return CallerRefs {
                input: BufferRef::Unregistered,
                output: BufferRef::Unregistered,
            };
        }
        let rank = self.ranks[0].rank();
        let (input_bytes, output_bytes) = self.buffer_bytes(shape, rank);
        let at = |list: &[u64]| list.get(rank).copied().unwrap_or(0);
        let find = |addr: u64, bytes: usize| -> BufferRef {
            match addr {
                0 => BufferRef::Absent,
                _ if self.registrations.is_empty() => BufferRef::Unregistered,
                // (A driver that cannot say where the buffer lies: the call copies it.)
                _ => device::pointer_allocation(addr).map_or(BufferRef::Unregistered, |current| {
                    self.registrations.find(addr, bytes, current)
                }),
            }
        };
        let (input, output) = (at(inputs), at(outputs));
        // An out-of-place call on overlapping buffers (NCCL's in-place forms, which
        // ringreduce-nccl passes as out-of-place calls) cannot run on them directly: its plan
        // may write the output before it has read all of the input. It copies, as it would
        // unregistered.
        let output = match registered::overlap((input, input_bytes), (output, output_bytes)) {
            true => BufferRef::Unregistered,
            false => find(output, output_bytes),
        };
        CallerRefs {
            input: find(input, input_bytes),
            output,
        }
    }

    /// The bytes of rank `rank`'s input and output (the in-place buffer) in a call of `shape`.
    fn buffer_bytes(&self, shape: &Shape, rank: usize) -> (usize, usize) {
        let c = &shape.collective;
        let bytes = |blocks: Option<usize>| blocks.unwrap_or(0) * shape.elem_bytes;
        match shape.in_place {
            true => (0, bytes(Some(c.in_place_len(self.world, shape.count)))),
            false => (
                bytes(c.input_len(rank, self.world, shape.count)),
                bytes(c.output_len(rank, self.world, shape.count)),
            ),
        }
    }

    /// Every rank's buffers of a registered call as this rank reaches them: its own as given,
    /// every peer's from the refs it published (`all`, by rank).
    fn registered_addresses(
        &self,
        shape: &Shape,
        all: &[CallerRefs],
        inputs: &[u64],
        outputs: &[u64],
    ) -> Result<(Vec<u64>, Vec<u64>)> {
        let own = self.ranks[0].rank();
        let (mut ins, mut outs) = (inputs.to_vec(), outputs.to_vec());
        ins.resize(self.world, 0);
        outs.resize(self.world, 0);
        for (q, refs) in all.iter().enumerate().filter(|&(q, _)| q != own) {
            let (input_bytes, output_bytes) = self.buffer_bytes(shape, q);
            ins[q] = self.registrations.address(q, refs.input, input_bytes)?;
            outs[q] = self.registrations.address(q, refs.output, output_bytes)?;
        }
        Ok((ins, outs))
    }

    /// Each caller's stream belongs to its rank's GPU, in the context ringreduce uses there (the
    /// device's primary context, as cudarc's `CudaContext::new` gives): the streams, checked, for
    /// [`CudaExecutor::run`]. Bad streams are the caller's mistake: refused before the peers hear
    /// of the call.
    pub(crate) fn check_caller_streams<'a>(
        &self,
        streams: &'a [CallerStream],
    ) -> Result<CallerStreams<'a>> {
        if streams.len() != self.ranks.len() {
            return Err(Error::WorldMismatch {
                world: self.ranks.len(),
                got: streams.len(),
            });
        }
        for (rank, (res, stream)) in self.ranks.iter().map(|r| &r.res).zip(streams).enumerate() {
            if stream.device() != res.device {
                return Err(Error::WrongDevice {
                    rank,
                    device: stream.device(),
                    expected: res.device,
                });
            }
            if stream.context() != res.ctx.cu_ctx() {
                return Err(Error::InvalidArgument(format!(
                    "rank {rank}'s stream is in another context of device {}: use the device's primary context (cudarc's CudaContext::new)",
                    res.device
                )));
            }
        }
        Ok(CallerStreams(streams))
    }
}
