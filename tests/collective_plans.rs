//! Every collective's plans pass the checker (shape, enqueue, races over two calls, the symbolic
//! result) for worlds 1 to 16, counts including 0, 1, primes and non-multiples of the world, in
//! and out of place, peer and staged edges; planted faults of each kind are rejected.

use ringreduce::check::{check, find_instr, waited};
use ringreduce::plan::{
    BufKind, Collective, CollectiveSpec, EdgeTransport, OneShotSpec, Op, Phase, Plan, Ranks,
    StreamKind, Transfer,
};
use ringreduce::ReduceOp;

fn collectives(world: usize) -> Vec<Collective> {
    let mut all = vec![
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::AllToAll,
    ];
    for root in [0, world / 2, world - 1] {
        all.push(Collective::Broadcast { root });
        all.push(Collective::Reduce { root });
    }
    all.push(pipeline(world, 5));
    all
}

/// Every rank sends to its successor and receives from its predecessor, plus a self-transfer
/// and a rank that sends twice: the exchange a pipeline makes.
fn pipeline(world: usize, count: usize) -> Collective {
    let mut transfers: Vec<Transfer> = (0..world)
        .map(|r| Transfer {
            from: r,
            to: (r + 1) % world,
            count: count + r,
        })
        .collect();
    transfers.push(Transfer {
        from: 0,
        to: 0,
        count,
    });
    transfers.push(Transfer {
        from: world - 1,
        to: 0,
        count: 1,
    });
    Collective::SendRecv { transfers }
}

fn spec(c: &Collective, world: usize, count: usize, chunk: usize, slots: usize) -> CollectiveSpec {
    CollectiveSpec::new(c.clone(), world, count, chunk, slots, EdgeTransport::Peer)
}

fn variants(
    c: &Collective,
    world: usize,
    count: usize,
    chunk: usize,
    slots: usize,
) -> Vec<CollectiveSpec> {
    let mut out = Vec::new();
    for transport in [EdgeTransport::Peer, EdgeTransport::Staged] {
        for in_place in [false, true] {
            if in_place && !c.has_in_place() {
                continue;
            }
            let ops: &[ReduceOp] = if c.reduces() {
                &[ReduceOp::Sum, ReduceOp::Avg]
            } else {
                &[ReduceOp::Sum]
            };
            for &op in ops {
                let mut s = spec(c, world, count, chunk, slots);
                s.ring.transports = vec![transport; world];
                s.ring.in_place = in_place;
                s.ring.op = op;
                out.push(s);
            }
        }
    }
    // A ring with one staged edge, the others peer.
    if world > 2 {
        let mut s = spec(c, world, count, chunk, slots);
        s.ring.transports[1] = EdgeTransport::Staged;
        out.push(s);
    }
    out
}

fn proves(s: &CollectiveSpec) {
    let plan = s.build().unwrap_or_else(|e| panic!("{s:?}: {e}"));
    check(&plan).unwrap_or_else(|e| {
        panic!(
            "{:?} world {} count {}: {e}",
            s.collective, s.ring.world, s.ring.count
        )
    });
}

#[test]
fn every_collective_is_proven_for_small_worlds() {
    for world in 1..=6 {
        for c in collectives(world) {
            for count in [0, 1, 2, 7, 13] {
                for (chunk, slots) in [(1, 1), (3, 2), (64, 3)] {
                    for s in variants(&c, world, count, chunk, slots) {
                        proves(&s);
                    }
                }
            }
        }
    }
}

#[test]
fn every_collective_is_proven_up_to_sixteen_ranks() {
    for world in 7..=16 {
        for c in collectives(world) {
            for count in [0, 1, 17] {
                for s in variants(&c, world, count, 5, 2) {
                    proves(&s);
                }
            }
        }
    }
}

#[test]
fn large_counts_check_quickly() {
    // 2^28 + 3 elements, 8 ranks, 1 Mi-element chunks: a few hundred chunks per block.
    for c in collectives(8) {
        let s = spec(&c, 8, (1 << 24) + 3, 1 << 20, 3);
        proves(&s);
    }
}

fn build(c: Collective, world: usize, count: usize, in_place: bool, op: ReduceOp) -> Plan {
    let mut s = spec(&c, world, count, 4, 2);
    s.ring.in_place = in_place;
    s.ring.op = op;
    let plan = s.build().unwrap();
    check(&plan).unwrap();
    plan
}

fn rejects(plan: &Plan, needle: &str) {
    let err = check(plan).expect_err("a broken plan must be rejected");
    assert!(err.0.contains(needle), "expected {needle:?}, got: {err}");
}

