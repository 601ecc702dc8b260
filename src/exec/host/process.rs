//! One host rank of a job with one process per rank: the host executor's stream workers and
//! plans, with what crosses ranks in shared memory between the processes.
//!
//! The processes meet at a rendezvous ([`crate::exec::rendezvous`]); each then makes a control
//! segment (module `shm`) that every peer maps: its pid, the job call it started last with that
//! call's shape, and an abort word. Per prepared plan each rank makes a plan segment holding its
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
//! - **every call starts** by publishing its shape, then checking every peer's once it has
//!   started the same call: ranks that call different collectives (a count, a type, a root)
//!   all get [`Error::CallMismatch`], never a hang or a wrong result;
//! - **a failure** sets the rank's abort word to the call's number (and the rank blamed); every
//!   waiting peer sees it and fails its call naming that rank (so does a peer's next call: a
//!   rank that failed is broken and never starts it); **a dead peer** — gone, or a zombie,
//!   before it finished the call — is seen by its pid within a few milliseconds of any wait,
//!   and named
//!   ([`Error::RankFailed`]). After a failed call the rank is broken: later calls return
//!   [`Error::CommunicatorFailed`] at once.
//!
//! A call copies this rank's caller buffers into its plan segment, runs its program, and copies
//! its outputs back: the caller's memory is never shared, so any buffer works. Segments are
//! unlinked as soon as every peer has mapped them, so a job killed once its ranks have prepared
//! leaves nothing in `/dev/shm`; one killed inside that window (while a new shape's segments
//! are being shared) can leave the segments made so far.
//!
//! Invariant: a rank touches a peer's memory only through the segments the peer made for the
//! job, and only as the plan the checker proved says; each shared word has one writer.

use super::shm::{process_alive, Segment};
use super::{
    checked_host_plan, command, stream_workers, Cmd, HostCall, HostConfig, HostEvent, HostFolds,
    HostPlan, RawBuf,
};
use crate::element::{DType, Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::rendezvous::{push_text, text_of, Rendezvous, UniqueId};
use crate::exec::{aborted, PlanCache, Shape};
use crate::plan::{BufKind, Collective, Op, StreamKind};
use crossbeam_channel::Sender;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

// The words of a rank's control segment.
/// The job call number this rank finished last (its part done, its outputs its own): a peer
/// whose process is gone after finishing the call a rank waits in did not fail it.
const DONE: usize = 0;
/// `(call << 16) | (blamed rank + 1)` of the last call this rank failed; 0: none.
const ABORT: usize = 1;
/// The job call number this rank started last.
const STARTED: usize = 2;
/// Two slots of [`SHAPE_WORDS`], by the call number's parity: the shape of that call.
const SHAPE: usize = 3;
const SHAPE_WORDS: usize = 6;
const CONTROL_WORDS: usize = SHAPE + 2 * SHAPE_WORDS;

// The head of a rank's plan segment: its barrier arrivals, then one count per event.
const ARRIVAL: usize = 0;
const EVENTS: usize = 1;
/// Alignment of the buffers in a plan segment (and of the head's end).
const ALIGN: usize = 64;

/// Prepared plans kept per rank (each holds its segments).
const CACHED_PLANS: usize = 16;

/// A word of a mapped segment.
///
/// # Safety
/// `base` is a live mapping of at least `(i + 1) * 8` bytes, 8-aligned, that outlives `'a`.
unsafe fn word<'a>(base: *mut u8, i: usize) -> &'a AtomicU64 {
    // SAFETY: the caller's contract; `AtomicU64` has the size and alignment of a u64, and every
    // process accesses these words only atomically.
    unsafe { &*base.cast::<AtomicU64>().add(i) }
}

/// The words one call shares with the other processes (module doc), for the stream workers.
pub(crate) struct SharedCall {
    rank: usize,
    control: Arc<Vec<Segment>>,
    segments: Arc<Vec<Segment>>,
    pids: Arc<Vec<u32>>,
    /// This plan's call number, from 1.
    nth: u64,
    /// Barrier arrivals per call of this plan (two per meeting).
    barriers: u64,
    /// The job's call number, from 1.
    seq: u64,
}

impl SharedCall {
    fn control_word(&self, rank: usize, i: usize) -> &AtomicU64 {
        // SAFETY: every control segment is CONTROL_WORDS words, mapped while `self` holds it.
        unsafe { word(self.control[rank].base(), i) }
    }

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
        let blamed = match err {
            Error::RankFailed { rank, .. } if *rank != self.rank => *rank,
            _ => self.rank,
        };
        let word = (self.seq << 16) | (blamed as u64 + 1);
        self.control_word(self.rank, ABORT)
            .store(word, Ordering::Release);
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
                &self.pids,
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
            backoff(now - start);
        }
    }
}

