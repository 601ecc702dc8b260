//! The ring all-reduce planner: segment and chunk arithmetic as small pure functions, and
//! [`RingSpec::build`], which emits the [`Plan`] the module above describes through the shared
//! push builder (`push.rs`: slots, credits, staged edges), with the ring's own Entry waits and
//! finish. [`RingSpec`]'s parameters (world, count, chunking, slots, edges) are every other
//! collective's too ([`super::CollectiveSpec`]).
//!
//! Emission order is the proof that the host threads cannot deadlock while enqueuing: transfers
//! are generated in (phase, step, chunk, sender) order and every wait refers to a record generated
//! earlier, so each rank's program, read in order, only ever waits for records that some rank
//! enqueues before it — the checker verifies this by simulating the enqueue.

use super::push::{region, Landing, Pusher};
use super::{BufId, BufKind, BufferDecl, EventId, Phase, Plan, StreamKind, Tag};
use crate::element::ReduceOp;
use crate::error::{Error, Result};
use std::ops::Range;

/// How one ring edge (rank r → rank r + 1) moves data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EdgeTransport {
    /// The sender's copy engine writes straight into the receiver's memory (peer access on).
    Peer,
    /// Device→host on the sender, host→device on the receiver, through pinned host slots.
    Staged,
}

/// Everything that decides the shape of a ring all-reduce plan (and, with the collective, of
/// every other collective's plan: [`super::CollectiveSpec`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RingSpec {
    /// Number of ranks in the ring.
    pub world: usize,
    /// Elements per rank.
    pub count: usize,
    /// True when each rank's output buffer is also its input.
    pub in_place: bool,
    /// The reduction; only `Avg` changes the plan (it adds the scaling).
    pub op: ReduceOp,
    /// Chunk length in elements (rounded up to a multiple of `align_elems`).
    pub chunk_elems: usize,
    /// Staging slots per receiver (and per staged sender), ≥ 1.
    pub slots: usize,
    /// Segment and chunk boundaries fall on multiples of this many elements (16 bytes' worth on
    /// GPUs, so kernels and copies stay vector-aligned).
    pub align_elems: usize,
    /// `transports[r]` is the edge r → r + 1; length `world`.
    pub transports: Vec<EdgeTransport>,
}

/// Rank that rank `rank` sends to.
pub fn send_to(rank: usize, world: usize) -> usize {
    (rank + 1) % world
}

/// Rank that rank `rank` receives from.
pub fn recv_from(rank: usize, world: usize) -> usize {
    (rank + world - 1) % world
}

/// The segment rank `rank` sends at `step` of `phase` (see the table in the module doc).
pub fn send_segment(phase: Phase, rank: usize, step: usize, world: usize) -> usize {
    match phase {
        Phase::ReduceScatter => (rank + world - step % world) % world,
        Phase::AllGather => (rank + 1 + world - step % world) % world,
        _ => unreachable!("no segment moves outside the ring phases"),
    }
}

/// The segment rank `rank` receives at `step` of `phase`.
pub fn recv_segment(phase: Phase, rank: usize, step: usize, world: usize) -> usize {
    send_segment(phase, recv_from(rank, world), step, world)
}

/// The segment whose full reduction rank `rank` holds after reduce-scatter.
pub fn owned_segment(rank: usize, world: usize) -> usize {
    (rank + 1) % world
}

/// Element range of segment `seg` when `count` elements are cut into `world` segments whose
/// boundaries are multiples of `align` (all but the last segment have whole units of `align`; the
/// units are spread as evenly as possible, the earlier segments taking one more when they don't
/// divide).
pub fn segment_range(count: usize, world: usize, align: usize, seg: usize) -> Range<usize> {
    debug_assert!(seg < world && world > 0 && align > 0);
    let units = count / align;
    let (base, extra) = (units / world, units % world);
    let start_unit = |s: usize| s * base + s.min(extra);
    let start = start_unit(seg) * align;
    let end = if seg + 1 == world {
        count
    } else {
        start_unit(seg + 1) * align
    };
    start..end
}

/// Chunks per segment: enough for the longest segment (shorter segments have empty tail chunks).
pub fn chunks_per_segment(count: usize, world: usize, align: usize, chunk_elems: usize) -> usize {
    let longest = (0..world)
        .map(|s| segment_range(count, world, align, s).len())
        .max()
        .unwrap_or(0);
    longest.div_ceil(chunk_elems)
}

