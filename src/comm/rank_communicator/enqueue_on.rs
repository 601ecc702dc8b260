//! The enqueue calls of a GPU [`RankCommunicator`], shaped like [`crate::Communicator`]'s: the
//! collective is ordered on the caller's stream — a cudarc stream (`&Arc<CudaStream>`) or a raw
//! `cudaStream_t` a C caller passed ([`CallerStream::from_raw`]), anything that is
//! `Into<CallerStream>` — and the call returns once it is enqueued, or captured into the caller's
//! CUDA graph: [`RankCommunicator::enqueue_collective`] (out of place),
//! [`RankCommunicator::enqueue_collective_in_place`], [`RankCommunicator::enqueue_send_recv`],
//! the all-reduce's shorthands (named as `Communicator`'s), and
//! [`RankCommunicator::synchronize`], which waits for what they enqueued.

use super::ends::Ends;
use super::{broken, guarded, Inner, RankCommunicator};
use crate::buffer::{Buffer, BufferMut};
use crate::device::CallerStream;
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::Shape;
use crate::plan::{BufKind, Collective, Transfer};

impl RankCommunicator {
    /// [`RankCommunicator::collective`] on a GPU rank, ordered on the caller's `stream`: see
    /// [`RankCommunicator::enqueue_collective_in_place`]. `input` is this rank's input where the
    /// collective reads one (a broadcast's root alone), `output` its output where it writes one
    /// (a reduce's root alone).
    ///
    /// # Safety
    /// `input` and `output` must stay allocated until `stream` has passed the collective, `input`
    /// unwritten and `output` untouched (on any stream or the host) meanwhile, except by work
    /// queued on `stream` after this call; `stream` is live until the call has returned;
    /// captured, the buffers must stay allocated, and this communicator open, while the graph
    /// may be replayed.
    pub unsafe fn enqueue_collective<
        T: Element,
        I: Buffer<T> + ?Sized,
        O: BufferMut<T> + ?Sized,
    >(
        &mut self,
        collective: &Collective,
        input: Option<&I>,
        output: Option<&mut O>,
        op: ReduceOp,
        stream: impl Into<CallerStream>,
    ) -> Result<()> {
        let (shape, ends) = self.out_of_place(collective, input, output, op)?;
        // SAFETY: our caller's contract, passed on.
        unsafe { self.enqueue_on::<T>(shape, ends, op, stream.into()) }
    }

    /// [`RankCommunicator::collective_in_place`] on a GPU rank, ordered on the caller's `stream`
    /// (of this rank's GPU, in its primary context): it starts after the work already queued
    /// there and the work queued there later waits for it, with no host synchronisation; it
    /// returns once enqueued. When `stream` is being captured into a CUDA graph, the collective
    /// becomes part of the graph (every rank must capture and replay its own alike).
    ///
    /// # Safety
    /// `buf` must stay allocated and untouched (no reads, no writes, on any stream or the host)
    /// until `stream` has passed the collective, except by work queued on `stream` after this
    /// call; `stream` is live until the call has returned; captured, `buf` must stay allocated,
    /// and this communicator open, while the graph may be replayed.
    pub unsafe fn enqueue_collective_in_place<T: Element, B: BufferMut<T> + ?Sized>(
        &mut self,
        collective: &Collective,
        buf: &mut B,
        op: ReduceOp,
        stream: impl Into<CallerStream>,
    ) -> Result<()> {
        let shape = self.in_place_shape::<T, B>(collective, buf, op)?;
        let ends = Ends {
            reads: Vec::new(),
            writes: vec![(BufKind::Output, buf.address_mut(), buf.count())],
        };
        // SAFETY: our caller's contract, passed on.
        unsafe { self.enqueue_on::<T>(shape, ends, op, stream.into()) }
    }

    /// [`RankCommunicator::all_reduce`] ordered on the caller's `stream`: see
    /// [`RankCommunicator::enqueue_collective_in_place`].
    ///
    /// # Safety
    /// As for [`RankCommunicator::enqueue_collective`].
    pub unsafe fn enqueue_all_reduce_on<
        T: Element,
        I: Buffer<T> + ?Sized,
        O: BufferMut<T> + ?Sized,
    >(
        &mut self,
        input: &I,
        output: &mut O,
        op: ReduceOp,
        stream: impl Into<CallerStream>,
    ) -> Result<()> {
        // SAFETY: our caller's contract, passed on.
        unsafe {
            self.enqueue_collective(
                &Collective::AllReduce,
                Some(input),
                Some(output),
                op,
                stream,
            )
        }
    }

