//! Grouped point-to-point: a list of transfers, each `count` elements from a send buffer on rank
//! `from` into a receive buffer on rank `to`, compiled into one plan, so that a pipeline's
//! exchange (every rank sends to its successor and receives from its predecessor) runs as one
//! call and cannot deadlock on the order in which ranks would otherwise post sends and receives.
//!
//! Transfer i is pushed chunk by chunk on `from`'s Send stream straight into `to`'s receive
//! buffer (peer; staged through `from`'s host slots where the GPUs do not all reach each other);
//! a transfer to oneself is a local copy on Main. Nothing waits on anything but the receiver's
//! Entry (a push never writes memory the receiver's previous call may still use) and, staged,
//! the host slot's credit, so no order of the list can deadlock.
//!
//! ```text
//!   a pipeline of 3:  transfers (0 → 1), (1 → 2), (2 → 0)
//!   rank 0 ──send 0──▶ rank 1 ──send 1──▶ rank 2 ──send 2──▶ rank 0   (all at once)
//! ```
//!
//! | transfer i | pushed by | from buffer   | into rank | buffer        |
//! |------------|-----------|---------------|-----------|---------------|
//! | i          | `from`    | `SendBuf(i)`  | `to`      | `RecvBuf(i)`  |
//!
//! Invariant: each receive buffer is written by exactly one transfer, each send buffer only read.
//! [`chunks_of`] is the chunk count; a unit test checks it.

use super::push::{chunk_for, region, Landing, Pusher};
use super::ring::chunk_range;
use super::{BufKind, BufferDecl, Collective, Phase, Plan, RingSpec, StreamKind, Tag, Transfer};
use crate::error::Result;

/// Chunks a transfer of `count` elements is cut into.
pub fn chunks_of(count: usize, chunk: usize) -> usize {
    count.div_ceil(chunk)
}

/// Compiles a grouped send/recv of `transfers` (`spec.count` is not used).
pub(super) fn build(spec: &RingSpec, transfers: &[Transfer]) -> Result<Plan> {
    spec.check_common()?;
    let mut plan = Pusher::empty_plan(
        spec,
        Collective::SendRecv {
            transfers: transfers.to_vec(),
        },
    );
    plan.count = 0;
    for (i, t) in transfers.iter().enumerate() {
        plan.buffers.push(BufferDecl {
            rank: t.from,
            kind: BufKind::SendBuf(i),
            len: t.count,
        });
        plan.buffers.push(BufferDecl {
            rank: t.to,
            kind: BufKind::RecvBuf(i),
            len: t.count,
        });
    }
    let longest = transfers.iter().map(|t| t.count).max().unwrap_or(0);
    let chunk = chunk_for(spec, longest)?;
    let mut p = Pusher::new(spec, chunk, plan, &[], true);
    p.record_entries();
    for (i, t) in transfers.iter().enumerate() {
        let send = p.buf(t.from, BufKind::SendBuf(i));
        let recv = p.buf(t.to, BufKind::RecvBuf(i));
        for c in 0..chunks_of(t.count, chunk) {
            let range = chunk_range(0..t.count, chunk, c);
            let (src, dst) = (region(send, range.clone()), region(recv, range));
            let tag = Tag {
                phase: Phase::SendRecv,
                step: i,
                chunk: c,
            };
            if t.from == t.to {
                p.local_copy(t.from, StreamKind::Main, src, dst, None, tag);
            } else {
                p.transfer(t.from, t.to, src, Landing::Final(dst), None, tag);
            }
        }
    }
    Ok(p.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_a_transfer() {
        assert_eq!(chunks_of(0, 4), 0);
        assert_eq!(chunks_of(1, 4), 1);
        assert_eq!(chunks_of(8, 4), 2);
        assert_eq!(chunks_of(9, 4), 3);
        for count in 0..50 {
            for chunk in 1..9 {
                let covered: usize = (0..chunks_of(count, chunk))
                    .map(|c| chunk_range(0..count, chunk, c).len())
                    .sum();
                assert_eq!(covered, count);
            }
        }
    }
}
