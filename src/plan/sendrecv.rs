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
//!
//! # The one-shot form
//!
//! Every list that is not empty also has a one-shot form (`build_oneshot`, module
//! [`super::oneshot`]): each receiver *pulls* — one [`Op::PeerReduce`] per receive copies the
//! sender's send buffer, of the transfer's own count, straight into its receive buffer, all of a
//! rank's receives between one start and one end barrier; a rank that only sends joins the
//! barriers (its buffer is ready before the start one, no longer read after the end one), and so
//! does a rank party to no transfer. Every rank meets as often as the rank with the most
//! receives: the others pad their meetings with ones that move nothing, zero elements of a
//! buffer of their own — a transfer's, or, on a rank party to none, a [`BufKind::Scratch`] of no
//! elements. The plan's count is the longest transfer (it sizes the kernels' grid, the same on
//! every rank). On GPUs that is one kernel per rank, which the call gate can stop — what lets a
//! send/recv across processes return once enqueued.
//!
//! | transfer i | pulled by | from buffer (rank `from`) | into |
//! |------------|-----------|---------------------------|------|
//! | i          | `to`      | `SendBuf(i)`              | `to`'s `RecvBuf(i)` |

use super::oneshot::on_main;
use super::push::{chunk_for, region, Landing, Pusher};
use super::ring::chunk_range;
use super::{
    BufKind, BufferDecl, Collective, Op, Phase, Plan, Ranks, Region, RingSpec, StreamKind, Tag,
    Transfer,
};
use crate::error::{Error, Result};

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

/// The longest transfer of `transfers`, the count of the list's one-shot form; `None` for an
/// empty list, which has none.
pub fn oneshot_count(transfers: &[Transfer]) -> Option<usize> {
    transfers.iter().map(|t| t.count).max()
}