    /// [`RankCommunicator::all_reduce_in_place`] ordered on the caller's `stream`: see
    /// [`RankCommunicator::enqueue_collective_in_place`].
    ///
    /// # Safety
    /// As for [`RankCommunicator::enqueue_collective_in_place`].
    pub unsafe fn enqueue_all_reduce_in_place_on<T: Element, B: BufferMut<T> + ?Sized>(
        &mut self,
        buf: &mut B,
        op: ReduceOp,
        stream: impl Into<CallerStream>,
    ) -> Result<()> {
        // SAFETY: our caller's contract, passed on.
        unsafe { self.enqueue_collective_in_place(&Collective::AllReduce, buf, op, stream) }
    }

    /// [`RankCommunicator::send_recv`] on a GPU rank, ordered on the caller's `stream` (see
    /// [`RankCommunicator::enqueue_collective_in_place`]).
    ///
    /// # Safety
    /// Every buffer stays allocated until the stream has passed the call, the sends unwritten
    /// and the receives untouched meanwhile except by work queued on the stream after this
    /// call; `stream` stays live until the call has returned.
    pub unsafe fn enqueue_send_recv<T: Element, I: Buffer<T> + ?Sized, O: BufferMut<T> + ?Sized>(
        &mut self,
        transfers: &[Transfer],
        sends: &[&I],
        recvs: &mut [&mut O],
        stream: impl Into<CallerStream>,
    ) -> Result<()> {
        let (shape, ends) = self.send_recv_ends(transfers, sends, recvs)?;
        // SAFETY: our caller's contract, passed on.
        unsafe { self.enqueue_on::<T>(shape, ends, ReduceOp::Sum, stream.into()) }
    }

    /// Waits for every collective this rank has enqueued (on a host rank, every call has
    /// completed already), with the first error they met — a peer lost meanwhile among them.
    pub fn synchronize(&mut self) -> Result<()> {
        broken(&self.broken)?;
        match &mut self.inner {
            Inner::Host(_) | Inner::Hosts(_) => Ok(()),
            Inner::Gpu { exec, .. } => guarded(&mut self.broken, || exec.synchronize()),
            Inner::GpuHosts(inner) => guarded(&mut self.broken, || inner.wait()),
        }
    }

    /// Enqueues the call of `shape` on this GPU rank's `ends`, ordered on `stream`.
    ///
    /// # Safety
    /// The ends are this rank's checked buffers (`placed`, `count_of`), which stay allocated
    /// and untouched as [`RankCommunicator::enqueue_collective`] says.
    unsafe fn enqueue_on<T: Element>(
        &mut self,
        shape: Shape,
        ends: Ends,
        op: ReduceOp,
        stream: CallerStream,
    ) -> Result<()> {
        broken(&self.broken)?;
        let (inputs, outputs) = self.addresses(&shape, &ends);
        match &mut self.inner {
            Inner::Gpu { exec, .. } => {
                let streams = [stream];
                // Bad streams are the caller's mistake: refused without breaking the
                // communicator.
                let streams = exec.check_caller_streams(&streams)?;
                guarded(&mut self.broken, || {
                    // SAFETY: every address is this rank's buffer on its GPU, valid for the
                    // length the plan declares; its lifetime until `stream` passes the call is
                    // our caller's contract.
                    unsafe { exec.run::<T>(shape, &inputs, &outputs, op, false, Some(streams)) }
                })
            }
            // SAFETY: as above.
            Inner::GpuHosts(inner) => guarded(&mut self.broken, || unsafe {
                inner.run::<T>(shape, &inputs, &outputs, op, false, Some(stream))
            }),
            Inner::Host(_) | Inner::Hosts(_) => Err(Error::InvalidArgument(
                "a host rank has no streams: the caller's stream needs a GPU rank".into(),
            )),
        }
    }
}
