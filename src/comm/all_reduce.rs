//! The all-reduce on a [`Communicator`]: in place or out of place, blocking or enqueued (on the
//! communicator's streams or the caller's), all through the one submit of every collective
//! (`dispatch.rs`: `submit_collective`, which checks the buffers, `validate.rs`, and runs the
//! call); and [`ring_allreduce`], the common case in one call.

use super::Communicator;
use crate::buffer::{Buffer, BufferMut, Placement};
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::host::HostConfig;
use crate::plan::Collective;
use std::sync::Arc;

impl Communicator {
    /// All-reduce in place: every `bufs[r]` ends holding the reduction over all ranks.
    ///
    /// On error nothing is enqueued when validation fails; when a rank fails mid-call, the
    /// buffers hold partial results (some elements reduced, some not) and the communicator is
    /// marked failed.
    ///
    /// # Errors
    /// After a timeout, a stuck GPU may still write the buffers once this has returned: read
    /// [`Communicator`]'s "A failed or timed-out call" before freeing or reusing them.
    pub fn all_reduce_in_place<T: Element, B: BufferMut<T>>(
        &self,
        bufs: &mut [B],
        op: ReduceOp,
    ) -> Result<()> {
        // SAFETY: the buffers are borrowed until `submit_collective` returns, which waits for completion.
        unsafe {
            self.submit_collective(&Collective::AllReduce, None::<&[B]>, bufs, op, true, None)
        }
    }

    /// [`Communicator::all_reduce_in_place`] that returns once the work is enqueued, without
    /// waiting for it (on host ranks too: their threads run it meanwhile). On GPUs the
    /// collective is ordered on each rank's [`Communicator::main_stream`]: work enqueued there
    /// afterwards sees the result; [`Communicator::synchronize`] waits for it.
    ///
    /// # Safety
    /// The buffers must stay allocated and untouched (no reads, no writes, on any stream or the
    /// host) until the collective has completed: after `synchronize`, or for work ordered after
    /// it on the rank's Main stream.
    pub unsafe fn enqueue_all_reduce_in_place<T: Element, B: BufferMut<T>>(
        &self,
        bufs: &mut [B],
        op: ReduceOp,
    ) -> Result<()> {
        // SAFETY: the buffers' lifetime until completion is the caller's contract.
        unsafe {
            self.submit_collective(&Collective::AllReduce, None::<&[B]>, bufs, op, false, None)
        }
    }

