//! A job on several hosts, simulated on this one: host ranks in processes of their own, each
//! told its host by `RINGREDUCE_HOST_ID`, run every hierarchical collective
//! (`RankCommunicator::host_across`) — within each host on ringreduce's plans over shared
//! memory, across hosts on `NcclStandIn`, the tests' double of NCCL — and must match the
//! in-process host executor's flat result bit for bit. A killed rank gives a named error on
//! every other rank, on both hosts.
//!
//! Each test is its own launcher (`common::launch`): run in the harness it spawns the ranks.

use common::launch::{as_rank, expect_success, launch};
use nccl_stand_in::NcclStandIn;
use ringreduce::plan::hierarchy::Hosts;
use ringreduce::plan::{Collective, CollectiveSpec, Op};
use ringreduce::verify::input_value;
use ringreduce::EdgeTransport;
use ringreduce::{Error, HostConfig, LaunchEnv, RankCommunicator, ReduceOp};
use std::time::{Duration, Instant};

mod common;
#[path = "hierarchy/nccl_stand_in.rs"]
mod nccl_stand_in;

fn config() -> HostConfig {
    HostConfig {
        algorithm: ringreduce::Algorithm::Ring,
        chunk_elems: 16,
        timeout: Duration::from_secs(30),
        ..HostConfig::default()
    }
}

fn stand_in() -> NcclStandIn {
    NcclStandIn {
        timeout: Duration::from_secs(30),
    }
}

/// `hosts` hosts of `local` ranks: each rank's `RINGREDUCE_HOST_ID` and torchrun's local
/// variables.
fn host_env(hosts: Hosts) -> impl Fn(usize) -> Vec<(String, String)> {
    move |rank| {
        vec![
            (
                "RINGREDUCE_HOST_ID".into(),
                format!("host-{}", hosts.host_of(rank)),
            ),
            ("LOCAL_RANK".into(), hosts.local_of(rank).to_string()),
            ("LOCAL_WORLD_SIZE".into(), hosts.local.to_string()),
        ]
    }
}

fn join(env: &LaunchEnv) -> RankCommunicator {
    let id = env.unique_id().unwrap();
    RankCommunicator::host_across(&id, env.rank, env.world, config(), &stand_in()).unwrap()
}

/// Every rank's out-of-place result of `collective` from the in-process (flat) host executor.
fn reference(
    collective: &Collective,
    world: usize,
    count: usize,
    op: ReduceOp,
) -> Vec<Option<Vec<f32>>> {
    common::host_reference(collective, world, count, op, config())
}

fn every_collective_on_this_rank(env: &LaunchEnv, hosts: Hosts) {
    let (rank, world) = (env.rank, env.world);
    let mut comm = join(env);
    assert_eq!(comm.hosts(), hosts);
    let mut all = vec![
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::AllToAll,
    ];
    for root in [0, world - 1, hosts.local] {
        all.push(Collective::Broadcast { root });
        all.push(Collective::Reduce { root });
    }
    // 37 does not divide among the local ranks: the all-reduce's tail runs too.
    let count = 37;
    for collective in &all {
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
            if op == ReduceOp::Avg && !collective.reduces() {
                continue;
            }
            let want = reference(collective, world, count, op);
            let input: Option<Vec<f32>> = collective
                .input_len(rank, world, count)
                .map(|len| (0..len).map(|k| input_value(op, rank, k)).collect());
            let mut output = collective
                .output_len(rank, world, count)
                .map(|len| vec![-7.0f32; len]);
            comm.collective(collective, input.as_ref(), output.as_mut(), op)
                .unwrap_or_else(|e| panic!("rank {rank}: {collective:?} {op:?}: {e}"));
            assert_eq!(output, want[rank], "rank {rank}: {collective:?} {op:?}");
            if !collective.has_in_place() {
                continue;
            }
            let len = collective.in_place_len(world, count);
            let mut buf: Vec<f32> = match collective {
                Collective::AllGather => (0..len)
                    .map(|k| match k / count == rank {
                        true => input_value(op, rank, k % count),
                        false => -7.0,
                    })
                    .collect(),
                _ => (0..len).map(|k| input_value(op, rank, k)).collect(),
            };
            let was = buf.clone();
            comm.collective_in_place(collective, &mut buf, op)
                .unwrap_or_else(|e| panic!("rank {rank}: {collective:?} in place {op:?}: {e}"));
            let mine = rank * count..(rank + 1) * count;
            match (collective, &want[rank]) {
                (Collective::ReduceScatter, Some(w)) => assert_eq!(&buf[mine], &w[..]),
                (Collective::Reduce { root }, _) if *root != rank => assert_eq!(buf, was),
                (_, Some(w)) => assert_eq!(&buf, w, "rank {rank}: {collective:?} in place {op:?}"),
                (_, None) => panic!("rank {rank} has no reference for {collective:?}"),
            }
        }
    }
    comm.close().unwrap();
}

