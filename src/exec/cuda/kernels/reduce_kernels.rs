//! The ring's kernels: the pairwise reduce `dst[i] = a[i] ⊕ b[i]` that ends every ring step on a
//! GPU, and the scale `x[i] = x[i] / world` that ends `Avg`. Both take any grid; the launch sizes
//! it to the message, at most filling the device once (the kernels' grid-stride loops cover the
//! rest).
//!
//! Invariant: a launch checks the stream's context and the addresses' alignment before it
//! enqueues anything, and enqueues nothing for zero elements.

use std::ffi::c_void;

use cudarc::driver::sys::CUstream;
use cudarc::driver::CudaFunction;

use super::{check_aligned, param, reduce_index, KernelModule, BLOCK_THREADS, VECTOR_BYTES};
use crate::device::{self, CallerStream, Stream};
use crate::element::{DType, ReduceOp};
use crate::error::{Error, Result};

impl KernelModule {
    /// Enqueues `dst[i] = a[i] ⊕ b[i]` for `i < count` on `stream`, where ⊕ is
    /// `op.combine_op()` (`Avg` combines as `Sum`; its division is [`KernelModule::scale`]).
    /// `count == 0` enqueues nothing. Returns once enqueued; errors are those of the launch.
    ///
    /// # Safety
    ///
    /// Until the kernel has run on `stream`:
    /// - `dst`, `a` and `b` are device addresses (`CUdeviceptr`) of allocations usable from this
    ///   context: its own, or a peer device's with peer access enabled from this context, each
    ///   valid for `count` elements of `dtype` (`count * dtype.size_bytes()` bytes);
    /// - `a` and `b` each either equal `dst` (in-place accumulate is `dst == a`) or do not overlap
    ///   `dst`'s `count` elements;
    /// - no other stream, device or host thread writes any of the three ranges, nor reads `dst`'s
    ///   range, unless ordered after this kernel (events, or the same stream).
    ///
    /// Misaligned addresses (not a multiple of `dtype.size_bytes()`) and a stream of another
    /// context are refused with an error before anything is enqueued.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce(
        &self,
        stream: &Stream,
        op: ReduceOp,
        dtype: DType,
        dst: u64,
        a: u64,
        b: u64,
        count: usize,
    ) -> Result<()> {
        self.check_stream(stream)?;
        check_aligned(dtype, "dst", dst)?;
        check_aligned(dtype, "a", a)?;
        check_aligned(dtype, "b", b)?;
        if count == 0 {
            return Ok(());
        }
        let (mut dst, mut a, mut b, mut count_arg) = (dst, a, b, count as u64);
        let mut params: [*mut c_void; 4] = [
            param(&mut dst),
            param(&mut a),
            param(&mut b),
            param(&mut count_arg),
        ];
        let function = &self.reduce[reduce_index(op, dtype)];
        // SAFETY: the function is rr_reduce_<op>_<dtype>(T*, const T*, const T*, unsigned long
        // long), matching the four 8-byte parameters above, which outlive the call (the driver
        // copies them at launch); the pointer contract is the caller's, stated above; the stream
        // is of self.ctx (`check_stream`).
        unsafe { self.launch(function, dtype, count, stream.raw(), &mut params) }
    }

    /// Enqueues `x[i] = x[i] / world` for `i < count` on `stream`: the last step of `Avg`, as
    /// [`crate::element::Element::average`] defines it (floats times `1/world`, integers divided
    /// by `world as T`, truncating; `world == 0` acts as 1) — skipped on the GPU where `error`
    /// (the rank's error word, a `u32` this GPU reads; 0: none) holds a code when it runs: the
    /// call's peer kernel failed, or found the call different from a peer's, and `x` stays as
    /// it was. `count == 0` enqueues nothing.
    ///
    /// # Safety
    ///
    /// Until the kernel has run on `stream`: `x` is a device address (`CUdeviceptr`) usable from
    /// this context (its own, or a peer's with peer access enabled), valid for `count` elements
    /// of `dtype`, and no other stream, device or host thread reads or writes that range unless
    /// ordered after this kernel; a nonzero `error` is a device address of a `u32` usable from
    /// this context. A misaligned `x` or a stream of another context is refused with
    /// an error before anything is enqueued.
    pub unsafe fn scale(
        &self,
        stream: &Stream,
        dtype: DType,
        x: u64,
        count: usize,
        world: usize,
        error: u64,
    ) -> Result<()> {
        self.check_stream(stream)?;
        check_aligned(dtype, "x", x)?;
        if count == 0 {
            return Ok(());
        }
        let (mut x, mut count_arg, mut world_arg) = (x, count as u64, world as u64);
        let mut error = error;
        let mut params: [*mut c_void; 4] = [
            param(&mut x),
            param(&mut count_arg),
            param(&mut world_arg),
            param(&mut error),
        ];
        let function = &self.scale[dtype as usize];
        // SAFETY: the function is rr_scale_<dtype>(T*, unsigned long long, unsigned long long,
        // const unsigned*), matching the four 8-byte parameters above, which outlive the call;
        // the pointer contract is the caller's, stated above; the stream is of self.ctx
        // (`check_stream`).
        unsafe { self.launch(function, dtype, count, stream.raw(), &mut params) }
    }

    /// Enqueues `dst[i] = src[i] × s` for `i < count` on the caller's `stream`: the first step of
    /// NCCL's PreMulSum (each rank's input multiplied by its factor, then summed). `s` is one
    /// element of `dtype`: [`PreMul::Host`]'s value, or the one at [`PreMul::Device`]'s address
    /// as the kernel runs. Floats multiply as `Prod` does (f16, bf16 and fp8 in f32, rounded
    /// once), integers wrap. `count == 0` enqueues nothing.
    ///
    /// # Safety
    ///
    /// Until the kernel has run on `stream`: `dst` and `src` are device addresses usable from
    /// this context, valid for `count` elements of `dtype`, equal or not overlapping; a device
    /// factor's address is valid for one element; no other stream or thread writes them, nor
    /// reads `dst`, unless ordered after this kernel. `stream` is live. Misaligned addresses and
    /// a stream of another context are refused before anything is enqueued.
    pub unsafe fn premul(
        &self,
        stream: &CallerStream,
        dtype: DType,
        dst: u64,
        src: u64,
        count: usize,
        factor: PreMul,
    ) -> Result<()> {
        if stream.context() != self.ctx.cu_ctx() {
            return Err(Error::InvalidArgument(format!(
                "stream of device {} given to the kernels of device {}",
                stream.device(),
                self.ctx.ordinal()
            )));
        }
        check_aligned(dtype, "dst", dst)?;
        check_aligned(dtype, "src", src)?;
        let (mut at, mut bits) = match factor {
            PreMul::Host(bits) => (0u64, bits),
            PreMul::Device(at) => {
                check_aligned(dtype, "the factor", at)?;
                (at, 0u64)
            }
        };
        if count == 0 {
            return Ok(());
        }
        let (mut dst, mut src, mut count_arg) = (dst, src, count as u64);
        let mut params: [*mut c_void; 5] = [
            param(&mut dst),
            param(&mut src),
            param(&mut count_arg),
            param(&mut at),
            param(&mut bits),
        ];
        let function = &self.premul[dtype as usize];
        // SAFETY: the function is rr_premul_<dtype>(T*, const T*, unsigned long long, const T*,
        // unsigned long long), matching the five 8-byte parameters above, which outlive the
        // call; the stream is of self.ctx (checked above); the memory contract is the caller's,
        // stated above.
        unsafe { self.launch(function, dtype, count, stream.raw(), &mut params) }
    }

    /// Launches `function` (one of this module's, loaded into `self.ctx`) over `count` elements
    /// of `dtype` on the stream `raw`, with a grid that fills the device once (each kernel loops
    /// over the rest; any grid suits them).
    ///
    /// # Safety
    /// `raw` is a live stream of `self.ctx`; `params` points at one value per kernel parameter,
    /// of the kernel's parameter types; the memory the kernel touches satisfies its contract
    /// (see `reduce`, `scale`, `premul`).
    unsafe fn launch(
        &self,
        function: &CudaFunction,
        dtype: DType,
        count: usize,
        raw: CUstream,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let blocks = grid_blocks(dtype, count, self.max_blocks);
        // SAFETY: the function was loaded into self.ctx, the stream's context; the rest is our
        // caller's contract, passed on.
        unsafe { device::launch_kernel(&self.ctx, function, blocks, BLOCK_THREADS, raw, params) }
    }
}

