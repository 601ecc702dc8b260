//! Every collective on a [`Communicator`] goes through one submit (`submit_collective`, in
//! `dispatch.rs`: the checks of `validate.rs`, then the executor), the all-reduce's methods
//! (`all_reduce.rs`) too. The other collectives: one generic entry,
//! [`Communicator::enqueue_collective`] (and its blocking twin [`Communicator::collective`]),
//! which takes the [`Collective`], the buffers and optionally the caller's streams, and named
//! blocking methods on top (`reduce_scatter`, `all_gather`, `broadcast`, `reduce`,
//! `all_to_all`, `send_recv`, each with its in-place form where NCCL has one).
//!
//! Which buffers a call passes (the lengths are in [`crate::plan::Collective`]'s table):
//!
//! | collective        | `inputs` (None: in place)            | `outputs`                          |
//! |-------------------|--------------------------------------|------------------------------------|
//! | all-reduce        | one per rank                         | one per rank                       |
//! | reduce-scatter    | one per rank, world·count            | one per rank, count                |
//! | all-gather        | one per rank, count                  | one per rank, world·count          |
//! | broadcast(root)   | the root's alone                     | one per rank                       |
//! | reduce(root)      | one per rank                         | the root's alone (in place: all)   |
//! | all-to-all        | one per rank, world·count            | one per rank, world·count          |
//! | send/recv         | one send buffer per transfer         | one receive buffer per transfer    |
//!
//! The count comes from the buffers; every length is then checked exactly (all-reduce's outputs
//! alone may be longer), with errors that name the rank, the buffer, and what was expected.

use super::Communicator;
use crate::buffer::{Buffer, BufferMut};
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::plan::{Collective, Transfer};
use cudarc::driver::CudaStream;
use std::sync::Arc;

