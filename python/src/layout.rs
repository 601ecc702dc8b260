//! Which of the core's two forms a call takes — in place on one buffer, or out of place from an
//! input to an output — from the buffers Python passed (`x` and `out`), for host buffers and GPU
//! tensors alike.
//!
//! The rule, NCCL's where NCCL has one:
//! - `out` is `None`, or the very memory of `x`: in place on `x` (the collective's in-place
//!   layout: src/plan/collective.rs's table).
//! - A reduce-scatter whose `out` is block `rank` of `x`, or an all-gather whose `x` is block
//!   `rank` of `out`: in place on the larger buffer (NCCL's in-place forms of the two).
//! - Otherwise `x` and `out` must not overlap: out of place. A broadcast's non-root reads no
//!   `x` (it may be `None`), and a reduce's non-root writes no `out` (it is not touched).
//!
//! Every rank must take the same form (the core compares calls across ranks, in place or not
//! included: a rank that differs gets `CallMismatch`, as do its peers).

use crate::errors::{argument, Failure};
use ringreduce::Collective;

/// A buffer as the rule sees it: `count` elements at `address` (host or device).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// The first element's address.
    pub address: u64,
    /// Elements.
    pub count: usize,
}

impl Span {
    /// The span's bytes, for elements of `size` bytes.
    fn bytes(self, size: usize) -> std::ops::Range<u64> {
        self.address..self.address + (self.count * size) as u64
    }

    /// True when the two spans share a byte (empty spans share none).
    pub fn overlaps(self, other: Span, size: usize) -> bool {
        let (a, b) = (self.bytes(size), other.bytes(size));
        a.start < b.end && b.start < a.end
    }

    /// Block `index` of `blocks` equal blocks of this span, when it divides evenly.
    fn block(self, index: usize, blocks: usize, size: usize) -> Option<Span> {
        (blocks > 0 && self.count % blocks == 0).then(|| {
            let count = self.count / blocks;
            Span {
                address: self.address + (index * count * size) as u64,
                count,
            }
        })
    }
}

/// The form a call takes, with the buffers the core gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// In place on this one buffer.
    InPlace(Span),
    /// Out of place: the input this rank passes (`None`: a broadcast's non-root) and the
    /// output (`None`: a reduce's non-root).
    OutOfPlace {
        /// What the core reads.
        input: Option<Span>,
        /// What the core writes.
        output: Option<Span>,
    },
}

/// The layout of `collective` on rank `rank` of `world` for elements of `size` bytes, from `x`
/// and `out` (module doc).
pub fn layout(
    collective: &Collective,
    rank: usize,
    world: usize,
    size: usize,
    x: Option<Span>,
    out: Option<Span>,
) -> Result<Layout, Failure> {
    let name = collective.name();
    let in_place = |span: Span| match collective.has_in_place() {
        true => Ok(Layout::InPlace(span)),
        false => Err(argument(format!(
            "{name} has no in-place form: pass an `out` apart from `x`"
        ))),
    };
    let (x, out) = match (x, out) {
        (Some(x), None) => return in_place(x),
        (None, None) => return Err(argument(format!("{name}: pass a buffer `x`"))),
        (x, Some(out)) => (x, out),
    };
    let reads = collective.input_len(rank, world, 1).is_some();
    let writes = collective.output_len(rank, world, 1).is_some();
    let Some(x) = x else {
        return match reads {
            false => Ok(Layout::OutOfPlace {
                input: None,
                output: Some(out),
            }),
            true => Err(argument(format!(
                "{name}: rank {rank} passes no `x` to read"
            ))),
        };
    };
    if x == out {
        return in_place(x);
    }
    match collective {
        Collective::ReduceScatter if x.block(rank, world, size) == Some(out) => return in_place(x),
        Collective::AllGather if out.block(rank, world, size) == Some(x) => return in_place(out),
        _ => {}
    }
    if reads && writes && x.overlaps(out, size) {
        return Err(argument(format!(
            "{name}: `out` overlaps `x`: pass the same buffer (or no `out`) for in place, or \
             separate buffers"
        )));
    }
    Ok(Layout::OutOfPlace {
        input: reads.then_some(x),
        output: writes.then_some(out),
    })
}

/// Refuses a send/recv whose receive buffers overlap each other or a send buffer (the sends may
/// share memory: they are only read).
pub fn check_send_recv(sends: &[Span], recvs: &[Span], size: usize) -> Result<(), Failure> {
    for (i, recv) in recvs.iter().enumerate() {
        if let Some(j) = recvs[..i].iter().position(|r| r.overlaps(*recv, size)) {
            return Err(argument(format!(
                "send/recv: recvs[{j}] and recvs[{i}] overlap: each receive needs its own memory"
            )));
        }
        if let Some(j) = sends.iter().position(|s| s.overlaps(*recv, size)) {
            return Err(argument(format!(
                "send/recv: recvs[{i}] overlaps sends[{j}]"
            )));
        }
    }
    Ok(())
}
