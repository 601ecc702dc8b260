//! The kernels compiled by NVRTC at run time, on a build that embeds nvcc's fatbin: what a
//! driver that refuses the fatbin (one older than the nvcc that built it, as a CUDA 12 driver for
//! kernels built by nvcc 13) gets, forced here with `RINGREDUCE_KERNELS=nvrtc` (set before any
//! kernel is loaded: this file is its own test process, with one test). Every algorithm of the
//! all-reduce must then be exact, and the module must say where its code came from. Waived
//! without a GPU or without libnvrtc.

use ringreduce::internal::kernels::{nvrtc_version, KernelModule, KernelSource};
use ringreduce::verify::{expected_value, input_value};
use ringreduce::{device, Algorithm, Communicator, CudaConfig, GpuBuffer, ReduceOp};

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
    // SAFETY: set before any thread of this test process loads kernels or reads the variable.
    unsafe { std::env::set_var("RINGREDUCE_KERNELS", "nvrtc") };
    let ctx = device::context(gpus[0]).unwrap();
    let module = KernelModule::new(&ctx).unwrap();
    assert_eq!(module.source(), KernelSource::Nvrtc);
    println!("NVRTC {major}.{minor} compiled the kernels");
    for algorithm in [Algorithm::Ring, Algorithm::OneShot, Algorithm::TwoShot] {
        let config = CudaConfig {
            algorithm,
            allow_shared_device: gpus[0] == gpus[1],
            ..CudaConfig::default()
        };
        let comm = Communicator::with_config(&gpus, config).unwrap();
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
}
