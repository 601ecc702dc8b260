//! An all-reduce, broadcast or reduce too large for the arenas, across processes, run as pieces
//! that fit them — each a call of the same collective on a run of the caller's elements, which
//! needs no more than the buffers' addresses moved on (the other collectives' buffers are
//! blocks, a piece of which is no run of elements). Each piece a call of its own, prepared by each rank alone and checked by the GPUs' call gate like
//! any gated call — so a large call also returns once enqueued, whatever the peers' hosts are
//! doing, instead of meeting them to allocate and exchange buffers of its size.
//!
//! ```text
//!   an in-place all-reduce of 40 M f32 (160 MiB; an arena holds 64 MiB a rank)
//!   piece 0: elements [0, 16 M)   piece 1: [16 M, 32 M)   piece 2: [32 M, 40 M)
//!   each: staged into the arena, reduced by the two-shot, copied back — one kernel a rank
//! ```
//!
//! Every piece's published call carries the whole call's count (`CallShape::piece_of`), so
//! ranks whose whole calls differ are named at the first piece, before any piece touches a
//! peer's memory or a caller's buffer.
//!
//! Invariant: the split depends only on what every rank has alike — the shape, the
//! communicator's selection and arenas, and whether the call runs on symmetric registrations
//! (which ranks deciding differently make a named mismatch of) — so every rank cuts a call into
//! the same pieces.

use super::callers::CallerStreams;
use super::peer_words::ARENA_BYTES;
use super::CudaExecutor;
use crate::element::{Element, ReduceOp};
use crate::error::Result;
use crate::exec::algorithm::Form;
use crate::exec::Shape;
use crate::plan::Collective;
use std::time::Instant;

/// How many buffers of a piece's count a rank places in its arena for a call of `shape`, where
/// it can run in pieces: an all-reduce out of place two (the two-shot's peers read its input
/// and its output), in place one; a broadcast or reduce one (the root's buffer its peers read,
/// or each rank's the root reads). `None`: the collective does not run in pieces.
fn staged_buffers(shape: &Shape) -> Option<usize> {
    match shape.collective {
        Collective::AllReduce if !shape.in_place => Some(2),
        Collective::AllReduce | Collective::Broadcast { .. } | Collective::Reduce { .. } => Some(1),
        _ => None,
    }
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
/// place; the steps kernel the buffer the peers read).
fn piece_fits(form: Form) -> bool {
    matches!(
        form,
        Form::TwoShotKernel | Form::OneShotKernel | Form::LlKernel | Form::StepsKernel
    )
}

/// Elements a piece of a call of `count` elements holds where a piece holds at most `most` (a
/// multiple of 4096): the call cut into as few pieces as fit, of about one size (whole blocks of
/// 4096 elements, the last the rest) — so that every piece runs the form a piece of that size
/// does, and no small remainder runs another.
pub(super) fn balanced(count: usize, most: usize) -> usize {
    let n = count.div_ceil(most).max(1);
    count.div_ceil(n).div_ceil(4096) * 4096
}

/// The pieces of a call of `count` elements, `piece` elements each but the last: (first
/// element, elements).
pub(super) fn pieces(count: usize, piece: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..count.div_ceil(piece)).map(move |i| (i * piece, piece.min(count - i * piece)))
}

impl CudaExecutor {
    /// How many elements each piece of this call holds, where it runs in pieces (module doc):
    /// an all-reduce, broadcast or reduce across processes whose ranks all made arenas, on
    /// buffers it would stage
    /// (not on symmetric registrations), larger than a piece — a piece whose form is a kernel
    /// the gate checks and whose plan fits the arena (`piece_fits`). `None`: it runs whole.
    pub(super) fn arena_piece(
        &self,
        shape: &Shape,
        inputs: &[u64],
        outputs: &[u64],
    ) -> Option<usize> {
        let most = piece_elems(ARENA_BYTES, shape.elem_bytes, staged_buffers(shape)?);
        if shape.count <= most
            || most == 0
            || self.in_one_process()
            || !self.arenas_everywhere()
            || !self.registrations.all_symmetric()
            || self.runs_symmetric(shape, inputs, outputs)
        {
            return None;
        }
        let piece = balanced(shape.count, most);
        let piece_shape = Shape {
            count: piece,
            ..shape.clone()
        };
        piece_fits(self.selection(&piece_shape).form).then_some(piece)
    }

    /// Runs `shape` as pieces of `piece` elements (module doc), each through
    /// [`CudaExecutor::run_one`], stopping at the first that fails — after the pieces enqueued
    /// before it have settled (as a failed call's own ranks are waited for, module `launch`), so
    /// that nothing touches the caller's buffers once the call has returned its error;
    /// [`crate::Ran::pieces`] says how many ran.
    ///
    /// # Safety
    /// As for [`CudaExecutor::run`]: the pieces are parts of the caller's buffers.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn run_in_pieces<T: Element>(
        &mut self,
        shape: Shape,
        piece: usize,
        inputs: &[u64],
        outputs: &[u64],
        op: ReduceOp,
        wait_complete: bool,
        caller: Option<CallerStreams<'_>>,
    ) -> Result<()> {
        let at = |list: &[u64], first: usize| -> Vec<u64> {
            let offset = (first * shape.elem_bytes) as u64;
            list.iter()
                .map(|&a| if a == 0 { 0 } else { a + offset })
                .collect()
        };
        let mut ran = 0;
        for (first, count) in pieces(shape.count, piece) {
            let part = Shape {
                count,
                ..shape.clone()
            };
            let (part_inputs, part_outputs) = (at(inputs, first), at(outputs, first));
            // SAFETY: each piece's buffers lie within the caller's (same addresses, offset by the
            // piece's first element, its count within the whole's): our caller's contract.
            let result = unsafe {
                self.run_one::<T>(
                    part,
                    &part_inputs,
                    &part_outputs,
                    op,
                    wait_complete,
                    caller,
                    shape.count,
                )
            };
            if let Err(err) = result {
                // (A capture's pieces have not run: nothing to wait for.)
                let captured = caller.map_or(Ok(false), |streams| streams.capturing());
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
    use crate::exec::cuda::executor::rank::Staged;
    use crate::plan::arena::arena_layout;
    use crate::plan::{Gather, OneShotSpec, TwoShotSpec};

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
        let fits = |plan: &crate::plan::Plan, elem_bytes: usize| {
            let staged = Staged::for_plan(plan, true);
            arena_layout(plan, |k| staged.owns(k), ARENA_BYTES / elem_bytes).is_some()
        };
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
}
