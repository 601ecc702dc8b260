//! The kernels on the GPU: the kernel source in `cuda/` loaded into a context ([`KernelModule`]),
//! launched by table index.
//!
//! Every ring step on a GPU ends in one kernel, `dst[i] = a[i] ⊕ b[i]` (the received segment
//! combined with the local partial), and `Avg` ends with one more, `x[i] = x[i] / world`
//! (module `reduce`). The peer kernels (module `peer`) are one kernel per rank that reads
//! every rank's memory directly (peer access) and meets the other ranks' kernels at barriers of
//! flags written into peer memory: the one-shot all-reduce ([`KernelModule::oneshot`]) folds
//! every rank's input in rank order into `dst` between a start and an end barrier; the two-shot
//! ([`KernelModule::twoshot`]), with three barriers, reduces the rank's own segment from every
//! rank's input, then copies the other segments from their owners; the steps kernel
//! ([`KernelModule::steps`]) runs the one-shot form of every other collective between one start
//! and one end barrier. The LL one-shot (module `ll`, [`KernelModule::ll`]) computes the
//! one-shot's result for small messages without barriers: each rank pushes its input into every
//! peer's receive buffer as self-validating words and folds what arrives in its own
//! ([`LL_MAX_BYTES`] says up to which size; the executor runs it only when
//! [`crate::CudaConfig::low_latency`] is on). Their semantics are those of [`crate::element`];
//! the kernels themselves, the flag layout, the memory ordering and why they are fast are
//! described in `cuda/` (`reduce.cuh`, `peer.cuh`, `peer_kernels.cuh`, `ll.cuh`). The codes a
//! kernel leaves in its error word are defined once, in `cuda/error_codes.cuh`, whose Rust
//! constants `build.rs` generates (module `error_codes`, [`ERROR_CODES`]).
//!
//! Where the code comes from is decided at build time (see `build.rs`):
//! - nvcc was found: the build embeds `reduce.fatbin` (SASS for sm_80 and sm_90, PTX for
//!   compute_90) and [`KernelModule::new`] loads it ([`KernelSource::EmbeddedFatbin`]);
//! - otherwise, or where the driver refuses that fatbin: [`KernelModule::new`] loads the same
//!   source compiled by NVRTC into machine code for the device ([`KernelSource::Nvrtc`]); that
//!   needs libnvrtc on the GPU host, and takes minutes once per host and NVRTC version: the
//!   image is kept in the process and in a disk cache (module `nvrtc`).
//!
//! Invariant: a [`KernelModule`] holds all 254 functions (4 operators × 12 types of pairwise
//! reduce, of one-shot, two-shot and LL one-shot all-reduce and of the steps kernel, one scale
//! kernel per type, and the two counter kernels of captured rings, module `counters`) resolved in
//! its context, so a launch is a table index and one `cuLaunchKernel`, with no lookup and no
//! allocation.

mod counters;
mod error_codes;
mod ll;
mod nvrtc;
mod peer;
mod reduce;
mod steps;

pub use error_codes::{
    COUNTER_ERR_BIT, ERROR_CODES, ERR_PEER_LOST, LL_ERR_WAIT, PEER_ERR_END, PEER_ERR_LAUNCH,
    PEER_ERR_MIDDLE, PEER_ERR_START,
};
pub use ll::{ll_blocks, ll_fits, ll_recv_bytes, LlArgs, LL_MAX_BYTES};
pub use nvrtc::{cache_dir as kernel_cache_dir, version as nvrtc_version};
pub use peer::{
    peer_blocks, OneShotArgs, TwoShotArgs, PEER_FLAG_BYTES, PEER_MAX_BLOCKS, PEER_MAX_RANKS,
};
pub use steps::{PeerStep, StepsArgs};

use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaFunction};

use crate::device::{self, Stream};
#[cfg(ringreduce_fatbin)]
use cudarc::nvrtc::Ptx;

use crate::element::{DType, ReduceOp};
use crate::error::{Error, Result};

