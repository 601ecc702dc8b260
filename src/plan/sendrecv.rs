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
//! every rank). A list of empty transfers alone keeps its one meeting, of zero elements on every
//! rank: NCCL's 0-byte send/recv synchronises the ranks on the GPUs (all-to-all lists with empty
//! pairs make them). On GPUs that is one kernel per rank, which the call gate can stop — what
//! lets a send/recv across processes return once enqueued.
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

/// The transfers of a send/recv folded into one word (FNV-1a over their numbers): equal lists
/// fold alike, and ranks compare the word to find that they name the same list.
pub fn folded(transfers: &[Transfer]) -> u64 {
    transfers.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, t| {
        [t.from, t.to, t.count].iter().fold(h, |h, &x| {
            (h ^ x as u64).wrapping_mul(0x0000_0100_0000_01b3)
        })
    })
}

/// Elements `first..first + count` of transfer `transfer` of a list: a part of it that runs
/// as a transfer of its own ([`runs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    /// The transfer's index in its list.
    pub transfer: usize,
    /// The part's first element of the transfer's buffers.
    pub first: usize,
    /// Elements of the part.
    pub count: usize,
}

/// Elements a send of `count` to another rank counts against a run's limit in [`runs`]: whole
/// blocks of 4096, one at least.
fn blocks(count: usize) -> usize {
    count.max(1).div_ceil(4096) * 4096
}

/// Whether [`runs`] surely leaves `transfers` one run, found without cutting it: no more
/// transfers than a rank may receive, and every send to another rank together within `most`.
pub fn one_run(transfers: &[Transfer], most: usize, receives: usize) -> bool {
    let across = transfers.iter().filter(|t| t.from != t.to);
    transfers.len() <= receives && across.map(|t| blocks(t.count)).sum::<usize>() <= most
}