/// The first instruction of `phase` matching `pred`, removed.
fn without(plan: &Plan, pred: impl Fn(usize, &ringreduce::plan::Instr) -> bool) -> Plan {
    let (rank, i) = find_instr(plan, pred).expect("the plan has such an instruction");
    let mut broken = plan.clone();
    broken.ranks[rank].remove(i);
    broken
}

#[test]
fn all_gather_block_pushed_to_the_wrong_place_is_caught() {
    let plan = build(Collective::AllGather, 3, 8, false, ReduceOp::Sum);
    let (rank, i) = find_instr(&plan, |_, ins| {
        matches!(ins.op, Op::Copy { .. }) && ins.tag.phase == Phase::AllGather
    })
    .unwrap();
    let mut broken = plan.clone();
    let Op::Copy { src, mut dst } = broken.ranks[rank][i].op else {
        unreachable!()
    };
    dst.offset = (dst.offset + 8) % 24;
    broken.ranks[rank][i].op = Op::Copy { src, dst };
    assert!(check(&broken).is_err());
    // Without the local copy, the rank's own block is never written.
    let broken = without(&plan, |_, ins| ins.tag.phase == Phase::Local);
    rejects(&broken, "is never written");
}

#[test]
fn all_gather_forwarding_a_block_it_has_not_received_is_a_race() {
    let plan = build(Collective::AllGather, 4, 8, true, ReduceOp::Sum);
    let broken = without(&plan, |r, ins| {
        ins.stream == StreamKind::Send
            && ins.tag.phase == Phase::AllGather
            && waited(ins)
                .is_some_and(|e| plan.events[e.0].rank != r && plan.events[e.0].what == "sent")
    });
    rejects(&broken, "data race");
}

#[test]
fn reduce_scatter_without_the_receivers_entry_is_a_cross_call_race() {
    let plan = build(Collective::ReduceScatter, 3, 8, false, ReduceOp::Sum);
    let broken = without(&plan, |r, ins| {
        ins.stream == StreamKind::Send
            && waited(ins)
                .is_some_and(|e| plan.events[e.0].rank != r && plan.events[e.0].what == "entry")
    });
    rejects(&broken, "data race");
}

#[test]
fn reduce_scatter_folding_the_wrong_block_is_caught() {
    let plan = build(Collective::ReduceScatter, 3, 8, false, ReduceOp::Sum);
    let (rank, i) = find_instr(&plan, |_, ins| matches!(ins.op, Op::Reduce { .. })).unwrap();
    let mut broken = plan.clone();
    let Op::Reduce { dst, mut a, b } = broken.ranks[rank][i].op else {
        unreachable!()
    };
    a.offset = (a.offset + 8) % 24; // the receiver's own contribution from another block
    broken.ranks[rank][i].op = Op::Reduce { dst, a, b };
    rejects(&broken, "reduces different elements");
}

#[test]
fn reduce_scatter_in_place_result_must_land_in_the_ranks_own_block() {
    // Deliver every final reduction one block later: the rank's own block keeps its input.
    let plan = build(Collective::ReduceScatter, 2, 6, true, ReduceOp::Sum);
    let mut broken = plan.clone();
    for program in &mut broken.ranks {
        for ins in program.iter_mut() {
            if let Op::Reduce { dst, a, b } = ins.op {
                let shift = |mut r: ringreduce::plan::Region| {
                    r.offset = (r.offset + 6) % 12;
                    r
                };
                ins.op = Op::Reduce {
                    dst: shift(dst),
                    a: shift(a),
                    b,
                };
            }
        }
    }
    assert!(check(&broken).is_err());
}

#[test]
fn broadcast_forwarding_before_arrival_is_a_race() {
    let plan = build(
        Collective::Broadcast { root: 1 },
        4,
        9,
        false,
        ReduceOp::Sum,
    );
    let broken = without(&plan, |r, ins| {
        ins.stream == StreamKind::Send
            && waited(ins)
                .is_some_and(|e| plan.events[e.0].rank != r && plan.events[e.0].what == "sent")
    });
    rejects(&broken, "data race");
}

#[test]
fn broadcast_from_the_wrong_root_is_caught() {
    let mut plan = build(Collective::Broadcast { root: 1 }, 3, 4, true, ReduceOp::Sum);
    plan.collective = Collective::Broadcast { root: 2 };
    rejects(&plan, "which nothing has written");
}

