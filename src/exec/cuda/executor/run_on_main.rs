//! A call made ready on the ranks' Main streams (`ready_call`): its plan prepared (module
//! `prepare`), the peer kernels' buffers opened, the caller's buffers laid out as the plan's (or
//! staged, across processes) and who launches it decided — the caller's thread (module
//! `launch`) or the rank threads (`run_on_rank_threads`, here).
//!
//! Invariant: a call that fails after some of its ranks were enqueued returns only once their
//! streams have settled (bounded by the call's deadline; here for the rank threads, in module
//! `launch` for the inline path), so nothing it enqueued touches the caller's buffers afterwards.

use super::callers::Checked;
use super::enqueue::wait_done;
use super::pieces;
use super::{CudaCall, CudaExecutor, Prepared, Schedule};
use crate::device;
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::algorithm::Ran;
use crate::exec::caller_address;
use crate::exec::profile::{self, HostPhase};
use crate::plan::Collective;
use crossbeam_channel::Receiver;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLockReadGuard};
use std::time::{Duration, Instant};

/// A call ready to launch ([`CudaExecutor::ready_call`]).
pub(super) struct ReadyCall {
    pub(super) call: Arc<CudaCall>,
    pub(super) prepared: Arc<Prepared>,
    /// The launch side of the gate (module `device::gate`), taken for a call the caller's thread
    /// enqueues (`Schedule::RankByRank`, `Schedule::Checked`); `None`: the rank threads'.
    pub(super) launching: Option<RwLockReadGuard<'static, ()>>,
    /// Where the rank threads report each rank's enqueue (`CudaCall::done`).
    pub(super) done: Receiver<(usize, Result<()>)>,
}

impl CudaExecutor {
    /// Makes one call of `checked` (any collective's plan) ready on the Main streams: `captured`
    /// when the call is being captured into CUDA graphs (module `capture`).
    ///
    /// # Safety
    /// Every caller's buffer the plan of the checked shape declares is a device address on its
    /// rank's GPU, valid for the declared length; written buffers overlap nothing else in the
    /// call; nothing else touches them (or writes the ones read) until the call is complete —
    /// when its launch returns if `wait_complete`, else once each rank's Main stream has passed
    /// the call.
    pub(super) unsafe fn ready_call<T: Element>(
        &mut self,
        checked: Checked<'_>,
        op: ReduceOp,
        wait_complete: bool,
        captured: bool,
    ) -> Result<ReadyCall> {
        let Checked {
            shape,
            inputs,
            outputs,
            gate,
        } = checked;
        let (inputs, outputs) = (&inputs[..], &outputs[..]);
        let registered = shape.registered;
        let prepared = self.prepare(shape.clone())?;
        self.last_ran = Some(Ran {
            algorithm: prepared.algorithm,
            form: prepared.dispatch.form(),
            reach: self.reach(),
            in_place: prepared.plan.in_place,
            copied: prepared.staged.any(),
            registered,
            captured,
            pieces: 1,
        });
        profile::mark(HostPhase::Plan);
        let peer_kernel = prepared.dispatch.peer_kernel();
        if let Some(kernel) = peer_kernel {
            self.last_peer_kernel = kernel;
        }
        if let (Some(kernel), true) = (peer_kernel, self.in_one_process()) {
            let inputs = (!prepared.plan.in_place).then_some(inputs);
            self.open_peer_call(kernel, inputs, outputs)?;
        } else {
            // Codes left by an earlier call's kernels are that call's failure, reported before
            // this one runs.
            self.check_error_words()?;
        }
        // The caller's buffers, as the plan's buffers: in one process every rank's are at hand,
        // in one address space; staged (`Prepared::staged`), this rank's are copied into the
        // memory it exported for them, and back; the rest its kernels touch where they lie.
        let callers = prepared
            .plan
            .buffers
            .iter()
            .map(|decl| caller_address(decl, inputs, outputs).unwrap_or(0))
            .collect::<Vec<u64>>();
        let (mut copies_in, mut copies_out) = (Vec::new(), Vec::new());
        if prepared.staged.any() {
            let (rank, own) = (self.ranks[0].rank(), &prepared.ranks[0]);
            for (buf, decl) in prepared.plan.buffers.iter().enumerate() {
                let staged = decl.kind.is_callers() && prepared.staged.owns(decl.kind);
                if decl.rank != rank || !staged || callers[buf] == 0 {
                    continue;
                }
                let (staged, caller) = (own.addrs[buf], callers[buf]);
                // One copy, or one a block of a strided piece (module `pieces`).
                for (at, from, bytes) in pieces::segments(&shape, self.world, decl.len) {
                    copies_in.push((staged + at, caller + from, bytes));
                    if !decl.kind.is_read_only() {
                        copies_out.push((caller + from, staged + at, bytes));
                    }
                }
            }
        } else if prepared.plan.collective != Collective::AllReduce && self.in_one_process() {
            // The all-reduce's caller grants its pools (`prepare_buffers`) before the call.
            // (Registered buffers across processes are never pool memory: nothing to grant.)
            self.grant_pushers(&prepared.plan, &callers)?;
        }
        // A call whose ranks do not cross through counters is enqueued from this thread (module
        // `launch`); its peer kernels are launched under the gate (module `device::gate`): no
        // blocking CUDA call of this crate runs between the ranks' launches. Taken before the
        // call's deadline starts, and waited for at most the timeout (another thread's blocking
        // call waits for a stuck kernel at most that long): past it, nothing is launched and
        // the call fails by name.
        let launching = match prepared.schedule {
            Schedule::RankByRank | Schedule::Checked(_) => {
                Some(device::gate::launching(self.config.timeout).ok_or_else(|| {
                    Error::Timeout {
                        rank: 0,
                        waiting_on: "another thread's blocking call of ringreduce (an allocation, \
                                 copy or free of a GpuBuffer) to finish, before launching"
                            .into(),
                        after: self.config.timeout,
                    }
                })?)
            }
            Schedule::RankThreads => None,
        };
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let call = Arc::new(CudaCall {
            fabric: self.fabric.clone(),
            plans: prepared.ranks.clone(),
            first: self.ranks[0].rank(),
            callers,
            copies_in,
            copies_out,
            serial: prepared.serial,
            dtype: T::DTYPE,
            op,
            wait_complete,
            deadline: Instant::now() + self.config.timeout,
            timeout: self.config.timeout,
            abort: AtomicBool::new(false),
            done: done_tx,
            peer_call: peer_kernel.is_some(),
            captured,
            gate,
        });
        profile::mark(HostPhase::Open);
        Ok(ReadyCall {
            call,
            prepared,
            launching,
            done: done_rx,
        })
    }

