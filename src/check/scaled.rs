//! The scaling lemma: a plan that is a proven plan with every range multiplied by one factor is
//! proven too — so a plan family whose ranges all grow with the count (the one-shot's) is checked
//! once, at one element, and every other count costs a comparison instead of the four checks.
//!
//! Why it holds: scale every offset, count and buffer length of a plan by `f ≥ 1`. Each element
//! range `[a, b)` becomes `[a·f, b·f)`, a union of whole "cells" of `f` elements, and every
//! operation acts on whole cells. So (1) shape: a range lies in its buffer, two lengths are equal,
//! a destination is its operand or disjoint from it — all before scaling iff after; (2) the
//! enqueue simulation never looks at ranges; (3) two ranges overlap iff their unit ranges do, so
//! the race check finds the same pairs; (4) the symbolic execution gives every element of a cell
//! the value its unit element had, with source shifts multiplied by `f` — zero iff zero, and the
//! all-reduce expects zero everywhere. Each check is invariant under the scaling, so its verdict
//! on the scaled plan is its verdict on the unit plan. The same holds for the other collectives
//! whose [`Collective`] carries no count — reduce-scatter, all-gather, broadcast, reduce,
//! all-to-all (their one-shot plans, [`crate::plan::OneShotSpec::build_collective`]): every
//! range and shift they are expected to end with is the count times a number of blocks (block
//! `j` at `j·count`: `check::result`'s expectations), so at `count·f` each is the unit's times
//! `f`, as the scaled plan's are. A send/recv carries its counts in its transfers, which scaling
//! does not touch: it is not covered. A check added later that is not invariant under uniform
//! scaling (an alignment rule, say) would break the lemma, and so belongs to the builder, not the
//! checker.

use crate::plan::{BufferDecl, Collective, Instr, Op, Plan, Region};

/// `plan` with every range and buffer length multiplied by `factor`.
pub fn scale_plan(plan: &Plan, factor: usize) -> Plan {
    let region = |r: Region| Region {
        buf: r.buf,
        offset: r.offset * factor,
        count: r.count * factor,
    };
    let op = |op: Op| match op {
        Op::Copy { src, dst } => Op::Copy {
            src: region(src),
            dst: region(dst),
        },
        Op::Expose { src, dst } => Op::Expose {
            src: region(src),
            dst: region(dst),
        },
        Op::Reduce { dst, a, b } => Op::Reduce {
            dst: region(dst),
            a: region(a),
            b: region(b),
        },
        Op::Scale { region: r } => Op::Scale { region: region(r) },
        Op::Record(e) => Op::Record(e),
        Op::Wait(e) => Op::Wait(e),
        Op::PeerReduce {
            dst,
            src,
            offset,
            count,
            ranks,
            fused,
            push,
        } => Op::PeerReduce {
            dst: region(dst),
            src,
            offset: offset * factor,
            count: count * factor,
            ranks,
            fused,
            push,
        },
    };
    Plan {
        count: plan.count * factor,
        buffers: plan
            .buffers
            .iter()
            .map(|b| BufferDecl {
                len: b.len * factor,
                ..b.clone()
            })
            .collect(),
        ranks: plan
            .ranks
            .iter()
            .map(|program| {
                program
                    .iter()
                    .map(|i| Instr { op: op(i.op), ..*i })
                    .collect()
            })
            .collect(),
        ..plan.clone()
    }
}

