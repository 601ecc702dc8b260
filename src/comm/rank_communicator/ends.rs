//! What every call of a [`RankCommunicator`] checks of this rank's buffers before it meets its
//! peers — the collective against the world, each buffer's length against [`Collective`]'s
//! table (the count comes from them), its placement — and the result, the call's [`Ends`]: this
//! rank's buffers by the plan's kind, which a host rank reads as slices (`host_slices`) and a
//! GPU rank passes by address (`addresses`).

use super::RankCommunicator;
use crate::buffer::{Buffer, BufferMut};
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::Shape;
use crate::plan::{BufKind, Collective, Transfer};

/// This rank's buffers of one call, by the plan's kind for each, as addresses and lengths.
pub(super) struct Ends {
    pub(super) reads: Vec<(BufKind, u64, usize)>,
    pub(super) writes: Vec<(BufKind, u64, usize)>,
}

/// A host rank's ends as slices, read-only and writable.
///
/// # Safety
/// Each address and length came from a `Buffer` in host memory (checked by `placed`), whose
/// contract makes them valid for the buffer's elements, borrowed by the caller of the call that
/// made `ends` for as long as the slices live; each write is a `BufferMut` borrowed mutably,
/// distinct from every other buffer of the call (the borrow checker keeps a `&mut` unique). The
/// slices live no longer than that call (`'a` is chosen by the caller and bounded by nothing
/// else).
#[allow(clippy::type_complexity)]
pub(super) unsafe fn host_slices<'a, T: Element>(
    ends: &Ends,
) -> (Vec<(BufKind, &'a [T])>, Vec<(BufKind, &'a mut [T])>) {
    // SAFETY: the contract above.
    let reads = ends
        .reads
        .iter()
        .map(|&(kind, addr, len)| unsafe {
            (kind, std::slice::from_raw_parts(addr as *const T, len))
        })
        .collect();
    // SAFETY: as above.
    let writes = ends
        .writes
        .iter()
        .map(|&(kind, addr, len)| unsafe {
            (kind, std::slice::from_raw_parts_mut(addr as *mut T, len))
        })
        .collect();
    (reads, writes)
}

impl RankCommunicator {
    /// The shape and this rank's ends of `collective` out of place, after checking the
    /// collective, the buffers' lengths and their placement.
    pub(super) fn out_of_place<T: Element, I: Buffer<T> + ?Sized, O: BufferMut<T> + ?Sized>(
        &self,
        collective: &Collective,
        input: Option<&I>,
        output: Option<&mut O>,
        op: ReduceOp,
    ) -> Result<(Shape, Ends)> {
        self.check(collective)?;
        let count = self.count_of(
            collective,
            input.map(|i| i.count()),
            output.as_ref().map(|o| o.count()),
            false,
        )?;
        let mut ends = Ends {
            reads: Vec::new(),
            writes: Vec::new(),
        };
        if let Some(i) = input {
            self.placed(i)?;
            ends.reads.push((BufKind::Input, i.address(), i.count()));
        }
        if let Some(o) = output {
            self.placed(&*o)?;
            ends.writes
                .push((BufKind::Output, o.address_mut(), o.count()));
        }
        Ok((
            Shape::collective::<T>(collective.clone(), count, false, op),
            ends,
        ))
    }

    /// The plan's caller buffers by address, as the GPU executor takes them: rank r's input and
    /// output at index r, transfer i's ends at index i (`exec::caller_address`); this rank's
    /// alone.
    pub(super) fn addresses(&self, shape: &Shape, ends: &Ends) -> (Vec<u64>, Vec<u64>) {
        let slots = match &shape.collective {
            Collective::SendRecv { transfers } => transfers.len(),
            _ => self.world,
        };
        let (mut inputs, mut outputs) = (vec![0u64; slots], vec![0u64; slots]);
        for &(kind, addr, _) in ends.reads.iter().chain(&ends.writes) {
            match kind {
                BufKind::Input => inputs[self.rank] = addr,
                BufKind::Output => outputs[self.rank] = addr,
                BufKind::SendBuf(i) => inputs[i] = addr,
                BufKind::RecvBuf(i) => outputs[i] = addr,
                _ => {}
            }
        }
        (inputs, outputs)
    }

