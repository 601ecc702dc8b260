//! The calls of a [`RankCommunicator`] that return once the collective is complete on this
//! rank: the all-reduce, any collective out of place or in place, grouped send/recv, and the
//! exchange of words that lets callers agree on a call's shape; each checks its buffers
//! (`ends.rs`) and then runs on this rank's executor (`run`).

use super::ends::{host_slices, Ends};
use super::{broken, guarded, Inner, RankCommunicator};
use crate::buffer::{Buffer, BufferMut};
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::Shape;
use crate::plan::{BufKind, Collective, Transfer};

impl RankCommunicator {
    /// All-reduce in place: every rank's `buf` ends holding the reduction of every rank's.
    pub fn all_reduce_in_place<T: Element, B: BufferMut<T> + ?Sized>(
        &mut self,
        buf: &mut B,
        op: ReduceOp,
    ) -> Result<()> {
        self.collective_in_place(&Collective::AllReduce, buf, op)
    }

    /// All-reduce: `output` ends holding the reduction of every rank's `input` (equal lengths).
    pub fn all_reduce<T: Element, I: Buffer<T> + ?Sized, O: BufferMut<T> + ?Sized>(
        &mut self,
        input: &I,
        output: &mut O,
        op: ReduceOp,
    ) -> Result<()> {
        self.collective(&Collective::AllReduce, Some(input), Some(output), op)
    }

    /// Any collective but send/recv ([`RankCommunicator::send_recv`]), out of place, on this
    /// rank's buffers: `input` is `None` where this rank passes none (a broadcast's non-root),
    /// `output` where it passes none (a reduce's non-root). The lengths are [`Collective`]'s
    /// table's for this rank; the count comes from them, and every rank must pass the same.
    pub fn collective<T: Element, I: Buffer<T> + ?Sized, O: BufferMut<T> + ?Sized>(
        &mut self,
        collective: &Collective,
        input: Option<&I>,
        output: Option<&mut O>,
        op: ReduceOp,
    ) -> Result<()> {
        let (shape, ends) = self.out_of_place(collective, input, output, op)?;
        self.run::<T>(shape, ends, op)
    }

    /// Any collective that has an in-place form ([`Collective::has_in_place`]), in place on this
    /// rank's one buffer, laid out as the collective's table says (an all-gather's holds this
    /// rank's block at its place; a reduce-scatter's leaves this rank's block holding its
    /// result, the others undefined).
    pub fn collective_in_place<T: Element, B: BufferMut<T> + ?Sized>(
        &mut self,
        collective: &Collective,
        buf: &mut B,
        op: ReduceOp,
    ) -> Result<()> {
        let shape = self.in_place_shape::<T, B>(collective, buf, op)?;
        let ends = Ends {
            reads: Vec::new(),
            writes: vec![(BufKind::Output, buf.address_mut(), buf.count())],
        };
        self.run::<T>(shape, ends, op)
    }

    /// Grouped send/recv: every rank names the same `transfers` (transfer i moves `count`
    /// elements from rank `from` to rank `to`), and passes its own ends of them — `sends`, one
    /// buffer per transfer it sends, and `recvs`, one per transfer it receives, each in the
    /// order of `transfers` and of the transfer's count. All in one call, so an exchange where
    /// every rank both sends and receives cannot deadlock.
    pub fn send_recv<T: Element, I: Buffer<T> + ?Sized, O: BufferMut<T> + ?Sized>(
        &mut self,
        transfers: &[Transfer],
        sends: &[&I],
        recvs: &mut [&mut O],
    ) -> Result<()> {
        let (shape, ends) = self.send_recv_ends(transfers, sends, recvs)?;
        self.run::<T>(shape, ends, ReduceOp::Sum)
    }

    /// Every rank's `words`, by rank, exchanged with the job's other ranks (a collective step:
    /// every rank calls it in the same order). For callers that must agree on a call's shape
    /// before making it — NCCL's send/recv, where each rank names only its own peers. GPU
    /// ranks only.
    #[doc(hidden)]
    pub fn exchange(&mut self, words: &[u64]) -> Result<Vec<Vec<u64>>> {
        broken(&self.broken)?;
        match &mut self.inner {
            Inner::Gpu { exec, .. } => guarded(&mut self.broken, || exec.exchange(words)),
            Inner::GpuHosts(inner) => guarded(&mut self.broken, || inner.exchange(words)),
            Inner::Host(_) | Inner::Hosts(_) => {
                Err(Error::InvalidArgument("exchange is for GPU ranks".into()))
            }
        }
    }

    /// Runs the call of `shape` on this rank's `ends`.
    fn run<T: Element>(&mut self, shape: Shape, ends: Ends, op: ReduceOp) -> Result<()> {
        broken(&self.broken)?;
        let addresses = self.addresses(&shape, &ends);
        match &mut self.inner {
            Inner::Host(inner) => {
                // SAFETY: the ends came from this call's checked host buffers (`host_slices`).
                let (reads, mut writes) = unsafe { host_slices::<T>(&ends) };
                guarded(&mut self.broken, || {
                    inner.run(shape, &reads, &mut writes, op)
                })
            }
            Inner::Hosts(inner) => {
                // SAFETY: as above.
                let (reads, mut writes) = unsafe { host_slices::<T>(&ends) };
                guarded(&mut self.broken, || {
                    inner.run(shape, &reads, &mut writes, op)
                })
            }
            Inner::Gpu { exec, .. } => {
                let (inputs, outputs) = addresses;
                guarded(&mut self.broken, || {
                    // SAFETY: every address is this rank's buffer on its GPU (`placed`), valid
                    // for the length the plan declares (`count_of`, `send_recv`), borrowed by
                    // our caller for this whole call, which waits for completion.
                    unsafe { exec.run::<T>(shape, &inputs, &outputs, op, true, None) }
                })
            }
            Inner::GpuHosts(inner) => {
                let (inputs, outputs) = addresses;
                // SAFETY: as above.
                guarded(&mut self.broken, || unsafe {
                    inner.run::<T>(shape, &inputs, &outputs, op, true, None)
                })
            }
        }
    }
}
