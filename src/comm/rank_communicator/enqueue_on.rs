//! The enqueue calls of a GPU [`RankCommunicator`], shaped like [`crate::Communicator`]'s: the
//! collective is ordered on the caller's stream — a cudarc stream (`&Arc<CudaStream>`) or a raw
//! `cudaStream_t` a C caller passed ([`CallerStream::from_raw`]), anything that is
//! `Into<CallerStream>` — and the call returns once it is enqueued, or captured into the caller's
//! CUDA graph: [`RankCommunicator::enqueue_collective`] (out of place),
//! [`RankCommunicator::enqueue_collective_in_place`], [`RankCommunicator::enqueue_send_recv`],
//! the all-reduce's shorthands (named as `Communicator`'s), and
//! [`RankCommunicator::synchronize`], which waits for what they enqueued.
//!
//! Each is two steps, which a caller may also take apart: the call checked against this rank's
//! buffers ([`RankCommunicator::checked_collective`], `checked_in_place`, `checked_send_recv`:
//! a [`RankCall`]), then [`RankCommunicator::enqueue`]. The NCCL API takes them so.

use super::ends::Ends;
use super::{broken, guarded, Inner, RankCommunicator};
use crate::buffer::{Buffer, BufferMut};
use crate::device::CallerStream;
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::Shape;
use crate::plan::{BufKind, Collective, Transfer};
use std::marker::PhantomData;

/// One call of a rank, checked against its communicator and buffers: the collective's shape and
/// this rank's buffers, borrowed for `'a` (out of the caller's reach until the call is enqueued
/// by [`RankCommunicator::enqueue`]).
pub struct RankCall<'a, T: Element> {
    shape: Shape,
    ends: Ends,
    op: ReduceOp,
    /// The rank, world and device (`None`: a host rank) it was checked for: the placement of its
    /// buffers was checked against that device.
    whose: Whose,
    buffers: PhantomData<&'a mut [T]>,
}

