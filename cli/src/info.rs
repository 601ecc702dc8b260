//! `ringreduce info`: what this build and machine have — the version, the kernel images the
//! build embeds, which one this driver loads and which NVRTC would compile them where it has
//! none or refuses it, the CUDA driver and every GPU, and how ranks in separate processes share
//! memory
//! (per GPU: `cuMemCreate` memory passed as file descriptors, or legacy CUDA IPC handles where
//! the driver lacks them; /dev/shm, with its room, for host ranks), and where NCCL is for jobs on
//! several hosts. Needs no GPU: without one it says why there is none.

use ringreduce::device;
use ringreduce::exec::cuda as kernels;

/// Prints the version, the kernel build path, the driver API version and one line per GPU.
pub fn run() -> Result<(), String> {
    out!("ringreduce {}", env!("CARGO_PKG_VERSION"));
    out!("reduce kernels: {}", kernels::build_kind());
    // What a driver without an embedded image, or refusing it, gets instead, and what
    // RINGREDUCE_KERNELS=nvrtc forces.
    match kernels::nvrtc_found() {
        Ok((path, (major, minor))) => out!(
            "NVRTC: {}.{} at {} (compiles the kernels where the driver has no embedded image or \
             refuses it, or with RINGREDUCE_KERNELS=nvrtc; kept in {})",
            major,
            minor,
            path.display(),
            kernels::kernel_cache_dir().map_or(
                "no disk cache (RINGREDUCE_KERNEL_CACHE=off, or no HOME)".into(),
                |d| d.display().to_string()
            )
        ),
        Err(why) => out!("NVRTC: none found ({why})"),
    }
    match device::driver_available() {
        Err(e) => out!("GPUs: none ({e})"),
        Ok(()) => {
            if let Ok((major, minor)) = device::driver_version() {
                out!("CUDA driver API: {major}.{minor}");
                let forced = std::env::var("RINGREDUCE_KERNELS").ok();
                let choice = kernels::kernel_choice(
                    forced.as_deref(),
                    major,
                    kernels::HAS_FATBIN,
                    kernels::HAS_CUDA12,
                );
                out!(
                    "kernels this driver loads: {}",
                    match choice {
                        Ok(kernels::KernelChoice::Fatbin) => "the embedded fatbin (nvcc)".into(),
                        Ok(kernels::KernelChoice::Cuda12) =>
                            "the embedded CUDA 12 image (NVRTC 12)".into(),
                        Ok(kernels::KernelChoice::Nvrtc) => "NVRTC's, compiled on this host".into(),
                        Err(e) => e.to_string(),
                    }
                );
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
                     caller's buffers staged through memory each rank exports, or used in place \
                     where every rank registered them)",
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
