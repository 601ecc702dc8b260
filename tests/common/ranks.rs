//! Helpers of the GPU-rank tests (`tests/gpu_ranks.rs`, `tests/gpu_late_peers.rs`): one process
//! a rank, as `launch` starts them — each rank's GPU and configuration, a late peer, and the
//! named mismatches the ranks expect.

use cudarc::driver::CudaStream;
use ringreduce::verify::input_value;
use ringreduce::{Algorithm, CudaConfig, GpuBuffer, LaunchEnv, RankCommunicator, ReduceOp};
use std::sync::Arc;
use std::time::Duration;

/// A GPU rank's configuration in these tests: `algorithm`, ranks allowed to share a GPU, a
/// 20 s timeout.
pub fn config(algorithm: Algorithm) -> CudaConfig {
    CudaConfig {
        algorithm,
        allow_shared_device: true,
        timeout: Duration::from_secs(20),
        ..CudaConfig::default()
    }
}

/// This rank's GPU: each process sees every GPU; rank r takes GPU r, or GPU 0 (shared) where
/// there are fewer GPUs than ranks.
pub fn this_gpu(env: &LaunchEnv) -> usize {
    match ringreduce::device_count().unwrap() >= env.world {
        true => env.rank,
        false => 0,
    }
}

/// This process's rank of the job in `env` under `Algorithm::Auto` on its GPU, with a stream of
/// its own there: (rank, world, device, communicator, stream).
pub fn auto_rank_with_stream(
    env: &LaunchEnv,
) -> (usize, usize, usize, RankCommunicator, Arc<CudaStream>) {
    let (rank, world) = (env.rank, env.world);
    let device = this_gpu(env);
    let id = env.unique_id().unwrap();
    let comm = RankCommunicator::gpu(&id, rank, world, device, config(Algorithm::Auto)).unwrap();
    let ctx = ringreduce::device::context(device).unwrap();
    let stream = ctx.new_stream().unwrap();
    (rank, world, device, comm, stream)
}

/// Rank 1 comes 2 s late to `enqueue` (the calls it makes); every other rank's `enqueue` must
/// return within 500 ms — once enqueued, whatever the late peer's host is doing.
pub fn enqueued_before_a_late_peer(rank: usize, enqueue: impl FnOnce()) {
    if rank == 1 {
        std::thread::sleep(Duration::from_secs(2));
    }
    let started = std::time::Instant::now();
    enqueue();
    let enqueued = started.elapsed();
    assert!(
        rank == 1 || enqueued < Duration::from_millis(500),
        "rank {rank} waited {enqueued:?} for a late peer's host"
    );
}

/// A first call of two new shapes, an in-place average of `base + 44` elements on rank 1 and
/// `base + 24` on the others: every call is enqueued, and every rank's GPU finds the difference
/// before touching a peer's memory — the mismatch named on every rank, the buffer untouched (the
/// average's last step, a scale kernel after the peer kernel, skipped too).
/// The form the call ran in, read once it was enqueued.
pub fn first_call_mismatch_is_named_by_the_gpus(
    rank: usize,
    comm: &mut RankCommunicator,
    stream: &CudaStream,
    device: usize,
    base: usize,
) -> Option<ringreduce::Form> {
    let (rank_1, others) = (base + 44, base + 24);
    let len = if rank == 1 { rank_1 } else { others };
    let mut buf = GpuBuffer::from_host(device, &vec![2.0f32; len]).unwrap();
    // SAFETY: `buf` is untouched until the stream is synchronised below.
    unsafe { comm.enqueue_all_reduce_in_place_on(&mut buf, ReduceOp::Avg, stream) }.unwrap();
    let ran = comm.last_ran().map(|r| r.form);
    stream.synchronize().unwrap();
    let err = comm.synchronize().unwrap_err();
    assert_rank_1_mismatch(rank, &err, &rank_1.to_string(), &others.to_string());
    assert_eq!(
        buf.to_host().unwrap(),
        vec![2.0; len],
        "rank {rank}: untouched"
    );
    ran
}

/// `err` is the mismatch of rank 1's call (of `rank_1`'s count) with the others' (of
/// `others`'): rank 1 names rank 0's call, every other rank names rank 1's, each with both counts.
pub fn assert_rank_1_mismatch(rank: usize, err: &ringreduce::Error, rank_1: &str, others: &str) {
    match err {
        ringreduce::Error::CallMismatch {
            rank: q,
            theirs,
            ours,
            ..
        } => {
            assert_eq!(*q, if rank == 1 { 0 } else { 1 }, "{err}");
            let (mine, other) = if rank == 1 {
                (rank_1, others)
            } else {
                (others, rank_1)
            };
            assert!(ours.contains(mine) && theirs.contains(other), "{err}");
        }
        other => panic!("rank {rank}: {other}"),
    }
}

/// Rank `rank`'s input of `len` elements for `op` (`ringreduce::verify`'s values).
pub fn values(op: ReduceOp, rank: usize, len: usize) -> Vec<f32> {
    (0..len).map(|k| input_value(op, rank, k)).collect()
}
