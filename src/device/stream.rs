//! Streams and events: [`Stream`] (a non-blocking stream in one context), [`Event`], and the
//! calls that order work with them — [`record`], [`wait`], synchronize, query and elapsed time.
//!
//! The idea is CUDA's stream model: work on one stream runs in order; work on different streams
//! (and different GPUs) is ordered only by an event recorded on one stream and waited on by
//! another. The invariant our wrappers keep: each call binds the context of the stream (or event)
//! it acts on, and teardown errors come back from `close`, never as a panic in `Drop`.
//!
//! # The trap: a wait enqueued before its record
//!
//! [`wait`] (`cuStreamWaitEvent`) captures the event's latest record **at the moment the wait is
//! enqueued**, not whichever record comes next. A wait enqueued before its record waits for the
//! previous record — or, for an event never recorded, for nothing — and the waiting stream runs
//! ahead: the reader copies before the writer has written, and gets stale data with no error.
//! So the record must be *enqueued* (not just planned) before any wait on it is: the executors hand
//! each recorded event from the recording thread to the waiting one, and the plan checker rejects
//! a plan that waits on an event before recording it ([`crate::check`]). `ringreduce sync` shows the
//! trap on real GPUs (docs/TOUR.md).

use super::context::same_context;
use super::{bind, check, guard, teardown_in_drop, DriverResultExt};
use crate::error::{Error, Result};
use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaStream};

use std::sync::Arc;

/// A `CU_STREAM_NON_BLOCKING` stream in one context: it never synchronizes implicitly with the
/// legacy default stream, so only events order it against other work.
#[derive(Debug)]
pub struct Stream {
    /// Null only after the stream was destroyed.
    raw: sys::CUstream,
    ctx: Arc<CudaContext>,
    /// A non-owning cudarc view of `raw` (`wrap_borrowed_stream`), for cudarc APIs that take a
    /// `&CudaStream` (kernel launches). Its `Drop` does nothing; only `release` destroys `raw`.
    borrowed: Arc<CudaStream>,
}

// SAFETY: a CUstream is a handle to a driver object; driver API calls are thread-safe, every call
// here binds the stream's context on the calling thread first, and the handle value changes only in
// `release`, which takes `&mut self`.
unsafe impl Send for Stream {}
// SAFETY: see Send; `&Stream` only reads the handle. Ordering between threads that enqueue on one
// stream is the enqueuers' concern, not memory safety's.
unsafe impl Sync for Stream {}