#[test]
fn every_collective_on_simulated_hosts_matches_the_flat_executor() {
    let layouts = [
        Hosts { hosts: 2, local: 2 },
        Hosts { hosts: 3, local: 2 },
        Hosts { hosts: 2, local: 3 },
    ];
    if let Some(env) = as_rank() {
        let layout: usize = std::env::var("LAYOUT").unwrap().parse().unwrap();
        every_collective_on_this_rank(&env, layouts[layout]);
        return;
    }
    for (i, hosts) in layouts.into_iter().enumerate() {
        let ranks = launch(
            "every_collective_on_simulated_hosts_matches_the_flat_executor",
            hosts.world(),
            |rank| {
                let mut env = host_env(hosts)(rank);
                env.push(("LAYOUT".into(), i.to_string()));
                env
            },
        );
        expect_success(ranks, Duration::from_secs(180));
    }
}

#[test]
fn send_recv_crosses_simulated_hosts_on_the_jobs_engine() {
    let hosts = Hosts { hosts: 2, local: 2 };
    if let Some(env) = as_rank() {
        let (rank, world) = (env.rank, env.world);
        let mut comm = join(&env);
        let transfers = common::pipeline_transfers(world);
        let (sends, want) = common::transfer_ends(&transfers, rank);
        let mut recvs: Vec<Vec<f32>> = want.iter().map(|w| vec![-1.0; w.len()]).collect();
        let send_refs: Vec<&Vec<f32>> = sends.iter().collect();
        let mut recv_refs: Vec<&mut Vec<f32>> = recvs.iter_mut().collect();
        comm.send_recv(&transfers, &send_refs, &mut recv_refs)
            .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(recvs, want, "rank {rank}");
        comm.close().unwrap();
        return;
    }
    let ranks = launch(
        "send_recv_crosses_simulated_hosts_on_the_jobs_engine",
        4,
        host_env(hosts),
    );
    expect_success(ranks, Duration::from_secs(60));
}

#[test]
fn a_killed_rank_is_named_on_both_hosts() {
    let hosts = Hosts { hosts: 2, local: 2 };
    if let Some(env) = as_rank() {
        let mut comm = join(&env);
        let mut buf = vec![1.0f32; 100];
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
        assert_eq!(buf, vec![4.0; 100]);
        if env.rank == 3 {
            // SAFETY: raising SIGKILL against this process; nothing runs after it.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        let started = Instant::now();
        let err = comm
            .all_reduce_in_place(&mut buf, ReduceOp::Sum)
            .unwrap_err();
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(10),
            "rank {}: {took:?}: {err}",
            env.rank
        );
        // The call starts by comparing shapes over the job's rendezvous, where rank 0 finds
        // rank 3 gone and tells the others: every rank names rank 3.
        assert_eq!(
            common::failed_rank(&err),
            Some(3),
            "rank {}: {err}",
            env.rank
        );
        println!("rank {} after {took:?}: {err}", env.rank);
        return;
    }
    let ranks = launch("a_killed_rank_is_named_on_both_hosts", 4, host_env(hosts));
    let mut children = ranks;
    let killed = children.pop().unwrap();
    expect_success(children, Duration::from_secs(60));
    let out = killed.wait_with_output().unwrap();
    assert!(!out.status.success(), "rank 3 was to die");
}

#[test]
fn ranks_without_an_engine_and_uneven_hosts_are_refused_by_name() {
    if let Some(env) = as_rank() {
        let id = env.unique_id().unwrap();
        let which = std::env::var("CASE").unwrap();
        let err = match which.as_str() {
            "no-engine" => RankCommunicator::host(&id, env.rank, env.world, config()).unwrap_err(),
            // GPU ranks with no NCCL to find (it is looked for before any GPU is touched).
            "gpu-no-nccl" => {
                let config = ringreduce::CudaConfig {
                    allow_shared_device: true,
                    ..ringreduce::CudaConfig::default()
                };
                RankCommunicator::gpu(&id, env.rank, env.world, 0, config).unwrap_err()
            }
            _ => RankCommunicator::host_across(&id, env.rank, env.world, config(), &stand_in())
                .unwrap_err(),
        };
        match (which.as_str(), &err) {
            ("no-engine", Error::NoInterHost { hosts: 2, why }) => {
                assert!(why.contains("host_across"), "{err}")
            }
            ("gpu-no-nccl", Error::NoInterHost { hosts: 2, why }) => {
                assert!(
                    why.contains("NCCL") && why.contains("RINGREDUCE_NCCL_PATH"),
                    "{err}"
                )
            }
            ("uneven", Error::HostLayout { what }) => assert!(what.contains("as many"), "{err}"),
            ("interleaved", Error::HostLayout { what }) => {
                assert!(what.contains("consecutive"), "{err}")
            }
            _ => panic!("rank {} ({which}): {err}", env.rank),
        }
        return;
    }
    for (case, hosts) in [
        ("no-engine", &["a", "a", "b", "b"][..]),
        ("gpu-no-nccl", &["a", "a", "b", "b"][..]),
        ("uneven", &["a", "a", "b"][..]),
        ("interleaved", &["a", "b", "a", "b"][..]),
    ] {
        let ranks = launch(
            "ranks_without_an_engine_and_uneven_hosts_are_refused_by_name",
            hosts.len(),
            |rank| {
                vec![
                    ("RINGREDUCE_HOST_ID".into(), hosts[rank].into()),
                    ("CASE".into(), case.into()),
                    (
                        "RINGREDUCE_NCCL_PATH".into(),
                        "/nonexistent/libnccl.so.2".into(),
                    ),
                ]
            },
        );
        expect_success(ranks, Duration::from_secs(60));
    }
}