impl Communicator {
    /// Runs any collective and returns once enqueued (on host ranks too: their threads run it
    /// meanwhile), ordered on each rank's Main stream or, with `streams`, on the
    /// caller's streams (one per rank, as for
    /// [`Communicator::enqueue_all_reduce_in_place_on`]). `inputs` is `None` in place; which
    /// buffers each list holds is in this module's table. `op` is used where the collective
    /// reduces (all-reduce, reduce-scatter, reduce).
    ///
    /// # Safety
    /// Every buffer must stay allocated, inputs unwritten and outputs untouched (no reads, no
    /// writes, on any stream or the host) until the collective has completed: after
    /// `synchronize`, or for work ordered after it on the rank's Main (or given) stream.
    pub unsafe fn enqueue_collective<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        collective: &Collective,
        inputs: Option<&[I]>,
        outputs: &mut [O],
        op: ReduceOp,
        streams: Option<&[Arc<CudaStream>]>,
    ) -> Result<()> {
        // SAFETY: the buffers' lifetime until completion is the caller's contract.
        unsafe { self.submit_collective(collective, inputs, outputs, op, false, streams) }
    }

    /// [`Communicator::enqueue_collective`], blocking until the collective has completed.
    ///
    /// # Errors
    /// After a timeout, a stuck GPU may still write the buffers once this has returned: read
    /// [`Communicator`]'s "A failed or timed-out call" before freeing or reusing them.
    pub fn collective<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        collective: &Collective,
        inputs: Option<&[I]>,
        outputs: &mut [O],
        op: ReduceOp,
    ) -> Result<()> {
        // SAFETY: the buffers are borrowed until `submit_collective` returns, which waits for
        // completion.
        unsafe { self.submit_collective(collective, inputs, outputs, op, true, None) }
    }

    /// Reduce-scatter: `outputs[r]` (count elements) ends holding block r of the reduction of
    /// every rank's `inputs` (world·count elements each; block j is elements j·count..).
    ///
    /// # Errors
    /// After a timeout, a stuck GPU may still write the buffers once this has returned: read
    /// [`Communicator`]'s "A failed or timed-out call" before freeing or reusing them.
    pub fn reduce_scatter<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        inputs: &[I],
        outputs: &mut [O],
        op: ReduceOp,
    ) -> Result<()> {
        self.collective(&Collective::ReduceScatter, Some(inputs), outputs, op)
    }

    /// Reduce-scatter in place: each `bufs[r]` (world·count elements) is rank r's input, and
    /// its block r (elements r·count..(r+1)·count) ends holding the result; the other blocks
    /// hold partial sums afterwards.
    ///
    /// # Errors
    /// After a timeout, a stuck GPU may still write the buffers once this has returned: read
    /// [`Communicator`]'s "A failed or timed-out call" before freeing or reusing them.
    pub fn reduce_scatter_in_place<T: Element, B: BufferMut<T>>(
        &self,
        bufs: &mut [B],
        op: ReduceOp,
    ) -> Result<()> {
        self.collective(&Collective::ReduceScatter, None::<&[B]>, bufs, op)
    }

    /// All-gather: every `outputs[r]` (world·count elements) ends holding every rank's input,
    /// rank j's in block j.
    ///
    /// # Errors
    /// After a timeout, a stuck GPU may still write the buffers once this has returned: read
    /// [`Communicator`]'s "A failed or timed-out call" before freeing or reusing them.
    pub fn all_gather<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        inputs: &[I],
        outputs: &mut [O],
    ) -> Result<()> {
        self.collective(&Collective::AllGather, Some(inputs), outputs, ReduceOp::Sum)
    }

    /// All-gather in place: rank r's input is block r of its `bufs[r]` (world·count elements),
    /// and every block ends holding its rank's input.
    ///
    /// # Errors
    /// After a timeout, a stuck GPU may still write the buffers once this has returned: read
    /// [`Communicator`]'s "A failed or timed-out call" before freeing or reusing them.
    pub fn all_gather_in_place<T: Element, B: BufferMut<T>>(&self, bufs: &mut [B]) -> Result<()> {
        self.collective(&Collective::AllGather, None::<&[B]>, bufs, ReduceOp::Sum)
    }

    /// Broadcast: every `outputs[r]` ends holding `input`, the root's buffer.
    ///
    /// # Errors
    /// After a timeout, a stuck GPU may still write the buffers once this has returned: read
    /// [`Communicator`]'s "A failed or timed-out call" before freeing or reusing them.
    pub fn broadcast<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        input: &I,
        outputs: &mut [O],
        root: usize,
    ) -> Result<()> {
        let inputs = std::slice::from_ref(input);
        self.collective(
            &Collective::Broadcast { root },
            Some(inputs),
            outputs,
            ReduceOp::Sum,
        )
    }

    /// Broadcast in place: every `bufs[r]` ends holding what `bufs[root]` holds.
    ///
    /// # Errors
    /// After a timeout, a stuck GPU may still write the buffers once this has returned: read
    /// [`Communicator`]'s "A failed or timed-out call" before freeing or reusing them.
    pub fn broadcast_in_place<T: Element, B: BufferMut<T>>(
        &self,
        bufs: &mut [B],
        root: usize,
    ) -> Result<()> {
        let c = Collective::Broadcast { root };
        self.collective(&c, None::<&[B]>, bufs, ReduceOp::Sum)
    }

    /// Reduce: `output` (the root's) ends holding the reduction of every rank's input.
    ///
    /// # Errors
    /// After a timeout, a stuck GPU may still write the buffers once this has returned: read
    /// [`Communicator`]'s "A failed or timed-out call" before freeing or reusing them.
    pub fn reduce<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        inputs: &[I],
        output: &mut O,
        root: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let outputs = std::slice::from_mut(output);
        self.collective(&Collective::Reduce { root }, Some(inputs), outputs, op)
    }

    /// Reduce in place: `bufs[root]` ends holding the reduction of every rank's buffer; the
    /// other ranks' buffers are left as they are.
    ///
    /// # Errors
    /// After a timeout, a stuck GPU may still write the buffers once this has returned: read
    /// [`Communicator`]'s "A failed or timed-out call" before freeing or reusing them.
    pub fn reduce_in_place<T: Element, B: BufferMut<T>>(
        &self,
        bufs: &mut [B],
        root: usize,
        op: ReduceOp,
    ) -> Result<()> {
        self.collective(&Collective::Reduce { root }, None::<&[B]>, bufs, op)
    }

    /// All-to-all: block j of `outputs[r]` ends holding block r of `inputs[j]` (both world·count
    /// elements; block j is elements j·count..(j+1)·count).
    ///
    /// # Errors
    /// After a timeout, a stuck GPU may still write the buffers once this has returned: read
    /// [`Communicator`]'s "A failed or timed-out call" before freeing or reusing them.
    pub fn all_to_all<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        inputs: &[I],
        outputs: &mut [O],
    ) -> Result<()> {
        self.collective(&Collective::AllToAll, Some(inputs), outputs, ReduceOp::Sum)
    }

    /// Grouped send/recv: transfer i moves `sends[i]` (on rank `pairs[i].0`) into `recvs[i]`
    /// (on rank `pairs[i].1`, the same length), all in one call, so an exchange where every rank
    /// both sends and receives cannot deadlock.
    ///
    /// # Errors
    /// After a timeout, a stuck GPU may still write the buffers once this has returned: read
    /// [`Communicator`]'s "A failed or timed-out call" before freeing or reusing them.
    pub fn send_recv<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        pairs: &[(usize, usize)],
        sends: &[I],
        recvs: &mut [O],
    ) -> Result<()> {
        if sends.len() != pairs.len() {
            return Err(Error::BufferCount {
                collective: "send/recv",
                what: "send buffers (one per transfer)",
                expected: pairs.len(),
                got: sends.len(),
            });
        }
        let transfers = pairs
            .iter()
            .zip(sends)
            .map(|(&(from, to), send)| Transfer {
                from,
                to,
                count: send.count(),
            })
            .collect();
        let c = Collective::SendRecv { transfers };
        self.collective(&c, Some(sends), recvs, ReduceOp::Sum)
    }
}
