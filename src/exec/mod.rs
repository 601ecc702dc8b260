//! Executors: run a checked [`Plan`] for real.
//!
//! Both executors share one shape, the one the multi-GPU article teaches: each rank's program
//! is walked in order and only *enqueued* — onto host worker threads in [`host`], onto CUDA
//! streams in [`cuda`]. Streams run their operations in order; the only ordering between
//! streams is an event: `Record` on one stream, `Wait` on another.
//!
//! Between ranks the two differ in how a wait finds its record. The host executor keeps CUDA's
//! event semantics exactly, with the **event handoff** (`enqueue_rank`): a wait captures the
//! event's latest record *at the moment it is enqueued*, so a wait on another rank's event is
//! enqueued only after that rank's thread has enqueued the record and told us so over a
//! channel. Enqueue the wait first and CUDA treats it as already satisfied: the classic silent
//! bug, which the host executor reproduces (a wait on a never-recorded event is a no-op), so a
//! plan that relied on luck fails there too. The GPU executor keeps events within a rank and
//! carries every wait for another rank's event through a counter in memory that the recorder
//! advances (module `cuda::executor::capture`): a count pairs the k-th signal with the k-th wait
//! whatever the order of enqueueing, so its ranks enqueue independently — from any thread, in
//! any process — and none waits on the host for a peer. The checker proves plans for both: its
//! enqueue simulation is the handoff's order, one order the counters allow too, and its shape
//! check the counters' pairing rule (a stream waits for a remote event at most once per call).

pub mod algorithm;
pub mod config;
pub mod cuda;
pub(crate) mod fds;
pub mod hierarchy;
pub mod host;
pub(crate) mod job;
pub mod nccl;
pub(crate) mod pace;
pub mod profile;
pub mod rendezvous;
pub(crate) mod shm;

pub(crate) use crate::error::panic_message;
pub use algorithm::Algorithm;

use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::plan::{
    BufKind, BufferDecl, Collective, CollectiveSpec, EdgeTransport, EventId, Gather, Instr,
    OneShotSpec, Op, Plan, RingSpec,
};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a prepared plan is cached under: everything about a call but its buffers' addresses.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Shape {
    pub(crate) collective: Collective,
    pub(crate) count: usize,
    pub(crate) in_place: bool,
    pub(crate) average: bool,
    pub(crate) elem_bytes: usize,
    /// Every rank's buffers lie in memory it registered, which ranks in other processes reach
    /// directly (GPU ranks, `exec::cuda::executor::registered`); otherwise such ranks copy their
    /// buffers through memory they export. The plans differ, so they are cached apart.
    pub(crate) registered: bool,
    /// The whole call this is a piece of (`cuda::executor`'s module `pieces`): its count, or a
    /// send/recv's transfers folded (`plan::sendrecv::folded`); 0: a whole call. A piece of a
    /// reduce-scatter, all-gather or all-to-all finds its blocks of the caller's buffers this
    /// many elements apart, not `count`, so it stages them differently: cached apart.
    pub(crate) piece_of: usize,
}

impl Shape {
    /// The shape of any collective (`Avg` counts only where the collective reduces).
    pub(crate) fn collective<T: Element>(
        collective: Collective,
        count: usize,
        in_place: bool,
        op: ReduceOp,
    ) -> Shape {
        Shape {
            average: op == ReduceOp::Avg && collective.reduces(),
            collective,
            count,
            in_place,
            elem_bytes: std::mem::size_of::<T>(),
            registered: false,
            piece_of: 0,
        }
    }

    /// The element count an automatic ring chunk is sized from (as for an all-reduce of that
    /// many): the collective's count, except for send/recv, whose count is 0 and whose
    /// transfers carry their own: there `world` × its longest transfer, so that a chunk is cut
    /// from a transfer as a segment is from an all-reduce.
    pub(crate) fn chunking_count(&self, world: usize) -> usize {
        match &self.collective {
            Collective::SendRecv { transfers } => transfers
                .iter()
                .map(|t| t.count)
                .max()
                .unwrap_or(0)
                .saturating_mul(world),
            _ => self.count,
        }
    }