#[test]
fn a_call_that_differs_on_another_host_is_named_on_every_rank() {
    let hosts = Hosts { hosts: 2, local: 2 };
    if let Some(env) = as_rank() {
        let mut comm = join(&env);
        let count = if env.rank == 3 { 65 } else { 64 };
        let mut buf = vec![1.0f32; count];
        let err = comm
            .all_reduce_in_place(&mut buf, ReduceOp::Sum)
            .unwrap_err();
        match &err {
            Error::CallMismatch {
                rank,
                this,
                ours,
                theirs,
            } => {
                let differs = if env.rank == 3 { 0 } else { 3 };
                assert_eq!((*rank, *this), (differs, env.rank), "{err}");
                assert!(ours.contains(&format!("{count} elements")), "{err}");
                assert!(
                    theirs.contains(&format!("{} elements", 129 - count)),
                    "{err}"
                );
            }
            other => panic!("rank {}: {other}", env.rank),
        }
        assert_eq!(buf, vec![1.0f32; count], "a refused call changes nothing");
        return;
    }
    let ranks = launch(
        "a_call_that_differs_on_another_host_is_named_on_every_rank",
        4,
        host_env(hosts),
    );
    expect_success(ranks, Duration::from_secs(60));
}

#[test]
fn a_rank_that_fails_within_its_host_is_named_by_level_everywhere() {
    let hosts = Hosts { hosts: 2, local: 2 };
    if let Some(env) = as_rank() {
        let id = env.unique_id().unwrap();
        // Rank 3 (local rank 1 of host 1) fails the first copy of its first call within the
        // host: the ring reduce-scatter of 1000 elements' 2 blocks of 500, in place.
        let ring = HostConfig {
            algorithm: ringreduce::Algorithm::Ring,
            ..config()
        };
        let mut spec = CollectiveSpec::new(
            Collective::ReduceScatter,
            2,
            500,
            ring.chunk_elems,
            ring.slots,
            EdgeTransport::Peer,
        );
        spec.ring.in_place = true;
        let plan = spec.build().unwrap();
        let instr = plan.ranks[1]
            .iter()
            .position(|i| matches!(i.op, Op::Copy { .. }))
            .unwrap();
        let config = HostConfig {
            fault: (env.rank == 3).then_some(ringreduce::Fault {
                rank: 1,
                instr,
                kind: ringreduce::FaultKind::Fail,
            }),
            ..ring
        };
        let mut comm =
            RankCommunicator::host_across(&id, env.rank, env.world, config, &stand_in()).unwrap();
        let mut buf = vec![1.0f32; 1000];
        let err = comm
            .all_reduce_in_place(&mut buf, ReduceOp::Sum)
            .unwrap_err();
        let Error::Level {
            level,
            rank,
            source,
        } = &err
        else {
            panic!("rank {}: {err}", env.rank);
        };
        assert_eq!(*rank, env.rank, "{err}");
        // Rank 2 meets rank 3 within the host; ranks 0 and 1 meet a group across hosts whose
        // host-1 member gave up (rank 2 or rank 3).
        match env.rank {
            2 => assert_eq!(*level, "within a host", "{err}"),
            3 => {}
            _ => assert_eq!(*level, "across hosts", "{err}"),
        }
        if env.rank != 3 {
            let Error::RankFailed { rank: named, .. } = **source else {
                panic!("rank {}: {err}", env.rank);
            };
            assert!(
                named == 3 || (env.rank != 2 && named == env.rank + 2),
                "rank {}: {err}",
                env.rank
            );
        }
        println!("rank {}: {err}", env.rank);
        return;
    }
    let ranks = launch(
        "a_rank_that_fails_within_its_host_is_named_by_level_everywhere",
        4,
        host_env(hosts),
    );
    expect_success(ranks, Duration::from_secs(60));
}
