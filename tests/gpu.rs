//! The GPU suite: the host test matrix on real GPUs, compared with the host reference
//! (`ringreduce::verify`, exact). On a one-GPU machine two ranks share GPU 0
//! ([`common::two_gpus_or_shared`]) and every test runs, but for those that check something
//! only two GPUs show — peer access between two devices and its edge probe, a buffer on another
//! rank's GPU, `ring_allreduce`'s one rank per GPU — which print their waiver
//! ([`common::waiver`]: `waived: needs ≥ 2 GPUs (found 1): …`) and pass; none fakes a result.
//! Run on a GPU host, one test at a time: `.gpu/bin/test-gpu --test-threads=1 --nocapture` (see
//! scripts/gpu-check.sh).

use half::{bf16, f16};
use ringreduce::device;
use ringreduce::exec::cuda::probe;
use ringreduce::verify::{compare, make_expected, make_input};
use ringreduce::{
    Algorithm, Communicator, CudaConfig, Element, Form, GpuBuffer, ReduceOp, Transport,
};
use std::sync::{Arc, Condvar, Mutex};

use common::two_gpus_or_shared;

mod common;

fn shared(devices: &[usize]) -> bool {
    devices[0] == devices[1]
}

fn comm(
    devices: &[usize],
    transport: Transport,
    chunk_bytes: Option<usize>,
    slots: usize,
) -> Communicator {
    let config = CudaConfig {
        transport,
        chunk_bytes,
        slots,
        allow_shared_device: shared(devices),
        // The ring on every size: these communicators test its chunking and transports.
        algorithm: Algorithm::Ring,
        ..CudaConfig::default()
    };
    Communicator::with_config(devices, config).expect("GPU communicator")
}

/// A communicator that runs the one-shot at every size.
fn oneshot_comm(devices: &[usize]) -> Communicator {
    peer_comm(devices, Algorithm::OneShot)
}

/// A communicator that runs `algorithm` (the one-shot or the two-shot) at every size.
fn peer_comm(devices: &[usize], algorithm: Algorithm) -> Communicator {
    let config = CudaConfig {
        allow_shared_device: shared(devices),
        algorithm,
        // A barrier that never meets costs this much per call, not a minute.
        timeout: std::time::Duration::from_secs(20),
        ..CudaConfig::default()
    };
    Communicator::with_config(devices, config).expect("one-shot GPU communicator")
}

/// The defaults: `Algorithm::Auto` (one-shot for small messages, ring above), `Transport::Auto`.
fn default_comm(devices: &[usize]) -> Communicator {
    let config = CudaConfig {
        allow_shared_device: shared(devices),
        ..CudaConfig::default()
    };
    Communicator::with_config(devices, config).expect("GPU communicator")
}

/// Runs one all-reduce on GPUs (optionally on a sub-slice starting `offset` elements in) and
/// checks every element of every rank against the host reference.
fn check_case<T: Element>(
    comm: &Communicator,
    count: usize,
    op: ReduceOp,
    in_place: bool,
    offset: usize,
) {
    let devices = comm.devices();
    let world = devices.len();
    let want = make_expected::<T>(op, world, count);
    let pad = |r: usize| -> Vec<T> {
        let mut v = vec![T::from_i64(77); offset];
        v.extend(make_input::<T>(op, r, count));
        v
    };
    let mut inputs: Vec<GpuBuffer<T>> = devices
        .iter()
        .enumerate()
        .map(|(r, &d)| GpuBuffer::from_host(d, &pad(r)).unwrap())
        .collect();
    let outputs_host: Vec<Vec<T>> = if in_place {
        let mut views: Vec<_> = inputs
            .iter_mut()
            .map(|b| b.view_mut(offset, count).unwrap())
            .collect();
        comm.all_reduce_in_place(&mut views, op).unwrap();
        drop(views);
        inputs
            .iter()
            .map(|b| b.to_host().unwrap()[offset..].to_vec())
            .collect()
    } else {
        let mut outputs: Vec<GpuBuffer<T>> = devices
            .iter()
            .map(|&d| GpuBuffer::zeroed(d, count + offset).unwrap())
            .collect();
        {
            let ins: Vec<_> = inputs
                .iter_mut()
                .map(|b| b.view_mut(offset, count).unwrap())
                .collect();
            let mut outs: Vec<_> = outputs
                .iter_mut()
                .map(|b| b.view_mut(offset, count).unwrap())
                .collect();
            comm.all_reduce(&ins, &mut outs, op).unwrap();
        }
        for (r, input) in inputs.iter().enumerate() {
            assert!(
                input.to_host().unwrap() == pad(r),
                "rank {r}'s input changed"
            );
        }
        outputs
            .iter()
            .map(|b| b.to_host().unwrap()[offset..].to_vec())
            .collect()
    };
    for (rank, out) in outputs_host.iter().enumerate() {
        let (wrong, first) = compare(rank, out, &want, 4);
        assert_eq!(
            wrong,
            0,
            "{} {op} count {count} in_place {in_place} offset {offset} edges {:?}: {wrong} wrong, first {}",
            T::DTYPE,
            comm.edges().iter().map(|e| e.transport).collect::<Vec<_>>(),
            first.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(" ")
        );
    }
}

fn every_op<T: Element>(comm: &Communicator, count: usize, offset: usize) {
    for op in ReduceOp::ALL {
        for in_place in [true, false] {
            check_case::<T>(comm, count, op, in_place, offset);
        }
    }
}

/// Every element type through [`every_op`].
fn every_type(comm: &Communicator, count: usize, offset: usize) {
    every_op::<f16>(comm, count, offset);
    every_op::<bf16>(comm, count, offset);
    every_op::<f32>(comm, count, offset);
    every_op::<f64>(comm, count, offset);
    every_op::<i8>(comm, count, offset);
    every_op::<u8>(comm, count, offset);
    every_op::<i32>(comm, count, offset);
    every_op::<u32>(comm, count, offset);
    every_op::<i64>(comm, count, offset);
    every_op::<u64>(comm, count, offset);
    every_op::<ringreduce::F8E4M3>(comm, count, offset);
    every_op::<ringreduce::F8E5M2>(comm, count, offset);
}

#[test]
fn every_type_and_op_both_transports() {
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    for transport in [Transport::Peer, Transport::Staged] {
        let comm = comm(&gpus, transport, Some(64 << 10), 2);
        for (count, offset) in [
            (0, 0),
            (1, 0),
            (3, 1),
            (1009, 0),
            (100_003, 3),
            (1 << 20, 0),
        ] {
            every_type(&comm, count, offset);
        }
        comm.close().unwrap();
    }
}

/// `algorithm` (the one-shot or the two-shot) forced on 2 GPUs (two ranks sharing GPU 0 on a
/// one-GPU machine): every type and op, in and out of place, misaligned sub-slices, lengths up
/// to 4 MiB; `None` (waived) without a GPU.
fn peer_algorithm_every_type(algorithm: Algorithm) -> Option<(Vec<usize>, Communicator)> {
    // (On one GPU the two ranks share it, each with half of its SMs for its grid.)
    let gpus = two_gpus_or_shared()?;
    let comm = peer_comm(&gpus, algorithm);
    assert_eq!(comm.algorithm_for(1 << 30, false), algorithm);
    for (count, offset) in [
        (0, 0),
        (1, 0),
        (3, 1),
        (17, 2),
        (1009, 0),
        (100_003, 3),
        (1 << 20, 0),
    ] {
        every_type(&comm, count, offset);
    }
    Some((gpus.to_vec(), comm))
}