    /// The operator as the plans see it: only `Avg` changes a plan (it adds the scaling).
    fn plan_op(&self) -> ReduceOp {
        if self.average {
            ReduceOp::Avg
        } else {
            ReduceOp::Sum
        }
    }

    /// The ring's parameters for this shape (the other collectives' planners share them).
    fn ring_spec(
        &self,
        chunk_elems: usize,
        slots: usize,
        align_elems: usize,
        transports: Vec<EdgeTransport>,
    ) -> RingSpec {
        RingSpec {
            world: transports.len().max(1),
            count: self.count,
            in_place: self.in_place,
            op: self.plan_op(),
            chunk_elems,
            slots,
            align_elems,
            transports,
        }
    }

    /// Builds the staged one-shot all-reduce for this shape over `world` ranks
    /// ([`crate::plan::staged`]) and proves it with the checker, reach included: it runs on
    /// ranks without peer access.
    pub(crate) fn checked_staged_oneshot_plan(&self, world: usize) -> Result<Plan> {
        let plan = self.oneshot_spec(world, self.count).build_staged()?;
        crate::check::check_staged(&plan)?;
        Ok(plan)
    }

    /// Builds the two-shot plan for this shape over `world` ranks (segments aligned to
    /// `align_elems`, gathered as the executor runs it: [`Gather`]) and proves it with the
    /// checker.
    pub(crate) fn checked_twoshot_plan(
        &self,
        world: usize,
        align_elems: usize,
        gather: Gather,
    ) -> Result<Plan> {
        let plan = crate::plan::TwoShotSpec {
            world,
            count: self.count,
            in_place: self.in_place,
            op: self.plan_op(),
            align: align_elems,
            gather,
        }
        .build()?;
        crate::check::check(&plan)?;
        Ok(plan)
    }

    /// The one-shot plan for this shape over `world` ranks, of `count` elements, built (not yet
    /// proven).
    fn oneshot_plan(&self, world: usize, count: usize) -> Result<Plan> {
        self.oneshot_spec(world, count)
            .build_collective(&self.collective)
    }

    /// The one-shot spec of this shape over `world` ranks of `count` elements.
    fn oneshot_spec(&self, world: usize, count: usize) -> OneShotSpec {
        OneShotSpec {
            world,
            count,
            in_place: self.in_place,
            op: self.plan_op(),
        }
    }
}

/// The address of a caller's buffer in a call: rank r's input and output are `inputs[r]` and
/// `outputs[r]`; transfer i's send and receive buffers are `inputs[i]` and `outputs[i]` (the
/// communicator lays them out so). `None` for the memory a prepared plan owns.
pub(crate) fn caller_address(decl: &BufferDecl, inputs: &[u64], outputs: &[u64]) -> Option<u64> {
    let at = |list: &[u64], i: usize| list.get(i).copied();
    match decl.kind {
        BufKind::Input => at(inputs, decl.rank),
        BufKind::Output => at(outputs, decl.rank),
        BufKind::SendBuf(i) => at(inputs, i),
        BufKind::RecvBuf(i) => at(outputs, i),
        BufKind::Slots
        | BufKind::HostSlots
        | BufKind::Exposed
        | BufKind::HostExposed
        | BufKind::Scratch => None,
    }
}

/// Prepared plans by shape, oldest first, at most `capacity` of them; the one-element one-shot
/// plans proven so far, by (collective, world, in place, `Avg`), which prove every other count's
/// one-shot by
/// the scaling lemma ([`crate::check::scaled_from`]); and the coarse forms of the ring plans
/// proven so far, which prove every ring plan of the same coarse form by the cell lemma
/// ([`crate::check::coarsen`]) — a message size never seen before costs a plan build and a
/// comparison, not the four checks.
pub(crate) struct PlanCache<P> {
    capacity: usize,
    entries: VecDeque<(Shape, Arc<P>)>,
    units: HashMap<(Collective, usize, bool, bool), Plan>,
    coarse: VecDeque<Plan>,
}

