//! The direct all-to-all: rank r's output block j is rank j's input block r. Each rank copies
//! its own block locally and pushes every other block straight into its owner's output, on its
//! Send stream (peer; staged through its host slots where the GPUs do not all reach each other),
//! chunk by chunk. Push j of rank r goes to rank r + j, so at each round every rank sends to one
//! rank and receives from one, spreading the load over the links.
//!
//! ```text
//!   world = 3; rank r's input blocks are r0 r1 r2 (block j is for rank j)
//!
//!   push 1: 0 ──01──▶ 1   1 ──12──▶ 2   2 ──20──▶ 0
//!   push 2: 0 ──02──▶ 2   1 ──10──▶ 0   2 ──21──▶ 1
//!   outputs: rank 0: 00 10 20   rank 1: 01 11 21   rank 2: 02 12 22
//! ```
//!
//! | push j | rank r sends its input block | into rank      | at output block |
//! |--------|------------------------------|----------------|-----------------|
//! | j      | (r + j) mod n                | (r + j) mod n  | r               |
//!
//! Invariant: every (sender, receiver) pair moves exactly one block, into a block of the
//! receiver's output nobody else writes. The formula is [`push_to`]; a unit test checks it
//! against this table.

use super::push::{block_range, chunk_for, region, Landing, Pusher};
use super::ring::chunk_range;
use super::{BufKind, Collective, Phase, Plan, RingSpec, StreamKind, Tag};
use crate::error::Result;

/// The rank that rank `rank` pushes to at push `j` (and whose block it sends).
pub fn push_to(rank: usize, j: usize, world: usize) -> usize {
    (rank + j) % world
}

/// Compiles a direct all-to-all of `spec.count` elements per block.
pub(super) fn build(spec: &RingSpec) -> Result<Plan> {
    spec.check_common()?;
    let (n, count) = (spec.world, spec.count);
    let mut plan = Pusher::empty_plan(spec, Collective::AllToAll);
    for rank in 0..n {
        plan.declare_callers(rank);
    }
    let chunk = chunk_for(spec, count)?;
    let mut p = Pusher::new(spec, chunk, plan, &[], true);
    p.record_entries();
    for rank in 0..n {
        let src = region(p.buf(rank, BufKind::Input), block_range(rank, count));
        let dst = region(p.buf(rank, BufKind::Output), block_range(rank, count));
        let tag = Tag::LOCAL;
        p.local_copy(rank, StreamKind::Main, src, dst, None, tag);
    }
    for j in 1..n {
        for c in 0..count.div_ceil(chunk) {
            for sender in 0..n {
                let receiver = push_to(sender, j, n);
                let from = chunk_range(block_range(receiver, count), chunk, c);
                let to = chunk_range(block_range(sender, count), chunk, c);
                let src = region(p.buf(sender, BufKind::Input), from);
                let dst = region(p.buf(receiver, BufKind::Output), to);
                let tag = Tag {
                    phase: Phase::AllToAll,
                    step: j,
                    chunk: c,
                };
                p.transfer(sender, receiver, src, Landing::Final(dst), None, tag);
            }
        }
    }
    Ok(p.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The diagram in the module doc, for world = 3: (push, rank) -> receiver.
    #[test]
    fn push_formula_matches_the_doc_table() {
        let table = [[1, 2, 0], [2, 0, 1]];
        for (j, row) in table.iter().enumerate() {
            for (rank, &to) in row.iter().enumerate() {
                assert_eq!(push_to(rank, j + 1, 3), to);
            }
        }
    }

    #[test]
    fn each_round_is_a_permutation_and_every_pair_meets_once() {
        for n in 1..=16 {
            let mut pairs = std::collections::BTreeSet::new();
            for j in 1..n {
                let mut to: Vec<usize> = (0..n).map(|r| push_to(r, j, n)).collect();
                for (r, &t) in to.iter().enumerate() {
                    assert!(pairs.insert((r, t)) && r != t);
                }
                to.sort_unstable();
                assert_eq!(to, (0..n).collect::<Vec<_>>());
            }
            assert_eq!(pairs.len(), n * (n - 1));
        }
    }
}
