//! The reduce kernels on the GPU: `cuda/reduce.cu` loaded into a context, launched by table index.
//!
//! Every ring step on a GPU ends in one kernel, `dst[i] = a[i] ⊕ b[i]` (the received segment
//! combined with the local partial), and `Avg` ends with one more, `x[i] = x[i] / world`. The
//! one-shot all-reduce is a single kernel per rank ([`Kernels::oneshot`]): it meets the other
//! ranks' kernels at a start barrier of flags written into peer memory, reads every rank's input
//! directly (peer access), folds them in rank order into `dst`, and meets them again at an end
//! barrier. The two-shot ([`Kernels::twoshot`]) is one kernel per rank too, with three
//! barriers: each rank reduces its own segment from every rank's input, then copies the other
//! segments from their owners. Their semantics are those of [`crate::element`]; the kernels
//! themselves, the flag layout, the memory ordering and why they are fast are described in
//! `cuda/reduce.cu`.
//!
//! Where the code comes from is decided at build time (see `build.rs`):
//! - nvcc was found: the build embeds `reduce.fatbin` (SASS for sm_80 and sm_90, PTX for
//!   compute_90) and [`Kernels::new`] loads it ([`KernelSource::EmbeddedFatbin`]);
//! - otherwise: [`Kernels::new`] compiles the same source with NVRTC for the device's compute
//!   capability and loads the PTX ([`KernelSource::Nvrtc`]); that needs libnvrtc on the GPU host.
//!
//! Invariant: a [`Kernels`] holds all 130 functions (4 operators × 10 types of pairwise reduce,
//! of one-shot and of two-shot all-reduce, and one scale kernel per type) resolved in its
//! context, so a launch is a table index and one `cuLaunchKernel`, with no lookup and no
//! allocation.

use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaFunction, DriverError};

use crate::device::{self, Stream};
use cudarc::nvrtc::{CompileError, Ptx};

use crate::element::{DType, ReduceOp};
use crate::error::{Error, Result};

/// The kernel source, for NVRTC (and for the tests that check it defines every symbol).
#[cfg_attr(ringreduce_fatbin, allow(dead_code))]
const SOURCE: &str = include_str!("../../../cuda/reduce.cu");

/// The kernels compiled by nvcc at build time.
#[cfg(ringreduce_fatbin)]
static FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/reduce.fatbin"));

/// Threads per block of every launch.
const BLOCK_THREADS: u32 = 256;
/// Blocks per SM in a full grid: 8 × 256 = 2048 threads, the most an sm_80/sm_90 SM holds.
const BLOCKS_PER_SM: u32 = 8;
/// Bytes one thread moves per pointer per loop iteration on the vector path (a `uint4`).
const VECTOR_BYTES: usize = 16;

/// Most ranks one one-shot kernel serves (`RR_ONESHOT_MAX_RANKS` in `cuda/reduce.cu`).
pub const ONESHOT_MAX_RANKS: usize = 8;
/// Most blocks of a one-shot grid (`RR_ONESHOT_MAX_BLOCKS`): each block has its own flag words.
pub const ONESHOT_MAX_BLOCKS: u32 = 128;
/// Barrier phases of the flag array (`RR_ONESHOT_PHASES`): the one-shot's start and end, the
/// two-shot's start, middle (the one-shot's end words) and end.
const ONESHOT_PHASES: usize = 3;
/// Bytes of one rank's flag array: 3 phases × ONESHOT_MAX_BLOCKS × ONESHOT_MAX_RANKS × 4.
pub const ONESHOT_FLAG_BYTES: usize =
    ONESHOT_PHASES * ONESHOT_MAX_BLOCKS as usize * ONESHOT_MAX_RANKS * size_of::<u32>();
/// Threads per block of the one-shot (`RR_ONESHOT_THREADS`, its `__launch_bounds__`).
const ONESHOT_BLOCK_THREADS: u32 = 512;
/// Bytes of one rank's input per one-shot block: a block moves 8 KiB per source per unrolled
/// load (512 threads × 16 B), 32 KiB per loop iteration (`RR_ONESHOT_UNROLL` = 4).
const ONESHOT_BYTES_PER_BLOCK: u64 = 32 << 10;

/// The pairwise operators that have kernels, in table order (`Avg` combines as `Sum`).
const PAIRWISE_OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max];

/// Where the loaded kernels came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelSource {
    /// The fatbin nvcc built and the build embedded.
    EmbeddedFatbin,
    /// `cuda/reduce.cu` compiled by NVRTC when the [`Kernels`] were made.
    Nvrtc,
}

impl fmt::Display for KernelSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KernelSource::EmbeddedFatbin => "embedded fatbin",
            KernelSource::Nvrtc => "NVRTC",
        })
    }
}

/// Which kernel path this build has, for `ringreduce info`.
pub fn build_kind() -> &'static str {
    #[cfg(ringreduce_fatbin)]
    {
        concat!(
            "embedded fatbin (",
            env!("RINGREDUCE_FATBIN_TARGETS"),
            "; nvcc ",
            env!("RINGREDUCE_NVCC_RELEASE"),
            ")"
        )
    }
    #[cfg(not(ringreduce_fatbin))]
    {
        "NVRTC at first use (built without nvcc; needs libnvrtc on the GPU host)"
    }
}

/// A CUDA driver or NVRTC failure, as the parts of [`Error::Cuda`].
pub(crate) trait CudaFailure {
    /// The status name, e.g. `CUDA_ERROR_INVALID_VALUE`.
    fn code(&self) -> String;
    /// The library's description, or the compile log.
    fn message(&self) -> String;
}

impl CudaFailure for DriverError {
    fn code(&self) -> String {
        // SAFETY: only probes whether libcuda can be loaded; the name lookup below needs it, and
        // without it cudarc would panic.
        if unsafe { sys::is_culib_present() } {
            if let Ok(name) = self.error_name() {
                return name.to_string_lossy().into_owned();
            }
        }
        format!("{:?}", self.0)
    }

    fn message(&self) -> String {
        // SAFETY: as in `code`.
        if unsafe { sys::is_culib_present() } {
            if let Ok(text) = self.error_string() {
                return text.to_string_lossy().into_owned();
            }
        }
        "no description (libcuda not loaded)".to_string()
    }
}

impl CudaFailure for CompileError {
    fn code(&self) -> String {
        match self {
            CompileError::CreationError(e)
            | CompileError::CompileError { nvrtc: e, .. }
            | CompileError::GetLogError(e)
            | CompileError::GetPtxError(e)
            | CompileError::DestroyError(e) => format!("{:?}", e.0),
        }
    }

    fn message(&self) -> String {
        match self {
            CompileError::CompileError { options, log, .. } => format!(
                "compiling cuda/reduce.cu with {options:?}:\n{}",
                log.to_string_lossy()
            ),
            _ => "NVRTC failed outside compilation".to_string(),
        }
    }
}

/// The one conversion of a cudarc error into [`Error::Cuda`]: `.map_err(kernel_err("cuX"))`.
pub(crate) fn kernel_err<E: CudaFailure>(call: &'static str) -> impl Fn(E) -> Error {
    move |e| Error::Cuda {
        call,
        code: e.code(),
        message: e.message(),
    }
}

