//! The other collectives on GPUs: refused bad calls, and every collective against the host
//! reference (reduce-scatter, all-gather, broadcast, reduce, all-to-all, send/recv), blocking and
//! on the caller's streams; at two ranks (sharing GPU 0 on a one-GPU machine) and three ranks
//! sharing GPU 0. A machine without a GPU waives them.

use common::{three_ranks_on_one_gpu, two_gpus_or_shared};
use ringreduce::device;
use ringreduce::verify::{compare, expected_value, input_value};
use ringreduce::{Algorithm, Communicator, CudaConfig, Error, GpuBuffer, ReduceOp, Transport};

mod common;

fn gpu(device: usize, data: &[f32]) -> GpuBuffer<f32> {
    GpuBuffer::from_host(device, data).expect("a GPU buffer")
}

fn input(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| input_value(ReduceOp::Sum, rank, i))
        .collect()
}

/// Bad calls are refused on GPUs as on host ranks, before anything is enqueued, and leave the
/// communicator usable.
#[test]
fn bad_collective_calls_are_refused_on_gpus() {
    let Some(devices) = two_gpus_or_shared() else {
        return;
    };
    let comm = communicator(&devices, Algorithm::Auto, Transport::Auto);
    let count = 1000;
    let inputs: Vec<_> = devices.iter().map(|&d| gpu(d, &input(d, count))).collect();
    let mut outs: Vec<_> = devices
        .iter()
        .map(|&d| gpu(d, &vec![0.0; 2 * count]))
        .collect();
    assert!(matches!(
        comm.broadcast(&inputs[0], &mut outs, 0),
        Err(Error::BufferLength { .. })
    ));
    assert!(matches!(
        comm.broadcast(&inputs[0], &mut outs, 5),
        Err(Error::RootOutOfRange { .. }) | Err(Error::BufferLength { .. })
    ));
    let mut bufs: Vec<_> = devices.iter().map(|&d| gpu(d, &input(d, count))).collect();
    comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum).unwrap();
    comm.health().unwrap();
    comm.close().unwrap();
}

/// Every collective at two ranks (both placements where NCCL has them), in every form — the
/// ring's over peer copies and staged through pinned host memory, and the one-shot's (SM
/// kernels reading peer memory; send/recv has only the ring's) — against the host reference, at
/// counts 0, 1, a prime and 1 Mi + 7.
#[test]
fn every_collective_on_gpus_matches_the_host_reference() {
    let Some(devices) = two_gpus_or_shared() else {
        return;
    };
    every_collective(&devices);
}

/// The same with three ranks sharing one GPU (the test-only shared mode: every copy is local,
/// but the plans, streams, events and kernels are the GPU executor's, at a world of 3).
#[test]
fn every_collective_with_three_ranks_on_one_gpu() {
    let Some(devices) = three_ranks_on_one_gpu() else {
        return;
    };
    every_collective(&devices);
}

/// Every collective on `devices` against the host reference, in every form ([`FORMS`]); the
/// send/recv exchange is between ranks 0 and 1.
fn every_collective(devices: &[usize]) {
    for (algorithm, transport) in FORMS {
        every_collective_in(devices, algorithm, transport);
    }
}

/// Every form a collective runs in: the ring's over peer copies and staged through pinned host
/// memory, and the one-shot's.
const FORMS: [(Algorithm, Transport); 3] = [
    (Algorithm::Ring, Transport::Peer),
    (Algorithm::Ring, Transport::Staged),
    (Algorithm::OneShot, Transport::Auto),
];

