//! A call's slot in its rank's control segment, and the two ways ranks compare calls: every
//! call is published ([`Job::publish`]: its number, shape and buffers into slot number mod
//! `CALL_SLOTS`, then the `PUBLISHED` word) without waiting for any peer, and then checked
//! against every peer's call of the same number — by the host ([`Job::meet`], which waits for
//! the peers to publish it; the `MET` word) or by the GPU's call gate (`cuda/gate.cuh`, which
//! reads the same words through the driver's mapping of the segments; the `GATED` word, and
//! `FAULT` for a call it found different: [`Job::gate_fault`]).
//!
//! Invariant: a slot is rewritten only once every rank, its own GPU's gate included, has checked
//! the call in it (its `MET` or `GATED` has reached that call, and each says every earlier call
//! is checked too): a host may run `CALL_SLOTS` calls ahead of the slowest rank's check, and
//! waits in [`Job::publish`] only beyond that.

use super::{
    peer_failure, CallShape, CallerRefs, Job, ABORT, CALL_SLOTS, FAULT, GATED, MET, PUBLISHED,
    REF_WORDS, SHAPE_WORDS, SLOTS, SLOT_WORDS,
};
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Where the call gate finds a rank's words: indices of 64-bit words in a control segment, as
/// the peer kernels take them (`rr_gate_layout` in `cuda/gate.cuh`, field for field).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct GateLayout {
    pub(crate) published: u32,
    pub(crate) abort: u32,
    pub(crate) gated: u32,
    pub(crate) fault: u32,
    pub(crate) slots: u32,
    pub(crate) slot_words: u32,
    pub(crate) call_slots: u32,
    /// Words compared: the call number and the shape ([`Job::gate_layout`]), and for a call on
    /// symmetric registrations the refs too ([`GateLayout::with_refs`]).
    pub(crate) compared: u32,
}

impl GateLayout {
    /// This layout comparing the whole slot: the call number, the shape and where every rank's
    /// buffers lie (a call on symmetric registrations, whose peers' buffers each rank takes to
    /// lie where its own do).
    pub(crate) fn with_refs(self) -> GateLayout {
        GateLayout {
            compared: SLOT_WORDS as u32,
            ..self
        }
    }

    /// No words (a kernel without a gate).
    pub(crate) const ZERO: GateLayout = GateLayout {
        published: 0,
        abort: 0,
        gated: 0,
        fault: 0,
        slots: 0,
        slot_words: 0,
        call_slots: 0,
        compared: 0,
    };
}

/// The first word of call `seq`'s slot.
fn slot(seq: u64) -> usize {
    SLOTS + (seq % CALL_SLOTS as u64) as usize * SLOT_WORDS
}

impl Job {
    /// The layout of every control segment, for the call gate.
    pub(crate) fn gate_layout() -> GateLayout {
        GateLayout {
            published: PUBLISHED as u32,
            abort: ABORT as u32,
            gated: GATED as u32,
            fault: FAULT as u32,
            slots: SLOTS as u32,
            slot_words: SLOT_WORDS as u32,
            call_slots: CALL_SLOTS as u32,
            compared: (1 + SHAPE_WORDS) as u32,
        }
    }

    /// The last call rank `q` checked against its peers, by host or GPU — with every call
    /// before it: `GATED` follows the rank's stream, and `MET` passes a call the gate has not
    /// reached yet only once it has (`Job::meet`).
    fn checked(&self, q: usize) -> u64 {
        let met = self.control_word(q, MET).load(Ordering::Acquire);
        met.max(self.control_word(q, GATED).load(Ordering::Acquire))
    }

