//! GPU ranks that each have their own communicator ([`RankCommunicator::gpu`]), one process per
//! GPU as torchrun runs them: every algorithm of the all-reduce and every other collective,
//! exact against the host reference (two and three processes), their memory crossing through
//! CUDA IPC handles; calls on each process's own stream and in its CUDA graphs; a killed rank
//! named; an abort from a watchdog thread releasing a waiting call; a mismatched call named on
//! every rank, by the hosts or by the GPUs' call gates (read one-shot and LL kernels); an eager
//! call returning before a late peer starts it (a small all-reduce's first call too, and
//! large calls: kernels, never the copy engines, across processes; an all-reduce too large for
//! the arenas in gated pieces); a watchdog thread's health poll beside another
//! thread's CUDA graph capture; a call one rank captures and its peer runs eagerly named as a
//! mismatch; registered buffers (every collective without copies, a mixed call copying, pool
//! memory refused; symmetric registrations used without a meeting, a rank at another offset
//! named by the GPUs); staged rings through pinned host memory the
//! processes share; two such ranks in one process refused by
//! name. On a one-GPU machine the ranks share GPU 0
//! (`allow_shared_device`). A machine without a GPU waives them.

use common::launch::{as_rank, expect_success, launch};
use common::two_gpus_or_shared;
use cudarc::driver::CudaStream;
use ringreduce::plan::Collective;
use ringreduce::verify::{expected_value, input_value};
use ringreduce::{
    Algorithm, CudaConfig, GpuBuffer, LaunchEnv, RankCommunicator, ReduceOp, Transfer, UniqueId,
};
use std::sync::Arc;
use std::time::Duration;

mod common;

fn config(algorithm: Algorithm) -> CudaConfig {
    CudaConfig {
        algorithm,
        allow_shared_device: true,
        timeout: Duration::from_secs(20),
        ..CudaConfig::default()
    }
}

/// This rank's GPU: each process sees every GPU; rank r takes GPU r, or GPU 0 (shared) where
/// there are fewer GPUs than ranks.
fn this_gpu(env: &LaunchEnv) -> usize {
    match ringreduce::device_count().unwrap() >= env.world {
        true => env.rank,
        false => 0,
    }
}

