//! The kernels compiled by NVRTC at run time, on a build that embeds nvcc's fatbin: what a
//! driver that refuses the fatbin (one older than the nvcc that built it, as a CUDA 12 driver for
//! kernels built by nvcc 13) gets, forced here with `RINGREDUCE_KERNELS=nvrtc` (set before any
//! kernel is loaded: this file is its own test process, with one test). Every algorithm of the
//! all-reduce must then be exact, the module must say where its code came from, and the image
//! is compiled once (the communicators' contexts reuse it; the disk cache holds it). Waived
//! without a GPU or without libnvrtc.

use ringreduce::internal::kernels::{nvrtc_version, KernelModule, KernelSource};
use ringreduce::verify::{expected_value, input_value};
use ringreduce::{device, Algorithm, Communicator, CudaConfig, GpuBuffer, ReduceOp};
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
    for algorithm in [Algorithm::Ring, Algorithm::OneShot, Algorithm::TwoShot] {
        let config = CudaConfig {
            algorithm,
            allow_shared_device: gpus[0] == gpus[1],
            ..CudaConfig::default()
        };
        let started = Instant::now();
        let comm = Communicator::with_config(&gpus, config).unwrap();
        println!(
            "{algorithm:?}: communicator made in {:?}",
            started.elapsed()
        );
        let count = 10_007;
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            let mut bufs: Vec<GpuBuffer<f32>> = gpus
                .iter()
                .enumerate()
                .map(|(rank, &g)| {
                    let v: Vec<f32> = (0..count).map(|k| input_value(op, rank, k)).collect();
                    GpuBuffer::from_host(g, &v).unwrap()
                })
                .collect();
            comm.all_reduce_in_place(&mut bufs, op).unwrap();
            let want: Vec<f32> = (0..count).map(|k| expected_value(op, 2, k)).collect();
            for b in &bufs {
                assert_eq!(b.to_host().unwrap(), want, "{algorithm:?} {op:?}");
            }
        }
        comm.close().unwrap();
    }
    let _ = std::fs::remove_dir_all(&cache);
}