/// A send/recv of `transfers` cut into runs, each a list of its own that fits where one rank
/// receives at most `receives` transfers and sends at most `most` elements to other ranks
/// (`most` a positive multiple of 4096; each send counted in whole blocks of 4096, one block at
/// least): in list order, a transfer to another rank longer than `most` cut into parts of
/// `most` (so every part but a transfer's last is a whole number of blocks long), a new run begun
/// where the next part would not fit the current one. One run: the whole list fits.
///
/// Invariant: every element of every transfer lies in exactly one part, parts of one transfer
/// in order, and every pair's parts in the list's order — what keeps NCCL's per-pair order when
/// the runs run one after another.
pub fn runs(transfers: &[Transfer], most: usize, receives: usize) -> Vec<Vec<Part>> {
    assert!(
        most > 0 && most % 4096 == 0 && receives > 0,
        "a run holds something"
    );
    let world = transfers
        .iter()
        .map(|t| t.from.max(t.to) + 1)
        .max()
        .unwrap_or(0);
    let (mut runs, mut run) = (Vec::new(), Vec::new());
    let (mut sent, mut received) = (vec![0usize; world], vec![0usize; world]);
    for (i, t) in transfers.iter().enumerate() {
        let across = t.from != t.to;
        let cut = if across { most } else { t.count.max(1) };
        let parts = t.count.div_ceil(cut).max(1);
        for k in 0..parts {
            let first = k * cut;
            let count = cut.min(t.count - first);
            let blocks = if across { blocks(count) } else { 0 };
            if !run.is_empty() && (received[t.to] == receives || sent[t.from] + blocks > most) {
                runs.push(std::mem::take(&mut run));
                sent.fill(0);
                received.fill(0);
            }
            run.push(Part {
                transfer: i,
                first,
                count,
            });
            sent[t.from] += blocks;
            received[t.to] += 1;
        }
    }
    if !run.is_empty() {
        runs.push(run);
    }
    runs
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
    for rank in (0..world).filter(|&r| !party(r)) {
        plan.buffers.push(BufferDecl {
            rank,
            kind: BufKind::Scratch,
            len: 0,
        });
    }
    // Transfers of zero elements alone still meet, once: NCCL's 0-byte send/recv synchronises
    // its ranks on the GPUs.
    let receives = |rank: usize| transfers.iter().filter(|t| t.to == rank).count();
    let meetings = (0..world).map(receives).max().unwrap_or(0).max(1);
    for rank in 0..world {
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
    fn empty_transfers_alone_meet_once_on_every_rank() {
        // NCCL's 0-byte send/recv: rank 2 of three takes no part, and meets too.
        let plan = build_oneshot(3, &[t(0, 1, 0), t(1, 0, 0)]).unwrap();
        assert_eq!(plan.count, 0);
        for rank in 0..3 {
            let meetings: Vec<_> = plan.ranks[rank]
                .iter()
                .filter_map(|i| match i.op {
                    Op::PeerReduce { count, dst, .. } => Some((count, dst.count)),
                    _ => None,
                })
                .collect();
            assert_eq!(meetings, [(0, 0)], "rank {rank}");
        }
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

    /// Every element of every transfer in exactly one part, each pair's parts in list order,
    /// and every run within its limits — for lists of long, short, empty and self transfers.
    #[test]
    fn runs_cover_every_transfer_in_order_within_their_limits() {
        let most = 4 * 4096;
        let lists: [&[Transfer]; 6] = [
            &[t(0, 1, 5)],
            &[t(0, 1, 3 * most + 7), t(1, 0, most)],
            &[t(0, 1, most - 1), t(0, 1, 2)],
            &[t(0, 0, 9 * most), t(1, 0, 0), t(1, 0, 0), t(1, 0, 1)],
            &[t(2, 0, most + 1), t(1, 2, 4096), t(0, 1, 4097), t(2, 0, 3)],
            &[],
        ];
        for transfers in lists {
            for receives in [1, 2, 8] {
                let runs = runs(transfers, most, receives);
                let at = format!("{transfers:?}, {receives} receives");
                let mut covered: Vec<Vec<u32>> =
                    transfers.iter().map(|t| vec![0; t.count]).collect();
                let mut last = vec![None; transfers.len()];
                let mut order = Vec::new();
                for run in &runs {
                    assert!(!run.is_empty(), "{at}");
                    let world = 4;
                    let (mut sent, mut received) = (vec![0; world], vec![0; world]);
                    for p in run {
                        let tr = transfers[p.transfer];
                        for e in &mut covered[p.transfer][p.first..p.first + p.count] {
                            *e += 1;
                        }
                        assert!(last[p.transfer] < Some(p.first), "{at}: parts in order");
                        last[p.transfer] = Some(p.first);
                        order.push((tr.from, tr.to, p.transfer, p.first));
                        received[tr.to] += 1;
                        if tr.from != tr.to {
                            sent[tr.from] += p.count.max(1).div_ceil(4096) * 4096;
                        }
                    }
                    assert!(received.iter().all(|&r| r <= receives), "{at}");
                    assert!(sent.iter().all(|&s| s <= most), "{at}: {sent:?}");
                }
                assert!(covered.iter().flatten().all(|&n| n == 1), "{at}");
                let parted = |i: usize| runs.iter().flatten().any(|p| p.transfer == i);
                assert!(
                    (0..transfers.len()).all(parted),
                    "{at}: every transfer, empty too"
                );
                // Each pair's parts in list order, across runs too.
                let mut pairs = order;
                pairs.sort_by_key(|&(from, to, ..)| (from, to));
                for w in pairs
                    .windows(2)
                    .filter(|w| (w[0].0, w[0].1) == (w[1].0, w[1].1))
                {
                    assert!((w[0].2, w[0].3) < (w[1].2, w[1].3), "{at}");
                }
            }
        }
        // As few runs as fit: one where the whole list does, a new one per long transfer's
        // part, and one per `receives` receives.
        assert_eq!(runs(&[t(0, 1, most), t(1, 0, most)], most, 8).len(), 1);
        assert_eq!(runs(&[t(0, 1, 3 * most + 7)], most, 8).len(), 4);
        let nine: Vec<_> = (0..9).map(|_| t(0, 1, 1)).collect();
        assert_eq!(runs(&nine, 16 * 4096, 8).len(), 2);
        assert_eq!(
            runs(&nine, most, 8).len(),
            3,
            "four sends of a block each a run"
        );
        assert_eq!(runs(&[t(0, 0, 9 * most)], most, 8).len(), 1);
        // The cheap test agrees where it says one run.
        for list in [&[t(0, 1, most), t(1, 1, 9 * most)][..], &nine[..8], &nine] {
            if one_run(list, 16 * 4096, 8) {
                assert_eq!(runs(list, 16 * 4096, 8).len(), 1, "{list:?}");
            }
        }
        assert!(one_run(&nine[..8], 16 * 4096, 8) && !one_run(&nine, 16 * 4096, 8));
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
