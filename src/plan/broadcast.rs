//! The chained broadcast: the root's `count` elements travel down the ring, root → root + 1 →
//! … → root + n − 1, each rank forwarding chunk c as soon as it has arrived — a pipeline, so a
//! large message costs about one link's time, not n − 1 of them.
//!
//! Hop h is the push from chain position h to h + 1 (rank `root + h` to `root + h + 1`, a ring
//! edge, so staged edges work as in the ring). Pushes land straight in the receiver's output on
//! the sender's Send stream (peer) or through its host slots (staged). Out of place the root
//! also copies its input into its own output.
//!
//! ```text
//!   world = 4, root = 1, chunks x y
//!
//!   hop 0: rank 1 ──x,y──▶ rank 2      hop 1: rank 2 ──x,y──▶ rank 3      hop 2: rank 3 ──x,y──▶ rank 0
//!   (chunk x of hop 1 starts as soon as chunk x of hop 0 has landed)
//! ```
//!
//! | hop h | sender           | receiver             |
//! |-------|------------------|----------------------|
//! | h     | (root + h) mod n | (root + h + 1) mod n |
//!
//! Invariant: after chunk c of hop h, ranks root … root + h + 1 hold chunk c. The formula is
//! [`chain_rank`]; a unit test checks it against this table.

use super::push::{chunk_for, region, Landing, Pusher};
use super::ring::chunk_range;
use super::{BufKind, Collective, EventId, Phase, Plan, RingSpec, StreamKind, Tag};
use crate::error::Result;

/// The rank at position `position` of the chain that starts at `start`.
pub fn chain_rank(start: usize, position: usize, world: usize) -> usize {
    (start + position) % world
}

/// Compiles a chained broadcast of `spec.count` elements from `root`.
pub(super) fn build(spec: &RingSpec, root: usize) -> Result<Plan> {
    spec.check_common()?;
    let (n, count, in_place) = (spec.world, spec.count, spec.in_place);
    let mut plan = Pusher::empty_plan(spec, Collective::Broadcast { root });
    for rank in 0..n {
        plan.declare_callers(rank);
    }
    let chunk = chunk_for(spec, count)?;
    let mut p = Pusher::new(spec, chunk, plan, &[], true);
    p.record_entries();
    let source = if in_place {
        p.buf(root, BufKind::Output)
    } else {
        let input = p.buf(root, BufKind::Input);
        let own = p.buf(root, BufKind::Output);
        p.local_copy(
            root,
            StreamKind::Main,
            region(input, 0..count),
            region(own, 0..count),
            None,
            Tag::LOCAL,
        );
        input
    };
    for c in 0..count.div_ceil(chunk) {
        let range = chunk_range(0..count, chunk, c);
        let mut landed: Option<EventId> = None;
        for hop in 0..n.saturating_sub(1) {
            let sender = chain_rank(root, hop, n);
            let receiver = chain_rank(root, hop + 1, n);
            let tag = Tag {
                phase: Phase::Broadcast,
                step: hop,
                chunk: c,
            };
            let src_buf = if hop == 0 {
                source
            } else {
                p.buf(sender, BufKind::Output)
            };
            let src = region(src_buf, range.clone());
            let dst = region(p.buf(receiver, BufKind::Output), range.clone());
            landed = Some(p.transfer(sender, receiver, src, Landing::Final(dst), landed, tag));
        }
    }
    Ok(p.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table in the module doc, for world = 4 and root = 1.
    #[test]
    fn chain_formula_matches_the_doc_table() {
        let hops = [(1, 2), (2, 3), (3, 0)];
        for (hop, &want) in hops.iter().enumerate() {
            assert_eq!((chain_rank(1, hop, 4), chain_rank(1, hop + 1, 4)), want);
        }
    }

    #[test]
    fn the_chain_visits_every_rank_once() {
        for n in 1..=16 {
            for root in 0..n {
                let mut seen: Vec<usize> = (0..n).map(|p| chain_rank(root, p, n)).collect();
                assert_eq!(seen[0], root);
                seen.sort_unstable();
                assert_eq!(seen, (0..n).collect::<Vec<_>>());
            }
        }
    }
}
