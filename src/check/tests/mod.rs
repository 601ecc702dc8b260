//! Break tests of the checker: real plans (ring, one-shot, two-shot) pass; each with a fault
//! planted is rejected, by the check that owns that fault, with a message that names it.
//!
//! `symbolic` holds the run-by-run symbolic execution to an element-by-element reference.

mod hierarchical_plans;
mod race_check_oracle;
mod symbolic;

use super::*;
use crate::element::ReduceOp;
use crate::plan::{
    BufKind, EdgeTransport, Gather, OneShotSpec, Phase, Ranks, RingSpec, StreamKind, Tag,
};

fn spec(
    world: usize,
    count: usize,
    chunk: usize,
    slots: usize,
    transport: EdgeTransport,
) -> RingSpec {
    RingSpec::new(world, count, chunk, slots, transport)
}

#[test]
fn ring_plans_pass_for_small_shapes() {
    for world in 1..=5 {
        for count in [0, 1, 2, 3, 5, 7, 13, 31] {
            for chunk in [1, 2, 3, 8] {
                for slots in [1, 2, 3] {
                    for transport in [EdgeTransport::Peer, EdgeTransport::Staged] {
                        for in_place in [true, false] {
                            for op in [ReduceOp::Sum, ReduceOp::Avg] {
                                let mut s = spec(world, count, chunk, slots, transport);
                                s.in_place = in_place;
                                s.op = op;
                                let plan = s.build().unwrap();
                                check(&plan).unwrap_or_else(|e| panic!("{s:?}: {e}"));
                            }
                        }
                    }
                }
            }
        }
    }
}

fn rejects(plan: &Plan, needle: &str) {
    let err = check(plan).expect_err("a broken plan must be rejected");
    assert!(
        err.0.contains(needle),
        "expected a rejection mentioning {needle:?}, got: {err}"
    );
}

#[test]
fn dropped_wait_is_a_race() {
    let plan = spec(3, 20, 3, 2, EdgeTransport::Peer).build().unwrap();
    // The receiver's reduce waits for the sender's push: drop the first such wait.
    let (rank, i) = find_instr(&plan, |_, ins| {
        ins.stream == StreamKind::Reduce
            && waited(ins).is_some()
            && ins.tag.phase == Phase::ReduceScatter
    })
    .unwrap();
    let mut broken = plan.clone();
    broken.ranks[rank].remove(i);
    rejects(&broken, "data race");
}

#[test]
fn slot_reused_before_its_credit_is_a_race() {
    // One slot: every push after the first must wait for the previous reduce to free it.
    let plan = spec(2, 16, 2, 1, EdgeTransport::Peer).build().unwrap();
    let (rank, i) = find_instr(&plan, |r, ins| {
        ins.stream == StreamKind::Send
            && waited(ins)
                .is_some_and(|e| plan.events[e.0].rank != r && plan.events[e.0].what == "reduced")
    })
    .unwrap();
    let mut broken = plan.clone();
    broken.ranks[rank].remove(i);
    rejects(&broken, "data race on Slots");
}

#[test]
fn chunk_sent_to_the_wrong_rank_is_caught() {
    let plan = spec(3, 12, 4, 2, EdgeTransport::Peer).build().unwrap();
    let (rank, i) = find_instr(&plan, |_, ins| {
        matches!(ins.op, Op::Copy { .. }) && ins.tag.phase == Phase::AllGather
    })
    .unwrap();
    let mut broken = plan.clone();
    let Op::Copy { src, mut dst } = broken.ranks[rank][i].op else {
        unreachable!()
    };
    // Deliver to the rank after the intended receiver instead.
    let intended = plan.decl(dst.buf).rank;
    dst.buf = plan.buffer((intended + 1) % 3, BufKind::Output).unwrap();
    broken.ranks[rank][i].op = Op::Copy { src, dst };
    assert!(check(&broken).is_err());
}

#[test]
fn wait_before_record_is_rejected() {
    let plan = spec(2, 8, 4, 2, EdgeTransport::Peer).build().unwrap();
    // Move rank 0's first local wait (its side stream waiting on its own Entry) to the front.
    let (rank, i) = find_instr(&plan, |r, ins| {
        waited(ins).is_some_and(|e| plan.events[e.0].rank == r)
    })
    .unwrap();
    let mut broken = plan.clone();
    let w = broken.ranks[rank].remove(i);
    broken.ranks[rank].insert(0, w);
    rejects(&broken, "silent no-op");
}

