//! A call too large for the arenas, across processes, run as pieces that fit them — each a call
//! of the same collective on a run of the caller's elements: an all-reduce's, broadcast's or
//! reduce's buffers moved on by the piece's first element; a reduce-scatter's, all-gather's or
//! all-to-all's blocks too, each block's run lying in the caller's buffer `piece_of` elements
//! (the whole call's count) after the one before, copied into the arena and back block by block
//! (`segments`). A send/recv's pieces are runs of its transfers (`plan::sendrecv::runs`), a
//! long transfer cut into parts, each run small enough for the arenas and receiving no more
//! transfers a rank than the steps kernel runs; they run one after another, which keeps every
//! pair's order. Each piece a call of its own, prepared by each rank alone and checked by the
//! GPUs' call gate like any gated call — so a large call also returns once enqueued, whatever
//! the peers' hosts are doing, instead of meeting them to allocate and exchange buffers of its
//! size.
//!
//! ```text
//!   an in-place all-reduce of 40 M f32 (160 MiB; an arena holds 64 MiB a rank)
//!   piece 0: elements [0, 16 M)   piece 1: [16 M, 32 M)   piece 2: [32 M, 40 M)
//!   each: staged into the arena, reduced by the two-shot, copied back — one kernel a rank
//!
//!   a reduce-scatter of 8 M f32 a rank on 3 ranks (input 96 MiB), pieces of 4 M:
//!   piece 0 stages input elements [0, 4 M) of each of the 3 blocks, writes output [0, 4 M)
//!   piece 1 stages input elements [4 M, 8 M) of each block,         writes output [4 M, 8 M)
//!
//!   a pipeline's send of 100 MiB from rank 0 to 1, then one of 8 MiB from 1 to 2 (f32):
//!   piece 0: 0 → 1 elements [0, 16 M)   piece 1: 0 → 1 [16 M, 25 M) and 1 → 2 [0, 2 M)
//! ```
//!
//! Every piece's shape carries the whole call (`Shape::piece_of`, published with the call: its
//! count, a send/recv's transfers folded), so ranks whose whole calls differ are named at the
//! first piece, before any piece touches a peer's memory or a caller's buffer.
//!
//! Invariant: the split depends only on what every rank has alike — the shape, the world, the
//! communicator's selection and arenas, and whether the call runs on symmetric registrations
//! (which ranks deciding differently make a named mismatch of) — so every rank cuts a call into
//! the same pieces.

use super::callers::CallMode;
use super::peer_words::ARENA_BYTES;
use super::CudaExecutor;
use crate::element::Element;
use crate::error::Result;
use crate::exec::algorithm::Form;
use crate::exec::cuda::kernels::PEER_MAX_RANKS;
use crate::exec::Shape;
use crate::plan::sendrecv::{self, Part};
use crate::plan::{Collective, Transfer};
use std::time::Instant;

/// How many buffers of the call's count a rank places in its arena for a call of `shape` on
/// `world` ranks, where its collective runs in pieces: whole, those a peer touches
/// (`rank::Staged::for_plan`: an all-reduce's input and output out of place, else its one
/// buffer; a broadcast's or reduce's one; a reduce-scatter's input of `world` blocks, an
/// all-gather's input, an all-to-all's input; in place the one buffer); as a piece of blocks
/// (`piece`), every caller's buffer, which its copies reach block by block (`segments`).
/// `None`: the call does not run in pieces (an in-place all-to-all, send/recv).
fn staged_buffers(shape: &Shape, world: usize, piece: bool) -> Option<usize> {
    let blocks = shape.collective.blocked();
    Some(match shape.collective {
        Collective::AllReduce if !shape.in_place => 2,
        Collective::AllReduce | Collective::Broadcast { .. } | Collective::Reduce { .. } => 1,
        Collective::AllToAll if shape.in_place => return None,
        _ if shape.in_place && blocks => world,
        Collective::ReduceScatter | Collective::AllGather if piece => world + 1,
        Collective::ReduceScatter => world,
        Collective::AllGather => 1,
        Collective::AllToAll if piece => 2 * world,
        Collective::AllToAll => world,
        Collective::SendRecv { .. } => return None,
    })
}

