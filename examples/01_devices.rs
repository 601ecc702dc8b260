//! Guide chapter 1, devices and contexts (`docs/guide/01-devices.md`).
//!
//! Asks the CUDA driver what GPUs there are — name, memory, SMs, compute capability, PCI bus id —
//! then retains each device's primary context and reads its free memory. Nothing else is
//! allocated. Without a GPU or driver it says why, and what it would print on a GPU host.
//!
//! Run: `cargo run --release --example 01_devices`

use ringreduce::device;

fn main() -> ringreduce::Result<()> {
    // One probe, cached for the process: libcuda loads, cuInit succeeds, at least one device.
    let count = match device::device_count() {
        Ok(count) => count,
        Err(why) => {
            println!("no GPU: {why}");
            println!();
            println!("On a GPU host this example lists every device the driver reports, e.g. on");
            println!("the 2×H200 test machine (docs/TOUR.md, `ringreduce topo`):");
            println!("  GPU 0: NVIDIA H200, 139.8 GiB, 132 SMs, sm_90, PCI 0000:00:06.0");
            println!("  GPU 1: NVIDIA H200, 139.8 GiB, 132 SMs, sm_90, PCI 0000:00:07.0");
            println!("and then each device's primary context with its free memory.");
            return Ok(());
        }
    };
    let (major, minor) = device::driver_version()?;
    println!("CUDA driver API {major}.{minor}, {count} device(s)");

    // Device queries need no context: they go straight to the driver.
    for d in device::devices()? {
        let (cc_major, cc_minor) = d.compute_capability;
        println!(
            "GPU {}: {}, {:.1} GiB, {} SMs, sm_{cc_major}{cc_minor}, PCI {}",
            d.index,
            d.name,
            d.total_memory_bytes as f64 / (1u64 << 30) as f64,
            d.sm_count,
            d.pci_bus_id
        );
    }

    // A context owns a device's allocations, streams and events. We use each device's primary
    // context — the one the CUDA runtime, NCCL and PyTorch share — so user buffers and ours live
    // together. `context` makes it current on this thread as a side effect: a driver call without
    // a device argument (cuMemAlloc, cuStreamCreate) acts on whichever context is current.
    println!();
    for index in 0..count {
        let ctx = device::context(index)?;
        let (free, total) = device::memory_info(&ctx)?;
        println!(
            "GPU {index}: primary context retained, {:.1} of {:.1} GiB free",
            free as f64 / (1u64 << 30) as f64,
            total as f64 / (1u64 << 30) as f64
        );
    }
    println!();
    println!("Next: 02_peer_access (can these GPUs reach each other's memory?)");
    Ok(())
}
