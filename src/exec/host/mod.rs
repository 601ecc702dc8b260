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
//! This file holds the executor and its per-call state (`HostCall`, the reports a call waits for,
//! the commands its streams are sent); `host_config.rs` its options and the faults it can inject,
//! `host_plan.rs` a shape's checked plan with its staging, `rank_thread.rs` the rank threads,
//! `stream.rs` the stream workers that run the operations (events, barriers, faults), `pool.rs`
//! the pool, and `fold.rs` the element folds they call.

mod fold;
mod host_config;
mod host_plan;
mod host_streams;
mod pool;
pub(crate) mod process;
mod rank_thread;

pub use host_config::{Fault, FaultKind, HostConfig};

use self::fold::HostFolds;
use self::host_plan::{checked_host_plan, host_reach, HostPlan};
use self::rank_thread::{command, host_rank_thread, stream_workers, Worker};
use super::algorithm::Ran;
use super::{Handoff, PlanCache, Shape};
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::plan::{Region, StreamKind};
use crossbeam_channel::Sender;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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

/// The cores this process may run on (1 where the OS does not say).
fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Plans kept per communicator (each holds its staging memory); beyond this one is dropped.
const CACHED_PLANS: usize = 16;

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
    /// What the latest call ran (set once its plan is prepared).
    last_ran: Option<Ran>,
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
            last_ran: None,
        })
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
        self.last_ran = Some(prepared.ran(host_reach(&self.config)));
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

    /// What the latest call ran, once its plan was prepared.
    pub(crate) fn last_ran(&self) -> Option<Ran> {
        self.last_ran
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
