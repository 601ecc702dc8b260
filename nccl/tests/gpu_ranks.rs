//! The library's collectives as NCCL's callers make them — one process per rank, rank 0's
//! `ncclGetUniqueId` handed to the others (through a file here), `ncclCommInitRank` on the
//! thread's current GPU, every collective on a stream of the process's own with raw device
//! pointers — exact against the host's arithmetic, in place and out of place, with NCCL's
//! in-place rules (each rank choosing on its own); sends and receives in a group; a mismatched
//! call an error on every rank; non-blocking creation, `ncclCommAbort` releasing the waiting
//! ranks and a killed rank reported by `ncclCommGetAsyncError`; a window
//! (`ncclCommWindowRegister`) whose out-of-place all-reduce runs without copies until it is
//! deregistered (its in-place form copies).
//! The ranks share GPU 0 on a one-GPU machine (`RINGREDUCE_NCCL_ALLOW_SHARED_GPU=1`); a machine
//! without a GPU waives the test.

#[path = "../../tests/common/mod.rs"]
mod common;

use common::launch::{as_rank, expect_success};
#[path = "common/ranks.rs"]
mod ranks;
use ranks::{gpu_of, launch_job, ok, run_jobs, unique_id};
use ringreduce::GpuBuffer;
use ringreduce_nccl::abi::*;
use ringreduce_nccl::*;
use std::ffi::c_void;
use std::time::{Duration, Instant};

/// Rank `rank`'s input element `k`: small integers, exact in f32.
fn input(rank: usize, k: usize) -> f32 {
    ((rank * 7 + k * 3) % 11) as f32 - 5.0
}

