//! The checks that tie a peer plan to the kernel that runs it, made once per plan when it is
//! prepared; the launches (module `peer_enqueue`) rely on what they return. A two-shot plan must have
//! exactly the layout the fused two-shot kernel implements ([`twoshot_segments`], which also
//! reads each rank's segment out of it); a one-shot all-reduce plan the layout the one-shot
//! kernels (the read one-shot and the LL one-shot) assume ([`oneshot_layout`]); the one-shot
//! plan of any other collective the layout the steps kernel runs between a single start and end
//! barrier ([`steps_layout`], which reads each rank's steps, [`StepLayout`], out of it).
//!
//! What a kernel runs is what the plan says: one kernel per rank runs a run of meetings fused
//! in the plan (`Op::PeerReduce::fused`: no barrier between them) between one start and one end
//! barrier, and may run several runs one after the other with one barrier between them (an end
//! barrier followed at once, on every rank, by a start barrier orders exactly what either
//! does); the in-place exposure (`Op::Expose`) is done inside the read one-shot or skipped by
//! the LL one-shot. Why the fusions are safe is the checker's proof (`check::fused`), not these
//! checks': they only match the plan's structure to the kernel's.
//!
//! Invariant: a plan these accept runs exactly the work the checker proved, with the kernels'
//! grids, sources, segments and steps the same as the plan's on every rank. A plan they refuse
//! came from this crate's own planners, so the refusal is [`Error::Internal`] (a bug here), not
//! a verdict on anything the caller passed.

use crate::error::{Error, Result};
use crate::exec::cuda::kernels::PEER_MAX_RANKS;
use crate::plan::{BufKind, Op, Plan, Ranks, Region, StreamKind};

/// One step of a rank's one-shot collective, read from its plan (`steps_layout`): a fold over
/// every rank (`from: None`) or a copy from rank `from`, of elements `offset..offset +
/// dst.count` of each source rank's `src` buffer, into `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct StepLayout {
    pub(super) from: Option<usize>,
    pub(super) src: BufKind,
    pub(super) offset: usize,
    pub(super) dst: Region,
}

/// Each rank's steps for the steps kernel, after verifying that the plan has the layout it
/// implements: every rank's work is peer reduces on Main (and a final `Scale`), each reading
/// every rank or exactly one, moving at most the plan's count (every collective's plan but
/// send/recv's moves exactly it; nothing: a rank that only joins) into a destination of that
/// count, at most [`PEER_MAX_RANKS`] that move data per rank; and every meeting after a rank's first is
/// fused to the one before, so that one kernel runs them all between a single start and end
/// barrier (the checker proved those fusions safe). `None` for a plan without meetings (one
/// rank, or zero elements).
pub(super) fn steps_layout(plan: &Plan) -> Result<Option<Vec<Vec<StepLayout>>>> {
    let bad = |why: String| {
        Err(Error::Internal {
            what: format!("not a one-shot collective plan: {why}"),
        })
    };
    let n = plan.world;
    let mut all: Vec<Vec<StepLayout>> = Vec::with_capacity(n);
    let mut meetings = 0;
    for rank in 0..n {
        let program = &plan.ranks[rank];
        let mut steps = Vec::new();
        let mut k = 0;
        for (i, instr) in program.iter().enumerate() {
            let op = instr.op;
            match op {
                _ if instr.stream != StreamKind::Main => {
                    return bad(format!("rank {rank} has work off its Main stream"))
                }
                Op::Scale { .. } if i + 1 == program.len() => {}
                Op::PeerReduce { push, .. } if push != Ranks::NONE => {
                    return bad(format!("rank {rank}'s meeting {k} pushes to its peers"))
                }
                Op::PeerReduce { fused, .. } if fused != (k > 0) => {
                    return bad(format!(
                        "rank {rank}'s meeting {k} is {}fused to the one before: the steps \
                         kernel runs every meeting between one start and one end barrier",
                        if fused { "" } else { "not " }
                    ))
                }
                Op::PeerReduce {
                    dst,
                    src,
                    offset,
                    count,
                    ranks,
                    ..
                } => {
                    let readers = (0..n).filter(|&q| ranks.contains(q)).count();
                    let from = match (ranks, readers) {
                        (Ranks::ALL, _) => None,
                        (_, 1) => (0..n).find(|&q| ranks.contains(q)),
                        _ => {
                            return bad(format!(
                                "rank {rank}'s peer reduce {k} reads {readers} of {n} ranks"
                            ))
                        }
                    };
                    if count > plan.count || dst.count != count {
                        return bad(format!(
                            "rank {rank}'s peer reduce {k} moves {count} elements into {}, \
                             of a plan of {}",
                            dst.count, plan.count
                        ));
                    }
                    if count > 0 {
                        steps.push(StepLayout {
                            from,
                            src,
                            offset,
                            dst,
                        });
                    }
                    k += 1;
                }
                _ => {
                    return bad(format!(
                        "rank {rank} has work besides peer reduces and a final scale"
                    ))
                }
            }
        }
        if steps.len() > PEER_MAX_RANKS {
            return bad(format!(
                "rank {rank} has {} steps; the kernel runs at most {PEER_MAX_RANKS}",
                steps.len()
            ));
        }
        meetings = meetings.max(k);
        all.push(steps);
    }
    if meetings == 0 {
        return Ok(None);
    }
    Ok(Some(all))
}

