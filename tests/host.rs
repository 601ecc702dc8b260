//! The host executor's test matrix: worlds 1..=8, awkward lengths, chunk sizes from one element to
//! a whole segment, in and out of place, every operator and element type, peer-shaped and
//! staged-shaped plans, with schedule-shaking delays. Inputs depend on rank and index and reduce
//! exactly (see `ringreduce::verify`), so every expectation is exact.

use half::{bf16, f16};
use ringreduce::verify::{compare, make_expected, make_input};
use ringreduce::{Communicator, EdgeTransport, Element, HostConfig, ReduceOp};

fn config(
    chunk_elems: usize,
    slots: usize,
    transport: EdgeTransport,
    seed: Option<u64>,
) -> HostConfig {
    HostConfig {
        algorithm: ringreduce::Algorithm::Ring,
        chunk_elems,
        slots,
        transport: transport.into(),
        delay_seed: seed,
        ..HostConfig::default()
    }
}

/// Runs one all-reduce and asserts every output element, reporting the first mismatches.
fn run_case<T: Element>(comm: &Communicator, count: usize, op: ReduceOp, in_place: bool) {
    let world = comm.world();
    let inputs: Vec<Vec<T>> = (0..world).map(|r| make_input(op, r, count)).collect();
    let want = make_expected::<T>(op, world, count);
    let outputs = if in_place {
        let mut bufs = inputs.clone();
        comm.all_reduce_in_place(&mut bufs, op).unwrap();
        bufs
    } else {
        let mut outs = vec![vec![T::from_i64(99); count]; world];
        comm.all_reduce(&inputs, &mut outs, op).unwrap();
        // Inputs are untouched.
        for (r, input) in inputs.iter().enumerate() {
            assert_eq!(
                input,
                &make_input::<T>(op, r, count),
                "rank {r}'s input changed"
            );
        }
        outs
    };
    for (rank, out) in outputs.iter().enumerate() {
        let (wrong, first) = compare(rank, out, &want, 4);
        assert_eq!(
            wrong,
            0,
            "{} {op} world {world} count {count} in_place {in_place}: {wrong} wrong, first {}",
            T::DTYPE,
            first
                .iter()
                .map(|m| m.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
}

fn lengths(world: usize) -> Vec<usize> {
    let mut v = vec![0, 1, world.saturating_sub(1), world + 1, 97, 1009];
    v.sort();
    v.dedup();
    v
}

#[test]
fn sum_f32_every_world_length_and_chunk() {
    for world in 1..=8 {
        for count in lengths(world) {
            let segment = count.div_ceil(world).max(1);
            for chunk in [1, 3, 64, segment] {
                for transport in [EdgeTransport::Peer, EdgeTransport::Staged] {
                    let comm =
                        Communicator::host_with(world, config(chunk, 2, transport, None)).unwrap();
                    for in_place in [true, false] {
                        run_case::<f32>(&comm, count, ReduceOp::Sum, in_place);
                    }
                }
            }
        }
    }
}

fn every_op<T: Element>(comm: &Communicator, count: usize) {
    for op in ReduceOp::ALL {
        for in_place in [true, false] {
            run_case::<T>(comm, count, op, in_place);
        }
    }
}

#[test]
fn every_type_and_op() {
    for world in [1, 2, 3, 5, 8] {
        for count in [0, 1, world + 1, 257] {
            let comm =
                Communicator::host_with(world, config(16, 3, EdgeTransport::Peer, None)).unwrap();
            every_op::<f16>(&comm, count);
            every_op::<bf16>(&comm, count);
            every_op::<f32>(&comm, count);
            every_op::<f64>(&comm, count);
            every_op::<i8>(&comm, count);
            every_op::<u8>(&comm, count);
            every_op::<i32>(&comm, count);
            every_op::<u32>(&comm, count);
            every_op::<i64>(&comm, count);
            every_op::<ringreduce::F8E4M3>(&comm, count);
            every_op::<ringreduce::F8E5M2>(&comm, count);
            every_op::<u64>(&comm, count);
        }
    }
}

#[test]
fn random_delays_shake_the_schedule() {
    for seed in 1..=12u64 {
        let world = 2 + (seed as usize % 5);
        let transport = if seed % 2 == 0 {
            EdgeTransport::Peer
        } else {
            EdgeTransport::Staged
        };
        let comm = Communicator::host_with(
            world,
            config(7, 1 + seed as usize % 3, transport, Some(seed)),
        )
        .unwrap();
        for count in [1, 50, 301] {
            run_case::<i32>(&comm, count, ReduceOp::Sum, seed % 3 == 0);
            run_case::<f64>(&comm, count, ReduceOp::Avg, seed % 3 != 0);
        }
    }
}

#[test]
fn a_communicator_is_reused_across_shapes() {
    let comm = Communicator::host_with(4, config(5, 2, EdgeTransport::Peer, Some(7))).unwrap();
    for count in [10, 3, 10, 0, 1000, 10] {
        run_case::<u64>(&comm, count, ReduceOp::Max, count % 2 == 0);
    }
    comm.close().unwrap();
}

#[test]
fn large_buffers_64_mib() {
    // 4 ranks × 16 Mi f32 = 64 MiB per rank.
    let count = 16 << 20;
    let comm = Communicator::host_with(4, config(1 << 20, 4, EdgeTransport::Peer, None)).unwrap();
    run_case::<f32>(&comm, count, ReduceOp::Sum, true);
}

#[test]
fn ring_allreduce_sums_in_place() {
    let mut bufs: Vec<Vec<i64>> = (0..5).map(|r| make_input(ReduceOp::Sum, r, 33)).collect();
    ringreduce::ring_allreduce(&mut bufs).unwrap();
    let want = make_expected::<i64>(ReduceOp::Sum, 5, 33);
    assert!(bufs.iter().all(|b| b == &want));
}

fn peer_reading(algorithm: ringreduce::Algorithm, seed: Option<u64>) -> HostConfig {
    HostConfig {
        algorithm,
        delay_seed: seed,
        ..HostConfig::default()
    }
}

/// The one-shot and the two-shot on rank threads (with schedule shaking) and on the pool (the
/// executor's path for blocking calls of these plans: module `exec::host::pool`).
#[test]
fn oneshot_and_twoshot_every_world_length_op_and_type() {
    for (world, algorithm, seed) in (1..=8).flat_map(|w| {
        [
            (ringreduce::Algorithm::OneShot, Some(w as u64)),
            (ringreduce::Algorithm::TwoShot, Some(w as u64)),
            (ringreduce::Algorithm::OneShot, None),
            (ringreduce::Algorithm::TwoShot, None),
        ]
        .map(|(a, seed)| (w, a, seed))
    }) {
        let comm = Communicator::host_with(world, peer_reading(algorithm, seed)).unwrap();
        for count in lengths(world) {
            for in_place in [true, false] {
                for op in ReduceOp::ALL {
                    run_case::<f32>(&comm, count, op, in_place);
                    run_case::<i64>(&comm, count, op, in_place);
                }
            }
        }
        for in_place in [true, false] {
            for op in ReduceOp::ALL {
                run_case::<f16>(&comm, 1009, op, in_place);
                run_case::<bf16>(&comm, 1009, op, in_place);
                run_case::<f64>(&comm, 97, op, in_place);
                run_case::<i8>(&comm, 97, op, in_place);
                run_case::<u8>(&comm, 97, op, in_place);
                run_case::<i32>(&comm, 97, op, in_place);
                run_case::<u32>(&comm, 97, op, in_place);
                run_case::<u64>(&comm, 97, op, in_place);
            }
        }
    }
}

/// `Auto` on host ranks runs the pushed two-shot at every size up to its rank limit and the ring
/// beyond (`exec::algorithm::select`, `Reach::Host`); over staged edges it picks the staged one-shot for small
/// messages and the ring for large ones on one communicator, and calls of both kinds alternate
/// on the same buffers.
#[test]
fn auto_picks_by_edges_and_size() {
    use ringreduce::exec::algorithm::Reach;
    use ringreduce::exec::algorithm::STAGED_ONESHOT_AUTO_MAX_BYTES;
    use ringreduce::plan::twoshot::MAX_RANKS;
    use ringreduce::{Algorithm, Transport};
    let auto = |world: usize, transport: Transport| {
        let config = HostConfig {
            algorithm: Algorithm::Auto,
            transport,
            chunk_elems: 1 << 20,
            ..HostConfig::default()
        };
        Communicator::host_with(world, config).unwrap()
    };
    let peer = auto(4, Transport::Peer);
    let all_reduce = ringreduce::Collective::AllReduce;
    for bytes in [4, 4 << 10, 4 << 20, 1 << 30] {
        for in_place in [true, false] {
            assert_eq!(peer.algorithm_for(bytes, in_place), Algorithm::TwoShot);
            // The per-collective answer for the all-reduce is the same one.
            assert_eq!(
                peer.algorithm_for_collective(&all_reduce, bytes, in_place),
                Algorithm::TwoShot
            );
        }
    }
    // What ran, as the executor says (algorithm, form, reach, in place).
    let ran = |c: &Communicator| {
        let r = c.last_ran().expect("a call ran");
        (r.algorithm, r.form, r.reach, r.in_place)
    };
    let threads = ringreduce::Form::HostThreads;
    for count in [1000, 17, 1 << 16] {
        run_case::<f32>(&peer, count, ReduceOp::Sum, true);
        let want = (Algorithm::TwoShot, threads, Reach::Host, true);
        assert_eq!(ran(&peer), want);
        run_case::<f32>(&peer, count, ReduceOp::Max, false);
        assert_eq!(
            ran(&peer),
            (Algorithm::TwoShot, threads, Reach::Host, false)
        );
    }
    let wide = auto(MAX_RANKS + 1, Transport::Peer);
    assert_eq!(wide.algorithm_for(4, true), Algorithm::Ring);
    run_case::<i32>(&wide, 100, ReduceOp::Sum, true);
    assert_eq!(ran(&wide), (Algorithm::Ring, threads, Reach::Host, true));
    // Staged at 4 ranks: the limit is half of the two-rank one.
    let staged = auto(4, Transport::Staged);
    let big = STAGED_ONESHOT_AUTO_MAX_BYTES / 2 / 4 + 1;
    assert_eq!(staged.algorithm_for(1000 * 4, true), Algorithm::OneShot);
    assert_eq!(
        staged.algorithm_for_collective(&all_reduce, 1000 * 4, true),
        Algorithm::OneShot
    );
    assert_eq!(staged.algorithm_for(big * 4, false), Algorithm::Ring);
    for count in [1000, big, 17, big, 1000] {
        run_case::<f32>(&staged, count, ReduceOp::Sum, true);
        let want = match count == big {
            true => Algorithm::Ring,
            false => Algorithm::OneShot,
        };
        assert_eq!(ran(&staged), (want, threads, Reach::HostStaged, true));
        run_case::<f32>(&staged, count, ReduceOp::Max, false);
    }
}

/// fp8 meetings (the one-shot's and the two-shot's peer reduction) accumulate in f32 and round
/// once, as the peer kernels do: 16 + 1 + 1 is 18 in e4m3, where rounding after each step
/// would stay at 16 (16 + 1 = 17 is a tie, which goes to the even 16).
#[test]
fn fp8_meetings_accumulate_in_f32() {
    use ringreduce::{Algorithm, F8E4M3};
    for algorithm in [Algorithm::OneShot, Algorithm::TwoShot] {
        let config = HostConfig {
            algorithm,
            ..HostConfig::default()
        };
        let comm = Communicator::host_with(3, config).unwrap();
        let mut bufs: Vec<Vec<F8E4M3>> = [16.0, 1.0, 1.0]
            .iter()
            .map(|&v| vec![F8E4M3::from_f32(v); 7])
            .collect();
        comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum).unwrap();
        for buf in &bufs {
            assert!(
                buf.iter().all(|&x| x.to_f32() == 18.0),
                "{algorithm:?}: {buf:?}"
            );
        }
    }
}

/// Over staged edges (ranks that cannot read each other's device memory) the one-shot publishes
/// each rank's source into host memory and folds every rank's host copy: exact for every world,
/// count, operator and placement, on the plan a GPU without peer access would run.
#[test]
fn the_staged_oneshot_is_exact() {
    for world in [2, 3, 5] {
        let config = HostConfig {
            algorithm: ringreduce::Algorithm::OneShot,
            transport: ringreduce::Transport::Staged,
            ..HostConfig::default()
        };
        let comm = Communicator::host_with(world, config).unwrap();
        for count in [1, 7, 1000, 65_537] {
            for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
                for in_place in [false, true] {
                    run_case::<f32>(&comm, count, op, in_place);
                }
            }
            run_case::<i32>(&comm, count, ReduceOp::Prod, false);
            run_case::<f64>(&comm, count, ReduceOp::Min, true);
        }
    }
}

/// `Auto` over staged edges: the staged one-shot for small messages, the ring above the limit
/// (scaled by 2/n) — and, with deterministic folds on more than two ranks, the staged one-shot
/// at every size (it folds in rank order; the ring does not). The two-shot cannot run staged and
/// is refused when the communicator is made.
#[test]
fn auto_over_staged_edges_takes_the_staged_oneshot_for_small_messages() {
    use ringreduce::exec::algorithm::STAGED_ONESHOT_AUTO_MAX_BYTES;
    use ringreduce::{Algorithm, Transport};
    let staged = |deterministic| HostConfig {
        algorithm: Algorithm::Auto,
        transport: Transport::Staged,
        deterministic,
        ..HostConfig::default()
    };
    let comm = Communicator::host_with(4, staged(false)).unwrap();
    let limit = STAGED_ONESHOT_AUTO_MAX_BYTES / 2;
    assert_eq!(comm.algorithm_for(limit, true), Algorithm::OneShot);
    assert_eq!(comm.algorithm_for(limit + 4, true), Algorithm::Ring);
    for count in [limit / 4, limit / 4 + 1, 3, limit / 4 + 1] {
        run_case::<f32>(&comm, count, ReduceOp::Sum, true);
        run_case::<f32>(&comm, count, ReduceOp::Avg, false);
    }
    let deterministic = Communicator::host_with(4, staged(true)).unwrap();
    assert_eq!(
        deterministic.algorithm_for(64 << 20, true),
        Algorithm::OneShot
    );
    run_case::<f32>(&deterministic, limit, ReduceOp::Sum, true);
    let twoshot = HostConfig {
        algorithm: Algorithm::TwoShot,
        ..staged(false)
    };
    let err = Communicator::host_with(4, twoshot)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("staged edges cannot"), "{err}");
}