/// Whether a piece of `shape` finds its blocks `piece_of` elements apart in the caller's
/// buffers (a piece of a reduce-scatter, all-gather or all-to-all): its plan stages every
/// caller's buffer (`rank::Staged::for_plan`), copied block by block (`segments`).
pub(super) fn strided(shape: &Shape) -> bool {
    shape.piece_of > 0 && shape.collective.blocked()
}

/// Where a buffer of `len` elements of a call of `shape` on `world` ranks lies in the caller's
/// buffer: (byte offset in the staged copy, byte offset in the caller's buffer, bytes) — one
/// run, or, of a strided piece's buffer of `world` blocks, a run a block, the caller's
/// `piece_of` elements apart.
pub(super) fn segments(
    shape: &Shape,
    world: usize,
    len: usize,
) -> impl Iterator<Item = (u64, u64, usize)> {
    let blocks = match strided(shape) && len == world * shape.count {
        true => world,
        false => 1,
    };
    let (eb, block) = (shape.elem_bytes, len / blocks);
    let apart = shape.piece_of.max(block);
    (0..blocks).map(move |b| ((b * block * eb) as u64, (b * apart * eb) as u64, block * eb))
}

/// The most elements of `elem_bytes` bytes a piece holds, `staged` buffers of it in an arena of
/// `arena_bytes`, in whole blocks of 4096 elements (so that every piece but the last keeps the
/// 16-byte alignment of the caller's buffers, and the plan's 64-element layout fits).
pub(super) fn piece_elems(arena_bytes: usize, elem_bytes: usize, staged: usize) -> usize {
    (arena_bytes / elem_bytes / staged) / 4096 * 4096
}

/// Whether a piece of [`piece_elems`] elements run in `form` fits the arena: a kernel the gate
/// checks, whose staged and exposed buffers are no more than [`staged_buffers`] (the two-shot
/// stages the caller's buffers; the read one-shot its input out of place, an exposed copy in
/// place; the steps kernel the buffer the peers read; the staged one-shot its host copy).
fn piece_fits(form: Form) -> bool {
    form.is_peer_kernel()
}

/// Elements a piece of a call of `count` elements holds where a piece holds at most `most` (a
/// multiple of 4096): the call cut into as few pieces as fit, of about one size (whole blocks of
/// 4096 elements, the last the rest, which is less than a block per piece shorter) — so that a
/// call of a few pieces leaves no small remainder to run another form.
pub(super) fn balanced(count: usize, most: usize) -> usize {
    let n = count.div_ceil(most).max(1);
    count.div_ceil(n).div_ceil(4096) * 4096
}

/// The pieces of a call of `count` elements, `piece` elements each but the last: (first
/// element, elements).
pub(super) fn pieces(count: usize, piece: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..count.div_ceil(piece)).map(move |i| (i * piece, piece.min(count - i * piece)))
}

/// The caller's buffers of a piece whose first element is `first` (elements of `elem_bytes`
/// bytes): each address moved on by it, absent ones (0) left absent. A strided piece's blocks
/// lie on from there, `piece_of` elements apart (`segments`).
fn moved(list: &[u64], first: usize, elem_bytes: usize) -> Vec<u64> {
    list.iter()
        .map(|&a| moved_one(a, first, elem_bytes))
        .collect()
}

/// One address of [`moved`].
fn moved_one(address: u64, first: usize, elem_bytes: usize) -> u64 {
    match address {
        0 => 0,
        a => a + (first * elem_bytes) as u64,
    }
}

/// Elements a piece of a call of `shape` on `world` ranks holds, where its collective has pieces
/// (`staged_buffers`) and the call is too large for the arena whole; `None`: it is not.
fn arena_piece(shape: &Shape, world: usize) -> Option<usize> {
    let eb = shape.elem_bytes;
    let whole = piece_elems(ARENA_BYTES, eb, staged_buffers(shape, world, false)?);
    let blocks = shape.collective.blocked();
    let most = piece_elems(ARENA_BYTES, eb, staged_buffers(shape, world, blocks)?);
    (shape.count > whole && most > 0).then(|| balanced(shape.count, most))
}