/// Element range (absolute, within the buffer) of chunk `chunk` of segment range `seg`; empty when
/// the segment is shorter than `chunk × chunk_elems`.
pub fn chunk_range(seg: Range<usize>, chunk_elems: usize, chunk: usize) -> Range<usize> {
    let start = (seg.start + chunk * chunk_elems).min(seg.end);
    let end = (start + chunk_elems).min(seg.end);
    start..end
}

impl RingSpec {
    /// A spec with every edge on `transport`.
    pub fn new(
        world: usize,
        count: usize,
        chunk_elems: usize,
        slots: usize,
        transport: EdgeTransport,
    ) -> RingSpec {
        RingSpec {
            world,
            count,
            in_place: true,
            op: ReduceOp::Sum,
            chunk_elems,
            slots,
            align_elems: 1,
            transports: vec![transport; world],
        }
    }

    /// Chunk length actually used: `chunk_elems`, but no longer than the longest segment (so a
    /// small message does not get staging slots sized for a large one) and no shorter than a
    /// [`super::max_chunks`]th of it, rounded up to a multiple of `align_elems`.
    pub fn effective_chunk(&self) -> usize {
        let (world, align) = (self.world.max(1), self.align_elems.max(1));
        // Segment 0 is the longest but for the last one, which also takes the unaligned tail.
        let longest = segment_range(self.count, world, align, 0)
            .len()
            .max(segment_range(self.count, world, align, world - 1).len());
        super::push::chunk_len(self, longest)
    }

    /// The checks every planner makes on the shared parameters (world, chunking, slots, edges).
    pub(super) fn check_common(&self) -> Result<()> {
        self.validate()
    }

    fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::InvalidArgument(what));
        if self.world == 0 {
            return bad("world must be at least 1".into());
        }
        if self.chunk_elems == 0 || self.slots == 0 || self.align_elems == 0 {
            return bad(format!(
                "chunk_elems ({}), slots ({}) and align_elems ({}) must be at least 1",
                self.chunk_elems, self.slots, self.align_elems
            ));
        }
        if self.transports.len() != self.world {
            return bad(format!(
                "{} edge transports for a ring of {} ranks",
                self.transports.len(),
                self.world
            ));
        }
        if self.effective_chunk().checked_mul(self.slots).is_none() {
            return bad("chunk_elems × slots overflows".into());
        }
        Ok(())
    }

    /// Compiles the spec into a plan (see the module doc of [`crate::plan`]).
    pub fn build(&self) -> Result<Plan> {
        self.validate()?;
        let mut b = Builder::new(self);
        b.entry();
        if self.world == 1 {
            b.single_rank();
        } else {
            b.ring();
        }
        b.finish();
        Ok(b.push.plan)
    }
}

/// The ring all-reduce's emission over the shared [`Pusher`]: its own Entry waits and finish.
struct Builder<'a> {
    push: Pusher<'a>,
}

