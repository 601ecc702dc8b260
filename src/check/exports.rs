//! Memory across processes: a rank whose peers live in other processes reaches a peer's buffer
//! only if that peer exported it (a file descriptor or an IPC handle its peers map). Which of a
//! plan's buffers its ranks export is the executor's choice — the staging slots, scratch and
//! exposed copies always; the caller's buffers only where it stages them through memory of
//! its own (the GPU executor's `Staged`: those some peer touches, [`touched_across_ranks`]), or
//! where they are registered. [`check_exports`] proves that a plan asks
//! for nothing more: every access an instruction of rank r makes to a buffer of rank q ≠ r
//! goes to a buffer of a kind q exports.
//!
//! Invariant: a plan that passes never makes an executor touch another process's memory that it
//! has no mapping of.

use super::{accesses, describe, reject, Check};
use crate::plan::{BufKind, Plan};

/// Proves that every cross-rank access of `plan` goes to a buffer whose kind `exported` says
/// its owner exports (module doc); the first that does not is rejected by name.
pub fn check_exports(plan: &Plan, exported: impl Fn(BufKind) -> bool) -> Check {
    for (rank, program) in plan.ranks.iter().enumerate() {
        for (index, instr) in program.iter().enumerate() {
            let (reads, writes) = accesses(plan, &instr.op);
            for region in reads.iter().chain(&writes) {
                let decl = plan.decl(region.buf);
                if decl.rank != rank && !exported(decl.kind) {
                    return reject(format!(
                        "{} touches rank {}'s {:?} buffer, which that rank does not export: a \
                         rank in another process reaches only memory its peer exported",
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

/// The kinds of buffer some rank of `plan` touches of another rank's (reads or writes): what a
/// rank must export of its own for the plan to run across processes ([`check_exports`]).
pub fn touched_across_ranks(plan: &Plan) -> Vec<BufKind> {
    let mut kinds = Vec::new();
    for (rank, program) in plan.ranks.iter().enumerate() {
        for instr in program {
            let (reads, writes) = accesses(plan, &instr.op);
            for region in reads.iter().chain(&writes) {
                let decl = plan.decl(region.buf);
                if decl.rank != rank && !kinds.contains(&decl.kind) {
                    kinds.push(decl.kind);
                }
            }
        }
    }
    kinds
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element::ReduceOp;
    use crate::plan::{EdgeTransport, OneShotSpec, RingSpec};

    /// The one-shot all-reduce of 10 elements on 3 ranks.
    fn one_shot(in_place: bool) -> Plan {
        let op = ReduceOp::Sum;
        let spec = OneShotSpec {
            world: 3,
            count: 10,
            in_place,
            op,
        };
        spec.build().unwrap()
    }

    /// What an executor exports without staging the caller's buffers.
    fn own_memory(kind: BufKind) -> bool {
        !kind.is_callers()
    }

    #[test]
    fn what_a_plan_touches_across_ranks_is_what_it_needs_exported() {
        // The one-shot out of place reads its peers' inputs and writes only its own output; in
        // place its peers' exposed copies.
        for (in_place, kinds) in [
            (false, vec![BufKind::Input]),
            (true, vec![BufKind::Exposed]),
        ] {
            let plan = one_shot(in_place);
            assert_eq!(touched_across_ranks(&plan), kinds);
            check_exports(&plan, |k| kinds.contains(&k)).unwrap();
            assert!(check_exports(&plan, |k| k != kinds[0]).is_err());
        }
    }

    #[test]
    fn a_one_shot_reads_its_peers_buffers_so_they_must_be_exported() {
        for in_place in [false, true] {
            let plan = one_shot(in_place);
            check_exports(&plan, |_| true).unwrap();
            let verdict = check_exports(&plan, own_memory);
            match in_place {
                // In place, peers read the exposed copy: the rank's own memory.
                true => verdict.unwrap(),
                false => {
                    let err = verdict.unwrap_err().0;
                    assert!(
                        err.contains("Input buffer") && err.contains("export"),
                        "{err}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_peer_ring_writes_its_peers_outputs_and_a_staged_one_only_slots() {
        for in_place in [false, true] {
            let mut spec = RingSpec::new(4, 37, 3, 2, EdgeTransport::Peer);
            spec.in_place = in_place;
            let plan = spec.build().unwrap();
            check_exports(&plan, |_| true).unwrap();
            // The all-gather copies straight into the next rank's output.
            let err = check_exports(&plan, own_memory).unwrap_err().0;
            assert!(
                err.contains("Output buffer") && err.contains("all-gather"),
                "{err}"
            );
            spec.transports = vec![EdgeTransport::Staged; 4];
            let plan = spec.build().unwrap();
            check_exports(&plan, own_memory).unwrap_or_else(|e| panic!("staged: {e}"));
            let err = check_exports(&plan, |kind| kind.is_callers())
                .unwrap_err()
                .0;
            assert!(err.contains("HostSlots"), "{err}");
        }
    }
}
