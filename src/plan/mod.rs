//! Plans: a collective compiled into data, before anything runs.
//!
//! A [`Plan`] lists, for each rank, the operations its host thread enqueues, in order, each on one
//! of the rank's streams: copies between byte ranges of buffers (peer, device→host, host→device),
//! reductions (`dst = a ⊕ b`), the `Avg` scaling, and event records and waits. The plan is the single
//! source of truth: the checker ([`crate::check`]) proves it correct on the CPU, and both executors
//! ([`crate::exec::host`], [`crate::exec::cuda`]) run exactly these operations. Ranges are counted in
//! elements (`offset`, `count`); an executor multiplies by the element size.
//!
//! # The ring all-reduce
//!
//! The `count` elements are cut into `world` segments (see [`ring::segment_range`]). Ring
//! all-reduce is a reduce-scatter followed by an all-gather, `world − 1` steps each; at every step
//! rank `r` sends one segment to `r + 1` and receives one from `r − 1` (all indices mod `world`):
//!
//! ```text
//!            step s of reduce-scatter                     step s of all-gather
//!   rank r ──seg (r−s)──▶ rank r+1: acc ⊕= recv     rank r ──seg (r+1−s)──▶ rank r+1: copy
//!
//!   world = 3, segments A B C (rank 0 holds A0 B0 C0, ...)
//!
//!   reduce-scatter   rank 0 sends   rank 1 sends   rank 2 sends    after the step
//!   step 0           A0 → 1         B1 → 2         C2 → 0          1: A01  2: B12  0: C20
//!   step 1           C20 → 1        A01 → 2        B12 → 0         1: C201 2: A012 0: B120
//!                                                                   (rank r owns seg r+1)
//!   all-gather
//!   step 0           B → 1          C → 2          A → 0           each rank has 2 full segs
//!   step 1           A → 1          B → 2          C → 0           each rank has all 3
//! ```
//!
//! | phase          | rank r sends segment | rank r receives segment | from    |
//! |----------------|----------------------|-------------------------|---------|
//! | reduce-scatter | (r − s) mod n        | (r − s − 1) mod n       | r − 1   |
//! | all-gather     | (r + 1 − s) mod n    | (r − s) mod n           | r − 1   |
//!
//! Invariant: after reduce-scatter step `s`, rank `r` holds `s + 2` contributions to segment
//! `(r − s − 1) mod n`; after step `n − 2` it owns the full sum of segment `(r + 1) mod n`.
//! These formulas live in [`ring::send_segment`] and [`ring::recv_segment`]; a unit test checks them
//! against this table.
//!
//! # Chunked pipelining and staging slots
//!
//! Every segment is cut into chunks of `chunk_elems` (but into no more than [`max_chunks`] of the
//! world: a longer segment gets longer chunks, so a plan's size does not grow with the count);
//! chunk `c`
//! of step `s + 1` only waits for chunk
//! `c` of step `s`, so while one chunk is being reduced the next is already on the wire. A sender
//! pushes a chunk into one of the receiver's `slots` staging slots (reduce-scatter) or straight into
//! the receiver's output (all-gather). A slot is reused only after the receiver has reduced its
//! previous contents: the sender's stream waits on the receiver's "reduced" event — the credit.
//!
//! Over an edge without peer access the chunk is staged through pinned host memory: device→host on
//! the sender's send stream into the sender's host slots, host→device on the receiver's receive
//! stream, with events between ([`EdgeTransport::Staged`]).
//!
//! # Streams and calls
//!
//! Each rank has a `Main` stream (the collective starts and ends there), a `Send` stream (pushes and
//! device→host copies), a `Reduce` stream (kernels) and, where it receives over a staged edge, a
//! `Recv` stream (host→device). A plan opens with `Entry` records on every Main stream that all other
//! streams touching that rank's memory wait on, and closes with Main waiting on everything the rank
//! did, so that back-to-back calls of one plan never overlap wrongly (the checker proves that too).
//!
//! # The one-shot all-reduce: a second algorithm, for small messages
//!
//! Below a few MiB the ring's chain of copies, kernels and cross-GPU events costs more than the
//! bytes (~55 µs at 512 KiB on the 2×H200 machine). The one-shot ([`oneshot::OneShotSpec`]) does
//! the whole collective in one instruction per rank, [`Op::PeerReduce`]: every rank meets every
//! other at a start barrier, reads all ranks' inputs directly (over peer access on GPUs), folds them
//! in rank order 0, 1, …, n−1 (so all ranks get the same bits) into its own output, and meets them
//! again at an end barrier, after which nobody reads anybody's input any more. In place, a rank
//! first copies its buffer into an [`BufKind::Exposed`] copy that peers read, since it overwrites
//! the buffer itself while they may still be reading. Each rank moves `(n−1)·count` elements over
//! its links (the ring: `2(n−1)/n·count`), so the one-shot wins on latency, not on bandwidth;
//! [`crate::Algorithm`] picks by message size.
//!
//! # The two-shot: a third, for mid-size messages in place
//!
//! [`twoshot::TwoShotSpec`] is the ring's two halves done by kernels reading peer memory: each
//! rank reduces its own segment from every rank (a `PeerReduce` over all ranks), then copies each
//! other segment from its owner (one `PeerReduce` over that rank alone per gather round). It
//! moves `2(n−1)/n·count` per rank, like the ring, and needs no exposed copy in place: what a
//! rank writes before the middle barrier, nobody else reads then. The table is in its module,
//! with the pushed gather the host executor runs ([`twoshot::Gather::Push`]: each owner writes
//! its reduced segment into every rank's buffer in the same meeting, `PeerReduce::push`).
//!
//! # The other collectives
//!
//! A plan says which collective it computes ([`Plan::collective`], a [`Collective`]); the
//! collective fixes every caller's buffer length and what the checker proves about the outputs
//! (the table is in [`Collective`]'s module). [`CollectiveSpec`] compiles any of them from the
//! ring's parameters. Each planner is a module with its diagram, step table and formulas:
//! [`reducescatter`] and [`allgather`] (the ring's two halves on blocks), [`broadcast`] and
//! [`reduce`] (pipelined chains along the ring), [`alltoall`] and [`sendrecv`] (direct pushes).
//! They all emit their transfers through one builder (`push.rs`: staging slots and their credits,
//! staged edges through host slots), the same one the ring all-reduce uses, so every plan is made
//! of the ops both executors run. Every collective but send/recv also has a one-shot form, made
//! of `PeerReduce` meetings like the all-reduce's ([`oneshot`], with its table), for small
//! messages.