/// The reduce and scale kernels, loaded into one context.
#[derive(Debug)]
pub struct Kernels {
    ctx: Arc<CudaContext>,
    source: KernelSource,
    /// `reduce[reduce_index(op, dtype)]`: `PAIRWISE_OPS.len()` rows of `DType::ALL.len()`.
    reduce: Vec<CudaFunction>,
    /// `scale[dtype as usize]`.
    scale: Vec<CudaFunction>,
    /// `oneshot[reduce_index(op, dtype)]`: the same table shape as `reduce`.
    oneshot: Vec<CudaFunction>,
    /// `twoshot[reduce_index(op, dtype)]`: the same table shape as `reduce`.
    twoshot: Vec<CudaFunction>,
    /// The grid size that fills the device: SM count × `BLOCKS_PER_SM`.
    max_blocks: u32,
}

impl Kernels {
    /// Loads the kernels into `ctx` (the embedded fatbin, or NVRTC's PTX when the build had no
    /// nvcc) and resolves every function. Call once per context and share the result.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Kernels> {
        let (image, source) = kernel_image(ctx)?;
        let module = ctx
            .load_module(image)
            .map_err(kernel_err("cuModuleLoadData"))?;
        let load = |symbol: String| {
            module
                .load_function(&symbol)
                .map_err(kernel_err("cuModuleGetFunction"))
        };
        let reduce = PAIRWISE_OPS
            .iter()
            .flat_map(|&op| DType::ALL.map(|dtype| reduce_symbol(op, dtype)))
            .map(load)
            .collect::<Result<Vec<_>>>()?;
        let scale = DType::ALL
            .iter()
            .map(|&dtype| load(scale_symbol(dtype)))
            .collect::<Result<Vec<_>>>()?;
        let oneshot = PAIRWISE_OPS
            .iter()
            .flat_map(|&op| DType::ALL.map(|dtype| oneshot_symbol(op, dtype)))
            .map(load)
            .collect::<Result<Vec<_>>>()?;
        let twoshot = PAIRWISE_OPS
            .iter()
            .flat_map(|&op| DType::ALL.map(|dtype| twoshot_symbol(op, dtype)))
            .map(load)
            .collect::<Result<Vec<_>>>()?;

        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(kernel_err("cuDeviceGetAttribute"))?;
        let max_blocks = u32::try_from(sms).unwrap_or(1).max(1) * BLOCKS_PER_SM;