/// The kernel source, for NVRTC (and for the tests that check it defines every symbol): the
/// parts in `cuda/` joined by `build.rs` (its `PARTS` lists them in order), the same text nvcc
/// compiles. Embedded in every build: a driver that refuses the embedded fatbin (one older than
/// the nvcc that built it) gets it compiled by NVRTC instead.
const SOURCE: &str = include_str!(concat!(env!("OUT_DIR"), "/ringreduce_kernels.cu"));

/// The kernels compiled by nvcc at build time.
#[cfg(ringreduce_fatbin)]
static FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/reduce.fatbin"));

/// Threads per block of every launch.
const BLOCK_THREADS: u32 = 256;
/// Blocks per SM in a full grid: 8 × 256 = 2048 threads, the most an sm_80/sm_90 SM holds.
const BLOCKS_PER_SM: u32 = 8;
/// Bytes one thread moves per pointer per loop iteration on the vector path (a `uint4`).
const VECTOR_BYTES: usize = 16;

/// The pairwise operators that have kernels, in table order (`Avg` combines as `Sum`).
const PAIRWISE_OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max];

/// Where the loaded kernels came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelSource {
    /// The fatbin nvcc built and the build embedded.
    EmbeddedFatbin,
    /// The kernel source (`cuda/`, joined by `build.rs`) compiled by NVRTC when the
    /// [`KernelModule`] were made: the build had no nvcc, or `RINGREDUCE_KERNELS=nvrtc`.
    Nvrtc,
    /// NVRTC's, because the driver refused the embedded fatbin ([`driver_refused_image`]: a
    /// driver older than the nvcc that built it, such as a CUDA 12 driver for kernels built
    /// by nvcc 13).
    NvrtcAfterFatbin,
}

impl fmt::Display for KernelSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KernelSource::EmbeddedFatbin => "embedded fatbin",
            KernelSource::Nvrtc => "NVRTC",
            KernelSource::NvrtcAfterFatbin => "NVRTC (the driver refused the embedded fatbin)",
        })
    }
}

/// Which kernel path this build has, for `ringreduce info` and reports: the embedded fatbin's
/// code, as read from the fatbin itself ([`fatbin_entries`]), and the nvcc that built it.
pub fn build_kind() -> String {
    #[cfg(ringreduce_fatbin)]
    {
        let entries = fatbin_entries(FATBIN)
            .map(|e| describe_entries(&e))
            .unwrap_or_else(|| "unreadable".into());
        format!(
            "embedded fatbin ({entries}; nvcc {})",
            env!("RINGREDUCE_NVCC_RELEASE")
        )
    }
    #[cfg(not(ringreduce_fatbin))]
    {
        "NVRTC at first use (built without nvcc; needs libnvrtc on the GPU host)".into()
    }
}

/// One code image of a fatbin: machine code (SASS) for one GPU architecture, or PTX for a
/// virtual one (which a driver compiles for its GPU: newer GPUs run it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FatbinEntry {
    /// SASS for `sm_<arch>` (e.g. 90).
    Sass(u32),
    /// PTX for `compute_<arch>`.
    Ptx(u32),
}