/// This process's rank of the job in `env` under `Algorithm::Auto` on its GPU, with a stream of
/// its own there: (rank, world, device, communicator, stream).
fn auto_rank_with_stream(
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
fn enqueued_before_a_late_peer(rank: usize, enqueue: impl FnOnce()) {
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
fn first_call_mismatch_is_named_by_the_gpus(
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
fn assert_rank_1_mismatch(rank: usize, err: &ringreduce::Error, rank_1: &str, others: &str) {
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

fn values(op: ReduceOp, rank: usize, len: usize) -> Vec<f32> {
    (0..len).map(|k| input_value(op, rank, k)).collect()
}

/// One rank's part: every all-reduce algorithm in and out of place, then every other collective
/// (their one-shot and ring forms) and a send/recv, each checked on this rank. `next_id` gives
/// the id of each communicator in turn (the same sequence on every rank).
fn every_collective_on_this_gpu(
    rank: usize,
    world: usize,
    device: usize,
    next_id: &mut dyn FnMut() -> UniqueId,
) {
    let count = 1000;
    for algorithm in [
        Algorithm::Ring,
        Algorithm::OneShot,
        Algorithm::TwoShot,
        Algorithm::Auto,
    ] {
        let mut comm =
            RankCommunicator::gpu(&next_id(), rank, world, device, config(algorithm)).unwrap();
        for op in [ReduceOp::Sum, ReduceOp::Avg] {
            let want: Vec<f32> = (0..count).map(|k| expected_value(op, world, k)).collect();
            let input = GpuBuffer::from_host(device, &values(op, rank, count)).unwrap();
            let mut output = GpuBuffer::<f32>::zeroed(device, count).unwrap();
            comm.all_reduce(&input, &mut output, op)
                .unwrap_or_else(|e| panic!("{algorithm:?} {op:?}: {e}"));
            assert_eq!(
                output.to_host().unwrap(),
                want,
                "rank {rank} {algorithm:?} {op:?}"
            );
            let mut buf = GpuBuffer::from_host(device, &values(op, rank, count)).unwrap();
            // Twice: the second call reuses the prepared plan and its staged buffers.
            for _ in 0..2 {
                buf.copy_from_host(&values(op, rank, count)).unwrap();
                comm.all_reduce_in_place(&mut buf, op)
                    .unwrap_or_else(|e| panic!("{algorithm:?} {op:?} in place: {e}"));
                assert_eq!(
                    buf.to_host().unwrap(),
                    want,
                    "rank {rank} {algorithm:?} in place"
                );
            }
        }
    }
    let op = ReduceOp::Sum;
    let per = 37;
    for algorithm in [Algorithm::Auto, Algorithm::Ring] {
        let mut comm =
            RankCommunicator::gpu(&next_id(), rank, world, device, config(algorithm)).unwrap();
        // All-gather: every rank's block, in rank order.
        let mine = GpuBuffer::from_host(device, &values(op, rank, per)).unwrap();
        let mut all = GpuBuffer::<f32>::zeroed(device, world * per).unwrap();
        comm.collective(&Collective::AllGather, Some(&mine), Some(&mut all), op)
            .unwrap();
        let want: Vec<f32> = (0..world).flat_map(|r| values(op, r, per)).collect();
        assert_eq!(all.to_host().unwrap(), want, "all-gather {algorithm:?}");
        // Reduce-scatter: block `rank` of the sum of every rank's world·per elements.
        let input = GpuBuffer::from_host(device, &values(op, rank, world * per)).unwrap();
        let mut block = GpuBuffer::<f32>::zeroed(device, per).unwrap();
        comm.collective(
            &Collective::ReduceScatter,
            Some(&input),
            Some(&mut block),
            op,
        )
        .unwrap();
        let want: Vec<f32> = (0..per)
            .map(|k| expected_value(op, world, rank * per + k))
            .collect();
        assert_eq!(
            block.to_host().unwrap(),
            want,
            "reduce-scatter {algorithm:?}"
        );
        // Broadcast from the last rank, in place.
        let root = world - 1;
        let mut buf = GpuBuffer::from_host(device, &values(op, rank, per)).unwrap();
        comm.collective_in_place(&Collective::Broadcast { root }, &mut buf, op)
            .unwrap();
        assert_eq!(
            buf.to_host().unwrap(),
            values(op, root, per),
            "broadcast {algorithm:?}"
        );
        // Reduce to the last rank, out of place: the root alone passes an output.
        let input = GpuBuffer::from_host(device, &values(op, rank, per)).unwrap();
        let mut out = (rank == root).then(|| GpuBuffer::<f32>::zeroed(device, per).unwrap());
        comm.collective(&Collective::Reduce { root }, Some(&input), out.as_mut(), op)
            .unwrap();
        if let Some(out) = out {
            let want: Vec<f32> = (0..per).map(|k| expected_value(op, world, k)).collect();
            assert_eq!(out.to_host().unwrap(), want, "reduce {algorithm:?}");
        }
        // All-to-all: block j of this rank's output is block `rank` of rank j's input.
        let input = GpuBuffer::from_host(device, &values(op, rank, world * per)).unwrap();
        let mut out = GpuBuffer::<f32>::zeroed(device, world * per).unwrap();
        comm.collective(&Collective::AllToAll, Some(&input), Some(&mut out), op)
            .unwrap();
        let want: Vec<f32> = (0..world)
            .flat_map(|j| values(op, j, world * per)[rank * per..(rank + 1) * per].to_vec())
            .collect();
        assert_eq!(out.to_host().unwrap(), want, "all-to-all {algorithm:?}");
    }
    // Send/recv: every rank to the next.
    let mut comm =
        RankCommunicator::gpu(&next_id(), rank, world, device, config(Algorithm::Ring)).unwrap();
    let transfers: Vec<Transfer> = (0..world)
        .map(|r| Transfer {
            from: r,
            to: (r + 1) % world,
            count: per + r,
        })
        .collect();
    let send = GpuBuffer::from_host(device, &values(op, rank, per + rank)).unwrap();
    let from = (rank + world - 1) % world;
    let mut recv = GpuBuffer::<f32>::zeroed(device, per + from).unwrap();
    comm.send_recv(&transfers, &[&send], &mut [&mut recv])
        .unwrap();
    assert_eq!(
        recv.to_host().unwrap(),
        values(op, from, per + from),
        "send/recv"
    );
}

/// One rank's part of the registration test: every collective on views of two registered
/// allocations (at offsets that differ between ranks: registered, not symmetric) runs exactly,
/// for every all-reduce algorithm — on the registrations, without copies, where the call meets
/// the peers' hosts anyway (the ring's copy engines), and copying where it is gated (a kernel:
/// each rank decides alone, and only symmetric registrations are decided alone); a call where
/// one rank's buffer is unregistered copies, on every rank, and is as exact; stream-ordered pool
/// memory is refused by name and leaves the communicator working; once deregistered, a call on
/// the same buffer copies, exactly.
fn registered_buffers_on_this_gpu(
    rank: usize,
    world: usize,
    device: usize,
    next_id: &mut dyn FnMut() -> UniqueId,
) {
    let op = ReduceOp::Sum;
    let space = 1 << 18;
    for algorithm in [
        Algorithm::Ring,
        Algorithm::OneShot,
        Algorithm::TwoShot,
        Algorithm::Auto,
    ] {
        let mut comm =
            RankCommunicator::gpu(&next_id(), rank, world, device, config(algorithm)).unwrap();
        let mut a = GpuBuffer::<f32>::zeroed(device, space).unwrap();
        let mut b = GpuBuffer::<f32>::zeroed(device, space).unwrap();
        // SAFETY: both are deregistered on every rank below, before they are dropped.
        let registered = unsafe { [comm.register(&a).unwrap(), comm.register(&b).unwrap()] };
        // Offsets differ between ranks: each rank publishes its own.
        let at = 64 * (rank + 1);
        // The latest call ran on the registered buffers, without copies, where it met the
        // peers (the copy engines' plans); a kernel's call, gated, ran on copies.
        let on_registered = |comm: &RankCommunicator, what: &str| {
            let r = comm.last_ran().unwrap();
            let meets = r.form == ringreduce::Form::CopyEngines;
            assert_eq!(r.registered, meets, "{algorithm:?} {what}: {r:?}");
            assert!(!(meets && r.copied), "{algorithm:?} {what}: {r:?}");
        };
        for count in [1000, 100_000] {
            let want: Vec<f32> = (0..count).map(|k| expected_value(op, world, k)).collect();
            a.copy_from_host(&[values(op, rank, count), vec![0.0; space - count]].concat())
                .unwrap();
            {
                let input = a.view(0, count).unwrap();
                let mut output = b.view_mut(at, count).unwrap();
                comm.all_reduce(&input, &mut output, op)
                    .unwrap_or_else(|e| panic!("{algorithm:?} {count}: {e}"));
            }
            on_registered(&comm, &count.to_string());
            assert_eq!(
                b.to_host().unwrap()[at..at + count],
                want[..],
                "{algorithm:?} {count}"
            );
            {
                let mut buf = a.view_mut(0, count).unwrap();
                comm.all_reduce_in_place(&mut buf, op)
                    .unwrap_or_else(|e| panic!("{algorithm:?} {count} in place: {e}"));
            }
            assert_eq!(
                a.to_host().unwrap()[..count],
                want[..],
                "{algorithm:?} in place"
            );
            on_registered(&comm, &format!("{count} in place"));
        }
        // Rank 0 passes an unregistered output: every rank copies, and the result is the same.
        let count = 1000;
        let want: Vec<f32> = (0..count).map(|k| expected_value(op, world, k)).collect();
        let input = GpuBuffer::from_host(device, &values(op, rank, count)).unwrap();
        let mut loose = GpuBuffer::<f32>::zeroed(device, count).unwrap();
        a.copy_from_host(&[values(op, rank, count), vec![0.0; space - count]].concat())
            .unwrap();
        if rank == 0 {
            comm.all_reduce(&input, &mut loose, op).unwrap();
            assert_eq!(loose.to_host().unwrap(), want, "{algorithm:?} mixed");
        } else {
            {
                let mut output = b.view_mut(0, count).unwrap();
                comm.all_reduce(&a.view(0, count).unwrap(), &mut output, op)
                    .unwrap();
            }
            assert_eq!(
                b.to_host().unwrap()[..count],
                want[..],
                "{algorithm:?} mixed"
            );
        }
        let mixed = comm.last_ran().unwrap();
        assert!(
            !mixed.registered,
            "{algorithm:?}: the mixed call copied: {mixed:?}"
        );
        if algorithm == Algorithm::Auto {
            // A kernel's call while registrations are not symmetric is gated like any other:
            // enqueued while rank 1 is 2 s late, whatever its buffers lie in.
            let ctx = cudarc::driver::CudaContext::new(device).unwrap();
            let stream = ctx.new_stream().unwrap();
            a.copy_from_host(&[values(op, rank, count), vec![0.0; space - count]].concat())
                .unwrap();
            enqueued_before_a_late_peer(rank, || {
                let mut buf = a.view_mut(0, count).unwrap();
                // SAFETY: `a` is untouched until the stream is synchronised below.
                unsafe { comm.enqueue_all_reduce_in_place_on(&mut buf, op, &stream) }.unwrap();
            });
            stream.synchronize().unwrap();
            comm.synchronize().unwrap();
            assert_eq!(a.to_host().unwrap()[..count], want[..], "late peer");
        }
        // Every other collective on registered views (the one-shot and ring forms by size),
        // once, with Auto.
        let others: &[usize] = match algorithm {
            Algorithm::Auto => &[37, 40_000],
            _ => &[],
        };
        for &per in others {
            a.copy_from_host(
                &[
                    values(op, rank, world * per),
                    vec![0.0; space - world * per],
                ]
                .concat(),
            )
            .unwrap();
            {
                let mine = a.view(0, per).unwrap();
                let mut all = b.view_mut(0, world * per).unwrap();
                comm.collective(&Collective::AllGather, Some(&mine), Some(&mut all), op)
                    .unwrap();
            }
            on_registered(&comm, &format!("all-gather of {per}"));
            let want: Vec<f32> = (0..world)
                .flat_map(|r| values(op, r, world * per)[..per].to_vec())
                .collect();
            assert_eq!(
                b.to_host().unwrap()[..world * per],
                want[..],
                "all-gather {per}"
            );
            {
                let input = a.view(0, world * per).unwrap();
                let mut block = b.view_mut(at, per).unwrap();
                comm.collective(
                    &Collective::ReduceScatter,
                    Some(&input),
                    Some(&mut block),
                    op,
                )
                .unwrap();
            }
            on_registered(&comm, &format!("reduce-scatter of {per}"));
            let want: Vec<f32> = (0..per)
                .map(|k| expected_value(op, world, rank * per + k))
                .collect();
            assert_eq!(
                b.to_host().unwrap()[at..at + per],
                want[..],
                "reduce-scatter {per}"
            );
            let root = world - 1;
            {
                let mut buf = a.view_mut(0, per).unwrap();
                comm.collective_in_place(&Collective::Broadcast { root }, &mut buf, op)
                    .unwrap();
            }
            on_registered(&comm, &format!("broadcast of {per}"));
            let sent = values(op, root, world * per)[..per].to_vec();
            assert_eq!(a.to_host().unwrap()[..per], sent[..], "broadcast {per}");
            a.copy_from_host(&[values(op, rank, per), vec![0.0; space - per]].concat())
                .unwrap();
            {
                let input = a.view(0, per).unwrap();
                let mut out = b.view_mut(0, per).unwrap();
                let out = (rank == root).then_some(&mut out);
                comm.collective(&Collective::Reduce { root }, Some(&input), out, op)
                    .unwrap();
            }
            on_registered(&comm, &format!("reduce of {per}"));
            if rank == root {
                let want: Vec<f32> = (0..per).map(|k| expected_value(op, world, k)).collect();
                assert_eq!(b.to_host().unwrap()[..per], want[..], "reduce {per}");
            }
            a.copy_from_host(
                &[
                    values(op, rank, world * per),
                    vec![0.0; space - world * per],
                ]
                .concat(),
            )
            .unwrap();
            {
                let input = a.view(0, world * per).unwrap();
                let mut out = b.view_mut(0, world * per).unwrap();
                comm.collective(&Collective::AllToAll, Some(&input), Some(&mut out), op)
                    .unwrap();
            }
            on_registered(&comm, &format!("all-to-all of {per}"));
            let want: Vec<f32> = (0..world)
                .flat_map(|j| values(op, j, world * per)[rank * per..(rank + 1) * per].to_vec())
                .collect();
            assert_eq!(
                b.to_host().unwrap()[..world * per],
                want[..],
                "all-to-all {per}"
            );
        }
        // Pool memory: refused by name on every rank; the communicator still works.
        let ctx = cudarc::driver::CudaContext::new(device).unwrap();
        let pool = ctx.default_stream().alloc_zeros::<f32>(1024).unwrap();
        // SAFETY: refused, so nothing is registered.
        let err = unsafe { comm.register(&pool) }.unwrap_err().to_string();
        assert!(err.contains("pool memory"), "{err}");
        // Deregistered on every rank: a call on the same buffer copies, and is exact.
        for registration in registered {
            comm.deregister(registration).unwrap();
        }
        a.copy_from_host(&[values(op, rank, count), vec![0.0; space - count]].concat())
            .unwrap();
        {
            let mut buf = a.view_mut(0, count).unwrap();
            comm.all_reduce_in_place(&mut buf, op).unwrap();
        }
        assert_eq!(
            a.to_host().unwrap()[..count],
            want[..],
            "{algorithm:?} deregistered"
        );
        // Not on the registrations; the caller's buffer copied where a peer touches it — not by
        // the in-place one-shot forms, whose peers read the copy their kernel exposes (or sends).
        let deregistered = comm.last_ran().unwrap();
        let exposes = matches!(
            deregistered.form,
            ringreduce::Form::OneShotKernel | ringreduce::Form::LlKernel
        );
        assert_eq!(
            (deregistered.registered, deregistered.copied),
            (false, !exposes),
            "{algorithm:?}: deregistered, {deregistered:?}"
        );
        comm.close().unwrap();
    }
}

#[test]
fn registered_buffers_run_every_collective_without_copies() {
    // A caller's cuMemAlloc memory takes a legacy IPC handle whatever the ranks' own memory
    // takes (file descriptors serve memory ringreduce made with cuMemCreate).
    in_processes_of_every_sharing(
        "registered_buffers_run_every_collective_without_copies",
        registered_buffers_on_this_gpu,
    );
}

/// The parent's side of a process test, and each rank's: `test` started as 2 and 3 processes
/// with memory shared by file descriptors where the driver can (the default), and as 2 with
/// legacy IPC handles (what a driver without them gets); each rank runs `part` with its rank,
/// the world, its GPU and the id of each communicator in turn (the same sequence on every rank).
fn in_processes_of_every_sharing(
    test: &str,
    part: fn(usize, usize, usize, &mut dyn FnMut() -> UniqueId),
) {
    if let Some(env) = as_rank() {
        let device = this_gpu(&env);
        let mut job = 0;
        let mut next_id = || {
            job += 1;
            LaunchEnv {
                run_id: Some(format!("{:?}-{job}", env.run_id)),
                ..env.clone()
            }
            .unique_id()
            .unwrap()
        };
        part(env.rank, env.world, device, &mut next_id);
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    for (world, sharing) in [(2, "default"), (3, "default"), (2, "legacy")] {
        let ranks = launch(test, world, |_| {
            vec![("RINGREDUCE_IPC".into(), sharing.into())]
        });
        expect_success(ranks, Duration::from_secs(300));
    }
}

#[test]
fn two_gpu_ranks_in_one_process_are_refused_by_name() {
    let Some(devices) = two_gpus_or_shared() else {
        return;
    };
    let id = UniqueId::new("127.0.0.1:0").unwrap();
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let device = devices[rank];
            std::thread::spawn(move || {
                RankCommunicator::gpu(&id, rank, 2, device, config(Algorithm::Auto)).unwrap_err()
            })
        })
        .collect();
    for h in handles {
        let err = h.join().unwrap().to_string();
        assert!(err.contains("in one process"), "{err}");
    }
}

#[test]
fn gpu_ranks_as_processes_run_every_collective_exactly() {
    in_processes_of_every_sharing(
        "gpu_ranks_as_processes_run_every_collective_exactly",
        every_collective_on_this_gpu,
    );
}

#[test]
fn gpu_ranks_as_processes_stage_through_shared_pinned_memory() {
    if let Some(env) = as_rank() {
        let device = this_gpu(&env);
        let id = env.unique_id().unwrap();
        let config = CudaConfig {
            transport: ringreduce::Transport::Staged,
            ..config(Algorithm::Ring)
        };
        let mut comm = RankCommunicator::gpu(&id, env.rank, env.world, device, config).unwrap();
        let (rank, world, count) = (env.rank, env.world, 5000);
        for op in [ReduceOp::Sum, ReduceOp::Avg] {
            let want: Vec<f32> = (0..count).map(|k| expected_value(op, world, k)).collect();
            let input = GpuBuffer::from_host(device, &values(op, rank, count)).unwrap();
            let mut output = GpuBuffer::<f32>::zeroed(device, count).unwrap();
            comm.all_reduce(&input, &mut output, op).unwrap();
            assert_eq!(output.to_host().unwrap(), want, "rank {rank} staged {op:?}");
            let mut buf = GpuBuffer::from_host(device, &values(op, rank, count)).unwrap();
            comm.all_reduce_in_place(&mut buf, op).unwrap();
            assert_eq!(
                buf.to_host().unwrap(),
                want,
                "rank {rank} staged {op:?} in place"
            );
        }
        let per = 333;
        let mine = GpuBuffer::from_host(device, &values(ReduceOp::Sum, rank, per)).unwrap();
        let mut all = GpuBuffer::<f32>::zeroed(device, per * world).unwrap();
        comm.collective(
            &Collective::AllGather,
            Some(&mine),
            Some(&mut all),
            ReduceOp::Sum,
        )
        .unwrap();
        let want: Vec<f32> = (0..world)
            .flat_map(|r| values(ReduceOp::Sum, r, per))
            .collect();
        assert_eq!(
            all.to_host().unwrap(),
            want,
            "rank {rank} staged all-gather"
        );
        println!("rank {rank}: staged through shared pinned memory, exact");
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    for world in [2, 3] {
        let ranks = launch(
            "gpu_ranks_as_processes_stage_through_shared_pinned_memory",
            world,
            |_| vec![],
        );
        expect_success(ranks, Duration::from_secs(300));
    }
}

#[test]
fn gpu_ranks_as_processes_stay_exact_as_plans_come_and_go() {
    if let Some(env) = as_rank() {
        let device = this_gpu(&env);
        let (rank, world) = (env.rank, env.world);
        for (job, algorithm) in [Algorithm::Auto, Algorithm::Ring].into_iter().enumerate() {
            let id = LaunchEnv {
                run_id: Some(format!("{:?}-{job}", env.run_id)),
                ..env.clone()
            }
            .unique_id()
            .unwrap();
            let mut comm =
                RankCommunicator::gpu(&id, rank, world, device, config(algorithm)).unwrap();
            // More sizes than the plan cache holds, twice over: evicted plans' memory is freed
            // and its addresses reused by the next plans' (the peers must map the new memory,
            // never the old mapping).
            let op = ReduceOp::Sum;
            for round in 0..2 {
                for i in 0..12 {
                    let count = 1000 + 4099 * i + round;
                    let want: Vec<f32> = (0..count).map(|k| expected_value(op, world, k)).collect();
                    let mut buf = GpuBuffer::from_host(device, &values(op, rank, count)).unwrap();
                    comm.all_reduce_in_place(&mut buf, op).unwrap();
                    assert_eq!(
                        buf.to_host().unwrap(),
                        want,
                        "rank {rank} {algorithm:?} round {round} count {count}"
                    );
                }
            }
        }
        println!("rank {rank}: 48 sizes exact through the plan cache");
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    for sharing in ["default", "legacy"] {
        let ranks = launch(
            "gpu_ranks_as_processes_stay_exact_as_plans_come_and_go",
            2,
            |_| vec![("RINGREDUCE_IPC".into(), sharing.into())],
        );
        expect_success(ranks, Duration::from_secs(300));
    }
}

#[test]
fn a_gpu_rank_killed_mid_job_is_named_well_before_the_timeout() {
    const VICTIM: usize = 1;
    if let Some(env) = as_rank() {
        let device = this_gpu(&env);
        // The one-shot's kernels wait at flag barriers, the ring's at event counters.
        let algorithm = match std::env::var("RINGREDUCE_TEST_ALGORITHM").as_deref() {
            Ok("ring") => Algorithm::Ring,
            _ => Algorithm::OneShot,
        };
        let id = env.unique_id().unwrap();
        let mut comm =
            RankCommunicator::gpu(&id, env.rank, env.world, device, config(algorithm)).unwrap();
        let count = 1 << 20;
        let mut buf = GpuBuffer::from_host(device, &vec![1.0f32; count]).unwrap();
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
        if env.rank == VICTIM {
            // Starts the next collective (the peers' start check passes), but on a stream held
            // behind a gate that never opens, so that its part never runs; then it is gone while
            // the other rank's kernels wait for it.
            let ctx = ringreduce::device::context(device).unwrap();
            let stream = ctx.new_stream().unwrap();
            let gate = GpuBuffer::<u32>::zeroed(device, 1).unwrap();
            ctx.bind_to_thread().unwrap();
            // SAFETY: `gate` is a live device word of this context; the stream waits until it
            // reaches 1, which never happens (the process is killed below).
            let status = unsafe {
                cudarc::driver::sys::cuStreamWaitValue32_v2(
                    stream.cu_stream(),
                    ringreduce::Buffer::address(&gate),
                    1,
                    cudarc::driver::sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
                )
            };
            assert_eq!(status, cudarc::driver::sys::CUresult::CUDA_SUCCESS);
            // SAFETY: the process ends before `buf` could be freed.
            unsafe { comm.enqueue_all_reduce_in_place_on(&mut buf, ReduceOp::Sum, &stream) }
                .unwrap();
            std::thread::sleep(Duration::from_millis(500));
            let me = std::process::id().to_string();
            let _ = std::process::Command::new("kill")
                .args(["-9", &me])
                .status();
            std::thread::sleep(Duration::from_secs(60));
        }
        let started = std::time::Instant::now();
        let err = comm
            .all_reduce_in_place(&mut buf, ReduceOp::Sum)
            .unwrap_err();
        let took = started.elapsed();
        match &err {
            ringreduce::Error::RankFailed { rank, .. } => assert_eq!(*rank, VICTIM, "{err}"),
            other => panic!("{algorithm:?}: {other}"),
        }
        // The kernels would give up at 15 s (three quarters of the 20 s timeout).
        assert!(
            took < Duration::from_secs(5),
            "{algorithm:?}: {took:?}: {err}"
        );
        println!("{algorithm:?}: the lost rank named after {took:?}: {err}");
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    for algorithm in ["oneshot", "ring"] {
        let mut ranks = launch(
            "a_gpu_rank_killed_mid_job_is_named_well_before_the_timeout",
            2,
            |_| vec![("RINGREDUCE_TEST_ALGORITHM".into(), algorithm.into())],
        );
        let mut victim = ranks.remove(VICTIM);
        let status = victim.wait().unwrap();
        assert!(!status.success(), "the victim killed itself");
        expect_success(ranks, Duration::from_secs(120));
    }
}

/// A call enqueued on a peer that is gone ends on the GPU within a second or so, though nobody
/// calls into the library while it waits: the survivor only synchronizes its own stream, as a C
/// program does, and the timeout is far away (10 minutes). The communicator's watcher thread
/// (`exec/cuda/executor/watch.rs`) sees the peer's process gone and stops the waiting kernel;
/// the survivor's next call of the communicator names the lost rank.
#[test]
fn a_call_gated_on_a_dead_peer_ends_without_a_call_into_the_library() {
    const VICTIM: usize = 1;
    if let Some(env) = as_rank() {
        let device = this_gpu(&env);
        let id = env.unique_id().unwrap();
        let config = CudaConfig {
            timeout: Duration::from_secs(600),
            ..config(Algorithm::OneShot)
        };
        let mut comm = RankCommunicator::gpu(&id, env.rank, env.world, device, config).unwrap();
        let count = 4096;
        let mut buf = GpuBuffer::from_host(device, &vec![1.0f32; count]).unwrap();
        // Prepares the shape with the peer: its next call runs gated, without a meeting.
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
        if env.rank == VICTIM {
            // Late first (the survivor's call is enqueued and waiting meanwhile), then gone.
            std::thread::sleep(Duration::from_secs(1));
            let me = std::process::id().to_string();
            let _ = std::process::Command::new("kill")
                .args(["-9", &me])
                .status();
            std::thread::sleep(Duration::from_secs(60));
        }
        let stream = ringreduce::device::context(device)
            .unwrap()
            .new_stream()
            .unwrap();
        let started = std::time::Instant::now();
        // SAFETY: `buf` outlives the call: the stream is synchronized below.
        unsafe { comm.enqueue_all_reduce_in_place_on(&mut buf, ReduceOp::Sum, &stream) }.unwrap();
        let enqueued = started.elapsed();
        stream.synchronize().unwrap();
        let ended = started.elapsed();
        assert!(
            ended < Duration::from_secs(10),
            "the gated kernel waited {ended:?} for a dead peer"
        );
        let err = comm.synchronize().unwrap_err();
        match &err {
            ringreduce::Error::RankFailed { rank, .. } => assert_eq!(*rank, VICTIM, "{err}"),
            other => panic!("not the lost rank: {other}"),
        }
        println!(
            "enqueued in {enqueued:?}; the stream ended {ended:?} after the call began; then: {err}"
        );
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let mut ranks = launch(
        "a_call_gated_on_a_dead_peer_ends_without_a_call_into_the_library",
        2,
        |_| vec![],
    );
    let mut victim = ranks.remove(VICTIM);
    let status = victim.wait().unwrap();
    assert!(!status.success(), "the victim killed itself");
    expect_success(ranks, Duration::from_secs(120));
}

#[test]
fn a_mismatched_gpu_call_is_a_named_error_on_every_rank_and_breaks_the_communicator() {
    if let Some(env) = as_rank() {
        let device = this_gpu(&env);
        let id = env.unique_id().unwrap();
        let mut comm =
            RankCommunicator::gpu(&id, env.rank, env.world, device, config(Algorithm::Auto))
                .unwrap();
        let mut buf = GpuBuffer::from_host(device, &[1.0f32; 64]).unwrap();
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
        assert_eq!(buf.to_host().unwrap(), vec![env.world as f32; 64]);
        // The second call's count differs on rank 1: nothing is enqueued, every rank is told.
        let count = if env.rank == 1 { 65 } else { 64 };
        let mut buf = GpuBuffer::from_host(device, &vec![1.0f32; count]).unwrap();
        let started = std::time::Instant::now();
        let err = comm
            .all_reduce_in_place(&mut buf, ReduceOp::Sum)
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5), "{err}");
        match &err {
            ringreduce::Error::CallMismatch { rank, theirs, .. } => {
                assert_eq!(*rank, if env.rank == 1 { 0 } else { 1 }, "{err}");
                assert!(theirs.contains("all-reduce"), "{err}");
            }
            other => panic!("rank {}: {other}", env.rank),
        }
        assert_eq!(buf.to_host().unwrap(), vec![1.0f32; count], "untouched");
        let again = comm
            .all_reduce_in_place(&mut buf, ReduceOp::Sum)
            .unwrap_err();
        assert!(
            matches!(again, ringreduce::Error::CommunicatorFailed(_)),
            "{again}"
        );
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "a_mismatched_gpu_call_is_a_named_error_on_every_rank_and_breaks_the_communicator",
        3,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(120));
}

#[test]
fn an_eager_call_returns_before_a_late_peer_starts_it_and_the_gpu_names_a_mismatch() {
    if let Some(env) = as_rank() {
        let (rank, world, device, mut comm, stream) = auto_rank_with_stream(&env);
        // Both shapes prepared, in step, by a first call each (those meet on the hosts).
        let mut small = GpuBuffer::from_host(device, &[1.0f32; 64]).unwrap();
        let mut large = GpuBuffer::from_host(device, &[1.0f32; 96]).unwrap();
        comm.all_reduce_in_place(&mut small, ReduceOp::Sum).unwrap();
        comm.all_reduce_in_place(&mut large, ReduceOp::Sum).unwrap();
        // Rank 1 is 2 s late for the next call: the others' calls return once enqueued.
        enqueued_before_a_late_peer(rank, || {
            // SAFETY: `small` is untouched until the stream is synchronised below.
            unsafe { comm.enqueue_all_reduce_in_place_on(&mut small, ReduceOp::Sum, &stream) }
                .unwrap();
        });
        stream.synchronize().unwrap();
        comm.synchronize().unwrap();
        let sum = (world * world) as f32;
        assert_eq!(small.to_host().unwrap(), vec![sum; 64], "rank {rank}");
        // Rank 1 calls the other prepared shape: every call is enqueued, and every rank's GPU
        // finds the difference before touching a peer's memory.
        let buf = if rank == 1 { &mut large } else { &mut small };
        let before = buf.to_host().unwrap();
        // SAFETY: `buf` is untouched until the stream is synchronised below.
        unsafe { comm.enqueue_all_reduce_in_place_on(buf, ReduceOp::Sum, &stream) }.unwrap();
        stream.synchronize().unwrap();
        let err = comm.synchronize().unwrap_err();
        assert_rank_1_mismatch(rank, &err, "96", "64");
        assert_eq!(buf.to_host().unwrap(), before, "rank {rank}: untouched");
        let again = comm
            .all_reduce_in_place(&mut small, ReduceOp::Sum)
            .unwrap_err();
        assert!(
            matches!(again, ringreduce::Error::CommunicatorFailed(_)),
            "{again}"
        );
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "an_eager_call_returns_before_a_late_peer_starts_it_and_the_gpu_names_a_mismatch",
        3,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(120));
}

#[test]
fn a_small_all_reduces_first_call_returns_before_a_late_peer_and_the_gpu_names_a_first_call_mismatch(
) {
    use ringreduce::Form;
    if let Some(env) = as_rank() {
        let (rank, world) = (env.rank, env.world);
        let device = this_gpu(&env);
        let id = env.unique_id().unwrap();
        // The LL one-shot (up to 64 KiB a rank): each rank prepares its shapes alone, so even a
        // shape's first call meets no peer.
        let cfg = CudaConfig {
            low_latency: true,
            ..config(Algorithm::Auto)
        };
        let mut comm = RankCommunicator::gpu(&id, rank, world, device, cfg).unwrap();
        let stream = ringreduce::device::context(device)
            .unwrap()
            .new_stream()
            .unwrap();
        let ones = GpuBuffer::from_host(device, &[1.0f32; 64]).unwrap();
        let mut small = GpuBuffer::<f32>::zeroed(device, 64).unwrap();
        // Ten shapes in place, 4 to 40 elements: with the out-of-place one, eleven plans
        // against a cache of 8 — three pushed out.
        let mut shapes: Vec<GpuBuffer<f32>> = (1..=10)
            .map(|k| GpuBuffer::from_host(device, &vec![k as f32; 4 * k]).unwrap())
            .collect();
        // Rank 1 is 2 s late for the communicator's first calls: the others' return once
        // enqueued — an out-of-place call, then ten new shapes in place while it waits (their
        // in-place copies in the arenas made at creation; the plans they push out of the cache
        // owning nothing a kernel in flight uses, so dropped without waiting for it).
        enqueued_before_a_late_peer(rank, || {
            // SAFETY: `ones`, `small` and `shapes` are untouched until the stream is
            // synchronised below.
            unsafe { comm.enqueue_all_reduce_on(&ones, &mut small, ReduceOp::Sum, &stream) }
                .unwrap();
            for buf in &mut shapes {
                // SAFETY: as above.
                unsafe { comm.enqueue_all_reduce_in_place_on(buf, ReduceOp::Sum, &stream) }
                    .unwrap();
            }
        });
        assert_eq!(
            comm.last_ran().map(|r| r.form),
            Some(Form::LlKernel),
            "rank {rank}"
        );
        stream.synchronize().unwrap();
        comm.synchronize().unwrap();
        assert_eq!(
            small.to_host().unwrap(),
            vec![world as f32; 64],
            "rank {rank}"
        );
        for (k, buf) in (1..=10).zip(&shapes) {
            let want = vec![(k * world) as f32; 4 * k];
            assert_eq!(
                buf.to_host().unwrap(),
                want,
                "rank {rank}, {} elements",
                4 * k
            );
        }
        // A first call of two new shapes: rank 1 calls 44 elements, the others 24.
        first_call_mismatch_is_named_by_the_gpus(rank, &mut comm, &stream, device, 0);
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "a_small_all_reduces_first_call_returns_before_a_late_peer_and_the_gpu_names_a_first_call_mismatch",
        3,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(120));
}

#[test]
fn every_kernel_forms_first_call_returns_before_a_late_peer_and_the_gpu_names_a_first_call_mismatch(
) {
    use ringreduce::Form;
    if let Some(env) = as_rank() {
        let (rank, world, device, mut comm, stream) = auto_rank_with_stream(&env);
        let op = ReduceOp::Sum;
        // First calls of shapes of every kernel form: the read one-shot in place and out of
        // place (1 MiB), the two-shot in place (8 MiB: from 8 MiB × 2/n in place), the steps
        // kernel's all-gather, ring of sends and all-to-all of sends of mixed counts — each
        // plan's buffers fit the arenas, so each rank prepares it alone.
        let (small, large, per) = ((1 << 18) + 3, (2 << 20) + 5, (1 << 16) + 3);
        let want = |count: usize| -> Vec<f32> {
            (0..count).map(|k| expected_value(op, world, k)).collect()
        };
        let mut in_place = GpuBuffer::from_host(device, &values(op, rank, small)).unwrap();
        let input = GpuBuffer::from_host(device, &values(op, rank, small)).unwrap();
        let mut output = GpuBuffer::<f32>::zeroed(device, small).unwrap();
        let mut two_shot = GpuBuffer::from_host(device, &values(op, rank, large)).unwrap();
        let mine = GpuBuffer::from_host(device, &values(op, rank, per)).unwrap();
        let mut all = GpuBuffer::<f32>::zeroed(device, world * per).unwrap();
        let ring: Vec<Transfer> = (0..world)
            .map(|from| Transfer {
                from,
                to: (from + 1) % world,
                count: per,
            })
            .collect();
        let mut got = GpuBuffer::<f32>::zeroed(device, per).unwrap();
        // Every rank sends to every rank (itself too) `per + 7·from + to` elements.
        let uneven = |from: usize, to: usize| per + 7 * from + to;
        let everyone: Vec<Transfer> = (0..world)
            .flat_map(|from| (0..world).map(move |to| (from, to)))
            .map(|(from, to)| Transfer {
                from,
                to,
                count: uneven(from, to),
            })
            .collect();
        let to_each: Vec<GpuBuffer<f32>> = (0..world)
            .map(|to| GpuBuffer::from_host(device, &values(op, rank, uneven(rank, to))).unwrap())
            .collect();
        let mut from_each: Vec<GpuBuffer<f32>> = (0..world)
            .map(|from| GpuBuffer::<f32>::zeroed(device, uneven(from, rank)).unwrap())
            .collect();
        // A pair the late rank 1 takes no part in: rank 2 sends to rank 0.
        let pair = [Transfer {
            from: 2,
            to: 0,
            count: per + 1,
        }];
        let pair_send = GpuBuffer::from_host(device, &values(op, rank, per + 1)).unwrap();
        let mut pair_recv = GpuBuffer::<f32>::zeroed(device, per + 1).unwrap();
        let form = |comm: &RankCommunicator| comm.last_ran().map(|r| r.form);
        let mut forms = Vec::new();
        // Rank 1 is 2 s late: the others' first calls return once enqueued.
        enqueued_before_a_late_peer(rank, || {
            // SAFETY: every buffer is untouched until the stream is synchronised below.
            unsafe { comm.enqueue_all_reduce_in_place_on(&mut in_place, op, &stream) }.unwrap();
            forms.push(form(&comm));
            // SAFETY: as above.
            unsafe { comm.enqueue_all_reduce_on(&input, &mut output, op, &stream) }.unwrap();
            forms.push(form(&comm));
            // SAFETY: as above.
            unsafe { comm.enqueue_all_reduce_in_place_on(&mut two_shot, op, &stream) }.unwrap();
            forms.push(form(&comm));
            let ag = Collective::AllGather;
            // SAFETY: as above.
            unsafe { comm.enqueue_collective(&ag, Some(&mine), Some(&mut all), op, &stream) }
                .unwrap();
            forms.push(form(&comm));
            let raw = ringreduce::device::CallerStream::of(&stream);
            // SAFETY: as above.
            unsafe { comm.enqueue_send_recv(&ring, &[&mine], &mut [&mut got], raw) }.unwrap();
            forms.push(form(&comm));
            let sends: Vec<&GpuBuffer<f32>> = to_each.iter().collect();
            let mut recvs: Vec<&mut GpuBuffer<f32>> = from_each.iter_mut().collect();
            // SAFETY: as above.
            unsafe { comm.enqueue_send_recv(&everyone, &sends, &mut recvs, raw) }.unwrap();
            forms.push(form(&comm));
            let sends: &[&GpuBuffer<f32>] = if rank == 2 { &[&pair_send] } else { &[] };
            let mut recv = [&mut pair_recv];
            let recvs: &mut [&mut GpuBuffer<f32>] = if rank == 0 { &mut recv } else { &mut [] };
            // SAFETY: as above.
            unsafe { comm.enqueue_send_recv(&pair, sends, recvs, raw) }.unwrap();
            forms.push(form(&comm));
        });
        let kernels = [
            Form::OneShotKernel,
            Form::OneShotKernel,
            Form::TwoShotKernel,
            Form::StepsKernel,
            Form::StepsKernel,
            Form::StepsKernel,
            Form::StepsKernel,
        ];
        assert_eq!(forms, kernels.map(Some), "rank {rank}");
        stream.synchronize().unwrap();
        comm.synchronize().unwrap();
        assert_eq!(
            in_place.to_host().unwrap(),
            want(small),
            "rank {rank} in place"
        );
        assert_eq!(
            output.to_host().unwrap(),
            want(small),
            "rank {rank} out of place"
        );
        assert_eq!(
            two_shot.to_host().unwrap(),
            want(large),
            "rank {rank} two-shot"
        );
        let want_ag: Vec<f32> = (0..world).flat_map(|r| values(op, r, per)).collect();
        assert_eq!(all.to_host().unwrap(), want_ag, "rank {rank} all-gather");
        let before = (rank + world - 1) % world;
        assert_eq!(
            got.to_host().unwrap(),
            values(op, before, per),
            "rank {rank} send/recv"
        );
        for (from, buf) in from_each.iter().enumerate() {
            assert_eq!(
                buf.to_host().unwrap(),
                values(op, from, uneven(from, rank)),
                "rank {rank}'s receive from {from}"
            );
        }
        let untouched = vec![0.0; per + 1];
        let pair_want = if rank == 0 {
            values(op, 2, per + 1)
        } else {
            untouched
        };
        assert_eq!(
            pair_recv.to_host().unwrap(),
            pair_want,
            "rank {rank}'s pair"
        );
        // A first call of two new read one-shot shapes: rank 1 calls 44 elements more than a
        // quarter million, the others 24.
        let ran =
            first_call_mismatch_is_named_by_the_gpus(rank, &mut comm, &stream, device, 1 << 18);
        assert_eq!(ran, Some(Form::OneShotKernel), "rank {rank}");
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "every_kernel_forms_first_call_returns_before_a_late_peer_and_the_gpu_names_a_first_call_mismatch",
        3,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(120));
}

/// GPUs that do not reach each other (`Transport::Staged`; ranks sharing GPU 0 stand in, every
/// buffer a peer touches in pinned host memory): every collective's first call is enqueued
/// before a late peer — the all-reduce's staged one-shot at every size (80 MiB as two pieces),
/// the others' steps kernel over the host arenas, a pair some rank takes no part in among them
/// — exact, and a first-call mismatch is named by the GPUs.
#[test]
fn staged_first_calls_of_every_collective_return_before_a_late_peer() {
    use ringreduce::Form;
    if let Some(env) = as_rank() {
        let (rank, world, device) = (env.rank, env.world, this_gpu(&env));
        let config = CudaConfig {
            transport: ringreduce::Transport::Staged,
            ..config(Algorithm::Auto)
        };
        let id = env.unique_id().unwrap();
        let mut comm = RankCommunicator::gpu(&id, rank, world, device, config).unwrap();
        let stream = ringreduce::device::context(device)
            .unwrap()
            .new_stream()
            .unwrap();
        let op = ReduceOp::Sum;
        let (small, mid, large, per) = (1003, (1 << 18) + 5, (20 << 20) + 7, (1 << 16) + 3);
        let from = |len: usize| GpuBuffer::from_host(device, &values(op, rank, len)).unwrap();
        let zeroed = |len: usize| GpuBuffer::<f32>::zeroed(device, len).unwrap();
        let want = |k: std::ops::Range<usize>| -> Vec<f32> {
            k.map(|k| expected_value(op, world, k)).collect()
        };
        let (mut in_place, input, mut output) = (from(small), from(mid), zeroed(mid));
        let mut pieces = from(large);
        let (mine, mut all) = (from(per), zeroed(world * per));
        let (blocks, mut block) = (from(world * per), zeroed(per));
        let ring: Vec<Transfer> = (0..world)
            .map(|from| Transfer {
                from,
                to: (from + 1) % world,
                count: per,
            })
            .collect();
        let mut got = zeroed(per);
        // A pair the late rank 1 takes no part in: rank 2 sends to rank 0.
        let pair = [Transfer {
            from: 2,
            to: 0,
            count: per + 1,
        }];
        let (pair_send, mut pair_recv) = (from(per + 1), zeroed(per + 1));
        let mut ran = Vec::new();
        let last = |comm: &RankCommunicator| comm.last_ran().map(|r| (r.form, r.pieces));
        enqueued_before_a_late_peer(rank, || {
            // SAFETY: every buffer is untouched until the stream is synchronised below.
            unsafe { comm.enqueue_all_reduce_in_place_on(&mut in_place, op, &stream) }.unwrap();
            ran.push(last(&comm));
            // SAFETY: as above.
            unsafe { comm.enqueue_all_reduce_on(&input, &mut output, op, &stream) }.unwrap();
            ran.push(last(&comm));
            // SAFETY: as above.
            unsafe { comm.enqueue_all_reduce_in_place_on(&mut pieces, op, &stream) }.unwrap();
            ran.push(last(&comm));
            for (c, send, recv) in [
                (Collective::AllGather, &mine, &mut all),
                (Collective::ReduceScatter, &blocks, &mut block),
            ] {
                // SAFETY: as above.
                unsafe { comm.enqueue_collective(&c, Some(send), Some(recv), op, &stream) }
                    .unwrap();
                ran.push(last(&comm));
            }
            let raw = ringreduce::device::CallerStream::of(&stream);
            // SAFETY: as above.
            unsafe { comm.enqueue_send_recv(&ring, &[&mine], &mut [&mut got], raw) }.unwrap();
            ran.push(last(&comm));
            let sends: &[&GpuBuffer<f32>] = if rank == 2 { &[&pair_send] } else { &[] };
            let mut recv = [&mut pair_recv];
            let recvs: &mut [&mut GpuBuffer<f32>] = if rank == 0 { &mut recv } else { &mut [] };
            // SAFETY: as above.
            unsafe { comm.enqueue_send_recv(&pair, sends, recvs, raw) }.unwrap();
            ran.push(last(&comm));
        });
        let (staged, steps) = (Some((Form::StagedKernel, 1)), Some((Form::StepsKernel, 1)));
        let two = Some((Form::StagedKernel, 2));
        assert_eq!(
            ran,
            [staged, staged, two, steps, steps, steps, steps],
            "rank {rank}"
        );
        stream.synchronize().unwrap();
        comm.synchronize().unwrap();
        assert_eq!(in_place.to_host().unwrap(), want(0..small), "rank {rank}");
        assert_eq!(output.to_host().unwrap(), want(0..mid), "rank {rank}");
        assert!(
            pieces.to_host().unwrap() == want(0..large),
            "rank {rank}: 80 MiB"
        );
        let want_ag: Vec<f32> = (0..world).flat_map(|r| values(op, r, per)).collect();
        assert_eq!(all.to_host().unwrap(), want_ag, "rank {rank} all-gather");
        let mine_of_sum = want(rank * per..(rank + 1) * per);
        assert_eq!(
            block.to_host().unwrap(),
            mine_of_sum,
            "rank {rank} reduce-scatter"
        );
        let before = (rank + world - 1) % world;
        assert_eq!(
            got.to_host().unwrap(),
            values(op, before, per),
            "rank {rank}"
        );
        let pair_want = match rank {
            0 => values(op, 2, per + 1),
            _ => vec![0.0; per + 1],
        };
        assert_eq!(
            pair_recv.to_host().unwrap(),
            pair_want,
            "rank {rank}'s pair"
        );
        let ran =
            first_call_mismatch_is_named_by_the_gpus(rank, &mut comm, &stream, device, 1 << 18);
        assert_eq!(ran, Some(Form::StagedKernel), "rank {rank}");
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "staged_first_calls_of_every_collective_return_before_a_late_peer",
        3,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(120));
}

#[test]
fn large_calls_and_sends_return_before_a_late_peer_and_run_as_kernels() {
    use ringreduce::Form;
    if let Some(env) = as_rank() {
        let (rank, world, device, mut comm, stream) = auto_rank_with_stream(&env);
        let op = ReduceOp::Sum;
        // Above the sizes where Auto ran the ring across processes (the all-reduce's one-shot
        // limit, 32 MiB × 2/n; the other collectives' 4 MiB crossing a rank's links).
        let count = (8 << 20) + 5;
        let per = (2 << 20) + 3;
        let want_ar: Vec<f32> = (0..count).map(|k| expected_value(op, world, k)).collect();
        let want_ag: Vec<f32> = (0..world).flat_map(|r| values(op, r, per)).collect();
        let mut buf = GpuBuffer::from_host(device, &values(op, rank, count)).unwrap();
        let mine = GpuBuffer::from_host(device, &values(op, rank, per)).unwrap();
        let mut all = GpuBuffer::<f32>::zeroed(device, world * per).unwrap();
        // A pipeline's ring of sends: rank r to r + 1, of one count each.
        let ring: Vec<Transfer> = (0..world)
            .map(|from| Transfer {
                from,
                to: (from + 1) % world,
                count: per,
            })
            .collect();
        let before = (rank + world - 1) % world;
        let mut got = GpuBuffer::<f32>::zeroed(device, per).unwrap();
        // Each shape prepared by a first call, in step (those meet on the hosts).
        comm.all_reduce_in_place(&mut buf, op).unwrap();
        comm.collective(&Collective::AllGather, Some(&mine), Some(&mut all), op)
            .unwrap();
        assert_eq!(all.to_host().unwrap(), want_ag, "rank {rank} all-gather");
        let form = |comm: &RankCommunicator| comm.last_ran().map(|r| r.form);
        assert_eq!(form(&comm), Some(Form::StepsKernel), "rank {rank}");
        comm.send_recv(&ring, &[&mine], &mut [&mut got]).unwrap();
        assert_eq!(
            got.to_host().unwrap(),
            values(op, before, per),
            "rank {rank}"
        );
        assert_eq!(
            form(&comm),
            Some(Form::StepsKernel),
            "rank {rank} send/recv"
        );
        buf.copy_from_host(&values(op, rank, count)).unwrap();
        all.copy_from_host(&vec![0.0; world * per]).unwrap();
        got.copy_from_host(&vec![0.0; per]).unwrap();
        // Rank 1 is 2 s late: the others' calls return once enqueued.
        enqueued_before_a_late_peer(rank, || {
            // SAFETY: `buf`, `mine`, `all` and `got` are untouched until the stream is
            // synchronised.
            unsafe { comm.enqueue_all_reduce_in_place_on(&mut buf, op, &stream) }.unwrap();
            assert_eq!(form(&comm), Some(Form::TwoShotKernel), "rank {rank}");
            let ag = Collective::AllGather;
            // SAFETY: as above.
            unsafe { comm.enqueue_collective(&ag, Some(&mine), Some(&mut all), op, &stream) }
                .unwrap();
            let raw = ringreduce::device::CallerStream::of(&stream);
            // SAFETY: as above (`got` too).
            unsafe { comm.enqueue_send_recv(&ring, &[&mine], &mut [&mut got], raw) }.unwrap();
            assert_eq!(
                form(&comm),
                Some(Form::StepsKernel),
                "rank {rank} send/recv"
            );
            // A collective of no elements runs nothing and meets no one (NCCL discards it).
            let mut none = buf.view_mut(0, 0).unwrap();
            // SAFETY: as above.
            unsafe { comm.enqueue_all_reduce_in_place_on(&mut none, op, &stream) }.unwrap();
            assert_eq!(comm.last_ran(), None, "rank {rank}: an empty all-reduce");
        });
        stream.synchronize().unwrap();
        comm.synchronize().unwrap();
        assert_eq!(buf.to_host().unwrap(), want_ar, "rank {rank} all-reduce");
        assert_eq!(all.to_host().unwrap(), want_ag, "rank {rank} all-gather");
        assert_eq!(
            got.to_host().unwrap(),
            values(op, before, per),
            "rank {rank} send/recv"
        );
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "large_calls_and_sends_return_before_a_late_peer_and_run_as_kernels",
        3,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(180));
}

#[test]
fn large_first_calls_are_gated_before_a_late_peer_an_all_reduce_in_pieces() {
    use ringreduce::Form;
    if let Some(env) = as_rank() {
        let (rank, world, device, mut comm, stream) = auto_rank_with_stream(&env);
        let op = ReduceOp::Sum;
        // First calls beyond a 64 MiB arena: 160 MiB in place (pieces of 64 MiB), 80 MiB out of
        // place (pieces of 32 MiB input and output) — each piece prepared alone and gated.
        let (in_place_count, out_count) = ((40 << 20) + 5, (20 << 20) + 3);
        let want = |count: usize| -> Vec<f32> {
            (0..count).map(|k| expected_value(op, world, k)).collect()
        };
        let mut buf = GpuBuffer::from_host(device, &values(op, rank, in_place_count)).unwrap();
        let input = GpuBuffer::from_host(device, &values(op, rank, out_count)).unwrap();
        let mut output = GpuBuffer::<f32>::zeroed(device, out_count).unwrap();
        // An all-gather of 48 MiB a rank into 144 MiB: only its input is copied into the arena
        // (its peers read nothing else), so it fits whole.
        let per = (12 << 20) + 1;
        let mine = GpuBuffer::from_host(device, &values(op, rank, per)).unwrap();
        let mut all = GpuBuffer::<f32>::zeroed(device, world * per).unwrap();
        // A broadcast from rank 1 out of place and a reduce to rank 2 in place, 80 MiB each: in
        // two pieces of the steps kernel.
        let long = (20 << 20) + 7;
        let source = GpuBuffer::from_host(device, &values(op, rank, long)).unwrap();
        let mut copy = GpuBuffer::<f32>::zeroed(device, long).unwrap();
        let mut summed = GpuBuffer::from_host(device, &values(op, rank, long)).unwrap();
        let mut ran = Vec::new();
        enqueued_before_a_late_peer(rank, || {
            // SAFETY: the buffers are untouched until the stream is synchronised below.
            unsafe { comm.enqueue_all_reduce_in_place_on(&mut buf, op, &stream) }.unwrap();
            ran.push(comm.last_ran().map(|r| (r.form, r.pieces, r.copied)));
            // SAFETY: as above.
            unsafe { comm.enqueue_all_reduce_on(&input, &mut output, op, &stream) }.unwrap();
            ran.push(comm.last_ran().map(|r| (r.form, r.pieces, r.copied)));
            let ag = Collective::AllGather;
            // SAFETY: as above.
            unsafe { comm.enqueue_collective(&ag, Some(&mine), Some(&mut all), op, &stream) }
                .unwrap();
            ran.push(comm.last_ran().map(|r| (r.form, r.pieces, r.copied)));
            let bcast = Collective::Broadcast { root: 1 };
            let from = (rank == 1).then_some(&source);
            // SAFETY: as above.
            unsafe { comm.enqueue_collective(&bcast, from, Some(&mut copy), op, &stream) }.unwrap();
            ran.push(comm.last_ran().map(|r| (r.form, r.pieces, r.copied)));
            let reduce = Collective::Reduce { root: 2 };
            // SAFETY: as above.
            unsafe { comm.enqueue_collective_in_place(&reduce, &mut summed, op, &stream) }.unwrap();
            ran.push(comm.last_ran().map(|r| (r.form, r.pieces, r.copied)));
        });
        assert_eq!(
            ran,
            [
                Some((Form::TwoShotKernel, 3, true)),
                Some((Form::TwoShotKernel, 3, true)),
                Some((Form::StepsKernel, 1, true)),
                Some((Form::StepsKernel, 2, true)),
                Some((Form::StepsKernel, 2, true)),
            ],
            "rank {rank}"
        );
        stream.synchronize().unwrap();
        comm.synchronize().unwrap();
        assert!(
            buf.to_host().unwrap() == want(in_place_count),
            "rank {rank} in place"
        );
        assert!(
            output.to_host().unwrap() == want(out_count),
            "rank {rank} out of place"
        );
        let want_ag: Vec<f32> = (0..world).flat_map(|r| values(op, r, per)).collect();
        assert!(all.to_host().unwrap() == want_ag, "rank {rank} all-gather");
        assert!(
            copy.to_host().unwrap() == values(op, 1, long),
            "rank {rank} broadcast"
        );
        if rank == 2 {
            assert!(
                summed.to_host().unwrap() == want(long),
                "rank {rank} reduce"
            );
        }
        // Whole calls that differ only in their last piece are named at the first, before any
        // piece touches a buffer: by the call itself where a piece's gate failed before the
        // next piece was published, else by the next synchronisation.
        let (rank_1, others) = ((40 << 20) + 44, (40 << 20) + 24);
        let len = if rank == 1 { rank_1 } else { others };
        let mut buf = GpuBuffer::from_host(device, &vec![2.0f32; len]).unwrap();
        // SAFETY: `buf` is untouched until the stream is synchronised below.
        let called = unsafe { comm.enqueue_all_reduce_in_place_on(&mut buf, op, &stream) };
        stream.synchronize().unwrap();
        let err = match called {
            Err(err) => err,
            Ok(()) => comm.synchronize().unwrap_err(),
        };
        assert_rank_1_mismatch(rank, &err, &rank_1.to_string(), &others.to_string());
        assert!(
            buf.to_host().unwrap() == vec![2.0; len],
            "rank {rank}: untouched"
        );
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "large_first_calls_are_gated_before_a_late_peer_an_all_reduce_in_pieces",
        3,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(200));
}

#[test]
fn large_block_first_calls_run_in_strided_pieces_before_a_late_peer() {
    use ringreduce::Form;
    if let Some(env) = as_rank() {
        let (rank, world, device, mut comm, stream) = auto_rank_with_stream(&env);
        let op = ReduceOp::Sum;
        // Reduce-scatters, all-gathers and an all-to-all whose copied buffers exceed a 64 MiB
        // arena (16 M f32): each runs as pieces of its blocks, every caller's buffer copied in
        // and out block by block — prepared alone and gated, so enqueued before rank 1 arrives.
        let (rs, rs_in_place) = ((6 << 20) + 5, (6 << 20) + 3);
        let (ag, ag_in_place, a2a) = ((17 << 20) + 1, (6 << 20) + 1, (6 << 20) + 9);
        let rs_input = GpuBuffer::from_host(device, &values(op, rank, world * rs)).unwrap();
        let mut rs_output = GpuBuffer::<f32>::zeroed(device, rs).unwrap();
        let mut rs_buf =
            GpuBuffer::from_host(device, &values(op, rank, world * rs_in_place)).unwrap();
        let ag_input = GpuBuffer::from_host(device, &values(op, rank, ag)).unwrap();
        let mut ag_output = GpuBuffer::<f32>::zeroed(device, world * ag).unwrap();
        let mut own_block = vec![0.0f32; world * ag_in_place];
        own_block[rank * ag_in_place..(rank + 1) * ag_in_place].copy_from_slice(&values(
            op,
            rank,
            ag_in_place,
        ));
        let mut ag_buf = GpuBuffer::from_host(device, &own_block).unwrap();
        let a2a_input = GpuBuffer::from_host(device, &values(op, rank, world * a2a)).unwrap();
        let mut a2a_output = GpuBuffer::<f32>::zeroed(device, world * a2a).unwrap();
        let mut ran = Vec::new();
        enqueued_before_a_late_peer(rank, || {
            let (reduce_scatter, all_gather) = (Collective::ReduceScatter, Collective::AllGather);
            // SAFETY: the buffers are untouched until the stream is synchronised below.
            unsafe {
                comm.enqueue_collective(
                    &reduce_scatter,
                    Some(&rs_input),
                    Some(&mut rs_output),
                    op,
                    &stream,
                )
            }
            .unwrap();
            ran.push(comm.last_ran().map(|r| (r.form, r.pieces, r.copied)));
            // SAFETY: as above.
            unsafe { comm.enqueue_collective_in_place(&reduce_scatter, &mut rs_buf, op, &stream) }
                .unwrap();
            ran.push(comm.last_ran().map(|r| (r.form, r.pieces, r.copied)));
            // SAFETY: as above.
            unsafe {
                comm.enqueue_collective(
                    &all_gather,
                    Some(&ag_input),
                    Some(&mut ag_output),
                    op,
                    &stream,
                )
            }
            .unwrap();
            ran.push(comm.last_ran().map(|r| (r.form, r.pieces, r.copied)));
            // SAFETY: as above.
            unsafe { comm.enqueue_collective_in_place(&all_gather, &mut ag_buf, op, &stream) }
                .unwrap();
            ran.push(comm.last_ran().map(|r| (r.form, r.pieces, r.copied)));
            let all_to_all = Collective::AllToAll;
            // SAFETY: as above.
            unsafe {
                comm.enqueue_collective(
                    &all_to_all,
                    Some(&a2a_input),
                    Some(&mut a2a_output),
                    op,
                    &stream,
                )
            }
            .unwrap();
            ran.push(comm.last_ran().map(|r| (r.form, r.pieces, r.copied)));
        });
        let steps = |pieces| Some((Form::StepsKernel, pieces, true));
        assert_eq!(
            ran,
            [steps(2), steps(2), steps(5), steps(2), steps(3)],
            "rank {rank}"
        );
        stream.synchronize().unwrap();
        comm.synchronize().unwrap();
        let block_of_sum = |count: usize| -> Vec<f32> {
            (0..count)
                .map(|k| expected_value(op, world, rank * count + k))
                .collect()
        };
        assert!(
            rs_output.to_host().unwrap() == block_of_sum(rs),
            "rank {rank} reduce-scatter"
        );
        let in_place = rs_buf.to_host().unwrap();
        let mine = &in_place[rank * rs_in_place..(rank + 1) * rs_in_place];
        assert!(
            mine == block_of_sum(rs_in_place),
            "rank {rank} reduce-scatter in place"
        );
        let gathered =
            |per: usize| -> Vec<f32> { (0..world).flat_map(|r| values(op, r, per)).collect() };
        assert!(
            ag_output.to_host().unwrap() == gathered(ag),
            "rank {rank} all-gather"
        );
        assert!(
            ag_buf.to_host().unwrap() == gathered(ag_in_place),
            "rank {rank} all-gather in place"
        );
        let exchanged: Vec<f32> = (0..world)
            .flat_map(|from| (0..a2a).map(move |k| input_value(op, from, rank * a2a + k)))
            .collect();
        assert!(
            a2a_output.to_host().unwrap() == exchanged,
            "rank {rank} all-to-all"
        );
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "large_block_first_calls_run_in_strided_pieces_before_a_late_peer",
        3,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(200));
}

#[test]
fn long_and_fanned_in_send_recvs_run_in_pieces_before_a_late_peer() {
    use ringreduce::Form;
    if let Some(env) = as_rank() {
        let (rank, _, device, mut comm, stream) = auto_rank_with_stream(&env);
        let t = |from, to, count| Transfer { from, to, count };
        // A pipeline's sends, the first longer than a 64 MiB arena (16 M f32): two pieces, the
        // first rank 0 → 1 alone (rank 2 takes no part), the second the rest of it and 1 → 2.
        let pipeline = [t(0, 1, (20 << 20) + 3), t(1, 2, 2 << 20)];
        // A fan-in of ten sends to rank 1, from ranks 0 and 2 in turn: more receives than the
        // steps kernel runs (eight), so two pieces.
        let fan_in: Vec<Transfer> = (0..10).map(|i| t(2 * (i % 2), 1, 1000 + i)).collect();
        // Transfer i's payload: distinct per transfer, exact in f32.
        let payload = |i: usize, count: usize| -> Vec<f32> {
            (0..count).map(|k| (i * 1000 + k % 997) as f32).collect()
        };
        let ends = |list: &[Transfer]| {
            let sends: Vec<GpuBuffer<f32>> = (list.iter().enumerate())
                .filter(|(_, x)| x.from == rank)
                .map(|(i, x)| GpuBuffer::from_host(device, &payload(i, x.count)).unwrap())
                .collect();
            let recvs: Vec<GpuBuffer<f32>> = (list.iter())
                .filter(|x| x.to == rank)
                .map(|x| GpuBuffer::<f32>::zeroed(device, x.count).unwrap())
                .collect();
            (sends, recvs)
        };
        let (mut lists, mut ran) = (Vec::new(), Vec::new());
        for list in [&pipeline[..], &fan_in[..]] {
            lists.push((list, ends(list)));
        }
        enqueued_before_a_late_peer(rank, || {
            let raw = ringreduce::device::CallerStream::of(&stream);
            for (list, (sends, recvs)) in &mut lists {
                let sends: Vec<&GpuBuffer<f32>> = sends.iter().collect();
                let mut recvs: Vec<&mut GpuBuffer<f32>> = recvs.iter_mut().collect();
                // SAFETY: every buffer is untouched until the stream is synchronised below.
                unsafe { comm.enqueue_send_recv(list, &sends, &mut recvs, raw) }.unwrap();
                ran.push(comm.last_ran().map(|r| (r.form, r.pieces)));
            }
        });
        let pieces = Some((Form::StepsKernel, 2));
        assert_eq!(ran, [pieces, pieces], "rank {rank}");
        stream.synchronize().unwrap();
        comm.synchronize().unwrap();
        for (list, (_, recvs)) in &lists {
            let mine = (list.iter().enumerate()).filter(|(_, x)| x.to == rank);
            for ((i, x), got) in mine.zip(recvs) {
                let want = payload(i, x.count);
                assert!(got.to_host().unwrap() == want, "rank {rank}'s receive {i}");
            }
        }
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "long_and_fanned_in_send_recvs_run_in_pieces_before_a_late_peer",
        3,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(120));
}

#[test]
fn symmetric_registrations_run_without_a_meeting_and_the_gpus_check_the_offsets() {
    if let Some(env) = as_rank() {
        let (rank, world, device, mut comm, stream) = auto_rank_with_stream(&env);
        let op = ReduceOp::Sum;
        let (space, count, at) = (1 << 16, 1000, 256);
        let mut win = GpuBuffer::<f32>::zeroed(device, space).unwrap();
        // SAFETY: the communicator is closed below, before `win` is dropped.
        let registration = unsafe { comm.register_symmetric(&win) }.unwrap();
        let want: Vec<f32> = (0..count).map(|k| expected_value(op, world, k)).collect();
        let mine = values(op, rank, count);
        let fill = |win: &mut GpuBuffer<f32>, from: usize| {
            let mut all = vec![0.0f32; space];
            all[from..from + count].copy_from_slice(&mine);
            win.copy_from_host(&all).unwrap();
        };
        let ran = |comm: &RankCommunicator| comm.last_ran().map(|r| (r.registered, r.copied));
        let on_registration = Some((true, false));
        // The shape's first call is prepared with the peers (met on the hosts).
        fill(&mut win, at);
        comm.all_reduce_in_place(&mut win.view_mut(at, count).unwrap(), op)
            .unwrap();
        assert_eq!(
            win.to_host().unwrap()[at..at + count],
            want[..],
            "rank {rank}"
        );
        assert_eq!(ran(&comm), on_registration, "rank {rank}");
        // Rank 1 is 2 s late: each other rank decides alone that the call runs on the
        // registration (its peers' buffers at its own offset) and returns once enqueued.
        fill(&mut win, at);
        enqueued_before_a_late_peer(rank, || {
            let mut buf = win.view_mut(at, count).unwrap();
            // SAFETY: `win` is untouched until the stream is synchronised below.
            unsafe { comm.enqueue_all_reduce_in_place_on(&mut buf, op, &stream) }.unwrap();
        });
        assert_eq!(ran(&comm), on_registration, "rank {rank}: decided alone");
        stream.synchronize().unwrap();
        comm.synchronize().unwrap();
        assert_eq!(
            win.to_host().unwrap()[at..at + count],
            want[..],
            "rank {rank}"
        );
        // Rank 1 passes its buffer at another offset: every rank's GPU names the difference
        // before touching a peer's memory.
        let from = if rank == 1 { at + 64 } else { at };
        fill(&mut win, from);
        let before = win.to_host().unwrap();
        {
            let mut buf = win.view_mut(from, count).unwrap();
            // SAFETY: as above.
            unsafe { comm.enqueue_all_reduce_in_place_on(&mut buf, op, &stream) }.unwrap();
        }
        stream.synchronize().unwrap();
        let err = comm.synchronize().unwrap_err();
        match &err {
            ringreduce::Error::CallMismatch {
                rank: q,
                theirs,
                ours,
                ..
            } => {
                assert_eq!(*q, if rank == 1 { 0 } else { 1 }, "{err}");
                let (offset, other) = match rank {
                    1 => ("1280", "1024"),
                    _ => ("1024", "1280"),
                };
                assert!(ours.contains(offset) && theirs.contains(other), "{err}");
            }
            other => panic!("rank {rank}: {other}"),
        }
        assert_eq!(win.to_host().unwrap(), before, "rank {rank}: untouched");
        // The communicator closes (and with it the registration) before `win` is freed.
        drop(registration);
        drop(comm);
        drop(win);
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "symmetric_registrations_run_without_a_meeting_and_the_gpus_check_the_offsets",
        3,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(120));
}

#[test]
fn a_watchdog_polling_health_during_another_threads_graph_capture_breaks_neither() {
    use cudarc::driver::sys;
    if let Some(env) = as_rank() {
        let device = this_gpu(&env);
        let id = env.unique_id().unwrap();
        let mut comm =
            RankCommunicator::gpu(&id, env.rank, env.world, device, config(Algorithm::Auto))
                .unwrap();
        let mut buf = GpuBuffer::from_host(device, &[1.0f32; 64]).unwrap();
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
        let ctx = ringreduce::device::context(device).unwrap();
        let (captured, other) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
        let global = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        let end = |what: &str| {
            let ended = captured.end_capture(sys::CUgraphInstantiate_flags(0));
            assert!(
                ended.is_ok(),
                "rank {}: {what}: {:?}",
                env.rank,
                ended.err()
            );
        };
        // PyTorch's watchdog asks ncclCommGetAsyncError while the main thread captures a graph
        // in CUDA's default (global) mode: the poll must neither fail nor break the capture.
        captured.begin_capture(global).unwrap();
        let comm = std::sync::Mutex::new(comm);
        let polled = std::thread::scope(|s| s.spawn(|| comm.lock().unwrap().async_error()).join());
        end("the capture beside the communicator's poll");
        assert!(
            polled.unwrap().is_none(),
            "rank {}: the poll failed",
            env.rank
        );
        let mut comm = comm.into_inner().unwrap();
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
        assert_eq!(
            buf.to_host().unwrap(),
            vec![(env.world * env.world) as f32; 64]
        );
        // Why the poll needs its care: the same query made plainly from another thread is
        // refused while the capture runs (the hazard, seen on this driver).
        captured.begin_capture(global).unwrap();
        let raw = other.cu_stream() as usize;
        let plain = std::thread::scope(|s| {
            s.spawn(|| {
                ctx.bind_to_thread().unwrap();
                // SAFETY: `other` is a live stream of the context bound above.
                unsafe { sys::cuStreamQuery(raw as sys::CUstream) }
            })
            .join()
            .unwrap()
        });
        let _ = captured.end_capture(sys::CUgraphInstantiate_flags(0));
        assert_ne!(
            plain,
            sys::CUresult::CUDA_SUCCESS,
            "rank {}: a plain cuStreamQuery beside a global capture was allowed: the hazard \
             `device::capture_relaxed` guards against is not there on this driver",
            env.rank
        );
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "a_watchdog_polling_health_during_another_threads_graph_capture_breaks_neither",
        2,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(120));
}

#[test]
fn a_call_one_rank_captures_and_its_peer_runs_eagerly_is_a_named_mismatch() {
    use cudarc::driver::sys;
    if let Some(env) = as_rank() {
        let (rank, world, device, mut comm, stream) = auto_rank_with_stream(&env);
        // A first call of a new shape: rank 0 captures it into a graph, rank 1 runs it — a pair
        // the library cannot run (replays are not checked against eager calls): named on both,
        // nothing touched. Both ranks prepare the shape alike (alone, in the arenas).
        let per = 1000;
        let mine = GpuBuffer::from_host(device, &values(ReduceOp::Sum, rank, per)).unwrap();
        let mut all = GpuBuffer::<f32>::zeroed(device, world * per).unwrap();
        let ag = Collective::AllGather;
        let sum = ReduceOp::Sum;
        let err = if rank == 0 {
            let relaxed = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
            stream.begin_capture(relaxed).unwrap();
            // SAFETY: the buffers outlive the capture, which is never launched.
            let called =
                unsafe { comm.enqueue_collective(&ag, Some(&mine), Some(&mut all), sum, &stream) };
            let _ = stream.end_capture(sys::CUgraphInstantiate_flags(0));
            called.unwrap_err()
        } else {
            // SAFETY: the buffers are untouched until the stream is synchronised below.
            unsafe { comm.enqueue_collective(&ag, Some(&mine), Some(&mut all), sum, &stream) }
                .unwrap();
            stream.synchronize().unwrap();
            comm.synchronize().unwrap_err()
        };
        match (rank, &err) {
            (0, ringreduce::Error::CallMismatch { rank: 1, ours, .. }) => {
                assert!(ours.contains("captured"), "{err}");
            }
            (
                1,
                ringreduce::Error::CallMismatch {
                    rank: 0, theirs, ..
                },
            ) => {
                assert!(theirs.contains("captured"), "{err}");
            }
            // Rank 0's failure, told to its peer before the peer's GPU compared the calls.
            (1, ringreduce::Error::RankFailed { rank: 0, .. }) => {}
            _ => panic!("rank {rank}: {err}"),
        }
        assert_eq!(
            all.to_host().unwrap(),
            vec![0.0; world * per],
            "rank {rank}: untouched"
        );
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "a_call_one_rank_captures_and_its_peer_runs_eagerly_is_a_named_mismatch",
        2,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(120));
}

#[test]
fn an_abort_from_another_thread_releases_a_waiting_call_and_names_the_rank() {
    if let Some(env) = as_rank() {
        let device = this_gpu(&env);
        let id = env.unique_id().unwrap();
        let mut comm =
            RankCommunicator::gpu(&id, env.rank, env.world, device, config(Algorithm::Auto))
                .unwrap();
        let mut buf = GpuBuffer::from_host(device, &[1.0f32; 64]).unwrap();
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
        if env.rank == 0 {
            // Rank 1 is late for the next call: a watchdog gives this rank up meanwhile.
            let handle = comm.abort_handle();
            let watchdog = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                handle.abort();
            });
            let started = std::time::Instant::now();
            let err = comm
                .all_reduce_in_place(&mut buf, ReduceOp::Sum)
                .unwrap_err();
            assert!(started.elapsed() < Duration::from_secs(5), "{err}");
            assert!(
                matches!(err, ringreduce::Error::RankFailed { rank: 0, .. }),
                "{err}"
            );
            watchdog.join().unwrap();
            comm.abort();
        } else {
            std::thread::sleep(Duration::from_secs(1));
            let err = comm
                .all_reduce_in_place(&mut buf, ReduceOp::Sum)
                .unwrap_err();
            assert!(
                matches!(err, ringreduce::Error::RankFailed { rank: 0, .. }),
                "{err}"
            );
        }
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "an_abort_from_another_thread_releases_a_waiting_call_and_names_the_rank",
        2,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(120));
}

/// One rank's part of the stream test: all-reduces ordered on this process's own stream between
/// copies queued there, then a CUDA graph captured on it (copy in, all-reduce, copy out)
/// replayed 100 times with new inputs each time, on `algorithm`.
fn streams_and_graphs_on_this_gpu(
    rank: usize,
    world: usize,
    device: usize,
    algorithm: Algorithm,
    id: &UniqueId,
) {
    use cudarc::driver::{result, sys};
    let count = 4096;
    let op = ReduceOp::Sum;
    let input = |rep: usize, r: usize| -> Vec<i32> {
        (0..count)
            .map(|k| input_value::<i32>(op, r, k) + rep as i32)
            .collect()
    };
    let want = |rep: usize| -> Vec<i32> {
        (0..count)
            .map(|k| (0..world).map(|r| input(rep, r)[k]).sum())
            .collect()
    };
    let mut comm = RankCommunicator::gpu(id, rank, world, device, config(algorithm)).unwrap();
    let ctx = ringreduce::device::context(device).unwrap();
    let stream = ctx.new_stream().unwrap();
    let mut buf = GpuBuffer::<i32>::zeroed(device, count).unwrap();
    let upload = |dst: u64, data: &[i32]| {
        ctx.bind_to_thread().unwrap();
        // SAFETY: `dst` holds `count` i32; `data` lives until the stream is synchronised below.
        unsafe { result::memcpy_htod_async(dst, data, stream.cu_stream()) }.unwrap();
    };
    // Eager, on the stream: upload, all-reduce, three times, one synchronisation at the end
    // of each (the upload of the next round is queued after the collective on the stream).
    for rep in 0..3 {
        let data = input(rep, rank);
        upload(ringreduce::Buffer::address(&buf), &data);
        // SAFETY: `buf` is untouched until the stream is synchronised below.
        unsafe { comm.enqueue_all_reduce_in_place_on(&mut buf, op, &stream) }.unwrap();
        stream.synchronize().unwrap();
        comm.synchronize().unwrap();
        assert_eq!(
            buf.to_host().unwrap(),
            want(rep),
            "rank {rank} {algorithm:?} eager {rep}"
        );
    }
    // Out of place on the stream: an all-reduce, then an all-gather of its result's first
    // block, both enqueued behind the upload with one synchronisation.
    let source = GpuBuffer::<i32>::zeroed(device, count).unwrap();
    let mut reduced = GpuBuffer::<i32>::zeroed(device, count).unwrap();
    let block = count / 8;
    let mut gathered = GpuBuffer::<i32>::zeroed(device, block * world).unwrap();
    upload(ringreduce::Buffer::address(&source), &input(7, rank));
    // SAFETY: the three buffers are untouched until the stream is synchronised below.
    unsafe { comm.enqueue_all_reduce_on(&source, &mut reduced, op, &stream) }.unwrap();
    let first = reduced.view(0, block).unwrap();
    // SAFETY: as above.
    unsafe {
        comm.enqueue_collective(
            &Collective::AllGather,
            Some(&first),
            Some(&mut gathered),
            op,
            &stream,
        )
    }
    .unwrap();
    stream.synchronize().unwrap();
    comm.synchronize().unwrap();
    assert_eq!(
        reduced.to_host().unwrap(),
        want(7),
        "rank {rank} out of place"
    );
    let gathered_want: Vec<i32> = (0..world).flat_map(|_| want(7)[..block].to_vec()).collect();
    assert_eq!(
        gathered.to_host().unwrap(),
        gathered_want,
        "rank {rank} all-gather out of place"
    );
    // A graph: copy the source in, all-reduce, copy the result out; replayed with new sources.
    let src = GpuBuffer::<i32>::zeroed(device, count).unwrap();
    let out = GpuBuffer::<i32>::zeroed(device, count).unwrap();
    let bytes = count * 4;
    let (src_at, out_at) = (
        ringreduce::Buffer::address(&src),
        ringreduce::Buffer::address(&out),
    );
    let buf_at = ringreduce::Buffer::address(&buf);
    ctx.bind_to_thread().unwrap();
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .unwrap();
    // SAFETY: all three are live allocations of `bytes` on this GPU, used only by this graph.
    unsafe { result::memcpy_dtod_async(buf_at, src_at, bytes, stream.cu_stream()) }.unwrap();
    // SAFETY: `buf` outlives the graph's replays below.
    unsafe { comm.enqueue_all_reduce_in_place_on(&mut buf, op, &stream) }.unwrap();
    // SAFETY: as above.
    unsafe { result::memcpy_dtod_async(out_at, buf_at, bytes, stream.cu_stream()) }.unwrap();
    let graph = stream
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .unwrap()
        .expect("a graph");
    for rep in 0..100 {
        let data = input(rep + 10, rank);
        upload(src_at, &data);
        graph.launch().unwrap();
        stream.synchronize().unwrap();
        assert_eq!(
            out.to_host().unwrap(),
            want(rep + 10),
            "rank {rank} {algorithm:?} replay {rep}"
        );
    }
    comm.synchronize().unwrap();
}

#[test]
fn gpu_ranks_order_collectives_on_their_own_streams_and_graphs() {
    if let Some(env) = as_rank() {
        let device = this_gpu(&env);
        for (job, algorithm) in [Algorithm::Auto, Algorithm::Ring].into_iter().enumerate() {
            let id = LaunchEnv {
                run_id: Some(format!("{:?}-{job}", env.run_id)),
                ..env.clone()
            }
            .unique_id()
            .unwrap();
            streams_and_graphs_on_this_gpu(env.rank, env.world, device, algorithm, &id);
        }
        println!("rank {}: streams and graphs exact", env.rank);
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "gpu_ranks_order_collectives_on_their_own_streams_and_graphs",
        2,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(300));
}
