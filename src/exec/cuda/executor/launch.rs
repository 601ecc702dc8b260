//! The inline enqueue of a call whose ranks meet on the GPUs or do not cross at all (the peer
//! kernels; one rank; nothing to do), which skips the rank threads: `CudaExecutor::run_inline`
//! enqueues every rank's program ([`enqueue_rank`], the one function that enqueues a rank's
//! program, whichever thread calls it) from the caller's thread, binding each rank's
//! context in turn and putting its own back — or, with `launch_threads`, from launcher threads
//! that launch the peer kernels of one call on every GPU at once. The kernels meet on the GPUs
//! whenever each starts.
//!
//! Why launcher threads: one thread launching on every GPU pays each launch in turn, twice the
//! floor of a thread per GPU for two GPUs (docs/PERFORMANCE.md, "The test machine") — and at
//! small sizes the launches are the call. So each rank but the first has a
//! launcher thread, its rank's context current, which spins on its slot for a while after each
//! job ([`SPIN`]) and parks after that: a stream of calls finds it awake, an idle communicator
//! costs no CPU. The caller posts the call to every launcher, launches rank 0 itself, and waits
//! until every launcher has enqueued its rank.
//!
//! Invariant: a launcher takes a job only after the caller posted it (`posted` advances after
//! the call is in the slot, with release order), and the caller reads a launcher's result only
//! after the launcher finished it (`finished`, the same way); the caller waits for every
//! launcher it posted to before it returns (or, past the call's deadline, reports it as a
//! timeout; a later post displaces a job never taken), so a slot holds at most one job at a
//! time. Known cost of launching in parallel: when rank 0's enqueue fails (a driver error — the
//! arguments were validated before the call), the other ranks have launched already; their
//! kernels then time out at their barriers and leave their codes, as for a stuck GPU, where the
//! serial path would have launched nothing.

use super::enqueue::{record_done, wait_done, CudaEnqueue};
use super::peer_words::PeerWords;
use super::rank::RankRes;
use super::{CudaCall, CudaExecutor, Schedule};
use crate::device;
use crate::error::{Error, Result};
use crate::exec::pace::Pace;
use crate::exec::panic_message;
use crate::exec::profile::{self, HostPhase};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

/// A launch of a later rank's peer kernel this long after the first rank's counts as held up:
/// a launch takes microseconds, so this much is the driver blocked by another thread's call.
const LAUNCH_BLOCKED_AFTER: Duration = Duration::from_millis(100);

