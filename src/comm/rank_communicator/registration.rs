//! Registered buffers of a GPU [`RankCommunicator`] ([`RankCommunicator::register`], NCCL's
//! window registration): every rank exports the allocation its buffers lie in and maps its
//! peers', so that later calls on buffers inside them run in place, without copies; a
//! [`Registration`] is what [`RankCommunicator::deregister`] undoes.

use super::{broken, guarded, Inner, RankCommunicator};
use crate::buffer::Buffer;
use crate::element::Element;
use crate::error::{Error, Result};

/// A registration of [`RankCommunicator::register`]: what [`RankCommunicator::deregister`]
/// undoes. Dropping it undoes nothing (the communicator's close does).
#[derive(Debug)]
#[must_use = "a registration is undone by RankCommunicator::deregister, or when the communicator closes"]
pub struct Registration {
    index: usize,
}

impl RankCommunicator {
    /// Registers the GPU allocation `buf` lies in, so that later calls on buffers inside it run
    /// on them directly: peers in other processes read and write it in place, with no copies
    /// into and out of the memory this rank exports for its calls (NCCL's window registration,
    /// `ncclCommWindowRegister`; vLLM's registered custom all-reduce buffers). Collective: every
    /// rank registers one buffer of its own in the same turn, and all wait for each other (the
    /// timeout bounds it). Each exports its allocation (a legacy IPC handle for `cuMemAlloc`
    /// memory such as [`GpuBuffer`](crate::GpuBuffer)'s) and maps every peer's, once, until
    /// [`RankCommunicator::deregister`] or the communicator closes.
    ///
    /// Whether a call runs on registered memory is decided without asking the peers at call
    /// time. A call that meets the peers' hosts anyway (the copy engines' plans — a forced ring
    /// — and a capture, checked once) runs without copies when every rank's buffers of it lie
    /// in memory it registered (each rank publishes where, beside the call's shape) and no
    /// rank's input and output of an out-of-place call overlap (the plan might write the
    /// output before it has read the input: NCCL's in-place forms, which ringreduce-nccl passes
    /// as out-of-place calls). A kernel's call across processes is gated instead (it returns
    /// once enqueued) and copies, as an unregistered call does — for kernels without copies,
    /// register symmetric ([`RankCommunicator::register_symmetric`]). Registration never
    /// changes a result, only the copies.
    /// Memory freed and allocated again at the same address is not taken for registered (the
    /// driver's allocation id is checked at each call). Refused by name, on every rank alike:
    /// stream-ordered pool memory (`cuMemAllocAsync`, cudarc's default allocation on a stream)
    /// and `cuMemCreate` memory of another allocator, which CUDA cannot share by a handle this
    /// library can pass; a buffer on another GPU or in host memory; host ranks and jobs on
    /// several hosts, which have nothing to register. A refused turn registers nothing and
    /// leaves the communicator working. [`RankCommunicator::last_ran`] says whether a call ran
    /// on registered buffers, without copies.
    ///
    /// # Safety
    /// The allocation `buf` lies in is not freed until this registration is deregistered on
    /// every rank ([`RankCommunicator::deregister`] returned) or the communicator is closed or
    /// dropped: CUDA leaves it undefined to free memory that another process still maps. And no
    /// CUDA graph that captured a call on registered buffers is replayed after that.
    ///
    /// Hence `unsafe`: safe code cannot register.
    ///
    /// ```compile_fail,E0133
    /// # fn f(comm: &mut ringreduce::RankCommunicator, buf: &ringreduce::GpuBuffer<f32>) {
    /// let registration = comm.register(buf); // E0133: call to unsafe function
    /// # }
    /// ```
    pub unsafe fn register<T: Element, B: Buffer<T> + ?Sized>(
        &mut self,
        buf: &B,
    ) -> Result<Registration> {
        // SAFETY: our caller's contract, passed on.
        unsafe { self.register_as(buf, false) }
    }

    /// [`RankCommunicator::register`], with the caller's promise that the registration is used
    /// symmetrically (NCCL's `NCCL_WIN_COLL_SYMMETRIC`): every rank registers its allocation in
    /// the same turn, and a call on buffers inside it passes, on every rank, buffers at the same
    /// offsets into that turn's allocations. Every rank then decides alone that a call runs on
    /// the registered buffers (its peers' at its own offsets), and the call returns once
    /// enqueued, whatever the peers' hosts are doing — no meeting, as for an unregistered call.
    /// The promise is checked, never trusted: the call gate on the GPU compares where every
    /// rank's buffers lie before any peer's memory is touched, so a rank whose buffers lie
    /// elsewhere (another offset, or unregistered memory) is an [`Error::CallMismatch`] on every
    /// rank, and nothing runs. Every rank registers a turn alike (symmetric or not), else the
    /// turn is refused; where the ranks' buffers lie at different offsets into their
    /// allocations the turn counts as [`RankCommunicator::register`]'s (a kernel's call on it
    /// then copies, as there). A broadcast or a reduce, whose ranks pass different buffers,
    /// copies.
    ///
    /// # Safety
    /// As for [`RankCommunicator::register`].
    pub unsafe fn register_symmetric<T: Element, B: Buffer<T> + ?Sized>(
        &mut self,
        buf: &B,
    ) -> Result<Registration> {
        // SAFETY: our caller's contract, passed on.
        unsafe { self.register_as(buf, true) }
    }

    /// [`RankCommunicator::register`] or, `symmetric`, [`RankCommunicator::register_symmetric`].
    ///
    /// # Safety
    /// As for [`RankCommunicator::register`].
    unsafe fn register_as<T: Element, B: Buffer<T> + ?Sized>(
        &mut self,
        buf: &B,
        symmetric: bool,
    ) -> Result<Registration> {
        broken(&self.broken)?;
        // A bad buffer is refused in the turn, on every rank alike (not before it, which would
        // leave the peers waiting).
        let own = self.placed(buf).map(|()| buf.address());
        match &mut self.inner {
            Inner::Gpu { exec, .. } => {
                // A refused turn leaves the communicator working; a failed job breaks it.
                let index = guarded(&mut self.broken, || exec.register(own, symmetric))??;
                Ok(Registration { index })
            }
            Inner::GpuHosts(_) => Err(Error::InvalidArgument(
                "registration serves the ranks of one host: a job on several hosts copies its \
                 buffers"
                    .into(),
            )),
            Inner::Host(_) | Inner::Hosts(_) => Err(Error::InvalidArgument(
                "host ranks have no GPU memory to register".into(),
            )),
        }
    }

    /// Undoes `registration` with every rank in the same turn (collective, as registering):
    /// each waits for its queued work, unmaps its peers' allocations of that turn, and meets the
    /// others — when this returns, no rank maps this rank's allocation any more, and it may be
    /// freed. Ranks that deregister different registrations get `InvalidArgument` and nothing
    /// changes.
    pub fn deregister(&mut self, registration: Registration) -> Result<()> {
        broken(&self.broken)?;
        match &mut self.inner {
            Inner::Gpu { exec, .. } => {
                guarded(&mut self.broken, || exec.deregister(registration.index))?
            }
            _ => Err(Error::InvalidArgument(
                "this communicator registers nothing".into(),
            )),
        }
    }
}
