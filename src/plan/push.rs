//! The push machinery every copy-engine planner shares: a sender's Send stream writes a chunk
//! into the receiver's memory (peer), or stages it through the sender's pinned host slots
//! (device→host on the sender's Send stream, host→device on the receiver's Recv stream); a chunk
//! that will be reduced lands in one of the receiver's `slots` staging slots, which is reused only
//! after the receiver's Reduce stream has folded it (the credit: the sender waits on the
//! receiver's "reduced" event). The ring all-reduce ([`super::ring`]) and every other collective's
//! planner emit their transfers through [`Pusher::transfer`].
//!
//! Two disciplines for where a call starts and ends. The ring all-reduce places its own Entry
//! waits and finish (its module explains why its chain of events needs no more). Every other
//! planner builds with `guarded` set: a rank's side stream waits on the rank's Entry before its
//! first operation, a sender waits on the receiver's Entry before its first write into the
//! receiver's memory (so a call never writes memory the receiver's previous call still reads,
//! nor the caller's buffers before the work queued ahead of the call), and [`Pusher::finish`]
//! makes each rank's Main wait on every stream, its own or another rank's, that touched its
//! memory (a sender's pushes, a receiver's reads of its host slots).
//!
//! Invariant: every wait is emitted after the record it waits on, so reading each rank's program
//! in order never waits for a record no rank has enqueued yet (the checker's enqueue check).

use super::{
    BufId, BufKind, BufferDecl, EdgeTransport, EventDecl, EventId, Instr, Op, Plan, Region,
    RingSpec, StreamKind, Tag,
};
use crate::element::ReduceOp;
use crate::error::{Error, Result};
use std::collections::BTreeSet;

/// Where a pushed chunk goes on the receiver.
#[derive(Clone, Copy, Debug)]
pub(super) enum Landing {
    /// The chunk is final where it lands: this region of the receiver's.
    Final(Region),
    /// It lands in a staging slot and the receiver folds it: `dst = own ⊕ slot`, then scales
    /// `dst` (the `Avg` finish) when `scale`.
    Reduce {
        own: Region,
        dst: Region,
        scale: bool,
    },
}

/// A plan under construction, with the staging-slot rotation and credits of every rank.
pub(super) struct Pusher<'a> {
    pub(super) spec: &'a RingSpec,
    /// Elements per chunk (a staging slot's length).
    pub(super) chunk: usize,
    pub(super) plan: Plan,
    /// Per receiver: device staging slot uses so far, and the event that frees each slot.
    slot_uses: Vec<usize>,
    slot_free: Vec<Vec<Option<EventId>>>,
    /// Per staged sender: host slot uses so far, and the event that frees each host slot.
    host_uses: Vec<usize>,
    host_free: Vec<Vec<Option<EventId>>>,
    /// Per rank and stream: the last event recorded there.
    pub(super) last_record: Vec<[Option<EventId>; 4]>,
    /// Each rank's Entry record on Main.
    pub(super) entry: Vec<EventId>,
    /// The guarded discipline (see the module doc) instead of the ring all-reduce's own.
    guarded: bool,
    /// Per rank and stream: whether the stream has waited on the rank's Entry (guarded only).
    started: Vec<[bool; 4]>,
    /// (sender, receiver) pairs whose sender has waited on the receiver's Entry (guarded only).
    entered: BTreeSet<(usize, usize)>,
    /// Per rank: the other ranks' streams that touched its memory — pushes into it, reads of its
    /// host slots (guarded only).
    touchers: Vec<BTreeSet<(usize, StreamKind)>>,
}