fn every_collective_in(devices: &[usize], algorithm: Algorithm, transport: Transport) {
    let n = devices.len();
    let comm = communicator(devices, algorithm, transport);
    for count in [0, 1, 1009, (1 << 20) + 7] {
        // Reduce-scatter, out of place.
        let inputs: Vec<_> = (0..n)
            .map(|r| gpu(devices[r], &input(r, n * count)))
            .collect();
        let mut outs: Vec<_> = (0..n)
            .map(|r| gpu(devices[r], &vec![77.0; count]))
            .collect();
        comm.reduce_scatter(&inputs, &mut outs, ReduceOp::Sum)
            .unwrap();
        for (r, out) in outs.iter().enumerate() {
            let want: Vec<f32> = (0..count)
                .map(|k| expected_value(ReduceOp::Sum, n, r * count + k))
                .collect();
            let (wrong, first) = compare(r, &out.to_host().unwrap(), &want, 4);
            assert_eq!(
                wrong, 0,
                "reduce-scatter count {count} {algorithm:?} {transport:?}: {first:?}"
            );
        }
        // All-gather, in place.
        let mut bufs: Vec<_> = (0..n)
            .map(|r| {
                let mut host = vec![77.0; n * count];
                host[r * count..(r + 1) * count].copy_from_slice(&input(r, count));
                gpu(devices[r], &host)
            })
            .collect();
        comm.all_gather_in_place(&mut bufs).unwrap();
        let want: Vec<f32> = (0..n).flat_map(|j| input(j, count)).collect();
        for (r, b) in bufs.iter().enumerate() {
            let (wrong, first) = compare(r, &b.to_host().unwrap(), &want, 4);
            assert_eq!(
                wrong, 0,
                "all-gather count {count} {algorithm:?} {transport:?}: {first:?}"
            );
        }
        // Broadcast from the last rank, reduce (avg) into rank 0, all-to-all.
        let mut outs: Vec<_> = (0..n)
            .map(|r| gpu(devices[r], &vec![77.0; count]))
            .collect();
        comm.broadcast(&gpu(devices[n - 1], &input(n - 1, count)), &mut outs, n - 1)
            .unwrap();
        for (r, b) in outs.iter().enumerate() {
            let (wrong, first) = compare(r, &b.to_host().unwrap(), &input(n - 1, count), 4);
            assert_eq!(
                wrong, 0,
                "broadcast count {count} {algorithm:?} {transport:?}: {first:?}"
            );
        }
        let inputs: Vec<_> = (0..n).map(|r| gpu(devices[r], &input(r, count))).collect();
        let mut out = gpu(devices[0], &vec![77.0; count]);
        comm.reduce(&inputs, &mut out, 0, ReduceOp::Avg).unwrap();
        let want: Vec<f32> = (0..count)
            .map(|k| expected_value(ReduceOp::Avg, n, k))
            .collect();
        let (wrong, first) = compare(0, &out.to_host().unwrap(), &want, 4);
        assert_eq!(
            wrong, 0,
            "reduce count {count} {algorithm:?} {transport:?}: {first:?}"
        );
        let inputs: Vec<_> = (0..n)
            .map(|r| gpu(devices[r], &input(r, n * count)))
            .collect();
        let mut outs: Vec<_> = (0..n)
            .map(|r| gpu(devices[r], &vec![77.0; n * count]))
            .collect();
        comm.all_to_all(&inputs, &mut outs).unwrap();
        for (r, b) in outs.iter().enumerate() {
            let want: Vec<f32> = (0..n)
                .flat_map(|j| (0..count).map(move |k| input_value(ReduceOp::Sum, j, r * count + k)))
                .collect();
            let (wrong, first) = compare(r, &b.to_host().unwrap(), &want, 4);
            assert_eq!(
                wrong, 0,
                "all-to-all count {count} {algorithm:?} {transport:?}: {first:?}"
            );
        }
        // Reduce-scatter in place: the result is block r of each rank's buffer.
        let mut bufs: Vec<_> = (0..n)
            .map(|r| gpu(devices[r], &input(r, n * count)))
            .collect();
        comm.reduce_scatter_in_place(&mut bufs, ReduceOp::Sum)
            .unwrap();
        for (r, b) in bufs.iter().enumerate() {
            let got = b.to_host().unwrap();
            let want: Vec<f32> = (0..count)
                .map(|k| expected_value(ReduceOp::Sum, n, r * count + k))
                .collect();
            let (wrong, first) = compare(r, &got[r * count..(r + 1) * count], &want, 4);
            assert_eq!(
                wrong, 0,
                "reduce-scatter in place count {count} {algorithm:?} {transport:?}: {first:?}"
            );
        }
        // Broadcast in place from rank 0.
        let mut bufs: Vec<_> = (0..n).map(|r| gpu(devices[r], &input(r, count))).collect();
        comm.broadcast_in_place(&mut bufs, 0).unwrap();
        for (r, b) in bufs.iter().enumerate() {
            let (wrong, first) = compare(r, &b.to_host().unwrap(), &input(0, count), 4);
            assert_eq!(
                wrong, 0,
                "broadcast in place count {count} {algorithm:?} {transport:?}: {first:?}"
            );
        }
        // Send/recv: a pipeline exchange where both ranks send and receive in one call.
        let sends = vec![
            gpu(devices[0], &input(0, count)),
            gpu(devices[1], &input(1, count)),
        ];
        let mut recvs = vec![
            gpu(devices[1], &vec![77.0; count]),
            gpu(devices[0], &vec![77.0; count]),
        ];
        comm.send_recv(&[(0, 1), (1, 0)], &sends, &mut recvs)
            .unwrap();
        for (i, from) in [0usize, 1].into_iter().enumerate() {
            let (wrong, first) = compare(i, &recvs[i].to_host().unwrap(), &input(from, count), 4);
            assert_eq!(
                wrong, 0,
                "send/recv {from} count {count} {algorithm:?} {transport:?}: {first:?}"
            );
        }
    }
    comm.health().unwrap();
    comm.close().unwrap();
}

