//! The host executor: runs a plan for real on the CPU, shaped like the GPU executor.
//!
//! One thread per rank enqueues the rank's program (`enqueue_rank`); each of its streams runs
//! what is enqueued on it, in order — Send, Recv and Reduce on a worker thread each, Main on the
//! rank thread itself once the call is enqueued.
//! Events have CUDA's semantics exactly: a record enqueued on a stream completes when the stream
//! reaches it; a wait captures the event's latest enqueued record at the moment the wait is
//! enqueued, and a wait on an event never recorded is a no-op. Buffers are host memory, copies are
//! `memmove`, reductions run on the CPU.
//!
//! It is the reference every GPU path is tested against, and runs every collective (all-reduce,
//! reduce-scatter, all-gather, broadcast, reduce, all-to-all, send/recv) across threads.
//! For tests it can shake the schedule (seeded random delays before operations) and inject faults
//! (fail, panic or stall rank r at instruction k). Every wait has the call's deadline, so a fault
//! never hangs a caller: the first error aborts the call, every thread drains, and the caller gets
//! the root cause, naming the rank and what it was waiting for.
//!
//! A blocking call whose plan keeps every rank on its Main stream without events (the one-shot
//! and the two-shot) runs instead on a pool of at most one thread per core, phase by phase
//! between the plan's barriers (`pool.rs`): the same operations, without a thread per rank
//! taking turns on few cores.
//!
//! This file holds the executor, its per-call state (`HostCall`) and the rank threads;
//! `stream.rs` the stream workers that run the operations (events, barriers, faults), `pool.rs`
//! the pool, and `fold.rs` the element folds they call.

mod fold;
mod pool;
pub(crate) mod process;
mod stream;

use self::fold::HostFolds;
use self::stream::{stream_worker, Stream};
use super::config::Transport;
use super::{enqueue_rank, panic_message, Algorithm, Enqueue, Handoff, Limits, PlanCache, Shape};
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::plan::{BufKind, Collective, Gather, Instr, Op, Plan, Region, StreamKind};
use crossbeam_channel::{Receiver, Sender};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Tuning and test options of the host executor.
#[derive(Clone, Debug, PartialEq)]
pub struct HostConfig {
    /// Chunk length in elements.
    pub chunk_elems: usize,
    /// Staging slots per receiver.
    pub slots: usize,
    /// How the ring's edges move data ([`Transport`], shared with [`crate::CudaConfig`]);
    /// `Staged` exercises the pinned-host plan shape on the CPU.
    pub transport: Transport,
    /// How long a collective may take before every caller gets [`Error::Timeout`].
    pub timeout: Duration,
    /// Seed for random delays (0–100 µs) before a quarter of all operations; `None` for none.
    pub delay_seed: Option<u64>,
    /// A fault to inject, for tests of failure handling.
    pub fault: Option<Fault>,
    /// Which all-reduce runs. `Auto` (the default) runs the two-shot with its gather pushed,
    /// the host ranks' fastest ([`Algorithm::choose_host`]; over `Staged` edges the staged
    /// rule, [`Algorithm::choose_staged`]); `Ring` and `OneShot` run those plans (a test of the
    /// ring's chunking sets `Ring`, so that it gets the ring).
    pub algorithm: Algorithm,
    /// Fold every element of a reducing collective (all-reduce, reduce-scatter, reduce) in rank
    /// order on every algorithm and size, so results do not depend on which algorithm runs (see
    /// [`crate::exec::algorithm::deterministic_needs_peers`] for what it costs and what it
    /// refuses, and docs/guide/07-other-collectives.md, "Fold order"). Off by default.
    pub deterministic: bool,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            chunk_elems: 64 * 1024,
            slots: 4,
            transport: Transport::Auto,
            timeout: Duration::from_secs(60),
            delay_seed: None,
            fault: None,
            algorithm: Algorithm::Auto,
            deterministic: false,
        }
    }
}

/// A fault injected into the host executor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The rank whose program the fault hits.
    pub rank: usize,
    /// Index of the instruction in the rank's program (taken modulo its length).
    pub instr: usize,
    /// What the fault does there.
    pub kind: FaultKind,
}