impl CudaExecutor {
    /// Enqueues a plan without events on every rank — from the calling thread for rank 0 and, where
    /// the communicator has them, from the launcher threads for the others at the same time
    /// (module `launch`), else from the calling thread rank after rank (each rank's work goes on
    /// its own streams, so the order between ranks does not matter: the peer kernels meet on the
    /// GPUs, whenever each is launched) — then waits for completion if asked. A panic is caught
    /// and returned as an error, as on the rank threads.
    ///
    /// `launching` is the gate's launch side, taken by the caller (module `device::gate`): held
    /// until every rank is enqueued, so that no blocking CUDA call of this crate falls between
    /// the ranks' launches.
    ///
    /// With `Schedule::Checked(order)` (the checker's enqueue order of the call's plan), every
    /// rank's instructions are enqueued interleaved in that order instead, so that every counter
    /// wait is enqueued after the signal it consumes.
    pub(super) fn run_inline(
        &mut self,
        call: &Arc<CudaCall>,
        launching: std::sync::RwLockReadGuard<'static, ()>,
        schedule: &Schedule,
    ) -> Result<()> {
        let order = match schedule {
            Schedule::Checked(order) => Some(&order[..]),
            Schedule::RankByRank | Schedule::RankThreads => None,
        };
        let saved = device::save_current()?;
        let started = Instant::now();
        if call.peer_call {
            for rank in &self.ranks {
                if let Some(peer) = &rank.peer {
                    peer.launched_at(started);
                }
            }
        }
        // Each rank's result and when its launch ended.
        let mut launched: Vec<(Result<()>, Instant)> = Vec::with_capacity(self.ranks.len());
        let mut displaced = Vec::new();
        match (order, self.launchers.as_mut()) {
            (Some(order), _) => {
                let result = catch_unwind(AssertUnwindSafe(|| {
                    enqueue_in_order(&self.ranks, call, order)
                }))
                .unwrap_or_else(|payload| {
                    Err(Error::RankFailed {
                        rank: 0,
                        during: "enqueue".into(),
                        message: panic_message(&*payload),
                    })
                });
                profile::mark(HostPhase::Launch);
                launched.push((result, Instant::now()));
            }
            (None, Some(launchers)) => {
                displaced = launchers.post(call);
                let first = &self.ranks[0];
                launched.push((
                    enqueue_rank(&first.res, first.peer.as_deref(), call),
                    Instant::now(),
                ));
                profile::mark(HostPhase::Launch);
                let launchers = self.launchers.as_ref().expect("posted above");
                launched.extend(launchers.wait(call.deadline));
                profile::mark(HostPhase::Launch);
            }
            (None, None) => {
                for rank in &self.ranks {
                    let result = enqueue_rank(&rank.res, rank.peer.as_deref(), call);
                    profile::mark(HostPhase::Launch);
                    let failed = result.is_err();
                    launched.push((result, Instant::now()));
                    if failed {
                        break;
                    }
                }
            }
        }
        drop(launching);
        drop(displaced);
        // A later rank's launch that ended long after the first: its kernel waited that long.
        let mut blocked: Option<(usize, Duration)> = None;
        let first = launched.iter().map(|(_, at)| *at).min().unwrap_or(started);
        for (rank, (_, at)) in launched.iter().enumerate() {
            let late = *at - first;
            if late >= LAUNCH_BLOCKED_AFTER && blocked.is_none_or(|(_, d)| late > d) {
                blocked = Some((rank, late));
            }
        }
        *self
            .launch_blocked
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = blocked;
        let result = match launched.into_iter().find_map(|(r, _)| r.err()) {
            Some(err) => {
                // Ranks already launched spin at their barriers until the kernel's timeout
                // (shorter than the call's deadline).
                self.settle_streams(call.deadline);
                Err(err)
            }
            None if call.wait_complete => {
                let waited = self.ranks.iter().try_for_each(|rank| {
                    wait_done(&rank.res, call).map_err(|err| self.name_blocked_launch(err))
                });
                profile::mark(HostPhase::Wait);
                let checked = waited.and_then(|()| self.check_error_words());
                profile::mark(HostPhase::Check);
                checked
            }
            None => Ok(()),
        };
        result.and(saved.restore())
    }

    /// After a call failed with some ranks' parts enqueued: waits until every stream of every
    /// rank is idle (their peer kernels and counter waits give up within three quarters of the
    /// timeout), so that nothing on a GPU touches the caller's buffers after the call has
    /// returned its error — at most until `deadline`: a stuck stream must not hold the caller.
    pub(super) fn settle_streams(&self, deadline: Instant) {
        let start = Instant::now();
        for stream in self.ranks.iter().flat_map(|r| &r.res.streams) {
            while matches!(device::stream_query(stream), Ok(false)) && Instant::now() < deadline {
                crate::exec::pace::DRAIN.rest(start.elapsed());
            }
        }
    }

    /// A timeout of a peer call whose launches were held up between ranks is that, by name:
    /// [`Error::LaunchBlocked`] instead of a timeout that blames a GPU. Any other timeout of a
    /// peer call says what else holds a peer kernel back: another thread's blocking CUDA calls
    /// on these GPUs make the driver hold a kernel's start on the GPU, not its launch (the gate's
    /// reason, [`crate::device::gate`]), which the host cannot tell from a stuck GPU.
    pub(super) fn name_blocked_launch(&self, err: Error) -> Error {
        let blocked = *self
            .launch_blocked
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match (err, blocked) {
            (Error::Timeout { .. }, Some((rank, late))) => Error::LaunchBlocked {
                rank,
                device: self.ranks[rank].res.device,
                late,
            },
            (
                Error::Timeout {
                    rank,
                    waiting_on,
                    after,
                },
                None,
            ) => Error::Timeout {
                rank,
                waiting_on: format!(
                    "{waiting_on} (a peer kernel waited for another that did not start: a stuck GPU, a peer's CUDA graph that was not replayed, or another thread's blocking CUDA call on these GPUs outside ringreduce — an allocation, a free, a pageable copy — during the call; docs/ERRORS.md, \"Several threads\")"
                ),
                after,
            },
            (err, _) => err,
        }
    }
}