/// Each rank's segment (offset, count) of a two-shot plan, after verifying that the plan has
/// exactly the layout the fused two-shot kernel implements: on every rank, a peer reduce of
/// every rank's sources into its own output segment, then one peer reduce per other rank q — in
/// the order `twoshot::gather_from` gives — copying q's output segment from q alone, each gather
/// round after the first fused to the one before (the kernel runs them between its middle and
/// end barrier), and nothing else but a final `Scale`; the segments tile the buffer in rank
/// order. `None` for an empty plan (one rank, or zero elements).
pub(super) fn twoshot_segments(plan: &Plan) -> Result<Option<Vec<(usize, usize)>>> {
    let n = plan.world;
    let peer_ops = |rank: usize| -> Vec<Op> {
        plan.ranks[rank]
            .iter()
            .map(|i| i.op)
            .filter(|op| matches!(op, Op::PeerReduce { .. }))
            .collect()
    };
    if (0..n).all(|r| peer_ops(r).is_empty()) {
        return Ok(None);
    }
    let bad = |why: String| {
        Err(Error::Internal {
            what: format!("not a two-shot plan: {why}"),
        })
    };
    let src_kind = if plan.in_place {
        BufKind::Output
    } else {
        BufKind::Input
    };
    let mut segments = Vec::with_capacity(n);
    for rank in 0..n {
        match peer_ops(rank).first() {
            Some(&Op::PeerReduce {
                dst,
                src,
                offset,
                count,
                ranks: Ranks::ALL,
                fused: false,
                push: Ranks::NONE,
            }) if dst.offset == offset
                && src == src_kind
                && plan.decl(dst.buf).rank == rank
                && plan.decl(dst.buf).kind == BufKind::Output =>
            {
                segments.push((offset, count))
            }
            _ => {
                return bad(format!(
                    "rank {rank} does not start by reducing its own segment"
                ))
            }
        }
    }
    let mut end = 0;
    for (q, &(offset, count)) in segments.iter().enumerate() {
        if offset != end {
            return bad(format!("segment {q} starts at {offset}, not at {end}"));
        }
        end += count;
    }
    if end != plan.count {
        return bad(format!("the segments end at {end}, not at {}", plan.count));
    }
    for rank in 0..n {
        let ops = peer_ops(rank);
        if ops.len() != n {
            return bad(format!(
                "rank {rank} has {} peer reduces, not {n}",
                ops.len()
            ));
        }
        for (round, op) in ops.iter().enumerate().skip(1) {
            let owner = crate::plan::twoshot::gather_from(rank, round, n);
            let (offset, count) = segments[owner];
            let fits = matches!(*op, Op::PeerReduce { dst, src: BufKind::Output, offset: o, count: c, ranks, fused, push: Ranks::NONE }
                if ranks == Ranks::only(owner)
                    && fused == (round > 1)
                    && (o, c) == (offset, count)
                    && (dst.offset, dst.count) == (offset, count)
                    && plan.decl(dst.buf).rank == rank
                    && plan.decl(dst.buf).kind == BufKind::Output);
            if !fits {
                return bad(format!(
                    "rank {rank}'s gather round {round} does not copy segment {owner} from rank {owner}"
                ));
            }
        }
        let program = &plan.ranks[rank];
        let others_ok = program.iter().enumerate().all(|(i, instr)| {
            instr.stream == StreamKind::Main
                && match instr.op {
                    Op::PeerReduce { .. } => true,
                    Op::Scale { .. } => i + 1 == program.len(),
                    _ => false,
                }
        });
        if !others_ok {
            return bad(format!(
                "rank {rank} has work besides its peer reduces and a final scale on Main"
            ));
        }
    }
    Ok(Some(segments))
}