/// What an injected fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// The operation returns an error.
    Fail,
    /// The operation panics (the executor catches it).
    Panic,
    /// The operation never finishes (until the call is aborted).
    Stall,
    /// The operation starts this much later (or fails at the call's deadline, or stops when the
    /// call is aborted), then runs: a slow rank, whose call completes late but right.
    Slow(Duration),
}

/// A CUDA-like event on the host: records enqueued so far, and records completed.
#[derive(Default)]
struct HostEvent {
    enqueued: AtomicU64,
    /// Records completed: raised under `lock`, so a wait on `reached` misses none; read without
    /// it by a wait's spin.
    completed: AtomicU64,
    lock: Mutex<()>,
    reached: Condvar,
}

/// Host memory for the plan's staging slots, zeroed, 64-byte aligned.
struct Scratch {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: Scratch is a plain owned allocation; the executor hands out raw pointers into it only to
// operations the checker proved race-free, and frees it only when no call is running.
unsafe impl Send for Scratch {}
// SAFETY: as above; `&Scratch` only exposes the base address.
unsafe impl Sync for Scratch {}

impl Scratch {
    fn new(bytes: usize) -> Result<Scratch> {
        let layout = Layout::from_size_align(bytes.max(1), 64).map_err(|_| Error::Resource {
            what: format!("staging of {bytes} bytes is too large"),
        })?;
        // SAFETY: the layout has non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| Error::Resource {
            what: format!("cannot allocate {bytes} bytes of staging"),
        })?;
        Ok(Scratch { ptr, layout })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// The cores this process may run on (1 where the OS does not say).
fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Plans kept per communicator (each holds its staging memory); beyond this one is dropped.
const CACHED_PLANS: usize = 16;

/// A checked plan with what running it needs, built once per shape and reused.
struct HostPlan {
    plan: Plan,
    waiters: Vec<Vec<usize>>,
    events: Vec<HostEvent>,
    /// One allocation per Slots / HostSlots / Exposed buffer, by buffer index.
    scratch: Vec<Option<Scratch>>,
    /// Where the pool can run the plan: each rank's program cut at its barriers (module `pool`).
    phases: Option<pool::Phases>,
}

/// A buffer of the caller's, as the executor sees it: a base address and a length in bytes.
#[derive(Clone, Copy)]
pub(crate) struct RawBuf {
    pub(crate) ptr: *mut u8,
    pub(crate) len_bytes: usize,
}

/// Everything the threads of one call share.
struct HostCall {
    id: u64,
    prepared: Arc<HostPlan>,
    bufs: Vec<RawBuf>,
    elem_bytes: usize,
    op: ReduceOp,
    folds: HostFolds,
    deadline: Instant,
    timeout: Duration,
    delay_seed: Option<u64>,
    fault: Option<Fault>,
    abort: AtomicBool,
    failure: Mutex<Option<Error>>,
    /// Data operations running right now. At the deadline a wait defers to a running operation:
    /// a stream stuck inside an operation is the root cause and names itself; the streams
    /// waiting on it are its victims.
    running: AtomicUsize,
    /// Each rank thread reports `(rank, None)`, each stream `(rank, Some(stream))`.
    done: Reports,
    /// Barrier arrivals per rank (two per `PeerReduce`: start, end), for the one-shot.
    arrivals: Mutex<Vec<u64>>,
    /// The highest arrival every rank has made (for a barrier's spin).
    all_arrived: AtomicU64,
    arrived: Condvar,
    /// A rank of a job with one process per rank: the words it shares with its peers' processes
    /// for this call (module `process`); `None` when every rank is a thread of this process.
    shared: Option<process::SharedCall>,
}

// SAFETY: the raw pointers in `bufs` point into buffers the caller keeps valid and untouched
// until every thread has reported the call done (`HostExecutor::run`'s contract: a blocking call
// waits for that, an enqueued one leaves it to the caller's `synchronize`), and the checker proved
// that no two threads touch overlapping bytes without an event between them.
unsafe impl Send for HostCall {}
// SAFETY: as above.
unsafe impl Sync for HostCall {}

impl HostCall {
    /// Records the first failure and aborts the call (in every process of the job, when its
    /// ranks are processes).
    fn fail(&self, err: Error) {
        let mut slot = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            if let Some(shared) = &self.shared {
                shared.abort_peers(&err);
            }
            *slot = Some(err);
        }
        self.abort.store(true, Ordering::Release);
    }

