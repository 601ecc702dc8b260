//! Part of check 1, shape: what an executor may fuse or drop, proven from the plan — the
//! [`Op::Expose`] publications and the `fused` meetings of [`Op::PeerReduce`].
//!
//! An executor runs exactly a plan's operations, but it may run several in one kernel where the
//! plan says they may be: a meeting marked `fused` runs in the same kernel as its rank's previous
//! meeting, with the barrier between the two dropped; an `Expose` may be done inside the next
//! meeting's kernel, or skipped by a meeting that sends each rank's source instead of letting
//! peers read it. The race and result checks model every meeting with both barriers and every
//! `Expose` as a copy; the two lemmas here make that model exact for what executors run.
//!
//! - **Fused meetings** (a run of meetings k, k+1, …, m, each after the first `fused`): every
//!   rank marks meeting j the same, and its meeting j directly follows its meeting j − 1 on one
//!   stream; and no access of one meeting of the run, on any rank, conflicts (overlaps, one a
//!   write) with an access of another meeting of the run, on any rank. Then the dropped barriers
//!   ordered only pairs that commute, and nothing else lies between them: the run between its
//!   first start and its last end barrier computes what the meetings with all their barriers
//!   compute, and races with nothing they did not race with.
//! - **Expose** (rank r, `dst = src`): `dst` is r's exposed copy; r's next instruction, on the
//!   same stream, is a meeting whose source on rank r is exactly `dst` and which writes exactly
//!   `src`; and every read of r's exposed copy in the plan belongs to that meeting. So a copy
//!   right before the meeting on its own stream is the same as one inside its kernel before the
//!   start barrier; and a meeting that skips the copy and takes r's source from `src` reads the
//!   same elements — nothing writes `src` between the copy and the meeting (the two are adjacent),
//!   and during the meeting only the meeting itself writes it (any other access would race with
//!   that write, which the race check rejects).
//!
//! Invariant: a plan these accept runs with the same results and the same race verdict whether
//! an executor honours the fusions and the skipped exposure or not.

use super::{accesses, describe, peer_destinations, peer_sources, reject, Check};
use crate::plan::{Op, Plan, Region};

