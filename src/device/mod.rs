//! The device layer: CUDA devices, contexts, peer access, memory, streams and events, in the shape
//! the GPU executor needs them — everything created once up front, then driven from one host thread
//! per GPU.
//!
//! Built on cudarc 0.19.10 in its own three layers (`sys` → `result` → safe types). This module adds
//! no FFI: it calls `cudarc::driver::result` where that has the call and `cudarc::driver::sys` where
//! it does not (peer access, pool access, pointer attributes, `cuMemcpyAsync`), and every status
//! becomes an [`Error::Cuda`] (call, code name, driver message) in one place: `check`, which the
//! `DriverResultExt::call` shorthand (`.call("cuMemcpyPeerAsync")?`) wraps. A cudarc panic (its
//! loader panics when an old libcuda lacks a symbol) becomes [`Error::NoGpu`] in `guard`, and a
//! `Drop` never panics (`teardown_in_drop`).
//!
//! # Where each part lives
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | status → `Result` (`check`, `DriverResultExt`, `guard`), driver presence ([`driver_available`]), [`device_count`], [`driver_version`] |
//! | `context.rs` | primary contexts ([`context()`]), binding and restoring the current context, [`DeviceInfo`], a GPU's ordinal from its UUID ([`ordinal_of`]), [`memory_info`] |
//! | `ipc.rs` | device memory shared with another process: `cuMemCreate` memory as file descriptors ([`fd_sharing_supported`], [`import_fd`], [`shareable_fd`], [`unmap`]); legacy CUDA IPC handles ([`export_handle`], [`open_handle`], [`close_handle`]) |
//! | `module.rs` | loading kernel code into a context ([`load_module`], [`load_function`], [`compute_capability`]) |
//! | `peer.rs` | peer access ([`can_access_peer`], [`enable_peer_access`], [`p2p_attributes`]), pool access grants, pointer queries |
//! | `memory.rs` | [`DeviceBuffer`], [`PinnedHost`], asynchronous copies and fills ([`memcpy_peer_async`], [`memcpy_async`], [`memset_d32_async`]) |
//! | `numa.rs` | pinned host memory on its GPU's NUMA node (the allocating thread's memory policy, set and restored around the allocation) |
//! | `stream.rs` | [`Stream`], [`Event`], [`record`], [`wait`] (and the trap of waiting before recording), synchronize, query, elapsed time, a caller's stream ([`CallerStream`]: a cudarc stream or a raw handle, its capture status), cudarc's [`tracking_stream`], and the crate's one kernel launch (`launch_kernel`: every kernel of `exec::cuda::kernels` goes through it) |
//! | `gate.rs` | [`gate`]: this crate's blocking calls wait for spinning peer kernels and hold new launches back |
//!
//! Every public item is re-exported here, so its path is `ringreduce::device::<name>`.
//!
//! # The model, in five facts
//!
//! 1. **Each GPU has its own context.** A context owns a device's allocations, streams, events and
//!    loaded kernels. We use each device's *primary* context ([`context()`]), the one the CUDA
//!    runtime, NCCL and PyTorch also use, so a user's buffers and ours live in the same context.
//! 2. **The current context decides where work goes.** Driver calls have no device argument:
//!    `cuMemAlloc`, `cuStreamCreate`, `cuEventCreate` act in whichever context is current on the
//!    calling host thread. A thread that drives GPU 1 while GPU 0's context is current allocates on
//!    GPU 0, silently. So every function here that acts in a context makes it current first (see
//!    "Which functions bind" below).
//! 3. **One address space, many owners.** With unified virtual addressing the host's pinned memory
//!    and every GPU's memory share one 64-bit address range, so a pointer value names its device
//!    ([`pointer_device`]) and `cuMemcpyAsync` infers the direction by itself. Holding a pointer into
//!    a peer's memory is not permission to reach it quickly.
//! 4. **Peer access is asked at run time, per direction, and switched on explicitly.**
//!    [`can_access_peer`]`(a, b)` says whether device `a` can map device `b`'s memory; it is not
//!    symmetric, so ask both ways. [`enable_peer_access`] turns it on for one direction only. When it
//!    is off, `cuMemcpyPeerAsync` still succeeds — the driver stages the bytes through host memory.
//!    On the 2×H200 test machine such a copy is about ten times slower with peer access off than on
//!    (docs/PERFORMANCE.md, "The test machine"). No error, only slowness; so the executor enables
//!    both directions for every ring neighbour and treats a failure to do so as an error.
//! 5. **Pool memory ignores `cuCtxEnablePeerAccess` (the pool trap).** Stream-ordered allocations
//!    (`cuMemAllocAsync`, which cudarc's `CudaStream::alloc*` uses whenever the device has memory
//!    pools) live in a memory pool with its own access list, set by `cuMemPoolSetAccess`, which peer
//!    access enabled on the contexts does not touch: with peer access enabled both ways,
//!    `cuMemcpyPeerAsync` between pool buffers runs at the staged path's speed, between `cuMemAlloc`
//!    buffers (or pool buffers after `cuMemPoolSetAccess(default pool, peer device, READWRITE)`) at
//!    the link's (docs/PERFORMANCE.md, "The test machine"). Hence: the ring's own
//!    memory is a [`DeviceBuffer`] (plain `cuMemAlloc`, outside every pool), and user buffers are
//!    checked with [`pointer_is_pool_memory`] and, when they come from a pool, the peer is granted
//!    access with [`grant_pointer_pool_access`] (that buffer's pool) or [`grant_pool_access`] (the
//!    device's default and current pools).
//!
//! # Which functions bind
//!
//! Nothing here assumes a context is already current. Binding costs one `cuCtxGetCurrent` (tens of
//! nanoseconds) when the context is already current, against ~1.5–2 µs per enqueued CUDA call.
//!
//! | binds, and leaves current on the calling thread | context |
//! |---|---|
//! | [`context()`] (cudarc's `CudaContext::new`) | the new one |
//! | [`enable_peer_access`] | `ctx_from` |
//! | [`grant_pool_access`] | `owner` |
//! | [`memory_info`] | `ctx` |
//! | [`Stream::new`], [`Event::new`], [`Event::with_timing`], [`DeviceBuffer::new`], [`PinnedHost::new`], their methods, `close`/`free` and `Drop` | the one they were made in |
//! | [`record`], [`wait`], [`memcpy_peer_async`], [`memcpy_async`], [`memset_d32_async`], [`stream_synchronize`] | the stream's |
//! | [`event_query`], [`event_synchronize`], [`event_elapsed_ms`], [`record_on_raw_stream`] | the event's |
//! | [`wait_on_raw_stream`] | the one given |
//!
//! Device-level queries need no context and bind none: [`driver_available`], [`device_count`],
//! [`devices`], [`driver_version`], [`can_access_peer`], [`peer_matrix`], [`p2p_attributes`],
//! [`pointer_device`], [`pointer_is_pool_memory`], [`grant_pointer_pool_access`].
//!
//! Binding goes through `cuCtxGetCurrent`/`cuCtxSetCurrent` directly rather than cudarc's
//! `CudaContext::bind_to_thread`, because the latter first returns (and clears) any error cudarc
//! recorded from an earlier `Drop` of one of *its* objects — that error would then be reported as the
//! failure of our unrelated call.
//!
//! # Why our own `Stream` and `Event`, not cudarc's `CudaStream`/`CudaEvent`
//!
//! cudarc's types would work for the hot path: both expose raw handles, `CudaStream::wait` is a bare
//! `cuStreamWaitEvent` with the waiting stream's context bound (cross-context waits work in 0.19.10),
//! and `CudaEvent::record` adds no event of its own. We still wrap the handles ourselves, because:
//! - `CudaContext::new_stream` has side effects on a context shared with the rest of the process: the
//!   first stream made with event tracking on synchronizes the whole context and switches it to
//!   "multi-stream mode", after which every `CudaSlice` allocated from that context object records a
//!   read and a write event on each use;
//! - cudarc's `Drop`s store teardown errors in the context's shared error slot, where the next
//!   `bind_to_thread` on that context — possibly another thread's unrelated call — returns them. Ours
//!   return teardown errors from an explicit `close`/`free`, and `Drop` drops them, never panicking.
//!
//! Where a cudarc API wants a `&CudaStream` (kernel launches), [`Stream::cudarc`] lends a
//! non-owning view of the same stream, borrowed from the `Stream`.
//!
//! For the same reason [`context()`] does not call `CudaContext::disable_event_tracking` (an `unsafe`
//! switch that moves stream ordering of *subsequently allocated `CudaSlice`s* onto the caller): it
//! affects only `CudaSlice`s, which the executor does not allocate — they come from the pool.
//!
//! # Teardown
//!
//! [`Stream`], [`Event`], [`DeviceBuffer`] and [`PinnedHost`] each hold an `Arc<CudaContext>`, so the
//! primary context outlives them. Each has an explicit `close`/`free` returning the driver's error,
//! and a `Drop` that does the same work, drops the error and catches any cudarc panic. Freeing memory
//! that queued GPU work still uses is prevented by the `# Safety` contracts of the enqueue functions,
//! not by `Drop`.

