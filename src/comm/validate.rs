//! What every call checks before anything is enqueued: buffer count, lengths compared across all
//! ranks, placement (host or the rank's own GPU), overlap between an output and an input and
//! between ranks' outputs, and the byte count. Each failure is its own [`Error`] variant naming
//! the rank; nothing has been touched when one is returned.
//!
//! One function checks every collective's call, the all-reduce's too: `validate_collective` —
//! the collective against the world (roots, transfers: [`Collective::validate`]), how many
//! buffers each list holds, every buffer's length ([`Collective::input_len`] and its siblings
//! are the one home of those rules; the all-reduce's outputs may be longer than its inputs),
//! and no buffer the call writes overlapping any other buffer of the call.

use super::Communicator;
use crate::buffer::{Buffer, BufferMut, Placement, StreamUse};
use crate::element::Element;
use crate::error::{Error, Result};
use crate::plan::{Collective, Transfer};
use cudarc::driver::CudaStream;

impl Communicator {
    /// The checks of one call of a collective, before anything is enqueued: the collective
    /// against the world (roots, transfers), the number of buffers in each list, every buffer's
    /// length, placement on its rank, and no written buffer overlapping another buffer of the
    /// call. The lengths are exact, but for the all-reduce's two rules: every rank's source
    /// holds the count (the first that differs from rank 0's is [`Error::LengthMismatch`]),
    /// and an output may be longer than it (only the first `count` elements are written;
    /// shorter is [`Error::OutputTooShort`]).
    pub(super) fn validate_collective<T: Element, I: Buffer<T>, O: Buffer<T>>(
        &self,
        collective: &Collective,
        inputs: Option<&[I]>,
        outputs: &[O],
    ) -> Result<Layout> {
        let (world, name) = (self.world, collective.name());
        collective.validate(world)?;
        let in_place = inputs.is_none();
        if in_place && !collective.has_in_place() {
            return Err(Error::NoInPlace { collective: name });
        }
        let layout = Layout::of(collective, world, in_place, inputs.map_or(0, |i| i.len()))?;
        let count_lists = |what: &'static str, expected: usize, got: usize| {
            if got == expected {
                Ok(())
            } else if expected == world && !matches!(collective, Collective::SendRecv { .. }) {
                Err(Error::WorldMismatch { world, got })
            } else {
                Err(Error::BufferCount {
                    collective: name,
                    what,
                    expected,
                    got,
                })
            }
        };
        let empty_inputs = inputs.is_some_and(|i| i.is_empty()) && !layout.input_at.is_empty();
        if empty_inputs || outputs.is_empty() && !layout.output_at.is_empty() {
            return Err(Error::NoBuffers);
        }
        if let Some(inputs) = inputs {
            count_lists(layout.input_what, layout.input_at.len(), inputs.len())?;
        }
        count_lists(layout.output_what, layout.output_at.len(), outputs.len())?;
        // The count, from the first buffer that states it (the others are checked against it).
        let count = match (collective, inputs) {
            (Collective::SendRecv { .. }, _) => 0,
            (Collective::ReduceScatter, Some(_)) => outputs[0].count(),
            (Collective::AllToAll, Some(i)) => i[0].count() / world,
            (_, Some(i)) => i[0].count(),
            (Collective::ReduceScatter | Collective::AllGather, None) => outputs[0].count() / world,
            (_, None) => outputs[0].count(),
        };
        // No object exceeds isize::MAX bytes; the longest buffer is world·count elements (the
        // all-reduce's: count).
        let all_reduce = *collective == Collective::AllReduce;
        count
            .checked_mul(if all_reduce { 1 } else { world })
            .and_then(|n| n.checked_mul(std::mem::size_of::<T>()))
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or(Error::SizeOverflow {
                count,
                dtype: T::DTYPE,
            })?;
        let (len_in, len_out) = layout.lengths(collective, world, count, in_place);
        let devices = self.devices();
        let mut seen: Vec<(usize, u64, u64, bool)> = Vec::new();
        let bytes = |len: usize| {
            len.checked_mul(std::mem::size_of::<T>())
                .filter(|&b| b <= isize::MAX as usize)
                .ok_or(Error::SizeOverflow {
                    count: len,
                    dtype: T::DTYPE,
                })
        };
        let ins = inputs.into_iter().flatten().map(|b| b as &dyn Buffer<T>);
        let outs = outputs.iter().map(|b| b as &dyn Buffer<T>);
        let listed = ins
            .zip(len_in)
            .zip(&layout.input_rank)
            .enumerate()
            .map(|(i, x)| (i, x, false))
            .chain(
                outs.zip(len_out)
                    .zip(&layout.output_rank)
                    .enumerate()
                    .map(|(i, x)| (i, x, true)),
            );
        let listed: Vec<_> = listed.collect();
        // Every length first (a wrong one is named whatever else is wrong) ...
        for &(index, ((b, want), &rank), written) in &listed {
            let source = !written || in_place;
            if all_reduce && source && b.count() != want {
                return Err(Error::LengthMismatch {
                    rank,
                    expected: want,
                    got: b.count(),
                });
            }
            if all_reduce && b.count() < want {
                return Err(Error::OutputTooShort {
                    rank,
                    input: want,
                    output: b.count(),
                });
            }
            if !all_reduce && b.count() != want {
                return Err(Error::BufferLength {
                    collective: name,
                    rank,
                    buffer: layout.buffer_name(index, written, in_place),
                    expected: want,
                    got: b.count(),
                });
            }
        }
        // ... then, buffer by buffer in list order, its placement and its overlap with every
        // buffer listed before it.
        for &(_, ((b, want), &rank), written) in &listed {
            placed(devices.get(rank).copied(), b.placement(), rank)?;
            let (s0, w0) = (b.address(), written);
            let e0 = s0.saturating_add(bytes(want)? as u64);
            for &(other, s1, e1, w1) in &seen {
                if (w0 || w1) && s0 < e1 && s1 < e0 {
                    return Err(match (w0, w1) {
                        (true, true) => Error::OutputsOverlap {
                            first: other.min(rank),
                            second: other.max(rank),
                        },
                        (true, false) => Error::Overlap { rank },
                        _ => Error::Overlap { rank: other },
                    });
                }
            }
            seen.push((rank, s0, e0, w0));
        }
        Ok(Layout { count, ..layout })
    }
}