    /// Waits until every report of the call is in, and returns its first error. The threads'
    /// own deadline checks fire first and name what they waited for; this is a backstop a
    /// little later: where reports are still missing then and nobody reported a failure, the
    /// call is a stall — it fails with a timeout naming the first missing reporter as
    /// `stalled` says (rank, what it did not finish), aborts, and the wait goes on: every thread
    /// notices the abort within milliseconds.
    fn wait_done(&self, stalled: impl FnOnce(Reporter) -> (usize, String)) -> Result<()> {
        let backstop = self.deadline + Duration::from_millis(250);
        if let Some(&first) = self.done.wait_until(backstop).first() {
            let (rank, waiting_on) = stalled(first);
            self.fail(Error::Timeout {
                rank,
                waiting_on,
                after: self.timeout,
            });
            self.done
                .wait_until(Instant::now() + Duration::from_secs(3600));
        }
        let failure = self
            .failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match failure {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }

    fn aborted(&self) -> bool {
        self.abort.load(Ordering::Acquire)
    }

    /// How long a blocked wait sleeps before it looks again at the abort flag and the deadline:
    /// the time left, between 1 and 20 ms.
    fn wait_slice(&self, now: Instant) -> Duration {
        self.deadline
            .saturating_duration_since(now)
            .clamp(Duration::from_millis(1), Duration::from_millis(20))
    }

    fn ptr(&self, region: Region) -> *mut u8 {
        let buf = self.bufs[region.buf.0];
        debug_assert!((region.offset + region.count) * self.elem_bytes <= buf.len_bytes);
        // SAFETY: the checker proved the region lies inside its buffer, and `bufs` has each
        // buffer's real length (asserted above in debug builds).
        unsafe { buf.ptr.add(region.offset * self.elem_bytes) }
    }
}

/// Who reports on a call: a rank thread `(rank, None)`, a stream `(rank, Some(stream))`.
type Reporter = (usize, Option<StreamKind>);

/// The reports a call waits for, and the one wake-up of its waiter: the last report wakes it
/// (a channel would wake it once per report that finds it asleep — up to 2n times a call on n
/// ranks, each a thread hand-off on a machine with few cores).
struct Reports {
    /// Reports still missing, readable without the lock (for the waiter's spin).
    missing: AtomicUsize,
    pending: Mutex<Vec<Reporter>>,
    all_in: Condvar,
}

impl Reports {
    fn new(expected: Vec<Reporter>) -> Reports {
        Reports {
            missing: AtomicUsize::new(expected.len()),
            pending: Mutex::new(expected),
            all_in: Condvar::new(),
        }
    }

    /// `who` is done with the call.
    fn report(&self, who: Reporter) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = pending.iter().position(|p| *p == who) {
            pending.swap_remove(at);
            self.missing.store(pending.len(), Ordering::Release);
        }
        if pending.is_empty() {
            self.all_in.notify_all();
        }
    }