impl<'a> Builder<'a> {
    fn new(spec: &'a RingSpec) -> Builder<'a> {
        let n = spec.world;
        let chunk = spec.effective_chunk();
        let mut plan = Pusher::empty_plan(spec, super::Collective::AllReduce);
        for rank in 0..n {
            plan.declare_callers(rank);
            if n > 1 && spec.count > 0 {
                let len = spec.slots * chunk;
                plan.buffers.push(BufferDecl {
                    rank,
                    kind: BufKind::Slots,
                    len,
                });
                if spec.transports[rank] == EdgeTransport::Staged {
                    plan.buffers.push(BufferDecl {
                        rank,
                        kind: BufKind::HostSlots,
                        len,
                    });
                }
            }
        }
        Builder {
            push: Pusher::new(spec, chunk, plan, &[], false),
        }
    }

    fn buf(&self, rank: usize, kind: BufKind) -> BufId {
        self.push.buf(rank, kind)
    }

    /// The buffer a rank's own contribution is read from.
    fn source(&self, rank: usize) -> BufId {
        self.buf(
            rank,
            if self.push.spec.in_place {
                BufKind::Output
            } else {
                BufKind::Input
            },
        )
    }

    /// Streams a rank will use besides Main.
    fn side_streams(&self, rank: usize) -> Vec<StreamKind> {
        let spec = self.push.spec;
        let n = spec.world;
        if n == 1 || spec.count == 0 {
            return Vec::new();
        }
        let mut s = vec![StreamKind::Send, StreamKind::Reduce];
        if spec.transports[recv_from(rank, n)] == EdgeTransport::Staged {
            s.push(StreamKind::Recv);
        }
        s
    }

    /// Every rank records Entry on Main and its side streams wait on it, so a call starts only
    /// after the caller's earlier work on Main (and the previous call's finish).
    ///
    /// Over a staged edge the sender's send stream also waits on the receiver's Entry: the
    /// receiver's last host→device copy of the previous call reads the sender's host slots, and
    /// nothing else orders the next call's first device→host copy after it (the checker's two-call
    /// race check finds that race when this wait is dropped). Over a peer edge no such wait is
    /// needed: every reduce feeds a later send that every rank's finish waits on, so the chain of
    /// events already orders a call's first push after the previous call's last read of the slot.
    fn entry(&mut self) {
        let spec = self.push.spec;
        let n = spec.world;
        self.push.record_entries();
        for rank in 0..n {
            for stream in self.side_streams(rank) {
                let own = self.push.entry[rank];
                self.push.wait(rank, stream, own, Tag::ENTRY);
            }
            if n > 1 && spec.count > 0 && spec.transports[rank] == EdgeTransport::Staged {
                let next = self.push.entry[send_to(rank, n)];
                self.push.wait(rank, StreamKind::Send, next, Tag::ENTRY);
            }
        }
    }

    fn single_rank(&mut self) {
        let spec = self.push.spec;
        if !spec.in_place && spec.count > 0 {
            let src = region(self.buf(0, BufKind::Input), 0..spec.count);
            let dst = region(self.buf(0, BufKind::Output), 0..spec.count);
            self.push
                .local_copy(0, StreamKind::Main, src, dst, None, Tag::ENTRY);
        }
    }

    fn ring(&mut self) {
        let spec = self.push.spec;
        let n = spec.world;
        let chunk_elems = self.push.chunk;
        let chunks = chunks_per_segment(spec.count, n, spec.align_elems, chunk_elems);
        // ready[rank][chunk]: the event after which chunk `chunk` of the segment rank just
        // received is final in its output, for the current step.
        let mut ready: Vec<Vec<Option<EventId>>> = vec![vec![None; chunks]; n];
        for phase in [Phase::ReduceScatter, Phase::AllGather] {
            for step in 0..n - 1 {
                let mut next_ready = vec![vec![None; chunks]; n];
                for chunk in 0..chunks {
                    #[allow(clippy::needless_range_loop)] // `sender` is a rank, not just an index
                    for sender in 0..n {
                        let tag = Tag { phase, step, chunk };
                        let seg = send_segment(phase, sender, step, n);
                        let range = chunk_range(
                            segment_range(spec.count, n, spec.align_elems, seg),
                            chunk_elems,
                            chunk,
                        );
                        if range.is_empty() {
                            continue;
                        }
                        // Reduce-scatter step 0 sends the sender's own input; every later send
                        // forwards what the sender finished in its previous step.
                        let first = phase == Phase::ReduceScatter && step == 0;
                        let after = if first { None } else { ready[sender][chunk] };
                        let src_buf = if first {
                            self.source(sender)
                        } else {
                            self.buf(sender, BufKind::Output)
                        };
                        let receiver = send_to(sender, n);
                        let out = region(self.buf(receiver, BufKind::Output), range.clone());
                        let landing = if phase == Phase::ReduceScatter {
                            Landing::Reduce {
                                own: region(self.source(receiver), range.clone()),
                                dst: out,
                                scale: self.push.plan.average && step + 2 == n,
                            }
                        } else {
                            Landing::Final(out)
                        };
                        let src = region(src_buf, range);
                        let landed = self
                            .push
                            .transfer(sender, receiver, src, landing, after, tag);
                        next_ready[receiver][chunk] = Some(landed);
                    }
                }
                ready = next_ready;
            }
        }
    }

    /// Main waits on the last record of every stream that wrote into this rank's memory: its own
    /// side streams and, for peer pushes, the sender's send stream.
    fn finish(&mut self) {
        let spec = self.push.spec;
        let n = spec.world;
        for rank in 0..n {
            for stream in self.side_streams(rank) {
                let last = self.push.record(rank, stream, Tag::FINISH, "done");
                self.push.wait(rank, StreamKind::Main, last, Tag::FINISH);
            }
        }
        for rank in 0..n {
            let prev = recv_from(rank, n);
            if prev != rank && spec.count > 0 && spec.transports[prev] == EdgeTransport::Peer {
                if let Some(last) = self.push.last_record[prev][StreamKind::Send.index()] {
                    self.push.wait(rank, StreamKind::Main, last, Tag::FINISH);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table in the module doc of `plan`, for world = 3, written out by hand.
    #[test]
    fn segment_formulas_match_the_doc_table() {
        let n = 3;
        // (phase, step, rank) -> (sends, receives)
        let rs = [
            // step 0: rank 0 sends A(0), receives C(2); rank 1 sends B(1), receives A(0); ...
            [(0, 2), (1, 0), (2, 1)],
            // step 1: rank 0 sends C(2) (received at step 0), receives B(1)
            [(2, 1), (0, 2), (1, 0)],
        ];
        let ag = [[(1, 0), (2, 1), (0, 2)], [(0, 2), (1, 0), (2, 1)]];
        for step in 0..2 {
            for rank in 0..n {
                assert_eq!(
                    (
                        send_segment(Phase::ReduceScatter, rank, step, n),
                        recv_segment(Phase::ReduceScatter, rank, step, n)
                    ),
                    rs[step][rank],
                    "reduce-scatter step {step} rank {rank}"
                );
                assert_eq!(
                    (
                        send_segment(Phase::AllGather, rank, step, n),
                        recv_segment(Phase::AllGather, rank, step, n)
                    ),
                    ag[step][rank],
                    "all-gather step {step} rank {rank}"
                );
            }
            // After the last reduce-scatter step, rank r received its owned segment r + 1.
        }
        for rank in 0..n {
            assert_eq!(
                recv_segment(Phase::ReduceScatter, rank, n - 2, n),
                owned_segment(rank, n)
            );
            // All-gather step 0 sends the owned segment.
            assert_eq!(
                send_segment(Phase::AllGather, rank, 0, n),
                owned_segment(rank, n)
            );
        }
    }

    #[test]
    fn forwarding_chain_holds_for_many_worlds() {
        // What rank r receives at step s is what it sends at step s + 1, in both phases.
        for n in 2..=16 {
            for r in 0..n {
                for s in 0..n - 2 {
                    for phase in [Phase::ReduceScatter, Phase::AllGather] {
                        assert_eq!(
                            recv_segment(phase, r, s, n),
                            send_segment(phase, r, s + 1, n)
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn segments_tile_the_buffer() {
        for count in [0, 1, 2, 7, 16, 17, 100, 1009] {
            for world in 1..=9 {
                for align in [1, 4, 8] {
                    let mut next = 0;
                    for seg in 0..world {
                        let r = segment_range(count, world, align, seg);
                        assert_eq!(r.start, next, "count {count} world {world} align {align}");
                        assert!(r.start % align == 0);
                        next = r.end;
                    }
                    assert_eq!(next, count);
                }
            }
        }
        // 10 elements, 3 ranks, align 1: 4 3 3
        assert_eq!(segment_range(10, 3, 1, 0), 0..4);
        assert_eq!(segment_range(10, 3, 1, 2), 7..10);
        // 10 elements, 3 ranks, align 4: units 2 → 4 4 and the tail of 2 → 0..4, 4..8, 8..10
        assert_eq!(segment_range(10, 3, 4, 1), 4..8);
        assert_eq!(segment_range(10, 3, 4, 2), 8..10);
    }

    #[test]
    fn chunks_cover_a_segment_in_order() {
        let seg = 10..27;
        let chunks: Vec<_> = (0..4).map(|c| chunk_range(seg.clone(), 5, c)).collect();
        assert_eq!(chunks, vec![10..15, 15..20, 20..25, 25..27]);
        assert!(chunk_range(seg, 5, 4).is_empty());
        assert_eq!(chunks_per_segment(17, 1, 1, 5), 4);
        assert_eq!(chunks_per_segment(0, 4, 1, 5), 0);
    }

    #[test]
    fn bad_specs_are_errors() {
        let mut spec = RingSpec::new(2, 10, 0, 1, EdgeTransport::Peer);
        assert!(spec.build().is_err());
        spec.chunk_elems = 4;
        spec.transports.pop();
        assert!(spec.build().is_err());
        assert!(RingSpec::new(0, 10, 1, 1, EdgeTransport::Peer)
            .build()
            .is_err());
    }
}
