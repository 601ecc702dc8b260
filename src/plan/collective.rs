//! Which collective a plan computes ([`Collective`]), the length of every caller's buffer per
//! collective (the one home of those rules: the planners, the checker and the communicator's
//! validation all read them here), and [`CollectiveSpec`], which compiles any collective.
//!
//! The semantics are NCCL's. `count` is NCCL's count: elements per rank for all-reduce,
//! broadcast and reduce; each rank's block for all-gather (its `sendcount`), reduce-scatter (its
//! `recvcount`) and all-to-all. In place, a rank passes one buffer:
//!
//! | collective      | input (out of place) | output (out of place) | in-place buffer, and where the input / result lie |
//! |-----------------|----------------------|-----------------------|----------------------------------------------------|
//! | all-reduce      | count                | count                 | count; the whole buffer is both                    |
//! | reduce-scatter  | world·count          | count                 | world·count; the result is block `rank`            |
//! | all-gather      | count                | world·count           | world·count; the input is block `rank`             |
//! | broadcast(root) | count, root only     | count                 | count; the root's buffer is the input              |
//! | reduce(root)    | count                | count, root only      | count; the root's buffer gets the result           |
//! | all-to-all      | world·count          | world·count           | — (out of place only)                              |
//! | send/recv       | per transfer         | per transfer          | — (out of place only)                              |
//!
//! Block `j` of a world·count buffer is elements `j·count..(j+1)·count`. All-to-all: rank r's
//! output block j is rank j's input block r.

use super::{EdgeTransport, Plan, RingSpec};
use crate::error::{Error, Result};

/// One point-to-point transfer of a grouped send/recv: `count` elements from a send buffer on
/// rank `from` into a receive buffer on rank `to` (`from == to` is a local copy).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Transfer {
    /// The sending rank.
    pub from: usize,
    /// The receiving rank.
    pub to: usize,
    /// Elements moved.
    pub count: usize,
}

/// Which collective a plan computes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every rank ends with the reduction over all ranks.
    AllReduce,
    /// Rank r ends with block r of the reduction of every rank's world·count input.
    ReduceScatter,
    /// Every rank ends with every rank's input, rank j's in block j.
    AllGather,
    /// Every rank ends with the root's input.
    Broadcast {
        /// The rank whose input is sent.
        root: usize,
    },
    /// The root ends with the reduction over all ranks.
    Reduce {
        /// The rank that receives the result.
        root: usize,
    },
    /// Rank r's output block j is rank j's input block r.
    AllToAll,
    /// A group of point-to-point transfers that run as one call (so a pipeline's exchange, where
    /// every rank sends and receives, cannot deadlock on the order of the calls).
    SendRecv {
        /// The transfers, each with its own send and receive buffer (`BufKind::SendBuf(i)`,
        /// `BufKind::RecvBuf(i)` for transfer `i`).
        transfers: Vec<Transfer>,
    },
}

