//! Guide chapter 5 (the ring all-reduce) in a real job's shape: a cudarc kernel writes each
//! GPU's gradients on the job's stream, the all-reduce runs on that same stream, and a second
//! cudarc kernel reads the result — no host synchronisation between the three, only one at the
//! end to print. Without GPUs it says what it would show.

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use ringreduce::{Communicator, ReduceOp};
use std::sync::Arc;

const KERNELS: &str = r#"
extern "C" __global__ void gradients(float* g, float rank, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = (rank + 1.0f) * (float)(i % 1000);
}
extern "C" __global__ void halve(const float* g, float* out, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 0.5f * g[i];
}
"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gpus = ringreduce::driver_available()
        .and_then(|()| ringreduce::device_count())
        .unwrap_or(0);
    if gpus < 2 {
        println!("needs 2 GPUs (found {gpus}): on 2 GPUs this runs a kernel, an all-reduce and a");
        println!("second kernel on each GPU's own stream with no host synchronisation between");
        println!(
            "them, and checks the second kernel saw the sum (3/2 · (i mod 1000) per element)."
        );
        return Ok(());
    }
    let n: u32 = 1 << 20;
    let comm = Communicator::new(&[0, 1])?;
    let ptx = cudarc::nvrtc::compile_ptx(KERNELS)?;
    let mut streams: Vec<Arc<CudaStream>> = Vec::new();
    let mut grads: Vec<CudaSlice<f32>> = Vec::new();
    let mut halves: Vec<CudaSlice<f32>> = Vec::new();
    let mut second: Vec<CudaFunction> = Vec::new();
    for gpu in 0..2 {
        let stream = ringreduce::device::context(gpu)?.new_stream()?;
        let module = stream.context().load_module(ptx.clone())?;
        let (gradients, halve) = (
            module.load_function("gradients")?,
            module.load_function("halve")?,
        );
        let mut g = stream.alloc_zeros::<f32>(n as usize)?;
        let out = stream.alloc_zeros::<f32>(n as usize)?;
        let rank = gpu as f32;
        // SAFETY: the kernel's parameters are (float*, float, unsigned), as passed.
        unsafe {
            stream
                .launch_builder(&gradients)
                .arg(&mut g)
                .arg(&rank)
                .arg(&n)
                .launch(LaunchConfig::for_num_elems(n))?;
        }
        streams.push(stream);
        grads.push(g);
        halves.push(out);
        second.push(halve);
    }
    // The all-reduce, after each stream's first kernel and before its next one.
    // SAFETY: the gradients are touched only by work queued on `streams` after this.
    unsafe { comm.enqueue_all_reduce_in_place_on(&mut grads, ReduceOp::Sum, &streams)? };
    for (gpu, (stream, halve)) in streams.iter().zip(&second).enumerate() {
        // SAFETY: the kernel's parameters are (const float*, float*, unsigned), as passed.
        unsafe {
            stream
                .launch_builder(halve)
                .arg(&grads[gpu])
                .arg(&mut halves[gpu])
                .arg(&n)
                .launch(LaunchConfig::for_num_elems(n))?;
        }
    }
    // The only host synchronisation: reading the result back.
    for (gpu, stream) in streams.iter().enumerate() {
        let out = stream.clone_dtoh(&halves[gpu])?;
        let wrong = (0..n as usize)
            .filter(|&i| out[i] != 1.5 * (i % 1000) as f32)
            .count();
        println!("GPU {gpu}: kernel → all-reduce → kernel on one stream: {wrong} of {n} wrong");
        if wrong != 0 {
            return Err("the second kernel did not see the all-reduce's result".into());
        }
    }
    comm.close()?;
    Ok(())
}