        Ok(Kernels {
            ctx: ctx.clone(),
            source,
            reduce,
            scale,
            oneshot,
            twoshot,
            max_blocks,
        })
    }

    /// Where the loaded code came from.
    pub fn source(&self) -> KernelSource {
        self.source
    }

    /// The context the kernels are loaded in; launches go to streams of this context only.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Enqueues `dst[i] = a[i] ⊕ b[i]` for `i < count` on `stream`, where ⊕ is
    /// `op.combine_op()` (`Avg` combines as `Sum`; its division is [`Kernels::scale`]).
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
            (&mut dst as *mut u64).cast(),
            (&mut a as *mut u64).cast(),
            (&mut b as *mut u64).cast(),
            (&mut count_arg as *mut u64).cast(),
        ];
        let function = &self.reduce[reduce_index(op, dtype)];
        // SAFETY: the function is rr_reduce_<op>_<dtype>(T*, const T*, const T*, unsigned long
        // long), matching the four 8-byte parameters above, which outlive the call (the driver
        // copies them at launch); the pointer contract is the caller's, stated above.
        unsafe { self.launch(stream, function, dtype, count, &mut params) }
    }

    /// Enqueues `x[i] = x[i] / world` for `i < count` on `stream`: the last step of `Avg`, as
    /// [`crate::element::Element::average`] defines it (floats times `1/world`, integers divided
    /// by `world as T`, truncating; `world == 0` acts as 1). `count == 0` enqueues nothing.
    ///
    /// # Safety
    ///
    /// Until the kernel has run on `stream`: `x` is a device address (`CUdeviceptr`) usable from
    /// this context (its own, or a peer's with peer access enabled), valid for `count` elements
    /// of `dtype`, and no other stream, device or host thread reads or writes that range unless
    /// ordered after this kernel. A misaligned `x` or a stream of another context is refused with
    /// an error before anything is enqueued.
    pub unsafe fn scale(
        &self,
        stream: &Stream,
        dtype: DType,
        x: u64,
        count: usize,
        world: usize,
    ) -> Result<()> {
        self.check_stream(stream)?;
        check_aligned(dtype, "x", x)?;
        if count == 0 {
            return Ok(());
        }
        let (mut x, mut count_arg, mut world_arg) = (x, count as u64, world as u64);
        let mut params: [*mut c_void; 3] = [
            (&mut x as *mut u64).cast(),
            (&mut count_arg as *mut u64).cast(),
            (&mut world_arg as *mut u64).cast(),
        ];
        let function = &self.scale[dtype as usize];
        // SAFETY: the function is rr_scale_<dtype>(T*, unsigned long long, unsigned long long),
        // matching the three 8-byte parameters above, which outlive the call; the pointer
        // contract is the caller's, stated above.
        unsafe { self.launch(stream, function, dtype, count, &mut params) }
    }

    /// Enqueues this rank's part of a one-shot all-reduce on `stream`: one kernel that waits
    /// at a start barrier until every rank's kernel of this call has started, then writes
    /// `dst[i] = src[0][i] ⊕ src[1][i] ⊕ … ⊕ src[world − 1][i]` for `i < count` (folded in rank
    /// order on every rank, so float results are bit-identical across ranks; ⊕ is
    /// `op.combine_op()`: `Avg` sums here and the caller then runs [`Kernels::scale`] on `dst`),
    /// and ends at an end barrier after which no rank reads this rank's input any more. The grid
    /// is [`oneshot_blocks`]`(dtype, count)` blocks of 512 threads. Returns once enqueued;
    /// errors are those of the checks below and of the launch. Barrier timeouts are reported
    /// by the kernel in `*args.error`, not here.
    ///
    /// Checked before anything is enqueued ([`Error::InvalidArgument`] unless said otherwise):
    /// `stream` belongs to this context; `args.world` in `2..=ONESHOT_MAX_RANKS` and
    /// `args.rank < args.world`; `args.dst` and `args.srcs[..world]` aligned to
    /// `dtype.size_bytes()`, `args.flags[..world]` and `args.error` aligned to 4; then, when
    /// `args.count > 0`: none of those addresses is null, `count × dtype.size_bytes()` fits
    /// ([`Error::SizeOverflow`]), and `dst`'s range overlaps no `srcs[r]` range (addresses are
    /// UVA, unique across devices). `count == 0` enqueues nothing.
    ///
    /// # Safety
    ///
    /// The call is one of `args.world` calls, one per rank `0..world`, each on its own device,
    /// with the same `dtype`, `op.combine_op()`, `count`, `epoch`, `srcs[..world]` and
    /// `flags[..world]`; all of them must be able to run at the same time (no rank's kernel
    /// may be ordered after another rank's kernel of the same call, or the barriers time out).
    /// Until this rank's kernel has completed on `stream` (and, for the inputs and flags, until
    /// every rank's kernel of this call has completed):
    /// - `srcs[r]` for `r < world` is rank `r`'s input, a device address readable from this
    ///   context (`srcs[rank]` this device's; the others a peer's, with peer access enabled from
    ///   this context and, for stream-ordered pool memory, pool access granted), valid for
    ///   `count` elements of `dtype`. Rank `r`'s input is written only by work that completes
    ///   before rank `r`'s kernel starts (e.g. earlier on rank `r`'s stream), and not again until
    ///   rank `r`'s kernel has completed (the end barrier makes that the point after which no
    ///   rank reads it);
    /// - `flags[r]` for `r < world` is rank `r`'s flag array: [`ONESHOT_FLAG_BYTES`] bytes of
    ///   device memory on rank `r`'s device, readable and writable from this context (peer
    ///   access), zeroed before the first call and used by no other group of kernels; `epoch` is
    ///   the previous call's epoch on these flags plus 1 (wrapping; 0 may be skipped; the first
    ///   call's is 1), and every call on these flags is made by all `world` ranks;
    /// - `dst` is device memory writable from this context, valid for `count` elements, disjoint
    ///   from every `srcs[r]` range, and read or written by no other work meanwhile;
    /// - `error` is a 4-byte word writable from this context (the device pointer of host-mapped
    ///   pinned memory, so the host can read it while kernels wait), zero before the call; the
    ///   kernel only ever stores a nonzero code there (1: start barrier timed out, 2: end
    ///   barrier timed out, 3: launch outside the kernel's assumptions). Every barrier gives up
    ///   once `timeout_ns` have passed since the block started (so the kernel ends within
    ///   `timeout_ns` of its start; 0: at once unless the peer is already there; `u64::MAX`:
    ///   never). After any nonzero code, on any rank, `dst` is undefined on every
    ///   rank, a peer may still be reading this rank's input, and the flags are out of step: no
    ///   further call may use them until every rank's kernels have completed and all flag arrays
    ///   are zeroed again (epochs restart at 1);
    /// - this device has room for the grid's blocks beside whatever else runs on it: a block
    ///   that cannot start holds up its peers' blocks of the same index until it can (or until
    ///   the timeout).
    pub unsafe fn oneshot(
        &self,
        dtype: DType,
        op: ReduceOp,
        args: &OneShotArgs,
        stream: &Stream,
    ) -> Result<()> {
        self.check_stream(stream)?;
        validate_oneshot(dtype, args)?;
        if args.count == 0 {
            return Ok(());
        }
        let mut peers = OneShotPeers::of(args.world, &args.srcs, &args.flags);
        let (mut world_arg, mut rank, mut dst, mut count, mut epoch, mut timeout_ns, mut error) = (
            args.world,
            args.rank,
            args.dst,
            args.count,
            args.epoch,
            args.timeout_ns,
            args.error,
        );
        let mut expose_from = args.expose_from;
        let mut params: [*mut c_void; 9] = [
            (&mut peers as *mut OneShotPeers).cast(),
            (&mut world_arg as *mut u32).cast(),
            (&mut rank as *mut u32).cast(),
            (&mut dst as *mut u64).cast(),
            (&mut count as *mut u64).cast(),
            (&mut epoch as *mut u32).cast(),
            (&mut timeout_ns as *mut u64).cast(),
            (&mut error as *mut u64).cast(),
            (&mut expose_from as *mut u64).cast(),
        ];
        let function = &self.oneshot[reduce_index(op, dtype)];
        let blocks = oneshot_blocks(dtype, usize::try_from(args.count).unwrap_or(usize::MAX));
        let blocks = match args.max_blocks {
            0 => blocks,
            cap => blocks.min(cap),
        };
        debug_assert!((1..=ONESHOT_MAX_BLOCKS).contains(&blocks));
        // SAFETY: the function is rr_oneshot_<op>_<dtype>(rr_peers, unsigned, unsigned, T*,
        // unsigned long long, unsigned, unsigned long long, unsigned*, const T*): `peers` is the
        // #[repr(C)] mirror of rr_peers (two arrays of 8 pointers, 128 bytes), then u32, u32,
        // u64, u64, u32, u64, u64, u64 in parameter order, all outliving the call (the driver copies them at
        // launch). The grid is at most ONESHOT_MAX_BLOCKS blocks of ONESHOT_BLOCK_THREADS, the
        // kernel's limits; the memory and the other ranks' calls are the caller's contract.
        unsafe { self.launch_grid(stream, function, blocks, ONESHOT_BLOCK_THREADS, &mut params) }
    }

    /// Enqueues this rank's part of a two-shot all-reduce on `stream`: one kernel that waits at
    /// a start barrier for every rank's kernel of this call, writes `outs[rank][s] = srcs[0][s] ⊕
    /// … ⊕ srcs[world − 1][s]` over its own segment `s = seg_off[rank]..+seg_len[rank]` (folded
    /// in rank order; `Avg` sums, the caller scales), meets the others at a middle barrier, then
    /// copies every other rank q's segment from `outs[q]` into `outs[rank]`, and ends at an end
    /// barrier after which no rank reads this rank's input or output any more. The grid is
    /// [`oneshot_blocks`] of the longest segment. Returns once enqueued; barrier timeouts are
    /// reported in `*args.error` (1 start, 4 middle, 2 end, 3 launch).
    ///
    /// Checked before anything is enqueued ([`Error::InvalidArgument`]): `stream` belongs to
    /// this context; world and rank as for [`Kernels::oneshot`]; the segments tile
    /// `0..count` in rank order (`seg_off[0] = 0`, each ends where the next begins, the last at
    /// `count`); every address aligned as in the one-shot and, when `count > 0`, not null; no
    /// output overlaps another rank's source or output, and each source is its own rank's
    /// output (in place) or overlaps no output at all (out of place).
    ///
    /// # Safety
    ///
    /// As for [`Kernels::oneshot`], with `srcs` the inputs (or, in place, the outputs) and
    /// `outs[r]` rank r's output, valid for `count` elements of `dtype` and readable from this
    /// context; every rank's call has the same `srcs`, `outs`, segments, `count`, `epoch`,
    /// `flags` and dtype. `outs[r]` is written by rank r's kernel only, and read or written by
    /// no other work until every rank's kernel of the call has completed.
    pub unsafe fn twoshot(
        &self,
        dtype: DType,
        op: ReduceOp,
        args: &TwoShotArgs,
        stream: &Stream,
    ) -> Result<()> {
        self.check_stream(stream)?;
        validate_twoshot(dtype, args)?;
        if args.count == 0 {
            return Ok(());
        }
        let world = args.world as usize;
        let mut peers = OneShotPeers::of(args.world, &args.srcs, &args.flags);
        let mut segs = TwoShotSegs {
            out: [0; ONESHOT_MAX_RANKS],
            off: [0; ONESHOT_MAX_RANKS],
            len: [0; ONESHOT_MAX_RANKS],
        };
        segs.out[..world].copy_from_slice(&args.outs[..world]);
        segs.off[..world].copy_from_slice(&args.seg_off[..world]);
        segs.len[..world].copy_from_slice(&args.seg_len[..world]);
        let (mut world_arg, mut rank, mut epoch, mut timeout_ns, mut error) = (
            args.world,
            args.rank,
            args.epoch,
            args.timeout_ns,
            args.error,
        );
        let mut params: [*mut c_void; 7] = [
            (&mut peers as *mut OneShotPeers).cast(),
            (&mut segs as *mut TwoShotSegs).cast(),
            (&mut world_arg as *mut u32).cast(),
            (&mut rank as *mut u32).cast(),
            (&mut epoch as *mut u32).cast(),
            (&mut timeout_ns as *mut u64).cast(),
            (&mut error as *mut u64).cast(),
        ];
        let function = &self.twoshot[reduce_index(op, dtype)];
        let longest = args.seg_len[..world].iter().copied().max().unwrap_or(0);
        let blocks = oneshot_blocks(dtype, usize::try_from(longest).unwrap_or(usize::MAX));
        let blocks = match args.max_blocks {
            0 => blocks,
            cap => blocks.min(cap),
        };
        debug_assert!((1..=ONESHOT_MAX_BLOCKS).contains(&blocks));
        // SAFETY: the function is rr_twoshot_<op>_<dtype>(rr_peers, rr_twoshot_segs, unsigned,
        // unsigned, unsigned, unsigned long long, unsigned*): `peers` and `segs` are the
        // #[repr(C)] mirrors of those structs (128 and 192 bytes), then u32, u32, u32, u64, u64
        // in parameter order, all outliving the call (the driver copies them at launch). The
        // grid is at most ONESHOT_MAX_BLOCKS blocks of ONESHOT_BLOCK_THREADS, the kernel's
        // limits; the memory and the other ranks' calls are the caller's contract.
        unsafe { self.launch_grid(stream, function, blocks, ONESHOT_BLOCK_THREADS, &mut params) }
    }

    /// Launches `function` over `count` elements of `dtype` with a grid that fills the device
    /// once (each kernel loops over the rest).
    ///
    /// # Safety
    ///
    /// `params` points at one value per kernel parameter, of the kernel's parameter types, and
    /// the memory the kernel touches satisfies the kernel's contract (see `reduce` / `scale`).
    unsafe fn launch(
        &self,
        stream: &Stream,
        function: &CudaFunction,
        dtype: DType,
        count: usize,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let blocks = grid_blocks(dtype, count, self.max_blocks);
        // SAFETY: the caller's contract, passed on; any grid suits the reduce and scale kernels.
        unsafe { self.launch_grid(stream, function, blocks, BLOCK_THREADS, params) }
    }

    /// Launches `function` with `blocks` blocks of `threads` threads on `stream`.
    ///
    /// # Safety
    ///
    /// As for `launch`, and the grid is one the kernel accepts.
    unsafe fn launch_grid(
        &self,
        stream: &Stream,
        function: &CudaFunction,
        blocks: u32,
        threads: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        device::bind(&self.ctx)?;
        // SAFETY: the function was loaded into self.ctx, which is current and owns `stream`
        // (check_stream); parameters, grid and memory are the caller's contract.
        unsafe {
            result::launch_kernel(
                function.cu_function(),
                (blocks, 1, 1),
                (threads, 1, 1),
                0,
                stream.raw(),
                params,
            )
        }
        .map_err(kernel_err("cuLaunchKernel"))
    }

    fn check_stream(&self, stream: &Stream) -> Result<()> {
        if stream.context().cu_ctx() == self.ctx.cu_ctx() {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "stream of device {} given to the kernels of device {}",
                stream.context().ordinal(),
                self.ctx.ordinal()
            )))
        }
    }
}

