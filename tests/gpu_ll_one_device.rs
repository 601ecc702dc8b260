//! The LL one-shot's protocol on ONE GPU: two ranks whose buffers, receive sets and epoch words
//! all live on the same device, their kernels on two streams of it, launched directly through
//! `KernelModule::ll`. It checks what does not depend on NVLink — the words, the epoch parity of
//! the receive sets under back-to-back calls, the fold, the padding of odd sizes — on a machine
//! with one GPU; the communicator tests in tests/gpu.rs (`ll_*`, two ranks sharing one GPU there
//! too) check the executor's use of it, and on two GPUs NVLink. Prints its waiver
//! (`common::waiver`) and passes where there is no GPU.

use ringreduce::device::{self, DeviceBuffer, PinnedHost, Stream};
use ringreduce::internal::kernels::{
    ll_recv_bytes, CallGate, KernelModule, LlArgs, PEER_FLAG_BYTES,
};
use ringreduce::{DType, ReduceOp};

mod common;

/// Rank `rank`'s input element `i` in call `call`: u32, exact, different in every call.
fn input(call: usize, rank: usize, i: usize) -> u32 {
    ((call as u32).wrapping_mul(2_654_435_761)) ^ ((rank as u32 + 1) << 24) ^ (i as u32)
}

fn bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

#[test]
fn ll_protocol_back_to_back_on_one_gpu() {
    if common::gpus(1, "the LL protocol on one GPU").is_none() {
        return;
    }
    let ctx = device::context(0).unwrap();
    let kernels = KernelModule::new(&ctx).unwrap();
    let calls = 40;
    for count in [1usize, 7, 4099, (64 << 10) / 4] {
        let n = 2;
        let recv: Vec<DeviceBuffer> = (0..n)
            .map(|_| DeviceBuffer::zeroed(&ctx, ll_recv_bytes(n)).unwrap())
            .collect();
        let flags: Vec<DeviceBuffer> = (0..n)
            .map(|_| DeviceBuffer::zeroed(&ctx, PEER_FLAG_BYTES).unwrap())
            .collect();
        let mut error = PinnedHost::new(&ctx, 4).unwrap();
        error.as_mut_slice().fill(0);
        let streams: Vec<Stream> = (0..n).map(|_| Stream::new(&ctx).unwrap()).collect();
        // Per call and rank: the input (uploaded before anything runs) and the output; all
        // calls are then enqueued back to back, with no host synchronisation between them.
        let mut srcs: Vec<Vec<DeviceBuffer>> = Vec::new();
        let mut dsts: Vec<Vec<DeviceBuffer>> = Vec::new();
        for call in 0..calls {
            let mut s = Vec::new();
            let mut d = Vec::new();
            for rank in 0..n {
                let mut b = DeviceBuffer::new(&ctx, count * 4).unwrap();
                let data: Vec<u32> = (0..count).map(|i| input(call, rank, i)).collect();
                b.copy_from_host(&bytes(&data)).unwrap();
                s.push(b);
                let mut o = DeviceBuffer::new(&ctx, count * 4).unwrap();
                o.copy_from_host(&bytes(&vec![7u32; count])).unwrap();
                d.push(o);
            }
            srcs.push(s);
            dsts.push(d);
        }
        for call in 0..calls {
            for rank in 0..n {
                let mut args = LlArgs {
                    recvs: [0; 8],
                    flags: flags[rank].ptr(),
                    world: n as u32,
                    rank: rank as u32,
                    src: srcs[call][rank].ptr(),
                    dst: dsts[call][rank].ptr(),
                    count: count as u64,
                    timeout_ns: 5_000_000_000,
                    error: error.uva_ptr(),
                    gate: CallGate::NONE,
                };
                args.recvs[0] = recv[0].ptr();
                args.recvs[1] = recv[1].ptr();
                // SAFETY: every address is a live buffer of this device of the size the kernel
                // needs; both ranks' kernels of a call are launched (on two streams of one GPU,
                // 16 blocks each at most, so both are resident at once); each rank's calls are
                // ordered on its stream.
                unsafe { kernels.ll(DType::U32, ReduceOp::Sum, &args, &streams[rank]) }.unwrap();
            }
        }
        for s in &streams {
            device::stream_synchronize(s).unwrap();
        }
        let code = u32::from_ne_bytes(error.as_slice()[..4].try_into().unwrap());
        assert_eq!(code, 0, "count {count}: error code {code}");
        for (call, per_rank) in dsts.iter().enumerate() {
            for (rank, dst) in per_rank.iter().enumerate() {
                let mut got = vec![0u8; count * 4];
                dst.copy_to_host(&mut got).unwrap();
                let wrong = (0..count)
                    .filter(|&i| {
                        let g = u32::from_ne_bytes(got[4 * i..4 * i + 4].try_into().unwrap());
                        g != input(call, 0, i).wrapping_add(input(call, 1, i))
                    })
                    .count();
                assert_eq!(
                    wrong, 0,
                    "count {count} call {call} rank {rank}: {wrong} wrong"
                );
            }
        }
        println!("count {count}: {calls} back-to-back LL calls exact on both ranks");
    }
}