    /// Hands `call` to the rank threads (each enqueues its rank's program, all at once, and
    /// reports on `done`) and waits until each has enqueued it — and, with the call's
    /// `wait_complete`, until it is complete.
    pub(super) fn run_on_rank_threads(
        &mut self,
        call: &Arc<CudaCall>,
        done: &Receiver<(usize, Result<()>)>,
    ) -> Result<()> {
        for (tx, _) in &self.threads {
            tx.send(call.clone()).map_err(|_| Error::Closed)?;
        }
        let mut first_error: Option<Error> = None;
        let mut pending: Vec<usize> = (0..self.ranks.len()).collect();
        let backstop = call.deadline + Duration::from_millis(250);
        while !pending.is_empty() {
            match done.recv_deadline(backstop) {
                Ok((rank, result)) => {
                    pending.retain(|&r| r != rank);
                    if let Err(err) = result {
                        call.abort.store(true, Ordering::Release);
                        first_error.get_or_insert(err);
                    }
                }
                Err(_) => {
                    call.abort.store(true, Ordering::Release);
                    self.settle_streams(call.deadline);
                    if let Some(lost) = self.fabric.lost_peer() {
                        first_error.get_or_insert(lost);
                    }
                    return Err(
                        first_error.unwrap_or(Error::Timeout {
                            rank: pending[0],
                            waiting_on:
                                "did not finish its part of the collective (its GPU may be hung)"
                                    .into(),
                            after: self.config.timeout,
                        }),
                    );
                }
            }
        }
        profile::mark(HostPhase::Launch);
        if let Some(err) = first_error {
            // The ranks that enqueued their part wait at counters that will never be signalled,
            // until their kernels give up: wait for that (bounded by the deadline), so that
            // nothing on a GPU touches the caller's buffers after this call has returned.
            self.settle_streams(call.deadline);
            return Err(err);
        }
        if call.wait_complete {
            // The caller's thread polls completion itself: the rank threads reported as soon as
            // they had enqueued (while the GPUs work), so no thread wake-up sits between the
            // GPUs finishing and this call returning.
            let saved = device::save_current()?;
            let waited = self.ranks.iter().try_for_each(|r| wait_done(&r.res, call));
            waited.and(saved.restore())?;
            profile::mark(HostPhase::Wait);
            self.check_error_words()?;
            profile::mark(HostPhase::Check);
        }
        Ok(())
    }
}