/// Coarse forms of ring plans kept proven per communicator, newest first out last (a family of
/// counts shares a handful: `tests/plan_check.rs`).
const COARSE_FORMS_KEPT: usize = 32;

impl<P> PlanCache<P> {
    pub(crate) fn new(capacity: usize) -> PlanCache<P> {
        PlanCache {
            capacity: capacity.max(1),
            entries: VecDeque::new(),
            units: HashMap::new(),
            coarse: VecDeque::new(),
        }
    }

    /// The ring form of `shape`'s collective — any collective: the all-reduce's ring, the
    /// other collectives' ring-family planners, which share its parameters ([`CollectiveSpec`])
    /// — proven: by the cell lemma, when its coarse form is one proven before (a comparison) or
    /// passes the four checks now (then remembered); by the four checks on the plan itself where
    /// the lemma declines it (every collective but the all-reduce: [`crate::check::coarsen`]).
    /// An executor runs no plan the checker has not accepted.
    pub(crate) fn checked_ring_plan(
        &mut self,
        shape: &Shape,
        chunk_elems: usize,
        slots: usize,
        align_elems: usize,
        transports: Vec<EdgeTransport>,
    ) -> Result<Plan> {
        let plan = CollectiveSpec {
            collective: shape.collective.clone(),
            ring: shape.ring_spec(chunk_elems, slots, align_elems, transports),
        }
        .build()?;
        match crate::check::coarsen(&plan) {
            Some(coarse) if self.coarse.contains(&coarse) => {}
            Some(coarse) => {
                crate::check::check(&coarse)?;
                if self.coarse.len() >= COARSE_FORMS_KEPT {
                    self.coarse.pop_front();
                }
                self.coarse.push_back(coarse);
            }
            None => crate::check::check(&plan)?,
        }
        Ok(plan)
    }

    /// The one-shot plan of `shape` over `world` ranks — of any collective
    /// ([`OneShotSpec::build_collective`]) — proven: by the checker at zero elements and for a
    /// send/recv (its transfers carry their counts), and for the one-element plan once per
    /// collective, world and placement; by the scaling lemma against that one-element plan
    /// otherwise (the full check if the comparison ever fails).
    pub(crate) fn checked_oneshot_plan(&mut self, shape: &Shape, world: usize) -> Result<Plan> {
        let plan = shape.oneshot_plan(world, shape.count)?;
        if shape.count == 0 || matches!(shape.collective, Collective::SendRecv { .. }) {
            crate::check::check(&plan)?;
            return Ok(plan);
        }
        let key = (
            shape.collective.clone(),
            world,
            shape.in_place,
            shape.average,
        );
        let unit = match self.units.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let unit = shape.oneshot_plan(world, 1)?;
                crate::check::check(&unit)?;
                e.insert(unit)
            }
        };
        if crate::check::scaled_from(unit, &plan).is_none() {
            crate::check::check(&plan)?;
        }
        Ok(plan)
    }

    pub(crate) fn get(&self, shape: &Shape) -> Option<Arc<P>> {
        self.entries
            .iter()
            .find(|(s, _)| s == shape)
            .map(|(_, p)| p.clone())
    }

    /// Every prepared plan in the cache, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<P>> {
        self.entries.iter().map(|(_, p)| p)
    }

    /// Whether inserting one more entry will push out the oldest (callers whose plans may still
    /// be in use by enqueued work wait for it first).
    pub(crate) fn is_full(&self) -> bool {
        self.entries.len() >= self.capacity
    }

    /// Inserts a prepared plan, dropping the oldest beyond the capacity.
    pub(crate) fn insert(&mut self, shape: Shape, prepared: Arc<P>) {
        if self.is_full() {
            self.entries.pop_front();
        }
        self.entries.push_back((shape, prepared));
    }
}