#[test]
fn a_second_wait_on_one_stream_for_a_remote_event_is_rejected() {
    for transport in [EdgeTransport::Peer, EdgeTransport::Staged] {
        let plan = spec(3, 24, 4, 2, transport).build().unwrap();
        check(&plan).unwrap();
        // Rank r's first wait for another rank's event, repeated right after itself: harmless
        // for CUDA events, but a counter wait would wait for a second signal that never comes.
        let (rank, i) = find_instr(&plan, |r, ins| {
            waited(ins).is_some_and(|e| plan.events[e.0].rank != r)
        })
        .unwrap();
        let mut broken = plan.clone();
        let again = broken.ranks[rank][i];
        broken.ranks[rank].insert(i + 1, again);
        rejects(&broken, "at most once per call");
        // The same wait on another stream of the rank pairs with the same signal: accepted by
        // the shape check (each stream counts its own).
        let mut other = plan.clone();
        let mut moved = again;
        moved.stream = StreamKind::ALL
            .into_iter()
            .find(|&s| s != again.stream)
            .unwrap();
        other.ranks[rank].insert(i + 1, moved);
        check_shape(&other).unwrap();
    }
}

#[test]
fn cross_rank_wait_cycle_is_a_deadlock() {
    let plan = spec(2, 8, 4, 2, EdgeTransport::Peer).build().unwrap();
    // Rank 0 waits, first thing, for rank 1's last record; rank 1 needs rank 0 to progress.
    let last = plan.events.iter().rposition(|e| e.rank == 1).unwrap();
    let mut broken = plan.clone();
    broken.ranks[0].insert(
        0,
        Instr {
            stream: StreamKind::Main,
            op: Op::Wait(EventId(last)),
            tag: crate::plan::Tag::ENTRY,
        },
    );
    rejects(&broken, "deadlock");
}

#[test]
fn counting_a_contribution_twice_is_caught() {
    let plan = spec(2, 4, 4, 1, EdgeTransport::Peer).build().unwrap();
    let (rank, i) = find_instr(&plan, |_, ins| matches!(ins.op, Op::Reduce { .. })).unwrap();
    let mut broken = plan.clone();
    let dup = broken.ranks[rank][i];
    broken.ranks[rank].insert(i + 1, dup);
    assert!(check(&broken).is_err());
}

#[test]
fn missing_finish_wait_is_caught() {
    let plan = spec(2, 8, 4, 2, EdgeTransport::Peer).build().unwrap();
    let mut broken = plan.clone();
    // Drop rank 1's Main wait on rank 0's send stream: Main would complete before the
    // all-gather push into rank 1's output lands.
    let i = broken.ranks[1]
        .iter()
        .rposition(|ins| {
            ins.stream == StreamKind::Main
                && waited(ins).is_some_and(|e| plan.events[e.0].rank == 0)
        })
        .unwrap();
    broken.ranks[1].remove(i);
    let order = enqueue_order(&broken).unwrap();
    let err = check_races(&broken, &order, 1).expect_err("Main must not finish early");
    assert!(err.0.contains("finish before"), "{err}");
}

#[test]
fn dropped_entry_wait_races_with_the_previous_call() {
    let plan = spec(2, 8, 2, 1, EdgeTransport::Peer).build().unwrap();
    // Rank 0's send stream waits for its own Entry; without it, call 2's first push into rank
    // 1's slot is ordered after nothing that follows rank 1's last reduce of call 1.
    let (rank, i) = find_instr(&plan, |r, ins| {
        ins.stream == StreamKind::Send
            && waited(ins)
                .is_some_and(|e| plan.events[e.0].rank == r && plan.events[e.0].what == "entry")
    })
    .unwrap();
    let mut broken = plan.clone();
    broken.ranks[rank].remove(i);
    rejects(&broken, "call 2");
    // One call alone is caught too: the send stream's first read of the caller's buffer is not
    // ordered after the work the caller queued on Main before the call.
    let order = enqueue_order(&broken).unwrap();
    let err = check_races(&broken, &order, 1).unwrap_err();
    assert!(err.0.contains("before work queued on rank"), "{err}");
}