impl RankCommunicator {
    /// The call of `collective` out of place, checked: the collective against the world, each
    /// buffer's length against [`Collective`]'s table, its placement. `input` is this rank's
    /// input where the collective reads one (a broadcast's root alone), `output` its output where
    /// it writes one (a reduce's root alone).
    pub fn checked_collective<'a, T: Element, I: Buffer<T> + ?Sized, O: BufferMut<T> + ?Sized>(
        &self,
        collective: &Collective,
        input: Option<&'a I>,
        output: Option<&'a mut O>,
        op: ReduceOp,
    ) -> Result<RankCall<'a, T>> {
        let (shape, ends) = self.out_of_place(collective, input, output, op)?;
        Ok(self.call_of(shape, ends, op))
    }

    /// The call of `collective` in place on `buf`, checked (as
    /// [`RankCommunicator::checked_collective`]).
    pub fn checked_in_place<'a, T: Element, B: BufferMut<T> + ?Sized>(
        &self,
        collective: &Collective,
        buf: &'a mut B,
        op: ReduceOp,
    ) -> Result<RankCall<'a, T>> {
        let shape = self.in_place_shape::<T, B>(collective, buf, op)?;
        let ends = Ends {
            reads: Vec::new(),
            writes: vec![(BufKind::Output, buf.address_mut(), buf.count())],
        };
        Ok(self.call_of(shape, ends, op))
    }

    /// The group of sends and receives `transfers`, checked: this rank's `sends` and `recvs`, in
    /// the order of its transfers.
    pub fn checked_send_recv<'a, T: Element, I: Buffer<T> + ?Sized, O: BufferMut<T> + ?Sized>(
        &self,
        transfers: &[Transfer],
        sends: &[&'a I],
        recvs: &'a mut [&mut O],
    ) -> Result<RankCall<'a, T>> {
        let (shape, ends) = self.send_recv_ends(transfers, sends, recvs)?;
        Ok(self.call_of(shape, ends, ReduceOp::Sum))
    }

    /// This communicator as a checked call names it: rank, world, device.
    fn whose(&self) -> Whose {
        (self.rank, self.world, self.device())
    }

    fn call_of<'a, T: Element>(&self, shape: Shape, ends: Ends, op: ReduceOp) -> RankCall<'a, T> {
        RankCall {
            shape,
            ends,
            op,
            whose: self.whose(),
            buffers: PhantomData,
        }
    }

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
        let call = self.checked_collective(collective, input, output, op)?;
        // SAFETY: our caller's contract, passed on.
        unsafe { self.enqueue(call, stream) }
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
        let call = self.checked_in_place(collective, buf, op)?;
        // SAFETY: our caller's contract, passed on.
        unsafe { self.enqueue(call, stream) }
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
        let call = self.checked_send_recv(transfers, sends, recvs)?;
        // SAFETY: our caller's contract, passed on.
        unsafe { self.enqueue(call, stream) }
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

    /// Enqueues `call` on this GPU rank, ordered on the caller's `stream` (see
    /// [`RankCommunicator::enqueue_collective_in_place`]). A call checked for another rank, world
    /// or device (another communicator's, whose buffers were placed for its GPU) is
    /// [`Error::InvalidArgument`].
    ///
    /// # Safety
    /// The call's buffers stay allocated until `stream` has passed the call, its inputs unwritten
    /// and its outputs untouched (on any stream or the host) meanwhile, except by work queued on
    /// `stream` after this call; `stream` is live until the call has returned; captured, the
    /// buffers must stay allocated, and this communicator open, while the graph may be replayed.
    pub unsafe fn enqueue<T: Element>(
        &mut self,
        call: RankCall<'_, T>,
        stream: impl Into<CallerStream>,
    ) -> Result<()> {
        broken(&self.broken)?;
        same_communicator(call.whose, self.whose())?;
        let (shape, op, stream) = (call.shape, call.op, stream.into());
        let (inputs, outputs) = self.addresses(&shape, &call.ends);
        match &mut self.inner {
            Inner::Gpu { exec, .. } => {
                let streams = [stream];
                // Bad streams are the caller's mistake: refused without breaking the
                // communicator.
                let streams = exec.check_caller_streams(&streams)?;
                guarded(&mut self.broken, || {
                    // SAFETY: every address is this rank's buffer on its GPU (placed when the
                    // call was checked, for this rank, world and device: compared above), valid
                    // for the length the plan declares; its lifetime until `stream` passes the
                    // call is our caller's contract.
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

/// A rank as a checked call names it: rank, world, device (`None`: a host rank).
type Whose = (usize, usize, Option<usize>);

/// `Ok` where a call checked for `checked` is enqueued on the same rank, world and device `here`;
/// else [`Error::InvalidArgument`] naming both.
fn same_communicator(checked: Whose, here: Whose) -> Result<()> {
    if checked == here {
        return Ok(());
    }
    let name = |(rank, world, device): Whose| match device {
        Some(d) => format!("rank {rank} of {world} on GPU {d}"),
        None => format!("host rank {rank} of {world}"),
    };
    Err(Error::InvalidArgument(format!(
        "a call checked for {} enqueued on {}",
        name(checked),
        name(here)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checked_call_runs_only_where_it_was_checked() {
        assert_eq!(same_communicator((0, 2, Some(1)), (0, 2, Some(1))), Ok(()));
        // Same rank and world, another GPU (a split of one process's ranks): its buffers were
        // placed for GPU 0.
        assert_eq!(
            same_communicator((0, 2, Some(0)), (0, 2, Some(1))),
            Err(Error::InvalidArgument(
                "a call checked for rank 0 of 2 on GPU 0 enqueued on rank 0 of 2 on GPU 1".into()
            ))
        );
        for (checked, here) in [
            ((0, 1, None), (0, 1, Some(0))),
            ((0, 2, Some(0)), (1, 2, Some(0))),
            ((0, 2, Some(0)), (0, 3, Some(0))),
        ] {
            assert!(
                same_communicator(checked, here).is_err(),
                "{checked:?} {here:?}"
            );
        }
    }
}
