//! The kernels on the GPU: the kernel source in `cuda/` loaded into a context ([`KernelModule`]),
//! launched by table index.
//!
//! Every ring step on a GPU ends in one kernel, `dst[i] = a[i] ⊕ b[i]` (the received segment
//! combined with the local partial), and `Avg` ends with one more, `x[i] = x[i] / world`
//! (module `reduce_kernels`). The peer kernels (modules `oneshot_kernel`, `twoshot_kernel` and `steps`,
//! launched through module `peer_launch`) are one kernel per rank that reads every rank's
//! memory directly (peer access) and meets the other ranks' kernels at barriers of
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
//! Where the code comes from (`build.rs` builds what it can; [`KernelModule::new`] picks, see
//! [`kernel_choice`]):
//! - **nvcc's fatbin** (SASS for sm_80 and sm_90, PTX for compute_90; built where nvcc 13 was
//!   found): what a CUDA 13 driver loads ([`KernelSource::EmbeddedFatbin`]);
//! - **the CUDA 12 image** (SASS for sm_80 and sm_90, PTX for compute_80, from NVRTC 12; built
//!   where `NVRTC_CUDA12` was set, see `build/cuda12.rs`): what a CUDA 12 driver (R535 and
//!   later) loads, which refuses nvcc 13's code ([`KernelSource::EmbeddedCuda12`]); the piece
//!   for the GPU is picked by [`cuda12_code_for`];
//! - **NVRTC on the GPU host**, where the build has neither image for this driver, where the
//!   driver refuses the one it has, or with `RINGREDUCE_KERNELS=nvrtc` ([`KernelSource::Nvrtc`],
//!   [`KernelSource::NvrtcAfterEmbedded`]): the same source compiled into machine code for the
//!   device by the host's libnvrtc (13 or 12); that takes minutes once per host and NVRTC
//!   version, so the image is kept in the process and in a disk cache (module `nvrtc`).
//!
//! The driver API itself is bound at CUDA 12.2's level (cudarc's `cuda-12020` bindings, loaded
//! at run time), whose entry points every later driver keeps, CUDA 13's included.
//!
//! Invariant: a [`KernelModule`] holds all 266 functions (4 operators × 12 types of pairwise
//! reduce, of one-shot, two-shot and LL one-shot all-reduce and of the steps kernel, one scale
//! and one premultiply kernel per type, and the two counter kernels of captured rings, module
//! `counter_kernels`) resolved in its context — the peer kernels with the call gate of calls across
//! processes at their start ([`CallGate`]) — so a launch is a table index and one `cuLaunchKernel`, with no lookup and no
//! allocation.

mod channel;
mod counter_kernels;
mod error_codes;
mod image;
mod ll;
mod nvrtc;
mod oneshot_kernel;
mod peer_launch;
mod reduce_kernels;
pub use reduce_kernels::PreMul;
mod steps;
mod twoshot_kernel;

pub use channel::{
    channel_bytes, channel_units, ChannelArgs, ChannelOp, CHANNEL_MAX_OPS, CHANNEL_SLOT_BYTES,
};
pub use error_codes::{
    CH_ERR_MISMATCH_BIT, CH_ERR_WAIT, COUNTER_ERR_BIT, ERROR_CODES, ERR_PEER_LOST,
    GATE_ERR_MISMATCH, GATE_ERR_WAIT, LL_ERR_WAIT, PEER_ERR_END, PEER_ERR_LAUNCH, PEER_ERR_MIDDLE,
    PEER_ERR_START,
};
pub use image::{
    build_kind, cuda12_code_for, driver_refused_image, fatbin_entries, kernel_choice, CodeEntry,
    KernelChoice, KernelSource, HAS_CUDA12, HAS_FATBIN,
};
pub use ll::{ll_blocks, ll_fits, ll_recv_bytes, LlArgs, LL_MAX_BYTES};
pub use nvrtc::{cache_dir as kernel_cache_dir, found as nvrtc_found, version as nvrtc_version};
pub use oneshot_kernel::OneShotArgs;
pub use peer_launch::{peer_blocks, CallGate, PEER_FLAG_BYTES, PEER_MAX_BLOCKS, PEER_MAX_RANKS};
pub use steps::{PeerStep, StepsArgs};
pub use twoshot_kernel::TwoShotArgs;

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::driver::{sys, CudaContext, CudaFunction};

use crate::device::{self, Stream};
use crate::element::{DType, ReduceOp};
use crate::error::{Error, Result};

/// The kernel source, for NVRTC (and for the tests that check it defines every symbol): the
/// parts in `cuda/` joined by `build.rs` (its `PARTS` lists them in order), the same text nvcc
/// compiles. Embedded in every build: a driver that refuses the embedded fatbin (one older than
/// the nvcc that built it) gets it compiled by NVRTC instead.
const SOURCE: &str = include_str!(concat!(env!("OUT_DIR"), "/ringreduce_kernels.cu"));

/// Threads per block of every launch.
const BLOCK_THREADS: u32 = 256;
/// Blocks per SM in a full grid: 8 × 256 = 2048 threads, the most an sm_80/sm_90 SM holds.
const BLOCKS_PER_SM: u32 = 8;
/// Bytes one thread moves per pointer per loop iteration on the vector path (a `uint4`).
const VECTOR_BYTES: usize = 16;