    /// Publishes this rank's next call — its `shape` and where its buffers lie (`refs`) — and
    /// returns its number. Waits only while a peer has not yet checked the call published
    /// `CALL_SLOTS` calls ago (whose slot this one takes), until `deadline` (`timeout` after
    /// the call began), ending early on this rank's abort or a peer's failure.
    pub(crate) fn publish(
        &self,
        shape: CallShape,
        refs: CallerRefs,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<u64> {
        let (seq, rank) = (self.seq() + 1, self.rank);
        if let Some(previous) = seq.checked_sub(CALL_SLOTS as u64).filter(|&p| p > 0) {
            // Every rank — this one's own gate among them — is done with the slot.
            let done = |q| self.checked(q) >= previous;
            self.wait_for(seq, "checked", true, done, deadline, timeout)?;
        }
        let at = slot(seq);
        let refs = refs.words();
        let words = shape.0.iter().chain(refs.iter());
        for (i, w) in words.enumerate() {
            self.control_word(rank, at + 1 + i)
                .store(*w, Ordering::Relaxed);
        }
        self.control_word(rank, at).store(seq, Ordering::Relaxed);
        self.control_word(rank, PUBLISHED)
            .store(seq, Ordering::Release);
        self.seq.store(seq, Ordering::Relaxed);
        Ok(seq)
    }

    /// Checks call `seq` (this rank's latest, published) against every peer's call of that
    /// number on the host: waits (until `deadline`, `timeout` after the call began) until every
    /// peer has published it, then compares. Ranks that make different calls all get
    /// [`Error::CallMismatch`]. Returns every rank's refs of the call, by rank, read before this
    /// rank lets the peers reuse its slot.
    pub(crate) fn meet(
        &self,
        seq: u64,
        shape: CallShape,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Vec<CallerRefs>> {
        let published = |q| self.control_word(q, PUBLISHED).load(Ordering::Acquire) >= seq;
        self.wait_for(seq, "started", false, published, deadline, timeout)
            .map_err(|failure| self.mismatch(seq, shape).unwrap_or(failure))?;
        if let Some(err) = self.mismatch(seq, shape) {
            return Err(err);
        }
        let refs = self.refs(seq);
        // `MET` says every call up to it is checked: past a call left to the gate only once the
        // gate has passed it (else a peer could reuse that call's slot before the gate reads it).
        let gated = self.control_word(self.rank, GATED).load(Ordering::Acquire);
        let met = match gated >= self.last_gated.load(Ordering::Relaxed) {
            true => seq,
            false => gated,
        };
        self.control_word(self.rank, MET)
            .fetch_max(met, Ordering::Release);
        Ok(refs)
    }

    /// Call `seq`, published, is left to this rank's GPU gate (`cuda/gate.cuh`).
    pub(crate) fn gating(&self, seq: u64) {
        self.last_gated.fetch_max(seq, Ordering::Relaxed);
    }

    /// [`Job::publish`] then [`Job::meet`]: the call's number.
    pub(crate) fn start_call(
        &self,
        shape: CallShape,
        refs: CallerRefs,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<u64> {
        let seq = self.publish(shape, refs, deadline, timeout)?;
        self.meet(seq, shape, deadline, timeout)?;
        Ok(seq)
    }

    /// Waits until `ready(q)` holds for every peer q (and this rank, with `own`), for call `seq`
    /// (named `what` in a timeout: "started", "checked"); ends early on this rank's abort, a
    /// peer's failure or `deadline`.
    fn wait_for(
        &self,
        seq: u64,
        what: &str,
        own: bool,
        ready: impl Fn(usize) -> bool,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<()> {
        let (rank, start) = (self.rank, Instant::now());
        let mut next_liveness = start;
        for q in (0..self.control.len()).filter(|&q| own || q != rank) {
            while !ready(q) {
                if let Some(aborted) = self.aborted_error() {
                    return Err(aborted);
                }
                peer_failure(
                    &self.control,
                    &self.processes,
                    rank,
                    seq,
                    &mut next_liveness,
                )
                .map_err(|err| self.named_mismatch(None).unwrap_or(err))?;
                if Instant::now() >= deadline {
                    return Err(Error::Timeout {
                        rank: q,
                        waiting_on: format!(
                            "has not {what} call {seq} (rank {rank} waited for it)"
                        ),
                        after: timeout,
                    });
                }
                crate::exec::pace::PEERS.rest(start.elapsed());
            }
        }
        Ok(())
    }

    /// Rank `q`'s call `seq` as it published it, while its slot still holds it.
    fn published(&self, q: usize, seq: u64) -> Option<(CallShape, CallerRefs)> {
        let at = slot(seq);
        let read = |i: usize| self.control_word(q, at + i).load(Ordering::Relaxed);
        if self.control_word(q, PUBLISHED).load(Ordering::Acquire) < seq || read(0) != seq {
            return None;
        }
        let mut shape = [0u64; SHAPE_WORDS];
        for (i, w) in shape.iter_mut().enumerate() {
            *w = read(1 + i);
        }
        let mut refs = [0u64; REF_WORDS];
        for (i, w) in refs.iter_mut().enumerate() {
            *w = read(1 + SHAPE_WORDS + i);
        }
        Some((CallShape(shape), CallerRefs::from_words(refs)))
    }

    /// Every rank's refs of call `seq`, by rank, as [`Job::meet`] reads them (every peer
    /// published it, and none rewrites its slot before this rank's `MET` has passed it).
    fn refs(&self, seq: u64) -> Vec<CallerRefs> {
        (0..self.control.len())
            .map(|q| {
                self.published(q, seq)
                    .map(|(_, refs)| refs)
                    .unwrap_or_default()
            })
            .collect()
    }

    /// The first peer that published call `seq` with another shape than `shape`, as the error.
    fn mismatch(&self, seq: u64, shape: CallShape) -> Option<Error> {
        (0..self.control.len())
            .filter(|&q| q != self.rank)
            .find_map(|q| {
                let (theirs, _) = self.published(q, seq)?;
                (theirs != shape).then(|| Error::CallMismatch {
                    rank: q,
                    theirs: theirs.describe(),
                    this: self.rank,
                    ours: shape.describe(),
                })
            })
    }

    /// The call this rank's GPU found different from a peer's (its gate's `FAULT` word), as
    /// the error: both calls described while their slots still hold them.
    pub(crate) fn gate_fault(&self) -> Option<Error> {
        let fault = self.control_word(self.rank, FAULT).load(Ordering::Acquire);
        if fault == 0 {
            return None;
        }
        let (seq, q) = (fault >> 16, ((fault & 0xffff) as usize).saturating_sub(1));
        // Calls alike but for where their buffers lie (symmetric registrations) say where.
        let calls = [q, self.rank].map(|rank| self.published(rank, seq));
        let refs_differ = matches!(&calls, [Some((a, _)), Some((b, _))] if a == b);
        let describe = |call: &Option<(CallShape, CallerRefs)>| {
            call.map_or_else(
                || format!("call {seq} (no longer at hand)"),
                |(shape, refs)| match refs_differ {
                    true => format!("{}, {}", shape.describe(), refs.describe()),
                    false => shape.describe(),
                },
            )
        };
        Some(Error::CallMismatch {
            rank: q,
            theirs: describe(&calls[0]),
            this: self.rank,
            ours: describe(&calls[1]),
        })
    }

    /// The mismatch behind a peer's failure, as this rank names it: where a peer's gate found
    /// its call different from another's (its `FAULT` word: the first failure of the job, which
    /// the peers' aborts follow), the first rank whose published call of that number differs
    /// from this rank's — published, or `next`, the call this rank is about to publish — so
    /// that ranks whose own gates had not run when a peer gave the call up (their kernels
    /// stopped once a peer failed, or the call not yet published) name the mismatch too, as
    /// their gates would have, not only that a peer failed. `None`: no peer's gate found one,
    /// or the calls are no longer at hand.
    pub(crate) fn named_mismatch(&self, next: Option<CallShape>) -> Option<Error> {
        let seq = (0..self.control.len())
            .filter(|&q| q != self.rank)
            .map(|q| self.control_word(q, FAULT).load(Ordering::Acquire))
            .find(|&f| f != 0)?
            >> 16;
        let ours = match self.published(self.rank, seq) {
            Some((ours, _)) => ours,
            None => next.filter(|_| seq == self.seq() + 1)?,
        };
        let (q, theirs) = (0..self.control.len())
            .filter(|&q| q != self.rank)
            .find_map(|q| match self.published(q, seq)? {
                (theirs, _) if theirs != ours => Some((q, theirs)),
                _ => None,
            })?;
        Some(Error::CallMismatch {
            rank: q,
            theirs: theirs.describe(),
            this: self.rank,
            ours: ours.describe(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element::{DType, ReduceOp};
    use crate::exec::shm::Segment;
    use crate::exec::Shape;
    use crate::plan::Collective;
    use std::sync::atomic::{AtomicBool, AtomicU64};
    use std::sync::Arc;

    /// Three ranks' jobs over one set of control segments, in this process.
    fn three_jobs(tag: &str) -> Vec<Job> {
        let prefix = format!("/ringreduce-test-{}-{tag}", std::process::id());
        let control: Vec<Segment> = (0..3)
            .map(|q| {
                let mut seg =
                    Segment::create(&format!("{prefix}-{q}"), super::super::CONTROL_BYTES).unwrap();
                seg.unlink();
                seg
            })
            .collect();
        let (control, processes) = (Arc::new(control), Arc::new(Vec::new()));
        (0..3)
            .map(|rank| Job {
                rank,
                prefix: prefix.clone(),
                control: control.clone(),
                processes: processes.clone(),
                seq: AtomicU64::new(0),
                last_gated: AtomicU64::new(0),
                aborted: AtomicBool::new(false),
                channel: AtomicBool::new(false),
            })
            .collect()
    }

    #[test]
    fn a_dead_peer_is_lost_while_channel_kernels_are_in_flight_whatever_it_finished() {
        let mut dead = std::process::Command::new("true").spawn().unwrap();
        dead.wait().unwrap();
        let here = |pid| super::super::Process { pid, here: true };
        let processes = Arc::new(vec![here(std::process::id()), here(dead.id()), here(1)]);
        let job = three_jobs("channel-dead").swap_remove(0);
        let job = Job { processes, ..job };
        // No call yet: a peer gone having finished every call so far is no loss.
        assert!(job.failed_peer().is_none());
        job.channel_launched();
        let lost = job.failed_peer().expect("rank 1's process is gone");
        assert!(
            matches!(lost, Error::RankFailed { rank: 1, .. }),
            "{lost:?}"
        );
        // Once this rank's work is seen complete, no longer.
        job.finished(0);
        assert!(job.failed_peer().is_none());
    }

    fn all_reduce_of(count: usize) -> CallShape {
        let shape = Shape::collective::<f32>(Collective::AllReduce, count, true, ReduceOp::Sum);
        CallShape::of(&shape, DType::F32, ReduceOp::Sum)
    }

    /// Rank 1's call 1 differs from rank 0's, and rank 0's gate found it (its `FAULT` word);
    /// rank 2 never ran its gate: it names rank 1's call against its own — published, or the
    /// one it is about to publish — and rank 1 names rank 0's. No gate's finding: nothing named.
    #[test]
    fn a_mismatch_a_peers_gate_found_is_named_by_a_rank_whose_gate_did_not_run() {
        let jobs = three_jobs("named");
        let (same, other) = (all_reduce_of(64), all_reduce_of(65));
        let far = Instant::now() + Duration::from_secs(5);
        let publish = |rank: usize, call| {
            let refs = CallerRefs::default();
            jobs[rank]
                .publish(call, refs, far, Duration::from_secs(5))
                .unwrap()
        };
        assert_eq!(publish(0, same), 1);
        assert_eq!(publish(1, other), 1);
        assert!(
            jobs[2].named_mismatch(Some(same)).is_none(),
            "no gate found one"
        );
        jobs[0]
            .control_word(0, FAULT)
            .store((1 << 16) | 2, Ordering::Release);
        let named = |err: Option<Error>| match err {
            Some(Error::CallMismatch {
                rank,
                this,
                theirs,
                ours,
            }) => (rank, this, theirs, ours),
            other => panic!("{other:?}"),
        };
        let (rank, this, theirs, ours) = named(jobs[2].named_mismatch(Some(same)));
        assert_eq!((rank, this), (1, 2));
        assert!(
            theirs.contains("65 elements") && ours.contains("64 elements"),
            "{theirs} / {ours}"
        );
        assert!(
            jobs[2].named_mismatch(None).is_none(),
            "rank 2's call 1 is not published"
        );
        publish(2, same);
        assert_eq!(named(jobs[2].named_mismatch(None)).0, 1);
        let (rank, this, ..) = named(jobs[1].named_mismatch(None));
        assert_eq!((rank, this), (0, 1));
    }

    #[test]
    fn every_slot_lies_inside_the_segment_and_calls_a_lap_apart_share_one() {
        let last = slot(CALL_SLOTS as u64 - 1) + SLOT_WORDS;
        assert!(last <= super::super::CONTROL_WORDS);
        const { assert!(super::super::CONTROL_WORDS * 8 <= super::super::CONTROL_BYTES) };
        assert_eq!(slot(3), slot(3 + CALL_SLOTS as u64));
        assert_ne!(slot(3), slot(4));
        let layout = Job::gate_layout();
        assert!(layout.compared as usize <= SLOT_WORDS);
        assert!([PUBLISHED, ABORT, GATED, FAULT].iter().all(|&w| w < SLOTS));
    }
}