#[test]
fn a_different_next_plan_without_its_entry_wait_races_on_the_callers_buffer() {
    let a = spec(2, 8, 2, 1, EdgeTransport::Peer).build().unwrap();
    let b = spec(2, 12, 3, 2, EdgeTransport::Peer).build().unwrap();
    check_sequence(&[&a, &b], &[0, 1, 0, 1]).unwrap();
    // Plan B's rank 0 send stream skips its wait on Entry: its first read of rank 0's buffer
    // is then unordered with plan A's all-gather push into that buffer.
    let (rank, i) = find_instr(&b, |r, ins| {
        r == 0
            && ins.stream == StreamKind::Send
            && waited(ins).is_some_and(|e| b.events[e.0].what == "entry")
    })
    .unwrap();
    let mut broken = b.clone();
    broken.ranks[rank].remove(i);
    let err = check_sequence(&[&a, &broken], &[0, 1]).expect_err("the race must be found");
    assert!(err.0.contains("data race on Output of rank 0"), "{err}");
}

#[test]
fn staged_plan_without_host_slot_credit_is_a_race() {
    let plan = spec(2, 16, 2, 1, EdgeTransport::Staged).build().unwrap();
    let (rank, i) = find_instr(&plan, |r, ins| {
        ins.stream == StreamKind::Send
            && waited(ins).is_some_and(|e| {
                plan.events[e.0].rank != r && plan.events[e.0].what == "copied from host"
            })
    })
    .unwrap();
    let mut broken = plan.clone();
    broken.ranks[rank].remove(i);
    rejects(&broken, "HostSlots");
}

#[test]
fn staged_sender_without_the_receivers_entry_races_across_calls() {
    let plan = spec(2, 2, 1, 1, EdgeTransport::Staged).build().unwrap();
    let (rank, i) = find_instr(&plan, |r, ins| {
        ins.stream == StreamKind::Send
            && waited(ins)
                .is_some_and(|e| plan.events[e.0].rank != r && plan.events[e.0].what == "entry")
    })
    .unwrap();
    let mut broken = plan.clone();
    broken.ranks[rank].remove(i);
    rejects(&broken, "call 2");
}

// ---- the one-shot -------------------------------------------------------------------

fn oneshot_spec(world: usize, count: usize, in_place: bool, op: ReduceOp) -> OneShotSpec {
    OneShotSpec {
        world,
        count,
        in_place,
        op,
    }
}

fn oneshot(world: usize, count: usize, in_place: bool) -> Plan {
    oneshot_spec(world, count, in_place, ReduceOp::Avg)
        .build()
        .unwrap()
}

#[test]
fn oneshot_plans_pass_for_small_shapes() {
    for world in 1..=6 {
        for count in [0, 1, 2, 7, 31] {
            for in_place in [true, false] {
                let plan = oneshot(world, count, in_place);
                check(&plan).unwrap_or_else(|e| panic!("{world} {count} {in_place}: {e}"));
            }
        }
    }
}

fn peer_reduce_at(plan: &Plan, rank: usize) -> usize {
    plan.ranks[rank]
        .iter()
        .position(|i| matches!(i.op, Op::PeerReduce { .. }))
        .expect("a peer reduce")
}

#[test]
fn oneshot_in_place_reading_the_buffer_it_overwrites_is_caught() {
    // Drop the exposed copy and read the in-place buffers directly: every rank overwrites its
    // buffer while the others still read it.
    let mut broken = oneshot(3, 8, true);
    for rank in 0..3 {
        broken.ranks[rank].remove(0);
        let i = peer_reduce_at(&broken, rank);
        if let Op::PeerReduce { src, .. } = &mut broken.ranks[rank][i].op {
            *src = BufKind::Output;
        }
    }
    // Each rank's own source is its destination (allowed: folded element by element), but
    // the peers read that buffer while its rank writes it.
    rejects(&broken, "data race on Output");
}

#[test]
fn oneshot_source_never_exposed_is_caught() {
    // Rank 1 forgets to copy its buffer into its exposed copy: peers read garbage.
    let mut broken = oneshot(3, 8, true);
    broken.ranks[1].remove(0);
    rejects(&broken, "nothing has written");
}

#[test]
fn oneshot_exposed_copy_after_the_meeting_races_with_the_readers() {
    // Rank 1 exposes its buffer only after the meeting: in the next call that copy overwrites
    // the exposed buffer... and within a call the peers read it before it is written.
    let mut broken = oneshot(2, 8, true);
    let copy = broken.ranks[1].remove(0);
    broken.ranks[1].push(copy);
    assert!(check(&broken).is_err());
}

#[test]
fn oneshot_rank_skipping_the_meeting_is_caught() {
    let mut broken = oneshot(3, 8, false);
    let i = peer_reduce_at(&broken, 2);
    broken.ranks[2].remove(i);
    rejects(&broken, "never all meet");
}