/// A peer's failure that dooms job call `seq`, as the error this rank reports: its abort word
/// names this call or the one before (a rank that failed the previous call is broken and never
/// starts this one), or its process is gone before it finished this call. Liveness (a `/proc`
/// read per peer) is looked at every few milliseconds, when `next_liveness` has passed.
fn peer_failure(
    control: &[Segment],
    pids: &[u32],
    rank: usize,
    seq: u64,
    next_liveness: &mut Instant,
) -> Result<()> {
    // SAFETY: control segments of CONTROL_WORDS words, mapped while `control` lives.
    let read = |q: usize, i: usize| unsafe { word(control[q].base(), i) }.load(Ordering::Acquire);
    for q in (0..control.len()).filter(|&q| q != rank) {
        let abort = read(q, ABORT);
        if abort != 0 && (abort >> 16) + 1 >= seq {
            let blamed = ((abort & 0xffff) as usize).saturating_sub(1);
            return Err(Error::RankFailed {
                rank: blamed,
                during: "a collective across processes".into(),
                message: format!("rank {q} aborted call {}", abort >> 16),
            });
        }
    }
    let now = Instant::now();
    if now >= *next_liveness {
        *next_liveness = now + Duration::from_millis(5);
        let gone = |q: usize| q != rank && read(q, DONE) < seq && !process_alive(pids[q]);
        if let Some(q) = (0..pids.len()).find(|&q| gone(q)) {
            return Err(Error::RankFailed {
                rank: q,
                during: "a collective across processes".into(),
                message: format!("its process (pid {}) is gone", pids[q]),
            });
        }
    }
    Ok(())
}

/// How long a poll rests after `waited` so far: spinning briefly, then sleeping longer, up to a
/// millisecond.
fn backoff(waited: Duration) {
    if waited < Duration::from_micros(50) {
        std::hint::spin_loop();
    } else if waited < Duration::from_millis(2) {
        std::thread::yield_now();
    } else {
        std::thread::sleep(
            Duration::from_micros(200)
                .max(waited / 64)
                .min(Duration::from_millis(1)),
        );
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
    /// Names of this job's segments start with this.
    prefix: String,
    control: Arc<Vec<Segment>>,
    pids: Arc<Vec<u32>>,
    workers: Vec<(Sender<Cmd>, JoinHandle<()>)>,
    cache: PlanCache<Mutex<ProcessPlan>>,
    plans_made: u64,
    seq: u64,
    broken: Option<Error>,
}

/// A call's shape as words, to compare across ranks.
fn shape_words(shape: &Shape, dtype: DType, op: ReduceOp) -> [u64; SHAPE_WORDS] {
    let (kind, root) = match shape.collective {
        Collective::AllReduce => (1, 0),
        Collective::ReduceScatter => (2, 0),
        Collective::AllGather => (3, 0),
        Collective::Broadcast { root } => (4, root),
        Collective::Reduce { root } => (5, root),
        Collective::AllToAll => (6, 0),
        Collective::SendRecv { ref transfers } => {
            // The transfers, folded into one word: every rank must name the same.
            let folded = transfers.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, t| {
                [t.from, t.to, t.count].iter().fold(h, |h, &x| {
                    (h ^ x as u64).wrapping_mul(0x0000_0100_0000_01b3)
                })
            });
            (7, folded as usize)
        }
    };
    let reduces = shape.collective.reduces();
    [
        kind,
        root as u64,
        shape.count as u64,
        DType::ALL
            .iter()
            .position(|&d| d == dtype)
            .map_or(u64::MAX, |i| i as u64),
        if reduces { op as u64 + 1 } else { 0 },
        u64::from(shape.in_place),
    ]
}