/// The code images of a fatbin (the container nvcc's `--fatbin` writes): a 16-byte header
/// (magic `0xBA55ED50`, version, header size, size of what follows), then entries, each a
/// header (kind at byte 0: 1 PTX, 2 ELF/SASS; its header size at byte 4; its payload size at
/// byte 8; the architecture at byte 28) and its payload. `None` for anything else. The layout
/// is nvcc's, read off the fatbins it writes (`cuobjdump --list-elf/--list-ptx` lists the
/// same); a test reads the embedded one.
pub fn fatbin_entries(image: &[u8]) -> Option<Vec<FatbinEntry>> {
    let u16_at = |at: usize| Some(u16::from_le_bytes(image.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(image.get(at..at + 4)?.try_into().ok()?));
    let u64_at = |at: usize| Some(u64::from_le_bytes(image.get(at..at + 8)?.try_into().ok()?));
    if u32_at(0)? != 0xBA55_ED50 {
        return None;
    }
    let header = usize::from(u16_at(6)?);
    let end = header.checked_add(usize::try_from(u64_at(8)?).ok()?)?;
    if end > image.len() {
        return None;
    }
    let mut entries = Vec::new();
    let mut at = header;
    while at < end {
        let kind = u16_at(at)?;
        let size = usize::try_from(u32_at(at + 4)?).ok()?;
        let payload = usize::try_from(u64_at(at + 8)?).ok()?;
        let arch = u32_at(at + 28)?;
        entries.push(match kind {
            1 => FatbinEntry::Ptx(arch),
            2 => FatbinEntry::Sass(arch),
            _ => return None,
        });
        at = at.checked_add(size)?.checked_add(payload)?;
        if size == 0 {
            return None;
        }
    }
    Some(entries)
}

/// "sm_80 + sm_90 SASS, compute_90 PTX".
#[cfg_attr(not(ringreduce_fatbin), allow(dead_code))]
fn describe_entries(entries: &[FatbinEntry]) -> String {
    let list = |ptx: bool, prefix: &str| -> Vec<String> {
        entries
            .iter()
            .filter_map(|e| match (e, ptx) {
                (FatbinEntry::Sass(a), false) | (FatbinEntry::Ptx(a), true) => {
                    Some(format!("{prefix}_{a}"))
                }
                _ => None,
            })
            .collect()
    };
    let (sass, ptx) = (list(false, "sm"), list(true, "compute"));
    match (sass.is_empty(), ptx.is_empty()) {
        (false, false) => format!("{} SASS, {} PTX", sass.join(" + "), ptx.join(" + ")),
        (false, true) => format!("{} SASS", sass.join(" + ")),
        (true, false) => format!("{} PTX", ptx.join(" + ")),
        (true, true) => "no code".into(),
    }
}

/// The kernel source (`cuda/`) loaded into one context: the reduce, scale, one-shot, two-shot,
/// steps, LL one-shot and counter kernels.
#[derive(Debug)]
pub struct KernelModule {
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
    /// `steps[reduce_index(op, dtype)]`: the same table shape as `reduce`.
    steps: Vec<CudaFunction>,
    /// `ll[reduce_index(op, dtype)]`: the same table shape as `reduce`.
    ll: Vec<CudaFunction>,
    /// `rr_counter_signal`, `rr_counter_wait`.
    counters: [CudaFunction; 2],
    /// The grid size that fills the device: SM count × `BLOCKS_PER_SM`.
    max_blocks: u32,
}

impl KernelModule {
    /// Loads the kernels into `ctx` (the embedded fatbin, or NVRTC's PTX when the build had no
    /// nvcc) and resolves every function. Call once per context and share the result.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<KernelModule> {
        let (module, source) = load_kernels(ctx)?;
        let load = |symbol: String| device::load_function(&module, &symbol);
        // One function per pairwise operator and type, row-major over PAIRWISE_OPS × DType::ALL.
        let family = |symbol_of: fn(ReduceOp, DType) -> String| {
            PAIRWISE_OPS
                .iter()
                .flat_map(|&op| DType::ALL.map(|dtype| symbol_of(op, dtype)))
                .map(load)
                .collect::<Result<Vec<_>>>()
        };
        let reduce = family(reduce_symbol)?;
        let scale = DType::ALL
            .iter()
            .map(|&dtype| load(scale_symbol(dtype)))
            .collect::<Result<Vec<_>>>()?;
        let oneshot = family(oneshot_symbol)?;
        let twoshot = family(twoshot_symbol)?;
        let steps = family(steps_symbol)?;
        let ll = family(ll_symbol)?;
        let counters = [
            load("rr_counter_signal".to_string())?,
            load("rr_counter_wait".to_string())?,
        ];

        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(device::check("cuDeviceGetAttribute"))?;
        let max_blocks = u32::try_from(sms).unwrap_or(1).max(1) * BLOCKS_PER_SM;

        Ok(KernelModule {
            ctx: ctx.clone(),
            source,
            reduce,
            scale,
            oneshot,
            twoshot,
            steps,
            ll,
            counters,
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
        unsafe { device::launch_kernel(function, blocks, threads, stream, params) }
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

/// The value of `#define name value` in the kernel source (decimal or `0x` hex, an optional `u`
/// suffix): for the unit tests that hold the Rust mirrors of the kernels' constants to the source.
#[cfg(test)]
pub(crate) fn source_define(name: &str) -> u64 {
    let prefix = format!("#define {name} ");
    let values: Vec<u64> = SOURCE
        .lines()
        .filter_map(|line| line.strip_prefix(prefix.as_str()))
        .map(|value| {
            let digits = value.trim().trim_end_matches('u');
            match digits.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => digits.parse(),
            }
            .expect("a decimal or hex #define")
        })
        .collect();
    assert_eq!(values.len(), 1, "#define {name} must appear once");
    values[0]
}

/// Whether `RINGREDUCE_KERNELS=nvrtc` asks for NVRTC's PTX even where the build embeds a fatbin
/// (what a driver that refuses the fatbin gets; this way it can be tested on any GPU).
#[cfg_attr(not(ringreduce_fatbin), allow(dead_code))]
fn nvrtc_forced() -> bool {
    std::env::var("RINGREDUCE_KERNELS").is_ok_and(|v| v.trim() == "nvrtc")
}

/// Whether `code`, the driver's answer to loading the embedded fatbin, says this driver cannot
/// run the image (too old for the nvcc that built it, or no code for this GPU) rather than that
/// something else failed: then NVRTC compiles the source for this driver and GPU.
pub fn driver_refused_image(code: &str) -> bool {
    [
        "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
        "CUDA_ERROR_NO_BINARY_FOR_GPU",
        "CUDA_ERROR_INVALID_IMAGE",
        "CUDA_ERROR_INVALID_PTX",
        "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
        "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC",
    ]
    .iter()
    .any(|c| code.contains(c))
}

/// The kernels loaded into `ctx` and where they came from: the embedded fatbin where the build
/// has one and the driver takes it, else NVRTC's PTX for the device (module doc).
fn load_kernels(ctx: &Arc<CudaContext>) -> Result<(Arc<cudarc::driver::CudaModule>, KernelSource)> {
    #[cfg(ringreduce_fatbin)]
    if !nvrtc_forced() {
        // cuModuleLoadData reads the fatbin in place; the copy lives in a heap block, which the
        // system allocator aligns to 16 bytes (the image's header wants 8).
        match device::load_module(ctx, Ptx::from_binary(FATBIN.to_vec())) {
            Ok(module) => return Ok((module, KernelSource::EmbeddedFatbin)),
            Err(Error::Cuda { code, .. }) if driver_refused_image(&code) => {
                return Ok((nvrtc::load(ctx)?, KernelSource::NvrtcAfterFatbin));
            }
            Err(e) => return Err(e),
        }
    }
    Ok((nvrtc::load(ctx)?, KernelSource::Nvrtc))
}

/// Index into `KernelModule::reduce`: row `op.combine_op()` in `PAIRWISE_OPS`, column `dtype`.
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

fn steps_symbol(op: ReduceOp, dtype: DType) -> String {
    format!("rr_steps_{}_{}", op.name(), dtype.name())
}

fn ll_symbol(op: ReduceOp, dtype: DType) -> String {
    format!("rr_ll_{}_{}", op.name(), dtype.name())
}

fn scale_symbol(dtype: DType) -> String {
    format!("rr_scale_{}", dtype.name())
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

/// A kernel parameter as `cuLaunchKernel` takes it: a pointer to the value, which must outlive
/// the launch call (the driver copies it then).
fn param<T>(value: &mut T) -> *mut c_void {
    (value as *mut T).cast()
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
                // KernelModule::new loads row-major over PAIRWISE_OPS × DType::ALL.
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

    #[test]
    fn source_defines_every_steps_kernel() {
        defines_the_family("RR_STEPS", "rr_steps", steps_symbol);
    }

    #[test]
    fn source_defines_every_ll_kernel() {
        defines_the_family("RR_LL", "rr_ll", ll_symbol);
        assert_eq!(
            ll_symbol(ReduceOp::Avg.combine_op(), DType::BF16),
            "rr_ll_sum_bf16"
        );
    }

    #[test]
    fn source_needs_no_header() {
        // NVRTC compiles it at run time with no include paths.
        assert!(!SOURCE
            .lines()
            .any(|l| l.trim_start().starts_with("#include")));
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
    fn only_a_refused_image_falls_back_to_nvrtc() {
        for code in [
            "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
            "CUDA_ERROR_NO_BINARY_FOR_GPU",
            "CUDA_ERROR_INVALID_IMAGE",
        ] {
            assert!(driver_refused_image(code), "{code}");
        }
        for code in [
            "CUDA_ERROR_OUT_OF_MEMORY",
            "CUDA_ERROR_INVALID_CONTEXT",
            "CUDA_ERROR_NOT_INITIALIZED",
        ] {
            assert!(!driver_refused_image(code), "{code}");
        }
    }

    /// A fatbin laid out as nvcc writes them (the entry headers' fields where nvcc puts them),
    /// holding the given entries with payloads of `payload` bytes.
    fn synthetic_fatbin(entries: &[FatbinEntry], payload: usize) -> Vec<u8> {
        let mut body = Vec::new();
        for e in entries {
            let (kind, arch) = match *e {
                FatbinEntry::Ptx(a) => (1u16, a),
                FatbinEntry::Sass(a) => (2u16, a),
            };
            let mut header = vec![0u8; 64];
            header[0..2].copy_from_slice(&kind.to_le_bytes());
            header[4..8].copy_from_slice(&64u32.to_le_bytes());
            header[8..16].copy_from_slice(&(payload as u64).to_le_bytes());
            header[28..32].copy_from_slice(&arch.to_le_bytes());
            body.extend(header);
            body.extend(vec![0xAB; payload]);
        }
        let mut image = Vec::new();
        image.extend(0xBA55_ED50u32.to_le_bytes());
        image.extend(1u16.to_le_bytes());
        image.extend(16u16.to_le_bytes());
        image.extend((body.len() as u64).to_le_bytes());
        image.extend(body);
        image
    }

    #[test]
    fn a_fatbins_entries_are_read_and_named() {
        let entries = [
            FatbinEntry::Sass(80),
            FatbinEntry::Sass(90),
            FatbinEntry::Ptx(90),
        ];
        let image = synthetic_fatbin(&entries, 100);
        assert_eq!(fatbin_entries(&image).unwrap(), entries);
        assert_eq!(
            describe_entries(&entries),
            "sm_80 + sm_90 SASS, compute_90 PTX"
        );
        // Anything else is refused, never misread: a wrong magic, a cut image, an unknown kind.
        let mut wrong = image.clone();
        wrong[0] ^= 1;
        assert_eq!(fatbin_entries(&wrong), None);
        assert_eq!(fatbin_entries(&image[..image.len() - 1]), None);
        let mut unknown = image.clone();
        unknown[16] = 7;
        assert_eq!(fatbin_entries(&unknown), None);
    }

    /// What the build embeds, read from the fatbin itself: SASS for every GPU generation the
    /// kernels are tuned for (Ampere sm_80, Hopper sm_90) and PTX, so that later GPUs (and
    /// drivers that take PTX of this version) compile them.
    #[cfg(ringreduce_fatbin)]
    #[test]
    fn the_embedded_fatbin_carries_sass_for_ampere_and_hopper_and_ptx_beyond() {
        let entries = fatbin_entries(FATBIN).expect("nvcc's fatbin layout");
        for want in [FatbinEntry::Sass(80), FatbinEntry::Sass(90)] {
            assert!(entries.contains(&want), "{entries:?}");
        }
        assert!(
            entries
                .iter()
                .any(|e| matches!(e, FatbinEntry::Ptx(a) if *a >= 80)),
            "{entries:?}"
        );
        println!("embedded: {}", describe_entries(&entries));
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