/// Where each buffer of a call's lists belongs: its rank, and its index in the address lists
/// the executors read ([`crate::exec::caller_address`]: by rank, or by transfer).
pub(super) struct Layout {
    pub(super) count: usize,
    pub(super) input_rank: Vec<usize>,
    pub(super) input_at: Vec<usize>,
    pub(super) input_slots: usize,
    input_what: &'static str,
    pub(super) output_rank: Vec<usize>,
    pub(super) output_at: Vec<usize>,
    pub(super) output_slots: usize,
    output_what: &'static str,
    transfers: Vec<Transfer>,
}

impl Layout {
    fn of(c: &Collective, world: usize, in_place: bool, inputs: usize) -> Result<Layout> {
        let ranks: Vec<usize> = (0..world).collect();
        let per_rank = "buffers (one per rank)";
        let mut l = Layout {
            count: 0,
            input_rank: if in_place { Vec::new() } else { ranks.clone() },
            input_at: if in_place { Vec::new() } else { ranks.clone() },
            input_slots: if in_place { 0 } else { world },
            input_what: per_rank,
            output_rank: ranks.clone(),
            output_at: ranks,
            output_slots: world,
            output_what: per_rank,
            transfers: Vec::new(),
        };
        match c {
            Collective::Broadcast { .. } if !in_place => {
                l.input_rank = c.input_ranks(world);
                l.input_at = l.input_rank.clone();
                l.input_what = "input buffers (the root's alone)";
            }
            Collective::Reduce { .. } if !in_place => {
                l.output_rank = c.output_ranks(world);
                l.output_at = l.output_rank.clone();
                l.output_what = "output buffers (the root's alone)";
            }
            Collective::SendRecv { transfers } => {
                let n = transfers.len();
                if inputs != n {
                    return Err(Error::BufferCount {
                        collective: c.name(),
                        what: "send buffers (one per transfer)",
                        expected: n,
                        got: inputs,
                    });
                }
                l.input_rank = c.input_ranks(world);
                l.output_rank = c.output_ranks(world);
                (l.input_at, l.output_at) = ((0..n).collect(), (0..n).collect());
                (l.input_slots, l.output_slots) = (n, n);
                l.input_what = "send buffers (one per transfer)";
                l.output_what = "receive buffers (one per transfer)";
                l.transfers = transfers.clone();
            }
            _ => {}
        }
        Ok(l)
    }

