//! The staged one-shot all-reduce: the one-shot for ranks that cannot read each other's device
//! memory (consumer GPUs, VMs and containers without peer access: the article's trade-offs),
//! through pinned host memory every rank can read — what NCCL's host transport does in spirit.
//!
//! Where edges are staged, the ring moves every chunk GPU → host → GPU with two copies and
//! cross-GPU events per step, which costs tens of microseconds before a byte counts; for small
//! messages that fixed cost is the whole call. Here each rank publishes its source once, into its
//! own [`BufKind::HostExposed`](super::BufKind::HostExposed) buffer (pinned host memory, mapped into every GPU's address
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
//! [`crate::exec::algorithm::STAGED_ONESHOT_AUTO_MAX_BYTES`] — and at every size where the call
//! gate checks the calls (ranks in several processes, `exec::algorithm::Ask::gated`), since the
//! ring's copies would meet the peers' hosts (its cost against the ring there is not measured).
//!
//! Invariant (proven by [`crate::check::check_staged`]): no rank reads or writes another rank's
//! device memory — every buffer a rank touches that is not its own is host memory.

use super::oneshot::{allreduce_plan, Publish};
use super::{OneShotSpec, Plan};
use crate::error::Result;

impl OneShotSpec {
    /// Compiles the staged form of the one-shot all-reduce (module doc): every rank's source
    /// published into a host copy. World 1 is a copy (out of place) or nothing; count 0 is an
    /// empty plan — as for [`OneShotSpec::build`], whose builder it shares.
    pub fn build_staged(&self) -> Result<Plan> {
        allreduce_plan(
            self.world,
            self.count,
            self.in_place,
            self.op,
            Publish::Host,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{check, check_staged};
    use crate::element::ReduceOp;
    use crate::plan::{BufKind, Op, Ranks};

    fn spec(world: usize, count: usize, in_place: bool, op: ReduceOp) -> OneShotSpec {
        OneShotSpec {
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
                        let plan = spec(world, count, in_place, op).build_staged().unwrap();
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
        let plan = spec(3, 10, false, ReduceOp::Avg).build_staged().unwrap();
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
        let device = spec(3, 10, false, ReduceOp::Sum).build().unwrap();
        check(&device).unwrap();
        let err = check_staged(&device).unwrap_err().to_string();
        assert!(err.contains("device memory"), "{err}");
    }
}