/// Where a host rank thread puts the operations it enqueues.
pub(crate) trait Enqueue {
    /// Enqueues instruction `index` of this rank's program.
    fn enqueue(&mut self, index: usize, instr: &Instr) -> Result<()>;
}

/// A rank's end of the event handoff: an inbox of "event e of call c is now recorded" messages,
/// and the other ranks' inboxes.
pub(crate) struct Handoff {
    pub(crate) rank: usize,
    pub(crate) inbox: Receiver<(u64, EventId)>,
    pub(crate) outboxes: Vec<Sender<(u64, EventId)>>,
    /// Events of the current call handed to us so far.
    seen: Vec<bool>,
    call: u64,
    timeout: Duration,
}

impl Handoff {
    /// One handoff end per rank, connected as a full mesh: every rank holds every rank's inbox,
    /// since a plan may wait on any rank's event (an all-to-all's or a send/recv's copies go
    /// between any two ranks), not only a ring neighbour's.
    pub(crate) fn mesh(world: usize) -> Vec<Handoff> {
        let (txs, rxs): (Vec<_>, Vec<_>) =
            (0..world).map(|_| crossbeam_channel::unbounded()).unzip();
        rxs.into_iter()
            .enumerate()
            .map(|(rank, inbox)| Handoff {
                rank,
                inbox,
                outboxes: txs.clone(),
                seen: Vec::new(),
                call: 0,
                timeout: Duration::ZERO,
            })
            .collect()
    }

    fn begin(&mut self, call: u64, events: usize, timeout: Duration) {
        self.call = call;
        self.timeout = timeout;
        self.seen.clear();
        self.seen.resize(events, false);
    }

    /// Blocks until `event` of the current call is handed over, the deadline passes, or the call
    /// is aborted.
    fn await_record(
        &mut self,
        plan: &Plan,
        event: EventId,
        deadline: Instant,
        abort: &AtomicBool,
    ) -> Result<()> {
        while !self.seen[event.0] {
            if abort.load(Ordering::Acquire) {
                return Err(aborted(self.rank));
            }
            let slice = deadline.min(Instant::now() + Duration::from_millis(20));
            let next =
                spin_try_recv(&self.inbox).map_or_else(|| self.inbox.recv_deadline(slice), Ok);
            match next {
                Ok((call, e)) if call == self.call => self.seen[e.0] = true,
                Ok(_) => {} // a message left over from an aborted earlier call
                Err(RecvTimeoutError::Timeout) if Instant::now() < deadline => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(Error::Timeout {
                        rank: self.rank,
                        waiting_on: format!(
                            "was waiting to enqueue its wait for {}",
                            plan.events[event.0]
                        ),
                        after: self.timeout,
                    })
                }
                Err(RecvTimeoutError::Disconnected) => return Err(aborted(self.rank)),
            }
        }
        Ok(())
    }
}

/// How long a waiting thread of the host executor, or a rank enqueuing, keeps looking before it
/// sleeps. A thread put to sleep takes tens of microseconds to wake on a virtual machine's
/// cores — on host ranks a small call is a handful of such wake-ups — while the thing waited
/// for is usually microseconds away: a peer's record, a meeting's last arrival, the next call.
pub(crate) const SPIN: Duration = Duration::from_micros(50);

/// Looks at `ready` until it holds (`true`) or [`SPIN`] has passed (`false`), yielding the core
/// between looks so that a thread it waits for can run on it.
pub(crate) fn spin_until(mut ready: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        for _ in 0..32 {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        if start.elapsed() >= SPIN {
            return false;
        }
        std::thread::yield_now();
    }
}