/// PreMulSum's factor ([`KernelModule::premul`]): one element of the call's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreMul {
    /// The element's bytes in the low bytes of the word (little-endian), as the host read it.
    Host(u64),
    /// The device address of the element, on the call's GPU, read when the kernel runs.
    Device(u64),
}

/// Blocks for `count` elements: one 16-byte vector per thread, at most `max_blocks` (the kernel's
/// grid-stride loop covers the rest), at least 1.
fn grid_blocks(dtype: DType, count: usize, max_blocks: u32) -> u32 {
    let per_thread = (VECTOR_BYTES / dtype.size_bytes()) as u64;
    let blocks = (count as u64)
        .div_ceil(per_thread)
        .div_ceil(u64::from(BLOCK_THREADS));
    blocks.clamp(1, u64::from(max_blocks.max(1))) as u32
}

#[cfg(test)]
mod tests {
    use super::grid_blocks;
    use crate::element::DType;

    #[test]
    fn grid_fills_the_device_once_at_most() {
        // f32: 4 elements per thread, 1024 per block.
        assert_eq!(grid_blocks(DType::F32, 1, 1056), 1);
        assert_eq!(grid_blocks(DType::F32, 1024, 1056), 1);
        assert_eq!(grid_blocks(DType::F32, 1025, 1056), 2);
        // u8: 16 per thread, 4096 per block; f64: 2 per thread, 512 per block.
        assert_eq!(grid_blocks(DType::U8, 4097, 1056), 2);
        assert_eq!(grid_blocks(DType::F64, 1024, 1056), 2);
        assert_eq!(grid_blocks(DType::F16, 1 << 30, 1056), 1056);
        assert_eq!(grid_blocks(DType::F32, usize::MAX, 1056), 1056);
        assert_eq!(grid_blocks(DType::F32, 5, 0), 1);
    }
}
