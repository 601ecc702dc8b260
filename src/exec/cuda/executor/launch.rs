//! Launcher threads: the peer kernels of one call launched on every GPU at once.
//!
//! A call without events (the peer kernels) is enqueued from the caller's thread. One thread
//! launching on every GPU pays each launch in turn — ~3 µs per GPU on 2×H200, 6.1–6.5 µs per
//! call for two GPUs against 3.2 µs with a thread per GPU (../shared/gpu/README.md, "Launch
//! floors") — and at small sizes the launches are the call. So each rank but the first has a
//! launcher thread, its rank's context current, which spins on its slot for a while after each
//! job ([`SPIN`]) and parks after that: a stream of calls finds it awake, an idle communicator
//! costs no CPU. The caller posts the call to every launcher, launches rank 0 itself, and waits
//! until every launcher has enqueued its rank.
//!
//! Invariant: a launcher takes a job only after the caller posted it (`posted` advances after
//! the call is in the slot, with release order), and the caller reads a launcher's result only
//! after the launcher finished it (`finished`, the same way); the caller waits for every
//! launcher it posted to before it returns, so a slot holds at most one job at a time.

use super::peer::enqueue_rank_inline;
use super::{CudaCall, RankRes};
use crate::device;
use crate::error::{Error, Result};
use crate::exec::panic_message;
use cudarc::driver::CudaContext;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

/// How long a launcher spins for its next job before it parks: longer than the gap between
/// back-to-back calls (a few µs) and a blocking call's completion wait (tens of µs).
const SPIN: Duration = Duration::from_micros(200);

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
    /// Starts a launcher for every rank but the first.
    pub(super) fn start(ranks: &[Arc<RankRes>]) -> Result<Launchers> {
        let contexts: Vec<Arc<CudaContext>> = ranks.iter().map(|r| r.ctx.clone()).collect();
        let mut launchers = Launchers {
            slots: Vec::new(),
            threads: Vec::new(),
            handles: Vec::new(),
            posted: 0,
        };
        for (rank, res) in ranks.iter().enumerate().skip(1) {
            let slot = Arc::new(Slot {
                call: Mutex::new(None),
                posted: AtomicU64::new(0),
                finished: AtomicU64::new(0),
                outcome: Mutex::new(None),
                stop: AtomicBool::new(false),
            });
            let (res, contexts, mine) = (res.clone(), contexts.clone(), slot.clone());
            let handle = std::thread::Builder::new()
                .name(format!("ringreduce-launch-{rank}"))
                .spawn(move || launcher(rank, &res, &contexts, &mine))
                .map_err(|e| Error::InvalidArgument(format!("cannot start a launcher: {e}")))?;
            launchers.threads.push(handle.thread().clone());
            launchers.handles.push(handle);
            launchers.slots.push(slot);
        }
        Ok(launchers)
    }

    /// Posts `call` to every launcher (each then enqueues its rank's program).
    pub(super) fn post(&mut self, call: &Arc<CudaCall>) {
        self.posted += 1;
        for (slot, thread) in self.slots.iter().zip(&self.threads) {
            *slot.call.lock().unwrap_or_else(|p| p.into_inner()) = Some(call.clone());
            slot.posted.store(self.posted, Ordering::Release);
            thread.unpark();
        }
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
                    if now - start < SPIN {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
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
    fn drop(&mut self) {
        for (slot, thread) in self.slots.iter().zip(&self.threads) {
            slot.stop.store(true, Ordering::Release);
            thread.unpark();
        }
        for handle in self.handles.drain(..) {
            let _ = handle.join();
        }
    }
}

/// A launcher's life: wait for a job (spin, then park), enqueue rank `rank`'s program, report.
fn launcher(rank: usize, res: &RankRes, contexts: &[Arc<CudaContext>], slot: &Slot) {
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
        let call = slot.call.lock().unwrap_or_else(|p| p.into_inner()).take();
        let result = match call {
            Some(call) => catch_unwind(AssertUnwindSafe(|| {
                enqueue_rank_inline(rank, res, contexts, &call)
            }))
            .unwrap_or_else(|payload| {
                Err(Error::RankFailed {
                    rank,
                    during: "enqueue".into(),
                    message: panic_message(&*payload),
                })
            }),
            None => Ok(()),
        };
        *slot.outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some((result, Instant::now()));
        slot.finished.store(seen, Ordering::Release);
        idle_since = Instant::now();
    }
}