pub mod allgather;
pub mod alltoall;
pub mod arena;
pub mod broadcast;
mod collective;
pub mod hierarchy;
pub mod oneshot;
mod push;
pub mod reduce;
pub mod reducescatter;
pub mod ring;
pub mod sendrecv;
pub mod staged;
pub mod twoshot;

pub use collective::{Collective, CollectiveSpec, Transfer};
pub use oneshot::OneShotSpec;
pub use push::{max_chunks, MAX_CHUNK_STEPS};
pub use ring::{EdgeTransport, RingSpec};
pub use twoshot::{Gather, TwoShotSpec};

use std::fmt;

/// Index of a buffer in [`Plan::buffers`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufId(pub usize);

/// Index of an event in [`Plan::events`]. Each event is recorded exactly once per call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub usize);

/// What a buffer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufKind {
    /// The caller's input (out-of-place calls only); never written.
    Input,
    /// The caller's output (or in-place buffer).
    Output,
    /// The receiver's device staging slots, `slots × chunk_elems`.
    Slots,
    /// The sender's pinned host staging slots, `slots × chunk_elems` (staged edges only).
    HostSlots,
    /// A rank's copy of its in-place buffer that the other ranks read (one-shot in place).
    Exposed,
    /// A rank's copy of its source in pinned host memory that the other ranks read: the
    /// one-shot over staged edges ([`staged`]), whose ranks cannot read each other's devices.
    HostExposed,
    /// A rank's device scratch for partial sums that its output has no room for (ring
    /// reduce-scatter out of place, the reduce chain's non-root ranks); allocated like `Slots`.
    Scratch,
    /// The send buffer of transfer `i` of a [`Collective::SendRecv`] (the caller's, on the
    /// transfer's `from` rank); never written.
    SendBuf(usize),
    /// The receive buffer of transfer `i` of a [`Collective::SendRecv`] (the caller's, on the
    /// transfer's `to` rank).
    RecvBuf(usize),
}

/// Where a buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Memory {
    /// GPU memory of the owning rank's device.
    Device,
    /// Pinned host memory.
    Host,
}

impl BufKind {
    /// Device memory for everything but the host staging slots and host exposed copies.
    pub fn memory(self) -> Memory {
        match self {
            BufKind::HostSlots | BufKind::HostExposed => Memory::Host,
            _ => Memory::Device,
        }
    }

    /// True for a rank's exposed copies ([`BufKind::Exposed`], [`BufKind::HostExposed`]): what
    /// an [`Op::Expose`] publishes into.
    pub fn is_exposure(self) -> bool {
        matches!(self, BufKind::Exposed | BufKind::HostExposed)
    }