mod context;
pub mod gate;
pub(crate) mod ipc;
mod memory;
mod module;
pub(crate) mod numa_memory;
mod peer;
mod stream;

pub(crate) use context::{bind, save_current};
pub use context::{
    context, current_device, device_info, devices, memory_info, ordinal_of, DeviceInfo,
};
pub use ipc::{
    close_handle, create_shared_host, export_handle, fd_sharing_supported, import_fd,
    map_shared_host, open_handle, shareable_by_serial, shareable_fd, unmap, unmap_shared_host,
    Mapped, Shareable,
};
pub(crate) use ipc::{register_host, unregister_host};
pub use memory::{
    alloc_async, free_async, memcpy_async, memcpy_on, memcpy_peer_async, memset_d32_async,
    DeviceBuffer, PinnedHost,
};
pub use module::{compute_capability, load_function, load_module};
pub use peer::{
    can_access_peer, disable_peer_access, enable_peer_access, grant_pointer_pool_access,
    grant_pool_access, p2p_attributes, peer_matrix, pointer_allocation, pointer_device,
    pointer_ipc_capable, pointer_is_pool_memory, Allocation, P2pAttributes,
};
pub(crate) use stream::{capture_relaxed, launch_kernel};
pub use stream::{
    event_elapsed_ms, event_query, event_synchronize, record, record_on_raw_stream, stream_query,
    stream_synchronize, tracking_stream, wait, wait_on_raw_stream, CallerStream, Event, Stream,
};