/// The arguments of one rank's one-shot kernel ([`Kernels::oneshot`]). Addresses are CUDA
/// device addresses (`CUdeviceptr`, UVA); entries `>= world` of `srcs` and `flags` are ignored.
#[derive(Clone, Copy, Debug)]
pub struct OneShotArgs {
    /// Every rank's input, by rank.
    pub srcs: [u64; ONESHOT_MAX_RANKS],
    /// Every rank's flag array ([`ONESHOT_FLAG_BYTES`] bytes on that rank's device), by rank.
    pub flags: [u64; ONESHOT_MAX_RANKS],
    /// Ranks taking part, 2..=[`ONESHOT_MAX_RANKS`].
    pub world: u32,
    /// This call's rank, `< world`.
    pub rank: u32,
    /// This rank's output: `count` elements, disjoint from every input.
    pub dst: u64,
    /// Elements per rank.
    pub count: u64,
    /// This call's barrier epoch: the previous call's on these flags + 1; the first call 1.
    pub epoch: u32,
    /// How long after its start the kernel gives up waiting at a barrier, in nanoseconds.
    pub timeout_ns: u64,
    /// Where the kernel stores a nonzero code on failure (1: start barrier timed out, 2: end
    /// barrier timed out, 3: a launch it cannot accept).
    pub error: u64,
    /// In place: the rank's in-place buffer (== `dst`), which each block copies, its own
    /// indices, into `srcs[rank]` (the exposed buffer) before the start barrier. 0 otherwise.
    /// Anything else is refused: blocks would copy from addresses other blocks write.
    pub expose_from: u64,
    /// At most this many blocks (0: no cap beyond [`ONESHOT_MAX_BLOCKS`]). Every block of every
    /// rank must be resident at once (a block spins for its partners), so the caller passes the
    /// smallest SM count of the ranks' GPUs (one block fits per SM), the same on every rank.
    pub max_blocks: u32,
}

/// The arguments of one rank's two-shot kernel ([`Kernels::twoshot`]). Addresses are CUDA
/// device addresses (UVA); entries `>= world` are ignored.
#[derive(Clone, Copy, Debug)]
pub struct TwoShotArgs {
    /// Every rank's source (its input out of place, its output in place), by rank.
    pub srcs: [u64; ONESHOT_MAX_RANKS],
    /// Every rank's output, by rank.
    pub outs: [u64; ONESHOT_MAX_RANKS],
    /// Every rank's flag array ([`ONESHOT_FLAG_BYTES`] bytes on that rank's device), by rank.
    pub flags: [u64; ONESHOT_MAX_RANKS],
    /// Segment q is elements `seg_off[q]..seg_off[q] + seg_len[q]`; rank q reduces it.
    pub seg_off: [u64; ONESHOT_MAX_RANKS],
    pub seg_len: [u64; ONESHOT_MAX_RANKS],
    /// Ranks taking part, 2..=[`ONESHOT_MAX_RANKS`].
    pub world: u32,
    /// This call's rank, `< world`.
    pub rank: u32,
    /// Elements per rank (the segments tile `0..count`).
    pub count: u64,
    /// This call's barrier epoch, as for the one-shot (the two kinds share the flags).
    pub epoch: u32,
    /// How long after its start the kernel gives up waiting at a barrier, in nanoseconds.
    pub timeout_ns: u64,
    /// Where the kernel stores a nonzero code on failure (1 start, 4 middle, 2 end, 3 launch).
    pub error: u64,
    /// At most this many blocks (0: no cap beyond [`ONESHOT_MAX_BLOCKS`]), as for the one-shot.
    pub max_blocks: u32,
}