    /// True for the caller's buffers (inputs, outputs, send and receive buffers), false for the
    /// memory a prepared plan owns (slots, scratch, exposed copies).
    pub fn is_callers(self) -> bool {
        matches!(
            self,
            BufKind::Input | BufKind::Output | BufKind::SendBuf(_) | BufKind::RecvBuf(_)
        )
    }

    /// True for buffers a plan may only read (inputs and send buffers).
    pub fn is_read_only(self) -> bool {
        matches!(self, BufKind::Input | BufKind::SendBuf(_))
    }
}

/// A buffer the plan uses: its owning rank, kind and length in elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferDecl {
    /// The rank that owns the buffer (on whose device it lives, or whose host slots it is).
    pub rank: usize,
    /// What the buffer holds.
    pub kind: BufKind,
    /// Length in elements.
    pub len: usize,
}

/// A range of `count` elements starting at element `offset` of buffer `buf`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    /// The buffer the range lies in.
    pub buf: BufId,
    /// First element of the range.
    pub offset: usize,
    /// Length of the range in elements.
    pub count: usize,
}

impl Region {
    /// End element (exclusive).
    pub fn end(&self) -> usize {
        self.offset + self.count
    }

    /// True when both regions are in the same buffer and share at least one element.
    pub fn overlaps(&self, other: &Region) -> bool {
        self.buf == other.buf && self.offset < other.end() && other.offset < self.end()
    }
}

/// The streams of one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StreamKind {
    /// Where the collective starts and ends: the other streams wait on its entry records.
    Main,
    /// Pushes to the next rank and device→host staging copies.
    Send,
    /// Host→device copies of a staged edge (receivers of staged edges only).
    Recv,
    /// The reduction kernels.
    Reduce,
}

impl StreamKind {
    /// Every stream kind, in [`StreamKind::index`] order.
    pub const ALL: [StreamKind; 4] = [
        StreamKind::Main,
        StreamKind::Send,
        StreamKind::Recv,
        StreamKind::Reduce,
    ];

    /// Dense index, `0..4`.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One operation, executed on the stream of the [`Instr`] that holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `dst = src`, `src.count == dst.count`.
    Copy {
        /// The range read.
        src: Region,
        /// The range written.
        dst: Region,
    },
    /// `dst = a ⊕ b` elementwise; `dst` is `a` or disjoint from both.
    Reduce {
        /// The range written.
        dst: Region,
        /// The left operand.
        a: Region,
        /// The right operand.
        b: Region,
    },
    /// The `Avg` finish: `x = x / world`.
    Scale {
        /// The range divided in place.
        region: Region,
    },
    /// Record the event on this stream.
    Record(EventId),
    /// Make this stream wait for the event's record (enqueued after that record, or it is a no-op).
    Wait(EventId),
    /// `dst = src`, where `dst` is this rank's exposed copy ([`BufKind::Exposed`], or
    /// [`BufKind::HostExposed`] over staged edges), published for the next
    /// instruction alone: a peer reduce on the same stream whose source on this rank is exactly
    /// `dst`, and which writes `src` itself or nothing `src` holds. Nothing else reads `dst`
    /// (the shape check proves all three). So an executor may run it as a copy, inside that
    /// meeting's kernel before its start barrier (the read one-shot), or not at all where the
    /// meeting sends each rank's source to its peers instead of letting them read it (the LL
    /// one-shot): then the meeting takes this rank's source from `src`, which holds the same
    /// elements.
    Expose {
        /// The range published (the in-place buffer, or the input of a staged one-shot).
        src: Region,
        /// The exposed copy written.
        dst: Region,
    },
    /// A collective instruction (the one-shot and the two-shot): every rank's k-th `PeerReduce`
    /// is one meeting. Start barrier with all ranks; then `dst = srcₐ ⊕ src_b ⊕ …` over the
    /// ranks in `ranks`, where `srcᵣ` is elements `offset..offset + count` of rank r's buffer of
    /// kind `src`, folded in rank order (one rank: a copy from that rank); then an end barrier.
    /// `dst` is the executing rank's own; the same result also goes, at the same range, into the
    /// buffer of `dst`'s kind of every rank in `push` (the pushed two-shot). Every range written
    /// is disjoint from every source, or exactly the source of the rank whose buffer it is
    /// (folded block by block: every source's block is read before any destination's block is
    /// written). Each rank of a meeting may read its own range.
    PeerReduce {
        /// The executing rank's range written.
        dst: Region,
        /// Which buffer of each rank in `ranks` is read.
        src: BufKind,
        /// First element read in each source buffer.
        offset: usize,
        /// Elements read from each source (and written to `dst`).
        count: usize,
        /// The ranks whose sources are folded.
        ranks: Ranks,
        /// This meeting runs in the same kernel as the rank's previous instruction, its
        /// previous meeting, with no barrier between the two: that meeting's end and this one's
        /// start barrier are dropped, so the two meetings' accesses are concurrent on every
        /// rank. Every rank's k-th peer reduce says the same; the shape check proves that no
        /// access of one meeting of a fused run conflicts with an access of another (so the
        /// dropped barriers ordered nothing).
        fused: bool,
        /// The other ranks whose buffer of `dst`'s kind receives the result too, at `dst`'s
        /// range ([`Ranks::NONE`] but in the pushed two-shot, [`twoshot::Gather::Push`]).
        push: Ranks,
    },
}

