//! A collective on the caller's streams: the entry point of every GPU call, which fences the
//! caller's streams (when given) around the communicator's own Main streams. Main then stands for
//! the caller's stream: the checker's start and completion rules make every access to a caller's
//! buffer follow the work queued before the call and precede the work queued after it.

use super::{capture, CudaExecutor};
use crate::device::{self, CallerStream};
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::job::CallShape;
use crate::exec::Shape;
use crate::plan::StreamKind;
use std::time::Instant;

impl CudaExecutor {
    /// Runs one collective of `shape` over device buffers (addresses laid out as
    /// [`crate::exec::caller_address`] lays them out; `inputs` empty in place).
    ///
    /// # Safety
    /// Every caller's buffer the plan of `shape` declares is a device address on its rank's GPU,
    /// valid for the declared length; written buffers overlap nothing else in the call; nothing
    /// else touches them (or writes the ones read) until the call is complete — when this returns
    /// if `wait_complete`, else once each rank's Main stream has passed the call.
    ///
    /// With `caller` streams (one per rank, enqueue only), the call starts after the work already
    /// queued on each and later work there waits for it: an event recorded on the caller's
    /// stream that Main waits for, and one recorded on Main after the call that the caller's
    /// stream waits for — Main stands for the caller's stream, which the checker's start and
    /// completion rules make exact. Events made once per rank; no host synchronisation. When the
    /// caller's streams are being captured, the collective becomes part of the caller's
    /// graph(s) (module `capture`).
    ///
    /// Over a fabric between processes, the call first meets its peers' (`Fabric::start_call`:
    /// the same shape on every rank, or [`Error::CallMismatch`] before anything is enqueued);
    /// a failure is told to the peers (`Fabric::fail`), and a blocking call's completion too.
    pub(crate) unsafe fn run<T: Element>(
        &mut self,
        shape: Shape,
        inputs: &[u64],
        outputs: &[u64],
        op: ReduceOp,
        wait_complete: bool,
        caller: Option<&[CallerStream]>,
    ) -> Result<()> {
        // Bad streams are this rank's mistake: refused before the peers hear of the call.
        if let Some(streams) = caller {
            self.check_caller_streams(streams)?;
        }
        let timeout = self.config.timeout;
        let started = self.fabric.start_call(
            CallShape::of(&shape, T::DTYPE, op),
            Instant::now() + timeout,
            timeout,
        );
        // SAFETY: our caller's contract, passed on.
        let result = started.and_then(|()| unsafe {
            self.run_fenced::<T>(shape, inputs, outputs, op, wait_complete, caller)
        });
        match &result {
            Err(err) => self.fabric.fail(err),
            Ok(()) if wait_complete => self.fabric.finished(),
            Ok(()) => {}
        }
        result
    }

    /// [`CudaExecutor::run`] once the call has started across the job.
    ///
    /// # Safety
    /// As for [`CudaExecutor::run`].
    unsafe fn run_fenced<T: Element>(
        &mut self,
        shape: Shape,
        inputs: &[u64],
        outputs: &[u64],
        op: ReduceOp,
        wait_complete: bool,
        caller: Option<&[CallerStream]>,
    ) -> Result<()> {
        let Some(streams) = caller else {
            // SAFETY: our caller's contract, passed on.
            return unsafe {
                self.run_shape_on_main::<T>(shape, inputs, outputs, op, wait_complete, false)
            };
        };
        self.check_caller_streams(streams)?;
        // A capture: the plan (prepared by an earlier call) is refused if it cannot be captured
        // before any stream joins the capture, and pinned, since the graph will hold its memory.
        let captured = capture::capturing(streams)?;
        if captured {
            self.pin_for_capture(shape.clone())?;
        }
        let saved = device::save_current()?;
        for (res, stream) in self.ranks.iter().map(|r| &*r.res).zip(streams) {
            // SAFETY: the stream is live (borrowed) and of the rank's context (checked above).
            unsafe { device::record_on_raw_stream(&res.fence_in, stream.raw()) }?;
            device::wait(&res.streams[StreamKind::Main.index()], &res.fence_in)?;
        }
        // SAFETY: our caller's contract, passed on.
        let result = unsafe {
            self.run_shape_on_main::<T>(shape, inputs, outputs, op, wait_complete, captured)
        };
        // Also after a failure: the caller's stream must not run ahead of what was enqueued.
        let fenced = self
            .ranks
            .iter()
            .map(|r| &*r.res)
            .zip(streams)
            .try_for_each(|(res, stream)| {
                device::record(&res.fence_out, &res.streams[StreamKind::Main.index()])?;
                // SAFETY: as above.
                unsafe { device::wait_on_raw_stream(&res.ctx, stream.raw(), &res.fence_out) }
            });
        result.and(fenced).and(saved.restore())
    }

    /// Each caller's stream belongs to its rank's GPU, in the context ringreduce uses there (the
    /// device's primary context, as cudarc's `CudaContext::new` gives).
    pub(crate) fn check_caller_streams(&self, streams: &[CallerStream]) -> Result<()> {
        if streams.len() != self.ranks.len() {
            return Err(Error::WorldMismatch {
                world: self.ranks.len(),
                got: streams.len(),
            });
        }
        for (rank, (res, stream)) in self.ranks.iter().map(|r| &r.res).zip(streams).enumerate() {
            if stream.device() != res.device {
                return Err(Error::WrongDevice {
                    rank,
                    device: stream.device(),
                    expected: res.device,
                });
            }
            if stream.context() != res.ctx.cu_ctx() {
                return Err(Error::InvalidArgument(format!(
                    "rank {rank}'s stream is in another context of device {}: use the device's primary context (cudarc's CudaContext::new)",
                    res.device
                )));
            }
        }
        Ok(())
    }
}
