//! Reach: a plan for ranks that cannot read each other's device memory (staged edges: no peer
//! access between them, the article's trade-offs) touches no other rank's device memory — every
//! buffer of another rank it reads or writes is pinned host memory, which every GPU maps
//! ([`crate::plan::Memory`]). The other checks prove what a plan computes; this one, that it can
//! run where peer access is missing at all (on CUDA, a peer read without access is an illegal
//! address, or through a host bounce buffer ten times slower, never a wrong plan the others see).
//!
//! The executor may also place buffers a plan declares in device memory into host memory of its
//! own: across processes, the buffers a rank prepares alone lie in its arena, which is pinned
//! host memory where GPUs do not reach each other (`exec::cuda`'s module `peer_words`), so a
//! kernel plan that reads only such buffers of its peers runs there too ([`check_reach_placed`]).
//!
//! Invariant: an empty range touches nothing (a meeting's zero-element "join" reads no memory).

use super::{accesses, describe, reject, Check};
use crate::plan::{BufKind, Memory, Plan};

/// Every range of another rank's buffer that an instruction touches lies in host memory.
pub(super) fn check_reach(plan: &Plan) -> Check {
    check_reach_placed(plan, |_| false)
}

/// [`check_staged`](super::check_staged)'s reach rule where the buffers of the kinds
/// `in_host` names lie in host memory whatever their kind's own memory: every range of another
/// rank's buffer an instruction touches is host memory by kind or by placement. (Not the other
/// checks: the plan's result and races are [`check`](super::check)'s, proven before.)
pub fn check_reach_placed(plan: &Plan, in_host: impl Fn(BufKind) -> bool) -> Check {
    for (rank, program) in plan.ranks.iter().enumerate() {
        for (index, instr) in program.iter().enumerate() {
            let (reads, writes) = accesses(plan, &instr.op);
            for region in reads.iter().chain(&writes).filter(|r| r.count > 0) {
                // An undeclared buffer is the shape check's to reject.
                let Some(decl) = plan.buffers.get(region.buf.0) else {
                    continue;
                };
                let host = decl.kind.memory() == Memory::Host || in_host(decl.kind);
                if decl.rank != rank && !host {
                    return reject(format!(
                        "{} touches rank {}'s {:?} buffer, device memory it cannot reach \
                         without peer access",
                        describe(plan, rank, index),
                        decl.rank,
                        decl.kind
                    ));
                }
            }
        }
    }
    Ok(())
}
