//! The ring reduce-scatter: rank r ends with block r of the reduction of every rank's world·count
//! input — the all-reduce ring's first half, on blocks, shifted so that rank r finishes block r.
//!
//! For `world − 1` steps rank r pushes one block's partial sum to rank r + 1, which folds its own
//! input block into it. A pushed chunk lands in one of the receiver's staging slots (credits as in
//! [`super::ring`]); the receiver's Reduce stream writes `own ⊕ slot` into its partial-sum buffer
//! — its output itself in place (the block's input is read only by that fold), a device
//! [`BufKind::Scratch`] of world·count elements out of place (the output holds one block) — and
//! at the last step into its output:
//!
//! ```text
//!   world = 3, blocks A B C; rank r's input is A_r B_r C_r
//!
//!   step   rank 0 sends   rank 1 sends   rank 2 sends    after the step
//!   0      C0 → 1         A1 → 2         B2 → 0          0: B20    1: C01    2: A12
//!   1      B20 → 1        C01 → 2        A12 → 0         0: A120   1: B201   2: C012
//! ```
//!
//! | step s | rank r sends block  | rank r receives block | from  |
//! |--------|---------------------|-----------------------|-------|
//! | s      | (r − s − 1) mod n   | (r − s − 2) mod n     | r − 1 |
//!
//! Invariant: after step s, rank r holds s + 2 contributions to block (r − s − 2) mod n; after
//! step n − 2 the full reduction of block r. The formulas are [`send_block`] and
//! [`recv_block`]; a unit test checks them against this table.

use super::push::{block_range, chunk_for, region, Landing, Pusher};
use super::ring::{chunk_range, send_to};
use super::{BufKind, BufferDecl, Collective, EventId, Phase, Plan, RingSpec, StreamKind, Tag};
use crate::error::Result;

/// The block rank `rank` pushes to rank + 1 at `step`.
pub fn send_block(rank: usize, step: usize, world: usize) -> usize {
    (rank + 2 * world - step % world - 1) % world
}

/// The block rank `rank` receives from rank − 1 at `step` (and folds its own input into).
pub fn recv_block(rank: usize, step: usize, world: usize) -> usize {
    send_block((rank + world - 1) % world, step, world)
}

/// Compiles a ring reduce-scatter of `spec.count` elements per rank's result.
pub(super) fn build(spec: &RingSpec) -> Result<Plan> {
    spec.check_common()?;
    let (n, count, in_place) = (spec.world, spec.count, spec.in_place);
    let mut plan = Pusher::empty_plan(spec, Collective::ReduceScatter);
    let scratch = !in_place && n > 2 && count > 0;
    for rank in 0..n {
        plan.declare_callers(rank);
        if scratch {
            plan.buffers.push(BufferDecl {
                rank,
                kind: BufKind::Scratch,
                len: n * count,
            });
        }
    }
    let chunk = chunk_for(spec, count)?;
    let slotted: Vec<usize> = if n > 1 && count > 0 {
        (0..n).collect()
    } else {
        Vec::new()
    };
    let mut p = Pusher::new(spec, chunk, plan, &slotted, true);
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
    let partial = |p: &Pusher, rank| {
        p.buf(
            rank,
            if in_place {
                BufKind::Output
            } else {
                BufKind::Scratch
            },
        )
    };
    if n == 1 && !in_place {
        let src = region(source(&p, 0), 0..count);
        let dst = region(p.buf(0, BufKind::Output), 0..count);
        p.local_copy(0, StreamKind::Main, src, dst, None, Tag::LOCAL);
    }
    let chunks = count.div_ceil(chunk);
    let mut ready: Vec<Vec<Option<EventId>>> = vec![vec![None; chunks]; n];
    for step in 0..n.saturating_sub(1) {
        let last = step + 2 == n;
        let mut next_ready = vec![vec![None; chunks]; n];
        for c in 0..chunks {
            #[allow(clippy::needless_range_loop)] // `sender` is a rank, not just an index
            for sender in 0..n {
                let tag = Tag {
                    phase: Phase::ReduceScatter,
                    step,
                    chunk: c,
                };
                let block = send_block(sender, step, n);
                let range = chunk_range(block_range(block, count), chunk, c);
                // Step 0 pushes the sender's input; later steps forward its partial sum.
                let src_buf = if step == 0 {
                    source(&p, sender)
                } else {
                    partial(&p, sender)
                };
                let src = region(src_buf, range.clone());
                let receiver = send_to(sender, n);
                let own = region(source(&p, receiver), range.clone());
                let dst = if last && !in_place {
                    // The receiver's block is `receiver`: its output holds that block alone.
                    let local = range.start - block * count..range.end - block * count;
                    region(p.buf(receiver, BufKind::Output), local)
                } else {
                    region(partial(&p, receiver), range)
                };
                let landing = Landing::Reduce {
                    own,
                    dst,
                    scale: p.plan.average && last,
                };
                let after = ready[sender][c];
                let landed = p.transfer(sender, receiver, src, landing, after, tag);
                next_ready[receiver][c] = Some(landed);
            }
        }
        ready = next_ready;
    }
    Ok(p.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table in the module doc, for world = 3, written out by hand.
    #[test]
    fn block_formulas_match_the_doc_table() {
        // [step][rank] -> (sends, receives)
        let table = [[(2, 1), (0, 2), (1, 0)], [(1, 0), (2, 1), (0, 2)]];
        for (step, row) in table.iter().enumerate() {
            for (rank, &want) in row.iter().enumerate() {
                assert_eq!((send_block(rank, step, 3), recv_block(rank, step, 3)), want);
            }
        }
    }

    #[test]
    fn partial_sums_are_forwarded_and_each_rank_finishes_its_own_block() {
        for n in 2..=16 {
            for r in 0..n {
                for s in 0..n - 2 {
                    assert_eq!(recv_block(r, s, n), send_block(r, s + 1, n));
                }
                assert_eq!(recv_block(r, n - 2, n), r);
            }
        }
    }
}
