//! How a [`RankCommunicator`] ends, and what it met on the way: an error found without a call
//! returning it ([`RankCommunicator::async_error`], what a watchdog polls), giving the rank up
//! from any thread ([`AbortHandle`]), and closing cleanly or aborting
//! ([`RankCommunicator::close`], [`RankCommunicator::abort`]).

use super::{Inner, RankCommunicator};
use crate::error::{Error, Result};
use crate::exec::cuda::fabric::Fabric;
use std::sync::Arc;

impl RankCommunicator {
    /// An error this communicator has met without a call returning it (NCCL's
    /// `ncclCommGetAsyncError`): the failure that broke it, a GPU rank's kernel that gave up or
    /// a CUDA error on its streams, a peer of another process that is gone or failed. `None`
    /// while healthy. Never waits.
    pub fn async_error(&mut self) -> Option<Error> {
        if let Some(err) = &self.broken {
            return Some(err.clone());
        }
        let found = match &self.inner {
            Inner::Gpu { exec, .. } => exec.poll_health().err().or_else(|| exec.lost_peer()),
            Inner::GpuHosts(inner) => inner.health().err(),
            Inner::Host(_) | Inner::Hosts(_) => None,
        };
        if let Some(err) = &found {
            self.broken = Some(err.clone());
        }
        found
    }

    /// A handle that gives this rank up from any thread, while a call of this communicator
    /// may be waiting (NCCL's `ncclCommAbort` from a watchdog thread): [`AbortHandle::abort`].
    /// A host rank's handle does nothing.
    pub fn abort_handle(&self) -> AbortHandle {
        match &self.inner {
            Inner::Gpu { exec, .. } => exec.abort_handle(),
            Inner::GpuHosts(inner) => inner.abort_handle(),
            Inner::Host(_) | Inner::Hosts(_) => AbortHandle::none(),
        }
    }

    /// Shuts this rank down cleanly (NCCL's `ncclCommFinalize` then `ncclCommDestroy`): waits for
    /// what it enqueued, parts from its peers and frees its memory, and returns the first error
    /// the communicator met — the failure that broke it, or one of the shutdown (dropping it
    /// does the same and drops the error).
    pub fn close(self) -> Result<()> {
        let shutdown = match self.inner {
            Inner::Gpu { exec, .. } => exec.shutdown(),
            Inner::GpuHosts(inner) => inner.shutdown(),
            Inner::Host(rank) => {
                drop(rank);
                Ok(())
            }
            Inner::Hosts(rank) => {
                drop(rank);
                Ok(())
            }
        };
        match self.broken {
            Some(err) => Err(err),
            None => shutdown,
        }
    }

    /// Gives up on the job (NCCL's `ncclCommAbort`): the peers' waits in this job end with an
    /// error naming this rank, and the communicator is closed without waiting for them.
    pub fn abort(self) {
        self.abort_handle().abort();
        drop(self);
    }
}

/// Gives a rank up from any thread ([`RankCommunicator::abort_handle`]): a call of its waiting
/// for peers returns at once, its kernels give up at their next poll, its peers' calls fail
/// naming it, and its communicator closes without the farewell barrier.
#[derive(Clone)]
pub struct AbortHandle {
    fabric: Option<Arc<dyn Fabric>>,
}

impl std::fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AbortHandle").finish_non_exhaustive()
    }
}

impl AbortHandle {
    pub(crate) fn new(fabric: Arc<dyn Fabric>) -> AbortHandle {
        AbortHandle {
            fabric: Some(fabric),
        }
    }

    pub(crate) fn none() -> AbortHandle {
        AbortHandle { fabric: None }
    }

    /// Gives the rank up (see the type's doc). Idempotent.
    pub fn abort(&self) {
        if let Some(fabric) = &self.fabric {
            fabric.abort();
        }
    }

    /// While the returned guard lives, this rank's abort also ends the join of `id` (a
    /// sub-communicator's: `RankCommunicator::split`) — at once where the rank has aborted
    /// already; once it is dropped (the join is over), an abort leaves the new communicator
    /// alone, as NCCL's leaves a split's.
    pub(crate) fn watch_join(&self, id: &crate::exec::rendezvous::UniqueId) -> JoinWatch<'_> {
        if let Some(fabric) = &self.fabric {
            fabric.watch_join(id);
        }
        JoinWatch {
            handle: self,
            id: *id,
        }
    }
}

/// [`AbortHandle::watch_join`]'s guard.
pub(crate) struct JoinWatch<'a> {
    handle: &'a AbortHandle,
    id: crate::exec::rendezvous::UniqueId,
}

impl Drop for JoinWatch<'_> {
    fn drop(&mut self) {
        if let Some(fabric) = &self.handle.fabric {
            fabric.unwatch_join(&self.id);
        }
    }
}