    /// All-reduce out of place: every `outputs[r]` ends holding the reduction of all `inputs`.
    /// Inputs are never modified, on error too. Outputs may be longer than inputs; only the
    /// first `inputs[r].count()` elements are written.
    ///
    /// # Errors
    /// After a timeout, a stuck GPU may still write the buffers once this has returned: read
    /// [`Communicator`]'s "A failed or timed-out call" before freeing or reusing them.
    pub fn all_reduce<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        inputs: &[I],
        outputs: &mut [O],
        op: ReduceOp,
    ) -> Result<()> {
        // SAFETY: the buffers are borrowed until `submit_collective` returns, which waits for completion.
        unsafe {
            self.submit_collective(
                &Collective::AllReduce,
                Some(inputs),
                outputs,
                op,
                true,
                None,
            )
        }
    }

    /// [`Communicator::all_reduce`] that returns once the work is enqueued (see
    /// [`Communicator::enqueue_all_reduce_in_place`]).
    ///
    /// # Safety
    /// Inputs and outputs must stay allocated, inputs unwritten and outputs untouched, until the
    /// collective has completed.
    pub unsafe fn enqueue_all_reduce<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        inputs: &[I],
        outputs: &mut [O],
        op: ReduceOp,
    ) -> Result<()> {
        // SAFETY: the buffers' lifetime until completion is the caller's contract.
        unsafe {
            self.submit_collective(
                &Collective::AllReduce,
                Some(inputs),
                outputs,
                op,
                false,
                None,
            )
        }
    }

    /// [`Communicator::enqueue_all_reduce_in_place`] ordered on the caller's streams, one per
    /// rank (cudarc streams of each rank's GPU, in its primary context): the collective starts
    /// after the work already queued on `streams[r]`, and work queued there afterwards runs after
    /// it — a kernel that writes the gradients, the all-reduce, and the kernel that reads them
    /// need no host synchronisation between them. Nothing is waited for on the host.
    ///
    /// ```no_run
    /// # use ringreduce::{Communicator, GpuBuffer, ReduceOp};
    /// # fn main() -> ringreduce::Result<()> {
    /// let comm = Communicator::new(&[0, 1])?;
    /// // The job's own streams (cudarc), one per GPU.
    /// let streams = vec![
    ///     ringreduce::device::context(0)?.new_stream().expect("a stream"),
    ///     ringreduce::device::context(1)?.new_stream().expect("a stream"),
    /// ];
    /// let mut grads = vec![GpuBuffer::<f32>::zeroed(0, 1024)?, GpuBuffer::zeroed(1, 1024)?];
    /// // ... a kernel writing `grads[r]` queued on `streams[r]` ...
    /// // SAFETY: `grads` stays alive and untouched until the streams have passed the call.
    /// unsafe { comm.enqueue_all_reduce_in_place_on(&mut grads, ReduceOp::Sum, &streams)? };
    /// // ... a kernel reading `grads[r]` queued on `streams[r]` runs after the all-reduce ...
    /// streams[0].synchronize().expect("sync"); // only where the host needs the result
    /// # Ok(()) }
    /// ```
    ///
    /// **In CUDA graphs.** When the streams are being captured (every rank's, each into its own
    /// graph or all into one; relaxed capture mode is safest), the collective becomes part of the
    /// graph(s) and replays correctly any number of times, with whatever the buffers hold then.
    /// Rules: the shape (count, element size, placement, `Avg` or not) must have run on this
    /// communicator before the capture; every rank's graph must be replayed as many times as the
    /// others (a rank whose peers never arrive gives up after ¾ of the timeout, and
    /// [`Communicator::health`] then reports the [`Error::Timeout`]); the communicator must stay
    /// open while its graphs can run. Refused with [`Error::NotCapturable`] (nothing enqueued):
    /// an unprepared shape, a capture of some ranks' streams but not others', a ring staged
    /// through host memory.
    ///
    /// # Safety
    /// The buffers must stay allocated and untouched (no reads, no writes, on any stream or the
    /// host) until each rank's stream has passed the collective, except by work queued on those
    /// streams after this call. Captured: the buffers must stay allocated, and the communicator
    /// open, while any graph holding the call may be replayed.
    pub unsafe fn enqueue_all_reduce_in_place_on<T: Element, B: BufferMut<T>>(
        &self,
        bufs: &mut [B],
        op: ReduceOp,
        streams: &[Arc<cudarc::driver::CudaStream>],
    ) -> Result<()> {
        // SAFETY: the buffers' lifetime until the streams pass the call is the caller's contract.
        unsafe {
            self.submit_collective(
                &Collective::AllReduce,
                None::<&[B]>,
                bufs,
                op,
                false,
                Some(streams),
            )
        }
    }

    /// [`Communicator::enqueue_all_reduce`] ordered on the caller's streams (see
    /// [`Communicator::enqueue_all_reduce_in_place_on`]).
    ///
    /// # Safety
    /// Inputs and outputs must stay allocated, inputs unwritten and outputs untouched, until each
    /// rank's stream has passed the collective, except by work queued on those streams after it.
    pub unsafe fn enqueue_all_reduce_on<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        inputs: &[I],
        outputs: &mut [O],
        op: ReduceOp,
        streams: &[Arc<cudarc::driver::CudaStream>],
    ) -> Result<()> {
        // SAFETY: as above.
        unsafe {
            self.submit_collective(
                &Collective::AllReduce,
                Some(inputs),
                outputs,
                op,
                false,
                Some(streams),
            )
        }
    }
}

/// All-reduce (sum) in place over one buffer per rank: the common case in one call, with a
/// communicator built for it and closed after it.
///
/// Which algorithm runs: host buffers run the ring (reduce-scatter then all-gather) on host
/// threads, one rank per buffer. GPU buffers ([`crate::GpuBuffer`]) run on their GPUs, one rank
/// per buffer in the order given, with [`crate::Algorithm::Auto`]: despite the function's name
/// (the design card's), small and medium messages run the one-shot or two-shot peer kernels and
/// large ones the copy-engine ring, by the rule in [`crate::exec::algorithm`]. For a fixed
/// algorithm, or for many calls, build a [`Communicator`] with a [`crate::CudaConfig`].
///
/// ```
/// let mut bufs = vec![vec![1u64, 2, 3], vec![10, 20, 30]];
/// ringreduce::ring_allreduce(&mut bufs)?;
/// assert_eq!(bufs[0], [11, 22, 33]);
/// assert_eq!(bufs[1], [11, 22, 33]);
/// # Ok::<(), ringreduce::Error>(())
/// ```
///
/// # Errors
/// After a timeout, a stuck GPU may still write the buffers once this has returned: read
/// [`Communicator`]'s "A failed or timed-out call" before freeing or reusing them.
pub fn ring_allreduce<T: Element, B: BufferMut<T>>(bufs: &mut [B]) -> Result<()> {
    if bufs.is_empty() {
        return Err(Error::NoBuffers);
    }
    let devices: Vec<usize> = bufs
        .iter()
        .filter_map(|b| match b.placement() {
            Placement::Device(d) => Some(d),
            Placement::Host => None,
        })
        .collect();
    let comm = if devices.is_empty() {
        let ring = HostConfig {
            algorithm: crate::Algorithm::Ring,
            ..HostConfig::default()
        };
        Communicator::host_with(bufs.len(), ring)?
    } else {
        Communicator::new(&devices)?
    };
    comm.all_reduce_in_place(bufs, ReduceOp::Sum)?;
    comm.close()
}