/// The kernel parameter `rr_twoshot_segs` of `cuda/reduce.cu`, byte for byte: every rank's
/// output, then the segments' offsets and lengths in elements.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct TwoShotSegs {
    out: [u64; ONESHOT_MAX_RANKS],
    off: [u64; ONESHOT_MAX_RANKS],
    len: [u64; ONESHOT_MAX_RANKS],
}

/// The checks of [`Kernels::twoshot`] that need no GPU (see there).
fn validate_twoshot(dtype: DType, args: &TwoShotArgs) -> Result<()> {
    let world = args.world as usize;
    let bad = |why: String| Err(Error::InvalidArgument(format!("two-shot {why}")));
    if !(2..=ONESHOT_MAX_RANKS).contains(&world) {
        return bad(format!(
            "world = {world}: the kernel serves 2 to {ONESHOT_MAX_RANKS} ranks"
        ));
    }
    if args.rank >= args.world {
        return bad(format!("rank = {} is not below world = {world}", args.rank));
    }
    let mut end = 0u64;
    for q in 0..world {
        if args.seg_off[q] != end {
            return bad(format!(
                "segment {q} starts at {} where segment {} ended ({end})",
                args.seg_off[q],
                q.saturating_sub(1)
            ));
        }
        end = end.saturating_add(args.seg_len[q]);
    }
    if end != args.count {
        return bad(format!(
            "segments end at {end}, not at count = {}",
            args.count
        ));
    }
    for r in 0..world {
        check_aligned(dtype, &format!("srcs[{r}]"), args.srcs[r])?;
        check_aligned(dtype, &format!("outs[{r}]"), args.outs[r])?;
        check_word_aligned(&format!("flags[{r}]"), args.flags[r])?;
    }
    check_word_aligned("error", args.error)?;
    if args.count == 0 {
        return Ok(());
    }
    let null = std::iter::once(("error".to_string(), args.error))
        .chain((0..world).map(|r| (format!("srcs[{r}]"), args.srcs[r])))
        .chain((0..world).map(|r| (format!("outs[{r}]"), args.outs[r])))
        .chain((0..world).map(|r| (format!("flags[{r}]"), args.flags[r])))
        .find(|&(_, address)| address == 0);
    if let Some((name, _)) = null {
        return bad(format!("{name} is null for {} elements", args.count));
    }
    let bytes = args
        .count
        .checked_mul(dtype.size_bytes() as u64)
        .filter(|&b| usize::try_from(b).is_ok())
        .ok_or(Error::SizeOverflow {
            count: usize::try_from(args.count).unwrap_or(usize::MAX),
            dtype,
        })?;
    let overlaps = |a: u64, b: u64| a < b.saturating_add(bytes) && b < a.saturating_add(bytes);
    for r in 0..world {
        for q in 0..world {
            if q != r && overlaps(args.outs[r], args.outs[q]) {
                return bad(format!("outs[{r}] overlaps outs[{q}]"));
            }
            let in_place = args.srcs[q] == args.outs[q];
            if overlaps(args.outs[r], args.srcs[q]) && !(in_place && q == r) {
                return bad(format!(
                    "outs[{r}] = {:#x} overlaps srcs[{q}] = {:#x}: a source is either its own \
                     rank's output (in place) or disjoint from every output",
                    args.outs[r], args.srcs[q]
                ));
            }
        }
    }
    Ok(())
}

/// The kernel parameter `rr_peers` of `cuda/reduce.cu`, byte for byte: two arrays of
/// `RR_ONESHOT_MAX_RANKS` pointers.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct OneShotPeers {
    src: [u64; ONESHOT_MAX_RANKS],
    flags: [u64; ONESHOT_MAX_RANKS],
}

impl OneShotPeers {
    /// The first `world` entries of `srcs` and `flags` (validated: `world <= ONESHOT_MAX_RANKS`);
    /// the kernel reads entries < world only, the rest are zeroed rather than passed on.
    fn of(world: u32, srcs: &[u64; ONESHOT_MAX_RANKS], flags: &[u64; ONESHOT_MAX_RANKS]) -> Self {
        let world = world as usize;
        let mut peers = OneShotPeers {
            src: [0; ONESHOT_MAX_RANKS],
            flags: [0; ONESHOT_MAX_RANKS],
        };
        peers.src[..world].copy_from_slice(&srcs[..world]);
        peers.flags[..world].copy_from_slice(&flags[..world]);
        peers
    }
}

/// Blocks of the one-shot grid for `count` elements of `dtype`: a function of (dtype, count)
/// only, so every rank computes the same grid; between 1 and [`ONESHOT_MAX_BLOCKS`].
///
/// One block per 32 KiB of one rank's input (one loop iteration of 4 × 16 B per thread per
/// source), so small messages finish in one round of loads per source and large ones (from
/// 4 MiB) use 128 blocks, enough to keep NVLink busy, while the whole grid (one block per SM:
/// up to 128 registers a thread) fits on an H200's 132 SMs, so all blocks of every rank are
/// resident together.
pub fn oneshot_blocks(dtype: DType, count: usize) -> u32 {
    let bytes = (count as u64).saturating_mul(dtype.size_bytes() as u64);
    bytes
        .div_ceil(ONESHOT_BYTES_PER_BLOCK)
        .clamp(1, u64::from(ONESHOT_MAX_BLOCKS)) as u32
}

/// The checks of [`Kernels::oneshot`] that need no GPU (see there).
fn validate_oneshot(dtype: DType, args: &OneShotArgs) -> Result<()> {
    let world = args.world as usize;
    if !(2..=ONESHOT_MAX_RANKS).contains(&world) {
        return Err(Error::InvalidArgument(format!(
            "one-shot world = {world}: the kernel serves 2 to {ONESHOT_MAX_RANKS} ranks"
        )));
    }
    if args.rank >= args.world {
        return Err(Error::InvalidArgument(format!(
            "one-shot rank = {} is not below world = {world}",
            args.rank
        )));
    }
    check_aligned(dtype, "dst", args.dst)?;
    for r in 0..world {
        check_aligned(dtype, &format!("srcs[{r}]"), args.srcs[r])?;
        check_word_aligned(&format!("flags[{r}]"), args.flags[r])?;
    }
    check_word_aligned("error", args.error)?;
    if args.count == 0 {
        return Ok(());
    }

    let named = [("dst", args.dst), ("error", args.error)];
    let null = named
        .into_iter()
        .map(|(name, address)| (name.to_string(), address))
        .chain((0..world).map(|r| (format!("srcs[{r}]"), args.srcs[r])))
        .chain((0..world).map(|r| (format!("flags[{r}]"), args.flags[r])))
        .find(|&(_, address)| address == 0);
    if let Some((name, _)) = null {
        return Err(Error::InvalidArgument(format!(
            "one-shot {name} is null for {} elements",
            args.count
        )));
    }
    let bytes = args
        .count
        .checked_mul(dtype.size_bytes() as u64)
        .filter(|&b| usize::try_from(b).is_ok())
        .ok_or(Error::SizeOverflow {
            count: usize::try_from(args.count).unwrap_or(usize::MAX),
            dtype,
        })?;
    let overlaps = |a: u64, b: u64| a < b.saturating_add(bytes) && b < a.saturating_add(bytes);
    if let Some(r) = (0..world).find(|&r| overlaps(args.dst, args.srcs[r])) {
        return Err(Error::InvalidArgument(format!(
            "one-shot dst = {:#x} overlaps srcs[{r}] = {:#x} ({bytes} bytes each): the one-shot \
             is out of place only",
            args.dst, args.srcs[r]
        )));
    }
    if args.expose_from != 0 && args.expose_from != args.dst {
        return Err(Error::InvalidArgument(format!(
            "one-shot expose_from = {:#x} must be 0 or dst = {:#x} (the in-place buffer)",
            args.expose_from, args.dst
        )));
    }
    if args.expose_from != 0 {
        check_aligned(dtype, "expose_from", args.expose_from)?;
        if let Some(r) = (0..world).find(|&r| overlaps(args.expose_from, args.srcs[r])) {
            return Err(Error::InvalidArgument(format!(
                "one-shot expose_from = {:#x} overlaps srcs[{r}] = {:#x}: it is copied into \
                 srcs[rank], which must be a separate buffer",
                args.expose_from, args.srcs[r]
            )));
        }
    }
    Ok(())
}