/// A cudarc stream of `ctx` (`cuStreamCreate`), for cudarc's own bookkeeping: the first one a
/// context handle makes puts it in cudarc's multi-stream mode, in which cudarc records a slice's
/// read and write events on the stream that uses it (and synchronizes the context once).
pub fn tracking_stream(ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>> {
    super::guard("cuStreamCreate", || ctx.new_stream().call("cuStreamCreate"))
}

/// A stream of the caller's, as the executor orders its collectives on it: the stream's handle,
/// its context and that context's device. From a cudarc stream ([`CallerStream::of`]), or from a
/// raw handle a C caller passed ([`CallerStream::from_raw`]; the legacy default stream, 0,
/// included).
#[derive(Clone, Copy, Debug)]
pub struct CallerStream {
    raw: sys::CUstream,
    ctx: sys::CUcontext,
    device: usize,
}

// SAFETY: the handles are plain identifiers that the driver accepts from any thread; this type
// never dereferences them.
unsafe impl Send for CallerStream {}
// SAFETY: as above.
unsafe impl Sync for CallerStream {}

impl From<&CudaStream> for CallerStream {
    fn from(stream: &CudaStream) -> CallerStream {
        CallerStream::of(stream)
    }
}

impl From<&Arc<CudaStream>> for CallerStream {
    fn from(stream: &Arc<CudaStream>) -> CallerStream {
        CallerStream::of(stream)
    }
}

impl CallerStream {
    /// The caller's cudarc `stream`.
    pub fn of(stream: &CudaStream) -> CallerStream {
        CallerStream {
            raw: stream.cu_stream(),
            ctx: stream.context().cu_ctx(),
            device: stream.context().ordinal(),
        }
    }

    /// A raw stream handle, as C callers pass it (`cudaStream_t`): asks the driver for its
    /// context (`cuStreamGetCtx`; for the legacy default stream, 0, the calling thread's current
    /// context) and that context's device. [`Error::NoGpu`] where there is no driver or GPU (a
    /// host rank's caller, a machine without CUDA), before any driver call.
    ///
    /// # Safety
    /// `raw` is 0 or a live stream, and stays live while the returned value is used.
    pub unsafe fn from_raw(raw: sys::CUstream) -> Result<CallerStream> {
        super::driver_available()?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `ctx` is a live local; `raw` is 0 or live (our caller's contract).
        unsafe { sys::cuStreamGetCtx(raw, &mut ctx) }
            .result()
            .call("cuStreamGetCtx")?;
        // The caller's current context is restored below.
        let saved = super::save_current()?;
        // SAFETY: `ctx` was just returned by the driver for a live stream; it is pushed to ask
        // its device and popped again.
        let device = unsafe { sys::cuCtxPushCurrent_v2(ctx) }
            .result()
            .call("cuCtxPushCurrent")
            .and_then(|()| {
                let mut dev: sys::CUdevice = 0;
                // SAFETY: `dev` is a live local and a context is current.
                let got = unsafe { sys::cuCtxGetDevice(&mut dev) }
                    .result()
                    .call("cuCtxGetDevice");
                let mut popped: sys::CUcontext = std::ptr::null_mut();
                // SAFETY: pops what was pushed just above.
                let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
                got.map(|()| dev as usize)
            });
        saved.restore()?;
        Ok(CallerStream {
            raw,
            ctx,
            device: device?,
        })
    }

    /// The stream's handle.
    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// The stream's context.
    pub fn context(&self) -> sys::CUcontext {
        self.ctx
    }

    /// The ordinal of the stream's device.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Whether the stream is being captured into a CUDA graph (`cuStreamIsCapturing`).
    pub fn capture_status(&self) -> Result<sys::CUstreamCaptureStatus> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        guard("cuStreamIsCapturing", || {
            // SAFETY: `status` is a live local; the stream is live (the constructors' contracts).
            unsafe { sys::cuStreamIsCapturing(self.raw, &mut status) }
                .result()
                .call("cuStreamIsCapturing")
        })?;
        Ok(status)
    }
}

impl Stream {
    /// Creates a non-blocking stream in `ctx` (`cuStreamCreate`); binds `ctx`.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        bind(ctx)?;
        let raw = result::stream::create(result::stream::StreamKind::NonBlocking)
            .call("cuStreamCreate")?;
        // SAFETY: `raw` is a live stream of `ctx`, just created. `self` owns it and keeps it alive
        // as long as the wrapper can be used: the wrapper is reachable only as a `&CudaStream`
        // borrowed from `self` (`cudarc()`), never as an `Arc` a caller could keep, and no method
        // of `&CudaStream` stores `self` anywhere. Work submitted through it goes to the same
        // stream, so it is ordered with ours.
        let borrowed = unsafe { ctx.wrap_borrowed_stream(raw) };
        Ok(Self {
            raw,
            ctx: Arc::clone(ctx),
            borrowed,
        })
    }

    /// The raw handle, for calls this module does not wrap (kernel launches). Do not destroy it.
    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// The context the stream belongs to.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The same stream as a cudarc `&CudaStream`, for cudarc APIs that want one (kernel launches:
    /// `cu_stream()` and `context()` are this stream's). Borrowed from `self`, so it cannot outlive
    /// the stream; it never destroys it.
    pub fn cudarc(&self) -> &CudaStream {
        &self.borrowed
    }

    /// The device ordinal the stream runs on.
    pub fn device(&self) -> usize {
        self.ctx.ordinal()
    }

    /// Destroys the stream now and returns the driver's error, if any (`Drop` does the same
    /// silently). Work still queued completes; the driver releases the stream afterwards.
    pub fn close(mut self) -> Result<()> {
        self.release()
    }

    fn release(&mut self) -> Result<()> {
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        if raw.is_null() {
            return Ok(());
        }
        bind(&self.ctx)?;
        // SAFETY: `raw` came from cuStreamCreate in `self.ctx` (now current) and is destroyed
        // exactly once: it was swapped for null above, and `close` and `Drop` both come through
        // here. Destroying a stream with queued work is allowed: the work still runs.
        unsafe { result::stream::destroy(raw) }.call("cuStreamDestroy")
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        teardown_in_drop(|| self.release());
    }
}

