//! The one way every call of a [`Communicator`] reaches its executor: `submit_collective`
//! validates its arguments, takes the state lock, refuses a failed or closed communicator, runs the call
//! on host threads or GPUs (on the communicator's streams or the caller's), and marks the
//! communicator failed when the call failed. And what each call leaves to be asked: what it ran
//! ([`Communicator::last_ran`]) and the profile of its host phases
//! ([`Communicator::host_profile`]; module [`crate::exec::profile`]).

use super::{Communicator, Executor};
use crate::buffer::{Buffer, BufferMut, StreamUse};
use crate::device::CallerStream;
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::algorithm::Ran;
use crate::exec::cuda::executor::CudaExecutor;
use crate::exec::profile::{self, CallProfile, HostPhase};
use crate::exec::Shape;
use crate::plan::Collective;
use cudarc::driver::CudaStream;
use std::sync::Arc;

/// The most call profiles a communicator keeps until [`Communicator::host_profile`] takes
/// them (a few hundred bytes each), so that a profiled communicator nobody asks does not grow.
pub const PROFILED_CALLS_KEPT: usize = 1 << 16;

impl Communicator {
    /// The host phases of every call since the last time this was asked (oldest first; the
    /// first [`PROFILED_CALLS_KEPT`] of them, later ones are not kept), with
    /// [`CudaConfig::profile_host`](crate::CudaConfig::profile_host) on; empty otherwise. See
    /// [`crate::exec::profile`].
    pub fn host_profile(&self) -> Vec<CallProfile> {
        self.profile.as_ref().map_or_else(Vec::new, |log| {
            std::mem::take(&mut *log.lock().unwrap_or_else(|p| p.into_inner()))
        })
    }

    /// What the latest call ran, as the executor that ran it says ([`Ran`]: the algorithm and
    /// form of its plan, how the ranks reached each other, whether the caller's buffers were
    /// copied, registered or captured); `None` before the first call. Set once the call's plan
    /// is prepared, so a call that failed after says what it began to run. Waits for a call
    /// running on another thread.
    pub fn last_ran(&self) -> Option<Ran> {
        match &self.state.lock().unwrap_or_else(|p| p.into_inner()).exec {
            Some(Executor::Cuda(exec)) => exec.last_ran(),
            Some(Executor::Host(exec)) => exec.last_ran(),
            None => None,
        }
    }

    /// Opens the calling thread's phase log for a call, when this communicator profiles.
    pub(super) fn begin_profile(&self) {
        if self.profile.is_some() {
            profile::begin();
        }
    }

    /// Ends the call's last phase ([`HostPhase::Return`]) and keeps its profile when this
    /// communicator profiles. Closes whatever log is open on this thread either way: one that a
    /// profiled call left open when it returned early (an error) ends here, one call later.
    pub(super) fn end_profile(&self, call: &'static str) {
        profile::mark(HostPhase::Return);
        if let (Some(log), Some(p)) = (&self.profile, profile::end(call)) {
            let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
            if log.len() < PROFILED_CALLS_KEPT {
                log.push(p);
            }
        }
    }

    /// Validates, then runs one collective (in place when `inputs` is `None`): takes the state
    /// lock, refuses a failed or closed communicator, runs the call on host threads or GPUs (on
    /// the communicator's streams or the caller's), and marks the communicator failed when the
    /// call failed (refusals that enqueued nothing excepted).
    ///
    /// # Safety
    /// When `!wait_complete`, the buffers must stay valid and untouched until the collective has
    /// completed (see [`Communicator::enqueue_collective`]).
    pub(super) unsafe fn submit_collective<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        collective: &Collective,
        inputs: Option<&[I]>,
        outputs: &mut [O],
        op: ReduceOp,
        wait_complete: bool,
        caller: Option<&[Arc<CudaStream>]>,
    ) -> Result<()> {
        self.begin_profile();
        let layout = self.validate_collective::<T, I, O>(collective, inputs, outputs)?;
        let (ins, outs) = layout.addresses(inputs, outputs);
        let shape = Shape::collective::<T>(collective.clone(), layout.count, inputs.is_none(), op);
        profile::mark(HostPhase::Validate);
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        profile::mark(HostPhase::Lock);
        if let Some(err) = self.failed.get() {
            return Err(Error::CommunicatorFailed(Box::new(err.clone())));
        }
        let result = match state.exec.as_mut() {
            None => return Err(Error::Closed),
            Some(Executor::Host(_)) if caller.is_some() => return Err(Error::InvalidArgument(
                "a host communicator has no streams: the caller's streams need a GPU communicator"
                    .into(),
            )),
            // SAFETY: validation checked every buffer is host memory of the length the
            // collective needs and that no written buffer overlaps another buffer; each written
            // buffer is a distinct `&mut` borrow held by our caller until this returns, and with
            // `wait_complete` `run` returns only once every thread is done with the buffers;
            // without, their lifetime until completion is our caller's contract.
            Some(Executor::Host(exec)) => unsafe {
                exec.run::<T>(shape, &ins, &outs, op, wait_complete)
            },
            Some(Executor::Cuda(exec)) => {
                let raw: Option<Vec<CallerStream>> =
                    caller.map(|streams| streams.iter().map(|s| CallerStream::of(s)).collect());
                // Bad streams are the caller's mistake: refused without failing the
                // communicator, before any buffer is touched.
                let callers = match raw.as_deref().map(|s| exec.check_caller_streams(s)) {
                    Some(Err(err)) => return Err(err),
                    checked => checked.transpose().expect("an error returned above"),
                };
                if *collective == Collective::AllReduce {
                    exec.prepare_buffers(&outs)?;
                }
                // Each buffer records its use on the stream its rank's work starts and ends on
                // (cudarc's event tracking).
                layout.track(
                    inputs,
                    outputs,
                    &call_streams(exec, caller),
                    StreamUse::Before,
                );
                // SAFETY: validation checked every buffer is on its rank's GPU with the length
                // the collective needs and that no written buffer overlaps another; lifetimes are
                // our caller's contract.
                let result =
                    unsafe { exec.run::<T>(shape, &ins, &outs, op, wait_complete, callers) };
                layout.track(
                    inputs,
                    outputs,
                    &call_streams(exec, caller),
                    StreamUse::After,
                );
                result
            }
        };
        if let Err(err) = &result {
            // Refusals that enqueued nothing leave the communicator usable.
            if !matches!(err, Error::PlanRejected(_) | Error::NotCapturable { .. }) {
                let _ = self.failed.set(err.clone());
            }
        }
        drop(state);
        self.end_profile("collective");
        result
    }
}

/// The stream each rank's work of a call starts and ends on: the caller's, or Main.
fn call_streams<'a>(
    exec: &'a CudaExecutor,
    caller: Option<&'a [Arc<CudaStream>]>,
) -> Vec<&'a CudaStream> {
    match caller {
        Some(streams) => streams.iter().map(|s| &**s).collect(),
        None => exec.main_streams(),
    }
}