/// Enqueues rank `rank`'s whole program of a call on its own streams (binding its context),
/// then its completion record: what the calling thread, a launcher thread or a rank thread
/// does for one rank. Gives up between instructions once the call is aborted (another rank
/// failed). A panic is caught and returned as [`Error::RankFailed`].
pub(super) fn enqueue_rank(res: &RankRes, peer: Option<&PeerWords>, call: &CudaCall) -> Result<()> {
    let rank = res.rank;
    catch_unwind(AssertUnwindSafe(|| {
        device::bind(&res.ctx)?;
        let plan = call.plan_of(rank);
        let main = res.stream(crate::plan::StreamKind::Main);
        for &(dst, src, bytes) in &call.copies_in {
            // SAFETY: the caller's buffer (validated, kept untouched until the call completes)
            // into the memory this rank exported for it, which no peer touches before this
            // rank's program signals or meets (the checked plan orders every access after
            // Main's start).
            unsafe { device::memcpy_async(dst, src, bytes, main)? };
        }
        let mut backend = CudaEnqueue::new(res, peer, plan, call);
        for instr in &plan.plan.ranks[rank] {
            if call.abort.load(Ordering::Acquire) {
                return Err(crate::exec::aborted(rank));
            }
            backend.enqueue(instr)?;
        }
        backend.finish()?;
        for &(dst, src, bytes) in &call.copies_out {
            // SAFETY: as above, back: the checker proved that every access to a rank's caller
            // buffers, by any rank, comes before its last Main instruction.
            unsafe { device::memcpy_async(dst, src, bytes, main)? };
        }
        record_done(res, call)
    }))
    .unwrap_or_else(|payload| {
        Err(Error::RankFailed {
            rank,
            during: "enqueue".into(),
            message: panic_message(&*payload),
        })
    })
}

/// Enqueues every rank's program of `call` from this thread, interleaved in `order` (the
/// checker's enqueue order of the plan: every wait after the record it waits for, so every
/// counter wait after its signal), then each rank's completion record.
///
/// Why: ranks that share a GPU share its context, and a context's streams share the GPU's few
/// hardware work queues (`CUDA_DEVICE_MAX_CONNECTIONS`, 8 by default). A counter wait whose
/// stream's next operation depends on it blocks its queue until it is signalled; were the
/// signal enqueued later on a stream mapped to the same queue, it would sit behind the wait
/// until the wait gave up. In this order every operation's dependencies are enqueued before it,
/// so whatever shares a queue, the head of each queue depends only on work that can run.
fn enqueue_in_order(
    ranks: &[super::rank::RankExecutor],
    call: &CudaCall,
    order: &[(usize, usize)],
) -> Result<()> {
    let mut enqueues: Vec<CudaEnqueue<'_>> = ranks
        .iter()
        .map(|r| CudaEnqueue::new(&r.res, r.peer.as_deref(), call.plan_of(r.res.rank), call))
        .collect();
    let mut bound = None;
    let mut bind = |rank: usize| -> Result<()> {
        if bound != Some(rank) {
            device::bind(&ranks[rank].res.ctx)?;
            bound = Some(rank);
        }
        Ok(())
    };
    for &(rank, index) in order {
        bind(rank)?;
        let plan = &call.plan_of(rank).plan;
        enqueues[rank].enqueue(&plan.ranks[rank][index])?;
    }
    for (rank, enqueue) in enqueues.iter_mut().enumerate() {
        bind(rank)?;
        enqueue.finish()?;
        record_done(&ranks[rank].res, call)?;
    }
    Ok(())
}

/// How long a launcher spins for its next job before it parks: longer than the gap between
/// back-to-back calls (a few µs) and a blocking call's completion wait (tens of µs).
const SPIN: Duration = Duration::from_micros(200);

/// The caller's thread waiting for the launchers to have enqueued a call: spins for [`SPIN`],
/// then yields (never sleeps: a launch takes microseconds).
const LAUNCHED: Pace = Pace {
    spin: SPIN,
    yield_until: Duration::MAX,
    sleep_min: Duration::ZERO,
    sleep_max: Duration::ZERO,
};

/// One launcher's mailbox.
struct Slot {
    call: Mutex<Option<Arc<CudaCall>>>,
    /// Sequence number of the latest job posted; a launcher takes jobs above what it has seen.
    posted: AtomicU64,
    /// Sequence number of the latest job finished, and its result and end time.
    finished: AtomicU64,
    outcome: Mutex<Option<(Result<()>, Instant)>>,
    stop: AtomicBool,
}

/// The launcher threads of one communicator, for ranks 1, 2, …
pub(super) struct Launchers {
    slots: Vec<Arc<Slot>>,
    threads: Vec<Thread>,
    handles: Vec<JoinHandle<()>>,
    posted: u64,
}