/// A call's shape in words, for people.
fn describe_shape(w: &[u64]) -> String {
    let name = match w[0] {
        1 => "all-reduce",
        2 => "reduce-scatter",
        3 => "all-gather",
        4 => "broadcast",
        5 => "reduce",
        6 => "all-to-all",
        7 => "send/recv",
        _ => "nothing",
    };
    let root = match w[0] {
        4 | 5 => format!(" from root {}", w[1]),
        7 => format!(" of transfers {:016x}", w[1]),
        _ => String::new(),
    };
    let dtype = DType::ALL
        .get(w[3] as usize)
        .map_or_else(|| "?".to_string(), |d| format!("{d:?}"));
    format!(
        "{name}{root} of {} elements of {dtype}{}{}",
        w[2],
        match w[4] {
            0 => String::new(),
            op => format!(", operator {}", op - 1),
        },
        if w[5] == 1 { ", in place" } else { "" }
    )
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
    /// rank's control segment mapped here.
    pub(crate) fn join(
        id: &UniqueId,
        rank: usize,
        world: usize,
        config: HostConfig,
    ) -> Result<ProcessRank> {
        let mut rendezvous =
            Rendezvous::join(id, rank, world, fingerprint(&config), config.timeout)?;
        // Every rank's pid and host; the names of the job's segments carry the id and rank 0's
        // pid.
        let mut record = vec![u64::from(std::process::id())];
        push_text(&mut record, &host_id());
        let records = rendezvous.all_gather(&record)?;
        let pids: Vec<u32> = records
            .iter()
            .map(|r| r.first().map_or(0, |&p| p as u32))
            .collect();
        let hosts: Vec<String> = records
            .iter()
            .map(|r| match r.get(1..) {
                Some([len, words @ ..]) => text_of(*len as usize, words),
                _ => String::new(),
            })
            .collect();
        if let Some(other) = hosts.iter().position(|h| *h != hosts[0]) {
            return Err(Error::SeveralHosts {
                rank: other,
                host: hosts[other].clone(),
                rank0_host: hosts[0].clone(),
            });
        }
        let prefix = format!("/ringreduce-{}-{}", id.tag(), pids[0]);
        let control_name = |q: usize| format!("{prefix}-r{q}-ctl");
        let own = Segment::create(&control_name(rank), CONTROL_WORDS * 8);
        let control = share_segments(&mut rendezvous, rank, own.is_ok(), |q| {
            Segment::open(&control_name(q), CONTROL_WORDS * 8)
        });
        let mut own = own?;
        let control = control?;
        own.unlink();
        let control = with_own(control, rank, own);
        let workers = stream_workers(rank)?;
        Ok(ProcessRank {
            rank,
            world,
            config,
            rendezvous,
            prefix,
            control: Arc::new(control),
            pids: Arc::new(pids),
            workers,
            cache: PlanCache::new(CACHED_PLANS),
            plans_made: 0,
            seq: 0,
            broken: None,
        })
    }

    fn control_word(&self, rank: usize, i: usize) -> &AtomicU64 {
        // SAFETY: every control segment is CONTROL_WORDS words, mapped while `self` lives.
        unsafe { word(self.control[rank].base(), i) }
    }

    /// Publishes this call's shape and waits until every peer has started the same call, then
    /// compares their shapes with it.
    fn start_call(&mut self, words: [u64; SHAPE_WORDS], deadline: Instant) -> Result<()> {
        self.seq += 1;
        let (seq, rank) = (self.seq, self.rank);
        let slot = SHAPE + (seq % 2) as usize * SHAPE_WORDS;
        for (i, w) in words.iter().enumerate() {
            self.control_word(rank, slot + i)
                .store(*w, Ordering::Relaxed);
        }
        self.control_word(rank, STARTED)
            .store(seq, Ordering::Release);
        let start = Instant::now();
        let mut next_liveness = start;
        for q in (0..self.world).filter(|&q| q != rank) {
            while self.control_word(q, STARTED).load(Ordering::Acquire) < seq {
                peer_failure(&self.control, &self.pids, rank, seq, &mut next_liveness)?;
                if Instant::now() >= deadline {
                    return Err(Error::Timeout {
                        rank: q,
                        waiting_on: format!("did not start call {seq} (rank {rank} waited for it)"),
                        after: self.config.timeout,
                    });
                }
                backoff(start.elapsed());
            }
            let theirs: Vec<u64> = (0..SHAPE_WORDS)
                .map(|i| self.control_word(q, slot + i).load(Ordering::Relaxed))
                .collect();
            if theirs != words {
                return Err(Error::CallMismatch {
                    rank: q,
                    theirs: describe_shape(&theirs),
                    this: rank,
                    ours: describe_shape(&words),
                });
            }
        }
        Ok(())
    }

    /// The plan of `shape`: cached, or built, proven and given its segments now (every rank
    /// prepares the same shapes in the same order).
    fn prepare(&mut self, shape: &Shape) -> Result<Arc<Mutex<ProcessPlan>>> {
        if let Some(p) = self.cache.get(shape) {
            return Ok(p);
        }
        let plan = checked_host_plan(shape, self.world, &self.config, &mut self.cache)?;
        let host = Arc::new(HostPlan {
            waiters: plan.remote_waiters(),
            events: plan.events.iter().map(|_| HostEvent::default()).collect(),
            scratch: plan.buffers.iter().map(|_| None).collect(),
            plan,
        });
        self.plans_made += 1;
        let (rank, serial, eb) = (self.rank, self.plans_made, shape.elem_bytes);
        let name = |q: usize| format!("{}-r{q}-p{serial}", self.prefix);
        let sizes: Vec<usize> = (0..self.world).map(|q| layout(&host, q, eb).1).collect();
        let own = Segment::create(&name(rank), sizes[rank]);
        let segments = share_segments(&mut self.rendezvous, rank, own.is_ok(), |q| {
            Segment::open(&name(q), sizes[q])
        });
        let mut own = own?;
        let segments = segments?;
        own.unlink();
        let segments = with_own(segments, rank, own);
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
        if let Some(err) = &self.broken {
            return Err(Error::CommunicatorFailed(Box::new(err.clone())));
        }
        let result = self.run_unbroken(shape, reads, writes, op);
        if let Err(err) = &result {
            self.broken = Some(err.clone());
        }
        result
    }

    fn run_unbroken<T: Element>(
        &mut self,
        shape: Shape,
        reads: &[(BufKind, &[T])],
        writes: &mut [(BufKind, &mut [T])],
        op: ReduceOp,
    ) -> Result<()> {
        // One deadline for the call: its start, and its run (a new shape's preparation meets
        // the peers within the rendezvous' own timeout).
        let deadline = Instant::now() + self.config.timeout;
        self.start_call(shape_words(&shape, T::DTYPE, op), deadline)?;
        let prepared = self.prepare(&shape)?;
        let mut prepared = prepared.lock().unwrap_or_else(|p| p.into_inner());
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
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let call = Arc::new(HostCall {
            id: self.seq,
            prepared: host.clone(),
            bufs,
            elem_bytes: eb,
            op,
            folds: HostFolds::of::<T>(),
            deadline,
            timeout: self.config.timeout,
            delay_seed: self
                .config
                .delay_seed
                .map(|s| s ^ self.seq.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            fault: self.config.fault,
            abort: AtomicBool::new(false),
            failure: Mutex::new(None),
            running: AtomicUsize::new(0),
            done: done_tx,
            arrivals: Mutex::new(Vec::new()),
            arrived: Condvar::new(),
            shared: Some(SharedCall {
                rank,
                control: self.control.clone(),
                segments: prepared.segments.clone(),
                pids: self.pids.clone(),
                nth: prepared.calls,
                barriers: prepared.barriers,
                seq: self.seq,
            }),
        });
        drop(prepared);
        self.enqueue(&call)?;
        self.wait(&call, done_rx)?;
        // This rank's part is done: its process may end now without failing slower peers.
        self.control_word(rank, DONE)
            .store(self.seq, Ordering::Release);
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
    fn wait(
        &self,
        call: &HostCall,
        done: crossbeam_channel::Receiver<(usize, Option<StreamKind>)>,
    ) -> Result<()> {
        let mut pending = self.workers.len();
        let backstop = call.deadline + Duration::from_millis(250);
        let mut timed_out = false;
        while pending > 0 {
            let until = match timed_out {
                true => Instant::now() + Duration::from_secs(3600),
                false => backstop,
            };
            match done.recv_deadline(until) {
                Ok(_) => pending -= 1,
                Err(_) if !timed_out => {
                    timed_out = true;
                    call.fail(Error::Timeout {
                        rank: self.rank,
                        waiting_on: "did not finish its part of the collective".into(),
                        after: call.timeout,
                    });
                }
                Err(_) => break,
            }
        }
        match call
            .failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            Some(err) => Err(err),
            None => Ok(()),
        }
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

/// Every rank's segment, mapped here, with this rank's slot empty for its own: this rank made
/// its own (`made` says whether that succeeded); the ranks tell each other whether they did,
/// then map every peer's with `open`, and tell each other again — so a rank that failed is
/// named on every rank, and no rank unlinks its name before every peer has mapped it.
fn share_segments(
    rendezvous: &mut Rendezvous,
    rank: usize,
    made: bool,
    open: impl Fn(usize) -> Result<Segment>,
) -> Result<Vec<Option<Segment>>> {
    let verdict = |records: Vec<Vec<u64>>, during: &str| -> Result<()> {
        match records.iter().position(|r| r.first() != Some(&0)) {
            Some(q) => Err(Error::RankFailed {
                rank: q,
                during: during.into(),
                message: "it could not make or map its shared memory (its own error says why)"
                    .into(),
            }),
            None => Ok(()),
        }
    };
    verdict(
        rendezvous.all_gather(&[u64::from(!made)])?,
        "making shared memory",
    )?;
    let mut mapped = Vec::with_capacity(rendezvous.world());
    let mut failed = None;
    for q in 0..rendezvous.world() {
        if q == rank {
            mapped.push(None);
            continue;
        }
        match open(q) {
            Ok(s) => mapped.push(Some(s)),
            Err(e) => {
                mapped.push(None);
                failed.get_or_insert(e);
            }
        }
    }
    let told = rendezvous.all_gather(&[u64::from(failed.is_some())]);
    // This rank's own failure says most; then a peer's, by name.
    if let Some(e) = failed {
        return Err(e);
    }
    verdict(told?, "mapping shared memory")?;
    Ok(mapped)
}

/// The segments with this rank's own in its slot.
fn with_own(mut segments: Vec<Option<Segment>>, rank: usize, own: Segment) -> Vec<Segment> {
    segments[rank] = Some(own);
    segments.into_iter().flatten().collect()
}

/// The host this rank reports: `RINGREDUCE_HOST_ID` when set (so that one machine can stand in
/// for several), else the host name.
fn host_id() -> String {
    if let Ok(id) = std::env::var("RINGREDUCE_HOST_ID") {
        return id;
    }
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is 256 writable bytes and that is the length passed; the result is
    // NUL-terminated within it on success (truncated names are not NUL-terminated: the last
    // byte is forced to 0 below).
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len() - 1);
    match ok {
        true => String::from_utf8_lossy(&buf[..end]).into_owned(),
        false => "unknown host".into(),
    }
}