/// An event in one context: recorded on a stream of that context, waited on by streams of any
/// context. [`Event::new`] disables timing (cheaper to record and wait on); [`Event::with_timing`]
/// is for benchmarks.
#[derive(Debug)]
pub struct Event {
    /// Null only after the event was destroyed.
    raw: sys::CUevent,
    ctx: Arc<CudaContext>,
    timing: bool,
}

// SAFETY: as for Stream: a driver handle, thread-safe driver calls, each binding the event's
// context first; the handle changes only in `release(&mut self)`.
unsafe impl Send for Event {}
// SAFETY: see Send. Concurrent record and wait on one event from two threads is defined by the
// driver (the wait sees one of the records); which one is an ordering question for the executor.
unsafe impl Sync for Event {}

impl Event {
    /// Creates an event with `CU_EVENT_DISABLE_TIMING` in `ctx`; binds `ctx`.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        Self::create(ctx, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING, false)
    }

    /// Creates an event that records timestamps (`CU_EVENT_DEFAULT`), for [`event_elapsed_ms`].
    pub fn with_timing(ctx: &Arc<CudaContext>) -> Result<Self> {
        Self::create(ctx, sys::CUevent_flags::CU_EVENT_DEFAULT, true)
    }

    fn create(ctx: &Arc<CudaContext>, flags: sys::CUevent_flags, timing: bool) -> Result<Self> {
        bind(ctx)?;
        let raw = result::event::create(flags).call("cuEventCreate")?;
        Ok(Self {
            raw,
            ctx: Arc::clone(ctx),
            timing,
        })
    }

    /// The raw handle. Do not destroy it.
    pub fn raw(&self) -> sys::CUevent {
        self.raw
    }

    /// The context the event belongs to.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The device ordinal of the event's context.
    pub fn device(&self) -> usize {
        self.ctx.ordinal()
    }

    /// Whether the event records timestamps.
    pub fn has_timing(&self) -> bool {
        self.timing
    }

    /// Destroys the event now and returns the driver's error, if any (`Drop` does the same
    /// silently). Allowed while the event is pending or waited on: the driver defers the release.
    pub fn close(mut self) -> Result<()> {
        self.release()
    }

    fn release(&mut self) -> Result<()> {
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        if raw.is_null() {
            return Ok(());
        }
        bind(&self.ctx)?;
        // SAFETY: `raw` came from cuEventCreate in `self.ctx` (now current) and is destroyed exactly
        // once: swapped for null above; `close` and `Drop` both come through here. Destroying a
        // pending event is allowed; waits already queued on it keep their meaning.
        unsafe { result::event::destroy(raw) }.call("cuEventDestroy")
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        teardown_in_drop(|| self.release());
    }
}

/// Captures the work queued on `stream` so far into `event` (`cuEventRecord`); binds the stream's
/// context. Both must belong to one context ([`Error::InvalidArgument`] otherwise). A later record
/// replaces what the event captures, but waits already queued keep what they saw.
pub fn record(event: &Event, stream: &Stream) -> Result<()> {
    if !same_context(&event.ctx, &stream.ctx) {
        return Err(Error::InvalidArgument(format!(
            "an event of device {} cannot be recorded on a stream of device {}",
            event.device(),
            stream.device()
        )));
    }
    bind(&stream.ctx)?;
    // SAFETY: both handles are live (owned by the borrowed Event and Stream, destroyed only in
    // their `release`) and belong to the context just bound.
    unsafe { result::event::record(event.raw, stream.raw) }.call("cuEventRecord")
}