/// The factor by which `plan` is `unit` scaled, if it is exactly that (a plan of any collective
/// but send/recv, `unit.count ≥ 1`). When `unit` passed [`crate::check::check`], so does `plan`
/// (module doc).
pub fn scaled_from(unit: &Plan, plan: &Plan) -> Option<usize> {
    if matches!(unit.collective, Collective::SendRecv { .. })
        || unit.count == 0
        || plan.count % unit.count != 0
        || plan.count == 0
    {
        return None;
    }
    let factor = plan.count / unit.count;
    (scale_plan(unit, factor) == *plan).then_some(factor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{check, find_instr};
    use crate::element::ReduceOp;
    use crate::plan::{OneShotSpec, TwoShotSpec};

    fn oneshot(world: usize, count: usize, in_place: bool, op: ReduceOp) -> Plan {
        OneShotSpec {
            world,
            count,
            in_place,
            op,
        }
        .build()
        .unwrap()
    }

    #[test]
    fn one_shot_plans_are_their_one_element_plan_scaled() {
        for world in 1..=8 {
            for in_place in [false, true] {
                for op in [ReduceOp::Sum, ReduceOp::Avg] {
                    let unit = oneshot(world, 1, in_place, op);
                    check(&unit).unwrap();
                    for count in [1, 2, 7, 1000, 1 << 20] {
                        let plan = oneshot(world, count, in_place, op);
                        assert_eq!(scaled_from(&unit, &plan), Some(count), "{world} {count}");
                        // The lemma's claim, checked directly on these plans.
                        check(&plan).unwrap();
                    }
                }
            }
        }
    }

    /// Every collective's one-shot plan but send/recv, built at each count, is its one-element
    /// plan scaled — and (the lemma's claim, checked directly on these) passes the checker; a
    /// broken unit plan stays broken scaled.
    #[test]
    fn every_collectives_one_shot_plans_are_their_one_element_plan_scaled() {
        let build = |c: &Collective, world, count, in_place| {
            OneShotSpec {
                world,
                count,
                in_place,
                op: ReduceOp::Avg,
            }
            .build_collective(c)
            .unwrap()
        };
        let mut covered = 0;
        for world in 1..=5 {
            let collectives = [
                Collective::ReduceScatter,
                Collective::AllGather,
                Collective::Broadcast { root: world - 1 },
                Collective::Reduce { root: 0 },
                Collective::AllToAll,
            ];
            for c in &collectives {
                for in_place in [false, true] {
                    if in_place && !c.has_in_place() {
                        continue;
                    }
                    let unit = build(c, world, 1, in_place);
                    check(&unit).unwrap_or_else(|e| panic!("{c:?} {world}: {e}"));
                    for count in [2, 7, 1000] {
                        let plan = build(c, world, count, in_place);
                        assert_eq!(
                            scaled_from(&unit, &plan),
                            Some(count),
                            "{c:?} {world} in place {in_place} {count}"
                        );
                        check(&plan).unwrap_or_else(|e| panic!("{c:?} {world} x{count}: {e}"));
                        covered += 1;
                    }
                    // A fault in the unit plan (its first meeting reads one element too few)
                    // is one in every scaling of it.
                    let mut broken = unit.clone();
                    let meeting = find_instr(&broken, |_, i| {
                        matches!(i.op, Op::PeerReduce { count: 1, .. })
                    });
                    if let Some((rank, index)) = meeting {
                        if let Op::PeerReduce { count, dst, .. } = &mut broken.ranks[rank][index].op
                        {
                            *count = 0;
                            dst.count = 0;
                        }
                        assert!(check(&broken).is_err(), "{c:?} {world}");
                        assert!(check(&scale_plan(&broken, 7)).is_err(), "{c:?} {world}");
                    }
                }
            }
        }
        assert!(covered >= 5 * 5 * 3, "{covered} plans compared");
        // Send/recv is not covered: its transfers carry their counts.
        let transfers = vec![crate::plan::Transfer {
            from: 0,
            to: 1,
            count: 1,
        }];
        let p2p = build(&Collective::SendRecv { transfers }, 2, 1, false);
        assert_eq!(scaled_from(&p2p, &p2p), None);
    }

    #[test]
    fn anything_but_an_exact_scaling_is_not_taken_for_one() {
        let unit = oneshot(3, 1, true, ReduceOp::Sum);
        assert_eq!(
            scaled_from(&unit, &oneshot(3, 0, true, ReduceOp::Sum)),
            None
        );
        assert_eq!(
            scaled_from(&unit, &oneshot(3, 5, false, ReduceOp::Sum)),
            None
        );
        assert_eq!(
            scaled_from(&unit, &oneshot(3, 5, true, ReduceOp::Avg)),
            None
        );
        assert_eq!(
            scaled_from(&unit, &oneshot(2, 5, true, ReduceOp::Sum)),
            None
        );
        // One range off by one element.
        let mut off = oneshot(3, 5, true, ReduceOp::Sum);
        let (rank, index) = find_instr(&off, |_, i| matches!(i.op, Op::PeerReduce { .. })).unwrap();
        if let Op::PeerReduce { count, .. } = &mut off.ranks[rank][index].op {
            *count -= 1;
        }
        assert_eq!(scaled_from(&unit, &off), None);
        // The two-shot's segments follow the count's alignment, not a uniform scaling.
        let two = |count| {
            TwoShotSpec {
                world: 3,
                count,
                in_place: true,
                op: ReduceOp::Sum,
                align: 4,
                gather: crate::plan::Gather::Pull,
            }
            .build()
            .unwrap()
        };
        assert_eq!(scaled_from(&two(12), &two(13)), None);
    }

    /// The lemma on broken plans: a fault planted in the unit plan is rejected, and so is the
    /// same fault in the scaled plan.
    #[test]
    fn a_broken_unit_plan_stays_broken_when_scaled() {
        for world in 2..=4 {
            let mut unit = oneshot(world, 1, true, ReduceOp::Avg);
            // Drop the Avg scaling of the last rank.
            let last = unit.ranks[world - 1]
                .iter()
                .rposition(|i| matches!(i.op, Op::Scale { .. }))
                .unwrap();
            unit.ranks[world - 1].remove(last);
            assert!(check(&unit).is_err());
            for factor in [2, 9, 1000] {
                assert!(
                    check(&scale_plan(&unit, factor)).is_err(),
                    "{world} x{factor}"
                );
            }
            // Make a peer reduce read one rank too few.
            let mut unit = oneshot(world, 1, false, ReduceOp::Sum);
            let (rank, index) =
                find_instr(&unit, |_, i| matches!(i.op, Op::PeerReduce { .. })).unwrap();
            if let Op::PeerReduce { ranks, .. } = &mut unit.ranks[rank][index].op {
                *ranks = crate::plan::Ranks::only(0);
            }
            assert!(check(&unit).is_err());
            for factor in [2, 9, 1000] {
                assert!(
                    check(&scale_plan(&unit, factor)).is_err(),
                    "{world} x{factor}"
                );
            }
        }
    }
}