#[test]
fn reduce_without_its_average_or_with_a_rank_twice_is_caught() {
    let plan = build(Collective::Reduce { root: 2 }, 4, 6, false, ReduceOp::Avg);
    let broken = without(&plan, |_, ins| matches!(ins.op, Op::Scale { .. }));
    rejects(&broken, "averaged 0 times");
    // Fold the sender's input instead of its partial sum: the receiver's own rank twice.
    let plan = build(Collective::Reduce { root: 0 }, 3, 6, false, ReduceOp::Sum);
    let (rank, i) = find_instr(&plan, |_, ins| {
        matches!(ins.op, Op::Reduce { .. }) && ins.tag.step == 1
    })
    .unwrap();
    let mut broken = plan.clone();
    let Op::Reduce { dst, a, .. } = broken.ranks[rank][i].op else {
        unreachable!()
    };
    broken.ranks[rank][i].op = Op::Reduce { dst, a, b: a };
    rejects(&broken, "twice");
}

#[test]
fn reduce_in_place_must_not_write_a_non_roots_buffer() {
    let plan = build(Collective::Reduce { root: 0 }, 3, 5, true, ReduceOp::Sum);
    let mut broken = plan.clone();
    // Rank 1 (position 0 of the chain) copies zeros of nothing: overwrite its buffer with the
    // root's value instead, after the collective.
    let src = ringreduce::plan::Region {
        buf: plan.buffer(2, BufKind::Scratch).unwrap(),
        offset: 0,
        count: 5,
    };
    let dst = ringreduce::plan::Region {
        buf: plan.buffer(2, BufKind::Output).unwrap(),
        offset: 0,
        count: 5,
    };
    let at = broken.ranks[2].len() - 1;
    broken.ranks[2].insert(
        at,
        ringreduce::plan::Instr {
            stream: StreamKind::Main,
            op: Op::Copy { src, dst },
            tag: ringreduce::plan::Tag::FINISH,
        },
    );
    rejects(&broken, "holds the contribution of rank(s) [1]");
}

#[test]
fn all_to_all_block_in_the_wrong_slot_is_caught() {
    let plan = build(Collective::AllToAll, 3, 4, false, ReduceOp::Sum);
    let (rank, i) = find_instr(&plan, |_, ins| {
        ins.tag.phase == Phase::AllToAll && matches!(ins.op, Op::Copy { .. })
    })
    .unwrap();
    let mut broken = plan.clone();
    let Op::Copy { mut src, dst } = broken.ranks[rank][i].op else {
        unreachable!()
    };
    src.offset = (src.offset + 4) % 12; // another block of the sender's input
    broken.ranks[rank][i].op = Op::Copy { src, dst };
    rejects(&broken, "holds element");
}

#[test]
fn send_recv_finishing_before_the_push_is_caught() {
    let plan = build(pipeline(3, 6), 3, 0, false, ReduceOp::Sum);
    let broken = without(&plan, |r, ins| {
        ins.stream == StreamKind::Main && waited(ins).is_some_and(|e| plan.events[e.0].rank != r)
    });
    rejects(&broken, "can finish before");
    // Receiving the wrong transfer's data.
    let (rank, i) = find_instr(&plan, |_, ins| {
        ins.tag.phase == Phase::SendRecv && matches!(ins.op, Op::Copy { .. })
    })
    .unwrap();
    let mut broken = plan.clone();
    let Op::Copy { mut src, dst } = broken.ranks[rank][i].op else {
        unreachable!()
    };
    src.buf = plan.buffer(rank, BufKind::SendBuf(3)).unwrap();
    broken.ranks[rank][i].op = Op::Copy { src, dst };
    rejects(&broken, "send buffer 3");
}

/// The one-shot form of `c` (every collective but send/recv), built and proven.
fn oneshot(c: &Collective, world: usize, count: usize, in_place: bool, op: ReduceOp) -> Plan {
    let spec = OneShotSpec {
        world,
        count,
        in_place,
        op,
    };
    let plan = spec
        .build_collective(c)
        .unwrap_or_else(|e| panic!("{c:?} world {world} count {count}: {e}"));
    check(&plan).unwrap_or_else(|e| {
        panic!("one-shot {c:?} world {world} count {count} in place {in_place}: {e}")
    });
    plan
}

#[test]
fn every_one_shot_collective_is_proven_up_to_sixteen_ranks() {
    for world in 1..=16 {
        let counts: &[usize] = if world <= 6 {
            &[0, 1, 2, 7, 13]
        } else {
            &[0, 1, 17]
        };
        for c in collectives(world) {
            if matches!(c, Collective::SendRecv { .. }) {
                continue;
            }
            for &count in counts {
                for in_place in [false, true] {
                    if in_place && !c.has_in_place() {
                        continue;
                    }
                    for op in [ReduceOp::Sum, ReduceOp::Avg] {
                        if op == ReduceOp::Avg && !c.reduces() {
                            continue;
                        }
                        oneshot(&c, world, count, in_place, op);
                    }
                }
            }
        }
    }
}

