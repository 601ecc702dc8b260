//! The kernels compiled by NVRTC at run time: what a driver that refuses the embedded image it is
//! given (or a build without one for it) gets, forced here with `RINGREDUCE_KERNELS=nvrtc` (set
//! before any kernel is loaded: this file is its own test process, with one test). Every algorithm of the
//! all-reduce must then be exact, the module must say where its code came from, and the image
//! is compiled once (the communicators' contexts reuse it; the disk cache holds it). Waived
//! without a GPU or without libnvrtc.

use ringreduce::device;
use ringreduce::internal::kernels::{nvrtc_version, KernelModule, KernelSource};
use std::time::Instant;

mod common;

#[test]
fn nvrtcs_kernels_run_every_algorithm_exactly() {
    let Some(gpus) = common::two_gpus_or_shared() else {
        return;
    };
    let Some((major, minor)) = nvrtc_version() else {
        println!("waived: needs libnvrtc (NVRTC) on this GPU host: the kernels it compiles");
        return;
    };
    // A disk cache of this test's own, so that the first load compiles.
    let cache = std::env::temp_dir().join(format!("ringreduce-nvrtc-{}", std::process::id()));
    // SAFETY: set before any thread of this test process loads kernels or reads the variables.
    unsafe {
        std::env::set_var("RINGREDUCE_KERNELS", "nvrtc");
        std::env::set_var("RINGREDUCE_KERNEL_CACHE", &cache);
    }
    let ctx = device::context(gpus[0]).unwrap();
    let started = Instant::now();
    let module = KernelModule::new(&ctx).unwrap();
    assert_eq!(module.source(), KernelSource::Nvrtc);
    println!(
        "NVRTC {major}.{minor} compiled the kernels in {:?}",
        started.elapsed()
    );
    let cached: Vec<_> = std::fs::read_dir(&cache).unwrap().collect();
    assert_eq!(cached.len(), 1, "one image in the disk cache");
    common::all_reduce_every_algorithm_exactly(&gpus);
    let _ = std::fs::remove_dir_all(&cache);
}
