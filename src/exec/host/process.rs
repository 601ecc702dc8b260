//! One host rank of a job with one process per rank: the host executor's stream workers and
//! plans, with what crosses ranks in shared memory between the processes.
//!
//! The processes meet at a rendezvous ([`crate::exec::rendezvous`]) and map each other's control
//! words (module `exec::job`: the call each started last with its shape, the call each finished
//! last, an abort word). Per prepared plan each rank makes a plan segment holding its
//! own buffers of the plan — a copy of the caller's buffers and its staging — after a head of
//! words: its barrier arrivals and one count per event it records. Every rank maps every peer's
//! segments, so a plan buffer of any rank has an address here, and the stream workers run the
//! plan's operations on those addresses unchanged.
//!
//! Between ranks:
//! - **a wait for another rank's event** waits until the recorder's count for the event reaches
//!   this plan's call number: each event is recorded once per call, and a stream waits for a
//!   remote event at most once per call (the checker's pairing rule), so the k-th call's wait
//!   pairs with the k-th record — the GPU executor's event counters, in shared memory;
//! - **a meeting's barrier** stores the rank's arrival number (counted over this plan's calls)
//!   and waits until every rank's has reached it;
//! - **every call starts** with the job's shape check, and every wait polls the job's abort
//!   words and its peers' liveness (module `exec::job`): a mismatched call, a failed or dead
//!   peer is a named error on every rank. After a failed call the rank is broken: later calls
//!   return [`Error::CommunicatorFailed`] at once.
//!
//! A call copies this rank's caller buffers into its plan segment, runs its program, and copies
//! its outputs back: the caller's memory is never shared, so any buffer works. Segments are
//! unlinked as soon as every peer has mapped them, so a job killed once its ranks have prepared
//! leaves nothing in `/dev/shm`; one killed inside that window (while a new shape's segments
//! are being shared) can leave the segments made so far.
//!
//! Invariant: a rank touches a peer's memory only through the segments the peer made for the
//! job, and only as the plan the checker proved says; each shared word has one writer.

