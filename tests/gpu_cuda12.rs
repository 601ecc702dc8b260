//! The CUDA 12 image (NVRTC 12's machine code, embedded by `build/cuda12.rs`): what a CUDA 12
//! driver loads, forced here with `RINGREDUCE_KERNELS=cuda12` on whatever driver the GPU host
//! has (a CUDA 13 driver loads CUDA 12 machine code too; set before any kernel is loaded: this
//! file is its own test process, with one test). Every algorithm of the all-reduce must be exact
//! and the module must say where its code came from. Waived without a GPU, and on a build
//! without the image (no `NVRTC_CUDA12`).

use ringreduce::device;
use ringreduce::internal::kernels::{KernelModule, KernelSource, HAS_CUDA12};
use std::time::Instant;

mod common;

#[test]
fn the_cuda12_image_runs_every_algorithm_exactly() {
    let Some(gpus) = common::two_gpus_or_shared() else {
        return;
    };
    if !HAS_CUDA12 {
        common::waiver::waive("the build has no CUDA 12 image (built without NVRTC_CUDA12)");
        return;
    }
    // SAFETY: set before any thread of this test process loads kernels or reads the variable.
    unsafe { std::env::set_var("RINGREDUCE_KERNELS", "cuda12") };
    let ctx = device::context(gpus[0]).unwrap();
    let started = Instant::now();
    let module = KernelModule::new(&ctx).unwrap();
    assert_eq!(module.source(), KernelSource::EmbeddedCuda12);
    println!(
        "the CUDA 12 image loaded in {:?}, driver {:?}",
        started.elapsed(),
        device::driver_version().unwrap()
    );
    common::all_reduce_every_algorithm_exactly(&gpus);
}
