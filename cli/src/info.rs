//! `ringreduce info`: what this build and machine have — the version, how the reduce kernels
//! were built and which NVRTC would compile them where the driver refuses the embedded ones, the CUDA driver and every GPU, and how ranks in separate processes share memory
//! (per GPU: `cuMemCreate` memory passed as file descriptors, or legacy CUDA IPC handles where
//! the driver lacks them; /dev/shm, with its room, for host ranks), and where NCCL is for jobs on
//! several hosts. Needs no GPU: without one it says why there is none.

use ringreduce::device;
use ringreduce::exec::cuda as kernels;

/// Prints the version, the kernel build path, the driver API version and one line per GPU.
pub fn run() -> Result<(), String> {
    out!("ringreduce {}", env!("CARGO_PKG_VERSION"));
    out!("reduce kernels: {}", kernels::build_kind());
    // What a driver that refuses the embedded fatbin (one older than the nvcc that built it)
    // gets instead, and what RINGREDUCE_KERNELS=nvrtc forces.
    match kernels::nvrtc_version() {
        Some((major, minor)) => {
            out!(
            "NVRTC: {major}.{minor} (compiles the kernels where the driver refuses the embedded \
             ones, or with RINGREDUCE_KERNELS=nvrtc; kept in {})",
            kernels::kernel_cache_dir().map_or("no disk cache (RINGREDUCE_KERNEL_CACHE=off, or no \
                HOME)".into(), |d| d.display().to_string())
        )
        }
        None => out!("NVRTC: none found (libnvrtc.so)"),
    }
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
                let sharing = kernels::MemorySharing::of(d.index).map_err(|e| e.to_string())?;
                out!(
                    "  GPU {} ranks in separate processes share memory through: {} (the \
                     caller's buffers staged through memory each rank exports)",
                    d.index,
                    sharing.describe()
                );
            }
        }
    }
    out!(
        "GPU ranks' pinned host memory (staged edges) crosses processes as anonymous files \
         (memfd) passed by descriptor: /dev/shm's size does not limit it"
    );
    out!(
        "host ranks in separate processes share memory through: /dev/shm ({})",
        shm_room()
    );
    // GPU ranks of a job on several hosts carry the stages between hosts on NCCL.
    match ringreduce::exec::nccl::Library::get() {
        Some(nccl) => out!(
            "between hosts (GPU ranks on several hosts): NCCL at {}",
            nccl.path.display()
        ),
        None => out!(
            "between hosts (GPU ranks on several hosts): no NCCL found (libnccl.so.2 on the \
             library path, or RINGREDUCE_NCCL_PATH): such jobs are refused at creation"
        ),
    }
    Ok(())
}

/// The room in /dev/shm, where host ranks of separate processes keep their buffers (a
/// container's is often 64 MB: too small for large messages, and said so by name when a call
/// needs more).
fn shm_room() -> String {
    let path = c"/dev/shm";
    // SAFETY: an all-zero statvfs is a valid value to be overwritten.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated; `stat` is a live, writable statvfs.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return format!("not available: {}", std::io::Error::last_os_error());
    }
    let unit = stat.f_frsize as f64;
    let mib = |blocks: libc::fsblkcnt_t| blocks as f64 * unit / (1u64 << 20) as f64;
    format!(
        "{:.0} MiB free of {:.0} MiB",
        mib(stat.f_bavail),
        mib(stat.f_blocks)
    )
}
