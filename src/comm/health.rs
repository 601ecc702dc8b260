//! Waiting for a [`Communicator`]'s work and ending it: [`Communicator::synchronize`], the
//! first error it met ([`Communicator::health`], which never waits for a running call), and
//! [`Communicator::abort`] and [`Communicator::close`].

use super::{Communicator, Executor, State};
use crate::error::{Error, Result};
use crate::exec::profile::{self, HostPhase};
use std::sync::TryLockError;

impl Communicator {
    /// Blocks until all work enqueued by this communicator has finished.
    ///
    /// # Errors
    /// After a timeout, a stuck GPU may still write the buffers once this has returned: read
    /// [`Communicator`]'s "A failed or timed-out call" before freeing or reusing them.
    pub fn synchronize(&self) -> Result<()> {
        self.begin_profile();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        profile::mark(HostPhase::Lock);
        let result = match state.exec.as_mut() {
            Some(Executor::Cuda(exec)) => exec.synchronize(),
            Some(Executor::Host(exec)) => exec.synchronize(),
            None => return Err(Error::Closed),
        };
        drop(state);
        self.end_profile("synchronize");
        // An error here is the GPU's (a CUDA error, or a one-shot kernel that gave up at a
        // barrier): the enqueued collectives failed, and so has the communicator.
        if let Err(err) = &result {
            let _ = self.failed.set(err.clone());
        }
        result
    }

    /// The first error a collective hit, if any (like `ncclCommGetAsyncError`); never blocks on
    /// a running collective's work. On GPUs it also asks the GPUs, without waiting, for errors
    /// of work enqueued earlier (a one-shot kernel that gave up at a barrier, a failed copy or
    /// kernel); such an error marks the communicator failed, as a call would have.
    pub fn health(&self) -> Result<()> {
        if let Some(err) = self.failed.get() {
            return Err(err.clone());
        }
        let polled = match self.state.try_lock() {
            Ok(state) => Self::poll(&state),
            Err(TryLockError::Poisoned(p)) => Self::poll(&p.into_inner()),
            // A call (or an abort) holds the lock; nothing has failed so far.
            Err(TryLockError::WouldBlock) => Ok(()),
        };
        if let Err(err) = &polled {
            if !matches!(err, Error::Closed) {
                let _ = self.failed.set(err.clone());
            }
        }
        polled
    }

    /// `health`'s look at the executor, under the state lock.
    fn poll(state: &State) -> Result<()> {
        match &state.exec {
            None => Err(Error::Closed),
            Some(Executor::Cuda(exec)) => exec.poll_health(),
            Some(Executor::Host(exec)) => exec.poll_health(),
        }
    }

    /// Releases the communicator's threads and memory, whatever state it is in; later calls return
    /// [`Error::Closed`]. A collective running on another thread is not interrupted: `abort` waits
    /// for it to end, which its deadline bounds. On GPUs, work already enqueued is waited for
    /// before the memory it uses is freed — at most the communicator's timeout: a GPU still busy
    /// then (a stuck kernel or stream) keeps its streams, events and buffers, which are leaked
    /// rather than freed under work that may still touch them.
    pub fn abort(&self) {
        let exec = self
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .exec
            .take();
        drop(exec);
    }

    /// Shuts down cleanly and returns the first error the communicator met, if any, including
    /// errors of work that was still enqueued (waited for at most the timeout, as in `abort`).
    pub fn close(self) -> Result<()> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // Work still enqueued may fail only now; its error is the first one if none came before.
        let shutdown = match state.exec.take() {
            Some(Executor::Cuda(exec)) => exec.shutdown(),
            Some(Executor::Host(mut exec)) => exec.synchronize(),
            None => Ok(()),
        };
        if let Err(err) = shutdown {
            let _ = self.failed.set(err);
        }
        match self.failed.get() {
            Some(err) => Err(err.clone()),
            None => Ok(()),
        }
    }
}