/// Every `Expose` is published for its next instruction alone (module doc).
pub(super) fn check_exposures(plan: &Plan) -> Check {
    for (rank, program) in plan.ranks.iter().enumerate() {
        for (i, instr) in program.iter().enumerate() {
            let Op::Expose { src, dst } = instr.op else {
                continue;
            };
            let here = describe(plan, rank, i);
            let target = plan.buffers.get(dst.buf.0);
            let exposed = target.is_some_and(|d| d.rank == rank && d.kind.is_exposure());
            if !exposed || plan.decl(src.buf).rank != rank {
                return reject(format!(
                    "{here} does not publish a range of its own rank into its own exposed copy"
                ));
            }
            if src.count != dst.count {
                return reject(format!(
                    "{here} publishes {} elements into {}",
                    src.count, dst.count
                ));
            }
            let next = program.get(i + 1);
            let meeting = match next.map(|n| (n.stream, n.op)) {
                Some((stream, op @ Op::PeerReduce { .. })) if stream == instr.stream => {
                    let own_source = peer_sources(plan, &op)
                        .into_iter()
                        .find(|r| plan.decl(r.buf).rank == rank);
                    // It writes the range published from exactly, or nothing of it (a staged
                    // one-shot out of place publishes its input and writes its output).
                    let writes_src_partly = peer_destinations(plan, &op)
                        .iter()
                        .any(|w| w.buf == src.buf && w.overlaps(&src) && *w != src);
                    if own_source != Some(dst) || writes_src_partly {
                        return reject(format!(
                            "{here} is not followed by a meeting that reads exactly what it \
                             publishes and writes exactly what it publishes from"
                        ));
                    }
                    meeting_index(plan, rank, i + 1)
                }
                _ => {
                    return reject(format!(
                        "{here} is not followed, on its stream, by the meeting it publishes for"
                    ))
                }
            };
            for (other, program) in plan.ranks.iter().enumerate() {
                for (j, reader) in program.iter().enumerate() {
                    let (reads, _) = accesses(plan, &reader.op);
                    let reads_it = reads
                        .iter()
                        .any(|r| r.buf == dst.buf && r.count > 0 && r.overlaps(&dst));
                    let in_meeting = matches!(reader.op, Op::PeerReduce { .. })
                        && meeting_index(plan, other, j) == meeting;
                    if reads_it && !in_meeting {
                        return reject(format!(
                            "{} reads the copy that {here} publishes for its meeting alone",
                            describe(plan, other, j)
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Every run of fused meetings is marked alike on every rank, adjacent on each rank's stream,
/// and free of conflicts between its meetings (module doc). `meetings[rank]` lists each rank's
/// peer reduces as (index, op), every rank as many (checked before).
pub(super) fn check_fused(plan: &Plan, meetings: &[Vec<(usize, Op)>]) -> Check {
    let Some(first) = meetings.first() else {
        return Ok(());
    };
    let is_fused = |op: &Op| matches!(op, Op::PeerReduce { fused: true, .. });
    // The runs of meetings as ranges of meeting indices.
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for k in 0..first.len() {
        let fused = is_fused(&first[k].1);
        for (rank, mine) in meetings.iter().enumerate() {
            let (index, op) = mine[k];
            let here = describe(plan, rank, index);
            if is_fused(&op) != fused {
                return reject(format!(
                    "{here} is {}fused to the meeting before and rank 0's is {}: the ranks would \
                     not meet at the same barriers",
                    if fused { "not " } else { "" },
                    if fused { "" } else { "not" }
                ));
            }
            if !fused {
                continue;
            }
            let adjacent = k > 0 && {
                let prev = mine[k - 1].0;
                prev + 1 == index && plan.ranks[rank][prev].stream == plan.ranks[rank][index].stream
            };
            if !adjacent {
                return reject(format!(
                    "{here} is fused to a meeting that is not its stream's previous instruction"
                ));
            }
        }
        match runs.last_mut() {
            Some(run) if fused => run.end = k + 1,
            _ => runs.push(k..k + 1),
        }
    }
    for run in runs.into_iter().filter(|r| r.len() > 1) {
        // Every access of the run: (region, write, meeting, rank, instruction index).
        let mut all: Vec<(Region, bool, usize, usize, usize)> = Vec::new();
        for (rank, mine) in meetings.iter().enumerate() {
            for k in run.clone() {
                let (index, op) = mine[k];
                let (reads, writes) = accesses(plan, &op);
                let tagged = reads.into_iter().map(|r| (r, false));
                for (region, write) in tagged.chain(writes.into_iter().map(|w| (w, true))) {
                    if region.count > 0 {
                        all.push((region, write, k, rank, index));
                    }
                }
            }
        }
        // By buffer and start; each access is compared with the earlier ones that still
        // overlap it.
        all.sort_by_key(|(r, ..)| (r.buf.0, r.offset));
        let mut open: Vec<usize> = Vec::new();
        for at in 0..all.len() {
            let (region, write, k, rank, index) = all[at];
            open.retain(|&o| all[o].0.buf == region.buf && all[o].0.end() > region.offset);
            for &o in &open {
                let (_, write2, k2, rank2, index2) = all[o];
                if k2 != k && (write || write2) {
                    return reject(format!(
                        "{} and {} are fused into one run of meetings but conflict: the barrier \
                         between them is needed",
                        describe(plan, rank2, index2),
                        describe(plan, rank, index)
                    ));
                }
            }
            open.push(at);
        }
    }
    Ok(())
}

/// Which meeting of its rank the peer reduce at `index` is (how many peer reduces precede it).
fn meeting_index(plan: &Plan, rank: usize, index: usize) -> usize {
    plan.ranks[rank][..index]
        .iter()
        .filter(|i| matches!(i.op, Op::PeerReduce { .. }))
        .count()
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use crate::element::ReduceOp;
    use crate::plan::{BufKind, Collective, Instr, OneShotSpec, Op, Plan, StreamKind};

    fn twoshot(world: usize, in_place: bool) -> Plan {
        crate::plan::twoshot::TwoShotSpec {
            world,
            count: 24,
            in_place,
            op: ReduceOp::Sum,
            align: 1,
            gather: crate::plan::Gather::Pull,
        }
        .build()
        .unwrap()
    }

    fn oneshot(collective: &Collective, world: usize, in_place: bool) -> Plan {
        OneShotSpec {
            world,
            count: 6,
            in_place,
            op: ReduceOp::Sum,
        }
        .build_collective(collective)
        .unwrap()
    }

    fn rejected(plan: &Plan, needle: &str) {
        let err = check(plan).expect_err("a plan with an unsafe fusion must be rejected");
        assert!(err.0.contains(needle), "expected {needle:?} in: {err}");
    }

    /// Sets the `fused` mark of every rank's meeting `k`.
    fn mark(plan: &mut Plan, k: usize, to: bool) {
        for program in &mut plan.ranks {
            let instr = program
                .iter_mut()
                .filter(|i| matches!(i.op, Op::PeerReduce { .. }))
                .nth(k)
                .expect("meeting k");
            if let Op::PeerReduce { fused, .. } = &mut instr.op {
                *fused = to;
            }
        }
    }

    #[test]
    fn the_planners_fusions_are_proven() {
        for world in 2..=6 {
            for in_place in [false, true] {
                check(&twoshot(world, in_place)).unwrap();
                for c in [Collective::AllGather, Collective::AllToAll] {
                    if in_place && !c.has_in_place() {
                        continue;
                    }
                    let plan = oneshot(&c, world, in_place);
                    let fused = plan.ranks[0]
                        .iter()
                        .filter(|i| matches!(i.op, Op::PeerReduce { fused: true, .. }))
                        .count();
                    assert!(fused >= world - 2, "{c:?} {world}: {fused} fused meetings");
                    check(&plan).unwrap_or_else(|e| panic!("{c:?} {world} {in_place}: {e}"));
                }
            }
        }
    }

    #[test]
    fn a_fusion_across_a_barrier_that_orders_something_is_rejected() {
        // The two-shot's gather reads the segments step 0 writes: fusing round 1 to step 0
        // would let a rank read a peer's segment while the peer still reduces it.
        for in_place in [false, true] {
            let mut plan = twoshot(3, in_place);
            mark(&mut plan, 1, true);
            rejected(&plan, "conflict: the barrier between them is needed");
        }
    }

    #[test]
    fn fusions_must_be_alike_on_every_rank_adjacent_and_not_first() {
        let mut plan = twoshot(3, false);
        if let Op::PeerReduce { fused, .. } = &mut plan.ranks[1][2].op {
            *fused = false;
        }
        rejected(&plan, "would not meet at the same barriers");

        let mut plan = twoshot(3, false);
        mark(&mut plan, 0, true);
        rejected(&plan, "not its stream's previous instruction");

        // Something between two fused meetings (a scale of the rank's own gathered segment).
        let mut plan = twoshot(3, false);
        for program in &mut plan.ranks {
            let Op::PeerReduce { dst, .. } = program[1].op else {
                panic!("round 1")
            };
            let scale = Instr {
                op: Op::Scale { region: dst },
                ..program[1]
            };
            program.insert(2, scale);
        }
        rejected(&plan, "not its stream's previous instruction");
    }

    fn in_place_oneshot() -> Plan {
        OneShotSpec {
            world: 3,
            count: 8,
            in_place: true,
            op: ReduceOp::Sum,
        }
        .build()
        .unwrap()
    }

    #[test]
    fn an_exposure_is_published_for_the_next_meeting_alone() {
        let plan = in_place_oneshot();
        check(&plan).unwrap();
        assert!(matches!(plan.ranks[0][0].op, Op::Expose { .. }));

        // Something between the exposure and its meeting.
        let mut between = plan.clone();
        let Op::Expose { src, .. } = between.ranks[1][0].op else {
            panic!("rank 1 exposes first")
        };
        let scale = Instr {
            op: Op::Scale { region: src },
            ..between.ranks[1][0]
        };
        between.ranks[1].insert(1, scale);
        rejected(&between, "is not followed, on its stream, by the meeting");

        // The meeting on another stream.
        let mut elsewhere = plan.clone();
        elsewhere.ranks[2][1].stream = StreamKind::Reduce;
        assert!(check(&elsewhere).is_err());

        // A second reader of the exposed copy: rank 0 copies rank 2's after the meeting.
        let mut reader = plan.clone();
        let exposed = reader.buffer(2, BufKind::Exposed).unwrap();
        let output = reader.buffer(0, BufKind::Output).unwrap();
        let region = |buf| crate::plan::Region {
            buf,
            offset: 0,
            count: 8,
        };
        let copy = Instr {
            op: Op::Copy {
                src: region(exposed),
                dst: region(output),
            },
            ..reader.ranks[0][1]
        };
        reader.ranks[0].push(copy);
        rejected(&reader, "publishes for its meeting alone");

        // An exposure of a range the meeting does not write.
        let mut partial = plan.clone();
        if let Op::Expose { src, dst } = &mut partial.ranks[0][0].op {
            src.count = 4;
            dst.count = 4;
        }
        rejected(&partial, "reads exactly what it publishes");
    }
}