/// One rank's part (module doc).
fn rank_part(rank: usize, world: usize, id_path: &std::path::Path) {
    let (device, stream) = gpu_of(rank, world);
    let raw = stream.cu_stream() as *mut c_void;
    let id = unique_id(rank, id_path);
    let mut comm: ncclComm_t = std::ptr::null_mut();
    // SAFETY: a writable handle.
    ok("init", unsafe {
        ncclCommInitRank(&mut comm, world as i32, id, rank as i32)
    });
    let count = 3000;
    let mine: Vec<f32> = (0..count).map(|k| input(rank, k)).collect();
    let every = |k: usize| (0..world).map(move |r| input(r, k));
    let sync = || {
        stream.synchronize().unwrap();
        // SAFETY: a live communicator.
        ok("finalize", unsafe { ncclCommFinalize(comm) });
    };
    let send = GpuBuffer::from_host(device, &mine).unwrap();
    let at = |b: &GpuBuffer<f32>| ringreduce::Buffer::address(b) as *mut c_void;

    // All-reduce: sum and max out of place, avg in place.
    for (op, fold) in [
        (
            ncclSum,
            every_sum as fn(&mut dyn Iterator<Item = f32>) -> f32,
        ),
        (ncclMax, every_max),
    ] {
        let recv = GpuBuffer::<f32>::zeroed(device, count).unwrap();
        // SAFETY: device buffers of `count` f32 on this GPU, kept until the stream is synced.
        ok("all-reduce", unsafe {
            ncclAllReduce(at(&send), at(&recv), count, ncclFloat32, op, comm, raw)
        });
        sync();
        let want: Vec<f32> = (0..count).map(|k| fold(&mut every(k))).collect();
        assert_eq!(
            recv.to_host().unwrap(),
            want,
            "rank {rank} all-reduce op {op}"
        );
    }
    // An all-reduce of `count` elements between device addresses of this GPU's, waited for.
    let all_reduce = |from: *mut c_void, into: *mut c_void, op| {
        // SAFETY: `count` f32 of device memory of this GPU at each, kept until the stream is
        // synced (below).
        ok("all-reduce", unsafe {
            ncclAllReduce(from, into, count, ncclFloat32, op, comm, raw)
        });
        sync();
    };
    let inplace = GpuBuffer::from_host(device, &mine).unwrap();
    all_reduce(at(&inplace), at(&inplace), ncclAvg);
    // A float avg is the sum multiplied by 1/world (the library's definition, src/element.rs).
    let want: Vec<f32> = (0..count)
        .map(|k| every(k).sum::<f32>() * (1.0 / world as f32))
        .collect();
    assert_eq!(inplace.to_host().unwrap(), want, "rank {rank} avg in place");

    // A window (NCCL's collective registration, `RankCommunicator::register`) of two halves:
    // an all-reduce from the first into the second runs on them without copies, exactly; one in
    // place (NCCL's form: the same pointer as both sides) copies, exactly; once the window is
    // deregistered, the first call copies, exactly.
    let windowed =
        GpuBuffer::from_host(device, &[mine.clone(), vec![0.0; count]].concat()).unwrap();
    let (first, second) = (
        at(&windowed),
        (at(&windowed) as usize + count * 4) as *mut c_void,
    );
    let mut window: *mut c_void = std::ptr::null_mut();
    // SAFETY: `2 count` f32 of device memory of this GPU, deregistered below before it is
    // freed.
    ok("window register", unsafe {
        ncclCommWindowRegister(comm, first, 2 * count * 4, &mut window, 1)
    });
    // SAFETY: a live communicator.
    let ran = || unsafe { last_ran(comm) }.expect("a call of a ringreduce communicator");
    let sum: Vec<f32> = (0..count).map(|k| every(k).sum()).collect();
    let world_sum: Vec<f32> = sum.iter().map(|v| v * world as f32).collect();
    for (round, from, registered, want) in [
        ("registered", first, true, &sum),
        ("in place", second, false, &world_sum),
        ("deregistered", first, false, &sum),
    ] {
        if round == "deregistered" {
            // SAFETY: the window registered above; every rank deregisters its own.
            ok("window deregister", unsafe {
                ncclCommWindowDeregister(comm, window)
            });
        }
        all_reduce(from, second, ncclSum);
        let got = windowed.to_host().unwrap();
        assert_eq!(&got[count..], &want[..], "rank {rank} window: {round}");
        assert_eq!(
            ran().registered,
            registered,
            "rank {rank} window: {round}: ran on the registered buffers"
        );
    }

    // Broadcast from the last rank; reduce (sum) to rank 0.
    let root = world - 1;
    let recv = GpuBuffer::<f32>::zeroed(device, count).unwrap();
    // SAFETY: as above (the send buffer is read on the root only).
    ok("broadcast", unsafe {
        ncclBroadcast(
            at(&send),
            at(&recv),
            count,
            ncclFloat32,
            root as i32,
            comm,
            raw,
        )
    });
    sync();
    let want: Vec<f32> = (0..count).map(|k| input(root, k)).collect();
    assert_eq!(recv.to_host().unwrap(), want, "rank {rank} broadcast");
    // In place on every rank (NCCL's ncclBcast): the root's buffer into every rank's.
    let same = GpuBuffer::from_host(device, &mine).unwrap();
    // SAFETY: as above; one buffer as both sides.
    ok("broadcast in place", unsafe {
        ncclBroadcast(
            at(&same),
            at(&same),
            count,
            ncclFloat32,
            root as i32,
            comm,
            raw,
        )
    });
    sync();
    assert_eq!(
        same.to_host().unwrap(),
        want,
        "rank {rank} broadcast in place"
    );
    let recv = GpuBuffer::<f32>::zeroed(device, count).unwrap();
    // SAFETY: as above (the receive buffer is written on the root only).
    ok("reduce", unsafe {
        ncclReduce(
            at(&send),
            at(&recv),
            count,
            ncclFloat32,
            ncclSum,
            0,
            comm,
            raw,
        )
    });
    sync();
    if rank == 0 {
        let want: Vec<f32> = (0..count).map(|k| every(k).sum()).collect();
        assert_eq!(recv.to_host().unwrap(), want, "reduce at the root");
    }

    // All-gather out of place, then in place (this rank's block of the receive buffer).
    let block = 500;
    let gathered_want: Vec<f32> = (0..world)
        .flat_map(|r| (0..block).map(move |k| input(r, k)))
        .collect();
    let part = GpuBuffer::from_host(device, &mine[..block]).unwrap();
    let all = GpuBuffer::<f32>::zeroed(device, block * world).unwrap();
    // SAFETY: as above.
    ok("all-gather", unsafe {
        ncclAllGather(at(&part), at(&all), block, ncclFloat32, comm, raw)
    });
    sync();
    assert_eq!(
        all.to_host().unwrap(),
        gathered_want,
        "rank {rank} all-gather"
    );
    let mut staged = vec![0f32; block * world];
    staged[rank * block..(rank + 1) * block].copy_from_slice(&mine[..block]);
    let all = GpuBuffer::from_host(device, &staged).unwrap();
    let own = (at(&all) as usize + rank * block * 4) as *mut c_void;
    // SAFETY: as above; `own` is this rank's block of `all` (NCCL's in-place all-gather).
    ok("all-gather in place", unsafe {
        ncclAllGather(own, at(&all), block, ncclFloat32, comm, raw)
    });
    sync();
    assert_eq!(
        all.to_host().unwrap(),
        gathered_want,
        "rank {rank} all-gather in place"
    );

    // Reduce-scatter out of place, then in place (this rank's block of the send buffer).
    let full: Vec<f32> = (0..block * world).map(|k| input(rank, k)).collect();
    let scattered_want: Vec<f32> = (0..block).map(|k| every(rank * block + k).sum()).collect();
    let src = GpuBuffer::from_host(device, &full).unwrap();
    let out = GpuBuffer::<f32>::zeroed(device, block).unwrap();
    // SAFETY: as above.
    ok("reduce-scatter", unsafe {
        ncclReduceScatter(at(&src), at(&out), block, ncclFloat32, ncclSum, comm, raw)
    });
    sync();
    assert_eq!(
        out.to_host().unwrap(),
        scattered_want,
        "rank {rank} reduce-scatter"
    );
    let src = GpuBuffer::from_host(device, &full).unwrap();
    let own = (at(&src) as usize + rank * block * 4) as *mut c_void;
    // SAFETY: as above; `own` is this rank's block of `src` (NCCL's in-place reduce-scatter).
    ok("reduce-scatter in place", unsafe {
        ncclReduceScatter(at(&src), own, block, ncclFloat32, ncclSum, comm, raw)
    });
    sync();
    let got = src.to_host().unwrap();
    assert_eq!(
        &got[rank * block..(rank + 1) * block],
        &scattered_want[..],
        "rank {rank} reduce-scatter in place"
    );

    // All-to-all: block j of this rank's send buffer to rank j.
    let src = GpuBuffer::from_host(device, &full).unwrap();
    let out = GpuBuffer::<f32>::zeroed(device, block * world).unwrap();
    // SAFETY: as above.
    ok("all-to-all", unsafe {
        ncclAlltoAll(at(&src), at(&out), block, ncclFloat32, comm, raw)
    });
    sync();
    let want: Vec<f32> = (0..world)
        .flat_map(|r| (0..block).map(move |k| input(r, rank * block + k)))
        .collect();
    assert_eq!(out.to_host().unwrap(), want, "rank {rank} all-to-all");

    // Send/recv in a group, as torch issues them: every rank sends block j of its buffer to rank
    // j and receives block i of its output from rank i (an all-to-all of sends and receives).
    let src = GpuBuffer::from_host(device, &full).unwrap();
    let out = GpuBuffer::<f32>::zeroed(device, block * world).unwrap();
    ok("group start", ncclGroupStart());
    for peer in 0..world {
        let from = (at(&src) as usize + peer * block * 4) as *const c_void;
        let into = (at(&out) as usize + peer * block * 4) as *mut c_void;
        // SAFETY: blocks of device buffers on this GPU, kept until the stream is synced.
        ok("send", unsafe {
            ncclSend(from, block, ncclFloat32, peer as i32, comm, raw)
        });
        // SAFETY: as above.
        ok("recv", unsafe {
            ncclRecv(into, block, ncclFloat32, peer as i32, comm, raw)
        });
    }
    ok("group end", ncclGroupEnd());
    sync();
    assert_eq!(
        out.to_host().unwrap(),
        want,
        "rank {rank} send/recv all-to-all"
    );

    // ncclBcast (PyTorch's broadcast): the root's buffer into every rank's, in place.
    let same = GpuBuffer::from_host(device, &full).unwrap();
    // SAFETY: as above.
    ok("bcast", unsafe {
        ncclBcast(at(&same), block, ncclFloat32, 0, comm, raw)
    });
    sync();
    let root_block: Vec<f32> = (0..block).map(|k| input(0, k)).collect();
    assert_eq!(
        &same.to_host().unwrap()[..block],
        &root_block[..],
        "rank {rank} bcast"
    );

    // Gather into the last rank, then scatter its blocks back out.
    let root = world - 1;
    let src = GpuBuffer::from_host(device, &full[..block]).unwrap();
    let gathered = GpuBuffer::<f32>::zeroed(device, block * world).unwrap();
    // SAFETY: as above (the receive buffer is written on the root only).
    ok("gather", unsafe {
        ncclGather(
            at(&src),
            at(&gathered),
            block,
            ncclFloat32,
            root as i32,
            comm,
            raw,
        )
    });
    sync();
    if rank == root {
        let want: Vec<f32> = (0..world)
            .flat_map(|r| (0..block).map(move |k| input(r, k)))
            .collect();
        assert_eq!(gathered.to_host().unwrap(), want, "gather at the root");
    }
    let scattered = GpuBuffer::<f32>::zeroed(device, block).unwrap();
    // SAFETY: as above (the send buffer is read on the root only).
    ok("scatter", unsafe {
        ncclScatter(
            at(&gathered),
            at(&scattered),
            block,
            ncclFloat32,
            root as i32,
            comm,
            raw,
        )
    });
    sync();
    let mine_block: Vec<f32> = (0..block).map(|k| input(rank, k)).collect();
    assert_eq!(
        scattered.to_host().unwrap(),
        mine_block,
        "rank {rank} scatter"
    );

    // A mismatched call (the count differs on rank 1): an error on every rank, nothing run —
    // from the call itself where the hosts compare it, or, where it is only enqueued (a small
    // all-reduce, even a shape's first call, is gated on the GPU), from the communicator's
    // async error once the GPU has compared it.
    let n = if rank == 1 { count - 1 } else { count };
    let before = inplace.to_host().unwrap();
    // SAFETY: as above.
    let result =
        unsafe { ncclAllReduce(at(&send), at(&inplace), n, ncclFloat32, ncclSum, comm, raw) };
    assert!(
        result == ncclInvalidUsage || result == ncclSuccess,
        "rank {rank} mismatch: {result}"
    );
    stream.synchronize().unwrap();
    assert_eq!(inplace.to_host().unwrap(), before, "rank {rank}: untouched");
    let mut async_error = ncclSuccess;
    // SAFETY: a live communicator and a writable result.
    ok("async error", unsafe {
        ncclCommGetAsyncError(comm, &mut async_error)
    });
    assert_ne!(
        async_error, ncclSuccess,
        "rank {rank}: the communicator is broken"
    );
    // SAFETY: a live communicator, destroyed once.
    ok("destroy", unsafe { ncclCommDestroy(comm) });
    println!("rank {rank}: every collective exact through NCCL's API");
}

