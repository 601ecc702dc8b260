//! A call's words, as each rank of a job publishes them in its control segment (the parent
//! module, `exec::job`): the call's shape ([`CallShape`]: collective, root or transfers, count,
//! type, operator, in place), which the ranks compare at the call's start, and where the rank's
//! buffers of the call lie in the memory it registered ([`CallerRefs`]), which says whether the
//! call runs on them directly.
//!
//! Invariant: [`CallerRefs`] survive their words, and fresh (zeroed) words read as a rank that
//! passes no buffer; a shape is its words, so ranks compare calls by comparing words.

use super::{REF_WORDS, SHAPE_WORDS};
use crate::element::{DType, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::Shape;
use crate::plan::Collective;

/// A call's shape as words, compared across ranks at its start (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CallShape(pub(super) [u64; SHAPE_WORDS]);

impl CallShape {
    /// The shape of a call of `shape` on elements of `dtype` reduced by `op`.
    pub(crate) fn of(shape: &Shape, dtype: DType, op: ReduceOp) -> CallShape {
        let (kind, root) = match shape.collective {
            Collective::AllReduce => (1, 0),
            Collective::ReduceScatter => (2, 0),
            Collective::AllGather => (3, 0),
            Collective::Broadcast { root } => (4, root as u64),
            Collective::Reduce { root } => (5, root as u64),
            Collective::AllToAll => (6, 0),
            // The transfers, folded into one word: every rank must name the same list.
            Collective::SendRecv { ref transfers } => (7, crate::plan::sendrecv::folded(transfers)),
        };
        let reduces = shape.collective.reduces();
        CallShape([
            kind,
            root,
            shape.count as u64,
            DType::ALL
                .iter()
                .position(|&d| d == dtype)
                .map_or(u64::MAX, |i| i as u64),
            if reduces { op as u64 + 1 } else { 0 },
            // In place, and (bit 1) run on symmetric registrations as this rank decided alone:
            // ranks that decide differently make different calls.
            u64::from(shape.in_place) | u64::from(shape.registered) << 1,
            // The whole call where this is a piece of one (`Shape::piece_of`); 0: a whole
            // call. Ranks whose whole calls differ differ at their first piece.
            shape.piece_of as u64,
        ])
    }

    /// The same call, captured into a CUDA graph where `captured` (bit 2 of the flags word):
    /// a call one rank captures and another runs eagerly is a mismatch, named on both — a
    /// graph's replays are not checked against eager calls, so the pair could not be run.
    pub(crate) fn captured(mut self, captured: bool) -> CallShape {
        self.0[5] |= u64::from(captured) << 2;
        self
    }

    /// The shape's words, as a rendezvous record carries them.
    pub(crate) fn words(&self) -> &[u64] {
        &self.0
    }

    /// The first peer in `records` (every rank's shape words, by rank) whose call differs from
    /// `self`, this rank's, as the error every rank reports alike: [`Error::CallMismatch`].
    pub(crate) fn compare(&self, records: &[Vec<u64>], rank: usize) -> Result<()> {
        match records.iter().position(|r| r[..] != self.0[..]) {
            None => Ok(()),
            Some(q) => {
                let mut theirs = [0u64; SHAPE_WORDS];
                for (w, x) in theirs.iter_mut().zip(&records[q]) {
                    *w = *x;
                }
                Err(Error::CallMismatch {
                    rank: q,
                    theirs: CallShape(theirs).describe(),
                    this: rank,
                    ours: self.describe(),
                })
            }
        }
    }

    /// The call in words, for messages.
    pub(crate) fn describe(&self) -> String {
        let w = &self.0;
        let name = match w[0] {
            1 => "all-reduce",
            2 => "reduce-scatter",
            3 => "all-gather",
            4 => "broadcast",
            5 => "reduce",
            6 => "all-to-all",
            7 => "send/recv",
            _ => "nothing",
        };
        let root = match w[0] {
            4 | 5 => format!(" from root {}", w[1]),
            7 => format!(" of transfers {:016x}", w[1]),
            _ => String::new(),
        };
        let dtype = DType::ALL
            .get(w[3] as usize)
            .map_or_else(|| "?".to_string(), |d| format!("{d:?}"));
        format!(
            "{name}{root} of {} elements of {dtype}{}{}",
            w[2],
            match w[4] {
                0 => String::new(),
                op => format!(", operator {}", op - 1),
            },
            if w[5] & 1 == 1 { ", in place" } else { "" },
        ) + if w[5] & 2 == 2 {
            ", on symmetric registrations"
        } else {
            ""
        } + if w[5] & 4 == 4 {
            ", captured into a CUDA graph"
        } else {
            ""
        } + &match (w[6], w[0]) {
            (0, _) => String::new(),
            (whole, 7) => format!(", a piece of transfers {whole:016x}"),
            (whole, _) => format!(", a piece of a call of {whole} elements"),
        }
    }
}

/// Where one rank's buffers of a call lie, published beside the call's shape: a peer reaches
/// them directly only where they lie in memory the rank registered (GPU ranks:
/// `RankCommunicator::register`), and a call runs without copies only where every rank's do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CallerRefs {
    pub(crate) input: BufferRef,
    /// The output, or the in-place buffer.
    pub(crate) output: BufferRef,
}

/// One buffer of a [`CallerRefs`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum BufferRef {
    /// The rank passes no such buffer (a broadcast's non-root input; an in-place call's input).
    #[default]
    Absent,
    /// A buffer outside the rank's registered memory.
    Unregistered,
    /// `offset` bytes into the rank's registration number `index`.
    Registered { index: usize, offset: u64 },
}