/// A set of ranks (rank r is bit r, for worlds up to 64; [`Ranks::ALL`] is every rank of any
/// world): whose buffers an [`Op::PeerReduce`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ranks(pub u64);

impl Ranks {
    /// Every rank, whatever the world.
    pub const ALL: Ranks = Ranks(u64::MAX);
    /// No rank.
    pub const NONE: Ranks = Ranks(0);

    /// The set of rank `rank` alone.
    pub fn only(rank: usize) -> Ranks {
        Ranks(1u64.checked_shl(rank as u32).unwrap_or(0))
    }

    /// True when rank `rank` is in the set.
    pub fn contains(self, rank: usize) -> bool {
        self == Ranks::ALL || rank < 64 && self.0 >> rank & 1 == 1
    }
}

/// The part of the algorithm an instruction belongs to (for errors and traces).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// The opening records on Main that the other streams wait on.
    Entry,
    /// The ring's reduce-scatter.
    ReduceScatter,
    /// The ring's all-gather.
    AllGather,
    /// The one-shot's barrier–read–reduce–barrier.
    OneShot,
    /// The two-shot: step 0 reduces the rank's own segment from every rank, step j ≥ 1 copies
    /// segment (rank + j) mod n from its owner.
    TwoShot,
    /// A rank's own block copied from its input into its output (all-gather, all-to-all,
    /// broadcast at the root, the one-rank cases).
    Local,
    /// The broadcast chain: step p is the hop from chain position p to p + 1.
    Broadcast,
    /// The reduce chain towards the root: step p is the hop from chain position p to p + 1.
    Reduce,
    /// All-to-all: step j is the push of block (rank + j) mod n to that rank.
    AllToAll,
    /// Grouped send/recv: step i is transfer i.
    SendRecv,
    /// The close: Main's waits on everything else the rank did (and the two-shot's `Avg` scaling).
    Finish,
}

/// Where in the algorithm an instruction or event sits: phase, step and chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tag {
    /// The algorithm phase.
    pub phase: Phase,
    /// The step within the phase (0 for phases without steps).
    pub step: usize,
    /// The chunk within the step's segment (0 for unchunked phases).
    pub chunk: usize,
}

impl Tag {
    /// The tag of the [`Phase::Entry`] instructions.
    pub const ENTRY: Tag = Tag {
        phase: Phase::Entry,
        step: 0,
        chunk: 0,
    };
    /// The tag of the [`Phase::Local`] copies.
    pub const LOCAL: Tag = Tag {
        phase: Phase::Local,
        step: 0,
        chunk: 0,
    };
    /// The tag of the [`Phase::Finish`] instructions.
    pub const FINISH: Tag = Tag {
        phase: Phase::Finish,
        step: 0,
        chunk: 0,
    };
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.phase {
            Phase::Entry => f.write_str("entry"),
            Phase::Finish => f.write_str("finish"),
            Phase::ReduceScatter => write!(
                f,
                "chunk {} of reduce-scatter step {}",
                self.chunk, self.step
            ),
            Phase::AllGather => write!(f, "chunk {} of all-gather step {}", self.chunk, self.step),
            Phase::OneShot => f.write_str("the one-shot peer reduce"),
            Phase::TwoShot if self.step == 0 => {
                f.write_str("the two-shot's reduce of the rank's own segment")
            }
            Phase::TwoShot => write!(f, "the two-shot's gather round {}", self.step),
            Phase::Local => f.write_str("the local copy of the rank's own block"),
            Phase::Broadcast => write!(f, "chunk {} of broadcast hop {}", self.chunk, self.step),
            Phase::Reduce => write!(f, "chunk {} of reduce hop {}", self.chunk, self.step),
            Phase::AllToAll => write!(f, "all-to-all push {}", self.step),
            Phase::SendRecv => write!(f, "chunk {} of transfer {}", self.chunk, self.step),
        }
    }
}