impl<'a> Pusher<'a> {
    /// An empty plan of `spec.world` ranks computing `plan`'s collective, with the buffers
    /// already declared in `plan`, plus device slots of `spec.slots × chunk` elements for the
    /// ranks in `slotted` (those that receive chunks to reduce). A staged sender's host slots are
    /// declared at its first staged transfer unless `plan` declares them. `guarded` picks the
    /// discipline of the module doc (every planner but the ring all-reduce's).
    pub(super) fn new(
        spec: &'a RingSpec,
        chunk: usize,
        mut plan: Plan,
        slotted: &[usize],
        guarded: bool,
    ) -> Pusher<'a> {
        let n = spec.world;
        for &rank in slotted {
            plan.buffers.push(BufferDecl {
                rank,
                kind: BufKind::Slots,
                len: spec.slots * chunk,
            });
        }
        Pusher {
            spec,
            chunk,
            plan,
            slot_uses: vec![0; n],
            slot_free: vec![vec![None; spec.slots]; n],
            host_uses: vec![0; n],
            host_free: vec![vec![None; spec.slots]; n],
            last_record: vec![[None; 4]; n],
            entry: Vec::new(),
            guarded,
            started: vec![[false; 4]; n],
            entered: BTreeSet::new(),
            touchers: vec![BTreeSet::new(); n],
        }
    }

    /// An empty plan (no buffers yet) of the spec's shape for `collective`.
    pub(super) fn empty_plan(spec: &RingSpec, collective: super::Collective) -> Plan {
        Plan {
            average: spec.op == ReduceOp::Avg && spec.world > 1 && collective.reduces(),
            collective,
            world: spec.world,
            count: spec.count,
            in_place: spec.in_place,
            buffers: Vec::new(),
            events: Vec::new(),
            ranks: vec![Vec::new(); spec.world],
        }
    }

    pub(super) fn buf(&self, rank: usize, kind: BufKind) -> BufId {
        self.plan
            .buffer(rank, kind)
            .expect("the builder declares every buffer it uses")
    }

    /// How a chunk moves from `sender` to `receiver`: a ring edge (`receiver = sender + 1`) over
    /// its own transport; any other pair staged if any ring edge is (the edges that could not be
    /// given peer access say the GPUs do not all reach each other), peer otherwise.
    pub(super) fn edge(&self, sender: usize, receiver: usize) -> EdgeTransport {
        let n = self.spec.world;
        if receiver == (sender + 1) % n {
            self.spec.transports[sender]
        } else if self.spec.transports.contains(&EdgeTransport::Staged) {
            EdgeTransport::Staged
        } else {
            EdgeTransport::Peer
        }
    }

    pub(super) fn emit(&mut self, rank: usize, stream: StreamKind, op: Op, tag: Tag) {
        if self.guarded && stream != StreamKind::Main && !self.started[rank][stream.index()] {
            self.started[rank][stream.index()] = true;
            let entry = self.entry[rank];
            self.emit(rank, stream, Op::Wait(entry), Tag::ENTRY);
        }
        self.plan.ranks[rank].push(Instr { stream, op, tag });
    }

    pub(super) fn record(
        &mut self,
        rank: usize,
        stream: StreamKind,
        tag: Tag,
        what: &'static str,
    ) -> EventId {
        let id = EventId(self.plan.events.len());
        self.plan.events.push(EventDecl {
            rank,
            stream,
            tag,
            what,
        });
        self.emit(rank, stream, Op::Record(id), tag);
        self.last_record[rank][stream.index()] = Some(id);
        id
    }

    pub(super) fn wait(&mut self, rank: usize, stream: StreamKind, event: EventId, tag: Tag) {
        self.emit(rank, stream, Op::Wait(event), tag);
    }

    /// Every rank records Entry on Main (guarded plans; the ring all-reduce adds its own waits).
    pub(super) fn record_entries(&mut self) {
        for rank in 0..self.spec.world {
            let e = self.record(rank, StreamKind::Main, Tag::ENTRY, "entry");
            self.entry.push(e);
        }
    }

    /// Guarded plans: before `sender`'s stream first writes into `receiver`'s memory (or, staged,
    /// into host slots the receiver reads), it waits on the receiver's Entry.
    fn enter(&mut self, sender: usize, receiver: usize, tag: Tag) {
        if self.guarded && sender != receiver && self.entered.insert((sender, receiver)) {
            let entry = self.entry[receiver];
            self.wait(sender, StreamKind::Send, entry, tag);
        }
    }

    /// A staged sender's host slots, declared at its first staged transfer.
    fn host_slots(&mut self, sender: usize) -> BufId {
        match self.plan.buffer(sender, BufKind::HostSlots) {
            Some(buf) => buf,
            None => {
                self.plan.buffers.push(BufferDecl {
                    rank: sender,
                    kind: BufKind::HostSlots,
                    len: self.spec.slots * self.chunk,
                });
                BufId(self.plan.buffers.len() - 1)
            }
        }
    }

    /// A copy within one rank's memory on one of its streams; `after` is waited for first.
    pub(super) fn local_copy(
        &mut self,
        rank: usize,
        stream: StreamKind,
        src: Region,
        dst: Region,
        after: Option<EventId>,
        tag: Tag,
    ) {
        if src.count == 0 {
            return;
        }
        if let Some(after) = after {
            self.wait(rank, stream, after, tag);
        }
        self.emit(rank, stream, Op::Copy { src, dst }, tag);
    }

    /// Moves one chunk, `src` of `sender`'s, to `receiver` over their edge's transport, once
    /// `after` (if any) has fired; returns the event after which the chunk is final on the
    /// receiver (copied in, or reduced).
    pub(super) fn transfer(
        &mut self,
        sender: usize,
        receiver: usize,
        src: Region,
        landing: Landing,
        after: Option<EventId>,
        tag: Tag,
    ) -> EventId {
        let spec = self.spec;
        let count = src.count;
        let staged = self.edge(sender, receiver) == EdgeTransport::Staged;
        // Where the chunk lands on the receiver: a staging slot when it will be reduced, its final
        // place otherwise.
        let (land, slot) = match landing {
            Landing::Reduce { .. } => {
                let slot = self.slot_uses[receiver] % spec.slots;
                self.slot_uses[receiver] += 1;
                let region = Region {
                    buf: self.buf(receiver, BufKind::Slots),
                    offset: slot * self.chunk,
                    count,
                };
                (region, Some(slot))
            }
            Landing::Final(dst) => (dst, None),
        };

        // Sender side: wait for the data to be final here, then push it out.
        if let Some(after) = after {
            self.wait(sender, StreamKind::Send, after, tag);
        }
        self.enter(sender, receiver, tag);
        let arrived = if staged {
            let h = self.host_uses[sender] % spec.slots;
            self.host_uses[sender] += 1;
            let host = Region {
                buf: self.host_slots(sender),
                offset: h * self.chunk,
                count,
            };
            if let Some(free) = self.host_free[sender][h] {
                self.wait(sender, StreamKind::Send, free, tag);
            }
            self.emit(sender, StreamKind::Send, Op::Copy { src, dst: host }, tag);
            let staged_out = self.record(sender, StreamKind::Send, tag, "copied to host");
            self.wait(receiver, StreamKind::Recv, staged_out, tag);
            if let Some(slot) = slot {
                if let Some(free) = self.slot_free[receiver][slot] {
                    self.wait(receiver, StreamKind::Recv, free, tag);
                }
            }
            self.emit(
                receiver,
                StreamKind::Recv,
                Op::Copy {
                    src: host,
                    dst: land,
                },
                tag,
            );
            let landed = self.record(receiver, StreamKind::Recv, tag, "copied from host");
            self.host_free[sender][h] = Some(landed);
            self.touchers[sender].insert((receiver, StreamKind::Recv));
            landed
        } else {
            if let Some(slot) = slot {
                if let Some(free) = self.slot_free[receiver][slot] {
                    self.wait(sender, StreamKind::Send, free, tag);
                }
            }
            self.emit(sender, StreamKind::Send, Op::Copy { src, dst: land }, tag);
            if sender != receiver {
                self.touchers[receiver].insert((sender, StreamKind::Send));
            }
            self.record(sender, StreamKind::Send, tag, "sent")
        };

        let Landing::Reduce { own, dst, scale } = landing else {
            return arrived;
        };
        // Receiver side: fold the slot into its own contribution.
        self.wait(receiver, StreamKind::Reduce, arrived, tag);
        self.emit(
            receiver,
            StreamKind::Reduce,
            Op::Reduce {
                dst,
                a: own,
                b: land,
            },
            tag,
        );
        if scale {
            self.emit(receiver, StreamKind::Reduce, Op::Scale { region: dst }, tag);
        }
        let reduced = self.record(receiver, StreamKind::Reduce, tag, "reduced");
        self.slot_free[receiver][slot.expect("a reduced chunk lands in a slot")] = Some(reduced);
        reduced
    }

    /// Guarded plans: every side stream a rank used records "done" and Main waits on it; then
    /// Main waits on the last record of every other rank's stream that touched its memory (so
    /// the next call, which starts after Main, never writes what this call still reads there).
    pub(super) fn finish(mut self) -> Plan {
        let n = self.spec.world;
        for rank in 0..n {
            for stream in [StreamKind::Send, StreamKind::Recv, StreamKind::Reduce] {
                if self.started[rank][stream.index()] {
                    let last = self.record(rank, stream, Tag::FINISH, "done");
                    self.wait(rank, StreamKind::Main, last, Tag::FINISH);
                }
            }
        }
        for rank in 0..n {
            for (other, stream) in std::mem::take(&mut self.touchers[rank]) {
                if let Some(last) = self.last_record[other][stream.index()] {
                    self.wait(rank, StreamKind::Main, last, Tag::FINISH);
                }
            }
        }
        self.plan
    }
}

