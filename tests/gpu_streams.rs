//! Collectives on the caller's streams (GPU): ordered after the work already queued on each
//! rank's stream, and before the work queued there afterwards, with no host synchronisation in
//! between. On a one-GPU machine two ranks share GPU 0 (two streams of it), and every test runs
//! but the refusal of a stream of another rank's GPU, which prints its waiver and passes there.

use cudarc::driver::{result, sys, CudaStream};
use ringreduce::{Algorithm, Buffer, Communicator, CudaConfig, Error, GpuBuffer, ReduceOp};
use std::sync::Arc;
use std::time::Duration;

use common::{new_streams, two_gpus_or_shared};

mod common;

/// A communicator that runs `algorithm` at every size, with a 20 s timeout; its ranks may share
/// a GPU.
fn forced(gpus: &[usize], algorithm: Algorithm) -> Communicator {
    let config = CudaConfig {
        allow_shared_device: gpus[0] == gpus[1],
        algorithm,
        timeout: Duration::from_secs(20),
        ..CudaConfig::default()
    };
    Communicator::with_config(gpus, config).unwrap()
}

/// What rank `rank` writes into every element of its input before call `call`.
fn value(call: usize, rank: usize) -> u32 {
    (call as u32).wrapping_mul(1_000_003) ^ (rank as u32 + 1).wrapping_mul(7919)
}

/// Fills `count` u32 at `ptr` with `v` on `stream` (a stand-in for the caller's kernel).
fn fill(stream: &Arc<CudaStream>, ptr: u64, v: u32, count: usize) {
    stream.context().bind_to_thread().unwrap();
    // SAFETY: `ptr` is a live allocation of at least `count` u32 on the stream's device.
    unsafe { sys::cuMemsetD32Async(ptr, v, count, stream.cu_stream()) }
        .result()
        .unwrap();
}

/// Copies `bytes` from `src` to `dst` on `stream` (a stand-in for the kernel that reads the
/// result).
fn copy(stream: &Arc<CudaStream>, dst: u64, src: u64, bytes: usize) {
    stream.context().bind_to_thread().unwrap();
    // SAFETY: both are live allocations of at least `bytes` on the stream's device.
    unsafe { result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream()) }.unwrap();
}

/// A write on each caller's stream, the all-reduce on those streams, a read on each: 20 calls
/// back to back with one host synchronisation at the end, every algorithm, both placements.
#[test]
fn the_callers_streams_order_the_collective() {
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    let streams: Vec<Arc<CudaStream>> = new_streams(&gpus);
    let count = 1 << 20;
    let bytes = count * 4;
    let calls = 20;
    for algorithm in [Algorithm::OneShot, Algorithm::TwoShot, Algorithm::Ring] {
        let comm = forced(&gpus, algorithm);
        for in_place in [true, false] {
            let mut bufs: Vec<GpuBuffer<u32>> = gpus
                .iter()
                .map(|&g| GpuBuffer::zeroed(g, count).unwrap())
                .collect();
            let mut outs: Vec<GpuBuffer<u32>> = gpus
                .iter()
                .map(|&g| GpuBuffer::zeroed(g, count).unwrap())
                .collect();
            let seen: Vec<Vec<GpuBuffer<u32>>> = (0..calls)
                .map(|_| {
                    gpus.iter()
                        .map(|&g| GpuBuffer::zeroed(g, count).unwrap())
                        .collect()
                })
                .collect();
            for (call, slots) in seen.iter().enumerate() {
                for (rank, stream) in streams.iter().enumerate() {
                    fill(stream, bufs[rank].address(), value(call, rank), count);
                }
                // SAFETY: nothing but work queued on `streams` after this touches the buffers
                // before the streams are synchronised below.
                unsafe {
                    if in_place {
                        comm.enqueue_all_reduce_in_place_on(&mut bufs, ReduceOp::Sum, &streams)
                    } else {
                        comm.enqueue_all_reduce_on(&bufs, &mut outs, ReduceOp::Sum, &streams)
                    }
                }
                .unwrap_or_else(|e| panic!("{algorithm:?} in_place {in_place} call {call}: {e}"));
                let result = if in_place { &bufs } else { &outs };
                for (rank, stream) in streams.iter().enumerate() {
                    copy(stream, slots[rank].address(), result[rank].address(), bytes);
                }
            }
            for stream in &streams {
                stream.synchronize().unwrap();
            }
            for (call, per_rank) in seen.iter().enumerate() {
                let want = value(call, 0).wrapping_add(value(call, 1));
                for (rank, buf) in per_rank.iter().enumerate() {
                    let got = buf.to_host().unwrap();
                    let wrong = got.iter().filter(|&&x| x != want).count();
                    assert_eq!(
                        wrong, 0,
                        "{algorithm:?} in_place {in_place} call {call} rank {rank}: {wrong} of {count} wrong (first {})",
                        got[0]
                    );
                }
            }
            comm.health().unwrap();
        }
    }
}