/// The one-shot kernel: every type and op, in and out of place, misaligned sub-slices, lengths
/// from 0 to 64 MiB — results bit-exact against the host reference.
#[test]
fn oneshot_every_type_and_op() {
    let Some((_, comm)) = peer_algorithm_every_type(Algorithm::OneShot) else {
        return;
    };
    for count in [(16 << 20) + 5, 16 << 20] {
        check_case::<f32>(&comm, count, ReduceOp::Sum, false, 0);
        check_case::<f32>(&comm, count, ReduceOp::Avg, true, 1);
    }
    comm.close().unwrap();
}

/// The two-shot kernel: every type and op, in and out of place, misaligned sub-slices, lengths
/// from 0 to 64 MiB — results bit-exact against the host reference — and calls alternating with
/// the one-shot's on another communicator of the same GPUs.
#[test]
fn twoshot_every_type_and_op() {
    let Some((gpus, comm)) = peer_algorithm_every_type(Algorithm::TwoShot) else {
        return;
    };
    let oneshot = oneshot_comm(&gpus);
    for count in [(16 << 20) + 5, 16 << 20] {
        check_case::<f32>(&comm, count, ReduceOp::Sum, false, 0);
        check_case::<f32>(&oneshot, count, ReduceOp::Sum, true, 0);
        check_case::<f32>(&comm, count, ReduceOp::Avg, true, 1);
        check_case::<bf16>(&comm, count, ReduceOp::Max, true, 3);
    }
    comm.close().unwrap();
    oneshot.close().unwrap();
}

/// Faults never hang, on the GPU either: a one-shot kernel whose peer never launches gives up at
/// its start barrier after the timeout, reports code 1 in its error word, and returns — the
/// stream completes. (On one GPU, rank 1's source and flags are on GPU 0 too; rank 1 still never
/// launches.)
#[test]
fn oneshot_kernel_gives_up_on_a_missing_peer() {
    use ringreduce::internal::kernels::{CallGate, KernelModule, OneShotArgs, PEER_FLAG_BYTES};
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    let (a, b) = (
        device::context(gpus[0]).unwrap(),
        device::context(gpus[1]).unwrap(),
    );
    device::enable_peer_access(&a, &b).unwrap();
    device::enable_peer_access(&b, &a).unwrap();
    let count = 1 << 16;
    let src_a = device::DeviceBuffer::zeroed(&a, count * 4).unwrap();
    let src_b = device::DeviceBuffer::zeroed(&b, count * 4).unwrap();
    let dst = device::DeviceBuffer::zeroed(&a, count * 4).unwrap();
    let flags_a = device::DeviceBuffer::zeroed(&a, PEER_FLAG_BYTES).unwrap();
    let flags_b = device::DeviceBuffer::zeroed(&b, PEER_FLAG_BYTES).unwrap();
    let mut error = device::PinnedHost::new(&a, 4).unwrap();
    error.as_mut_slice().fill(0);
    let stream = device::Stream::new(&a).unwrap();
    let kernels = KernelModule::new(&a).unwrap();
    let mut args = OneShotArgs {
        srcs: [0; 8],
        flags: [0; 8],
        world: 2,
        rank: 0,
        dst: dst.ptr(),
        count: count as u64,
        timeout_ns: 200_000_000,
        error: error.uva_ptr(),
        expose_from: 0,
        max_blocks: 0,
        gate: CallGate::NONE,
    };
    args.srcs[..2].copy_from_slice(&[src_a.ptr(), src_b.ptr()]);
    args.flags[..2].copy_from_slice(&[flags_a.ptr(), flags_b.ptr()]);
    let start = std::time::Instant::now();
    // SAFETY: every address is a live buffer of the right size on a GPU reachable from GPU a;
    // rank 1 never launches, which is the fault under test.
    unsafe { kernels.oneshot(ringreduce::DType::F32, ReduceOp::Sum, &args, &stream) }.unwrap();
    device::stream_synchronize(&stream).unwrap();
    let waited = start.elapsed();
    let code = u32::from_ne_bytes(error.as_slice()[..4].try_into().unwrap());
    println!("one-shot without its peer: error code {code} after {waited:?}");
    assert_eq!(code, 1, "the start barrier must report its timeout");
    assert!(waited < std::time::Duration::from_secs(10), "{waited:?}");
}

/// A communicator that runs the one-shot at every size, with `low_latency` on: the LL one-shot
/// up to `LL_MAX_BYTES` per rank, the read one-shot above.
fn ll_comm(devices: &[usize]) -> Communicator {
    let config = CudaConfig {
        allow_shared_device: shared(devices),
        algorithm: Algorithm::OneShot,
        low_latency: true,
        timeout: std::time::Duration::from_secs(20),
        ..CudaConfig::default()
    };
    Communicator::with_config(devices, config).expect("LL one-shot GPU communicator")
}

/// The LL one-shot (the one-shot's kernel up to `LL_MAX_BYTES` per rank with `low_latency`),
/// for one element type: every op, in and out of place, at 1, 7 and 4099 elements (misaligned
/// sub-slices among them: element-by-element chunks) and at the LL limit: one element below,
/// exactly at it (aligned and not), and one above (the read one-shot) — exact against the host
/// reference on every rank, so the bits are identical on every rank.
fn ll_cases<T: Element>(comm: &Communicator) {
    use ringreduce::internal::kernels::{ll_fits, LL_MAX_BYTES};
    let most = LL_MAX_BYTES / size_of::<T>();
    for (count, offset) in [
        (1, 0),
        (7, 1),
        (4099, 3),
        (most - 1, 0),
        (most, 0),
        (most, 1),
        (most + 1, 0),
    ] {
        assert_eq!(ll_fits(T::DTYPE, count), count <= most);
        every_op::<T>(comm, count, offset);
    }
}

/// The LL one-shot kernel: every type × op × placement through it (see [`ll_cases`]). On a
/// one-GPU machine the two ranks share GPU 0: the LL grid (at most 16 blocks per rank) fits the
/// peer kernels' grid cap there (SMs / 2), so both ranks' blocks are resident at once and the
/// pushes are stores into the same GPU's memory — everything but NVLink runs.
#[test]
fn ll_oneshot_every_type_and_op() {
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    let comm = ll_comm(&gpus);
    ll_cases::<f16>(&comm);
    ll_cases::<bf16>(&comm);
    ll_cases::<f32>(&comm);
    ll_cases::<f64>(&comm);
    ll_cases::<i8>(&comm);
    ll_cases::<u8>(&comm);
    ll_cases::<i32>(&comm);
    ll_cases::<u32>(&comm);
    ll_cases::<i64>(&comm);
    ll_cases::<u64>(&comm);
    ll_cases::<ringreduce::F8E4M3>(&comm);
    ll_cases::<ringreduce::F8E5M2>(&comm);
    comm.close().unwrap();
}