/// Records `event` on a raw stream of the event's context (`cuEventRecord`), e.g. a
/// communicator's [`crate::Communicator::main_stream`], so ringreduce and NCCL iterations can be
/// timed with the same events. Binds the event's context.
///
/// # Safety
/// `stream` is a live CUDA stream of the event's context (the same device's primary context), and
/// stays live until this returns.
pub unsafe fn record_on_raw_stream(
    event: &Event,
    stream: cudarc::driver::sys::CUstream,
) -> Result<()> {
    bind(event.context())?;
    // SAFETY: `event` is live (borrowed), its context is current, and `stream` belongs to that
    // context by our caller's contract.
    unsafe { result::event::record(event.raw(), stream) }.call("cuEventRecord")
}

/// Makes work queued on a raw stream after this call wait until the work captured by `event`'s
/// latest record has completed (`cuStreamWaitEvent`), e.g. a caller's stream waiting for a
/// collective; binds `ctx`, the stream's context. The record-before-wait rule of [`wait`] holds.
///
/// # Safety
/// `stream` is a live CUDA stream of `ctx`, and stays live until this returns.
pub unsafe fn wait_on_raw_stream(
    ctx: &Arc<CudaContext>,
    stream: sys::CUstream,
    event: &Event,
) -> Result<()> {
    bind(ctx)?;
    // SAFETY: `stream` belongs to the context just bound (our caller's contract); the event is
    // live (borrowed) and may belong to any context.
    unsafe {
        result::stream::wait_event(
            stream,
            event.raw,
            sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
        )
    }
    .call("cuStreamWaitEvent")
}

/// Makes work queued on `stream` after this call wait until the work captured by `event`'s latest
/// record has completed (`cuStreamWaitEvent`); binds the stream's context. Works across contexts: a
/// stream on GPU 1 may wait on an event of GPU 0, on the GPU, without blocking the host. An event
/// never recorded is already complete.
///
/// The record the wait honours is the latest one enqueued *before* this call. A wait enqueued
/// before its record does not wait for it: the waiting stream runs ahead and reads stale data, with
/// no error. Enqueue the record first (the trap, in `device::stream`'s module doc).
pub fn wait(stream: &Stream, event: &Event) -> Result<()> {
    bind(&stream.ctx)?;
    // SAFETY: both handles are live (owned by the borrowed Stream and Event); the stream's context
    // is current; the event may belong to any context.
    unsafe {
        result::stream::wait_event(
            stream.raw,
            event.raw,
            sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
        )
    }
    .call("cuStreamWaitEvent")
}

/// Blocks the calling thread until all work queued on `stream` has completed
/// (`cuStreamSynchronize`); binds the stream's context. Reports errors of that work.
pub fn stream_synchronize(stream: &Stream) -> Result<()> {
    bind(&stream.ctx)?;
    // SAFETY: the stream is live (owned by the borrowed Stream) and its context is bound.
    unsafe { result::stream::synchronize(stream.raw) }.call("cuStreamSynchronize")
}

/// Whether all work queued on `stream` has completed, without blocking (`cuStreamQuery`):
/// `CUDA_ERROR_NOT_READY` is `Ok(false)`, other errors (including those of earlier asynchronous
/// work) are errors. Binds the stream's context.
pub fn stream_query(stream: &Stream) -> Result<bool> {
    bind(&stream.ctx)?;
    // SAFETY: the stream is live (owned by the borrowed Stream) and its context is bound.
    match unsafe { sys::cuStreamQuery(stream.raw) }.result() {
        Ok(()) => Ok(true),
        Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
        Err(err) => Err(check("cuStreamQuery")(err)),
    }
}