/// An all-gather enqueued on the caller's streams, 10 calls back to back
/// with one synchronisation at the end, each call's result copied out on the same streams; in
/// the ring's form and in the one-shot's.
#[test]
fn collectives_on_the_callers_streams() {
    let Some(devices) = two_gpus_or_shared() else {
        return;
    };
    for algorithm in [Algorithm::Ring, Algorithm::OneShot] {
        collectives_on_the_callers_streams_in(&devices, algorithm);
    }
}

fn collectives_on_the_callers_streams_in(devices: &[usize], algorithm: Algorithm) {
    use ringreduce::{Buffer, Collective};
    let n = devices.len();
    let comm = communicator(devices, algorithm, Transport::Auto);
    let streams: Vec<_> = devices
        .iter()
        .map(|&d| device::context(d).unwrap().new_stream().unwrap())
        .collect();
    let count = 4099;
    let calls = 10;
    let inputs: Vec<_> = (0..n).map(|r| gpu(devices[r], &input(r, count))).collect();
    let mut outs: Vec<_> = (0..n)
        .map(|r| gpu(devices[r], &vec![77.0; n * count]))
        .collect();
    let copies: Vec<Vec<GpuBuffer<f32>>> = (0..calls)
        .map(|_| {
            (0..n)
                .map(|r| gpu(devices[r], &vec![0.0; n * count]))
                .collect()
        })
        .collect();
    for slot in &copies {
        // SAFETY: only work queued on `streams` touches the buffers until they are synchronised.
        unsafe {
            comm.enqueue_collective(
                &Collective::AllGather,
                Some(&inputs[..]),
                &mut outs,
                ReduceOp::Sum,
                Some(&streams),
            )
        }
        .unwrap();
        for (r, s) in streams.iter().enumerate() {
            s.context().bind_to_thread().unwrap();
            // SAFETY: both are live device buffers of n·count f32 on this stream's device.
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(
                    slot[r].address(),
                    outs[r].address(),
                    n * count * 4,
                    s.cu_stream(),
                )
            }
            .unwrap();
        }
    }
    for s in &streams {
        s.synchronize().unwrap();
    }
    let want: Vec<f32> = (0..n).flat_map(|j| input(j, count)).collect();
    for (call, slot) in copies.iter().enumerate() {
        for (r, b) in slot.iter().enumerate() {
            let (wrong, first) = compare(r, &b.to_host().unwrap(), &want, 4);
            assert_eq!(wrong, 0, "all-gather call {call} {algorithm:?}: {first:?}");
        }
    }
    comm.health().unwrap();
}