/// The LL one-shot's receive sets (by epoch parity) under back-to-back calls: many in-place
/// calls enqueued without waiting, each with its own data (so a set reused too early would show),
/// interleaved with the read one-shot, the two-shot and the steps kernel (an in-place
/// all-gather), which advance the same per-block epochs on the same communicator (`Auto` with
/// `low_latency`), then one synchronize; every result exact. Two ranks sharing GPU 0 on a
/// one-GPU machine.
#[test]
fn ll_back_to_back_with_the_other_peer_kernels() {
    /// One enqueued call: an all-reduce of `n` elements per rank, or an all-gather in place.
    #[derive(Clone, Copy)]
    enum Call {
        AllReduce(usize),
        AllGather,
    }
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    let config = CudaConfig {
        allow_shared_device: shared(&gpus),
        low_latency: true,
        timeout: std::time::Duration::from_secs(20),
        ..CudaConfig::default()
    };
    let comm = Communicator::with_config(&gpus, config).unwrap();
    let world = gpus.len();
    let ll = [1, 3, 1000, 4096, 16384]; // u32: up to exactly 64 KiB, the LL one-shot
    let read = 100_003; // the read one-shot
    let twoshot = 2 << 20; // 8 MiB in place: the two-shot
    let gather = 777; // per rank: the all-gather's one-shot form, the steps kernel
    assert_eq!(comm.algorithm_for(read * 4, true), Algorithm::OneShot);
    assert_eq!(comm.algorithm_for(twoshot * 4, true), Algorithm::TwoShot);
    assert_eq!(
        comm.algorithm_for_collective(&ringreduce::Collective::AllGather, gather * 4, true),
        Algorithm::OneShot
    );
    // What ran, as the executor says: the LL kernel up to 64 KiB per rank, the read one-shot
    // above it, the two-shot in place from its limit.
    for (count, form) in [
        (16384, Form::LlKernel),
        (16385, Form::OneShotKernel),
        (read, Form::OneShotKernel),
        (twoshot, Form::TwoShotKernel),
    ] {
        check_case::<f32>(&comm, count, ReduceOp::Sum, true, 0);
        assert_eq!(comm.last_ran().map(|r| r.form), Some(form), "{count}");
    }
    let mut calls = Vec::new();
    for call in 0..120 {
        calls.push(Call::AllReduce(ll[call % ll.len()]));
        if call % 7 == 3 {
            calls.push(Call::AllReduce(read));
        }
        if call % 29 == 11 {
            calls.push(Call::AllReduce(twoshot));
        }
        if call % 13 == 5 {
            calls.push(Call::AllGather);
        }
    }
    let length = |c: Call| match c {
        Call::AllReduce(n) => n,
        Call::AllGather => world * gather,
    };
    // Input of call `call`, rank `rank`, element `i`: exact under a wrapping u32 sum.
    let value = |call: usize, rank: usize, i: usize| -> u32 {
        (call as u32).wrapping_mul(0x9e37_79b9) ^ ((rank as u32) << 24) ^ (i as u32)
    };
    let mut bufs: Vec<Vec<GpuBuffer<u32>>> = calls
        .iter()
        .enumerate()
        .map(|(call, &c)| {
            (0..world)
                .map(|r| {
                    let data: Vec<u32> = (0..length(c)).map(|i| value(call, r, i)).collect();
                    GpuBuffer::from_host(gpus[r], &data).unwrap()
                })
                .collect()
        })
        .collect();
    for (set, &c) in bufs.iter_mut().zip(&calls) {
        // SAFETY: the buffers stay alive and untouched until `synchronize` below returns.
        unsafe {
            match c {
                Call::AllReduce(_) => comm.enqueue_all_reduce_in_place(set, ReduceOp::Sum),
                Call::AllGather => comm.enqueue_collective(
                    &ringreduce::Collective::AllGather,
                    None::<&[GpuBuffer<u32>]>,
                    set,
                    ReduceOp::Sum,
                    None,
                ),
            }
        }
        .unwrap();
    }
    comm.synchronize().unwrap();
    for (call, (set, &c)) in bufs.iter().zip(&calls).enumerate() {
        // The all-gather in place: block j of every rank ends holding rank j's block j.
        let want = |i: usize| -> u32 {
            match c {
                Call::AllReduce(_) => {
                    (0..world).fold(0u32, |acc, r| acc.wrapping_add(value(call, r, i)))
                }
                Call::AllGather => value(call, i / gather, i),
            }
        };
        for (rank, b) in set.iter().enumerate() {
            let got = b.to_host().unwrap();
            let wrong: Vec<usize> = (0..length(c))
                .filter(|&i| got[i] != want(i))
                .take(4)
                .collect();
            assert!(
                wrong.is_empty(),
                "call {call} ({} elements), rank {rank}: wrong at {wrong:?}",
                length(c)
            );
        }
    }
    comm.close().unwrap();
}

/// Faults never hang, the LL one-shot either: a kernel whose peer never launches gives up after
/// the timeout waiting for the peer's words, reports `LL_ERR_WAIT` in its error word, leaves its
/// output untouched, and returns — the stream completes. (On one GPU, rank 1's receive buffer is
/// on GPU 0 too; rank 1 still never launches.)
#[test]
fn ll_kernel_gives_up_on_a_missing_peer() {
    use ringreduce::internal::kernels::{
        ll_recv_bytes, CallGate, KernelModule, LlArgs, LL_ERR_WAIT, PEER_FLAG_BYTES,
    };
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    let (a, b) = (
        device::context(gpus[0]).unwrap(),
        device::context(gpus[1]).unwrap(),
    );
    device::enable_peer_access(&a, &b).unwrap();
    device::enable_peer_access(&b, &a).unwrap();
    let count = 5000; // f32: 2 blocks
    let bytes_of = |x: f32| -> Vec<u8> { (0..count).flat_map(|_| x.to_ne_bytes()).collect() };
    let sentinel = bytes_of(-7.0);
    let mut src = device::DeviceBuffer::new(&a, count * 4).unwrap();
    src.copy_from_host(&bytes_of(1.0)).unwrap();
    let mut dst = device::DeviceBuffer::new(&a, count * 4).unwrap();
    dst.copy_from_host(&sentinel).unwrap();
    let recv_a = device::DeviceBuffer::zeroed(&a, ll_recv_bytes(2)).unwrap();
    let recv_b = device::DeviceBuffer::zeroed(&b, ll_recv_bytes(2)).unwrap();
    let flags_a = device::DeviceBuffer::zeroed(&a, PEER_FLAG_BYTES).unwrap();
    let mut error = device::PinnedHost::new(&a, 4).unwrap();
    error.as_mut_slice().fill(0);
    let stream = device::Stream::new(&a).unwrap();
    let kernels = KernelModule::new(&a).unwrap();
    let mut args = LlArgs {
        recvs: [0; 8],
        flags: flags_a.ptr(),
        world: 2,
        rank: 0,
        src: src.ptr(),
        dst: dst.ptr(),
        count: count as u64,
        timeout_ns: 200_000_000,
        error: error.uva_ptr(),
        gate: CallGate::NONE,
    };
    args.recvs[..2].copy_from_slice(&[recv_a.ptr(), recv_b.ptr()]);
    let start = std::time::Instant::now();
    // SAFETY: every address is a live buffer of the right size on a GPU reachable from GPU a;
    // rank 1 never launches, which is the fault under test.
    unsafe { kernels.ll(ringreduce::DType::F32, ReduceOp::Sum, &args, &stream) }.unwrap();
    device::stream_synchronize(&stream).unwrap();
    let waited = start.elapsed();
    let code = u32::from_ne_bytes(error.as_slice()[..4].try_into().unwrap());
    println!("LL one-shot without its peer: error code {code} after {waited:?}");
    assert_eq!(code, LL_ERR_WAIT, "the wait must report its timeout");
    assert!(waited < std::time::Duration::from_secs(10), "{waited:?}");
    let mut after = vec![0u8; count * 4];
    dst.copy_to_host(&mut after).unwrap();
    assert!(after == sentinel, "dst written without the peer's data");
}

/// Forcing the one-shot where it cannot run (here: one rank) is a clear error at creation;
/// `Auto` runs the ring there instead.
#[test]
fn forcing_the_oneshot_where_it_cannot_run_is_an_error() {
    if common::gpus(1, "a one-rank GPU communicator").is_none() {
        return;
    }
    let gpus = [0];
    let forced = CudaConfig {
        algorithm: Algorithm::OneShot,
        ..CudaConfig::default()
    };
    match Communicator::with_config(&gpus, forced) {
        Err(ringreduce::Error::InvalidArgument(why)) => {
            assert!(why.contains("Algorithm::OneShot needs"), "{why}")
        }
        Err(other) => panic!("wrong error: {other}"),
        Ok(_) => panic!("a one-rank communicator accepted Algorithm::OneShot"),
    }
    let auto = Communicator::with_config(&gpus, CudaConfig::default()).unwrap();
    assert_eq!(auto.algorithm_for(4096, false), Algorithm::Ring);
    check_case::<f32>(&auto, 1000, ReduceOp::Sum, true, 0);
    let ran = auto.last_ran().expect("a call ran");
    assert_eq!(
        (ran.algorithm, ran.form),
        (Algorithm::Ring, Form::CopyEngines)
    );
}