fn check_word_aligned(name: &str, address: u64) -> Result<()> {
    if address % 4 == 0 {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{name} = {address:#x} is not aligned to 4 bytes, the size of a flag word"
        )))
    }
}

/// The code to load into `ctx`: the embedded fatbin when the build has one.
#[cfg(ringreduce_fatbin)]
fn kernel_image(_ctx: &Arc<CudaContext>) -> Result<(Ptx, KernelSource)> {
    // cuModuleLoadData reads the fatbin in place; the copy lives in a heap block, which the
    // system allocator aligns to 16 bytes (the image's header wants 8).
    Ok((
        Ptx::from_binary(FATBIN.to_vec()),
        KernelSource::EmbeddedFatbin,
    ))
}

/// The code to load into `ctx`: NVRTC's PTX for the device's compute capability.
#[cfg(not(ringreduce_fatbin))]
fn kernel_image(ctx: &Arc<CudaContext>) -> Result<(Ptx, KernelSource)> {
    // SAFETY: only probes whether libnvrtc can be loaded; cudarc panics on first use otherwise.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::Cuda {
            call: "nvrtcCreateProgram",
            code: "NVRTC_LIBRARY_NOT_FOUND".to_string(),
            message: "libnvrtc could not be loaded, and this build has no embedded kernels \
                      (build with nvcc: set NVCC, see .ci/install-nvcc.sh)"
                .to_string(),
        });
    }
    let (major, minor) = ctx
        .compute_capability()
        .map_err(kernel_err("cuDeviceGetAttribute"))?;
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(SOURCE, nvrtc_options(major, minor))
        .map_err(kernel_err("nvrtcCompileProgram"))?;
    Ok((ptx, KernelSource::Nvrtc))
}

/// NVRTC's options for a device of compute capability `major.minor`: PTX for exactly that
/// architecture, no include paths (the source needs none).
#[cfg(not(ringreduce_fatbin))]
fn nvrtc_options(major: i32, minor: i32) -> cudarc::nvrtc::CompileOptions {
    cudarc::nvrtc::CompileOptions {
        // Same IEEE behaviour as nvcc's build (see build.rs) and the host executor.
        ftz: Some(false),
        prec_div: Some(true),
        fmad: Some(false),
        options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
        name: Some("reduce.cu".to_string()),
        ..Default::default()
    }
}

/// Index into `Kernels::reduce`: row `op.combine_op()` in `PAIRWISE_OPS`, column `dtype`.
fn reduce_index(op: ReduceOp, dtype: DType) -> usize {
    let row = match op.combine_op() {
        ReduceOp::Sum | ReduceOp::Avg => 0,
        ReduceOp::Prod => 1,
        ReduceOp::Min => 2,
        ReduceOp::Max => 3,
    };
    row * DType::ALL.len() + dtype as usize
}

fn reduce_symbol(op: ReduceOp, dtype: DType) -> String {
    format!("rr_reduce_{}_{}", op.name(), dtype.name())
}

fn oneshot_symbol(op: ReduceOp, dtype: DType) -> String {
    format!("rr_oneshot_{}_{}", op.name(), dtype.name())
}

fn twoshot_symbol(op: ReduceOp, dtype: DType) -> String {
    format!("rr_twoshot_{}_{}", op.name(), dtype.name())
}