impl BufferRef {
    fn words(self) -> [u64; 2] {
        match self {
            BufferRef::Absent => [0, 0],
            BufferRef::Unregistered => [1, 0],
            BufferRef::Registered { index, offset } => [index as u64 + 2, offset],
        }
    }

    fn from_words(w: [u64; 2]) -> BufferRef {
        match w[0] {
            0 => BufferRef::Absent,
            1 => BufferRef::Unregistered,
            k => BufferRef::Registered {
                index: (k - 2) as usize,
                offset: w[1],
            },
        }
    }

    /// Whether peers can reach the buffer, or need not.
    pub(crate) fn reachable(self) -> bool {
        self != BufferRef::Unregistered
    }
}

impl CallerRefs {
    pub(super) fn words(self) -> [u64; REF_WORDS] {
        let (i, o) = (self.input.words(), self.output.words());
        [i[0], i[1], o[0], o[1]]
    }

    pub(super) fn from_words(w: [u64; REF_WORDS]) -> CallerRefs {
        CallerRefs {
            input: BufferRef::from_words([w[0], w[1]]),
            output: BufferRef::from_words([w[2], w[3]]),
        }
    }

    /// Where the buffers lie, for messages: "input none, output registration 0 at offset
    /// 4096".
    pub(crate) fn describe(&self) -> String {
        let one = |at: BufferRef| match at {
            BufferRef::Absent => "none".to_string(),
            BufferRef::Unregistered => "unregistered".to_string(),
            BufferRef::Registered { index, offset } => {
                format!("registration {index} at offset {offset}")
            }
        };
        format!("input {}, output {}", one(self.input), one(self.output))
    }

    /// Whether every rank of `all` passes only buffers its peers reach: then the call runs on
    /// them directly, with no copies through the ranks' own memory.
    pub(crate) fn all_reachable(all: &[CallerRefs]) -> bool {
        !all.is_empty()
            && all
                .iter()
                .all(|r| r.input.reachable() && r.output.reachable())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_decided_on_symmetric_registrations_differs_from_one_that_copies() {
        let shape = Shape::collective::<f32>(Collective::AllReduce, 64, true, ReduceOp::Sum);
        let registered = Shape {
            registered: true,
            ..shape.clone()
        };
        let (copies, on_them) = (
            CallShape::of(&shape, DType::F32, ReduceOp::Sum),
            CallShape::of(&registered, DType::F32, ReduceOp::Sum),
        );
        assert_ne!(copies, on_them);
        assert!(
            copies.describe().ends_with(", in place"),
            "{}",
            copies.describe()
        );
        assert!(
            on_them
                .describe()
                .ends_with(", in place, on symmetric registrations"),
            "{}",
            on_them.describe()
        );
        let err = on_them
            .compare(&[copies.words().to_vec(), on_them.words().to_vec()], 1)
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::CallMismatch {
                    rank: 0,
                    this: 1,
                    ..
                }
            ),
            "{err}"
        );
    }

    /// A captured call, or a piece of a call, differs from the same call run whole and eagerly:
    /// rank 1's call (`other`, of the eager call's shape) is named against rank 0's, described
    /// with what differs.
    fn differs_from_eager(other: impl Fn(&Shape) -> CallShape, tail: &str) {
        let shape = Shape::collective::<f32>(Collective::AllGather, 64, false, ReduceOp::Sum);
        let eager = CallShape::of(&shape, DType::F32, ReduceOp::Sum);
        let theirs = other(&shape);
        let description = theirs.describe();
        assert!(description.ends_with(tail), "{description}");
        let err = eager
            .compare(&[eager.words().to_vec(), theirs.words().to_vec()], 0)
            .unwrap_err();
        assert!(matches!(err, Error::CallMismatch { rank: 1, .. }), "{err}");
    }

    #[test]
    fn a_captured_call_or_a_piece_differs_from_the_same_call_run_whole_and_eagerly() {
        let of = |shape: &Shape| CallShape::of(shape, DType::F32, ReduceOp::Sum);
        differs_from_eager(|s| of(s).captured(true), ", captured into a CUDA graph");
        let piece = |s: &Shape| Shape {
            piece_of: 100,
            ..s.clone()
        };
        differs_from_eager(|s| of(&piece(s)), ", a piece of a call of 100 elements");
        let shape = Shape::collective::<f32>(Collective::AllGather, 64, false, ReduceOp::Sum);
        assert_eq!(of(&shape).captured(false), of(&shape));
    }

    #[test]
    fn caller_refs_survive_their_words_and_fresh_words_read_as_absent() {
        let registered = BufferRef::Registered {
            index: 3,
            offset: 4096,
        };
        for refs in [
            CallerRefs::default(),
            CallerRefs {
                input: registered,
                output: BufferRef::Unregistered,
            },
            CallerRefs {
                input: BufferRef::Absent,
                output: BufferRef::Registered {
                    index: 0,
                    offset: 0,
                },
            },
        ] {
            assert_eq!(CallerRefs::from_words(refs.words()), refs);
        }
        assert_eq!(
            CallerRefs::from_words([0; REF_WORDS]),
            CallerRefs::default()
        );
        // An unregistered buffer anywhere keeps the call on the copies.
        let all = [
            CallerRefs {
                input: registered,
                output: registered,
            },
            CallerRefs {
                input: BufferRef::Unregistered,
                output: registered,
            },
        ];
        assert!(!CallerRefs::all_reachable(&all));
        assert!(CallerRefs::all_reachable(&all[..1]));
    }
}
