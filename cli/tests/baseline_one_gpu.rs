//! The NCCL baseline's every NCCL call, run for real on one GPU: a one-rank NCCL communicator
//! (`ncclCommInitAll` over GPU 0) through each collective of `bench` — all-reduce out of place
//! and in place, on NCCL's streams and the caller's, reduce-scatter, all-gather, broadcast,
//! reduce, all-to-all and send/recv (`ncclSend`/`ncclRecv` to itself) — and NCCL's symmetric
//! memory (`ncclMemAlloc`, `ncclCommWindowRegister`, their frees), then `close`. With one rank
//! every collective leaves each output equal to its input, so a wrong signature in the loader's
//! table — a buffer, count, type or communicator out of place — shows as a wrong value, an NCCL
//! error or a crash; a swapped root, peer or operator would not (each is 0 or a no-op with one
//! rank): those are the bench's to show on two GPUs.
//!
//! Waived (`waived:`, passing) where there is no GPU or no NCCL (CI); on a GPU host, NCCL is
//! found as the library finds it (`RINGREDUCE_NCCL_PATH`, or `libnccl.so.2` on the loader path).

use ringreduce::plan::{Collective, Transfer};
use ringreduce::{GpuBuffer, ReduceOp};
use ringreduce_cli::baseline::{nccl_missing, NcclAllReduce};

const COUNT: usize = 1000;

fn data(salt: u32) -> Vec<f32> {
    (0..COUNT as u32)
        .map(|i| ((i * 7 + salt) % 113) as f32)
        .collect()
}

#[test]
fn every_nccl_call_of_the_baseline_runs_on_one_gpu() {
    if ringreduce::device::device_count().unwrap_or(0) == 0 {
        println!("waived: no GPU");
        return;
    }
    if let Some(why) = nccl_missing() {
        println!("waived: no NCCL ({why})");
        return;
    }
    let nccl = NcclAllReduce::new(&[0]).expect("a one-rank NCCL communicator");
    let input = data(1);
    let ins = vec![GpuBuffer::from_host(0, &input).unwrap()];
    let read = |bufs: &[GpuBuffer<f32>]| bufs[0].to_host().unwrap();

    // All-reduce out of place (NCCL's stream), in place, and on the caller's stream.
    for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
        let mut outs = vec![GpuBuffer::<f32>::zeroed(0, COUNT).unwrap()];
        // SAFETY: the buffers outlive the call, which `synchronize` waits for.
        unsafe { nccl.enqueue_all_reduce(&ins, &mut outs, op) }.unwrap();
        nccl.synchronize().unwrap();
        assert_eq!(read(&outs), input, "all-reduce {op:?}");
    }
    let mut bufs = vec![GpuBuffer::from_host(0, &input).unwrap()];
    // SAFETY: as above.
    unsafe { nccl.enqueue_all_reduce_in_place(&mut bufs, ReduceOp::Sum) }.unwrap();
    nccl.synchronize().unwrap();
    assert_eq!(read(&bufs), input, "all-reduce in place");
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let mut outs = vec![GpuBuffer::<f32>::zeroed(0, COUNT).unwrap()];
    // SAFETY: as above, on the caller's stream, synchronized below.
    unsafe {
        nccl.enqueue_all_reduce_on(
            &ins,
            &mut outs,
            ReduceOp::Sum,
            std::slice::from_ref(&stream),
        )
    }
    .unwrap();
    stream.synchronize().unwrap();
    assert_eq!(read(&outs), input, "all-reduce on the caller's stream");

    // Every other collective of one rank: the output is the input.
    let rooted = [
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast { root: 0 },
        Collective::Reduce { root: 0 },
        Collective::AllToAll,
        Collective::SendRecv {
            transfers: vec![Transfer {
                from: 0,
                to: 0,
                count: COUNT,
            }],
        },
    ];
    for collective in &rooted {
        let mut outs = vec![GpuBuffer::<f32>::zeroed(0, COUNT).unwrap()];
        // SAFETY: as above.
        unsafe {
            nccl.enqueue_collective(collective, Some(&ins[..]), &mut outs, ReduceOp::Sum, None)
        }
        .unwrap_or_else(|e| panic!("{collective:?}: {e}"));
        nccl.synchronize().unwrap();
        assert_eq!(read(&outs), input, "{collective:?}");
    }

    // NCCL's symmetric memory: allocated, registered, all-reduced in place, freed (NCCL 2.27 and
    // later; an older NCCL lacks the calls, which the baseline names: that part is waived).
    match nccl.symmetric_buffers::<f32>(COUNT) {
        Err(ringreduce::Error::NoGpu { reason }) => {
            println!("waived: NCCL's symmetric memory ({reason})");
        }
        Err(other) => panic!("ncclMemAlloc, ncclCommWindowRegister: {other}"),
        Ok(mut symmetric) => {
            symmetric.write(0, &input).unwrap();
            {
                let mut views = symmetric.views_mut(COUNT).unwrap();
                // SAFETY: as above.
                unsafe { nccl.enqueue_all_reduce_in_place(&mut views, ReduceOp::Sum) }.unwrap();
                nccl.synchronize().unwrap();
            }
            assert_eq!(symmetric.read(0, COUNT).unwrap(), input, "symmetric");
            symmetric
                .free()
                .expect("ncclCommWindowDeregister, ncclMemFree");
        }
    }
    nccl.close().expect("ncclCommFinalize, ncclCommDestroy");
    println!("ran on NCCL {}", nccl_version_line());
}

fn nccl_version_line() -> String {
    ringreduce_cli::baseline::nccl_version().unwrap_or_else(|e| e.to_string())
}
