//! Waiting for a communicator's GPUs and letting go of them: `synchronize`, `poll_health`,
//! `close` (through `shutdown`) and `Drop`.
//!
//! Teardown never hangs on a stuck GPU: every wait polls the streams (never
//! `cuStreamSynchronize`) for at most the communicator's timeout. A GPU still busy then keeps this
//! communicator's streams, events, staging buffers and peer-kernel flags — leaked on purpose,
//! since freeing memory that stuck work may yet touch would turn a hang into corruption.
//!
//! Invariant: memory is freed only when every stream of every rank reports idle.

use super::{CudaExecutor, CACHED_PLANS};
use crate::device;
use crate::error::{Error, Result};
use crate::exec::profile::{self, HostPhase};
use crate::exec::PlanCache;
use crate::plan::StreamKind;
use std::time::{Duration, Instant};

impl CudaExecutor {
    /// Blocks until every rank's streams are idle, at most the communicator's timeout, and
    /// reports what the GPUs left: a CUDA error of queued work, a peer kernel's barrier
    /// timeout, or [`Error::Timeout`] naming a GPU that is still busy after the timeout.
    pub(crate) fn synchronize(&self) -> Result<()> {
        let result = self.drain();
        match &result {
            Err(err) => self.fabric.fail(err),
            Ok(()) => self.fabric.finished(),
        }
        result
    }

    /// What the GPUs report without waiting: a peer kernel's barrier timeout, or an error of
    /// earlier asynchronous work (`cuStreamQuery` on each rank's Main stream returns it).
    /// Puts the calling thread's context back.
    /// Waits for every local stream and checks the kernels' error words, without telling the
    /// peers anything (a plan's eviction inside a call waits so: that call is not finished).
    pub(crate) fn drain(&self) -> Result<()> {
        let result = self.wait_idle(self.config.timeout).and_then(|()| {
            profile::mark(HostPhase::Wait);
            self.check_error_words()
        });
        profile::mark(HostPhase::Check);
        result
    }

    /// Every rank's `words`, by rank, through the fabric (a collective step of every rank).
    pub(crate) fn exchange(&self, words: &[u64]) -> Result<Vec<Vec<u64>>> {
        self.fabric.all_gather(vec![words.to_vec()])
    }

    /// A peer of another process that is gone or failed, as the error naming it.
    pub(crate) fn lost_peer(&self) -> Option<Error> {
        let lost = self.fabric.lost_peer();
        if lost.is_some() {
            // Kernels waiting for the lost peer (a call gate, a barrier) stop now, not at their
            // deadline: a blocking call of this process waits for them first (`device::gate`).
            self.stop_kernels();
        }
        lost
    }

    /// Stops this executor's kernels where they wait (every rank's error word set: they return
    /// within microseconds) — for a caller that gives a call up from the host while the work it
    /// enqueued may still be spinning (a rank of a job on several hosts whose other level
    /// failed).
    pub(crate) fn stop_kernels(&self) {
        for r in &self.ranks {
            r.res.give_up(crate::exec::cuda::kernels::ERR_PEER_LOST);
        }
    }

    /// A handle that gives this executor's ranks up from any thread (`Fabric::abort`).
    pub(crate) fn abort_handle(&self) -> crate::comm::AbortHandle {
        crate::comm::AbortHandle::new(self.fabric.clone())
    }

    pub(crate) fn poll_health(&self) -> Result<()> {
        self.check_error_words()?;
        let saved = device::save_current()?;
        // (Relaxed: the caller may be a watchdog thread while another thread captures a graph.)
        let polled = device::capture_relaxed(|| {
            self.ranks.iter().try_fold(true, |idle, r| {
                device::stream_query(r.res.stream(StreamKind::Main)).map(|done| idle && done)
            })
        })
        .and_then(|polled| polled);
        saved.restore()?;
        // Every call this process enqueued has completed: its part of the job's latest call is
        // done, and its process may end without its peers taking it for lost.
        if polled? {
            self.fabric.finished();
        }
        Ok(())
    }

