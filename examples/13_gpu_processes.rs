//! One process per GPU, as torchrun runs a training job: each process is one rank on its GPU,
//! joins the others through the variables its launcher set, and orders the all-reduce of its
//! gradients on its own CUDA stream, between the work queued before it (the gradients'
//! upload) and after it (their download), with no host synchronisation between them. The
//! processes share memory as `cuMemCreate` file descriptors (legacy CUDA IPC handles where the
//! driver lacks them); a rank whose peer dies gets an error naming it.
//!
//! ```text
//! cargo build --release --example 13_gpu_processes
//! cargo run --release -p ringreduce-cli -- launch -n 2 -- target/release/examples/13_gpu_processes
//! ```
//!
//! With one GPU the ranks share it (each process its own context: correct, not fast). Started
//! alone, it says how to launch it; without a GPU it says so.

use cudarc::driver::result;
use ringreduce::verify::{expected_value, input_value};
use ringreduce::{CudaConfig, GpuBuffer, LaunchEnv, RankCommunicator, ReduceOp};

fn main() {
    if let Err(err) = run() {
        eprintln!("13_gpu_processes: {err}");
        std::process::exit(match err {
            ringreduce::Error::NoGpu { .. } => 3,
            _ => 1,
        });
    }
}

fn run() -> ringreduce::Result<()> {
    let Ok(env) = LaunchEnv::from_env() else {
        eprintln!(
            "13_gpu_processes is one rank of a job: start it with `ringreduce launch -n 2 -- {}`",
            std::env::args().next().unwrap_or_default()
        );
        std::process::exit(2);
    };
    let gpus = ringreduce::device_count()?;
    let config = CudaConfig {
        // One GPU for several processes: they share it.
        allow_shared_device: gpus < env.world,
        ..CudaConfig::default()
    };
    let mut comm = RankCommunicator::from_env_gpu(config)?;
    let (rank, world) = (comm.rank(), comm.world());
    let device = if gpus >= world && gpus > 1 {
        env.local_rank
    } else {
        0
    };

    let count = 1 << 20;
    let grads: Vec<f32> = (0..count)
        .map(|i| input_value(ReduceOp::Avg, rank, i))
        .collect();
    let mut buf = GpuBuffer::<f32>::zeroed(device, count)?;
    let ctx = ringreduce::device::context(device)?;
    let stream = ctx
        .new_stream()
        .map_err(|e| ringreduce::Error::InvalidArgument(e.to_string()))?;
    let mut averaged = vec![0f32; count];
    let buf_at = ringreduce::Buffer::address(&buf);
    ctx.bind_to_thread()
        .map_err(|e| ringreduce::Error::InvalidArgument(e.to_string()))?;
    let started = std::time::Instant::now();
    // SAFETY: `buf` holds `count` f32 on this GPU; `grads` stays alive and unchanged until the
    // stream is synchronised below.
    unsafe { result::memcpy_htod_async(buf_at, &grads, stream.cu_stream()) }
        .map_err(|e| ringreduce::Error::InvalidArgument(e.to_string()))?;
    // SAFETY: `buf` is touched by nothing but this stream's work until it is synchronised.
    unsafe { comm.enqueue_all_reduce_in_place_on(&mut buf, ReduceOp::Avg, &stream)? };
    // SAFETY: `averaged` holds `count` f32 and outlives the synchronisation below.
    unsafe { result::memcpy_dtoh_async(&mut averaged, buf_at, stream.cu_stream()) }
        .map_err(|e| ringreduce::Error::InvalidArgument(e.to_string()))?;
    stream
        .synchronize()
        .map_err(|e| ringreduce::Error::InvalidArgument(e.to_string()))?;
    comm.synchronize()?;
    let took = started.elapsed();
    let wrong = (0..count)
        .filter(|&i| averaged[i] != expected_value::<f32>(ReduceOp::Avg, world, i))
        .count();
    println!(
        "rank {rank} of {world} (pid {}, GPU {device}): averaged {count} f32 gradients on its \
         own stream in {took:?}, {wrong} wrong",
        std::process::id()
    );
    if wrong > 0 {
        std::process::exit(1);
    }
    Ok(())
}