/// Compiles the one-shot form of a grouped send/recv of `transfers` over `world` ranks (module
/// doc): each receive a pull of the sender's send buffer, a rank's receives fused between one
/// pair of barriers, a rank that receives less padding its meetings with empty ones. An error
/// for an empty list, which has no one-shot form ([`oneshot_count`]).
pub(super) fn build_oneshot(world: usize, transfers: &[Transfer]) -> Result<Plan> {
    let Some(count) = oneshot_count(transfers) else {
        return Err(Error::InvalidArgument(
            "an empty send/recv has no one-shot form".into(),
        ));
    };
    let mut plan = Plan {
        collective: Collective::SendRecv {
            transfers: transfers.to_vec(),
        },
        world,
        count,
        in_place: false,
        average: false,
        buffers: Vec::new(),
        events: Vec::new(),
        ranks: vec![Vec::new(); world],
    };
    for (i, t) in transfers.iter().enumerate() {
        for (rank, kind) in [(t.from, BufKind::SendBuf(i)), (t.to, BufKind::RecvBuf(i))] {
            plan.buffers.push(BufferDecl {
                rank,
                kind,
                len: t.count,
            });
        }
    }
    // A rank party to no transfer pads its meetings on a buffer of no elements of its own.
    let party = |r: usize| transfers.iter().any(|t| t.from == r || t.to == r);
    for rank in (0..world).filter(|&r| count > 0 && !party(r)) {
        plan.buffers.push(BufferDecl {
            rank,
            kind: BufKind::Scratch,
            len: 0,
        });
    }
    // Zero elements: nothing to move, nobody meets.
    let receives = |rank: usize| transfers.iter().filter(|t| t.to == rank).count();
    let meetings = (0..world).map(receives).max().unwrap_or(0).max(1);
    for rank in (0..world).filter(|_| count > 0) {
        let buf = |kind| plan.buffer(rank, kind).expect("declared");
        let mut ops = Vec::new();
        for (i, t) in transfers.iter().enumerate().filter(|(_, t)| t.to == rank) {
            ops.push(Op::PeerReduce {
                dst: Region {
                    buf: buf(BufKind::RecvBuf(i)),
                    offset: 0,
                    count: t.count,
                },
                src: BufKind::SendBuf(i),
                offset: 0,
                count: t.count,
                ranks: Ranks::only(t.from),
                fused: !ops.is_empty(),
                push: Ranks::NONE,
            });
        }
        // Meetings that move nothing — zero elements of a buffer of the rank's own — until the
        // rank meets as often as every other.
        let own = transfers.iter().enumerate().find_map(|(i, t)| match () {
            _ if t.from == rank => Some(BufKind::SendBuf(i)),
            _ if t.to == rank => Some(BufKind::RecvBuf(i)),
            _ => None,
        });
        let own = own.unwrap_or(BufKind::Scratch);
        while ops.len() < meetings {
            ops.push(Op::PeerReduce {
                dst: Region {
                    buf: buf(own),
                    offset: 0,
                    count: 0,
                },
                src: own,
                offset: 0,
                count: 0,
                ranks: Ranks::only(rank),
                fused: !ops.is_empty(),
                push: Ranks::NONE,
            });
        }
        plan.ranks[rank] = on_main(ops);
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(from: usize, to: usize, count: usize) -> Transfer {
        Transfer { from, to, count }
    }

    #[test]
    fn the_one_shot_form_counts_the_longest_transfer() {
        assert_eq!(oneshot_count(&[t(0, 1, 5)]), Some(5));
        assert_eq!(oneshot_count(&[t(0, 1, 5), t(1, 0, 5)]), Some(5));
        assert_eq!(oneshot_count(&[t(0, 1, 5), t(1, 0, 6)]), Some(6));
        assert_eq!(oneshot_count(&[t(0, 1, 0), t(1, 0, 0)]), Some(0));
        assert_eq!(oneshot_count(&[]), None);
        assert!(build_oneshot(2, &[]).is_err());
    }

    #[test]
    fn a_rank_party_to_no_transfer_meets_as_often_as_the_others_on_nothing_of_its_own() {
        // Rank 1 of four receives two transfers; ranks 2 and 3 take no part.
        let plan = build_oneshot(4, &[t(0, 1, 6), t(0, 1, 3)]).unwrap();
        for rank in [2, 3] {
            let scratch = plan.buffer(rank, BufKind::Scratch).expect("declared");
            assert_eq!(plan.decl(scratch).len, 0);
            assert_eq!(plan.ranks[rank].len(), 2, "rank {rank} meets twice");
        }
        assert!(plan.buffer(0, BufKind::Scratch).is_none());
        crate::check::check(&plan).unwrap();
    }

    #[test]
    fn one_shot_send_recv_plans_pass_the_checker() {
        // Mixed counts, and ranks receiving different numbers of transfers (rank 2 of the
        // fourth list receives three, rank 0 none): every rank meets three times.
        let lists: [&[Transfer]; 9] = [
            &[t(0, 1, 7)],
            &[t(1, 0, 7), t(0, 1, 7)],
            &[t(0, 1, 3), t(1, 2, 3), t(2, 0, 3)],
            &[t(0, 2, 5), t(1, 2, 9), t(0, 2, 0), t(2, 1, 2)],
            &[t(0, 0, 4), t(0, 1, 4)],
            &[t(0, 1, 0), t(1, 0, 0)],
            &[t(1, 0, 3), t(0, 1, 11), t(0, 1, 1)],
            &[t(2, 0, 5)],
            &[t(0, 3, 2), t(3, 0, 4), t(0, 3, 1)],
        ];
        // Over the ranks the list names, and one more that takes no part (as do ranks 1 and 2
        // of the eighth list, 1 and 2 of the ninth).
        for (transfers, more) in lists.into_iter().flat_map(|l| [(l, 1), (l, 2)]) {
            let world = more + transfers.iter().map(|t| t.from.max(t.to)).max().unwrap();
            let plan = build_oneshot(world, transfers).unwrap();
            crate::check::check(&plan)
                .unwrap_or_else(|e| panic!("{transfers:?} over {world}: {e}"));
        }
    }

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