    /// Polls every rank's streams until all are idle (or report an error) or `within` has
    /// passed. Returns the first CUDA error a stream reported (the root cause), else
    /// [`Error::Timeout`] naming the first GPU still busy. Polling, not `cuStreamSynchronize`, so
    /// that a stuck GPU cannot hold the caller forever; a stream that reports an error does not
    /// stop the wait for the others.
    fn wait_idle(&self, within: Duration) -> Result<()> {
        let start = Instant::now();
        let mut busy: Vec<(usize, usize)> = self
            .ranks
            .iter()
            .enumerate()
            .flat_map(|(rank, r)| (0..r.res.streams.len()).map(move |s| (rank, s)))
            .collect();
        let mut first_error: Option<Error> = None;
        let mut watch = super::watch::PeerWatch::new(start);
        loop {
            // A lost peer of another process: give the calls up, as `wait_done` does.
            if watch.gives_up(&*self.fabric, Instant::now()) {
                self.stop_kernels();
            }
            busy.retain(|&(rank, s)| {
                match device::stream_query(&self.ranks[rank].res.streams[s]) {
                    Ok(idle) => !idle,
                    Err(err) => {
                        first_error.get_or_insert(err);
                        false
                    }
                }
            });
            let Some(&(rank, s)) = busy.first() else {
                return first_error.map_or(Ok(()), Err);
            };
            let waited = start.elapsed();
            if waited >= within {
                if let Some(err) = first_error {
                    return Err(err);
                }
                return Err(Error::Timeout {
                    rank,
                    waiting_on: format!(
                        "GPU {}'s {:?} stream was still busy (a collective, or work queued before one, did not finish)",
                        self.ranks[rank].res.device,
                        StreamKind::ALL[s]
                    ),
                    after: within,
                });
            }
            crate::exec::pace::DRAIN.rest(waited);
        }
    }

    /// Waits (at most the timeout) for the GPUs to finish this communicator's work, reports
    /// what they left, and frees everything — except when any stream is still busy (or in an
    /// error state) after the timeout: then the communicator's streams, events and buffers on
    /// every GPU are leaked on purpose, since freeing memory that a stuck copy or kernel may still
    /// touch would turn a hang into memory corruption.
    pub(crate) fn shutdown(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        // Idle between calls (a call waits for its launchers): stopped and joined at once; so is
        // the watcher (within its period).
        self.launchers = None;
        self.watcher = None;
        for (tx, handle) in self.threads.drain(..) {
            drop(tx);
            let _ = handle.join();
        }
        if self.ranks.is_empty() {
            return Ok(()); // torn down already
        }
        // A rank that aborted, or whose peer is lost, first stops its kernels that wait (the
        // gate below waits for them, up to their deadline).
        let _ = self.lost_peer();
        // Freeing memory and destroying streams may wait for the GPUs: none of it overlaps
        // another communicator's peer kernels (`device::gate`).
        let quiet = device::gate::quiet();
        let result = self.synchronize();
        // Ranks of other processes: every one idle before any frees what the others imported
        // (a rank that failed, or a peer already gone, ends the wait: bounded either way).
        let parted = match result.is_ok() {
            true => self.fabric.farewell(),
            false => Ok(()),
        };
        // Free only what no GPU can still touch: every stream idle. A stream still busy, or one
        // in an error state that cannot say, keeps everything (its context may be broken anyway,
        // and freeing would then fail or block).
        let all_idle = self.ranks.iter().all(|r| {
            r.res
                .streams
                .iter()
                .all(|s| matches!(device::stream_query(s), Ok(true)))
        });
        if !all_idle {
            self.fabric.keep_mapped();
            std::mem::forget(std::mem::replace(
                &mut self.cache,
                PlanCache::new(CACHED_PLANS),
            ));
            std::mem::forget(std::mem::take(&mut self.pinned));
            for rank in &mut self.ranks {
                rank.release(true);
            }
            std::mem::forget(std::mem::take(&mut self.ranks));
        }
        self.cache = PlanCache::new(CACHED_PLANS);
        self.pinned.clear();
        for rank in &mut self.ranks {
            rank.release(false);
        }
        self.ranks.clear();
        // What other processes exported to this one is unmapped once nothing here uses it.
        let closed = match all_idle {
            true => self.fabric.close_imports(),
            false => Ok(()),
        };
        drop(quiet);
        result.and(parted).and(closed)
    }
}

impl Drop for CudaExecutor {
    fn drop(&mut self) {
        // Queued work may still use the plans' events and buffers: let it finish first (at most
        // the timeout). An error here has nowhere to go (Drop never panics); `Communicator::close`
        // reports it through `shutdown`.
        let _ = self.teardown();
    }
}