use crate::error::{Error, Result};
use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;

use std::ffi::c_int;
use std::panic::{self, AssertUnwindSafe};
use std::sync::OnceLock;

// ---------------------------------------------------------------------------------------------
// Status → Result, in one place.
// ---------------------------------------------------------------------------------------------

/// Converts a cudarc [`DriverError`] from `call` into [`Error::Cuda`]: the call's name, the error's
/// name (`CUDA_ERROR_INVALID_VALUE`) and the driver's own message. The one place a CUDA driver status
/// becomes an [`Error`]; use it as `.map_err(check("cuMemcpyPeerAsync"))` or through
/// [`DriverResultExt::call`].
pub(crate) fn check(call: &'static str) -> impl FnOnce(DriverError) -> Error {
    move |err| Error::Cuda {
        call,
        // The binding's enum variant name is the CUDA name; unlike cuGetErrorName it needs no driver.
        code: format!("{:?}", err.0),
        message: driver_message(err),
    }
}

/// `.call("cuX")` on any cudarc driver result: [`check`] as a method.
pub(crate) trait DriverResultExt<T> {
    /// Converts an error from the driver call `call` into [`Error::Cuda`].
    fn call(self, call: &'static str) -> Result<T>;
}

impl<T> DriverResultExt<T> for std::result::Result<T, DriverError> {
    fn call(self, call: &'static str) -> Result<T> {
        self.map_err(check(call))
    }
}

/// The driver's message for `err`, or a placeholder when libcuda is not loaded (asking cudarc then
/// would panic).
fn driver_message(err: DriverError) -> String {
    if !libcuda_present() {
        return "(no driver message: libcuda is not loaded)".to_string();
    }
    match err.error_string() {
        Ok(message) => message.to_string_lossy().into_owned(),
        Err(_) => "(the driver has no message for this code)".to_string(),
    }
}

/// Runs `f`, turning a cudarc panic (a symbol missing from an old libcuda: cudarc's loader panics
/// instead of returning an error) into [`Error::NoGpu`].
fn guard<T>(call: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    // AssertUnwindSafe: a panic from cudarc's symbol loader happens before the driver is called, so
    // no state that `f` captured is left half-updated.
    match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => Err(Error::NoGpu {
            reason: format!(
                "cudarc panicked during {call}: {} (is libcuda older than the CUDA 13.0 \
                 bindings this crate is built with?)",
                crate::error::panic_message(&*payload)
            ),
        }),
    }
}

/// Runs one teardown step from `Drop`: the error is dropped (the explicit `close`/`free` returns it)
/// and a cudarc panic is caught, so `Drop` never panics.
fn teardown_in_drop(step: impl FnOnce() -> Result<()>) {
    let _ = panic::catch_unwind(AssertUnwindSafe(step));
}