#[test]
fn oneshot_meeting_behind_a_wait_on_the_other_side_deadlocks() {
    // Rank 1 waits, before the meeting, for an event rank 0 records after it: on GPUs rank 0's
    // kernel spins at the start barrier for a kernel that waits for it.
    let mut broken = oneshot(2, 8, false);
    let e = EventId(broken.events.len());
    broken.events.push(crate::plan::EventDecl {
        rank: 0,
        stream: StreamKind::Main,
        tag: Tag::FINISH,
        what: "after the meeting",
    });
    broken.ranks[0].push(Instr {
        stream: StreamKind::Main,
        op: Op::Record(e),
        tag: Tag::FINISH,
    });
    broken.ranks[1].insert(
        0,
        Instr {
            stream: StreamKind::Main,
            op: Op::Wait(e),
            tag: Tag::FINISH,
        },
    );
    rejects(&broken, "deadlock");
}

#[test]
fn oneshot_meeting_on_a_side_stream_without_ordering_races_with_the_caller() {
    // Rank 0 runs the meeting on its Send stream with no event from Main: it can read the
    // caller's input before the caller's earlier work (on Main) wrote it, and Main can finish
    // before the meeting has: the completion rule catches it.
    let mut broken = oneshot(2, 8, false);
    let i = peer_reduce_at(&broken, 0);
    broken.ranks[0][i].stream = StreamKind::Send;
    assert!(check(&broken).is_err());
}

#[test]
fn oneshot_meeting_with_mismatched_ranges_is_caught() {
    let mut broken = oneshot(2, 8, false);
    let i = peer_reduce_at(&broken, 1);
    if let Op::PeerReduce {
        offset, count, dst, ..
    } = &mut broken.ranks[1][i].op
    {
        *offset = 1;
        *count = 7;
        dst.count = 7;
    }
    // Ranks of one meeting may read different ranges (the two-shot does); this one leaves
    // an element of its output unwritten, and the result check says so.
    rejects(&broken, "nothing has written");
}

fn twoshot(world: usize, count: usize, in_place: bool) -> Plan {
    twoshot_gathered(world, count, in_place, Gather::Pull)
}

fn twoshot_gathered(world: usize, count: usize, in_place: bool, gather: Gather) -> Plan {
    crate::plan::TwoShotSpec {
        world,
        count,
        in_place,
        op: ReduceOp::Avg,
        align: 2,
        gather,
    }
    .build()
    .unwrap()
}

#[test]
fn twoshot_plans_pass_for_small_shapes() {
    for world in 1..=6 {
        for count in [0, 1, 2, 7, 31] {
            for in_place in [true, false] {
                for gather in [Gather::Pull, Gather::Push] {
                    let plan = twoshot_gathered(world, count, in_place, gather);
                    check(&plan)
                        .unwrap_or_else(|e| panic!("{world} {count} {in_place} {gather:?}: {e}"));
                }
            }
        }
    }
}

/// Rank `rank`'s one meeting in a pushed two-shot plan, to break.
fn pushed_meeting(plan: &mut Plan, rank: usize) -> &mut Op {
    let i = peer_reduce_at(plan, rank);
    &mut plan.ranks[rank][i].op
}

#[test]
fn a_pushed_twoshot_that_skips_a_rank_leaves_its_segment_unwritten() {
    for in_place in [true, false] {
        let mut broken = twoshot_gathered(3, 12, in_place, Gather::Push);
        if let Op::PeerReduce { push, .. } = pushed_meeting(&mut broken, 1) {
            *push = Ranks::only(2);
        }
        // Rank 0's copy of segment 1 is its own input, or (out of place) never written.
        let err = check(&broken).expect_err("rank 0 lacks segment 1").0;
        assert!(
            err.contains("nothing has written") || err.contains("rank 0"),
            "{in_place}: {err}"
        );
    }
}

#[test]
fn a_twoshot_that_pushes_to_its_own_rank_or_a_rank_without_the_buffer_is_refused() {
    let mut broken = twoshot_gathered(3, 12, true, Gather::Push);
    if let Op::PeerReduce { push, .. } = pushed_meeting(&mut broken, 0) {
        *push = Ranks::ALL;
    }
    rejects(&broken, "pushes to its own rank");
    // Out of place, pushing the input's kind: a rank's Input is never written.
    let mut broken = twoshot_gathered(3, 12, false, Gather::Push);
    let input = broken.buffer(0, BufKind::Input).unwrap();
    if let Op::PeerReduce { dst, .. } = pushed_meeting(&mut broken, 0) {
        dst.buf = input;
    }
    assert!(check(&broken).is_err());
}