/// Over staged edges (`Transport::Staged`: the GPUs treated as not reaching each other) the
/// one-shot runs its staged form — every rank's source published into pinned host memory, the
/// read kernel folding every rank's host copy, its barrier words in host memory too: every type
/// and op, in and out of place, misaligned sub-slices; `Auto` takes it for small messages and
/// the ring above `STAGED_ONESHOT_AUTO_MAX_BYTES`, on one communicator, calls of both kinds
/// alternating; the two-shot, which reads its peers' GPUs, is refused.
#[test]
fn the_staged_oneshot_runs_where_gpus_do_not_reach_each_other() {
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    let staged = |algorithm| CudaConfig {
        transport: Transport::Staged,
        algorithm,
        allow_shared_device: shared(&gpus),
        ..CudaConfig::default()
    };
    let comm = Communicator::with_config(&gpus, staged(Algorithm::OneShot)).unwrap();
    assert_eq!(comm.algorithm_for(1 << 20, false), Algorithm::OneShot);
    for (count, offset) in [(1, 0), (3, 1), (1009, 0), (100_003, 3)] {
        every_type(&comm, count, offset);
    }
    comm.close().unwrap();
    let auto = Communicator::with_config(&gpus, staged(Algorithm::Auto)).unwrap();
    let limit = ringreduce::exec::algorithm::STAGED_ONESHOT_AUTO_MAX_BYTES * 2 / gpus.len();
    assert_eq!(auto.algorithm_for(limit, true), Algorithm::OneShot);
    assert_eq!(auto.algorithm_for(limit + 4, true), Algorithm::Ring);
    for count in [limit / 4, limit / 4 + 1, 7, (limit / 4) * 3, 1000] {
        check_case::<f32>(&auto, count, ReduceOp::Sum, true, 0);
        // What ran, as the executor says: the staged kernel up to the limit, the ring above.
        let want = match count * 4 <= limit {
            true => (Algorithm::OneShot, Form::StagedKernel),
            false => (Algorithm::Ring, Form::CopyEngines),
        };
        let ran = auto.last_ran().expect("a call ran");
        assert_eq!((ran.algorithm, ran.form), want, "{count}");
        check_case::<f32>(&auto, count, ReduceOp::Avg, false, 1);
    }
    auto.close().unwrap();
    match Communicator::with_config(&gpus, staged(Algorithm::TwoShot)) {
        Err(ringreduce::Error::InvalidArgument(why)) => assert!(why.contains("staged"), "{why}"),
        Err(other) => panic!("wrong error: {other}"),
        Ok(_) => panic!("the two-shot was accepted over staged edges"),
    }
}

/// `Algorithm::Auto` switches between the one-shot, the two-shot (in place, mid sizes) and the
/// ring by size on one communicator — the one-shot and the two-shot share its flags and epochs;
/// enqueue-only calls of all three kinds back to back, then one synchronize, are all correct.
#[test]
fn auto_switches_algorithms_and_enqueues_both() {
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    let comm = default_comm(&gpus);
    let small = 4096;
    let mid = 4 << 20; // 16 MiB of f32
    let large = 64 << 20;
    assert_eq!(comm.algorithm_for(small * 4, false), Algorithm::OneShot);
    assert_eq!(comm.algorithm_for(mid * 4, true), Algorithm::TwoShot);
    assert_eq!(comm.algorithm_for(mid * 4, false), Algorithm::OneShot);
    assert_eq!(comm.algorithm_for(large * 4, false), Algorithm::Ring);
    for count in [small, mid, large / 4, small, mid + 5, large / 4 + 3, mid, 7] {
        check_case::<f32>(&comm, count, ReduceOp::Sum, true, 0);
        // What ran, as the executor says (two ranks): the ring above 32 MiB, the two-shot in
        // place from 8 MiB, the one-shot otherwise.
        let (ring, twoshot) = (count * 4 > 32 << 20, count * 4 >= 8 << 20);
        let want = |in_place| match (ring, in_place && twoshot) {
            (true, _) => Algorithm::Ring,
            (false, true) => Algorithm::TwoShot,
            (false, false) => Algorithm::OneShot,
        };
        let ran = || comm.last_ran().map(|r| r.algorithm);
        assert_eq!(ran(), Some(want(true)), "{count} in place");
        check_case::<i32>(&comm, count, ReduceOp::Max, false, 1);
        assert_eq!(ran(), Some(want(false)), "{count} out of place");
    }
    let world = gpus.len();
    let sizes = [small, mid, large, mid, small, large, mid];
    let mut bufs: Vec<Vec<GpuBuffer<f32>>> = sizes
        .iter()
        .map(|&n| {
            (0..world)
                .map(|r| {
                    GpuBuffer::from_host(gpus[r], &make_input::<f32>(ReduceOp::Sum, r, n)).unwrap()
                })
                .collect()
        })
        .collect();
    for set in bufs.iter_mut() {
        // SAFETY: the buffers stay alive and untouched until `synchronize` below returns.
        unsafe {
            comm.enqueue_all_reduce_in_place(set, ReduceOp::Sum)
                .unwrap()
        };
    }
    comm.synchronize().unwrap();
    for (set, &n) in bufs.iter().zip(&sizes) {
        let want = make_expected::<f32>(ReduceOp::Sum, world, n);
        for (rank, b) in set.iter().enumerate() {
            let (wrong, _) = compare(rank, &b.to_host().unwrap(), &want, 4);
            assert_eq!(wrong, 0, "enqueued call of {n} elements, rank {rank}");
        }
    }
}

#[test]
fn chunk_sizes_and_slots() {
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    for (chunk, slots) in [(16, 1), (4096, 2), (1 << 20, 3), (64 << 20, 4)] {
        for transport in [Transport::Peer, Transport::Staged] {
            let comm = comm(&gpus, transport, Some(chunk), slots);
            // Keep plans under ~16k chunks: each chunk is a handful of CUDA calls and checker work.
            for count in [17, 65_537, 3_000_001]
                .into_iter()
                .filter(|c| c * 4 / chunk <= 16_384)
            {
                check_case::<f32>(&comm, count, ReduceOp::Sum, true, 0);
                check_case::<i32>(&comm, count, ReduceOp::Max, false, 0);
            }
        }
    }
}

/// `Transport::Auto` gives an edge peer copies exactly where its sender reaches its receiver
/// (peer access; a GPU reaches itself, so ranks sharing GPU 0 get them too), and the ring over
/// those edges is exact.
#[test]
fn auto_transport_uses_peer_copies_where_gpus_reach_each_other() {
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    let comm = default_comm(&gpus);
    for edge in comm.edges() {
        println!("edge {}", edge.describe());
        let can = device::can_access_peer(edge.from_device, edge.to_device).unwrap();
        assert_eq!(edge.transport == ringreduce::EdgeTransport::Peer, can);
    }
    check_case::<f32>(&comm, 5 << 20, ReduceOp::Sum, false, 0);
}

/// Every edge between two GPUs is probed at creation (a timed copy over its link, NVLink on the
/// H200s), measures above zero, and is not flagged slow on a healthy machine.
#[test]
fn edges_between_two_gpus_are_probed_and_none_is_flagged() {
    let Some(gpus) = common::two_gpus("the edge probe's timed copy over a link between two GPUs")
    else {
        return;
    };
    let comm = default_comm(&gpus);
    for edge in comm.edges() {
        println!("edge {}", edge.describe());
        assert_ne!(edge.from_device, edge.to_device);
        let probe = edge.probe.as_ref().expect("edges between GPUs are probed");
        assert!(probe.measured_gb_per_s > 0.0, "{}", edge.describe());
        assert_eq!(
            edge.slow(),
            None,
            "a healthy edge flagged: {}",
            edge.describe()
        );
    }
}

