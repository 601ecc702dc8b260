//! The staged one-shot all-reduce: the one-shot for ranks that cannot read each other's device
//! memory (consumer GPUs, VMs and containers without peer access: the article's trade-offs),
//! through pinned host memory every rank can read — what NCCL's host transport does in spirit.
//!
//! Where edges are staged, the ring moves every chunk GPU → host → GPU with two copies and
//! cross-GPU events per step, which costs tens of microseconds before a byte counts; for small
//! messages that fixed cost is the whole call. Here each rank publishes its source once, into its
//! own [`BufKind::HostExposed`] buffer (pinned host memory, mapped into every GPU's address
//! space), and one meeting per rank folds every rank's host copy in rank order into its output:
//!
//! ```text
//!   rank r (Main stream), in place or out of place
//!   Expose src_r → host_r                        src = the input, or the buffer in place
//!   PeerReduce out_r = host_0 ⊕ … ⊕ host_n−1      (start and end barrier)
//!   [Scale out_r]                                (Avg)
//! ```
//!
//! The same two barriers as the device one-shot ([`super::oneshot`]) order it: the start barrier
//! that every host copy is written before anyone reads it, the end barrier that nobody still
//! reads one when its rank moves on (to the next call's exposure into the same memory). Each
//! rank reads n·count elements of host memory and writes count elements to it, against the
//! ring's 2(n−1)/n·count through host memory on each of its two copies per step: the one-shot
//! stays ahead only while the fixed costs dominate, so `Algorithm::Auto` takes it below
//! [`crate::exec::algorithm::STAGED_ONESHOT_AUTO_MAX_BYTES`].
//!
//! Invariant (proven by [`crate::check::check_staged`]): no rank reads or writes another rank's
//! device memory — every buffer a rank touches that is not its own is host memory.

use super::oneshot::{declare, on_main, peer_plan};
use super::{BufId, BufKind, Op, Plan, Ranks, Region};
use crate::element::ReduceOp;
use crate::error::{Error, Result};

/// Everything the staged one-shot plan depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedOneShotSpec {
    /// Number of ranks.
    pub world: usize,
    /// Elements per rank.
    pub count: usize,
    /// True when each rank's output buffer is also its input.
    pub in_place: bool,
    /// Only `Avg` matters to the plan (it adds the scaling).
    pub op: ReduceOp,
}

impl StagedOneShotSpec {
    /// Compiles the spec into a plan. World 1 is a copy (out of place) or nothing; count 0 is an
    /// empty plan — as for the one-shot.
    pub fn build(&self) -> Result<Plan> {
        if self.world == 0 {
            return Err(Error::InvalidArgument(
                "a staged one-shot plan needs at least one rank".into(),
            ));
        }
        let n = self.world;
        let mut plan = peer_plan(n, self.count, self.in_place, self.op);
        let collective = n > 1 && self.count > 0;
        if collective {
            for rank in 0..n {
                declare(&mut plan, rank, BufKind::HostExposed, self.count);
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
            let mut ops = Vec::new();
            if n == 1 {
                if let Some(input) = input.filter(|r| r.count > 0) {
                    ops.push(Op::Copy {
                        src: input,
                        dst: out,
                    });
                }
            } else if collective {
                let host = whole(plan.buffer(rank, BufKind::HostExposed).expect("declared"));
                ops.push(Op::Expose {
                    src: input.unwrap_or(out),
                    dst: host,
                });
                ops.push(Op::PeerReduce {
                    dst: out,
                    src: BufKind::HostExposed,
                    offset: 0,
                    count: self.count,
                    ranks: Ranks::ALL,
                    fused: false,
                    push: Ranks::NONE,
                });
                if plan.average {
                    ops.push(Op::Scale { region: out });
                }
            }
            plan.ranks[rank] = on_main(ops);
        }
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{check, check_staged};

    fn spec(world: usize, count: usize, in_place: bool, op: ReduceOp) -> StagedOneShotSpec {
        StagedOneShotSpec {
            world,
            count,
            in_place,
            op,
        }
    }

    #[test]
    fn staged_plans_are_proven_and_touch_no_peers_device_memory() {
        for world in 1..=8 {
            for count in [0, 1, 7, 1000] {
                for in_place in [false, true] {
                    for op in [ReduceOp::Sum, ReduceOp::Avg] {
                        let plan = spec(world, count, in_place, op).build().unwrap();
                        check_staged(&plan).unwrap_or_else(|e| {
                            panic!("world {world} count {count} in place {in_place}: {e}")
                        });
                    }
                }
            }
        }
    }

    #[test]
    fn each_rank_publishes_into_host_memory_then_folds_every_ranks_copy() {
        let plan = spec(3, 10, false, ReduceOp::Avg).build().unwrap();
        for (rank, program) in plan.ranks.iter().enumerate() {
            let ops: Vec<Op> = program.iter().map(|i| i.op).collect();
            let host = plan.buffer(rank, BufKind::HostExposed).unwrap();
            let input = plan.buffer(rank, BufKind::Input).unwrap();
            assert!(
                matches!(ops[0], Op::Expose { src, dst } if src.buf == input && dst.buf == host)
            );
            assert!(matches!(
                ops[1],
                Op::PeerReduce {
                    src: BufKind::HostExposed,
                    ranks: Ranks::ALL,
                    ..
                }
            ));
            assert!(matches!(ops[2], Op::Scale { .. }));
        }
        // The device one-shot's plan reads peers' device memory: proven, but not staged.
        let device = crate::plan::OneShotSpec {
            world: 3,
            count: 10,
            in_place: false,
            op: ReduceOp::Sum,
        }
        .build()
        .unwrap();
        check(&device).unwrap();
        let err = check_staged(&device).unwrap_err().to_string();
        assert!(err.contains("device memory"), "{err}");
    }
}
