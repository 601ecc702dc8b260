//! The arena layout: where a plan's buffers lie in each rank's arena — one region of device
//! memory per rank (pinned host memory where the GPUs do not all reach each other), made once
//! with the communicator, that holds the buffers a peer-kernel plan's
//! ranks own (exposed copies, scratch, staged copies of the caller's buffers).
//!
//! Why a layout and not an allocation per plan: a rank in another process reaches a buffer only
//! through an export handle that it imports, so a plan whose buffers are allocated when it is
//! prepared needs every rank's handles, an exchange that meets the peers. When each rank's
//! buffers lie at offsets that are a function of the plan alone, every rank computes every
//! rank's addresses by itself (the owner's arena, exchanged at creation, plus the offset) and
//! prepares the plan alone. The GPU executor does so across processes
//! (`exec::cuda::executor::prepare`).
//!
//! Buffers of rank `r` are laid out in plan order, each at the next multiple of
//! [`ARENA_ALIGN_ELEMS`] elements (at least 64 bytes for every element type, so every buffer is
//! vector-aligned for the kernels), each at least one element long.
//!
//! Why plans of different shapes may share one arena is the exposure region's argument: peers
//! only read a rank's arena, between a kernel's start and end barriers, and a rank writes its
//! arena (its staged copies, its exposed copy) only after its previous call completed — which,
//! for a barrier kernel, waited for every peer's reads at the end barrier (the LL kernel reads
//! no peer memory at all). The checker's race check over sequences of plans laid out in the
//! arenas models it ([`crate::check::check_sequence_in_arenas`]; `tests/plan_check.rs` runs it
//! on random sequences of kernel plans).

use super::{BufKind, Memory, Plan};

/// The alignment of every buffer in an arena, in elements.
pub const ARENA_ALIGN_ELEMS: usize = 64;

/// The offset, in elements of the owner's arena, of every buffer of `plan` that `placed` says an
/// arena holds (`None` for the others: the caller's buffers, by address), every rank's laid out
/// from its arena's start; `None` when a placed buffer is host memory and the arenas (of
/// `memory`) are not, or a rank's placed buffers do not fit `capacity` elements. (Arenas of host
/// memory hold buffers of either kind: every GPU maps them.)
pub fn arena_layout(
    plan: &Plan,
    placed: impl Fn(BufKind) -> bool,
    capacity: usize,
    memory: Memory,
) -> Option<Vec<Option<usize>>> {
    let mut next = vec![0usize; plan.world];
    let mut offsets = Vec::with_capacity(plan.buffers.len());
    for decl in &plan.buffers {
        if !placed(decl.kind) {
            offsets.push(None);
            continue;
        }
        if decl.kind.memory() == Memory::Host && memory != Memory::Host {
            return None;
        }
        let at = next[decl.rank].checked_next_multiple_of(ARENA_ALIGN_ELEMS)?;
        let end = at.checked_add(decl.len.max(1))?;
        if end > capacity {
            return None;
        }
        next[decl.rank] = end;
        offsets.push(Some(at));
    }
    Some(offsets)
}

#[cfg(test)]
mod tests {
    use super::{arena_layout, ARENA_ALIGN_ELEMS};
    use crate::element::ReduceOp;
    use crate::plan::{BufKind, Memory, OneShotSpec};

    fn in_place(world: usize, count: usize) -> crate::plan::Plan {
        OneShotSpec {
            world,
            count,
            in_place: true,
            op: ReduceOp::Sum,
        }
        .build()
        .unwrap()
    }

    #[test]
    fn each_ranks_buffers_are_aligned_apart_from_its_arenas_start_and_must_fit() {
        let plan = in_place(3, 100);
        // Exposed copies and the caller's buffers, as a rank staging its caller's would own.
        let staged = |kind: BufKind| kind == BufKind::Exposed || kind.is_callers();
        let layout = arena_layout(&plan, staged, 1 << 20, Memory::Device).unwrap();
        for rank in 0..3 {
            let mut mine: Vec<(usize, usize)> = plan
                .buffers
                .iter()
                .zip(&layout)
                .filter(|(d, _)| d.rank == rank)
                .map(|(d, at)| (at.unwrap(), d.len))
                .collect();
            mine.sort();
            assert_eq!(mine.len(), 2, "rank {rank}: output and exposed copy");
            assert_eq!(mine[0].0, 0, "rank {rank} starts its arena");
            assert_eq!(
                mine[1].0, 128,
                "rank {rank}: 100 elements, then the next 64"
            );
            assert!(mine.iter().all(|(at, _)| at % ARENA_ALIGN_ELEMS == 0));
        }
        // Only what is placed; and 228 elements need 228.
        let exposed = arena_layout(&plan, |k| k == BufKind::Exposed, 100, Memory::Device).unwrap();
        let placed = plan.buffers.iter().zip(&exposed);
        assert!(placed
            .clone()
            .all(|(d, at)| at.is_some() == (d.kind == BufKind::Exposed)));
        assert!(arena_layout(&plan, staged, 227, Memory::Device).is_none());
        assert!(arena_layout(&plan, staged, 228, Memory::Device).is_some());
    }

    #[test]
    fn host_memory_is_laid_out_in_host_arenas_only() {
        let plan = OneShotSpec {
            world: 2,
            count: 8,
            in_place: true,
            op: ReduceOp::Sum,
        }
        .build_staged()
        .unwrap();
        assert!(plan.buffers.iter().any(|d| d.kind == BufKind::HostExposed));
        let host = |k| k == BufKind::HostExposed;
        assert!(arena_layout(&plan, host, 1 << 20, Memory::Device).is_none());
        assert!(arena_layout(&plan, host, 1 << 20, Memory::Host).is_some());
    }
}
