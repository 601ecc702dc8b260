//! The ring all-gather: every rank ends with every rank's `count` elements, rank j's in block j
//! of its world·count output — the all-reduce ring's second half, on blocks instead of segments.
//!
//! Rank r first copies its input into its own block (out of place; in place the input already is
//! block r). Then, for `world − 1` steps, rank r pushes one block into rank r + 1's output on its
//! Send stream (peer), or through its pinned host slots (staged edge), chunk by chunk; chunk c of
//! step s + 1 forwards what arrived as chunk c of step s:
//!
//! ```text
//!   world = 3, blocks A B C (rank 0's input is A, rank 1's B, rank 2's C)
//!
//!   step   rank 0 sends   rank 1 sends   rank 2 sends    after the step
//!   0      A → 1          B → 2          C → 0           0: A C   1: A B   2: B C
//!   1      C → 1          A → 2          B → 0           every rank: A B C
//! ```
//!
//! | step s | rank r sends block | rank r receives block | from  |
//! |--------|--------------------|-----------------------|-------|
//! | s      | (r − s) mod n      | (r − s − 1) mod n     | r − 1 |
//!
//! Invariant: after step s, rank r holds blocks r, r − 1, …, r − s − 1 (mod n). The formulas are
//! [`send_block`] and [`recv_block`]; a unit test checks them against this table.

use super::push::{block_range, chunk_for, region, Landing, Pusher};
use super::ring::{chunk_range, send_to};
use super::{BufKind, Collective, EventId, Phase, Plan, RingSpec, StreamKind, Tag};
use crate::error::Result;

/// The block rank `rank` pushes to rank + 1 at `step`.
pub fn send_block(rank: usize, step: usize, world: usize) -> usize {
    (rank + world - step % world) % world
}

/// The block rank `rank` receives from rank − 1 at `step`.
pub fn recv_block(rank: usize, step: usize, world: usize) -> usize {
    send_block((rank + world - 1) % world, step, world)
}

/// Compiles a ring all-gather of `spec.count` elements per rank.
pub(super) fn build(spec: &RingSpec) -> Result<Plan> {
    spec.check_common()?;
    let (n, count) = (spec.world, spec.count);
    let mut plan = Pusher::empty_plan(spec, Collective::AllGather);
    for rank in 0..n {
        plan.declare_callers(rank);
    }
    let chunk = chunk_for(spec, count)?;
    let mut p = Pusher::new(spec, chunk, plan, &[], true);
    p.record_entries();
    if !spec.in_place {
        for rank in 0..n {
            let src = region(p.buf(rank, BufKind::Input), 0..count);
            let dst = region(p.buf(rank, BufKind::Output), block_range(rank, count));
            p.local_copy(rank, StreamKind::Main, src, dst, None, Tag::LOCAL);
        }
    }
    let chunks = count.div_ceil(chunk);
    let mut ready: Vec<Vec<Option<EventId>>> = vec![vec![None; chunks]; n];
    for step in 0..n.saturating_sub(1) {
        let mut next_ready = vec![vec![None; chunks]; n];
        for c in 0..chunks {
            #[allow(clippy::needless_range_loop)] // `sender` is a rank, not just an index
            for sender in 0..n {
                let tag = Tag {
                    phase: Phase::AllGather,
                    step,
                    chunk: c,
                };
                let block = send_block(sender, step, n);
                let range = chunk_range(block_range(block, count), chunk, c);
                // Step 0 pushes the sender's input; later steps forward what just arrived.
                let src = if step == 0 && !spec.in_place {
                    let local = range.start - block * count..range.end - block * count;
                    region(p.buf(sender, BufKind::Input), local)
                } else {
                    region(p.buf(sender, BufKind::Output), range.clone())
                };
                let receiver = send_to(sender, n);
                let dst = region(p.buf(receiver, BufKind::Output), range);
                let after = ready[sender][c];
                let landed = p.transfer(sender, receiver, src, Landing::Final(dst), after, tag);
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
        let table = [[(0, 2), (1, 0), (2, 1)], [(2, 1), (0, 2), (1, 0)]];
        for (step, row) in table.iter().enumerate() {
            for (rank, &want) in row.iter().enumerate() {
                assert_eq!((send_block(rank, step, 3), recv_block(rank, step, 3)), want);
            }
        }
    }

    #[test]
    fn what_arrives_is_forwarded_and_every_block_arrives_once() {
        for n in 2..=16 {
            for r in 0..n {
                let mut got = vec![r];
                for s in 0..n - 1 {
                    if s + 1 < n - 1 {
                        assert_eq!(recv_block(r, s, n), send_block(r, s + 1, n));
                    }
                    got.push(recv_block(r, s, n));
                }
                got.sort_unstable();
                assert_eq!(got, (0..n).collect::<Vec<_>>());
            }
        }
    }
}
