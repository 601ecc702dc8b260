//! One process per rank, on host ranks: the rendezvous, every collective, a mismatched call and
//! a killed peer, across real processes.
//!
//! Each test is its own launcher: run in the test harness, it spawns `world` copies of this test
//! executable running the same test alone, with the variables torchrun sets (`RANK`,
//! `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, … and `RINGREDUCE_PORT` on a free port), and
//! checks that every rank exits cleanly; in a rank (`RINGREDUCE_TEST_RANK_PROCESS` set), the
//! same function is one rank of the job. Results are compared with the in-process host
//! executor's on the same inputs — every rank builds that reference itself — bit for bit.

use common::launch::{as_rank, expect_success, launch};
use ringreduce::plan::Collective;
use ringreduce::verify::input_value;
use ringreduce::{Algorithm, Error, HostConfig, LaunchEnv, RankCommunicator, ReduceOp};
use std::time::{Duration, Instant};

mod common;

fn config(algorithm: Algorithm) -> HostConfig {
    HostConfig {
        chunk_elems: 96,
        slots: 2,
        algorithm,
        timeout: Duration::from_secs(30),
        ..HostConfig::default()
    }
}

/// The plan the host executor runs for an in-place f32 sum of `count` on `world` ranks with
/// this file's ring configuration: where a test finds the instruction to plant a fault at.
fn ring_plan(world: usize, count: usize) -> ringreduce::plan::Plan {
    let config = config(Algorithm::Ring);
    ringreduce::plan::RingSpec {
        world,
        count,
        in_place: true,
        op: ReduceOp::Sum,
        chunk_elems: config.chunk_elems,
        slots: config.slots,
        align_elems: 1,
        transports: vec![ringreduce::EdgeTransport::Peer; world],
    }
    .build()
    .unwrap()
}

/// What the in-process host executor gives every rank (out of place): the reference.
fn reference(
    collective: &Collective,
    world: usize,
    count: usize,
    op: ReduceOp,
    algorithm: Algorithm,
) -> Vec<Option<Vec<f32>>> {
    common::host_reference(collective, world, count, op, config(algorithm))
}

/// One rank's part of every collective, out of place and in place where it has one, against
/// the reference.
fn every_collective_on_this_rank(env: &LaunchEnv, algorithm: Algorithm, job: usize) {
    let (rank, world) = (env.rank, env.world);
    let id = LaunchEnv {
        run_id: Some(format!("{:?}-{job}", env.run_id)),
        ..env.clone()
    }
    .unique_id()
    .unwrap();
    let mut comm = RankCommunicator::host(&id, rank, world, config(algorithm)).unwrap();
    let count = 37;
    let mut all = vec![
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::AllToAll,
    ];
    for root in [0, world - 1] {
        all.push(Collective::Broadcast { root });
        all.push(Collective::Reduce { root });
    }
    for collective in &all {
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            let want = reference(collective, world, count, op, algorithm);
            let input: Option<Vec<f32>> = collective
                .input_len(rank, world, count)
                .map(|len| (0..len).map(|k| input_value(op, rank, k)).collect());
            let mut output = collective
                .output_len(rank, world, count)
                .map(|len| vec![-7.0f32; len]);
            comm.collective(collective, input.as_ref(), output.as_mut(), op)
                .unwrap_or_else(|e| panic!("{collective:?} {op:?}: {e}"));
            assert_eq!(output, want[rank], "rank {rank}: {collective:?} {op:?}");
            // What ran, as this rank's executor says: on host ranks `Auto` takes the two-shot
            // all-reduce and, at this size, the other collectives' one-shot forms; a forced
            // one- or two-shot of another collective is its one-shot form.
            let all_reduce = *collective == Collective::AllReduce;
            let ran_as = match (algorithm, all_reduce) {
                (Algorithm::Auto, true) => Algorithm::TwoShot,
                (Algorithm::Auto | Algorithm::TwoShot, false) => Algorithm::OneShot,
                (forced, _) => forced,
            };
            let ran = comm.last_ran().expect("a call ran");
            assert_eq!(
                (ran.algorithm, ran.form, ran.in_place),
                (ran_as, ringreduce::Form::HostThreads, false),
                "rank {rank}: {collective:?} under {algorithm:?}"
            );
            // In place: the buffer starts as this rank's input, laid out as the collective's
            // in-place table says.
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
            comm.collective_in_place(collective, &mut buf, op)
                .unwrap_or_else(|e| panic!("{collective:?} in place {op:?}: {e}"));
            let mine = rank * count..(rank + 1) * count;
            match (collective, &want[rank]) {
                // Only this rank's block is defined (NCCL's rule too).
                (Collective::ReduceScatter, Some(w)) => assert_eq!(&buf[mine], &w[..]),
                // A non-root's buffer is left as it was.
                (Collective::Reduce { root }, _) if *root != rank => {
                    let was: Vec<f32> = (0..count).map(|k| input_value(op, rank, k)).collect();
                    assert_eq!(buf, was, "rank {rank}: {collective:?} in place {op:?}");
                }
                (_, Some(w)) => assert_eq!(&buf, w, "rank {rank}: {collective:?} in place {op:?}"),
                (_, None) => panic!("rank {rank} has no reference for {collective:?}"),
            }
        }
    }
}

