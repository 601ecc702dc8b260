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
//! on the scaled plan is its verdict on the unit plan. The lemma is stated for all-reduce plans
//! (other collectives carry counts in their [`Collective`] too); a check added later that is not
//! invariant under uniform scaling (an alignment rule, say) would break it, and so belongs to
//! the builder, not the checker.

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

/// The factor by which `plan` is `unit` scaled, if it is exactly that (an all-reduce plan,
/// `unit.count ≥ 1`). When `unit` passed [`crate::check::check`], so does `plan` (module doc).
pub fn scaled_from(unit: &Plan, plan: &Plan) -> Option<usize> {
    if unit.collective != Collective::AllReduce
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