/// The pairwise operators that have kernels, in table order (`Avg` combines as `Sum`).
const PAIRWISE_OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max];

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
    /// `premul[dtype as usize]`.
    premul: Vec<CudaFunction>,
    /// `oneshot[reduce_index(op, dtype)]`: the same table shape as `reduce_kernels`.
    oneshot: Vec<CudaFunction>,
    /// `twoshot[reduce_index(op, dtype)]`: the same table shape as `reduce_kernels`.
    twoshot: Vec<CudaFunction>,
    /// `steps[reduce_index(op, dtype)]`: the same table shape as `reduce_kernels`.
    steps: Vec<CudaFunction>,
    /// `ll[reduce_index(op, dtype)]`: the same table shape as `reduce_kernels`.
    ll: Vec<CudaFunction>,
    /// `rr_counter_signal`, `rr_counter_wait`.
    counters: [CudaFunction; 2],
    /// `rr_channel`: the point-to-point channel (module `channel`).
    channel: CudaFunction,
    /// The grid size that fills the device: SM count × `BLOCKS_PER_SM`.
    max_blocks: u32,
}

impl KernelModule {
    /// Loads the kernels into `ctx` (the embedded fatbin, or NVRTC's PTX when the build had no
    /// nvcc) and resolves every function: a module of its own, unloaded when dropped. The
    /// executors take [`KernelModule::shared`].
    pub fn new(ctx: &Arc<CudaContext>) -> Result<KernelModule> {
        let (module, source) = image::load_kernels(ctx)?;
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
        // One function per type.
        let per_type = |symbol_of: fn(DType) -> String| {
            DType::ALL
                .iter()
                .map(|&dtype| load(symbol_of(dtype)))
                .collect::<Result<Vec<_>>>()
        };
        let scale = per_type(scale_symbol)?;
        let premul = per_type(premul_symbol)?;
        let oneshot = family(oneshot_symbol)?;
        let twoshot = family(twoshot_symbol)?;
        let steps = family(steps_symbol)?;
        let ll = family(ll_symbol)?;
        let counters = [
            load("rr_counter_signal".to_string())?,
            load("rr_counter_wait".to_string())?,
        ];
        let channel = load("rr_channel".to_string())?;

        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(device::check("cuDeviceGetAttribute"))?;
        let max_blocks = u32::try_from(sms).unwrap_or(1).max(1) * BLOCKS_PER_SM;

        Ok(KernelModule {
            ctx: ctx.clone(),
            source,
            reduce,
            scale,
            premul,
            oneshot,
            twoshot,
            steps,
            ll,
            counters,
            channel,
            max_blocks,
        })
    }

    /// The kernels of `ctx`, loaded once per process and context (and `RINGREDUCE_KERNELS`
    /// choice) and shared by every communicator from then on, as NCCL and cuBLAS keep theirs:
    /// a new communicator then loads nothing, and no module is unloaded while the process lives
    /// (an unload waits for the context's work and, on a communicator made after one was
    /// abandoned on a stuck GPU, left about 2 MiB of device memory behind each time).
    pub fn shared(ctx: &Arc<CudaContext>) -> Result<Arc<KernelModule>> {
        type Key = (usize, Option<String>);
        static LOADED: Mutex<Vec<(Key, Arc<KernelModule>)>> = Mutex::new(Vec::new());
        let key = (
            ctx.cu_ctx() as usize,
            std::env::var("RINGREDUCE_KERNELS").ok(),
        );
        // Held while loading: two communicators made at once load once.
        let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, module)) = loaded.iter().find(|(k, _)| *k == key) {
            return Ok(module.clone());
        }
        let module = Arc::new(KernelModule::new(ctx)?);
        loaded.push((key, module.clone()));
        Ok(module)
    }

    /// Where the loaded code came from.
    pub fn source(&self) -> KernelSource {
        self.source
    }

    /// The context the kernels are loaded in; launches go to streams of this context only.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
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

fn premul_symbol(dtype: DType) -> String {
    format!("rr_premul_{}", dtype.name())
}

fn check_aligned(dtype: DType, name: impl std::fmt::Display, address: u64) -> Result<()> {
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
        defines_the_per_type_family("RR_SCALE", "rr_scale", scale_symbol);
    }

    #[test]
    fn source_defines_every_premul_kernel() {
        defines_the_per_type_family("RR_PREMUL", "rr_premul", premul_symbol);
    }

    /// The source invokes `macro_name(symbol, type)` exactly once for every type, with the
    /// symbol `symbol_of` names.
    fn defines_the_per_type_family(macro_name: &str, prefix: &str, symbol_of: fn(DType) -> String) {
        let mut defined = BTreeSet::new();
        for args in invocations(macro_name) {
            let [symbol, ty] = args.as_slice() else {
                panic!("{macro_name} takes (symbol, type): {args:?}");
            };
            assert_eq!(
                *symbol,
                format!("{prefix}_{}", ty.trim_start_matches("rr_"))
            );
            assert!(defined.insert(symbol.clone()), "{symbol} defined twice");
        }
        let wanted: BTreeSet<String> = DType::ALL.into_iter().map(symbol_of).collect();
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
}