#[test]
fn every_collective_across_processes_matches_the_threads() {
    if let Some(env) = as_rank() {
        for (job, algorithm) in [
            Algorithm::Ring,
            Algorithm::OneShot,
            Algorithm::TwoShot,
            Algorithm::Auto,
        ]
        .into_iter()
        .enumerate()
        {
            every_collective_on_this_rank(&env, algorithm, job);
        }
        return;
    }
    for world in [2, 3] {
        let ranks = launch(
            "every_collective_across_processes_matches_the_threads",
            world,
            |_| vec![],
        );
        expect_success(ranks, Duration::from_secs(120));
    }
}

#[test]
fn a_mismatched_call_is_a_named_error_on_every_rank() {
    if let Some(env) = as_rank() {
        let id = env.unique_id().unwrap();
        let mut comm =
            RankCommunicator::host(&id, env.rank, env.world, config(Algorithm::Ring)).unwrap();
        // A first call agrees; the second's count differs on rank 1.
        let mut buf = vec![1.0f32; 64];
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
        assert_eq!(buf, vec![env.world as f32; 64]);
        let count = if env.rank == 1 { 65 } else { 64 };
        let mut buf = vec![1.0f32; count];
        let started = Instant::now();
        let err = comm
            .all_reduce_in_place(&mut buf, ReduceOp::Sum)
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5), "{err}");
        match &err {
            Error::CallMismatch {
                rank, theirs, ours, ..
            } => {
                let differs = if env.rank == 1 { 0 } else { 1 };
                assert_eq!(*rank, differs, "{err}");
                assert!(
                    theirs.contains("all-reduce") && ours.contains("all-reduce"),
                    "{err}"
                );
            }
            other => panic!("rank {}: {other}", env.rank),
        }
        // The communicator is broken from then on, and closing it says why.
        let again = comm
            .all_reduce_in_place(&mut buf, ReduceOp::Sum)
            .unwrap_err();
        assert!(matches!(again, Error::CommunicatorFailed(_)), "{again}");
        let closed = comm.close().unwrap_err();
        assert_eq!(closed.to_string(), err.to_string());
        return;
    }
    let ranks = launch(
        "a_mismatched_call_is_a_named_error_on_every_rank",
        3,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(60));
}

#[test]
fn a_killed_rank_is_named_on_every_other_rank_well_before_the_timeout() {
    const VICTIM: usize = 1;
    if let Some(env) = as_rank() {
        let id = env.unique_id().unwrap();
        // The victim stalls in its first copy of the collective until the launcher kills it
        // (the plan the host executor runs: the ring's, with this test's chunk and slots).
        let count = 4096;
        let plan = ring_plan(env.world, count);
        let first_copy = plan.ranks[VICTIM]
            .iter()
            .position(|i| matches!(i.op, ringreduce::plan::Op::Copy { .. }))
            .unwrap();
        let fault = (env.rank == VICTIM).then_some(ringreduce::Fault {
            rank: VICTIM,
            instr: first_copy,
            kind: ringreduce::FaultKind::Slow(Duration::from_secs(30)),
        });
        let config = HostConfig {
            fault,
            ..config(Algorithm::Ring)
        };
        let mut comm = RankCommunicator::host(&id, env.rank, env.world, config).unwrap();
        let mut buf = vec![1.0f32; count];
        let started = Instant::now();
        let err = comm
            .all_reduce_in_place(&mut buf, ReduceOp::Sum)
            .unwrap_err();
        let took = started.elapsed();
        match &err {
            Error::RankFailed { rank, .. } => assert_eq!(*rank, VICTIM, "{err}"),
            other => panic!("rank {}: {other}", env.rank),
        }
        // Killed about a second in; the collective's timeout is 30 s.
        assert!(took < Duration::from_secs(10), "{took:?}: {err}");
        let again = comm
            .all_reduce_in_place(&mut buf, ReduceOp::Sum)
            .unwrap_err();
        assert!(matches!(again, Error::CommunicatorFailed(_)), "{again}");
        return;
    }
    let world = 3;
    let mut ranks = launch(
        "a_killed_rank_is_named_on_every_other_rank_well_before_the_timeout",
        world,
        |_| vec![],
    );
    let rank0 = ranks[0].id();
    std::thread::sleep(Duration::from_secs(1));
    let mut victim = ranks.remove(VICTIM);
    victim.kill().unwrap(); // SIGKILL
    victim.wait().unwrap();
    expect_success(ranks, Duration::from_secs(60));
    // Nothing of the job is left in /dev/shm (its names carry rank 0's pid).
    if let Ok(dir) = std::fs::read_dir("/dev/shm") {
        let left: Vec<_> = dir
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("ringreduce-") && n.contains(&format!("-{rank0}-")))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}