#[test]
fn a_push_over_another_owners_segment_is_a_race() {
    // Rank 0 reduces its own segment but writes it over segment 1 of every rank, which rank 1
    // reads and writes in the same meeting.
    for in_place in [true, false] {
        let mut broken = twoshot_gathered(3, 12, in_place, Gather::Push);
        if let Op::PeerReduce { dst, .. } = pushed_meeting(&mut broken, 0) {
            dst.offset = 4;
        }
        rejects(&broken, "data race");
    }
}

#[test]
fn twoshot_gathering_a_segment_from_a_rank_that_does_not_own_it_is_caught() {
    // Rank 0's first gather round copies segment 1 from rank 2, which only has its own
    // input (or, in place, its own unreduced value) there.
    for in_place in [true, false] {
        let mut broken = unfused(twoshot(3, 12, in_place));
        if let Op::PeerReduce { ranks, src, .. } = &mut broken.ranks[0][1].op {
            *ranks = crate::plan::Ranks::only(2);
            *src = if in_place {
                BufKind::Output
            } else {
                BufKind::Input
            };
        }
        // Rank 0's segment 1 holds rank 2's value alone: the result check sees it.
        rejects(&broken, "partial sum (ranks [2])");
    }
}

#[test]
fn twoshot_reduce_writing_beyond_its_segment_races_with_the_readers() {
    // In place, rank 1 reduces its segment into a destination that also covers segment 0,
    // which rank 0 reads from rank 1 in the same meeting.
    let mut broken = twoshot(2, 8, true);
    if let Op::PeerReduce {
        dst, offset, count, ..
    } = &mut broken.ranks[1][0].op
    {
        *offset = 0;
        *count = 8;
        *dst = Region {
            offset: 0,
            count: 8,
            ..*dst
        };
    }
    rejects(&broken, "data race on Output of rank");
}

#[test]
fn twoshot_gather_before_the_reduce_is_caught() {
    // Rank 1 gathers before it has reduced: the meetings pair its gather with the others'
    // reduce, and it copies an unreduced segment.
    let mut broken = twoshot(3, 12, false);
    broken.ranks[1].swap(0, 1);
    // As planned, rank 1's gather round 2 is now fused to its reduce: the fusion lemma sees
    // them conflict.
    rejects(&broken, "conflict: the barrier between them is needed");
    // Without the fusions, its gather meets the others' reduces: it copies rank 2's segment
    // while rank 2 writes it (and rank 0's gather meets rank 1's reduce likewise; which race
    // the check reports first depends on its map's order).
    rejects(&unfused(broken), "data race on Output of rank");
}

/// `plan` with every meeting's barriers kept (no `fused` meeting): for planting faults that the
/// race and result checks, not the fusion lemma, must find.
fn unfused(mut plan: Plan) -> Plan {
    for instr in plan.ranks.iter_mut().flatten() {
        if let Op::PeerReduce { fused, .. } = &mut instr.op {
            *fused = false;
        }
    }
    plan
}

/// Both checks reject `bad`, an order that splits meeting 0, with `needle` and the rule for
/// laying out an order in the message.
fn split_meeting_rejected(plan: &Plan, bad: &[(usize, usize)], needle: &str) {
    for err in [
        check_races(plan, bad, 1).unwrap_err(),
        check_result(plan, bad).unwrap_err(),
    ] {
        assert!(
            err.0.contains("meeting 0")
                && err.0.contains(needle)
                && err
                    .0
                    .contains("must stand together in the order, ranks 0..world"),
            "{bad:?}: {err}"
        );
    }
}

