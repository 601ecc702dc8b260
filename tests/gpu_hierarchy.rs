//! GPU ranks of a job on several hosts, simulated on one machine: four processes, two per
//! simulated host (`RINGREDUCE_HOST_ID`; for NCCL each process claims a host of its own with
//! `NCCL_HOSTID`, and its peer-to-peer and shared-memory transports are off, so that it talks
//! over its socket transport, as between hosts without InfiniBand). On a one-GPU machine every
//! rank runs on GPU 0 (`allow_shared_device`; NCCL accepts ranks of one GPU under different host
//! ids).
//! Every hierarchical collective must match the flat host executor exactly, on the rank's own
//! stream too and replayed from a CUDA graph; a send/recv across the hosts must deliver every
//! transfer, and a rank killed on either host is named on every other. Waived without a GPU, or
//! without NCCL (`libnccl.so.2`).

use common::launch::{as_rank, expect_success, launch};
use ringreduce::plan::hierarchy::Hosts;
use ringreduce::plan::Collective;
use ringreduce::verify::input_value;
use ringreduce::{CudaConfig, GpuBuffer, HostConfig, LaunchEnv, RankCommunicator, ReduceOp};
use std::time::{Duration, Instant};

mod common;

const HOSTS: Hosts = Hosts { hosts: 2, local: 2 };

fn config() -> CudaConfig {
    CudaConfig {
        allow_shared_device: true,
        timeout: Duration::from_secs(60),
        ..CudaConfig::default()
    }
}

/// Each rank's simulated host for ringreduce; for NCCL, a host of its own per process (NCCL
/// refuses two ranks of one host on one GPU, as the job's communicator for send/recv would have:
/// each process its own host, every NCCL communicator talks over sockets).
fn host_env(rank: usize) -> Vec<(String, String)> {
    vec![
        (
            "RINGREDUCE_HOST_ID".into(),
            format!("host-{}", HOSTS.host_of(rank)),
        ),
        ("NCCL_HOSTID".into(), format!("rank-{rank}")),
        ("NCCL_P2P_DISABLE".into(), "1".into()),
        ("NCCL_SHM_DISABLE".into(), "1".into()),
        ("NCCL_NVLS_ENABLE".into(), "0".into()),
        ("LOCAL_RANK".into(), HOSTS.local_of(rank).to_string()),
        ("LOCAL_WORLD_SIZE".into(), HOSTS.local.to_string()),
    ]
}

/// Whether this machine can run the test: a GPU and NCCL (else the waiver is printed).
fn can_run(property: &str) -> bool {
    if common::gpus(1, property).is_none() {
        return false;
    }
    if ringreduce::exec::nccl::Library::get().is_none() {
        println!("waived: needs NCCL (libnccl.so.2) between the simulated hosts: {property}");
        return false;
    }
    true
}

fn join(env: &LaunchEnv) -> RankCommunicator {
    let id = env.unique_id().unwrap();
    RankCommunicator::gpu(&id, env.rank, env.world, 0, config()).unwrap()
}

/// Every rank's out-of-place result from the flat host executor.
fn reference(collective: &Collective, count: usize, op: ReduceOp) -> Vec<Option<Vec<f32>>> {
    common::host_reference(collective, HOSTS.world(), count, op, HostConfig::default())
}