/// The next message of `rx` if one comes within [`SPIN`] (looked for, never slept for);
/// `None` if none came or every sender is gone (a blocking receive then says which).
fn spin_try_recv<T>(rx: &Receiver<T>) -> Option<T> {
    let mut got = None;
    spin_until(|| match rx.try_recv() {
        Ok(v) => {
            got = Some(v);
            true
        }
        Err(crossbeam_channel::TryRecvError::Empty) => false,
        Err(crossbeam_channel::TryRecvError::Disconnected) => true,
    });
    got
}

/// The next message of `rx`: looked for for [`SPIN`] first, then waited for; `None` once every
/// sender is gone.
pub(crate) fn spin_recv<T>(rx: &Receiver<T>) -> Option<T> {
    spin_try_recv(rx).or_else(|| rx.recv().ok())
}

/// The error a rank reports when another rank's failure aborted the call.
pub(crate) fn aborted(rank: usize) -> Error {
    Error::RankFailed {
        rank,
        during: "a collective".into(),
        message: "aborted because another rank failed".into(),
    }
}

/// When a call must give up: its deadline (and the timeout it came from, for messages), and the
/// flag another rank sets when it fails.
#[derive(Clone, Copy)]
pub(crate) struct Limits<'a> {
    pub(crate) deadline: Instant,
    pub(crate) timeout: Duration,
    pub(crate) abort: &'a AtomicBool,
}

/// Walks rank `rank`'s program and enqueues it onto `backend`, with the event handoff: remote
/// waits block until the recorder hands the event over; records are handed to every rank that
/// waits on them (`waiters`, from [`Plan::remote_waiters`]).
pub(crate) fn enqueue_rank(
    plan: &Plan,
    waiters: &[Vec<usize>],
    call: u64,
    handoff: &mut Handoff,
    backend: &mut impl Enqueue,
    limits: Limits<'_>,
) -> Result<()> {
    let Limits {
        deadline,
        timeout,
        abort,
    } = limits;
    let rank = handoff.rank;
    handoff.begin(call, plan.events.len(), timeout);
    for (index, instr) in plan.ranks[rank].iter().enumerate() {
        if abort.load(Ordering::Acquire) {
            return Err(aborted(rank));
        }
        if let Op::Wait(e) = instr.op {
            if plan.events[e.0].rank != rank {
                handoff.await_record(plan, e, deadline, abort)?;
            }
        }
        backend.enqueue(index, instr)?;
        if let Op::Record(e) = instr.op {
            for &w in &waiters[e.0] {
                // A closed inbox means that rank's thread is gone; it will report its own failure.
                let _ = handoff.outboxes[w].send((call, e));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::cuda::executor::auto_chunk_bytes;
    use crate::plan::Transfer;

    /// Send/recv's shape has count 0: its automatic chunk must come from its transfers, or a
    /// transfer is cut into one-element chunks (a copy and two events per element).
    #[test]
    fn send_recv_chunks_follow_the_longest_transfer() {
        let transfers = vec![
            Transfer {
                from: 0,
                to: 1,
                count: 2 << 20,
            },
            Transfer {
                from: 1,
                to: 0,
                count: 5,
            },
        ];
        let shape =
            Shape::collective::<f32>(Collective::SendRecv { transfers }, 0, false, ReduceOp::Sum);
        let elems = shape.chunking_count(2);
        assert_eq!(elems, 4 << 20);
        let chunk_elems = auto_chunk_bytes(elems, 2, 4, false) / 4;
        let plan = PlanCache::<()>::new(1)
            .checked_ring_plan(&shape, chunk_elems, 3, 4, vec![EdgeTransport::Peer; 2])
            .unwrap();
        let copies = plan.ranks[0]
            .iter()
            .filter(|i| matches!(i.op, Op::Copy { .. }))
            .count();
        assert!(
            (1..=4).contains(&copies),
            "8 MiB sent in {copies} chunks of {chunk_elems} elements"
        );
        // Every other collective sizes its chunks from its own count.
        let gather = Shape::collective::<f32>(Collective::AllGather, 1000, false, ReduceOp::Sum);
        assert_eq!(gather.chunking_count(4), 1000);
    }
}