/// A stream of another rank's GPU (here: two ranks' streams swapped) is refused before anything
/// is enqueued, and the refusal fails nothing.
#[test]
fn streams_of_the_wrong_gpus_are_refused() {
    let Some(gpus) = common::two_gpus(
        "a stream of another rank's GPU (with ranks sharing GPU 0, every stream is on its own \
         rank's GPU)",
    ) else {
        return;
    };
    let comm = Communicator::new(&gpus).unwrap();
    let swapped = new_streams(&[gpus[1], gpus[0]]);
    let mut bufs: Vec<GpuBuffer<f32>> = gpus
        .iter()
        .map(|&g| GpuBuffer::zeroed(g, 16).unwrap())
        .collect();
    // SAFETY: refused before anything is enqueued.
    let err = unsafe { comm.enqueue_all_reduce_in_place_on(&mut bufs, ReduceOp::Sum, &swapped) }
        .unwrap_err();
    assert!(matches!(err, Error::WrongDevice { rank: 0, .. }), "{err}");
    // The refusal failed nothing.
    comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum).unwrap();
}

/// A number of streams other than the world is refused before anything is enqueued, and the
/// refusal fails nothing.
#[test]
fn streams_not_one_per_rank_are_refused() {
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    let comm = forced(&gpus, Algorithm::Auto);
    let streams = new_streams(&gpus);
    let mut bufs: Vec<GpuBuffer<f32>> = gpus
        .iter()
        .map(|&g| GpuBuffer::zeroed(g, 16).unwrap())
        .collect();
    let one = &streams[..1];
    // SAFETY: refused before anything is enqueued.
    let err =
        unsafe { comm.enqueue_all_reduce_in_place_on(&mut bufs, ReduceOp::Sum, one) }.unwrap_err();
    assert!(matches!(err, Error::WorldMismatch { .. }), "{err}");
    // The refusal failed nothing.
    comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum).unwrap();
}

/// cudarc slices as buffers, with cudarc's event tracking respected: each call's input is written
/// by `memcpy_htod` on the slice's own stream, the all-reduce is enqueued on the communicator's
/// streams, and the result is read by `clone_dtoh` on the slice's stream — no host
/// synchronisation between them; 20 calls, every algorithm.
#[test]
fn cudarc_slices_are_buffers_and_their_events_are_respected() {
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    let count = 1 << 18;
    for algorithm in [Algorithm::OneShot, Algorithm::TwoShot, Algorithm::Ring] {
        let comm = forced(&gpus, algorithm);
        // Each slice lives on a stream of its own (cudarc's default for a new stream).
        let streams: Vec<Arc<CudaStream>> = new_streams(&gpus);
        let mut slices: Vec<cudarc::driver::CudaSlice<f32>> = streams
            .iter()
            .map(|s| s.alloc_zeros::<f32>(count).unwrap())
            .collect();
        for call in 0..20 {
            let inputs: Vec<Vec<f32>> = (0..2)
                .map(|r| {
                    (0..count)
                        .map(|i| ((i % 1000) * (r + 1) + call) as f32)
                        .collect()
                })
                .collect();
            for ((s, slice), input) in streams.iter().zip(&mut slices).zip(&inputs) {
                s.memcpy_htod(input, slice).unwrap();
            }
            // SAFETY: the slices are only touched by cudarc calls on their streams afterwards,
            // which wait for the collective through the slices' events.
            unsafe { comm.enqueue_all_reduce_in_place(&mut slices, ReduceOp::Sum) }
                .unwrap_or_else(|e| panic!("{algorithm:?} call {call}: {e}"));
            for (rank, (s, slice)) in streams.iter().zip(&slices).enumerate() {
                let got = s.clone_dtoh(slice).unwrap();
                let wrong = (0..count)
                    .filter(|&i| got[i] != inputs[0][i] + inputs[1][i])
                    .count();
                assert_eq!(wrong, 0, "{algorithm:?} call {call} rank {rank}");
            }
        }
        comm.health().unwrap();
    }
}