use super::{
    checked_host_plan, command, host_reach, stream_workers, Cmd, HostCall, HostConfig, HostEvent,
    HostFolds, HostPlan, RawBuf, Reports, Worker,
};
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::algorithm::Ran;
use crate::exec::job::{self, peer_failure, word, CallShape, CallerRefs, Job};
use crate::exec::rendezvous::{Rendezvous, UniqueId};
use crate::exec::shm::Segment;
use crate::exec::{aborted, PlanCache, Shape};
use crate::plan::{BufKind, Op, StreamKind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

// The head of a rank's plan segment: its barrier arrivals, then one count per event.
const ARRIVAL: usize = 0;
const EVENTS: usize = 1;
/// Alignment of the buffers in a plan segment (and of the head's end).
const ALIGN: usize = 64;

/// Prepared plans kept per rank (each holds its segments).
const CACHED_PLANS: usize = 16;

/// The words one call shares with the other processes (module doc), for the stream workers.
pub(crate) struct SharedCall {
    rank: usize,
    control: Arc<Vec<Segment>>,
    segments: Arc<Vec<Segment>>,
    processes: Arc<Vec<crate::exec::job::Process>>,
    /// This plan's call number, from 1.
    nth: u64,
    /// Barrier arrivals per call of this plan (two per meeting).
    barriers: u64,
    /// The job's call number, from 1.
    seq: u64,
}

impl SharedCall {
    fn plan_word(&self, rank: usize, i: usize) -> &AtomicU64 {
        // SAFETY: every plan segment starts with EVENTS + its plan's events words (`layout`),
        // mapped while `self` holds it; callers pass an index below that.
        unsafe { word(self.segments[rank].base(), i) }
    }

    /// This call's record of `event` (one of this rank's) is done: its count reaches the call.
    pub(super) fn signal(&self, event: usize) {
        self.plan_word(self.rank, EVENTS + event)
            .fetch_max(self.nth, Ordering::AcqRel);
    }

    /// Tells every peer that this call failed, blaming the rank `err` names if it is a peer's
    /// failure seen here, else this rank.
    pub(super) fn abort_peers(&self, err: &Error) {
        job::abort_peers(&self.control, self.rank, self.seq, err);
    }

    /// Waits until `recorder`'s count of `event` reaches this call.
    pub(super) fn wait_for(
        &self,
        call: &HostCall,
        rank: usize,
        recorder: usize,
        event: usize,
        what: impl Fn() -> String,
    ) -> Result<()> {
        let word = self.plan_word(recorder, EVENTS + event);
        self.poll(call, rank, what, || {
            (word.load(Ordering::Acquire) >= self.nth).then_some(())
        })
    }

    /// A barrier of this call: `arrival` is its number within the call (from 1).
    pub(super) fn meet(
        &self,
        call: &HostCall,
        rank: usize,
        arrival: u64,
        what: impl Fn() -> String,
    ) -> Result<()> {
        let mine = (self.nth - 1) * self.barriers + arrival;
        self.plan_word(rank, ARRIVAL)
            .fetch_max(mine, Ordering::AcqRel);
        let world = self.segments.len();
        let missing = || -> Vec<usize> {
            (0..world)
                .filter(|&q| self.plan_word(q, ARRIVAL).load(Ordering::Acquire) < mine)
                .collect()
        };
        self.poll(
            call,
            rank,
            || format!("{} for rank(s) {:?}", what(), missing()),
            || missing().is_empty().then_some(()),
        )
    }

    /// Polls `ready` until it holds; fails at once when the call aborts, a peer's abort word
    /// names this call, or a peer's process is gone, and at the deadline (when no operation of
    /// this rank is still running, which would be the root cause and names itself).
    fn poll<T>(
        &self,
        call: &HostCall,
        rank: usize,
        what: impl Fn() -> String,
        mut ready: impl FnMut() -> Option<T>,
    ) -> Result<T> {
        let start = Instant::now();
        let mut next_liveness = start;
        loop {
            if let Some(v) = ready() {
                return Ok(v);
            }
            if call.aborted() {
                return Err(aborted(rank));
            }
            peer_failure(
                &self.control,
                &self.processes,
                self.rank,
                self.seq,
                &mut next_liveness,
            )?;
            let now = Instant::now();
            if now >= call.deadline && call.running.load(Ordering::Acquire) == 0 {
                return Err(Error::Timeout {
                    rank,
                    waiting_on: what(),
                    after: call.timeout,
                });
            }
            crate::exec::pace::PEERS.rest(now - start);
        }
    }
}

/// A plan prepared on this rank: the host plan (its events for this rank's own waits) and every
/// rank's plan segment mapped here.
struct ProcessPlan {
    host: Arc<HostPlan>,
    segments: Arc<Vec<Segment>>,
    /// Per plan buffer: its byte offset in its owner's segment.
    offsets: Vec<usize>,
    /// Barrier arrivals per call (two per meeting).
    barriers: u64,
    /// Calls of this plan so far.
    calls: u64,
}

/// Byte offsets of a plan segment's buffers (by plan buffer; only `rank`'s are meaningful) and
/// the segment's length, for elements of `elem_bytes`.
fn layout(host: &HostPlan, rank: usize, elem_bytes: usize) -> (Vec<usize>, usize) {
    let head = ((EVENTS + host.plan.events.len()) * 8).next_multiple_of(ALIGN);
    let mut at = head;
    let offsets = host
        .plan
        .buffers
        .iter()
        .map(|decl| {
            let here = at;
            if decl.rank == rank {
                at += (decl.len * elem_bytes).next_multiple_of(ALIGN);
            }
            here
        })
        .collect();
    (offsets, at.max(ALIGN))
}

/// One host rank of a job with one process per rank (module doc).
pub(crate) struct ProcessRank {
    rank: usize,
    world: usize,
    config: HostConfig,
    rendezvous: Rendezvous,
    /// The job's control words (module `exec::job`).
    job: Job,
    /// One per stream, by [`StreamKind::index`].
    workers: Vec<Worker>,
    cache: PlanCache<Mutex<ProcessPlan>>,
    plans_made: u64,
    /// What the latest call ran (set once its plan is prepared).
    last_ran: Option<Ran>,
}

/// What every rank's configuration must share, as one number.
fn fingerprint(config: &HostConfig) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (config.chunk_elems, config.slots).hash(&mut h);
    format!(
        "{:?} {:?} {}",
        config.transport, config.algorithm, config.deterministic
    )
    .hash(&mut h);
    h.finish()
}

impl ProcessRank {
    /// Joins the job of `id` as `rank` of `world` (module doc): the rendezvous, then every
    /// rank's control segment mapped here. The ranks must be on one host.
    pub(crate) fn join(
        id: &UniqueId,
        rank: usize,
        world: usize,
        config: HostConfig,
    ) -> Result<ProcessRank> {
        let rendezvous = ProcessRank::meet(id, rank, world, &config)?;
        ProcessRank::on(rendezvous, id, config)
    }

    /// The rendezvous of a host rank of `config` (module doc).
    pub(crate) fn meet(
        id: &UniqueId,
        rank: usize,
        world: usize,
        config: &HostConfig,
    ) -> Result<Rendezvous> {
        Rendezvous::join(id, rank, world, fingerprint(config), config.timeout)
    }