#[test]
fn gpu_ranks_on_simulated_hosts_run_every_collective_exactly() {
    if let Some(env) = as_rank() {
        let rank = env.rank;
        let mut comm = join(&env);
        assert_eq!(comm.hosts(), HOSTS);
        let mut all = vec![
            Collective::AllReduce,
            Collective::ReduceScatter,
            Collective::AllGather,
            Collective::AllToAll,
        ];
        for root in [0, 3] {
            all.push(Collective::Broadcast { root });
            all.push(Collective::Reduce { root });
        }
        let count = 1001;
        for collective in &all {
            for op in [ReduceOp::Sum, ReduceOp::Avg] {
                if op == ReduceOp::Avg && !collective.reduces() {
                    continue;
                }
                let want = reference(collective, count, op);
                let input = collective.input_len(rank, 4, count).map(|len| {
                    let v: Vec<f32> = (0..len).map(|k| input_value(op, rank, k)).collect();
                    GpuBuffer::from_host(0, &v).unwrap()
                });
                let mut output = collective
                    .output_len(rank, 4, count)
                    .map(|len| GpuBuffer::from_host(0, &vec![-7.0f32; len]).unwrap());
                comm.collective(collective, input.as_ref(), output.as_mut(), op)
                    .unwrap_or_else(|e| panic!("rank {rank}: {collective:?} {op:?}: {e}"));
                let got = output.map(|o| o.to_host().unwrap());
                assert_eq!(got, want[rank], "rank {rank}: {collective:?} {op:?}");
            }
        }
        // Send/recv across the simulated hosts (on NCCL's communicator of the job).
        let transfers = common::pipeline_transfers(4);
        let (sent, want) = common::transfer_ends(&transfers, rank);
        let on_gpu = |v: &Vec<f32>| GpuBuffer::from_host(0, v).unwrap();
        let sends: Vec<GpuBuffer<f32>> = sent.iter().map(on_gpu).collect();
        let mut recvs: Vec<GpuBuffer<f32>> =
            want.iter().map(|w| on_gpu(&vec![-1.0; w.len()])).collect();
        let send_refs: Vec<&GpuBuffer<f32>> = sends.iter().collect();
        let mut recv_refs: Vec<&mut GpuBuffer<f32>> = recvs.iter_mut().collect();
        comm.send_recv(&transfers, &send_refs, &mut recv_refs)
            .unwrap_or_else(|e| panic!("rank {rank}: send/recv: {e}"));
        let got: Vec<Vec<f32>> = recvs.iter().map(|b| b.to_host().unwrap()).collect();
        assert_eq!(got, want, "rank {rank}: send/recv");
        // On the rank's own stream, with no host synchronisation until the end.
        let stream = common::new_streams(&[0]).remove(0);
        let mut buf = GpuBuffer::from_host(0, &vec![rank as f32 + 1.0; 4096]).unwrap();
        // SAFETY: `buf` lives past the synchronisation below and nothing else touches it.
        unsafe { comm.enqueue_all_reduce_in_place_on(&mut buf, ReduceOp::Sum, &stream) }.unwrap();
        stream.synchronize().unwrap();
        assert_eq!(buf.to_host().unwrap(), vec![10.0f32; 4096]);
        captured_all_reduce(&mut comm, rank, &stream, &mut buf);
        comm.close().unwrap();
        return;
    }
    if !can_run("GPU ranks on two simulated hosts") {
        return;
    }
    let ranks = launch(
        "gpu_ranks_on_simulated_hosts_run_every_collective_exactly",
        4,
        host_env,
    );
    expect_success(ranks, Duration::from_secs(300));
}

/// A CUDA graph captured on the rank's stream (copy a source in, the hierarchical all-reduce
/// — ringreduce's kernels and NCCL's calls captured together — copy the result out), replayed
/// with a new source each time. The shape ran eagerly before, so nothing is made under capture.
fn captured_all_reduce(
    comm: &mut RankCommunicator,
    rank: usize,
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    buf: &mut GpuBuffer<f32>,
) {
    use cudarc::driver::{result, sys};
    let count = buf.len();
    let src = GpuBuffer::<f32>::zeroed(0, count).unwrap();
    let out = GpuBuffer::<f32>::zeroed(0, count).unwrap();
    let at = ringreduce::Buffer::address;
    let (src_at, buf_at, out_at) = (at(&src), at(&*buf), at(&out));
    let bytes = count * 4;
    stream.context().bind_to_thread().unwrap();
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .unwrap();
    // SAFETY: live allocations of `bytes` on GPU 0, used by this graph alone until it is gone.
    unsafe { result::memcpy_dtod_async(buf_at, src_at, bytes, stream.cu_stream()) }.unwrap();
    // SAFETY: `buf` outlives the replays below.
    unsafe { comm.enqueue_all_reduce_in_place_on(buf, ReduceOp::Sum, stream) }
        .unwrap_or_else(|e| panic!("rank {rank}: captured all-reduce: {e}"));
    // SAFETY: as above.
    unsafe { result::memcpy_dtod_async(out_at, buf_at, bytes, stream.cu_stream()) }.unwrap();
    let graph = stream
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .unwrap()
        .expect("a graph");
    for replay in 0..3 {
        let value = |r: usize| (r * 10 + replay) as f32;
        let data = vec![value(rank); count];
        // SAFETY: `src` holds `count` f32; `data` lives until the stream is synchronised.
        unsafe { result::memcpy_htod_async(src_at, &data, stream.cu_stream()) }.unwrap();
        graph.launch().unwrap();
        stream.synchronize().unwrap();
        let want: f32 = (0..HOSTS.world()).map(value).sum();
        assert_eq!(
            out.to_host().unwrap(),
            vec![want; count],
            "rank {rank}: graph replay {replay}"
        );
    }
}

