//! The one way every call of a [`Communicator`] reaches its executor, once its arguments are
//! checked: `run` takes the state lock, refuses a failed or closed communicator, runs the call
//! on host threads or GPUs (on the communicator's streams or the caller's), and marks the
//! communicator failed when the call failed. And what each call leaves to be asked: what it ran
//! ([`Communicator::last_ran`]) and the profile of its host phases
//! ([`Communicator::host_profile`]; module [`crate::exec::profile`]).

use super::{Call, Communicator, Executor, When};
use crate::buffer::StreamUse;
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::algorithm::Ran;
use crate::exec::cuda::executor::CudaExecutor;
use crate::exec::profile::{self, CallProfile, HostPhase};
use crate::exec::Shape;
use crate::plan::Collective;
use cudarc::driver::CudaStream;

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

    /// Runs one validated call; `inputs` and `outputs` are the buffers' addresses as
    /// [`crate::exec::caller_address`] lays them out (`inputs` empty in place).
    ///
    /// # Safety
    /// The buffers passed validation; they stay valid and untouched by others until the call is
    /// complete (until this returns when `wait_complete`).
    pub(super) unsafe fn run<T: Element>(
        &self,
        call: Call,
        inputs: &[u64],
        outputs: &[u64],
        op: ReduceOp,
        when: When<'_>,
        track: &mut dyn FnMut(&[&CudaStream], StreamUse),
    ) -> Result<()> {
        let Call {
            collective,
            count,
            in_place,
        } = call;
        let When {
            wait_complete,
            caller,
        } = when;
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
            Some(Executor::Host(exec)) => {
                let shape = Shape::collective::<T>(collective, count, in_place, op);
                // SAFETY: validation checked every buffer is host memory of the length the
                // collective needs and that no written buffer overlaps another buffer; each
                // written buffer is a distinct `&mut` borrow held by our caller until this
                // returns, and with `wait_complete` `run` returns only once every thread is done
                // with the buffers; without, their lifetime until completion is our caller's
                // contract.
                unsafe { exec.run::<T>(shape, inputs, outputs, op, wait_complete) }
            }
            Some(Executor::Cuda(exec)) => {
                let callers: Option<Vec<crate::device::CallerStream>> = caller.map(|streams| {
                    streams
                        .iter()
                        .map(|s| crate::device::CallerStream::of(s))
                        .collect()
                });
                // Bad streams are the caller's mistake: refused without failing the communicator.
                if let Some(streams) = &callers {
                    exec.check_caller_streams(streams)?;
                }
                if collective == Collective::AllReduce {
                    exec.prepare_buffers(outputs)?;
                }
                let shape = Shape::collective::<T>(collective, count, in_place, op);
                // The stream each rank's work starts and ends on: the caller's, or Main.
                let on =
                    |exec: &CudaExecutor,
                     when: StreamUse,
                     track: &mut dyn FnMut(&[&CudaStream], StreamUse)| {
                        let streams: Vec<&CudaStream> = match caller {
                            Some(streams) => streams.iter().map(|s| &**s).collect(),
                            None => exec.main_streams(),
                        };
                        track(&streams, when);
                    };
                on(exec, StreamUse::Before, track);
                // SAFETY: validation checked every buffer is on its rank's GPU with the length the
                // collective needs and that no written buffer overlaps another; lifetimes are our
                // caller's contract.
                let result = unsafe {
                    exec.run::<T>(
                        shape,
                        inputs,
                        outputs,
                        op,
                        wait_complete,
                        callers.as_deref(),
                    )
                };
                on(exec, StreamUse::After, track);
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
