//! `ringreduce info`: what this build and machine have — the version, how the reduce kernels
//! were built, the CUDA driver and every GPU. Needs no GPU: without one it says why there is none.

use ringreduce::device;
use ringreduce::exec::cuda as kernels;

/// Prints the version, the kernel build path, the driver API version and one line per GPU.
pub fn run() -> Result<(), String> {
    out!("ringreduce {}", env!("CARGO_PKG_VERSION"));
    out!("reduce kernels: {}", kernels::build_kind());
    match device::driver_available() {
        Err(e) => out!("GPUs: none ({e})"),
        Ok(()) => {
            if let Ok((major, minor)) = device::driver_version() {
                out!("CUDA driver API: {major}.{minor}");
            }
            for d in device::devices().map_err(|e| e.to_string())? {
                out!(
                    "GPU {}: {}, {:.1} GiB, {} SMs, sm_{}{}, PCI {}",
                    d.index,
                    d.name,
                    d.total_memory_bytes as f64 / (1u64 << 30) as f64,
                    d.sm_count,
                    d.compute_capability.0,
                    d.compute_capability.1,
                    d.pci_bus_id
                );
            }
        }
    }
    Ok(())
}