// ---------------------------------------------------------------------------------------------
// Driver and devices.
// ---------------------------------------------------------------------------------------------

/// Whether the dynamic loader finds libcuda; asked once per process. Every other cudarc call panics
/// when it does not.
fn libcuda_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: is_culib_present only tries `dlopen` on cudarc's candidate names for libcuda and
    // closes what it opened; it has no precondition. It is the call cudarc provides for asking
    // before its loader would panic.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

fn no_libcuda() -> Error {
    Error::NoGpu {
        reason: "libcuda (the NVIDIA driver library) could not be loaded: no NVIDIA driver on \
                 this host, or it is not on the loader path (LD_LIBRARY_PATH)"
            .to_string(),
    }
}

/// The device count, probed once per process: libcuda present, `cuInit` succeeded, ≥ 1 device.
fn probe() -> &'static Result<usize> {
    static PROBE: OnceLock<Result<usize>> = OnceLock::new();
    PROBE.get_or_init(|| {
        if !libcuda_present() {
            return Err(no_libcuda());
        }
        guard("cuInit", || {
            let no_gpu = |call: &'static str| {
                move |err: DriverError| Error::NoGpu {
                    reason: check(call)(err).to_string(),
                }
            };
            result::init().map_err(no_gpu("cuInit"))?;
            let count = result::device::get_count().map_err(no_gpu("cuDeviceGetCount"))?;
            match usize::try_from(count) {
                Ok(count) if count > 0 => Ok(count),
                _ => Err(Error::NoGpu {
                    reason: "the CUDA driver loaded and initialized but reports no devices"
                        .to_string(),
                }),
            }
        })
    })
}

/// `Ok` when the CUDA driver can be used: libcuda loads, `cuInit` succeeds and there is at least one
/// device. Otherwise [`Error::NoGpu`] with the reason. Never panics; the answer is probed once per
/// Every file named `file_name` (a shared library, e.g. `libnccl.so.2`) in the folders of
/// `LD_LIBRARY_PATH`, then in the usual system folders, in that order: where the loader would
/// look, for callers that open a library by path.
pub fn library_files(file_name: &str) -> impl Iterator<Item = std::path::PathBuf> + '_ {
    let from_env = std::env::var_os("LD_LIBRARY_PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    let system = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/cuda/lib64",
        "/usr/local/lib",
    ]
    .map(std::path::PathBuf::from);
    from_env
        .into_iter()
        .chain(system)
        .map(move |dir| dir.join(file_name))
        .filter(|path| path.is_file())
}

/// process and cached. Call it before anything else in this module (the functions here do).
pub fn driver_available() -> Result<()> {
    probe().as_ref().map(|_| ()).map_err(Clone::clone)
}

/// The number of CUDA devices; [`Error::NoGpu`] when [`driver_available`] fails (including zero
/// devices).
pub fn device_count() -> Result<usize> {
    probe().clone()
}

/// The version of the installed CUDA driver as (major, minor), e.g. (13, 0) for driver 580. Needs
/// libcuda but no device.
pub fn driver_version() -> Result<(u32, u32)> {
    if !libcuda_present() {
        return Err(no_libcuda());
    }
    guard("cuDriverGetVersion", || {
        let mut version: c_int = 0;
        // SAFETY: `version` is a live c_int that the driver writes once; cuDriverGetVersion needs
        // neither cuInit nor a context.
        unsafe { sys::cuDriverGetVersion(&mut version) }
            .result()
            .call("cuDriverGetVersion")?;
        Ok(decode_driver_version(version))
    })
}

/// CUDA encodes versions as 1000 × major + 10 × minor (13000 is 13.0, 12080 is 12.8).
fn decode_driver_version(version: c_int) -> (u32, u32) {
    let version = u32::try_from(version).unwrap_or(0);
    (version / 1000, (version % 1000) / 10)
}

/// The driver's handle for device `index`, after checking the driver and the index.
pub(crate) fn cu_device(index: usize) -> Result<sys::CUdevice> {
    let count = device_count()?;
    if index >= count {
        return Err(Error::InvalidArgument(format!(
            "device {index} does not exist: this host has {count} CUDA device(s), 0..{count}"
        )));
    }
    let ordinal = c_int::try_from(index)
        .map_err(|_| Error::InvalidArgument(format!("device {index} is not a CUDA ordinal")))?;
    result::device::get(ordinal).call("cuDeviceGet")
}

#[cfg(test)]
mod tests;