impl Launchers {
    /// Starts a launcher for every rank but the first: each enqueues rank `rank`'s program with
    /// its resources and peer words (`ranks[rank]`).
    pub(super) fn start(ranks: &[(Arc<RankRes>, Option<Arc<PeerWords>>)]) -> Result<Launchers> {
        let mut launchers = Launchers {
            slots: Vec::new(),
            threads: Vec::new(),
            handles: Vec::new(),
            posted: 0,
        };
        for (rank, (res, peer)) in ranks.iter().enumerate().skip(1) {
            let slot = Arc::new(Slot {
                call: Mutex::new(None),
                posted: AtomicU64::new(0),
                finished: AtomicU64::new(0),
                outcome: Mutex::new(None),
                stop: AtomicBool::new(false),
            });
            let (res, peer, mine) = (res.clone(), peer.clone(), slot.clone());
            let handle = std::thread::Builder::new()
                .name(format!("ringreduce-launch-{rank}"))
                .spawn(move || launcher(&res, peer.as_deref(), &mine))
                .map_err(|e| Error::Resource {
                    what: format!("cannot start a launcher: {e}"),
                })?;
            launchers.threads.push(handle.thread().clone());
            launchers.handles.push(handle);
            launchers.slots.push(slot);
        }
        Ok(launchers)
    }

    /// Posts `call` to every launcher (each then enqueues its rank's program). Returns the calls
    /// it displaced — posted earlier to a launcher that never took them (it was held past that
    /// call's deadline) — for the caller to drop once it no longer holds the launch gate (the
    /// last reference to a call may free GPU memory, which takes the gate).
    #[must_use]
    pub(super) fn post(&mut self, call: &Arc<CudaCall>) -> Vec<Arc<CudaCall>> {
        self.posted += 1;
        let mut displaced = Vec::new();
        for (slot, thread) in self.slots.iter().zip(&self.threads) {
            let old = slot
                .call
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .replace(call.clone());
            displaced.extend(old);
            slot.posted.store(self.posted, Ordering::Release);
            thread.unpark();
        }
        displaced
    }

    /// Waits until every launcher has finished the job posted last; per rank 1, 2, …, its result
    /// and when it finished. A launcher that does not finish by `deadline` (a launch the driver
    /// holds) is reported as a timeout.
    pub(super) fn wait(&self, deadline: Instant) -> Vec<(Result<()>, Instant)> {
        self.slots
            .iter()
            .enumerate()
            .map(|(i, slot)| {
                let start = Instant::now();
                while slot.finished.load(Ordering::Acquire) < self.posted {
                    let now = Instant::now();
                    if now >= deadline {
                        return (
                            Err(Error::Timeout {
                                rank: i + 1,
                                waiting_on: "its launcher thread, still enqueuing the call".into(),
                                after: now - start,
                            }),
                            now,
                        );
                    }
                    LAUNCHED.rest(now - start);
                }
                slot.outcome
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take()
                    .unwrap_or_else(|| (Ok(()), Instant::now()))
            })
            .collect()
    }
}

impl Drop for Launchers {
    /// Stops every launcher and joins the idle ones (all of them, between calls). One still
    /// inside its last job — a launch the driver held past the call's deadline — is left to
    /// finish on its own: joining it could wait as long as the driver holds it.
    fn drop(&mut self) {
        for (slot, thread) in self.slots.iter().zip(&self.threads) {
            slot.stop.store(true, Ordering::Release);
            thread.unpark();
        }
        for (slot, handle) in self.slots.iter().zip(self.handles.drain(..)) {
            if slot.finished.load(Ordering::Acquire) >= self.posted {
                let _ = handle.join();
            }
        }
    }
}

/// A launcher's life: wait for a job (spin, then park), enqueue its rank's program, report.
fn launcher(res: &RankRes, peer: Option<&PeerWords>, slot: &Slot) {
    let _ = device::bind(&res.ctx);
    let mut seen = 0;
    let mut idle_since = Instant::now();
    loop {
        if slot.stop.load(Ordering::Acquire) {
            return;
        }
        let posted = slot.posted.load(Ordering::Acquire);
        if posted == seen {
            if idle_since.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::park_timeout(Duration::from_millis(50));
            }
            continue;
        }
        seen = posted;
        // Held until the job is reported: the last reference to a call may free GPU memory,
        // which waits for the launch gate that the caller holds until this job is done.
        let call = slot.call.lock().unwrap_or_else(|p| p.into_inner()).take();
        let result = match &call {
            Some(call) => enqueue_rank(res, peer, call),
            None => Ok(()),
        };
        *slot.outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some((result, Instant::now()));
        slot.finished.store(seen, Ordering::Release);
        drop(call);
        idle_since = Instant::now();
    }
}