/// The silent fallback, caught: with peer access disabled a peer copy still succeeds, through host
/// memory; the probe must flag it, and must not flag the same edge with peer access on.
#[test]
fn the_edge_probe_flags_a_peer_copy_without_peer_access() {
    let property = "peer access turned off and on between two GPUs, and the edge probe's verdict";
    let Some(gpus) = common::two_gpus(property) else {
        return;
    };
    if !device::can_access_peer(gpus[0], gpus[1]).unwrap() {
        common::waiver::waive(&format!(
            "needs 2 GPUs with peer access (GPUs 0 and 1 have none): {property}"
        ));
        return;
    }
    let (a, b) = (
        device::context(gpus[0]).unwrap(),
        device::context(gpus[1]).unwrap(),
    );
    let stream = device::Stream::new(&a).unwrap();
    let link = ringreduce::topo::detect()
        .ok()
        .and_then(|d| d.links[gpus[0]][gpus[1]]);
    device::enable_peer_access(&a, &b).unwrap();
    device::enable_peer_access(&b, &a).unwrap();
    let on = probe::peer_edge(&a, &b, &stream, link).unwrap();
    // One direction off: the driver may still move the copy over the link through the other
    // direction's mapping (seen once another test had left b → a enabled), so this is printed,
    // not judged; "off" below means both directions.
    device::disable_peer_access(&a, &b).unwrap();
    let one_way = probe::peer_edge(&a, &b, &stream, link);
    device::disable_peer_access(&b, &a).unwrap();
    let off = probe::peer_edge(&a, &b, &stream, link);
    device::enable_peer_access(&a, &b).unwrap();
    device::enable_peer_access(&b, &a).unwrap();
    let off = off.unwrap();
    println!(
        "link {link:?}: peer access on {on:?}; a → b off, b → a on {one_way:?}; both off {off:?}"
    );
    assert_eq!(on.slow, None, "peer access on, flagged: {on:?}");
    assert!(off.slow.is_some(), "peer access off, not flagged: {off:?}");
    assert!(off.measured_gb_per_s < on.measured_gb_per_s);
}

#[test]
fn large_messages_up_to_1_gib() {
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    let comm = default_comm(&gpus);
    for count in [(64 << 20) / 4 + 5, (1 << 30) / 4] {
        check_case::<f32>(&comm, count, ReduceOp::Sum, true, 0);
    }
    let staged = self::comm(&gpus, Transport::Staged, None, 3);
    check_case::<f32>(&staged, (256 << 20) / 4, ReduceOp::Sum, false, 0);
}

#[test]
fn enqueue_then_synchronize() {
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    let comm = default_comm(&gpus);
    let count = 1 << 20;
    let mut bufs: Vec<GpuBuffer<f32>> = gpus
        .iter()
        .enumerate()
        .map(|(r, &d)| GpuBuffer::from_host(d, &make_input(ReduceOp::Sum, r, count)).unwrap())
        .collect();
    for _ in 0..3 {
        // SAFETY: the buffers live until after `synchronize` and nothing else touches them.
        unsafe {
            comm.enqueue_all_reduce_in_place(&mut bufs, ReduceOp::Sum)
                .unwrap()
        };
    }
    comm.synchronize().unwrap();
    // Three sums in a row: x → 2·Σ... each call sums the previous results, so the result is
    // world^(calls-1) · Σ inputs = 4 · Σ inputs for two ranks and three calls.
    let once = make_expected::<f32>(ReduceOp::Sum, 2, count);
    for (r, b) in bufs.iter().enumerate() {
        let got = b.to_host().unwrap();
        let want: Vec<f32> = once.iter().map(|x| x * 4.0).collect();
        let (wrong, first) = compare(r, &got, &want, 4);
        assert_eq!(wrong, 0, "{first:?}");
    }
}

/// In-place one-shot all-reduces whose size changes on every call — enqueued back to back with
/// no synchronisation between them, more sizes than the plan cache holds, growing the exposure
/// regions several times (1 MiB at first, doubling up to 32 MiB), at odd offsets — give the host's bits call after call. Plans of different
/// sizes share each rank's exposure region (`exec::cuda::executor::exposure`): a call that
/// overwrote a region a peer was still reading would leave wrong elements. `u32` sums wrap, so
/// every result is exact however often an element is summed.
#[test]
fn in_place_oneshot_sizes_change_on_every_call() {
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    let gpu = oneshot_comm(&gpus);
    let world = gpus.len();
    let host = Communicator::host(world).unwrap();
    // 16 MiB and a little per rank.
    let len = (4 << 20) + 8;
    let mut want: Vec<Vec<u32>> = (0..world)
        .map(|r| make_input(ReduceOp::Sum, r, len))
        .collect();
    let mut bufs: Vec<GpuBuffer<u32>> = gpus
        .iter()
        .zip(&want)
        .map(|(&g, x)| GpuBuffer::from_host(g, x).unwrap())
        .collect();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut sizes = std::collections::BTreeSet::new();
    for _ in 0..150 {
        // Counts of every bit length up to 23 (1 to 8 Mi elements), clipped to the buffer.
        let offset = (next() % 4) as usize;
        let count = (1 + next() % (1 << (next() % 23))) as usize;
        let count = count.min(len - offset);
        sizes.insert(count);
        let mut slices: Vec<_> = bufs
            .iter_mut()
            .map(|b| b.view_mut(offset, count).unwrap())
            .collect();
        // SAFETY: the buffers are read back only after the synchronize below.
        unsafe { gpu.enqueue_all_reduce_in_place(&mut slices, ReduceOp::Sum) }.unwrap();
        let mut reference: Vec<&mut [u32]> = want
            .iter_mut()
            .map(|w| &mut w[offset..offset + count])
            .collect();
        host.all_reduce_in_place(&mut reference, ReduceOp::Sum)
            .unwrap();
    }
    gpu.synchronize().unwrap();
    assert!(sizes.len() > 100, "{} distinct sizes", sizes.len());
    for (rank, b) in bufs.iter().enumerate() {
        let (wrong, first) = compare(rank, &b.to_host().unwrap(), &want[rank], 4);
        assert_eq!(wrong, 0, "{first:?}");
    }
    gpu.close().unwrap();
}

/// `profile_host`: every call's phases on the calling thread, in order, adding up to no more
/// than the call's wall time — a blocking one-shot, an enqueued one, `synchronize`, and a
/// blocking ring call (one launch mark for all ranks, then the error words' check).
#[test]
fn host_profile_names_every_phase_of_a_call() {
    use ringreduce::exec::profile::HostPhase::{self, *};
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    let phases_of = |comm: &Communicator| -> Vec<Vec<HostPhase>> {
        comm.host_profile()
            .iter()
            .map(|p| p.phases.iter().map(|(ph, _)| *ph).collect())
            .collect()
    };
    for (algorithm, blocking) in [
        (
            Algorithm::OneShot,
            vec![
                Validate, Lock, Plan, Open, Launch, Launch, Wait, Check, Return,
            ],
        ),
        (
            // The ring's blocking call reads the error words too (its counter waits leave codes
            // there).
            Algorithm::Ring,
            vec![Validate, Lock, Plan, Open, Launch, Wait, Check, Return],
        ),
    ] {
        let comm = Communicator::with_config(
            &gpus,
            CudaConfig {
                allow_shared_device: shared(&gpus),
                algorithm,
                profile_host: true,
                ..CudaConfig::default()
            },
        )
        .unwrap();
        let mut bufs: Vec<GpuBuffer<f32>> = gpus
            .iter()
            .map(|&g| GpuBuffer::zeroed(g, 1000).unwrap())
            .collect();
        comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum).unwrap(); // plans the shape
        comm.host_profile();
        let t = std::time::Instant::now();
        comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum).unwrap();
        let wall = t.elapsed();
        let profile = comm.host_profile();
        assert_eq!(profile.len(), 1, "{profile:?}");
        assert!(profile[0].total() <= wall, "{profile:?} in {wall:?}");
        let got: Vec<HostPhase> = profile[0].phases.iter().map(|(p, _)| *p).collect();
        assert_eq!(got, blocking, "{algorithm:?} blocking");
        if algorithm == Algorithm::OneShot {
            // SAFETY: the buffers live past the synchronize below.
            unsafe { comm.enqueue_all_reduce_in_place(&mut bufs, ReduceOp::Sum) }.unwrap();
            comm.synchronize().unwrap();
            assert_eq!(
                phases_of(&comm),
                [
                    vec![Validate, Lock, Plan, Open, Launch, Launch, Return],
                    vec![Lock, Wait, Check, Return]
                ]
            );
        }
        comm.close().unwrap();
    }
}