/// Reduce-scatter (out of place and in place) and reduce (into the last rank) of every type
/// and operator, on sub-slices that start `offset` elements into their allocation, against the
/// host reference, bit for bit.
fn reducing_collectives_of<T: ringreduce::Element>(
    comm: &Communicator,
    count: usize,
    offset: usize,
) {
    use ringreduce::verify::{make_expected, make_input};
    let devices = comm.devices();
    let n = devices.len();
    let padded = |r: usize, data: Vec<T>| -> GpuBuffer<T> {
        let mut v = vec![T::from_i64(77); offset];
        v.extend(data);
        GpuBuffer::from_host(devices[r], &v).unwrap()
    };
    for op in ReduceOp::ALL {
        let want = make_expected::<T>(op, n, n * count);
        // Reduce-scatter, out of place.
        let inputs: Vec<_> = (0..n)
            .map(|r| padded(r, make_input::<T>(op, r, n * count)))
            .collect();
        let mut outs: Vec<_> = (0..n)
            .map(|r| padded(r, vec![T::from_i64(5); count]))
            .collect();
        {
            let ins: Vec<_> = inputs
                .iter()
                .map(|b| b.view(offset, n * count).unwrap())
                .collect();
            let mut os: Vec<_> = outs
                .iter_mut()
                .map(|b| b.view_mut(offset, count).unwrap())
                .collect();
            comm.reduce_scatter(&ins, &mut os, op).unwrap();
        }
        for (r, b) in outs.iter().enumerate() {
            let got = b.to_host().unwrap();
            let (wrong, first) = compare(r, &got[offset..], &want[r * count..(r + 1) * count], 3);
            assert_eq!(
                wrong,
                0,
                "{} {op:?} reduce-scatter {count}+{offset}: {first:?}",
                T::DTYPE
            );
        }
        // Reduce-scatter, in place.
        let mut bufs: Vec<_> = (0..n)
            .map(|r| padded(r, make_input::<T>(op, r, n * count)))
            .collect();
        {
            let mut bs: Vec<_> = bufs
                .iter_mut()
                .map(|b| b.view_mut(offset, n * count).unwrap())
                .collect();
            comm.reduce_scatter_in_place(&mut bs, op).unwrap();
        }
        for (r, b) in bufs.iter().enumerate() {
            let got = b.to_host().unwrap();
            let mine = &got[offset + r * count..offset + (r + 1) * count];
            let (wrong, first) = compare(r, mine, &want[r * count..(r + 1) * count], 3);
            assert_eq!(
                wrong,
                0,
                "{} {op:?} reduce-scatter in place {count}+{offset}: {first:?}",
                T::DTYPE
            );
        }
        // Reduce into the last rank.
        let want = make_expected::<T>(op, n, count);
        let inputs: Vec<_> = (0..n)
            .map(|r| padded(r, make_input::<T>(op, r, count)))
            .collect();
        let mut out = padded(n - 1, vec![T::from_i64(5); count]);
        {
            let ins: Vec<_> = inputs
                .iter()
                .map(|b| b.view(offset, count).unwrap())
                .collect();
            let mut o = out.view_mut(offset, count).unwrap();
            comm.reduce(&ins, &mut o, n - 1, op).unwrap();
        }
        let got = out.to_host().unwrap();
        let (wrong, first) = compare(n - 1, &got[offset..], &want, 3);
        assert_eq!(
            wrong,
            0,
            "{} {op:?} reduce {count}+{offset}: {first:?}",
            T::DTYPE
        );
    }
}

fn reducing_collectives(devices: &[usize]) {
    for (algorithm, transport) in FORMS {
        reducing_collectives_in(devices, algorithm, transport);
    }
}

fn reducing_collectives_in(devices: &[usize], algorithm: Algorithm, transport: Transport) {
    use half::{bf16, f16};
    let comm = communicator(devices, algorithm, transport);
    for (count, offset) in [(1, 0), (7, 1), (1009, 3), (65_537, 0)] {
        reducing_collectives_of::<f16>(&comm, count, offset);
        reducing_collectives_of::<bf16>(&comm, count, offset);
        reducing_collectives_of::<f32>(&comm, count, offset);
        reducing_collectives_of::<f64>(&comm, count, offset);
        reducing_collectives_of::<i8>(&comm, count, offset);
        reducing_collectives_of::<u8>(&comm, count, offset);
        reducing_collectives_of::<i32>(&comm, count, offset);
        reducing_collectives_of::<u32>(&comm, count, offset);
        reducing_collectives_of::<i64>(&comm, count, offset);
        reducing_collectives_of::<u64>(&comm, count, offset);
        reducing_collectives_of::<ringreduce::F8E4M3>(&comm, count, offset);
        reducing_collectives_of::<ringreduce::F8E5M2>(&comm, count, offset);
    }
    comm.health().unwrap();
}

/// Every type and operator of the reducing collectives at two ranks, in every form.
#[test]
fn reducing_collectives_every_type_and_op() {
    let Some(devices) = two_gpus_or_shared() else {
        return;
    };
    reducing_collectives(&devices);
}

/// The same with three ranks sharing one GPU.
#[test]
fn reducing_collectives_every_type_and_op_three_ranks_on_one_gpu() {
    let Some(devices) = three_ranks_on_one_gpu() else {
        return;
    };
    reducing_collectives(&devices);
}

/// A communicator over `devices` running `algorithm`'s form of every collective over
/// `transport`, in the shared mode where a device repeats.
fn communicator(devices: &[usize], algorithm: Algorithm, transport: Transport) -> Communicator {
    let config = CudaConfig {
        allow_shared_device: devices.iter().skip(1).any(|&d| d == devices[0]),
        algorithm,
        transport,
        ..CudaConfig::default()
    };
    Communicator::with_config(devices, config).unwrap()
}