    /// The shape and this rank's ends of a send/recv, after checking the transfers, the
    /// buffers' number, lengths and placement.
    pub(super) fn send_recv_ends<T: Element, I: Buffer<T> + ?Sized, O: BufferMut<T> + ?Sized>(
        &self,
        transfers: &[Transfer],
        sends: &[&I],
        recvs: &mut [&mut O],
    ) -> Result<(Shape, Ends)> {
        let rank = self.rank;
        let collective = Collective::SendRecv {
            transfers: transfers.to_vec(),
        };
        collective.validate(self.world)?;
        let mine = |to_me: bool| -> Vec<(usize, usize)> {
            transfers
                .iter()
                .enumerate()
                .filter(|(_, t)| if to_me { t.to == rank } else { t.from == rank })
                .map(|(i, t)| (i, t.count))
                .collect()
        };
        let (sending, receiving) = (mine(false), mine(true));
        let send_lens: Vec<usize> = sends.iter().map(|b| b.count()).collect();
        let recv_lens: Vec<usize> = recvs.iter().map(|b| b.count()).collect();
        for (what, ends, lens) in [
            (
                "send buffers (one per transfer this rank sends)",
                &sending,
                &send_lens,
            ),
            (
                "receive buffers (one per transfer this rank receives)",
                &receiving,
                &recv_lens,
            ),
        ] {
            if lens.len() != ends.len() {
                return Err(Error::BufferCount {
                    collective: "send/recv",
                    what,
                    expected: ends.len(),
                    got: lens.len(),
                });
            }
            if let Some((&(i, count), &got)) = ends
                .iter()
                .zip(lens)
                .find(|((_, count), got)| count != *got)
            {
                return Err(Error::BufferLength {
                    collective: "send/recv",
                    rank,
                    buffer: format!("buffer of transfer {i}"),
                    expected: count,
                    got,
                });
            }
        }
        let mut ends = Ends {
            reads: Vec::new(),
            writes: Vec::new(),
        };
        for (&(i, count), b) in sending.iter().zip(sends) {
            self.placed(*b)?;
            ends.reads.push((BufKind::SendBuf(i), b.address(), count));
        }
        for (&(i, count), b) in receiving.iter().zip(recvs.iter_mut()) {
            self.placed(&**b)?;
            ends.writes
                .push((BufKind::RecvBuf(i), b.address_mut(), count));
        }
        Ok((
            Shape::collective::<T>(collective, 0, false, ReduceOp::Sum),
            ends,
        ))
    }

    /// The shape of `collective` in place on this rank's `buf`, after checking that it has an
    /// in-place form, `buf`'s length and its placement.
    pub(super) fn in_place_shape<T: Element, B: BufferMut<T> + ?Sized>(
        &self,
        collective: &Collective,
        buf: &B,
        op: ReduceOp,
    ) -> Result<Shape> {
        self.check(collective)?;
        if !collective.has_in_place() {
            return Err(Error::InvalidArgument(format!(
                "{} has no in-place form",
                collective.name()
            )));
        }
        let count = self.count_of(collective, None, Some(buf.count()), true)?;
        self.placed(buf)?;
        Ok(Shape::collective::<T>(collective.clone(), count, true, op))
    }

    /// What every call but send/recv checks first: a collective of its world (send/recv has
    /// its own call, [`RankCommunicator::send_recv`]).
    fn check(&self, collective: &Collective) -> Result<()> {
        if matches!(collective, Collective::SendRecv { .. }) {
            return Err(Error::InvalidArgument(
                "send/recv passes a buffer per transfer: call RankCommunicator::send_recv".into(),
            ));
        }
        collective.validate(self.world)
    }

    /// A buffer is where this rank's calls take it: host memory for a host rank, its GPU for a
    /// GPU rank.
    pub(super) fn placed<T: Element, B: Buffer<T> + ?Sized>(&self, buf: &B) -> Result<()> {
        crate::comm::validate::placed(self.device(), buf.placement(), self.rank)
    }

    /// The collective's count from this rank's buffers' lengths, each checked against the
    /// table.
    fn count_of(
        &self,
        collective: &Collective,
        input: Option<usize>,
        output: Option<usize>,
        in_place: bool,
    ) -> Result<usize> {
        let (rank, world) = (self.rank, self.world);
        let per = |len: usize, blocks: usize| -> Result<usize> {
            match len % blocks {
                0 => Ok(len / blocks),
                _ => Err(Error::InvalidArgument(format!(
                    "rank {rank}'s buffer of {len} elements is not {blocks} blocks of one count"
                ))),
            }
        };
        if in_place {
            let len = output.ok_or_else(|| {
                Error::InvalidArgument(format!("rank {rank} passes no buffer in place"))
            })?;
            return per(len, collective.in_place_len(world, 1));
        }
        let input_blocks = collective.input_len(rank, world, 1);
        let output_blocks = collective.output_len(rank, world, 1);
        let count = match (input_blocks, input, output_blocks, output) {
            (Some(b), Some(len), _, _) => per(len, b)?,
            (_, _, Some(b), Some(len)) => per(len, b)?,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "rank {rank} passes no buffer the {} needs",
                    collective.name()
                )))
            }
        };
        for (what, blocks, len) in [
            ("input", input_blocks, input),
            ("output", output_blocks, output),
        ] {
            match (blocks, len) {
                (Some(b), Some(len)) if len == b * count => {}
                (None, None) => {}
                (Some(b), got) => {
                    return Err(Error::BufferLength {
                        collective: collective.name(),
                        rank,
                        buffer: what.into(),
                        expected: b * count,
                        got: got.unwrap_or(0),
                    })
                }
                (None, Some(_)) => {
                    return Err(Error::InvalidArgument(format!(
                        "rank {rank} passes an {what} the {} does not take from it",
                        collective.name()
                    )))
                }
            }
        }
        Ok(count)
    }
}