/// `ring_allreduce` sums buffers on distinct GPUs, one rank per buffer's GPU, and refuses a GPU
/// that two buffers share (it has no shared mode) by name.
#[test]
fn ring_allreduce_on_gpu_buffers() {
    if common::gpus(1, "ring_allreduce on GPU buffers").is_none() {
        return;
    }
    let mut same: Vec<GpuBuffer<i64>> = (0..2).map(|_| GpuBuffer::zeroed(0, 8).unwrap()).collect();
    assert!(matches!(
        ringreduce::ring_allreduce(&mut same),
        Err(ringreduce::Error::DuplicateDevice { .. })
    ));
    let Some(gpus) = common::two_gpus(
        "ring_allreduce's sum across GPUs: it takes one rank per buffer's GPU and refuses a \
         repeated one, so its ranks cannot share GPU 0",
    ) else {
        return;
    };
    let mut bufs: Vec<GpuBuffer<i64>> = gpus
        .iter()
        .enumerate()
        .map(|(r, &d)| GpuBuffer::from_host(d, &make_input(ReduceOp::Sum, r, 4099)).unwrap())
        .collect();
    ringreduce::ring_allreduce(&mut bufs).unwrap();
    let want = make_expected::<i64>(ReduceOp::Sum, 2, 4099);
    for b in &bufs {
        assert!(b.to_host().unwrap() == want);
    }
}

/// Bad input is refused before anything runs, and does not poison the communicator: a GPU
/// listed twice without the shared mode, lengths that differ between ranks, host buffers.
#[test]
fn bad_input_on_gpus() {
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    assert!(matches!(
        Communicator::new(&[gpus[0], gpus[0]]),
        Err(ringreduce::Error::DuplicateDevice { .. })
    ));
    let comm = default_comm(&gpus);
    let mut short = vec![
        GpuBuffer::<f32>::zeroed(gpus[0], 8).unwrap(),
        GpuBuffer::zeroed(gpus[1], 7).unwrap(),
    ];
    assert!(matches!(
        comm.all_reduce_in_place(&mut short, ReduceOp::Sum),
        Err(ringreduce::Error::LengthMismatch { rank: 1, .. })
    ));
    let mut host = vec![vec![0f32; 8], vec![0f32; 8]];
    assert!(matches!(
        comm.all_reduce_in_place(&mut host, ReduceOp::Sum),
        Err(ringreduce::Error::WrongPlacement { .. })
    ));
    // Validation failures do not poison the communicator.
    comm.health().unwrap();
}

/// A buffer on another rank's GPU (here: two ranks' buffers swapped) is refused by name, and
/// does not poison the communicator.
#[test]
fn buffers_on_the_wrong_gpu_are_refused() {
    let Some(gpus) = common::two_gpus(
        "a buffer on another rank's GPU (with ranks sharing GPU 0, every buffer is on its own \
         rank's GPU)",
    ) else {
        return;
    };
    let comm = Communicator::new(&gpus).unwrap();
    let mut swapped = vec![
        GpuBuffer::<f32>::zeroed(gpus[1], 8).unwrap(),
        GpuBuffer::zeroed(gpus[0], 8).unwrap(),
    ];
    assert!(matches!(
        comm.all_reduce_in_place(&mut swapped, ReduceOp::Sum),
        Err(ringreduce::Error::WrongDevice { rank: 0, .. })
    ));
    comm.health().unwrap();
}

/// Issue 6 on GPUs: a randomized soak — sizes, types, ops, in and out of place, both transports —
/// every result checked exactly. Deterministic (seeded), bounded in count.
#[test]
fn soak_random_collectives() {
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    let comms = [
        comm(&gpus, Transport::Auto, None, 3),
        comm(&gpus, Transport::Staged, None, 2),
        comm(&gpus, Transport::Peer, Some(4096), 1),
        default_comm(&gpus),
    ]
    .into_iter()
    .chain(std::iter::once(oneshot_comm(&gpus)))
    .collect::<Vec<_>>();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let calls = 600;
    for i in 0..calls {
        let comm = &comms[(next() % comms.len() as u64) as usize];
        let count = match next() % 4 {
            0 => (next() % 16) as usize,
            1 => (next() % 5000) as usize,
            2 => (next() % 300_000) as usize,
            _ => (next() % 4_000_000) as usize,
        };
        let op = ReduceOp::ALL[(next() % 5) as usize];
        let in_place = next() % 2 == 0;
        let offset = (next() % 3) as usize;
        match next() % 5 {
            0 => check_case::<f32>(comm, count, op, in_place, offset),
            1 => check_case::<bf16>(comm, count, op, in_place, offset),
            2 => check_case::<i32>(comm, count, op, in_place, offset),
            3 => check_case::<u8>(comm, count, op, in_place, offset),
            _ => check_case::<f64>(comm, count, op, in_place, offset),
        }
        if i % 100 == 99 {
            println!("soak: {} collectives checked", i + 1);
        }
    }
}

/// Issue 6 on GPUs: creating and dropping a communicator (with a collective each time) many
/// times leaves the GPUs' free memory where it started.
#[test]
fn communicators_leak_no_gpu_memory() {
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    let free = || -> Vec<usize> {
        gpus.iter()
            .map(|&d| device::memory_info(&device::context(d).unwrap()).unwrap().0)
            .collect()
    };
    let round = || {
        let comm = default_comm(&gpus);
        check_case::<f32>(&comm, 3 << 20, ReduceOp::Sum, false, 0);
        comm.close().unwrap();
    };
    // Warm-up: the first rounds load kernels and grow the driver's own pools.
    for _ in 0..5 {
        round();
    }
    let before = free();
    for _ in 0..100 {
        round();
    }
    let after = free();
    println!("free GPU memory before {before:?}, after {after:?} (bytes)");
    for (b, a) in before.iter().zip(&after) {
        // One round allocates ~36 MiB of buffers and staging per GPU: a leak of even one round
        // shows; a few MiB of driver bookkeeping does not count.
        assert!(
            a + (8 << 20) >= *b,
            "free memory fell from {b} to {a} bytes"
        );
    }
}

/// A closed gate on a stream: `cuStreamWaitValue32` holds everything queued after it on the
/// stream until a pinned host word becomes non-zero — a GPU stuck before a collective, at will.
/// A watchdog thread opens it by itself after [`Gate::DEADLINE`], and dropping it opens it: a
/// wait the test did not foresee on the gated GPU (a device-wide one, which a rank sharing that
/// GPU would meet too) fails the test instead of hanging it, and a test that fails while the
/// gate is closed leaves no stream stuck for the tests after it.
struct Gate {
    word: Arc<(Mutex<GateWord>, Condvar)>,
    watchdog: Option<std::thread::JoinHandle<()>>,
}