/// Runs `f` with the calling thread's stream-capture mode relaxed
/// (`cuThreadExchangeStreamCaptureMode`), then puts the thread's mode back. While any thread
/// captures a stream in CUDA's default (global) mode, every other thread in global mode is
/// refused "potentially unsafe" calls — `cuStreamQuery` among them, even of a stream nobody
/// captures — and the refusal invalidates that capture. A watchdog's poll of this crate's own
/// streams (`ncclCommGetAsyncError` from PyTorch's watchdog while the main thread captures a CUDA
/// graph) is safe, and must neither fail nor break the capture.
pub(crate) fn capture_relaxed<R>(f: impl FnOnce() -> R) -> Result<R> {
    super::driver_available()?;
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: `mode` is a live local; the call exchanges the calling thread's mode.
    unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }
        .result()
        .call("cuThreadExchangeStreamCaptureMode")?;
    let result = f();
    // SAFETY: as above: puts back the mode the thread had.
    unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }
        .result()
        .call("cuThreadExchangeStreamCaptureMode")?;
    Ok(result)
}

/// Whether the work captured by `event` has completed, without blocking (`cuEventQuery`):
/// `CUDA_ERROR_NOT_READY` is `Ok(false)`, other errors (including those of earlier asynchronous
/// work) are errors. An event never recorded is complete. Binds the event's context.
pub fn event_query(event: &Event) -> Result<bool> {
    bind(&event.ctx)?;
    // SAFETY: the event is live (owned by the borrowed Event).
    match unsafe { result::event::query(event.raw) } {
        Ok(()) => Ok(true),
        Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
        Err(err) => Err(check("cuEventQuery")(err)),
    }
}

/// Blocks the calling thread until the work captured by `event` has completed
/// (`cuEventSynchronize`; it spins, the event was not made with `CU_EVENT_BLOCKING_SYNC`). Binds
/// the event's context.
pub fn event_synchronize(event: &Event) -> Result<()> {
    bind(&event.ctx)?;
    // SAFETY: the event is live (owned by the borrowed Event).
    unsafe { result::event::synchronize(event.raw) }.call("cuEventSynchronize")
}

/// Milliseconds between `start` and `end` on the GPU (`cuEventElapsedTime`), after waiting for both
/// to complete. Both must be [`Event::with_timing`] events of one context, recorded
/// ([`Error::InvalidArgument`] for the first two; the driver's error for an unrecorded one).
/// Resolution is about half a microsecond. Binds the events' context.
pub fn event_elapsed_ms(start: &Event, end: &Event) -> Result<f32> {
    if !start.timing || !end.timing {
        return Err(Error::InvalidArgument(
            "event_elapsed_ms needs two events made with Event::with_timing".to_string(),
        ));
    }
    if !same_context(&start.ctx, &end.ctx) {
        return Err(Error::InvalidArgument(format!(
            "event_elapsed_ms needs events of one device, got devices {} and {}",
            start.device(),
            end.device()
        )));
    }
    event_synchronize(start)?;
    event_synchronize(end)?;
    guard("cuEventElapsedTime", || {
        // SAFETY: both events are live timing events of the bound context and have completed.
        unsafe { result::event::elapsed(start.raw, end.raw) }.call("cuEventElapsedTime")
    })
}

/// Enqueues `function` on the stream `raw` (one of ours, [`Stream::raw`], or a caller's,
/// [`CallerStream::raw`]) with `ctx` current (bound here): `blocks` blocks of `threads` threads,
/// no dynamic shared memory (`cuLaunchKernel`). The one launch of the crate: every kernel goes
/// through here.
///
/// # Safety
/// `function` was loaded into `ctx`, the context of `raw`, a live stream;
/// `params` holds one pointer per kernel parameter, each to a value of the parameter's type that
/// lives until this returns; the grid is one the kernel accepts; and the memory the kernel
/// touches is valid and unaliased as the kernel's own contract says, until it completes.
pub(crate) unsafe fn launch_kernel(
    ctx: &CudaContext,
    function: &cudarc::driver::CudaFunction,
    blocks: u32,
    threads: u32,
    raw: sys::CUstream,
    params: &mut [*mut std::ffi::c_void],
) -> Result<()> {
    bind(ctx)?;
    // SAFETY: our caller's contract, passed on; `ctx`, the function's and the stream's, is
    // current.
    unsafe {
        cudarc::driver::result::launch_kernel(
            function.cu_function(),
            (blocks, 1, 1),
            (threads, 1, 1),
            0,
            raw,
            params,
        )
    }
    .call("cuLaunchKernel")
}