/// Element range of block `block` of a buffer cut into blocks of `count` elements.
pub(super) fn block_range(block: usize, count: usize) -> std::ops::Range<usize> {
    block * count..(block + 1) * count
}

/// The most chunk-steps a rank's ring all-reduce is cut into: its `2(world − 1)` steps times the
/// chunks per segment ([`max_chunks`]). A plan is data — every chunk of every step is an
/// instruction the checker proves — so a count or a `chunk_elems` that would cut a range finer
/// gets longer chunks instead: planning and proving a new shape then costs what a plan of this
/// many chunk-steps per rank costs, whatever the count (docs/PERFORMANCE.md, "The first call of
/// a shape"), about 5·world·`MAX_CHUNK_STEPS` instructions. A ring's pipeline fills and drains
/// in a chunk each, so 128 chunk-steps keep it busy for all but ~2% of a call at any world. The
/// price: beyond the bound, staging slots (`slots × chunk`, pinned host memory on staged edges)
/// grow with the count — a 16 GiB broadcast over 2 staged ranks with 3 slots pins 768 MiB per
/// sender where 4 MiB chunks would pin 12 MiB. Running a long message as several windows of
/// bounded plans would bound both; it is not built.
pub const MAX_CHUNK_STEPS: usize = 128;

/// The most chunks a range is cut into on `world` ranks: [`MAX_CHUNK_STEPS`] shared among the
/// ring all-reduce's `2(world − 1)` steps (64 on 2 ranks, 9 on 8, 4 on 16), at least one. Every
/// collective's planner uses this one bound.
pub fn max_chunks(world: usize) -> usize {
    (MAX_CHUNK_STEPS / (2 * world.saturating_sub(1)).max(2)).max(1)
}

/// The chunk length for a collective that moves ranges of at most `longest` elements
/// ([`chunk_len`]), with its staging (`slots` chunks) checked to be addressable.
pub(super) fn chunk_for(spec: &RingSpec, longest: usize) -> Result<usize> {
    let chunk = chunk_len(spec, longest);
    match chunk.checked_mul(spec.slots) {
        Some(_) => Ok(chunk),
        None => Err(Error::InvalidArgument(format!(
            "{} slots of {chunk} elements do not fit in memory",
            spec.slots
        ))),
    }
}

/// `chunk_elems`, but no longer than `longest` (at least 1) and no shorter than
/// `longest / max_chunks(world)`, rounded up to `align_elems`.
pub(super) fn chunk_len(spec: &RingSpec, longest: usize) -> usize {
    let align = spec.align_elems.max(1);
    let longest = longest.max(1);
    spec.chunk_elems
        .min(longest)
        .max(longest.div_ceil(max_chunks(spec.world)))
        .div_ceil(align)
        * align
}

/// A region of `count` elements from `offset` of `buf`.
pub(super) fn region(buf: BufId, range: std::ops::Range<usize>) -> Region {
    Region {
        buf,
        offset: range.start,
        count: range.len(),
    }
}
