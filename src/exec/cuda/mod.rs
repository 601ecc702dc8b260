//! The CUDA executor: the reduce kernels ([`kernels`]), typed device buffers ([`gpu_buffer`]), the
//! edge probe that catches silent degradation ([`probe`]), the executor that runs plans on GPU
//! streams — one rank executor per rank — ([`executor`]), and the fabric its rank executors
//! exchange records and memory over (`fabric`). The driver calls underneath live one layer down,
//! in [`crate::device`].
pub mod cudarc_buffers;
pub mod executor;
pub(crate) mod fabric;
pub mod gpu_buffer;
#[doc(hidden)] // Not API: reached only through `crate::internal` (its doc says why).
pub mod kernels;
pub mod probe;

pub use crate::exec::config::Transport;
pub use executor::{auto_chunk_bytes, CudaConfig, EdgeInfo};
pub use fabric::MemorySharing;
pub use gpu_buffer::{GpuBuffer, GpuView, GpuViewMut};
pub use kernels::{
    build_kind, driver_refused_image, kernel_cache_dir, kernel_choice, ll_fits, ll_recv_bytes,
    nvrtc_found, nvrtc_version, KernelChoice, KernelSource, HAS_CUDA12, HAS_FATBIN, LL_MAX_BYTES,
};
pub use probe::Probe;