    /// Waits until every report is in or `until` passes; the reporters still missing (none:
    /// all in), in the order they were expected where none reported yet.
    fn wait_until(&self, until: Instant) -> Vec<Reporter> {
        super::spin_until(|| self.missing.load(Ordering::Acquire) == 0);
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        while !pending.is_empty() {
            let now = Instant::now();
            if now >= until {
                break;
            }
            pending = self
                .all_in
                .wait_timeout(pending, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        pending.clone()
    }
}

/// What a stream worker is told.
enum Cmd {
    Begin(Arc<HostCall>),
    Run {
        index: usize,
    },
    Record {
        event: usize,
        generation: u64,
    },
    Wait {
        event: usize,
        target: u64,
        index: usize,
    },
    /// A wait for another process's rank's event (its count in shared memory).
    WaitShared {
        event: usize,
        index: usize,
    },
    End,
}

/// The host executor of one communicator: a thread per rank (which runs its Main stream), a worker
/// per other stream, and the pool's helpers (module `pool`).
pub(crate) struct HostExecutor {
    world: usize,
    config: HostConfig,
    ranks: Vec<(Sender<Arc<HostCall>>, JoinHandle<()>)>,
    cache: PlanCache<HostPlan>,
    calls: u64,
    /// Calls started and not yet waited for, oldest first.
    in_flight: VecDeque<InFlight>,
    /// The pool's helper threads (module `pool`), started by its first call.
    helpers: Vec<(Sender<Arc<pool::Job>>, JoinHandle<()>)>,
}

impl HostExecutor {
    /// The world and the options were checked against `exec::config`'s limits by the caller.
    pub(crate) fn new(world: usize, config: HostConfig) -> Result<HostExecutor> {
        debug_assert!(world >= 1 && config.chunk_elems >= 1 && config.slots >= 1);
        let ranks = Handoff::mesh(world)
            .into_iter()
            .map(|handoff| {
                let (tx, rx) = crossbeam_channel::unbounded();
                let handle = std::thread::Builder::new()
                    .name(format!("ringreduce-rank-{}", handoff.rank))
                    .spawn(move || host_rank_thread(handoff, rx))
                    .map_err(|e| Error::Resource {
                        what: format!("cannot start a rank thread: {e}"),
                    })?;
                Ok((tx, handle))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(HostExecutor {
            world,
            config,
            ranks,
            cache: PlanCache::new(CACHED_PLANS),
            calls: 0,
            in_flight: VecDeque::new(),
            helpers: Vec::new(),
        })
    }

    fn prepare(&mut self, shape: Shape) -> Result<Arc<HostPlan>> {
        if let Some(p) = self.cache.get(&shape) {
            return Ok(p);
        }
        let plan = checked_host_plan(&shape, self.world, &self.config, &mut self.cache)?;
        let scratch = plan
            .buffers
            .iter()
            .map(|decl| match decl.kind {
                BufKind::Slots
                | BufKind::HostSlots
                | BufKind::Exposed
                | BufKind::HostExposed
                | BufKind::Scratch => decl
                    .len
                    .checked_mul(shape.elem_bytes)
                    .ok_or(Error::Internal {
                        what: "staging size overflows".into(),
                    })
                    .and_then(Scratch::new)
                    .map(Some),
                _ => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        let prepared = Arc::new(HostPlan {
            waiters: plan.remote_waiters(),
            events: plan.events.iter().map(|_| HostEvent::default()).collect(),
            scratch,
            phases: pool::phases(&plan),
            plan,
        });
        // A call in flight holds its plan (and the plan's staging) alive: evicting is safe.
        self.cache.insert(shape, prepared.clone());
        Ok(prepared)
    }

    /// Starts one collective and returns once every rank thread has it; with `wait_complete`,
    /// then waits for it and for every call started before it ([`HostExecutor::synchronize`]).
    /// Without, the call runs on while the caller goes on, as an enqueued GPU call does: the
    /// rank threads and stream workers take calls in order, with CUDA's event semantics, so a
    /// later call's operations wait for an earlier one's exactly where they would on GPUs.
    /// `inputs` and `outputs` hold the caller's buffers' addresses as [`super::caller_address`]
    /// lays them out.
    ///
    /// # Safety
    /// Every caller's buffer the plan of `shape` declares must point to as many valid, aligned
    /// elements of `T` as the plan's declaration says, that nothing else reads or writes until
    /// the call has completed (this returns, with `wait_complete`; else a later
    /// [`HostExecutor::synchronize`] or `run` with `wait_complete` returns, or the executor has
    /// been dropped); buffers written (outputs, receive buffers) must not overlap each other or
    /// any buffer read. Buffers only read may overlap each other.
    pub(crate) unsafe fn run<T: Element>(
        &mut self,
        shape: Shape,
        inputs: &[u64],
        outputs: &[u64],
        op: ReduceOp,
        wait_complete: bool,
    ) -> Result<()> {
        let elem_bytes = std::mem::size_of::<T>();
        debug_assert_eq!(shape.elem_bytes, elem_bytes);
        let prepared = self.prepare(shape)?;
        let bufs = prepared
            .plan
            .buffers
            .iter()
            .enumerate()
            .map(
                |(i, decl)| match super::caller_address(decl, inputs, outputs) {
                    Some(addr) => RawBuf {
                        ptr: addr as *mut u8,
                        len_bytes: decl.len * elem_bytes,
                    },
                    None => {
                        let s = prepared.scratch[i]
                            .as_ref()
                            .expect("staging is allocated in prepare");
                        RawBuf {
                            ptr: s.ptr.as_ptr(),
                            len_bytes: s.layout.size(),
                        }
                    }
                },
            )
            .collect();
        self.calls += 1;
        // Each rank thread, and each stream its rank's program uses (no other takes part).
        let plan = &prepared.plan;
        let expected: Vec<Reporter> = (0..self.world)
            .flat_map(|r| {
                let streams = plan.streams(r).into_iter().map(move |s| (r, Some(s)));
                std::iter::once((r, None)).chain(streams)
            })
            .collect();
        let call = Arc::new(HostCall {
            id: self.calls,
            prepared,
            bufs,
            elem_bytes,
            op,
            folds: HostFolds::of::<T>(self.world),
            deadline: Instant::now() + self.config.timeout,
            timeout: self.config.timeout,
            delay_seed: self
                .config
                .delay_seed
                .map(|s| s ^ self.calls.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            fault: self.config.fault,
            abort: AtomicBool::new(false),
            failure: Mutex::new(None),
            running: AtomicUsize::new(0),
            done: Reports::new(expected),
            arrivals: Mutex::new(vec![0; self.world]),
            all_arrived: AtomicU64::new(0),
            arrived: Condvar::new(),
            shared: None,
        });
        // A blocking call behind nothing, whose plan the pool can run, runs there; schedule
        // shaking (`delay_seed`) is for the rank threads' interleavings.
        let pooled = call.prepared.phases.is_some() && call.delay_seed.is_none();
        if wait_complete && pooled && self.in_flight.is_empty() {
            return self.run_pooled(call);
        }
        for (tx, _) in &self.ranks {
            if tx.send(call.clone()).is_err() {
                call.fail(Error::Closed);
            }
        }
        self.in_flight.push_back(InFlight { call });
        if wait_complete {
            self.synchronize()
        } else {
            Ok(())
        }
    }

    /// Runs `call` on the pool: the caller and up to as many helpers as make one worker per
    /// core (no more than one per rank), and returns once every worker is done with it.
    fn run_pooled(&mut self, call: Arc<HostCall>) -> Result<()> {
        let workers = self.world.min(cores());
        while self.helpers.len() + 1 < workers {
            let (tx, rx) = crossbeam_channel::unbounded::<Arc<pool::Job>>();
            let handle = std::thread::Builder::new()
                .name(format!("ringreduce-pool-{}", self.helpers.len() + 1))
                .spawn(move || {
                    while let Some(job) = super::spin_recv(&rx) {
                        job.work();
                    }
                })
                .map_err(|e| Error::Resource {
                    what: format!("cannot start a pool thread: {e}"),
                })?;
            self.helpers.push((tx, handle));
        }
        let job = Arc::new(pool::Job::new(call));
        for (tx, _) in &self.helpers[..workers - 1] {
            // A helper that is gone takes no units: the others run them.
            let _ = tx.send(job.clone());
        }
        job.work();
        job.wait_all();
        let failure = job
            .call
            .failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        failure.map_or(Ok(()), Err)
    }

    /// Waits for every call started so far, oldest first, and returns the first one's error.
    pub(crate) fn synchronize(&mut self) -> Result<()> {
        let mut first = Ok(());
        while let Some(in_flight) = self.in_flight.pop_front() {
            let result = in_flight.wait();
            if first.is_ok() {
                first = result;
            }
        }
        first
    }

    /// The first error of a call still in flight, if one has failed; never blocks on a call.
    pub(crate) fn poll_health(&self) -> Result<()> {
        for in_flight in &self.in_flight {
            let failure = in_flight
                .call
                .failure
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(err) = &*failure {
                return Err(err.clone());
            }
        }
        Ok(())
    }
}

/// The checked plan of `shape` over `world` host ranks, as `config` asks (the algorithm, the
/// ring's chunk and slots), proven through `cache`'s lemmas where they apply.
fn checked_host_plan<P>(
    shape: &Shape,
    world: usize,
    config: &HostConfig,
    cache: &mut PlanCache<P>,
) -> Result<Plan> {
    let bytes = shape.count.saturating_mul(shape.elem_bytes);
    let transports = vec![config.transport.on_host(); world];
    let (chunk, slots) = (config.chunk_elems, config.slots);
    if shape.collective != Collective::AllReduce {
        let algorithm = config.algorithm.choose_for(
            &shape.collective,
            bytes,
            world,
            shape.in_place,
            true,
            config.deterministic,
        );
        return if algorithm == Algorithm::OneShot {
            shape.checked_oneshot_collective_plan(world)
        } else {
            shape.checked_collective_plan(chunk, slots, 1, transports)
        };
    }
    // Staged edges: the host runs the plans ranks without peer access would (the staged
    // one-shot reads only host copies; the ring moves chunks through host slots).
    if config.transport == Transport::Staged {
        return match config
            .algorithm
            .choose_staged(bytes, world, config.deterministic)
        {
            Algorithm::OneShot => shape.checked_staged_oneshot_plan(world),
            Algorithm::TwoShot => Err(Error::InvalidArgument(
                "the two-shot reads its peers' buffers: it cannot run over staged edges (use \
                 the ring, the one-shot or Auto)"
                    .into(),
            )),
            _ => cache.checked_ring_plan(shape, chunk, slots, 1, transports),
        };
    }
    match config.algorithm.choose_host(world, config.deterministic) {
        Algorithm::OneShot => cache.checked_oneshot_plan(shape, world),
        Algorithm::TwoShot => shape.checked_twoshot_plan(world, 1, Gather::Push),
        _ => cache.checked_ring_plan(shape, chunk, slots, 1, transports),
    }
}

/// A call the rank threads have, until the caller has seen it end.
struct InFlight {
    call: Arc<HostCall>,
}

impl InFlight {
    /// Returns when every rank is done with the call (or the call failed and every thread has
    /// stopped touching its buffers), with the call's first error.
    fn wait(self) -> Result<()> {
        self.call.wait_done(|(rank, stream)| {
            let waiting_on = match stream {
                Some(s) => format!("did not finish the operations on its {s:?} stream"),
                None => "did not finish enqueuing its operations".into(),
            };
            (rank, waiting_on)
        })
    }
}

impl Drop for HostExecutor {
    fn drop(&mut self) {
        // Calls still in flight may write the caller's buffers: they end (or fail at their
        // deadline, aborted by the backstop) before anything is released.
        let _ = self.synchronize();
        for (tx, handle) in self.ranks.drain(..) {
            drop(tx);
            // A rank thread only ends by its channel closing; a panic inside it was caught.
            let _ = handle.join();
        }
        for (tx, handle) in self.helpers.drain(..) {
            drop(tx);
            // Between calls a helper only waits on its channel; a panic in a unit was caught.
            let _ = handle.join();
        }
    }
}

/// A rank's thread: for each call, enqueue the rank's program onto its streams — the Send, Recv
/// and Reduce workers, and its own list for the Main stream — then run the Main stream itself.
///
/// Why running Main here cannot deadlock: a rank's enqueue of a call waits only for other
/// ranks' enqueues of the same call (the handoffs; the checker proves they never cycle), and
/// every rank enqueues all of a call before it runs that call's Main stream, whose commands
/// wait only for work of that call or earlier ones, all enqueued by then.
fn host_rank_thread(mut handoff: Handoff, calls: Receiver<Arc<HostCall>>) {
    let rank = handoff.rank;
    let workers = stream_workers(rank, false).expect("spawning a stream worker thread");
    let mut main = Stream::new(rank, StreamKind::Main);
    while let Some(call) = super::spin_recv(&calls) {
        // Only the streams the rank's program uses take part in the call (a thread woken for
        // nothing is what makes small calls slow on few cores).
        let used = call.prepared.plan.streams(rank);
        let taking_part = || {
            workers
                .iter()
                .zip(StreamKind::ALL)
                .filter(|(_, s)| used.contains(s))
                .filter_map(|(worker, _)| worker.as_ref().map(|(tx, _)| tx))
        };
        for tx in taking_part() {
            let _ = tx.send(Cmd::Begin(call.clone()));
        }
        let mut backend = HostEnqueue {
            call: &call,
            workers: &workers,
            main: Vec::new(),
        };
        let result = catch_unwind(AssertUnwindSafe(|| {
            enqueue_rank(
                &call.prepared.plan,
                &call.prepared.waiters,
                call.id,
                &mut handoff,
                &mut backend,
                Limits {
                    deadline: call.deadline,
                    timeout: call.timeout,
                    abort: &call.abort,
                },
            )
        }));
        match result {
            Ok(Ok(())) => {}
            Ok(Err(err)) => call.fail(err),
            Err(payload) => call.fail(Error::RankFailed {
                rank,
                during: "enqueue".into(),
                message: panic_message(&*payload),
            }),
        }
        for tx in taking_part() {
            let _ = tx.send(Cmd::End);
        }
        call.done.report((rank, None));
        if used.contains(&StreamKind::Main) {
            main.run(Cmd::Begin(call.clone()));
            for cmd in backend.main {
                main.run(cmd);
            }
            main.run(Cmd::End);
        }
    }
    for (tx, handle) in workers.into_iter().flatten() {
        drop(tx);
        let _ = handle.join();
    }
}

/// A worker thread for each stream of rank `rank`, by [`StreamKind::index`], with the channel
/// that feeds it — but `None` for Main unless `main_worker` (a rank thread runs its Main stream
/// itself; a rank of its own process, whose calls return before they run, does not).
fn stream_workers(rank: usize, main_worker: bool) -> Result<Vec<Option<Worker>>> {
    StreamKind::ALL
        .iter()
        .map(|&stream| {
            if stream == StreamKind::Main && !main_worker {
                return Ok(None);
            }
            let (tx, rx) = crossbeam_channel::unbounded();
            let handle = std::thread::Builder::new()
                .name(format!("ringreduce-rank-{rank}-{stream:?}"))
                .spawn(move || stream_worker(rank, stream, rx))
                .map_err(|e| Error::Resource {
                    what: format!("cannot start a stream worker: {e}"),
                })?;
            Ok(Some((tx, handle)))
        })
        .collect()
}

/// A stream worker thread and the channel that feeds it.
type Worker = (Sender<Cmd>, JoinHandle<()>);

/// The rank thread's view of its streams while enqueuing one call: the workers, and the Main
/// stream's commands, which the rank thread runs once the call is enqueued.
struct HostEnqueue<'a> {
    call: &'a HostCall,
    workers: &'a [Option<Worker>],
    main: Vec<Cmd>,
}

impl Enqueue for HostEnqueue<'_> {
    fn enqueue(&mut self, index: usize, instr: &Instr) -> Result<()> {
        let Some(cmd) = command(&self.call.prepared.events, index, instr) else {
            return Ok(());
        };
        match &self.workers[instr.stream.index()] {
            Some((tx, _)) => tx.send(cmd).map_err(|_| Error::Closed),
            None => {
                self.main.push(cmd);
                Ok(())
            }
        }
    }
}

/// What a stream worker is told to do for instruction `index`, with CUDA's event semantics:
/// a record takes the event's next generation; a wait captures the latest one enqueued, and a
/// wait on an event never recorded does nothing (`None`).
fn command(events: &[HostEvent], index: usize, instr: &Instr) -> Option<Cmd> {
    Some(match instr.op {
        Op::Record(e) => Cmd::Record {
            event: e.0,
            generation: events[e.0].enqueued.fetch_add(1, Ordering::AcqRel) + 1,
        },
        Op::Wait(e) => match events[e.0].enqueued.load(Ordering::Acquire) {
            0 => return None,
            target => Cmd::Wait {
                event: e.0,
                target,
                index,
            },
        },
        _ => Cmd::Run { index },
    })
}