fn every_sum(values: &mut dyn Iterator<Item = f32>) -> f32 {
    values.sum()
}

fn every_max(values: &mut dyn Iterator<Item = f32>) -> f32 {
    values.fold(f32::NEG_INFINITY, f32::max)
}

#[test]
fn ranks_as_processes_run_every_collective_through_nccls_api() {
    if let Some(env) = as_rank() {
        let path = std::path::PathBuf::from(std::env::var("RINGREDUCE_TEST_ID_FILE").unwrap());
        rank_part(env.rank, env.world, &path);
        return;
    }
    if common::two_gpus_or_shared().is_none() {
        return;
    }
    run_jobs(
        "ranks_as_processes_run_every_collective_through_nccls_api",
        &[],
    );
}

/// This process's rank's communicator on `id`, made as `config.blocking = 0` asks: the call
/// returns `ncclSuccess` or `ncclInProgress`, and `ncclCommGetAsyncError` is polled until it is
/// no longer `ncclInProgress` (NCCL's documented pattern for non-blocking communicators).
fn join_nonblocking(rank: usize, world: usize, id: ncclUniqueId) -> ncclComm_t {
    let mut config = ncclConfig_t {
        size: std::mem::size_of::<ncclConfig_t>(),
        magic: NCCL_CONFIG_MAGIC,
        version: 22800,
        blocking: 0,
        cgaClusterSize: NCCL_CONFIG_UNDEF_INT,
        minCTAs: NCCL_CONFIG_UNDEF_INT,
        maxCTAs: NCCL_CONFIG_UNDEF_INT,
        netName: std::ptr::null(),
        splitShare: NCCL_CONFIG_UNDEF_INT,
    };
    let mut comm: ncclComm_t = std::ptr::null_mut();
    // SAFETY: a writable handle and an initialised config.
    let made =
        unsafe { ncclCommInitRankConfig(&mut comm, world as i32, id, rank as i32, &mut config) };
    assert!(
        made == ncclSuccess || made == ncclInProgress,
        "rank {rank}: non-blocking creation returned {made}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut state = ncclSuccess;
        // SAFETY: a communicator being made (NCCL allows this call on one) and a writable result.
        ok("async error", unsafe {
            ncclCommGetAsyncError(comm, &mut state)
        });
        if state != ncclInProgress {
            assert_eq!(
                state, ncclSuccess,
                "rank {rank}: creation ended with {state}"
            );
            return comm;
        }
        assert!(
            Instant::now() < deadline,
            "rank {rank}: creation never ended"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits (at most 30 s) until `comm` reports an error, or a call of it has returned one
/// (`returned`); returns how long that took.
fn until_failed(rank: usize, comm: ncclComm_t, returned: ncclResult_t) -> Duration {
    let started = Instant::now();
    if returned != ncclSuccess {
        return started.elapsed();
    }
    loop {
        let mut state = ncclSuccess;
        // SAFETY: a live communicator and a writable result.
        ok("async error", unsafe {
            ncclCommGetAsyncError(comm, &mut state)
        });
        if state != ncclSuccess && state != ncclInProgress {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "rank {rank}: no error reported 30 s after a peer left"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// One rank's part of the communicator's life (the test's doc).
fn life_part(rank: usize, world: usize, id_path: &std::path::Path) {
    let (device, stream) = gpu_of(rank, world);
    let raw = stream.cu_stream() as *mut c_void;
    let count = 4096;
    let mine: Vec<f32> = (0..count).map(|k| input(rank, k)).collect();
    let want: Vec<f32> = (0..count)
        .map(|k| every_sum(&mut (0..world).map(|r| input(r, k))))
        .collect();
    let at = |b: &GpuBuffer<f32>| ringreduce::Buffer::address(b) as *mut c_void;
    let all_reduce = |comm: ncclComm_t, buf: &GpuBuffer<f32>| {
        // SAFETY: `buf` holds `count` f32 on this GPU and outlives the stream's use of it.
        unsafe { ncclAllReduce(at(buf), at(buf), count, ncclFloat32, ncclSum, comm, raw) }
    };

    // A communicator made without blocking on the id in `id_file`, and a buffer it reduced
    // exactly.
    let joined = |id_file: &std::path::Path| {
        let comm = join_nonblocking(rank, world, unique_id(rank, id_file));
        let buf = GpuBuffer::from_host(device, &mine).unwrap();
        ok("all-reduce", all_reduce(comm, &buf));
        stream.synchronize().unwrap();
        assert_eq!(buf.to_host().unwrap(), want, "rank {rank}: {id_file:?}");
        (comm, buf)
    };

    // 1. Non-blocking creation, then an exact all-reduce.
    let (comm, buf) = joined(id_path);

    // 2. Rank 1 aborts while the others wait in the next all-reduce: they are released with an
    //    error, and abort their own communicators.
    if rank == 1 {
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: a live communicator, released once.
        ok("abort", unsafe { ncclCommAbort(comm) });
    } else {
        let returned = all_reduce(comm, &buf);
        let after = until_failed(rank, comm, returned);
        // SAFETY: as above.
        ok("abort", unsafe { ncclCommAbort(comm) });
        stream.synchronize().unwrap();
        println!("rank {rank}: released {after:?} after rank 1's abort (call returned {returned})");
    }

    // 3. A new communicator; rank 2 dies after one all-reduce: the others' calls fail, their
    //    communicators say so, and they are released.
    let (comm, buf) = joined(&id_path.with_extension("2"));
    if rank == 2 {
        // SAFETY: raising SIGKILL against this process; nothing runs after it.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
    let returned = all_reduce(comm, &buf);
    let after = until_failed(rank, comm, returned);
    let mut state = ncclSuccess;
    // SAFETY: a live communicator and a writable result.
    ok("async error", unsafe {
        ncclCommGetAsyncError(comm, &mut state)
    });
    assert_ne!(
        state, ncclSuccess,
        "rank {rank}: a dead peer left the communicator healthy"
    );
    // SAFETY: a live communicator, released once.
    ok("abort", unsafe { ncclCommAbort(comm) });
    stream.synchronize().unwrap();
    println!("rank {rank}: rank 2's death reported after {after:?} (call returned {returned})");
}

/// NCCL's documented life of a communicator beyond the collectives, three processes:
/// creation with `config.blocking = 0` (`ncclInProgress` polled through
/// `ncclCommGetAsyncError`) and an exact all-reduce on it; rank 1's `ncclCommAbort` releasing the
/// others from the all-reduce they wait in; a second communicator whose rank 2 is killed: the
/// others' calls fail and `ncclCommGetAsyncError` reports it within 30 s, never a hang.
#[test]
fn nonblocking_creation_abort_and_a_dead_peer_through_nccls_api() {
    if let Some(env) = as_rank() {
        let path = std::path::PathBuf::from(std::env::var("RINGREDUCE_TEST_ID_FILE").unwrap());
        life_part(env.rank, env.world, &path);
        return;
    }
    if common::two_gpus_or_shared().is_none() {
        return;
    }
    let path = std::env::temp_dir().join(format!("ringreduce-nccl-life-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(path.with_extension("2"));
    let mut ranks = launch_job(
        "nonblocking_creation_abort_and_a_dead_peer_through_nccls_api",
        3,
        &path,
        &[],
    );
    let dead = ranks.remove(2);
    expect_success(ranks, Duration::from_secs(180));
    assert!(!dead.wait_with_output().unwrap().status.success());
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(path.with_extension("2"));
}
