//! NCCL's PreMulSum on a GPU rank ([`RankCommunicator::enqueue_premul_sum`]): each rank's
//! input multiplied by a factor of its own, then summed — NCCL's `ncclRedOpCreatePreMulSum`,
//! which PyTorch uses to divide gradients before they are summed (FSDP's gradient divide factor)
//! so that low-precision sums do not overflow.
//!
//! The product is made before the collective, in stream-ordered scratch memory on the caller's
//! stream (`cuMemAllocAsync`; a kernel, [`crate::exec::cuda::kernels::KernelModule::premul`]),
//! and the collective then sums the scratch; the caller's input is never written. The factor is a
//! value the host holds ([`PreMul::Host`]) or an element in device memory read when the kernel
//! runs ([`PreMul::Device`]), as NCCL's `ncclScalarHostImmediate` and `ncclScalarDevice`.
//! Invariant: the scratch is freed on the stream after the collective, whether it was enqueued
//! or refused.

use super::RankCommunicator;
use crate::buffer::{Buffer, BufferMut, DeviceMemory};
use crate::device::{self, CallerStream};
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::cuda::kernels::{KernelModule, PreMul};
use crate::plan::Collective;

impl RankCommunicator {
    /// Enqueues `collective` (an all-reduce, reduce-scatter or reduce) on the caller's `stream`,
    /// reducing with PreMulSum: `Σ factor × input` over the ranks (module doc). Every rank
    /// passes its own factor (NCCL's contract: the same one on every rank, as PyTorch does; the
    /// sum uses each rank's). The rest is
    /// [`RankCommunicator::enqueue_collective`] with [`ReduceOp::Sum`]: `input` is this
    /// rank's input, `output` its output where the collective writes one. GPU ranks only.
    ///
    /// # Safety
    /// As for [`RankCommunicator::enqueue_collective`]; a [`PreMul::Device`] factor is
    /// one element of `T` in this rank's GPU memory, unwritten until the stream passes the call.
    pub unsafe fn enqueue_premul_sum<T: Element, O: BufferMut<T> + ?Sized>(
        &mut self,
        collective: &Collective,
        input: &DeviceMemory<T>,
        output: Option<&mut O>,
        factor: PreMul,
        stream: impl Into<CallerStream>,
    ) -> Result<()> {
        let stream = stream.into();
        if !collective.reduces() {
            return Err(Error::InvalidArgument(format!(
                "PreMulSum reduces: the {} does not",
                collective.name()
            )));
        }
        let device = self.device().ok_or_else(|| {
            Error::InvalidArgument("PreMulSum runs on GPU ranks: this is a host rank".into())
        })?;
        self.placed(input)?;
        let ctx = device::context(device)?;
        let kernels = KernelModule::shared(&ctx)?;
        let count = input.count();
        // SAFETY: the caller's stream is live (our caller's contract) and `placed` put the input
        // on its GPU, whose primary context the stream must belong to (`premul` checks it).
        let scratch = unsafe { device::alloc_async(&ctx, count * T::DTYPE.size_bytes(), &stream) }?;
        // SAFETY: `scratch` holds `count` elements, fresh, on this stream; the input and the
        // factor are the caller's (our contract); the kernel reads one and writes the other.
        let result =
            unsafe { kernels.premul(&stream, T::DTYPE, scratch, input.address(), count, factor) }
                .and_then(|()| {
                    // SAFETY: `count` elements of this GPU's stream-ordered memory, written by the
                    // kernel just queued and freed only after the collective, below.
                    let scaled = unsafe { DeviceMemory::<T>::new(scratch, count, device) };
                    // SAFETY: the scratch as above; the output is the caller's (our contract).
                    unsafe {
                        self.enqueue_collective(
                            collective,
                            Some(&scaled),
                            output,
                            ReduceOp::Sum,
                            stream,
                        )
                    }
                });
        // SAFETY: from alloc_async above, freed once; the collective's reads of it were queued
        // before (its completion is ordered before later work on the caller's stream).
        let freed = unsafe { device::free_async(&ctx, scratch, &stream) };
        result.and(freed)
    }
}
