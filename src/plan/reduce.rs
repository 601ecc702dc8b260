//! The chained reduce: partial sums travel down the ring towards the root, root + 1 → root + 2
//! → … → root, each rank folding its own input into what arrives and forwarding chunk c as soon
//! as it is folded — a pipeline, like the broadcast chain run backwards into a sum.
//!
//! Hop h is the push from chain position h to h + 1, where position q is rank `root + 1 + q`
//! (the last position, n − 1, is the root). Pushes land in the receiver's staging slots (credits
//! as in [`super::ring`]); the receiver's Reduce stream writes `own ⊕ slot` into its
//! [`BufKind::Scratch`] (a non-root rank's buffers are never written, in place too), or, at the
//! root, into its output (scaled there for `Avg`).
//!
//! ```text
//!   world = 4, root = 1; rank r's input is x_r
//!
//!   hop 0: rank 2 ──x2──▶ rank 3: x2⊕x3   hop 1: rank 3 ──▶ rank 0: x2⊕x3⊕x0
//!   hop 2: rank 0 ──▶ rank 1 (root): x2⊕x3⊕x0⊕x1
//! ```
//!
//! | hop h | sender               | receiver             |
//! |-------|----------------------|----------------------|
//! | h     | (root + 1 + h) mod n | (root + 2 + h) mod n |
//!
//! Invariant: after chunk c of hop h, chain position h + 1 holds h + 2 contributions to chunk c.
//! The formula is [`super::broadcast::chain_rank`] from `root + 1`; a unit test checks it
//! against this table.

use super::broadcast::chain_rank;
use super::push::{chunk_for, region, Landing, Pusher};
use super::ring::chunk_range;
use super::{BufKind, BufferDecl, Collective, EventId, Phase, Plan, RingSpec, StreamKind, Tag};
use crate::error::Result;

/// Compiles a chained reduce of `spec.count` elements into `root`.
pub(super) fn build(spec: &RingSpec, root: usize) -> Result<Plan> {
    spec.check_common()?;
    let (n, count, in_place) = (spec.world, spec.count, spec.in_place);
    let start = (root + 1) % n;
    let mut plan = Pusher::empty_plan(spec, Collective::Reduce { root });
    for rank in 0..n {
        plan.declare_callers(rank);
        // Positions 1 … n − 2 fold and forward.
        if rank != root && rank != start && count > 0 {
            plan.buffers.push(BufferDecl {
                rank,
                kind: BufKind::Scratch,
                len: count,
            });
        }
    }
    let chunk = chunk_for(spec, count)?;
    let receivers: Vec<usize> = if count > 0 {
        (1..n).map(|q| chain_rank(start, q, n)).collect()
    } else {
        Vec::new()
    };
    let mut p = Pusher::new(spec, chunk, plan, &receivers, true);
    p.record_entries();
    let source = |p: &Pusher, rank| {
        p.buf(
            rank,
            if in_place {
                BufKind::Output
            } else {
                BufKind::Input
            },
        )
    };
    if n == 1 && !in_place {
        let src = region(source(&p, 0), 0..count);
        let dst = region(p.buf(0, BufKind::Output), 0..count);
        let tag = Tag::LOCAL;
        p.local_copy(0, StreamKind::Main, src, dst, None, tag);
    }
    for c in 0..count.div_ceil(chunk) {
        let range = chunk_range(0..count, chunk, c);
        let mut landed: Option<EventId> = None;
        for hop in 0..n.saturating_sub(1) {
            let sender = chain_rank(start, hop, n);
            let receiver = chain_rank(start, hop + 1, n);
            let tag = Tag {
                phase: Phase::Reduce,
                step: hop,
                chunk: c,
            };
            let src_buf = if hop == 0 {
                source(&p, sender)
            } else {
                p.buf(sender, BufKind::Scratch)
            };
            let dst_buf = if receiver == root {
                p.buf(root, BufKind::Output)
            } else {
                p.buf(receiver, BufKind::Scratch)
            };
            let landing = Landing::Reduce {
                own: region(source(&p, receiver), range.clone()),
                dst: region(dst_buf, range.clone()),
                scale: p.plan.average && receiver == root,
            };
            let src = region(src_buf, range.clone());
            landed = Some(p.transfer(sender, receiver, src, landing, landed, tag));
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
        let hops = [(2, 3), (3, 0), (0, 1)];
        let start = 2;
        for (hop, &want) in hops.iter().enumerate() {
            assert_eq!(
                (chain_rank(start, hop, 4), chain_rank(start, hop + 1, 4)),
                want
            );
        }
    }

    #[test]
    fn the_chain_ends_at_the_root() {
        for n in 2..=16 {
            for root in 0..n {
                assert_eq!(chain_rank((root + 1) % n, n - 1, n), root);
            }
        }
    }
}