/// Every rank but `killed` names it after `killed` dies between two all-reduces.
fn killed_rank_is_named(test: &str, killed: usize) {
    if let Some(env) = as_rank() {
        let mut comm = join(&env);
        let mut buf = GpuBuffer::from_host(0, &vec![1.0f32; 1000]).unwrap();
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
        if env.rank == killed {
            // SAFETY: raising SIGKILL against this process; nothing runs after it.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        let started = Instant::now();
        let err = comm
            .all_reduce_in_place(&mut buf, ReduceOp::Sum)
            .unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "rank {}: {err}",
            env.rank
        );
        assert_eq!(
            common::failed_rank(&err),
            Some(killed),
            "rank {}: {err}",
            env.rank
        );
        println!("rank {} after {:?}: {err}", env.rank, started.elapsed());
        return;
    }
    if !can_run("a killed GPU rank on two simulated hosts") {
        return;
    }
    let mut ranks = launch(test, 4, host_env);
    let dead = ranks.remove(killed);
    expect_success(ranks, Duration::from_secs(120));
    assert!(!dead.wait_with_output().unwrap().status.success());
}

/// Rank 3 dies while a large all-reduce is under way (a thread of its own kills it 30 ms into
/// the call: in the intra-host stages or in NCCL's, over its socket transport): every other
/// rank's call must fail well within its deadline, never hang. Prints each rank's error: which
/// rank it names depends on where the death was seen first.
#[test]
fn a_gpu_rank_killed_during_a_large_all_reduce_never_hangs_the_others() {
    if let Some(env) = as_rank() {
        let mut comm = join(&env);
        let count = 64 << 20; // 256 MiB of f32: NCCL's socket transport takes a while for it
        let mut buf = GpuBuffer::from_host(0, &vec![1.0f32; count]).unwrap();
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
        if env.rank == 3 {
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_millis(30));
                // SAFETY: raising SIGKILL against this process.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            });
        }
        let started = Instant::now();
        let result = comm.all_reduce_in_place(&mut buf, ReduceOp::Sum);
        let after = started.elapsed();
        let err = match result {
            Ok(()) if env.rank == 3 => {
                // Finished before the kill came: wait for it.
                std::thread::sleep(Duration::from_secs(10));
                unreachable!("rank 3 outlived its kill");
            }
            Ok(()) => comm
                .all_reduce_in_place(&mut buf, ReduceOp::Sum)
                .expect_err("a call after rank 3 died"),
            Err(e) => e,
        };
        println!(
            "rank {} after {after:?}: named {:?}: {err}",
            env.rank,
            common::failed_rank(&err)
        );
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "rank {}: {err}",
            env.rank
        );
        return;
    }
    if !can_run("a GPU rank killed during a large all-reduce on two simulated hosts") {
        return;
    }
    let mut ranks = launch(
        "a_gpu_rank_killed_during_a_large_all_reduce_never_hangs_the_others",
        4,
        host_env,
    );
    let dead = ranks.remove(3);
    expect_success(ranks, Duration::from_secs(120));
    assert!(!dead.wait_with_output().unwrap().status.success());
}

#[test]
fn a_gpu_rank_killed_on_the_second_simulated_host_is_named_on_both() {
    killed_rank_is_named(
        "a_gpu_rank_killed_on_the_second_simulated_host_is_named_on_both",
        3,
    );
}

#[test]
fn a_gpu_rank_killed_on_the_first_simulated_host_is_named_on_both() {
    killed_rank_is_named(
        "a_gpu_rank_killed_on_the_first_simulated_host_is_named_on_both",
        1,
    );
}
