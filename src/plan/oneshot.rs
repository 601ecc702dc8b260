//! The one-shot all-reduce plan: one [`Op::PeerReduce`] per rank (module doc of [`crate::plan`]).
//!
//! ```text
//!   out of place, rank r (Main stream)         in place, rank r (Main stream)
//!   PeerReduce out_r = in_0 ⊕ … ⊕ in_n−1       Copy buf_r → exposed_r
//!   [Scale out_r]            (Avg)             PeerReduce buf_r = exposed_0 ⊕ … ⊕ exposed_n−1
//!                                              [Scale buf_r]            (Avg)
//! ```
//!
//! Everything runs on Main, so the caller's work before the call is ordered before it and the
//! call's completion is Main's: no events at all. What orders ranks against each other is the
//! instruction's two barriers: the start barrier guarantees every source is ready (each rank's
//! copy into its exposed buffer, or the caller's writes of its input, came before its barrier
//! arrival on its own stream), the end barrier that no rank still reads another's source when that
//! rank moves on — to the caller's next kernel, or to the next call's copy into the same exposed
//! buffer. The checker ([`crate::check`]) proves both.

use super::{BufId, BufKind, BufferDecl, Instr, Op, Phase, Plan, Ranks, Region, StreamKind, Tag};
use crate::element::ReduceOp;
use crate::error::{Error, Result};

/// Everything the one-shot plan depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OneShotSpec {
    /// Number of ranks.
    pub world: usize,
    /// Elements per rank.
    pub count: usize,
    /// True when each rank's output buffer is also its input.
    pub in_place: bool,
    /// Only `Avg` matters to the plan (it adds the scaling); the others differ in the kernel.
    pub op: ReduceOp,
}

const TAG: Tag = Tag {
    phase: Phase::OneShot,
    step: 0,
    chunk: 0,
};

impl OneShotSpec {
    /// Compiles the spec into a plan. World 1 is a copy (out of place) or nothing; count 0 is an
    /// empty plan — as for the ring.
    pub fn build(&self) -> Result<Plan> {
        if self.world == 0 {
            return Err(Error::InvalidArgument(
                "a one-shot plan needs at least one rank".into(),
            ));
        }
        let n = self.world;
        let mut plan = peer_plan(n, self.count, self.in_place, self.op);
        let collective = n > 1 && self.count > 0;
        if self.in_place && collective {
            for rank in 0..n {
                declare(&mut plan, rank, BufKind::Exposed, self.count);
            }
        }
        let whole = |buf: BufId| Region {
            buf,
            offset: 0,
            count: self.count,
        };
        for rank in 0..n {
            let out = whole(plan.buffer(rank, BufKind::Output).expect("declared"));
            let input = plan.buffer(rank, BufKind::Input).map(whole);
            let exposed = plan.buffer(rank, BufKind::Exposed).map(whole);
            let mut ops = Vec::new();
            if n == 1 {
                if let Some(input) = input.filter(|r| r.count > 0) {
                    ops.push(Op::Copy {
                        src: input,
                        dst: out,
                    });
                }
            } else if collective {
                let src = match exposed {
                    Some(exposed) => {
                        ops.push(Op::Copy {
                            src: out,
                            dst: exposed,
                        });
                        BufKind::Exposed
                    }
                    None => BufKind::Input,
                };
                ops.push(Op::PeerReduce {
                    dst: out,
                    src,
                    offset: 0,
                    count: self.count,
                    ranks: Ranks::ALL,
                });
                if plan.average {
                    ops.push(Op::Scale { region: out });
                }
            }
            plan.ranks[rank] = ops
                .into_iter()
                .map(|op| Instr {
                    stream: StreamKind::Main,
                    op,
                    tag: TAG,
                })
                .collect();
        }
        Ok(plan)
    }
}

pub(super) fn declare(plan: &mut Plan, rank: usize, kind: BufKind, len: usize) {
    plan.buffers.push(BufferDecl { rank, kind, len });
}

/// An empty plan of `world` ranks with every rank's input (out of place) and output declared,
/// `count` elements each: the start of the one-shot's and the two-shot's plans.
pub(super) fn peer_plan(world: usize, count: usize, in_place: bool, op: ReduceOp) -> Plan {
    let mut plan = Plan {
        collective: super::Collective::AllReduce,
        world,
        count,
        in_place,
        average: op == ReduceOp::Avg && world > 1,
        buffers: Vec::new(),
        events: Vec::new(),
        ranks: vec![Vec::new(); world],
    };
    for rank in 0..world {
        if !in_place {
            declare(&mut plan, rank, BufKind::Input, count);
        }
        declare(&mut plan, rank, BufKind::Output, count);
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_place_exposes_a_copy_out_of_place_reads_inputs() {
        let oop = OneShotSpec {
            world: 3,
            count: 10,
            in_place: false,
            op: ReduceOp::Sum,
        }
        .build()
        .unwrap();
        assert!(oop.buffer(0, BufKind::Exposed).is_none());
        assert_eq!(oop.ranks[1].len(), 1);
        assert!(matches!(
            oop.ranks[1][0].op,
            Op::PeerReduce {
                src: BufKind::Input,
                ..
            }
        ));
        let ip = OneShotSpec {
            world: 3,
            count: 10,
            in_place: true,
            op: ReduceOp::Avg,
        }
        .build()
        .unwrap();
        assert!(ip.buffer(2, BufKind::Exposed).is_some());
        let ops: Vec<_> = ip.ranks[2].iter().map(|i| i.op).collect();
        assert!(matches!(ops[0], Op::Copy { .. }));
        assert!(matches!(
            ops[1],
            Op::PeerReduce {
                src: BufKind::Exposed,
                ..
            }
        ));
        assert!(matches!(ops[2], Op::Scale { .. }));
        assert!(ip.events.is_empty());
    }
}
