//! GPU ranks that each have their own communicator ([`RankCommunicator::gpu`]), one process per
//! GPU as torchrun runs them: every algorithm of the all-reduce and every other collective,
//! exact against the host reference (two and three processes), their memory crossing through
//! CUDA IPC handles; calls on each process's own stream and in its CUDA graphs; a killed rank
//! named; an abort from a watchdog thread releasing a waiting call; a mismatched call named on
//! every rank; a watchdog thread's health poll beside another thread's CUDA graph capture; a
//! call one rank captures and its peer runs eagerly named as a mismatch; registered buffers
//! (every collective without copies, a mixed call copying, pool memory refused; symmetric
//! registrations used without a meeting, a rank at another offset named by the GPUs); staged
//! rings through pinned host memory the processes share; two such ranks in one process refused
//! by name. Calls before a late peer are `tests/gpu_late_peers.rs`'. On a one-GPU machine the
//! ranks share GPU 0 (`allow_shared_device`). A machine without a GPU waives them.

use common::launch::{as_rank, expect_success, launch};
use common::ranks::{
    assert_rank_1_mismatch, auto_rank_with_stream, config, enqueued_before_a_late_peer, this_gpu,
    values,
};
use common::two_gpus_or_shared;
use ringreduce::plan::Collective;
use ringreduce::verify::{expected_value, input_value};
use ringreduce::{
    Algorithm, CudaConfig, GpuBuffer, LaunchEnv, RankCommunicator, ReduceOp, Transfer, UniqueId,
};
use std::time::Duration;

mod common;

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
        // Rank 1's offset (bytes) against the others'.
        assert_rank_1_mismatch(rank, &err, "1280", "1024");
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