    /// The rank of the ranks `rendezvous` met at `id`, all on one host: every rank's control
    /// segment mapped here.
    pub(crate) fn on(
        mut rendezvous: Rendezvous,
        id: &UniqueId,
        config: HostConfig,
    ) -> Result<ProcessRank> {
        let (rank, world) = (rendezvous.rank(), rendezvous.world());
        let job = Job::join(&mut rendezvous, id)?;
        let workers = stream_workers(rank, true)?
            .into_iter()
            .map(|w| w.expect("a worker for every stream, Main included"))
            .collect();
        Ok(ProcessRank {
            rank,
            world,
            config,
            rendezvous,
            job,
            workers,
            cache: PlanCache::new(CACHED_PLANS),
            plans_made: 0,
            last_ran: None,
        })
    }

    /// What the latest call ran, once its plan was prepared.
    pub(crate) fn last_ran(&self) -> Option<Ran> {
        self.last_ran
    }

    /// Gives this rank up: its peers' waits fail naming it.
    pub(crate) fn abort(&self) {
        self.job.abort();
    }

    /// The plan of `shape`: cached, or built, proven and given its segments now (every rank
    /// prepares the same shapes in the same order).
    fn prepare(&mut self, shape: &Shape) -> Result<Arc<Mutex<ProcessPlan>>> {
        if let Some(p) = self.cache.get(shape) {
            return Ok(p);
        }
        let (plan, algorithm) =
            checked_host_plan(shape, self.world, &self.config, &mut self.cache)?;
        let host = Arc::new(HostPlan {
            algorithm,
            waiters: plan.remote_waiters(),
            events: plan.events.iter().map(|_| HostEvent::default()).collect(),
            scratch: plan.buffers.iter().map(|_| None).collect(),
            // A rank of its own process meets its peers in shared memory, never in the pool.
            phases: None,
            plan,
        });
        self.plans_made += 1;
        let (rank, serial, eb) = (self.rank, self.plans_made, shape.elem_bytes);
        let name = |q: usize| format!("{}-r{q}-p{serial}", self.job.prefix());
        let sizes: Vec<usize> = (0..self.world).map(|q| layout(&host, q, eb).1).collect();
        let own = Segment::create(&name(rank), sizes[rank]);
        let segments = job::share_segments(&mut self.rendezvous, rank, own.is_ok(), |q| {
            Segment::open(&name(q), sizes[q])
        });
        let mut own = own?;
        let segments = segments?;
        own.unlink();
        let segments = job::with_own(segments, rank, own);
        let offsets = (0..host.plan.buffers.len())
            .map(|b| layout(&host, host.plan.buffers[b].rank, eb).0[b])
            .collect();
        let meetings = host.plan.ranks[rank]
            .iter()
            .filter(|i| matches!(i.op, Op::PeerReduce { .. }))
            .count() as u64;
        let prepared = Arc::new(Mutex::new(ProcessPlan {
            host,
            segments: Arc::new(segments),
            offsets,
            barriers: 2 * meetings,
            calls: 0,
        }));
        self.cache.insert(shape.clone(), prepared.clone());
        Ok(prepared)
    }