impl Collective {
    /// The collective's name, as messages print it.
    pub fn name(&self) -> &'static str {
        match self {
            Collective::AllReduce => "all-reduce",
            Collective::ReduceScatter => "reduce-scatter",
            Collective::AllGather => "all-gather",
            Collective::Broadcast { .. } => "broadcast",
            Collective::Reduce { .. } => "reduce",
            Collective::AllToAll => "all-to-all",
            Collective::SendRecv { .. } => "send/recv",
        }
    }

    /// True when the collective combines ranks' values with the operator (so `Avg` applies).
    pub fn reduces(&self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce { .. }
        )
    }

    /// True when NCCL defines an in-place form (see the table in the module doc).
    pub fn has_in_place(&self) -> bool {
        !matches!(self, Collective::AllToAll | Collective::SendRecv { .. })
    }

    /// The root of a rooted collective.
    pub fn root(&self) -> Option<usize> {
        match *self {
            Collective::Broadcast { root } | Collective::Reduce { root } => Some(root),
            _ => None,
        }
    }

    /// Length of rank `rank`'s input out of place (`None`: the rank passes none).
    pub fn input_len(&self, rank: usize, world: usize, count: usize) -> Option<usize> {
        match *self {
            Collective::ReduceScatter | Collective::AllToAll => Some(world * count),
            Collective::Broadcast { root } if rank != root => None,
            Collective::SendRecv { .. } => None,
            _ => Some(count),
        }
    }

    /// Length of rank `rank`'s output out of place (`None`: the rank passes none).
    pub fn output_len(&self, rank: usize, world: usize, count: usize) -> Option<usize> {
        match *self {
            Collective::AllGather | Collective::AllToAll => Some(world * count),
            Collective::Reduce { root } if rank != root => None,
            Collective::SendRecv { .. } => None,
            _ => Some(count),
        }
    }

    /// Whether the collective's buffers of `world × count` elements are `world` blocks of
    /// `count`, block `j` rank `j`'s part: a reduce-scatter's input, an all-gather's output, an
    /// all-to-all's both (in place, the one buffer).
    pub fn blocked(&self) -> bool {
        matches!(
            self,
            Collective::ReduceScatter | Collective::AllGather | Collective::AllToAll
        )
    }

    /// Which rank owns each buffer of an out-of-place call's input list, in list order: every
    /// rank; the root alone for a broadcast; each transfer's sender for send/recv.
    pub fn input_ranks(&self, world: usize) -> Vec<usize> {
        match self {
            Collective::Broadcast { root } => vec![*root],
            Collective::SendRecv { transfers } => transfers.iter().map(|t| t.from).collect(),
            _ => (0..world).collect(),
        }
    }

    /// Which rank owns each buffer of an out-of-place call's output list, in list order: every
    /// rank; the root alone for a reduce; each transfer's receiver for send/recv. (In place,
    /// every rank passes one buffer.)
    pub fn output_ranks(&self, world: usize) -> Vec<usize> {
        match self {
            Collective::Reduce { root } => vec![*root],
            Collective::SendRecv { transfers } => transfers.iter().map(|t| t.to).collect(),
            _ => (0..world).collect(),
        }
    }

    /// Length of every rank's one buffer in place.
    pub fn in_place_len(&self, world: usize, count: usize) -> usize {
        match self {
            Collective::ReduceScatter | Collective::AllGather => world * count,
            _ => count,
        }
    }

    /// Where rank `rank`'s input lies in its in-place buffer: the element offset of its block.
    pub fn in_place_input_at(&self, rank: usize, count: usize) -> usize {
        match self {
            Collective::AllGather => rank * count,
            _ => 0,
        }
    }

    /// Where rank `rank`'s result lies in its in-place buffer: the element offset of its block.
    pub fn in_place_output_at(&self, rank: usize, count: usize) -> usize {
        match self {
            Collective::ReduceScatter => rank * count,
            _ => 0,
        }
    }

    /// Checks the collective against a world: roots in range, transfers between real ranks.
    pub fn validate(&self, world: usize) -> Result<()> {
        if let Some(root) = self.root() {
            if root >= world {
                return Err(Error::RootOutOfRange { root, world });
            }
        }
        if let Collective::SendRecv { transfers } = self {
            for (index, t) in transfers.iter().enumerate() {
                if t.from >= world || t.to >= world {
                    return Err(Error::TransferOutOfRange {
                        index,
                        from: t.from,
                        to: t.to,
                        world,
                    });
                }
            }
        }
        Ok(())
    }
}

/// Everything that decides the shape of a plan of any collective: which one, and the ring's
/// parameters (world, count, in place, operator, chunking, slots, alignment, edge transports),
/// which every planner shares (see [`RingSpec`]; `ring.count` is the collective's count).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CollectiveSpec {
    /// The collective.
    pub collective: Collective,
    /// World, count, in place, operator, chunking, slots, alignment and edge transports.
    pub ring: RingSpec,
}

impl CollectiveSpec {
    /// A spec of `collective` over `world` ranks, `count` elements, every edge on `transport`,
    /// out of place, `Sum`.
    pub fn new(
        collective: Collective,
        world: usize,
        count: usize,
        chunk_elems: usize,
        slots: usize,
        transport: EdgeTransport,
    ) -> CollectiveSpec {
        let mut ring = RingSpec::new(world, count, chunk_elems, slots, transport);
        ring.in_place = false;
        CollectiveSpec { collective, ring }
    }

    /// Compiles the spec into a plan; each collective's planner documents its algorithm.
    pub fn build(&self) -> Result<Plan> {
        let ring = &self.ring;
        self.collective.validate(ring.world.max(1))?;
        if ring.in_place && !self.collective.has_in_place() {
            return Err(Error::InvalidArgument(format!(
                "{} has no in-place form",
                self.collective.name()
            )));
        }
        if ring.op == crate::element::ReduceOp::Avg && !self.collective.reduces() {
            return Err(Error::InvalidArgument(format!(
                "{} does not reduce: Avg does not apply",
                self.collective.name()
            )));
        }
        match &self.collective {
            Collective::AllReduce => ring.build(),
            Collective::ReduceScatter => super::reducescatter::build(ring),
            Collective::AllGather => super::allgather::build(ring),
            Collective::Broadcast { root } => super::broadcast::build(ring, *root),
            Collective::Reduce { root } => super::reduce::build(ring, *root),
            Collective::AllToAll => super::alltoall::build(ring),
            Collective::SendRecv { transfers } => super::sendrecv::build(ring, transfers),
        }
    }
}