/// The word a [`Gate`]'s stream waits on, and who opened it.
struct GateWord {
    word: device::PinnedHost,
    open: bool,
    by_deadline: bool,
}

impl GateWord {
    fn open(&mut self) {
        if !self.open {
            // SAFETY: the word is 4 bytes of live pinned memory owned by self; volatile, since
            // the GPU polls it.
            unsafe { std::ptr::write_volatile(self.word.as_mut_ptr().cast::<u32>(), 1) };
            self.open = true;
        }
    }
}

impl Gate {
    /// Far beyond any stall test's timeouts (a few seconds).
    const DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

    /// Closes a gate in front of whatever is queued next on `stream`, a stream of GPU `gpu`.
    fn close(gpu: usize, stream: cudarc::driver::sys::CUstream) -> Gate {
        let ctx = device::context(gpu).unwrap();
        let mut word = device::PinnedHost::new(&ctx, 4).unwrap();
        word.as_mut_slice().fill(0);
        ctx.bind_to_thread().unwrap();
        // SAFETY: `stream` is a live stream of GPU `gpu`'s primary context (now current), and
        // the word is pinned, device-mapped memory that outlives the wait: the gate is opened
        // (by `open`, the watchdog or `Drop`) before the word is dropped.
        let status = unsafe {
            cudarc::driver::sys::cuStreamWaitValue32_v2(
                stream,
                word.uva_ptr(),
                1,
                cudarc::driver::sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
            )
        };
        assert_eq!(status, cudarc::driver::sys::CUresult::CUDA_SUCCESS);
        let word = Arc::new((
            Mutex::new(GateWord {
                word,
                open: false,
                by_deadline: false,
            }),
            Condvar::new(),
        ));
        let watched = word.clone();
        let watchdog = std::thread::spawn(move || {
            let (lock, opened) = &*watched;
            let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
            let (mut gate, waited) = opened
                .wait_timeout_while(guard, Self::DEADLINE, |g| !g.open)
                .unwrap_or_else(|p| p.into_inner());
            if waited.timed_out() {
                eprintln!(
                    "the gate opened itself after {:?}: the test waited on the gated GPU",
                    Self::DEADLINE
                );
                gate.by_deadline = true;
                gate.open();
            }
        });
        Gate {
            word,
            watchdog: Some(watchdog),
        }
    }

    /// Opens the gate; fails the test if the watchdog had to open it first.
    fn open(&mut self) {
        let (lock, opened) = &*self.word;
        let mut gate = lock.lock().unwrap_or_else(|p| p.into_inner());
        assert!(
            !gate.by_deadline,
            "the gate had opened itself after {:?}: something waited on the gated GPU",
            Self::DEADLINE
        );
        gate.open();
        opened.notify_all();
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        let (lock, opened) = &*self.word;
        lock.lock().unwrap_or_else(|p| p.into_inner()).open();
        opened.notify_all();
        if let Some(watchdog) = self.watchdog.take() {
            let _ = watchdog.join();
        }
    }
}

/// Out-of-place f32 buffers for a stall test: inputs that depend on rank and index, outputs
/// filled with a sentinel that no sum of the inputs produces.
fn stall_buffers(gpus: &[usize], count: usize) -> (Vec<GpuBuffer<f32>>, Vec<GpuBuffer<f32>>) {
    let inputs = gpus
        .iter()
        .enumerate()
        .map(|(r, &d)| GpuBuffer::from_host(d, &make_input(ReduceOp::Sum, r, count)).unwrap())
        .collect();
    let outputs = gpus
        .iter()
        .map(|&d| GpuBuffer::from_host(d, &vec![-12345.0f32; count]).unwrap())
        .collect();
    (inputs, outputs)
}

/// A communicator of `algorithm` (and `low_latency`) with a 2 s timeout, and stall buffers that
/// one good call has already used: the plan and kernels exist, so a failed call after is only
/// the stall.
fn stall_setup(
    gpus: &[usize],
    algorithm: Algorithm,
    low_latency: bool,
    count: usize,
) -> (
    Communicator,
    Vec<GpuBuffer<f32>>,
    Vec<GpuBuffer<f32>>,
    std::time::Duration,
) {
    let timeout = std::time::Duration::from_secs(2);
    let config = CudaConfig {
        allow_shared_device: shared(gpus),
        algorithm,
        low_latency,
        timeout,
        ..CudaConfig::default()
    };
    let comm = Communicator::with_config(gpus, config).unwrap();
    let (mut inputs, mut outputs) = stall_buffers(gpus, count);
    all_reduce_f32(&comm, &mut inputs, &mut outputs).unwrap();
    (comm, inputs, outputs, timeout)
}

fn all_reduce_f32(
    comm: &Communicator,
    inputs: &mut [GpuBuffer<f32>],
    outputs: &mut [GpuBuffer<f32>],
) -> ringreduce::Result<()> {
    let count = inputs[0].len();
    let ins: Vec<_> = inputs
        .iter_mut()
        .map(|b| b.view_mut(0, count).unwrap())
        .collect();
    let mut outs: Vec<_> = outputs
        .iter_mut()
        .map(|b| b.view_mut(0, count).unwrap())
        .collect();
    comm.all_reduce(&ins, &mut outs, ReduceOp::Sum)
}

/// Issue 6 on GPUs, the one-shot: GPU 1 is stuck (its Main stream gated) when a call begins.
/// The call fails by its deadline naming rank 1, the communicator is failed at once after, and
/// when the gate opens — rank 1's kernel starting more than the timeout late — that kernel finds
/// rank 0's start signal withdrawn (the LL one-shot: rank 0's pushed words) and gives up
/// without reading anything: rank 1's output keeps its sentinel, and `synchronize` reports the
/// timeout within the timeout. A new communicator on the same GPUs then works. Both kernels:
/// 256 KiB per rank (the read one-shot) and 16 KiB with `low_latency` (the LL one-shot). On a
/// one-GPU machine rank 1 shares GPU 0 and its Main stream is the stuck one: the call waits on
/// streams, never on a whole GPU, so rank 0 meets a late peer as it would beside a stuck GPU
/// (and the gate's watchdog fails the test should anything wait on GPU 0 as a whole).
#[test]
fn a_stuck_gpu_fails_the_oneshot_and_its_late_kernel_reads_nothing() {
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    stuck_oneshot(&gpus, 1 << 16, false);
    stuck_oneshot(&gpus, 1 << 12, true);
}

/// One communicator of [`a_stuck_gpu_fails_the_oneshot_and_its_late_kernel_reads_nothing`].
fn stuck_oneshot(gpus: &[usize], count: usize, low_latency: bool) {
    use std::time::{Duration, Instant};
    let (comm, mut inputs, _, timeout) = stall_setup(gpus, Algorithm::OneShot, low_latency, count);
    let mut outputs = stall_buffers(gpus, count).1;

    let mut gate = Gate::close(gpus[1], comm.main_stream(1).unwrap());
    let start = Instant::now();
    let err = all_reduce_f32(&comm, &mut inputs, &mut outputs).unwrap_err();
    let took = start.elapsed();
    println!(
        "stuck GPU 1, one-shot of {count} (low_latency {low_latency}): {err} (after {took:?})"
    );
    assert!(
        matches!(err, ringreduce::Error::Timeout { rank: 1, .. }),
        "the stuck rank must be named: {err}"
    );
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(1),
        "{took:?}"
    );
    let again = Instant::now();
    assert!(all_reduce_f32(&comm, &mut inputs, &mut outputs).is_err());
    assert!(
        again.elapsed() < Duration::from_millis(100),
        "a failed communicator answers at once"
    );
    assert!(comm.health().is_err());

    gate.open();
    let start = Instant::now();
    let late = comm.synchronize();
    let took = start.elapsed();
    println!("after the gate opened: synchronize → {late:?} (after {took:?})");
    assert!(
        matches!(late, Err(ringreduce::Error::Timeout { .. })),
        "{late:?}"
    );
    assert!(took < timeout + Duration::from_millis(500), "{took:?}");
    let sentinel = vec![-12345.0f32; count];
    assert!(
        outputs[1].to_host().unwrap() == sentinel,
        "rank 1's late kernel wrote its output: it passed a start barrier its peer had left"
    );
    for (r, input) in inputs.iter().enumerate() {
        assert!(input.to_host().unwrap() == make_input::<f32>(ReduceOp::Sum, r, count));
    }
    assert!(comm.close().is_err());
    let fresh = if low_latency {
        ll_comm(gpus)
    } else {
        oneshot_comm(gpus)
    };
    check_case::<f32>(&fresh, count, ReduceOp::Sum, false, 0);
}