/// One piece of a call: its shape, and the caller's buffers it runs on as the executor takes
/// them (`exec::caller_address`).
pub(super) struct Piece {
    pub(super) shape: Shape,
    pub(super) inputs: Vec<u64>,
    pub(super) outputs: Vec<u64>,
}

/// The pieces of a send/recv of `shape` whose one-shot form does not fit an arena whole (or
/// whose ranks receive more transfers than the steps kernel runs), cut by
/// `plan::sendrecv::runs`: each a send/recv of the parts of one run, on the caller's buffers
/// moved on to each part's first element, carrying the whole list folded (`Shape::piece_of`);
/// a run of empty transfers alone moves nothing and is left out. `None`: one run, the whole
/// list.
fn send_recv_pieces(
    shape: &Shape,
    transfers: &[Transfer],
    inputs: &[u64],
    outputs: &[u64],
) -> Option<Vec<Piece>> {
    let eb = shape.elem_bytes;
    let most = piece_elems(ARENA_BYTES, eb, 1);
    // (A short list whose sends all fit at once is one run: no need to cut it.)
    if sendrecv::one_run(transfers, most, PEER_MAX_RANKS) {
        return None;
    }
    let mut runs = sendrecv::runs(transfers, most, PEER_MAX_RANKS);
    if runs.len() < 2 {
        return None;
    }
    // A run that moves nothing (empty transfers alone) has nothing to run.
    runs.retain(|run| run.iter().any(|p| p.count > 0));
    let whole = sendrecv::folded(transfers) as usize;
    let at =
        |list: &[u64], p: &Part| moved_one(list.get(p.transfer).copied().unwrap_or(0), p.first, eb);
    let piece = |run: &Vec<Part>| Piece {
        shape: Shape {
            collective: Collective::SendRecv {
                transfers: run
                    .iter()
                    .map(|p| Transfer {
                        count: p.count,
                        ..transfers[p.transfer]
                    })
                    .collect(),
            },
            piece_of: whole,
            ..shape.clone()
        },
        inputs: run.iter().map(|p| at(inputs, p)).collect(),
        outputs: run.iter().map(|p| at(outputs, p)).collect(),
    };
    Some(runs.iter().map(piece).collect())
}

impl CudaExecutor {
    /// The pieces this call runs as, where it runs in pieces (module doc): across processes
    /// whose ranks all made arenas, on buffers it would stage (not on symmetric
    /// registrations), a call too large for the arena whole — a collective that has pieces
    /// (`staged_buffers`) cut into runs of its elements, a send/recv into runs of its
    /// transfers (`send_recv_pieces`) — each piece of a form the gate checks whose plan fits
    /// the arena (`piece_fits`). `None`: it runs whole.
    pub(super) fn pieces_of(
        &self,
        shape: &Shape,
        inputs: &[u64],
        outputs: &[u64],
    ) -> Option<Vec<Piece>> {
        if !self.first_calls_alone() {
            return None;
        }
        let all: Vec<Piece> = match &shape.collective {
            Collective::SendRecv { transfers } => {
                send_recv_pieces(shape, transfers, inputs, outputs)?
            }
            _ => {
                let piece = arena_piece(shape, self.world)?;
                let eb = shape.elem_bytes;
                pieces(shape.count, piece)
                    .map(|(first, count)| Piece {
                        shape: Shape {
                            count,
                            piece_of: shape.count,
                            ..shape.clone()
                        },
                        inputs: moved(inputs, first, eb),
                        outputs: moved(outputs, first, eb),
                    })
                    .collect()
            }
        };
        let fit = |p: &Piece| piece_fits(self.selection(&p.shape).form);
        (all.iter().all(fit) && !self.runs_symmetric(shape, inputs, outputs)).then_some(all)
    }