#[test]
fn send_recv_across_processes_moves_every_transfer() {
    if let Some(env) = as_rank() {
        let (rank, world) = (env.rank, env.world);
        let id = env.unique_id().unwrap();
        let mut comm = RankCommunicator::host(&id, rank, world, config(Algorithm::Ring)).unwrap();
        // Every rank to the next, of different lengths, and rank 0 to the last rank twice.
        let mut transfers: Vec<ringreduce::Transfer> = (0..world)
            .map(|r| ringreduce::Transfer {
                from: r,
                to: (r + 1) % world,
                count: 5 + 97 * r,
            })
            .collect();
        for count in [3, 200] {
            transfers.push(ringreduce::Transfer {
                from: 0,
                to: world - 1,
                count,
            });
        }
        // Transfer i's data: i·1000 + index.
        let data = |i: usize, len: usize| -> Vec<i64> {
            (0..len).map(|k| (i * 1000 + k) as i64).collect()
        };
        let sends: Vec<Vec<i64>> = transfers
            .iter()
            .enumerate()
            .filter(|(_, t)| t.from == rank)
            .map(|(i, t)| data(i, t.count))
            .collect();
        let mut recvs: Vec<Vec<i64>> = transfers
            .iter()
            .filter(|t| t.to == rank)
            .map(|t| vec![-1; t.count])
            .collect();
        let send_refs: Vec<&Vec<i64>> = sends.iter().collect();
        let mut recv_refs: Vec<&mut Vec<i64>> = recvs.iter_mut().collect();
        comm.send_recv(&transfers, &send_refs, &mut recv_refs)
            .unwrap();
        let want: Vec<Vec<i64>> = transfers
            .iter()
            .enumerate()
            .filter(|(_, t)| t.to == rank)
            .map(|(i, t)| data(i, t.count))
            .collect();
        assert_eq!(recvs, want, "rank {rank}");
        // A rank that passes the wrong number of buffers is refused before anything moves.
        let err = comm
            .send_recv::<i64, Vec<i64>, Vec<i64>>(&transfers, &[], &mut [])
            .unwrap_err();
        assert!(
            matches!(err, Error::BufferCount { .. }) || sends.is_empty() && recvs.is_empty(),
            "{err}"
        );
        return;
    }
    for world in [2, 3] {
        let ranks = launch(
            "send_recv_across_processes_moves_every_transfer",
            world,
            |_| vec![],
        );
        expect_success(ranks, Duration::from_secs(60));
    }
}

#[test]
fn ranks_calling_with_different_element_types_are_a_named_mismatch() {
    if let Some(env) = as_rank() {
        let id = env.unique_id().unwrap();
        let mut comm =
            RankCommunicator::host(&id, env.rank, env.world, config(Algorithm::Ring)).unwrap();
        // Four bytes an element on both ranks, but f32 on rank 0 and i32 on rank 1.
        let err = if env.rank == 0 {
            comm.all_reduce_in_place(&mut vec![1.0f32; 16], ReduceOp::Sum)
        } else {
            comm.all_reduce_in_place(&mut vec![1i32; 16], ReduceOp::Sum)
        }
        .unwrap_err();
        match &err {
            Error::CallMismatch { theirs, ours, .. } => {
                assert!(theirs.contains("F32") != ours.contains("F32"), "{err}")
            }
            other => panic!("rank {}: {other}", env.rank),
        }
        return;
    }
    let ranks = launch(
        "ranks_calling_with_different_element_types_are_a_named_mismatch",
        2,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(60));
}

#[test]
fn a_rank_that_finished_and_exited_fails_no_slower_peer() {
    const SLOW: usize = 2;
    if let Some(env) = as_rank() {
        let id = env.unique_id().unwrap();
        // The slow rank's last copy starts 300 ms late: the others finish their part first,
        // and whichever finishes first exits at once.
        let count = 4096;
        let plan = ring_plan(env.world, count);
        let last_copy = plan.ranks[SLOW]
            .iter()
            .rposition(|i| matches!(i.op, ringreduce::plan::Op::Copy { .. }))
            .unwrap();
        let config = HostConfig {
            fault: (env.rank == SLOW).then_some(ringreduce::Fault {
                rank: SLOW,
                instr: last_copy,
                kind: ringreduce::FaultKind::Slow(Duration::from_millis(300)),
            }),
            ..config(Algorithm::Ring)
        };
        let mut comm = RankCommunicator::host(&id, env.rank, env.world, config).unwrap();
        let mut buf = vec![1.0f32; count];
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)
            .unwrap_or_else(|e| panic!("rank {}: {e}", env.rank));
        assert_eq!(buf, vec![env.world as f32; count]);
        return;
    }
    for _ in 0..3 {
        let ranks = launch(
            "a_rank_that_finished_and_exited_fails_no_slower_peer",
            3,
            |_| vec![],
        );
        expect_success(ranks, Duration::from_secs(60));
    }
}