/// A caller-made order that splits a meeting (rank 1's peer reduce ahead of rank 0's, rank
/// 0's twice, rank 1's left out or moved behind another instruction) is rejected by the race
/// and the result check with a message that names what stands where — never a panic (a
/// slice past the end), never a verdict on a misread meeting.
#[test]
fn an_order_that_splits_a_meeting_is_rejected() {
    let plan = crate::plan::OneShotSpec {
        world: 2,
        count: 8,
        in_place: false,
        op: ReduceOp::Sum,
    }
    .build()
    .unwrap();
    let order = enqueue_order(&plan).unwrap();
    let (mine, theirs) = ((0, peer_reduce_at(&plan, 0)), (1, peer_reduce_at(&plan, 1)));
    // Out of place and summed, each rank's program is its peer reduce alone.
    assert_eq!(order, [mine, theirs]);
    check_races(&plan, &order, 2).unwrap();
    check_result(&plan, &order).unwrap();
    let rank1 = describe(&plan, 1, theirs.1);
    split_meeting_rejected(
        &plan,
        &[theirs, mine],
        &format!("has {rank1} where it needs {}", describe(&plan, 0, mine.1)),
    );
    split_meeting_rejected(&plan, &[mine, mine], &format!("where it needs {rank1}"));
    split_meeting_rejected(
        &plan,
        &[mine],
        &format!("has the end of the order where it needs {rank1}"),
    );
    let err = check_races(&plan, &[mine, (1, 7)], 1).unwrap_err();
    assert!(
        err.0
            .contains("rank 1 instruction 7, which the plan does not have"),
        "{err}"
    );

    // In place, rank 1 first exposes its buffer in its exposed copy: an order that puts that
    // exposure between the meeting's members is rejected, naming it.
    let plan = oneshot(2, 8, true);
    let theirs = (1, peer_reduce_at(&plan, 1));
    let copy = (1, 0);
    assert!(matches!(plan.ranks[1][0].op, Op::Expose { .. }));
    let mut moved = enqueue_order(&plan).unwrap();
    moved.retain(|&e| e != copy);
    let at = moved.iter().position(|&e| e == theirs).unwrap();
    moved.insert(at, copy);
    split_meeting_rejected(
        &plan,
        &moved,
        &format!(
            "has {} where it needs {}",
            describe(&plan, 1, 0),
            describe(&plan, 1, theirs.1)
        ),
    );
}

fn staged(world: usize, count: usize, in_place: bool) -> Plan {
    oneshot_spec(world, count, in_place, ReduceOp::Sum)
        .build_staged()
        .unwrap()
}

#[test]
fn staged_ring_plans_reach_no_peers_device_memory() {
    // The ring over staged edges moves every chunk through the sender's host slots: it runs
    // where peer access is missing, as the staged one-shot does.
    for world in 2..=4 {
        for in_place in [true, false] {
            let mut s = spec(world, 13, 3, 2, EdgeTransport::Staged);
            s.in_place = in_place;
            check_staged(&s.build().unwrap()).unwrap_or_else(|e| panic!("{s:?}: {e}"));
            let mut peer = spec(world, 13, 3, 2, EdgeTransport::Peer);
            peer.in_place = in_place;
            let err = check_staged(&peer.build().unwrap()).unwrap_err();
            assert!(err.0.contains("without peer access"), "{err}");
        }
    }
}

#[test]
fn a_staged_oneshot_reading_a_peers_device_buffer_is_refused_by_reach_alone() {
    // Rank 1 folds every rank's input instead of their host copies: the same values (the plan
    // is out of place, nothing writes the inputs), so the other checks pass; only reach sees
    // that it reads device memory of ranks 0 and 2. (Its own host copy, which the others still
    // read, becomes a plain copy: an exposure must be followed by a meeting that reads it.)
    let mut broken = staged(3, 8, false);
    if let Op::Expose { src, dst } = broken.ranks[1][0].op {
        broken.ranks[1][0].op = Op::Copy { src, dst };
    }
    let i = peer_reduce_at(&broken, 1);
    if let Op::PeerReduce { src, .. } = &mut broken.ranks[1][i].op {
        *src = BufKind::Input;
    }
    check(&broken).unwrap();
    let err = check_staged(&broken).unwrap_err();
    assert!(
        err.0.contains("rank 0's Input buffer, device memory"),
        "{err}"
    );
}

#[test]
fn an_exposure_whose_meeting_writes_part_of_the_published_range_is_refused() {
    // In place, rank 0 publishes the first half of its buffer and its meeting writes elements
    // 2..6 of it: an executor that skips the exposure (sending the buffer itself) would send
    // elements the meeting is overwriting.
    let mut broken = staged(2, 8, true);
    if let Op::Expose { src, dst } = &mut broken.ranks[0][0].op {
        src.count = 4;
        dst.count = 4;
    }
    let i = peer_reduce_at(&broken, 0);
    if let Op::PeerReduce { dst, count, .. } = &mut broken.ranks[0][i].op {
        dst.offset = 2;
        dst.count = 4;
        *count = 4;
    }
    rejects(&broken, "writes exactly what it publishes from");
}

#[test]
fn a_staged_oneshot_rank_that_never_publishes_is_caught() {
    let mut broken = staged(3, 8, false);
    broken.ranks[2].remove(0);
    rejects(&broken, "nothing has written");
}