    /// Runs a call as its pieces `all` (module doc), each through [`CudaExecutor::run_one`],
    /// stopping at the first that fails — after the pieces enqueued before it have settled (as
    /// a failed call's own ranks are waited for, module `launch`), so that nothing touches the
    /// caller's buffers once the call has returned its error (a peer that gave the call up
    /// because an earlier piece differs names that mismatch: `Job::named_mismatch`);
    /// [`crate::Ran::pieces`] says how many ran.
    ///
    /// # Safety
    /// As for [`CudaExecutor::run`]: the pieces are parts of the caller's buffers.
    pub(super) unsafe fn run_in_pieces<T: Element>(
        &mut self,
        all: Vec<Piece>,
        mode: CallMode<'_>,
    ) -> Result<()> {
        let mut ran = 0;
        for part in all {
            // SAFETY: each piece's buffers lie within the caller's (same addresses, offset by the
            // piece's first element, its count within the whole's): our caller's contract.
            let result =
                unsafe { self.run_one::<T>(part.shape, &part.inputs, &part.outputs, mode) };
            if let Err(err) = result {
                // (A capture's pieces have not run: nothing to wait for.)
                let captured = mode.caller.map_or(Ok(false), |streams| streams.capturing());
                if ran > 0 && !captured.unwrap_or(true) {
                    self.settle_streams(Instant::now() + self.config.timeout);
                }
                return Err(err);
            }
            ran += 1;
            if let Some(last) = &mut self.last_ran {
                last.pieces = ran;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element::ReduceOp;
    use crate::exec::cuda::executor::rank::Staged;
    use crate::plan::arena::arena_layout;
    use crate::plan::{Gather, Memory, OneShotSpec, TwoShotSpec};

    #[test]
    fn pieces_tile_the_call() {
        let all: Vec<_> = pieces(10, 4).collect();
        assert_eq!(all, [(0, 4), (4, 4), (8, 2)]);
        assert_eq!(pieces(8, 4).count(), 2);
        assert_eq!(pieces(0, 4).count(), 0);
        // As few pieces as fit, of about one size.
        let most = 4 * 4096;
        for count in [
            most + 1,
            2 * most,
            2 * most + 1,
            5 * most - 3,
            40 * most + 77,
        ] {
            let piece = balanced(count, most);
            let all: Vec<_> = pieces(count, piece).collect();
            assert!(piece <= most && piece % 4096 == 0, "{count}");
            assert_eq!(all.len(), count.div_ceil(most), "{count}");
            let last = all.last().unwrap().1;
            assert!(last + 4096 * all.len() > piece, "{count}: {all:?}");
        }
    }

    /// A piece's plan fits the arena with the caller's buffers staged, for every element size,
    /// world and placement: the two-shot's (what a gated all-reduce of a piece's size runs) and
    /// the read one-shot's (`piece_fits`).
    #[test]
    fn a_piece_of_the_two_shot_fits_the_arena() {
        let fits_in = |plan: &crate::plan::Plan, elem_bytes: usize, memory: Memory| {
            let staged = Staged::for_plan(plan, true);
            arena_layout(plan, |k| staged.owns(k), ARENA_BYTES / elem_bytes, memory).is_some()
        };
        let fits =
            |plan: &crate::plan::Plan, elem_bytes: usize| fits_in(plan, elem_bytes, Memory::Device);
        for elem_bytes in [1, 2, 4, 8] {
            for in_place in [true, false] {
                let staged = if in_place { 1 } else { 2 };
                let count = piece_elems(ARENA_BYTES, elem_bytes, staged);
                assert_eq!(count % 4096, 0);
                for world in 2..=8 {
                    let at = format!("{elem_bytes} B, in place {in_place}, {world} ranks");
                    let op = ReduceOp::Sum;
                    let oneshot = OneShotSpec {
                        world,
                        count,
                        in_place,
                        op,
                    };
                    assert!(fits(&oneshot.build().unwrap(), elem_bytes), "one-shot {at}");
                    // The staged one-shot's (over staged reach), in host arenas only.
                    let staged = oneshot.build_staged().unwrap();
                    assert!(fits_in(&staged, elem_bytes, Memory::Host), "staged {at}");
                    assert!(!fits(&staged, elem_bytes), "staged {at}");
                    // A broadcast's and a reduce's pieces hold as many as an in-place
                    // all-reduce's.
                    let one = OneShotSpec {
                        count: piece_elems(ARENA_BYTES, elem_bytes, 1),
                        ..oneshot
                    };
                    for c in [
                        Collective::Broadcast { root: 1 },
                        Collective::Reduce { root: 1 },
                    ] {
                        let plan = one.build_collective(&c).unwrap();
                        assert!(fits(&plan, elem_bytes), "{c:?} {at}");
                    }
                    let twoshot = |count| TwoShotSpec {
                        world,
                        count,
                        in_place,
                        op,
                        align: (16 / elem_bytes).max(1),
                        gather: Gather::Pull,
                    };
                    assert!(fits(&twoshot(count).build().unwrap(), elem_bytes), "{at}");
                    // ... and a piece a block larger would not: the piece is as large as fits.
                    let larger = twoshot(count + 4096).build().unwrap();
                    assert!(!fits(&larger, elem_bytes), "{at}");
                }
            }
        }
    }

    /// A shape of `collective` on elements of `elem_bytes`, whole.
    fn shape_of(collective: Collective, in_place: bool, elem_bytes: usize) -> Shape {
        Shape {
            collective,
            count: 0,
            in_place,
            average: false,
            elem_bytes,
            registered: false,
            piece_of: 0,
        }
    }

    /// A reduce-scatter's, all-gather's or all-to-all's call fits the arena whole up to the
    /// count `staged_buffers` gives (the buffers a peer touches staged), and a strided piece up
    /// to its count (every caller's buffer staged) — and a block more would not fit: the
    /// counts are as large as fit, for every element size, world and placement.
    #[test]
    fn block_collectives_fit_the_arena_whole_or_as_pieces_up_to_their_counts() {
        for elem_bytes in [1, 2, 4, 8] {
            for world in 2..=8 {
                for in_place in [false, true] {
                    for c in [
                        Collective::ReduceScatter,
                        Collective::AllGather,
                        Collective::AllToAll,
                    ] {
                        let shape = shape_of(c.clone(), in_place, elem_bytes);
                        for piece in [false, true] {
                            let Some(n) = staged_buffers(&shape, world, piece) else {
                                assert!(in_place && c == Collective::AllToAll);
                                continue;
                            };
                            let fits = |count: usize| {
                                let spec = OneShotSpec {
                                    world,
                                    count,
                                    in_place,
                                    op: ReduceOp::Sum,
                                };
                                let plan = spec.build_collective(&c).unwrap();
                                let staged = Staged::for_plan(&plan, !piece);
                                let capacity = ARENA_BYTES / elem_bytes;
                                arena_layout(&plan, |k| staged.owns(k), capacity, Memory::Device)
                                    .is_some()
                            };
                            let count = piece_elems(ARENA_BYTES, elem_bytes, n);
                            let at = format!("{c:?}, {elem_bytes} B, in place {in_place}, {world} ranks, piece {piece}");
                            assert!(fits(count), "{at}");
                            assert!(!fits(count + 4096), "{at}");
                        }
                    }
                }
            }
        }
    }

    /// A send/recv's pieces each fit the arena with the buffers a peer reads staged, for every
    /// element size — a long pipeline send, a fan-in of more transfers than the steps kernel
    /// runs, a rank taking no part — and run on the caller's buffers moved on to each part,
    /// absent ones left absent; a list that fits whole has no pieces.
    #[test]
    fn a_send_recvs_pieces_fit_the_arena_on_the_callers_buffers_moved_on() {
        let t = |from, to, count| Transfer { from, to, count };
        for eb in [1, 2, 4, 8] {
            let most = piece_elems(ARENA_BYTES, eb, 1);
            let lists = [
                vec![t(0, 1, 2 * most + 5), t(1, 2, most / 2), t(2, 0, 7)],
                (1..=9).map(|from| t(from % 3, 3, most / 8)).collect(),
                vec![t(0, 2, most + 1), t(0, 0, 3 * most)],
                // An empty transfer alone in a run: left out.
                vec![t(0, 1, most), t(0, 1, 0), t(1, 0, 5)],
            ];
            for transfers in lists {
                let shape = Shape {
                    count: 0,
                    ..shape_of(
                        Collective::SendRecv {
                            transfers: transfers.clone(),
                        },
                        false,
                        eb,
                    )
                };
                let world = 4;
                // Rank 0's buffers: its sends' at 1 GiB + 1 MiB·i, its receives' at 2 GiB +
                // 1 MiB·i, the others' absent.
                let rank_0s = |base: u64, whose: fn(&Transfer) -> usize| -> Vec<u64> {
                    (transfers.iter().enumerate())
                        .map(|(i, x)| match whose(x) {
                            0 => base + (i << 20) as u64,
                            _ => 0,
                        })
                        .collect()
                };
                let inputs = rank_0s(1 << 30, |x| x.from);
                let outputs = rank_0s(2 << 30, |x| x.to);
                let all = send_recv_pieces(&shape, &transfers, &inputs, &outputs).unwrap();
                let mut runs = sendrecv::runs(&transfers, most, PEER_MAX_RANKS);
                runs.retain(|run| run.iter().any(|p| p.count > 0));
                assert_eq!(all.len(), runs.len());
                let moved_on = |a: u64, p: &Part| match a {
                    0 => 0,
                    a => a + (p.first * eb) as u64,
                };
                for (piece, run) in all.iter().zip(&runs) {
                    assert_eq!(piece.shape.piece_of, sendrecv::folded(&transfers) as usize);
                    for (k, p) in run.iter().enumerate() {
                        assert_eq!(piece.inputs[k], moved_on(inputs[p.transfer], p));
                        assert_eq!(piece.outputs[k], moved_on(outputs[p.transfer], p));
                    }
                    let spec = OneShotSpec {
                        world,
                        count: 0,
                        in_place: false,
                        op: ReduceOp::Sum,
                    };
                    let plan = spec.build_collective(&piece.shape.collective).unwrap();
                    let staged = Staged::for_plan(&plan, true);
                    let capacity = ARENA_BYTES / eb;
                    let at = format!("{eb} B: {:?}", piece.shape.collective);
                    assert!(
                        arena_layout(&plan, |k| staged.owns(k), capacity, Memory::Device).is_some(),
                        "{at}"
                    );
                }
            }
            let fits = vec![t(0, 1, most), t(1, 0, most), t(2, 2, 5 * most)];
            let shape = shape_of(
                Collective::SendRecv {
                    transfers: fits.clone(),
                },
                false,
                eb,
            );
            assert!(send_recv_pieces(&shape, &fits, &[0; 3], &[0; 3]).is_none());
        }
        // A run of an empty transfer alone is left out: the call is one piece, not the whole
        // list (which does not fit).
        let shape = shape_of(Collective::SendRecv { transfers: vec![] }, false, 4);
        let list = [t(0, 1, ARENA_BYTES / 4), t(0, 1, 0)];
        let all = send_recv_pieces(&shape, &list, &[0; 2], &[0; 2]).unwrap();
        let kept: Vec<_> = all.iter().map(|p| p.shape.collective.clone()).collect();
        assert_eq!(
            kept,
            [Collective::SendRecv {
                transfers: vec![list[0]]
            }]
        );
    }

    /// A strided piece's copies, from the caller's buffers moved on to the piece
    /// (`moved`), reach block `b`'s elements `[first, first + count)` at the staged copy's
    /// block `b`, every element of the caller's buffer in exactly one piece; a buffer of one
    /// block (a reduce-scatter's output) is one run.
    #[test]
    fn a_strided_pieces_copies_reach_each_blocks_elements_once() {
        let (eb, base) = (4, 1u64 << 20);
        for world in [2, 3, 5] {
            for (whole, piece) in [(3 * 4096 + 7, 4096), (10_000, 8192), (8192, 4096)] {
                let mut reached = vec![0u32; world * whole];
                for (first, count) in pieces(whole, piece) {
                    let shape = Shape {
                        count,
                        piece_of: whole,
                        ..shape_of(Collective::ReduceScatter, false, eb)
                    };
                    let caller = moved(&[base, 0], first, eb);
                    assert_eq!(caller[1], 0, "absent stays absent");
                    for (at, from, bytes) in segments(&shape, world, world * count) {
                        for k in 0..bytes / eb {
                            let staged = at as usize / eb + k;
                            let element = (caller[0] + from - base) as usize / eb + k;
                            let (b, i) = (staged / count, staged % count);
                            assert_eq!(element, b * whole + first + i, "{world} {whole} {piece}");
                            reached[element] += 1;
                        }
                    }
                    let output: Vec<_> = segments(&shape, world, count).collect();
                    assert_eq!(output, [(0, 0, count * eb)]);
                }
                assert!(reached.iter().all(|&n| n == 1), "{world} {whole} {piece}");
            }
        }
    }
}