/// Verifies that a one-shot plan has the layout the one-shot kernel assumes: in every meeting,
/// every rank reads every rank (`Ranks::ALL`) over the same source kind and range, so that all
/// ranks launch the same grid and every source is known, and no meeting is fused (each meeting
/// is a kernel of its own, with both barriers). (The checker allows more: ranks of a meeting
/// reading different ranges or a subset of ranks, as the two-shot does.)
pub(super) fn oneshot_layout(plan: &Plan) -> Result<()> {
    let meetings = |rank: usize| -> Vec<Op> {
        plan.ranks[rank]
            .iter()
            .map(|i| i.op)
            .filter(|op| matches!(op, Op::PeerReduce { .. }))
            .collect()
    };
    let first = meetings(0);
    for rank in 0..plan.world {
        let mine = meetings(rank);
        if mine.len() != first.len() {
            return Err(Error::Internal {
                what: format!(
                    "not a one-shot plan: rank {rank} has {} peer reduces, rank 0 {}",
                    mine.len(),
                    first.len()
                ),
            });
        }
        for (k, (op, op0)) in mine.iter().zip(&first).enumerate() {
            let same = match (*op, *op0) {
                (
                    Op::PeerReduce {
                        src,
                        offset,
                        count,
                        ranks,
                        fused: false,
                        push: Ranks::NONE,
                        ..
                    },
                    Op::PeerReduce {
                        src: src0,
                        offset: offset0,
                        count: count0,
                        ..
                    },
                ) => ranks == Ranks::ALL && (src, offset, count) == (src0, offset0, count0),
                _ => false,
            };
            if !same {
                return Err(Error::Internal {
                    what: format!(
                    "not a one-shot plan: rank {rank}'s peer reduce {k} does not read every rank \
                     over rank 0's range"
                ),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{oneshot_layout, twoshot_segments};
    use crate::element::ReduceOp;
    use crate::plan::{BufKind, OneShotSpec, Op, Ranks, TwoShotSpec};

    fn twoshot(world: usize, count: usize, in_place: bool) -> crate::plan::Plan {
        TwoShotSpec {
            world,
            count,
            in_place,
            op: ReduceOp::Avg,
            align: 4,
            gather: crate::plan::Gather::Pull,
        }
        .build()
        .unwrap()
    }

    #[test]
    fn twoshot_layout_is_read_from_the_plan_and_tiles_the_buffer() {
        for world in 2..=8 {
            for count in [1, 7, 64, 1001] {
                for in_place in [false, true] {
                    let segments = twoshot_segments(&twoshot(world, count, in_place))
                        .unwrap()
                        .expect("a collective");
                    assert_eq!(segments.len(), world);
                    assert_eq!(segments[0].0, 0);
                    for pair in segments.windows(2) {
                        assert_eq!(pair[0].0 + pair[0].1, pair[1].0);
                    }
                    let (last_offset, last_count) = segments[world - 1];
                    assert_eq!(last_offset + last_count, count);
                }
            }
        }
        assert_eq!(twoshot_segments(&twoshot(1, 10, true)).unwrap(), None);
        assert_eq!(twoshot_segments(&twoshot(3, 0, false)).unwrap(), None);
    }

    #[test]
    fn every_one_shot_collective_has_the_steps_kernels_layout() {
        use crate::plan::Collective;
        for world in 2..=8 {
            let mut all = vec![
                Collective::ReduceScatter,
                Collective::AllGather,
                Collective::AllToAll,
            ];
            for root in [0, world - 1] {
                all.push(Collective::Broadcast { root });
                all.push(Collective::Reduce { root });
            }
            for c in &all {
                for in_place in [false, true] {
                    if in_place && !c.has_in_place() {
                        continue;
                    }
                    let plan = OneShotSpec {
                        world,
                        count: 13,
                        in_place,
                        op: ReduceOp::Avg,
                    }
                    .build_collective(c)
                    .unwrap();
                    let steps = super::steps_layout(&plan)
                        .unwrap_or_else(|e| panic!("{c:?} {world} {in_place}: {e}"))
                        .expect("a collective");
                    // Every rank reads each rank at most once; a gather reads all of them.
                    let most = steps.iter().map(Vec::len).max().unwrap();
                    let want = match c {
                        Collective::AllGather if in_place => world - 1,
                        Collective::AllGather | Collective::AllToAll => world,
                        _ => 1,
                    };
                    assert_eq!(most, want, "{c:?} {world} {in_place}");
                }
            }
        }
        // Two meetings where the second reads what the first wrote: the checker refuses the
        // fusion; the steps kernel refuses a plan whose later meetings are not fused.
        let mut plan = OneShotSpec {
            world: 2,
            count: 4,
            in_place: false,
            op: ReduceOp::Sum,
        }
        .build_collective(&Collective::AllGather)
        .unwrap();
        let written = match plan.ranks[0][0].op {
            Op::PeerReduce { dst, .. } => dst,
            _ => unreachable!(),
        };
        if let Op::PeerReduce { src, offset, .. } = &mut plan.ranks[1][1].op {
            *src = BufKind::Output;
            *offset = written.offset;
        }
        assert!(crate::check::check(&plan).is_err());
        for program in &mut plan.ranks {
            if let Op::PeerReduce { fused, .. } = &mut program[1].op {
                *fused = false;
            }
        }
        assert!(super::steps_layout(&plan).is_err());
    }

    #[test]
    fn plans_the_kernels_do_not_implement_are_refused() {
        // A gather round that copies from the wrong rank.
        let mut wrong_owner = twoshot(3, 12, true);
        if let Op::PeerReduce { ranks, .. } = &mut wrong_owner.ranks[0][1].op {
            *ranks = Ranks::only(2);
        }
        assert!(twoshot_segments(&wrong_owner).is_err());
        // Step 0 reading the input of an in-place plan.
        let mut wrong_source = twoshot(2, 12, true);
        if let Op::PeerReduce { src, .. } = &mut wrong_source.ranks[1][0].op {
            *src = BufKind::Input;
        }
        assert!(twoshot_segments(&wrong_source).is_err());
        // A one-shot plan is not a two-shot plan, and the reverse.
        let oneshot = OneShotSpec {
            world: 2,
            count: 12,
            in_place: false,
            op: ReduceOp::Sum,
        }
        .build()
        .unwrap();
        oneshot_layout(&oneshot).unwrap();
        assert!(twoshot_segments(&oneshot).is_err());
        assert!(oneshot_layout(&twoshot(2, 12, false)).is_err());
    }
}