/// Issue 6 on GPUs, the ring: GPU 1 is stuck (its Main stream gated) and stays stuck. The call
/// fails by its deadline naming rank 1 as the rank that never started; `abort` returns within
/// the timeout instead of hanging on the stuck GPU (its streams and memory are leaked, not freed
/// under queued work). Then the gate opens: the leaked work runs to its end without a CUDA
/// error, into buffers that are still alive (what it leaves there is undefined: rank 0's waits
/// for rank 1 gave up at three quarters of the timeout, and rank 0 ran on without rank 1's
/// data), and new communicators on the same GPUs work. On a one-GPU machine rank
/// 1 shares GPU 0 and its Main stream is the stuck one: the failed call and `abort` poll
/// streams and free nothing a busy stream may use, so neither waits on GPU 0 as a whole (the
/// gate's watchdog fails the test should one do so).
#[test]
fn abort_does_not_hang_on_a_stuck_gpu() {
    use std::time::{Duration, Instant};
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    let count = 1 << 20;
    let (comm, mut inputs, mut outputs, timeout) =
        stall_setup(&gpus, Algorithm::Ring, false, count);

    let mut gate = Gate::close(gpus[1], comm.main_stream(1).unwrap());
    let start = Instant::now();
    let err = all_reduce_f32(&comm, &mut inputs, &mut outputs).unwrap_err();
    let took = start.elapsed();
    println!("stuck GPU 1, ring: {err} (after {took:?})");
    match &err {
        ringreduce::Error::Timeout {
            rank: 1,
            waiting_on,
            ..
        } => assert!(waiting_on.contains("never started"), "{waiting_on}"),
        other => panic!("the stuck rank must be named: {other}"),
    }
    assert!(took < timeout + Duration::from_secs(1), "{took:?}");
    assert!(comm.health().is_err());
    let start = Instant::now();
    comm.abort();
    let took = start.elapsed();
    println!("abort with GPU 1 still stuck: returned after {took:?}");
    assert!(
        took < timeout + Duration::from_secs(1),
        "abort hung: {took:?}"
    );
    assert!(comm.health().is_err());

    // The leaked work reads the inputs and writes the outputs once it runs: keep the buffers
    // until it has finished (a device-wide synchronize waits for the leaked streams too; so do
    // GpuBuffer's copies, which is why the new communicator below comes after the gate opens).
    gate.open();
    for &d in &gpus {
        device::context(d).unwrap().synchronize().unwrap();
    }
    for out in &outputs {
        out.to_host().unwrap();
    }
    for algorithm in [Algorithm::Ring, Algorithm::OneShot] {
        let fresh = Communicator::with_config(
            &gpus,
            CudaConfig {
                allow_shared_device: shared(&gpus),
                algorithm,
                ..CudaConfig::default()
            },
        )
        .unwrap();
        check_case::<f32>(&fresh, count, ReduceOp::Sum, false, 0);
        fresh.close().unwrap();
    }
}

/// `launch_threads`: every peer algorithm launched on every GPU at once from the launcher
/// threads gives the host reference's bits (blocking calls, and enqueued calls back to back with
/// one synchronize), and the launchers are gone after `close`.
#[test]
fn launcher_threads_give_the_same_results() {
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    for algorithm in [Algorithm::OneShot, Algorithm::TwoShot, Algorithm::Auto] {
        let comm = Communicator::with_config(
            &gpus,
            CudaConfig {
                allow_shared_device: shared(&gpus),
                algorithm,
                launch_threads: true,
                ..CudaConfig::default()
            },
        )
        .unwrap();
        for (count, offset) in [(1, 0), (1000, 1), (65_536, 0), (1 << 20, 3)] {
            for in_place in [false, true] {
                check_case::<f32>(&comm, count, ReduceOp::Sum, in_place, offset);
                check_case::<half::bf16>(&comm, count, ReduceOp::Max, in_place, offset);
            }
        }
        // 200 enqueued calls back to back, each into its own outputs (each launcher takes one
        // job at a time), then one synchronize.
        let count = 4099;
        let world = gpus.len();
        let inputs: Vec<GpuBuffer<i32>> = (0..world)
            .map(|r| GpuBuffer::from_host(gpus[r], &make_input::<i32>(ReduceOp::Sum, r, count)))
            .collect::<Result<_, _>>()
            .unwrap();
        let mut outputs: Vec<Vec<GpuBuffer<i32>>> = (0..200)
            .map(|_| {
                gpus.iter()
                    .map(|&g| GpuBuffer::zeroed(g, count).unwrap())
                    .collect()
            })
            .collect();
        for outs in &mut outputs {
            // SAFETY: the buffers are only read back after the synchronize below.
            unsafe { comm.enqueue_all_reduce(&inputs, outs, ReduceOp::Sum) }.unwrap();
        }
        comm.synchronize().unwrap();
        let want = make_expected::<i32>(ReduceOp::Sum, world, count);
        for (call, outs) in outputs.iter().enumerate() {
            for (rank, b) in outs.iter().enumerate() {
                let (wrong, first) = compare(rank, &b.to_host().unwrap(), &want, 3);
                assert_eq!(wrong, 0, "{algorithm:?} call {call}: {first:?}");
            }
        }
        comm.close().unwrap();
    }
}

/// fp8 in the peer kernels (the read one-shot, the LL one-shot, the two-shot) accumulates in f32
/// and rounds once: with three ranks holding 16, 1 and 1 in e4m3 every rank gets 18, where a
/// fold rounding after each step would stay at 16 (17 is a tie, which goes to the even 16). The
/// host executor's meetings are held to the same in tests/host.rs.
#[test]
fn fp8_peer_kernels_accumulate_in_f32() {
    use ringreduce::F8E4M3;
    let Some(gpus) = common::three_ranks_on_one_gpu() else {
        return;
    };
    for (algorithm, low_latency) in [
        (Algorithm::OneShot, false),
        (Algorithm::OneShot, true),
        (Algorithm::TwoShot, false),
    ] {
        let config = CudaConfig {
            allow_shared_device: true,
            algorithm,
            low_latency,
            timeout: std::time::Duration::from_secs(20),
            ..CudaConfig::default()
        };
        let comm = Communicator::with_config(&gpus, config).unwrap();
        let mut bufs: Vec<GpuBuffer<F8E4M3>> = [16.0, 1.0, 1.0]
            .iter()
            .zip(gpus)
            .map(|(&v, d)| GpuBuffer::from_host(d, &vec![F8E4M3::from_f32(v); 4099]).unwrap())
            .collect();
        comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum).unwrap();
        for buf in &bufs {
            let got = buf.to_host().unwrap();
            assert!(
                got.iter().all(|x| x.to_f32() == 18.0),
                "{algorithm:?} low_latency {low_latency}: {:?}",
                &got[..4]
            );
        }
    }
}