    /// Every buffer's address in the lists the executors read (by rank, or by transfer; 0 where
    /// a list has no buffer): inputs (empty in place), outputs.
    pub(super) fn addresses<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        inputs: Option<&[I]>,
        outputs: &mut [O],
    ) -> (Vec<u64>, Vec<u64>) {
        let mut ins = vec![0u64; self.input_slots];
        for (b, &slot) in inputs.into_iter().flatten().zip(&self.input_at) {
            ins[slot] = b.address();
        }
        let mut outs = vec![0u64; self.output_slots];
        for (b, &slot) in outputs.iter_mut().zip(&self.output_at) {
            outs[slot] = b.address_mut();
        }
        (ins, outs)
    }

    /// Records each buffer's use by the call on its rank's stream in `streams` (by rank), `when`
    /// before or after it: cudarc's event tracking of its slices.
    pub(super) fn track<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        inputs: Option<&[I]>,
        outputs: &mut [O],
        streams: &[&CudaStream],
        when: StreamUse,
    ) {
        for (b, &rank) in inputs.into_iter().flatten().zip(&self.input_rank) {
            b.on_stream(streams[rank], when);
        }
        for (b, &rank) in outputs.iter_mut().zip(&self.output_rank) {
            b.on_stream_mut(streams[rank], when);
        }
    }

    /// The exact length of each buffer in the input and output lists.
    fn lengths(
        &self,
        c: &Collective,
        world: usize,
        count: usize,
        in_place: bool,
    ) -> (Vec<usize>, Vec<usize>) {
        if !self.transfers.is_empty() {
            let counts: Vec<usize> = self.transfers.iter().map(|t| t.count).collect();
            return (counts.clone(), counts);
        }
        let ins = self
            .input_rank
            .iter()
            .map(|&r| c.input_len(r, world, count).unwrap_or(0))
            .collect();
        let outs = self
            .output_rank
            .iter()
            .map(|&r| {
                if in_place {
                    c.in_place_len(world, count)
                } else {
                    c.output_len(r, world, count).unwrap_or(0)
                }
            })
            .collect();
        (ins, outs)
    }

    /// How errors name buffer `index` of the input (or output) list.
    fn buffer_name(&self, index: usize, output: bool, in_place: bool) -> String {
        match (self.transfers.is_empty(), output, in_place) {
            (false, false, _) => format!("send buffer of transfer {index}"),
            (false, true, _) => format!("receive buffer of transfer {index}"),
            (true, _, true) => "in-place buffer".into(),
            (true, false, false) => "input".into(),
            (true, true, false) => "output".into(),
        }
    }
}

/// Whether a buffer of rank `rank` is where its communicator needs it: host memory for a host
/// rank (`device` none), the rank's own GPU otherwise — the one placement rule of both
/// communicators ([`Communicator`]'s calls and a [`crate::RankCommunicator`]'s).
pub(crate) fn placed(device: Option<usize>, p: Placement, rank: usize) -> Result<()> {
    match (p, device) {
        (Placement::Host, None) => Ok(()),
        (Placement::Device(_), None) => Err(Error::WrongPlacement {
            rank,
            got: p,
            expected: "host memory (this is a host communicator)",
        }),
        (Placement::Host, _) => Err(Error::WrongPlacement {
            rank,
            got: p,
            expected: "device memory (this is a GPU communicator)",
        }),
        (Placement::Device(device), Some(expected)) if device != expected => {
            Err(Error::WrongDevice {
                rank,
                device,
                expected,
            })
        }
        (Placement::Device(_), Some(_)) => Ok(()),
    }
}