/// One entry of a rank's program: an operation on one of its streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Instr {
    /// The rank's stream the operation is enqueued on.
    pub stream: StreamKind,
    /// The operation.
    pub op: Op,
    /// Where in the algorithm it sits.
    pub tag: Tag,
}

/// What an event marks, for messages like "rank 1 waited for rank 0's chunk 7 of reduce-scatter
/// step 3 (sent)".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventDecl {
    /// The rank whose stream records it.
    pub rank: usize,
    /// The stream that records it.
    pub stream: StreamKind,
    /// Where in the algorithm the record sits.
    pub tag: Tag,
    /// What has happened once it fires ("sent", "reduced", "copied to host", ...).
    pub what: &'static str,
}

impl fmt::Display for EventDecl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {}'s {} ({})", self.rank, self.tag, self.what)
    }
}

/// A collective compiled for one shape: world, count, in/out of place, op, chunking, transports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Which collective the plan computes: what the checker proves about its outputs, and the
    /// length of every caller's buffer ([`Collective::input_len`], [`Collective::output_len`]).
    pub collective: Collective,
    /// Number of ranks.
    pub world: usize,
    /// The collective's count, as NCCL counts it: elements per rank for all-reduce, broadcast
    /// and reduce; per block (each rank's share) for all-gather, reduce-scatter and all-to-all;
    /// 0 for send/recv, whose transfers carry their own counts.
    pub count: usize,
    /// True when each rank's output buffer is also its input.
    pub in_place: bool,
    /// True when the plan ends with the `Avg` scaling (it is element-type independent otherwise).
    pub average: bool,
    /// Every buffer of every rank, indexed by [`BufId`].
    pub buffers: Vec<BufferDecl>,
    /// Every event, indexed by [`EventId`].
    pub events: Vec<EventDecl>,
    /// `ranks[r]` is rank r's program, in enqueue order.
    pub ranks: Vec<Vec<Instr>>,
}

impl Plan {
    /// Declares rank `rank`'s caller's buffers by the collective's length rules
    /// ([`Collective::input_len`], [`Collective::output_len`], [`Collective::in_place_len`]): in
    /// place its one buffer (as `Output`); out of place its input, then its output, where the
    /// collective gives it one. Send/recv's buffers are its transfers' and are declared by its
    /// planner.
    pub fn declare_callers(&mut self, rank: usize) {
        let (collective, n, count) = (&self.collective, self.world, self.count);
        let mut decls = Vec::with_capacity(2);
        if self.in_place {
            decls.push((BufKind::Output, collective.in_place_len(n, count)));
        } else {
            decls.extend(
                collective
                    .input_len(rank, n, count)
                    .map(|l| (BufKind::Input, l)),
            );
            decls.extend(
                collective
                    .output_len(rank, n, count)
                    .map(|l| (BufKind::Output, l)),
            );
        }
        self.buffers.extend(
            decls
                .into_iter()
                .map(|(kind, len)| BufferDecl { rank, kind, len }),
        );
    }

    /// The buffer declared for `(rank, kind)`, if the plan uses one.
    pub fn buffer(&self, rank: usize, kind: BufKind) -> Option<BufId> {
        self.buffers
            .iter()
            .position(|b| b.rank == rank && b.kind == kind)
            .map(BufId)
    }

    /// The declaration of a buffer.
    pub fn decl(&self, buf: BufId) -> &BufferDecl {
        &self.buffers[buf.0]
    }

    /// The streams rank `rank` uses, in [`StreamKind`] order.
    pub fn streams(&self, rank: usize) -> Vec<StreamKind> {
        let mut used = [false; 4];
        for instr in &self.ranks[rank] {
            used[instr.stream.index()] = true;
        }
        StreamKind::ALL
            .into_iter()
            .filter(|s| used[s.index()])
            .collect()
    }

    /// For each event, the ranks other than its recorder that wait on it (the event handoff's
    /// fan-out: the recording thread tells exactly these ranks once the record is enqueued).
    pub fn remote_waiters(&self) -> Vec<Vec<usize>> {
        let mut waiters = vec![Vec::new(); self.events.len()];
        for (rank, program) in self.ranks.iter().enumerate() {
            for instr in program {
                if let Op::Wait(e) = instr.op {
                    let w: &mut Vec<usize> = &mut waiters[e.0];
                    if self.events[e.0].rank != rank && !w.contains(&rank) {
                        w.push(rank);
                    }
                }
            }
        }
        waiters
    }

    /// Total number of instructions over all ranks.
    pub fn len(&self) -> usize {
        self.ranks.iter().map(Vec::len).sum()
    }

    /// True when no rank has anything to do.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