    /// Runs one collective on this rank's buffers and returns when it is complete: `reads` are
    /// the buffers it only reads and `writes` those it writes, each named by the plan's kind for
    /// it ([`BufKind::Input`], [`BufKind::Output`], a transfer's [`BufKind::SendBuf`] or
    /// [`BufKind::RecvBuf`]), of the lengths the plan of `shape` declares for this rank (the
    /// caller checked them).
    pub(crate) fn run<T: Element>(
        &mut self,
        shape: Shape,
        reads: &[(BufKind, &[T])],
        writes: &mut [(BufKind, &mut [T])],
        op: ReduceOp,
    ) -> Result<()> {
        // One deadline for the call: its start, and its run (a new shape's preparation meets
        // the peers within the rendezvous' own timeout).
        let deadline = Instant::now() + self.config.timeout;
        let seq = self.job.start_call(
            CallShape::of(&shape, T::DTYPE, op),
            CallerRefs::default(),
            deadline,
            self.config.timeout,
        )?;
        let prepared = self.prepare(&shape)?;
        let mut prepared = prepared.lock().unwrap_or_else(|p| p.into_inner());
        self.last_ran = Some(prepared.host.ran(host_reach(&self.config)));
        prepared.calls += 1;
        let rank = self.rank;
        let eb = shape.elem_bytes;
        let host = prepared.host.clone();
        let bufs: Vec<RawBuf> = host
            .plan
            .buffers
            .iter()
            .enumerate()
            .map(|(b, decl)| RawBuf {
                // SAFETY: the offset lies inside the owner's segment (`layout` sized it so).
                ptr: unsafe { prepared.segments[decl.rank].base().add(prepared.offsets[b]) },
                len_bytes: decl.len * eb,
            })
            .collect();
        // This rank's caller buffers into its segment: what it reads, and what it writes (in
        // place the one buffer is both; out of place what the collective leaves alone must stay
        // the caller's).
        for (b, decl) in host.plan.buffers.iter().enumerate() {
            if decl.rank != rank {
                continue;
            }
            let from = reads
                .iter()
                .map(|(kind, buf)| (*kind, &**buf))
                .chain(writes.iter().map(|(kind, buf)| (*kind, &**buf)))
                .find(|(kind, _)| *kind == decl.kind)
                .map(|(_, buf)| buf);
            if let Some(from) = from {
                let bytes = (decl.len * eb).min(std::mem::size_of_val(from));
                // SAFETY: `bufs[b]` holds decl.len elements in this rank's segment, which no
                // other rank touches before this rank's Entry records or start barrier (the
                // checked plan); `from` holds at least `bytes` bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(from.as_ptr().cast::<u8>(), bufs[b].ptr, bytes)
                };
            }
        }
        // Every stream of this rank takes part (each gets Begin and End).
        let expected = StreamKind::ALL.iter().map(|&s| (rank, Some(s))).collect();
        let call = Arc::new(HostCall {
            id: seq,
            prepared: host.clone(),
            bufs,
            elem_bytes: eb,
            op,
            folds: HostFolds::of::<T>(host.plan.world),
            deadline,
            timeout: self.config.timeout,
            delay_seed: self
                .config
                .delay_seed
                .map(|s| s ^ seq.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            fault: self.config.fault,
            abort: AtomicBool::new(false),
            failure: Mutex::new(None),
            running: AtomicUsize::new(0),
            done: Reports::new(expected),
            arrivals: Mutex::new(Vec::new()),
            all_arrived: AtomicU64::new(0),
            arrived: Condvar::new(),
            shared: Some(SharedCall {
                rank,
                control: self.job.control().clone(),
                segments: prepared.segments.clone(),
                processes: self.job.processes().clone(),
                nth: prepared.calls,
                barriers: prepared.barriers,
                seq,
            }),
        });
        drop(prepared);
        self.enqueue(&call)?;
        self.wait(&call)?;
        // This rank's part is done: its process may end now without failing slower peers.
        self.job.finished(seq);
        // This rank's outputs back to the caller: its streams are done, and the checker proved
        // that no rank touches a rank's caller buffers after that rank's last Main instruction.
        for (kind, out) in writes.iter_mut() {
            for (b, decl) in host.plan.buffers.iter().enumerate() {
                if decl.rank == rank && decl.kind == *kind {
                    let bytes = (decl.len * eb).min(std::mem::size_of_val(*out));
                    // SAFETY: as for the copy in, in the other direction.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            call.bufs[b].ptr,
                            out.as_mut_ptr().cast::<u8>(),
                            bytes,
                        )
                    };
                }
            }
        }
        Ok(())
    }

    /// Enqueues this rank's program on its stream workers.
    fn enqueue(&self, call: &Arc<HostCall>) -> Result<()> {
        let rank = self.rank;
        let plan = &call.prepared.plan;
        for (tx, _) in &self.workers {
            tx.send(Cmd::Begin(call.clone()))
                .map_err(|_| Error::Closed)?;
        }
        for (index, instr) in plan.ranks[rank].iter().enumerate() {
            let cmd = match instr.op {
                // Another process's event: its count in shared memory.
                Op::Wait(e) if plan.events[e.0].rank != rank => {
                    Some(Cmd::WaitShared { event: e.0, index })
                }
                _ => command(&call.prepared.events, index, instr),
            };
            if let Some(cmd) = cmd {
                self.workers[instr.stream.index()]
                    .0
                    .send(cmd)
                    .map_err(|_| Error::Closed)?;
            }
        }
        for (tx, _) in &self.workers {
            tx.send(Cmd::End).map_err(|_| Error::Closed)?;
        }
        Ok(())
    }

    /// Waits until every stream worker has finished the call; its first failure.
    fn wait(&self, call: &HostCall) -> Result<()> {
        call.wait_done(|_| {
            let waiting_on = "did not finish its part of the collective".to_string();
            (self.rank, waiting_on)
        })
    }
}

impl Drop for ProcessRank {
    fn drop(&mut self) {
        for (tx, handle) in self.workers.drain(..) {
            drop(tx);
            let _ = handle.join();
        }
    }
}