#[test]
fn send_recv_has_a_one_shot_form_wherever_it_moves_something() {
    let spec = |world| OneShotSpec {
        world,
        count: 0,
        in_place: false,
        op: ReduceOp::Sum,
    };
    // A pipeline of mixed counts: rank 0 receives three transfers, ranks 1 and 2 one each.
    for world in 2..=5 {
        let plan = spec(world).build_collective(&pipeline(world, 4)).unwrap();
        assert_eq!(plan.count, 4 + world - 1, "the longest transfer");
        check(&plan).unwrap_or_else(|e| panic!("pipeline of {world}: {e}"));
    }
    // Rank 2 of three takes no part: it joins the meetings on a buffer of no elements.
    let pair = Collective::SendRecv {
        transfers: vec![Transfer {
            from: 0,
            to: 1,
            count: 4,
        }],
    };
    for world in 2..=4 {
        let plan = spec(world).build_collective(&pair).unwrap();
        check(&plan).unwrap_or_else(|e| panic!("a pair among {world}: {e}"));
    }
    let empty = Collective::SendRecv { transfers: vec![] };
    assert!(spec(2).build_collective(&empty).is_err());
}

/// Rank `rank`'s `k`-th peer reduce, for planting faults.
fn meeting_mut(plan: &mut Plan, rank: usize, k: usize) -> &mut Op {
    plan.ranks[rank]
        .iter_mut()
        .map(|i| &mut i.op)
        .filter(|op| matches!(op, Op::PeerReduce { .. }))
        .nth(k)
        .expect("the rank has that many meetings")
}

#[test]
fn one_shot_all_gather_copying_from_the_wrong_rank_is_caught() {
    let mut plan = oneshot(&Collective::AllGather, 3, 4, false, ReduceOp::Sum);
    if let Op::PeerReduce { ranks, .. } = meeting_mut(&mut plan, 0, 1) {
        *ranks = Ranks::only(2); // block 1 filled from rank 2
    }
    rejects(&plan, "holds the contribution of rank(s) [2]");
    // In place, a rank that copies its own block over itself from a peer.
    let mut plan = oneshot(&Collective::AllGather, 3, 4, true, ReduceOp::Sum);
    if let Op::PeerReduce { dst, .. } = meeting_mut(&mut plan, 1, 0) {
        dst.offset = 4; // rank 1's own block, which rank 0 and 2 read
    }
    assert!(check(&plan).is_err());
}

#[test]
fn one_shot_reduce_scatter_reading_the_wrong_block_is_caught() {
    let mut plan = oneshot(&Collective::ReduceScatter, 3, 5, false, ReduceOp::Sum);
    if let Op::PeerReduce { offset, .. } = meeting_mut(&mut plan, 2, 0) {
        *offset = 0; // block 0 instead of block 2
    }
    rejects(&plan, "holds element");
    // Summing only some ranks.
    let mut plan = oneshot(&Collective::ReduceScatter, 3, 5, true, ReduceOp::Sum);
    if let Op::PeerReduce { ranks, .. } = meeting_mut(&mut plan, 1, 0) {
        *ranks = Ranks(0b011);
    }
    assert!(check(&plan).is_err());
}

#[test]
fn one_shot_rank_that_skips_the_meeting_is_caught() {
    // A non-root of the reduce that does not join: the root's barriers would never meet.
    let plan = oneshot(&Collective::Reduce { root: 1 }, 3, 6, false, ReduceOp::Sum);
    let broken = without(&plan, |r, ins| {
        r == 2 && matches!(ins.op, Op::PeerReduce { .. })
    });
    rejects(&broken, "peer reduces");
    // The broadcast root in place, rewriting its buffer (with its own values) while the
    // others read it: a race, though every value stays the same.
    let mut plan = oneshot(
        &Collective::Broadcast { root: 0 },
        2,
        6,
        true,
        ReduceOp::Sum,
    );
    if let Op::PeerReduce { dst, count, .. } = meeting_mut(&mut plan, 0, 0) {
        dst.count = 6;
        *count = 6;
    }
    rejects(&plan, "data race");
    // A rank writing into the root's buffer.
    let mut plan = oneshot(
        &Collective::Broadcast { root: 0 },
        2,
        6,
        true,
        ReduceOp::Sum,
    );
    let buf0 = plan.buffer(0, BufKind::Output).unwrap();
    if let Op::PeerReduce { dst, .. } = meeting_mut(&mut plan, 1, 0) {
        dst.buf = buf0;
    }
    rejects(&plan, "another rank's buffer");
}

#[test]
fn one_shot_reduce_without_its_average_is_caught() {
    let plan = oneshot(&Collective::Reduce { root: 2 }, 4, 6, true, ReduceOp::Avg);
    let broken = without(&plan, |_, ins| matches!(ins.op, Op::Scale { .. }));
    rejects(&broken, "averaged 0 times");
}