fn scale_symbol(dtype: DType) -> String {
    format!("rr_scale_{}", dtype.name())
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

fn check_aligned(dtype: DType, name: &str, address: u64) -> Result<()> {
    let size = dtype.size_bytes() as u64;
    if address % size == 0 {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{name} = {address:#x} is not aligned to {size} bytes, the size of {dtype}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The (symbol, op, type) arguments of every `MACRO(` line of the kernel source.
    fn invocations(macro_name: &str) -> Vec<Vec<String>> {
        let prefix = format!("{macro_name}(");
        SOURCE
            .lines()
            .filter_map(|line| line.trim().strip_prefix(prefix.as_str()))
            .map(|rest| {
                rest.trim_end()
                    .strip_suffix(')')
                    .unwrap_or_else(|| panic!("unterminated {macro_name} line: {rest}"))
                    .split(',')
                    .map(|arg| arg.trim().to_string())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn dtype_discriminants_follow_all() {
        for (i, dtype) in DType::ALL.into_iter().enumerate() {
            assert_eq!(dtype as usize, i, "{dtype}");
        }
    }

    #[test]
    fn table_covers_every_op_and_type() {
        let mut seen = BTreeSet::new();
        for op in ReduceOp::ALL {
            for dtype in DType::ALL {
                let index = reduce_index(op, dtype);
                assert!(index < PAIRWISE_OPS.len() * DType::ALL.len());
                // Kernels::new loads row-major over PAIRWISE_OPS × DType::ALL.
                let loaded_op = PAIRWISE_OPS[index / DType::ALL.len()];
                let loaded_type = DType::ALL[index % DType::ALL.len()];
                assert_eq!(
                    reduce_symbol(loaded_op, loaded_type),
                    reduce_symbol(op.combine_op(), dtype)
                );
                seen.insert(index);
            }
        }
        assert_eq!(seen.len(), PAIRWISE_OPS.len() * DType::ALL.len());
        assert_eq!(
            reduce_symbol(ReduceOp::Avg, DType::BF16),
            "rr_reduce_avg_bf16"
        );
        assert_eq!(
            reduce_index(ReduceOp::Avg, DType::BF16),
            reduce_index(ReduceOp::Sum, DType::BF16)
        );
    }

    #[test]
    fn source_defines_every_reduce_kernel() {
        defines_the_family("RR_REDUCE", "rr_reduce", reduce_symbol);
    }

    #[test]
    fn source_defines_every_scale_kernel() {
        let mut defined = BTreeSet::new();
        for args in invocations("RR_SCALE") {
            let [symbol, ty] = args.as_slice() else {
                panic!("RR_SCALE takes (symbol, type): {args:?}");
            };
            assert_eq!(
                *symbol,
                format!("rr_scale_{}", ty.trim_start_matches("rr_"))
            );
            assert!(defined.insert(symbol.clone()), "{symbol} defined twice");
        }
        let wanted: BTreeSet<String> = DType::ALL.into_iter().map(scale_symbol).collect();
        assert_eq!(defined, wanted);
    }

    /// The source invokes `macro_name(symbol, op, type)` exactly once for every pairwise op and
    /// type, with the symbol `symbol_of` names, built from that op and type.
    fn defines_the_family(
        macro_name: &str,
        prefix: &str,
        symbol_of: fn(ReduceOp, DType) -> String,
    ) {
        let mut defined = BTreeSet::new();
        for args in invocations(macro_name) {
            let [symbol, op, ty] = args.as_slice() else {
                panic!("{macro_name} takes (symbol, op, type): {args:?}");
            };
            assert_eq!(
                *symbol,
                format!("{prefix}_{op}_{}", ty.trim_start_matches("rr_")),
                "the symbol must name the op and type it is built from"
            );
            assert!(defined.insert(symbol.clone()), "{symbol} defined twice");
        }
        let wanted: BTreeSet<String> = PAIRWISE_OPS
            .iter()
            .flat_map(|&op| DType::ALL.map(|dtype| symbol_of(op, dtype)))
            .collect();
        assert_eq!(defined, wanted);
    }

    #[test]
    fn source_defines_every_oneshot_kernel() {
        defines_the_family("RR_ONESHOT", "rr_oneshot", oneshot_symbol);
        assert_eq!(
            oneshot_symbol(ReduceOp::Avg.combine_op(), DType::F16),
            "rr_oneshot_sum_f16"
        );
    }

    #[test]
    fn source_defines_every_twoshot_kernel() {
        defines_the_family("RR_TWOSHOT", "rr_twoshot", twoshot_symbol);
    }

    /// The value of `#define name value` in the kernel source.
    fn define(name: &str) -> u64 {
        let prefix = format!("#define {name} ");
        let values: Vec<u64> = SOURCE
            .lines()
            .filter_map(|line| line.strip_prefix(prefix.as_str()))
            .map(|value| value.trim().parse().expect("a decimal #define"))
            .collect();
        assert_eq!(values.len(), 1, "#define {name} must appear once");
        values[0]
    }

    #[test]
    fn oneshot_constants_match_the_source() {
        assert_eq!(define("RR_ONESHOT_MAX_RANKS"), ONESHOT_MAX_RANKS as u64);
        assert_eq!(
            define("RR_ONESHOT_MAX_BLOCKS"),
            u64::from(ONESHOT_MAX_BLOCKS)
        );
        assert_eq!(
            define("RR_ONESHOT_THREADS"),
            u64::from(ONESHOT_BLOCK_THREADS)
        );
        // One block iteration: threads × 16 B × unroll.
        assert_eq!(
            u64::from(ONESHOT_BLOCK_THREADS) * VECTOR_BYTES as u64 * define("RR_ONESHOT_UNROLL"),
            ONESHOT_BYTES_PER_BLOCK
        );
        assert_eq!(define("RR_ONESHOT_PHASES"), ONESHOT_PHASES as u64);
        assert_eq!(ONESHOT_FLAG_BYTES, 3 * 128 * 8 * 4);
        // The last word, (3 * MAX_BLOCKS - 1) * MAX_RANKS + MAX_RANKS - 1, is in range.
        let last_word =
            (ONESHOT_MAX_BLOCKS as usize * 3 - 1) * ONESHOT_MAX_RANKS + ONESHOT_MAX_RANKS - 1;
        assert_eq!((last_word + 1) * 4, ONESHOT_FLAG_BYTES);
    }

    #[test]
    fn twoshot_segs_is_the_kernel_parameter() {
        // struct rr_twoshot_segs { void* out[8]; rr_ull off[8]; rr_ull len[8]; }.
        assert_eq!(size_of::<TwoShotSegs>(), 192);
        assert_eq!(std::mem::offset_of!(TwoShotSegs, off), 64);
        assert_eq!(std::mem::offset_of!(TwoShotSegs, len), 128);
    }

    fn twoshot_args(in_place: bool) -> TwoShotArgs {
        let mut args = TwoShotArgs {
            srcs: [0; 8],
            outs: [0; 8],
            flags: [0; 8],
            seg_off: [0; 8],
            seg_len: [0; 8],
            world: 2,
            rank: 1,
            count: 100,
            epoch: 1,
            timeout_ns: 1_000_000,
            error: 0x9000,
            max_blocks: 0,
        };
        args.outs[..2].copy_from_slice(&[0x10_0000, 0x20_0000]);
        let srcs = if in_place {
            [0x10_0000, 0x20_0000]
        } else {
            [0x30_0000, 0x40_0000]
        };
        args.srcs[..2].copy_from_slice(&srcs);
        args.flags[..2].copy_from_slice(&[0x5000, 0x6000]);
        args.seg_off[..2].copy_from_slice(&[0, 52]);
        args.seg_len[..2].copy_from_slice(&[52, 48]);
        args
    }

    #[test]
    fn twoshot_arguments_are_validated() {
        let why = |args: &TwoShotArgs| match validate_twoshot(DType::F32, args) {
            Err(Error::InvalidArgument(why)) => why,
            other => panic!("not refused: {other:?}"),
        };
        validate_twoshot(DType::F32, &twoshot_args(true)).unwrap();
        validate_twoshot(DType::F32, &twoshot_args(false)).unwrap();
        let mut gap = twoshot_args(true);
        gap.seg_off[1] = 53;
        assert!(
            why(&gap).contains("segment 1 starts at 53"),
            "{}",
            why(&gap)
        );
        let mut short = twoshot_args(true);
        short.seg_len[1] = 47;
        assert!(why(&short).contains("not at count"), "{}", why(&short));
        let mut crossed = twoshot_args(false);
        crossed.srcs[0] = crossed.outs[1];
        assert!(
            why(&crossed).contains("overlaps srcs[0]"),
            "{}",
            why(&crossed)
        );
        let mut shared = twoshot_args(true);
        shared.outs[1] = shared.outs[0] + 8;
        assert!(why(&shared).contains("overlaps outs"), "{}", why(&shared));
        let mut lonely = twoshot_args(true);
        lonely.world = 1;
        lonely.rank = 0;
        assert!(why(&lonely).contains("world = 1"), "{}", why(&lonely));
        let mut null = twoshot_args(true);
        null.flags[1] = 0;
        assert!(why(&null).contains("flags[1] is null"), "{}", why(&null));
    }

    #[test]
    fn oneshot_peers_is_the_kernel_parameter() {
        // struct rr_peers { const void* src[8]; unsigned* flags[8]; } on a 64-bit device.
        assert_eq!(size_of::<OneShotPeers>(), 128);
        assert_eq!(std::mem::align_of::<OneShotPeers>(), 8);
        assert_eq!(std::mem::offset_of!(OneShotPeers, src), 0);
        assert_eq!(std::mem::offset_of!(OneShotPeers, flags), 64);
    }

    #[test]
    fn oneshot_grid_is_bounded_and_monotonic() {
        // 32 KiB of one rank's input per block.
        assert_eq!(oneshot_blocks(DType::F32, 0), 1);
        assert_eq!(oneshot_blocks(DType::F32, 1), 1);
        assert_eq!(oneshot_blocks(DType::F32, 8 << 10), 1);
        assert_eq!(oneshot_blocks(DType::F32, (8 << 10) + 1), 2);
        assert_eq!(oneshot_blocks(DType::U8, 1 << 20), 32);
        assert_eq!(oneshot_blocks(DType::F64, 1 << 20), 128);
        assert_eq!(oneshot_blocks(DType::F16, usize::MAX), ONESHOT_MAX_BLOCKS);
        for dtype in DType::ALL {
            let mut previous = 1;
            for shift in 0..40 {
                for count in [(1usize << shift) - 1, 1 << shift, (1 << shift) + 1] {
                    let blocks = oneshot_blocks(dtype, count);
                    assert!(
                        (1..=ONESHOT_MAX_BLOCKS).contains(&blocks),
                        "{dtype} {count}"
                    );
                    assert!(blocks >= previous, "{dtype} {count}: {blocks} < {previous}");
                    previous = blocks;
                }
            }
            assert_eq!(previous, ONESHOT_MAX_BLOCKS);
        }
    }

    /// Arguments for rank 0 of 2 that pass validation: f32 inputs 64 MiB apart.
    fn oneshot_args() -> OneShotArgs {
        let base = 0x7f00_0000_0000_u64;
        OneShotArgs {
            srcs: std::array::from_fn(|r| base + ((r as u64) << 26)),
            flags: std::array::from_fn(|r| base + (1 << 32) + ((r as u64) << 16)),
            world: 2,
            rank: 0,
            dst: base + (1 << 33),
            count: 1 << 20,
            epoch: 1,
            timeout_ns: 1_000_000_000,
            error: base + (1 << 34),
            expose_from: 0,
            max_blocks: 0,
        }
    }

    fn invalid(dtype: DType, args: &OneShotArgs) -> String {
        match validate_oneshot(dtype, args) {
            Err(Error::InvalidArgument(why)) => why,
            other => panic!("expected InvalidArgument for {args:?}, got {other:?}"),
        }
    }

    #[test]
    fn oneshot_arguments_are_validated() {
        let ok = oneshot_args();
        assert_eq!(validate_oneshot(DType::F32, &ok), Ok(()));
        for world in 2..=ONESHOT_MAX_RANKS as u32 {
            for rank in 0..world {
                let args = OneShotArgs { world, rank, ..ok };
                assert_eq!(
                    validate_oneshot(DType::F32, &args),
                    Ok(()),
                    "{world} {rank}"
                );
            }
        }

        for world in [0, 1, 9, u32::MAX] {
            let why = invalid(DType::F32, &OneShotArgs { world, ..ok });
            assert!(why.contains(&format!("world = {world}")), "{why}");
        }
        for (world, rank) in [(2, 2), (2, 7), (8, 8)] {
            let why = invalid(DType::F32, &OneShotArgs { world, rank, ..ok });
            assert!(why.contains(&format!("rank = {rank}")), "{why}");
        }

        let mut args = ok;
        args.srcs[1] += 2;
        assert!(invalid(DType::F32, &args).contains("srcs[1]"));
        assert_eq!(validate_oneshot(DType::F16, &args), Ok(()));
        // Entries at or above world are not looked at.
        let mut args = ok;
        args.srcs[2] = 0x3;
        args.flags[5] = 0;
        assert_eq!(validate_oneshot(DType::F64, &args), Ok(()));
        let mut args = ok;
        args.flags[1] += 2;
        assert!(invalid(DType::U8, &args).contains("flags[1]"));
        assert!(invalid(
            DType::F32,
            &OneShotArgs {
                error: ok.error + 1,
                ..ok
            }
        )
        .contains("error"));
        // The in-place exposure: its source may be dst, never an exposed buffer, and aligned.
        validate_oneshot(
            DType::F32,
            &OneShotArgs {
                expose_from: ok.dst,
                ..ok
            },
        )
        .unwrap();
        for bad in [ok.srcs[1] + 64, ok.dst + 2, ok.dst + 4] {
            assert!(invalid(
                DType::F32,
                &OneShotArgs {
                    expose_from: bad,
                    ..ok
                }
            )
            .contains("must be 0 or dst"));
        }

        // Null pointers are refused only when there is something to do.
        let mut args = ok;
        args.flags[0] = 0;
        assert!(invalid(DType::F32, &args).contains("flags[0] is null"));
        args.count = 0;
        assert_eq!(validate_oneshot(DType::F32, &args), Ok(()));

        // Out of place only: dst may touch an input's end but not overlap it.
        let bytes = ok.count * 4;
        let args = OneShotArgs {
            dst: ok.srcs[1] + bytes,
            ..ok
        };
        assert_eq!(validate_oneshot(DType::F32, &args), Ok(()));
        let args = OneShotArgs {
            dst: ok.srcs[1] + bytes - 4,
            ..ok
        };
        assert!(invalid(DType::F32, &args).contains("overlaps srcs[1]"));
        let args = OneShotArgs {
            dst: ok.srcs[0] - bytes + 4,
            ..ok
        };
        assert!(invalid(DType::F32, &args).contains("overlaps srcs[0]"));

        let args = OneShotArgs {
            count: u64::MAX / 2,
            ..ok
        };
        assert!(matches!(
            validate_oneshot(DType::F32, &args),
            Err(Error::SizeOverflow {
                dtype: DType::F32,
                ..
            })
        ));
    }

    #[test]
    fn source_needs_no_header() {
        // NVRTC compiles it at run time with no include paths.
        assert!(!SOURCE
            .lines()
            .any(|l| l.trim_start().starts_with("#include")));
    }

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

    #[test]
    fn misaligned_addresses_are_refused() {
        assert!(check_aligned(DType::F32, "a", 0x1000).is_ok());
        assert!(check_aligned(DType::F32, "a", 0x1004).is_ok());
        assert!(check_aligned(DType::U8, "a", 0x1003).is_ok());
        let err = check_aligned(DType::F64, "dst", 0x1004).unwrap_err();
        assert!(err.to_string().contains("dst = 0x1004"), "{err}");
    }

    #[test]
    fn driver_errors_become_error_cuda_with_the_call() {
        let err =
            kernel_err("cuLaunchKernel")(DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE));
        let Error::Cuda { call, code, .. } = err else {
            panic!("not Error::Cuda: {err:?}");
        };
        assert_eq!(call, "cuLaunchKernel");
        assert_eq!(code, "CUDA_ERROR_INVALID_VALUE");
    }

    #[test]
    fn build_kind_names_the_path() {
        let kind = build_kind();
        if cfg!(ringreduce_fatbin) {
            assert!(kind.starts_with("embedded fatbin"), "{kind}");
        } else {
            assert!(kind.starts_with("NVRTC"), "{kind}");
        }
    }
}
