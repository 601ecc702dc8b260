//! The device layer: CUDA devices, contexts, peer access, memory, streams and events, in the shape
//! the GPU executor needs them — everything created once up front, then driven from one host thread
//! per GPU.
//!
//! Built on cudarc 0.19.10 in its own three layers (`sys` → `result` → safe types). This module adds
//! no FFI: it calls `cudarc::driver::result` where that has the call and `cudarc::driver::sys` where
//! it does not (peer access, pool access, pointer attributes, `cuMemcpyAsync`), and every status
//! becomes an [`Error::Cuda`] (call, code name, driver message) in one place: `check`, which the
//! `DriverResultExt::call` shorthand (`.call("cuMemcpyPeerAsync")?`) wraps.
//!
//! # The model, in five facts
//!
//! 1. **Each GPU has its own context.** A context owns a device's allocations, streams, events and
//!    loaded kernels. We use each device's *primary* context ([`context`]), the one the CUDA runtime,
//!    NCCL and PyTorch also use, so a user's buffers and ours live in the same context.
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
//!    Measured on the 2×H200 test machine (NV18, 256 MiB copies): **395 GB/s** with peer access on,
//!    **38 GB/s** with it off. No error, only slowness; so the executor enables both directions for
//!    every ring neighbour and treats a failure to do so as an error.
//! 5. **Pool memory ignores `cuCtxEnablePeerAccess` (the pool trap).** Stream-ordered allocations
//!    (`cuMemAllocAsync`, which cudarc's `CudaStream::alloc*` uses whenever the device has memory
//!    pools) live in a memory pool with its own access list, set by `cuMemPoolSetAccess`, which peer
//!    access enabled on the contexts does not touch. On the test machine, after enabling peer access
//!    both ways, `cuMemcpyPeerAsync` between pool buffers ran at **37.6 GB/s** (the staged path),
//!    between `cuMemAlloc` buffers at 392 GB/s, and between pool buffers after
//!    `cuMemPoolSetAccess(default pool, peer device, READWRITE)` at 395 GB/s. Hence: the ring's own
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
//! | [`context`] (cudarc's `CudaContext::new`) | the new one |
//! | [`enable_peer_access`] | `ctx_from` |
//! | [`grant_pool_access`] | `owner` |
//! | [`memory_info`] | `ctx` |
//! | [`Stream::new`], [`Event::new`], [`Event::with_timing`], [`DeviceBuffer::new`], [`PinnedHost::new`], their methods, `close`/`free` and `Drop` | the one they were made in |
//! | [`record`], [`wait`], [`memcpy_peer_async`], [`memcpy_async`], [`memset_d32_async`], [`stream_synchronize`] | the stream's |
//! | [`event_query`], [`event_synchronize`], [`event_elapsed_ms`], [`record_on_raw_stream`] | the event's |
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
//! For the same reason [`context`] does not call `CudaContext::disable_event_tracking` (an `unsafe`
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

use crate::error::{Error, Result};
use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaStream};

use std::ffi::{c_int, c_uint, c_void};
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

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
                crate::exec::panic_message(&*payload)
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

/// What the driver says about one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The CUDA device ordinal (as in `CUDA_VISIBLE_DEVICES` order).
    pub index: usize,
    /// The product name, e.g. "NVIDIA H200".
    pub name: String,
    /// Total device memory in bytes.
    pub total_memory_bytes: usize,
    /// Number of streaming multiprocessors.
    pub sm_count: u32,
    /// Compute capability as (major, minor), e.g. (9, 0) for Hopper.
    pub compute_capability: (u32, u32),
    /// PCI address "domain:bus:device.function", e.g. "0000:19:00.0"; matches `nvidia-smi`.
    pub pci_bus_id: String,
}

/// Every device the driver reports, in ordinal order. Creates no context.
pub fn devices() -> Result<Vec<DeviceInfo>> {
    let count = device_count()?;
    guard("device queries", || (0..count).map(device_info).collect())
}

/// The driver's handle for device `index`, after checking the driver and the index.
fn cu_device(index: usize) -> Result<sys::CUdevice> {
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

fn device_info(index: usize) -> Result<DeviceInfo> {
    let dev = cu_device(index)?;
    let attribute = |attribute: sys::CUdevice_attribute| {
        // SAFETY: `dev` came from cuDeviceGet for an ordinal below the device count just above.
        unsafe { result::device::get_attribute(dev, attribute) }
            .call("cuDeviceGetAttribute")
            .map(non_negative)
    };
    use sys::CUdevice_attribute::*;
    Ok(DeviceInfo {
        index,
        name: result::device::get_name(dev).call("cuDeviceGetName")?,
        // SAFETY: as above, `dev` is a valid device handle.
        total_memory_bytes: unsafe { result::device::total_mem(dev) }.call("cuDeviceTotalMem")?,
        sm_count: attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        compute_capability: (
            attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
        pci_bus_id: pci_bus_id(dev)?,
    })
}

/// The driver returns counts and versions as C ints; they are never negative.
fn non_negative(value: c_int) -> u32 {
    u32::try_from(value).unwrap_or(0)
}

fn pci_bus_id(dev: sys::CUdevice) -> Result<String> {
    const LEN: usize = 64; // "0000:19:00.0" is 13 bytes with its NUL; the driver truncates to LEN.
    let mut buf = [0u8; LEN];
    // SAFETY: `buf` is LEN writable bytes and LEN is the length we pass, so the driver's
    // NUL-terminated string stays inside it; `dev` is a valid handle from cuDeviceGet.
    unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr().cast(), LEN as c_int, dev) }
        .result()
        .call("cuDeviceGetPCIBusId")?;
    Ok(c_buf_to_string(&buf))
}

/// The text before the first NUL (all of it if there is none), with invalid UTF-8 replaced.
fn c_buf_to_string(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

// ---------------------------------------------------------------------------------------------
// Contexts.
// ---------------------------------------------------------------------------------------------

/// The primary context of `device`, retained (cudarc's `CudaContext::new`); it is bound to the
/// calling thread as a side effect. Checks [`driver_available`] and the index first, so it returns
/// [`Error::NoGpu`] or [`Error::InvalidArgument`] instead of panicking. Each call retains the primary
/// context once more; it is released when the last clone of the returned `Arc` is dropped. Event
/// tracking is left on: see the module doc.
pub fn context(device: usize) -> Result<Arc<CudaContext>> {
    cu_device(device)?;
    guard("cuDevicePrimaryCtxRetain", || {
        CudaContext::new(device).call("cuDevicePrimaryCtxRetain")
    })
}

/// Free and total memory of `ctx`'s device in bytes (`cuMemGetInfo`); binds `ctx`. For leak
/// checks and reports.
pub fn memory_info(ctx: &CudaContext) -> Result<(usize, usize)> {
    bind(ctx)?;
    result::mem_get_info().call("cuMemGetInfo")
}

/// Makes `ctx` current on the calling thread unless it already is. Does not consume errors cudarc
/// recorded in the context (see the module doc).
pub(crate) fn bind(ctx: &CudaContext) -> Result<()> {
    let current = result::ctx::get_current().call("cuCtxGetCurrent")?;
    if current != Some(ctx.cu_ctx()) {
        // SAFETY: `ctx.cu_ctx()` is a live context: the CudaContext we borrow holds its primary
        // context retained until it is dropped.
        unsafe { result::ctx::set_current(ctx.cu_ctx()) }.call("cuCtxSetCurrent")?;
    }
    Ok(())
}

/// The calling thread's current context, saved by [`save_current`] and put back by
/// [`SavedContext::restore`]: code that binds other contexts on a caller's thread leaves the
/// caller's binding (its runtime, its cuBLAS) as it found it.
pub(crate) struct SavedContext(Option<sys::CUcontext>);

pub(crate) fn save_current() -> Result<SavedContext> {
    Ok(SavedContext(
        result::ctx::get_current().call("cuCtxGetCurrent")?,
    ))
}

impl SavedContext {
    pub(crate) fn restore(self) -> Result<()> {
        let ctx = self.0.unwrap_or(std::ptr::null_mut());
        // SAFETY: the context was current on this thread when saved, within one call of ours
        // that the caller is blocked in, so it cannot have been destroyed meanwhile; null
        // unbinds, as it was.
        unsafe { result::ctx::set_current(ctx) }.call("cuCtxSetCurrent")
    }
}

fn same_context(a: &CudaContext, b: &CudaContext) -> bool {
    a.cu_ctx() == b.cu_ctx()
}

// ---------------------------------------------------------------------------------------------
// Peer access.
// ---------------------------------------------------------------------------------------------

/// Whether device `from` can map device `to`'s memory (`cuDeviceCanAccessPeer(from, to)`).
///
/// **Not symmetric**: the answer for (a, b) says nothing about (b, a); ask both directions. A device
/// always reaches its own memory, so `from == to` is `true` (the driver itself would answer 0).
/// "Can" is not "does": access must still be switched on with [`enable_peer_access`].
pub fn can_access_peer(from: usize, to: usize) -> Result<bool> {
    let (dev_from, dev_to) = (cu_device(from)?, cu_device(to)?);
    if from == to {
        return Ok(true);
    }
    let mut can: c_int = 0;
    // SAFETY: both handles come from cuDeviceGet; `can` is a live c_int the driver writes once.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, dev_from, dev_to) }
        .result()
        .call("cuDeviceCanAccessPeer")?;
    Ok(can != 0)
}

/// `m[from][to]` = [`can_access_peer`]`(from, to)` for devices `0..n`; the diagonal is `true`.
/// Read it by row: it need not be symmetric.
pub fn peer_matrix(n: usize) -> Result<Vec<Vec<bool>>> {
    let count = device_count()?;
    if n > count {
        return Err(Error::InvalidArgument(format!(
            "peer matrix for {n} devices asked, but this host has {count}"
        )));
    }
    (0..n)
        .map(|from| (0..n).map(|to| can_access_peer(from, to)).collect())
        .collect()
}

/// The driver's description of the link from device `from` to device `to`
/// (`cuDeviceGetP2PAttribute`, source `from`, destination `to`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct P2pAttributes {
    /// A relative rank of the link's performance; compare it only between pairs of one host.
    pub performance_rank: i32,
    /// Whether peer access from `from` to `to` is supported (the same answer as
    /// [`can_access_peer`]).
    pub access_supported: bool,
    /// Whether native atomics over the link are supported.
    pub native_atomics: bool,
    /// Whether CUDA arrays on `to` can be accessed from `from`.
    pub cuda_array_access: bool,
}

/// The link attributes from device `from` to device `to`. Directional, like [`can_access_peer`];
/// `from == to` is an [`Error::InvalidArgument`] (the driver defines no link from a device to
/// itself).
pub fn p2p_attributes(from: usize, to: usize) -> Result<P2pAttributes> {
    let (dev_from, dev_to) = (cu_device(from)?, cu_device(to)?);
    if from == to {
        return Err(Error::InvalidArgument(format!(
            "p2p attributes need two different devices, got {from} twice"
        )));
    }
    guard("cuDeviceGetP2PAttribute", || {
        let attribute = |attribute: sys::CUdevice_P2PAttribute| {
            let mut value: c_int = 0;
            // SAFETY: both handles come from cuDeviceGet and differ; `value` is a live c_int the
            // driver writes once.
            unsafe { sys::cuDeviceGetP2PAttribute(&mut value, attribute, dev_from, dev_to) }
                .result()
                .call("cuDeviceGetP2PAttribute")
                .map(|()| value)
        };
        use sys::CUdevice_P2PAttribute::*;
        Ok(P2pAttributes {
            performance_rank: attribute(CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK)?,
            access_supported: attribute(CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED)? != 0,
            native_atomics: attribute(CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)? != 0,
            // CUDA's header calls value 4 CUDA_ARRAY_ACCESS_SUPPORTED; bindgen kept its older
            // alias ACCESS_ACCESS_SUPPORTED.
            cuda_array_access: attribute(CU_DEVICE_P2P_ATTRIBUTE_ACCESS_ACCESS_SUPPORTED)? != 0,
        })
    })
}

/// Lets `ctx_from` (its device, its kernels and copy engines) access memory allocated in `ctx_to`:
/// binds `ctx_from` and calls `cuCtxEnablePeerAccess(ctx_to, 0)`.
///
/// One direction only: a ring enables both directions for each pair of neighbours. Already enabled
/// counts as success, so it may be called again. The same device (or context) is a no-op `Ok`.
/// [`Error::NoPeerAccess`] when the hardware cannot do it (`CUDA_ERROR_PEER_ACCESS_UNSUPPORTED`).
/// This covers `cuMemAlloc` memory only — pool memory needs [`grant_pool_access`] (module doc).
/// A device can have at most 8 peers enabled (`CUDA_ERROR_TOO_MANY_PEERS` beyond).
pub fn enable_peer_access(ctx_from: &CudaContext, ctx_to: &CudaContext) -> Result<()> {
    if same_context(ctx_from, ctx_to) || ctx_from.ordinal() == ctx_to.ordinal() {
        return Ok(());
    }
    bind(ctx_from)?;
    // SAFETY: `ctx_to.cu_ctx()` is a live context (the borrowed CudaContext keeps it retained) and
    // flags must be 0, which we pass; `ctx_from` is current, as the call requires.
    match unsafe { sys::cuCtxEnablePeerAccess(ctx_to.cu_ctx(), 0) }.result() {
        Ok(()) | Err(DriverError(sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)) => Ok(()),
        Err(DriverError(sys::CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED)) => {
            Err(Error::NoPeerAccess {
                from: ctx_from.ordinal(),
                to: ctx_to.ordinal(),
            })
        }
        Err(err) => Err(check("cuCtxEnablePeerAccess")(err)),
    }
}

/// Undoes [`enable_peer_access`] for one direction (`cuCtxDisablePeerAccess`); not enabled counts
/// as success. Peer copies between the two then still work — through host memory, slowly, with no
/// error: the silent fallback that [`super::probe`] exists to catch. For tests and teaching.
pub fn disable_peer_access(ctx_from: &CudaContext, ctx_to: &CudaContext) -> Result<()> {
    if same_context(ctx_from, ctx_to) || ctx_from.ordinal() == ctx_to.ordinal() {
        return Ok(());
    }
    bind(ctx_from)?;
    // SAFETY: `ctx_to.cu_ctx()` is a live context (retained by the borrowed CudaContext) and
    // `ctx_from` is current, as the call requires.
    match unsafe { sys::cuCtxDisablePeerAccess(ctx_to.cu_ctx()) }.result() {
        Ok(()) | Err(DriverError(sys::CUresult::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)) => Ok(()),
        Err(err) => Err(check("cuCtxDisablePeerAccess")(err)),
    }
}

// ---------------------------------------------------------------------------------------------
// Pool memory: detecting it and granting access to it.
// ---------------------------------------------------------------------------------------------

/// Grants device `peer_device` read-write access to the memory pools of `owner`'s device: its
/// default pool (`cuDeviceGetDefaultMemPool`), and its current pool (`cuDeviceGetMemPool`, which
/// `cuMemAllocAsync` draws from) when that is a different one. Without this, peer copies into or
/// out of pool buffers take the 37.6 GB/s staged path even with peer access enabled (module doc).
///
/// Covers pool buffers allocated before and after the call. `peer_device == owner`'s device is a
/// no-op `Ok` (a pool's own device always has access). [`Error::NoPeerAccess`] when `peer_device`
/// cannot access `owner`'s device at all. For a buffer from some other pool use
/// [`grant_pointer_pool_access`].
pub fn grant_pool_access(owner: &CudaContext, peer_device: usize) -> Result<()> {
    cu_device(peer_device)?;
    let owner_device = owner.ordinal();
    if peer_device == owner_device {
        return Ok(());
    }
    if !can_access_peer(peer_device, owner_device)? {
        return Err(Error::NoPeerAccess {
            from: peer_device,
            to: owner_device,
        });
    }
    bind(owner)?;
    guard("cuMemPoolSetAccess", || {
        // SAFETY: `owner.cu_device()` is the device of a live context, so a valid device handle.
        let default_pool = unsafe { result::device::get_default_mem_pool(owner.cu_device()) }
            .call("cuDeviceGetDefaultMemPool")?;
        // SAFETY: as above.
        let current_pool = unsafe { result::device::get_mem_pool(owner.cu_device()) }
            .call("cuDeviceGetMemPool")?;
        set_pool_access(default_pool, peer_device, READ_WRITE)?;
        if current_pool != default_pool {
            set_pool_access(current_pool, peer_device, READ_WRITE)?;
        }
        Ok(())
    })
}

/// When `ptr` lies in memory from a stream-ordered pool, grants `peer_device` read-write access to
/// that pool (whichever pool it is) and returns `true`; returns `false` for memory outside pools
/// (nothing to do). A no-op `true` when the pool is on `peer_device` itself. [`Error::NoPeerAccess`]
/// when `peer_device` cannot access the pool's device.
pub fn grant_pointer_pool_access(ptr: u64, peer_device: usize) -> Result<bool> {
    cu_device(peer_device)?;
    let Some(pool) = pointer_pool(ptr)? else {
        return Ok(false);
    };
    let Some(owner_device) = pointer_device(ptr)? else {
        return Ok(false);
    };
    if owner_device == peer_device {
        return Ok(true);
    }
    if !can_access_peer(peer_device, owner_device)? {
        return Err(Error::NoPeerAccess {
            from: peer_device,
            to: owner_device,
        });
    }
    guard("cuMemPoolSetAccess", || {
        set_pool_access(pool, peer_device, READ_WRITE)
    })?;
    Ok(true)
}

const READ_WRITE: sys::CUmemAccess_flags =
    sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

/// `cuMemPoolSetAccess(pool, {device peer_device, flags})`. `pool` must be a live pool handle from
/// the driver; every caller passes one it just obtained from the driver.
fn set_pool_access(
    pool: sys::CUmemoryPool,
    peer_device: usize,
    flags: sys::CUmemAccess_flags,
) -> Result<()> {
    let id = c_int::try_from(peer_device).map_err(|_| {
        Error::InvalidArgument(format!("device {peer_device} is not a CUDA ordinal"))
    })?;
    let desc = sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id,
        },
        flags,
    };
    // SAFETY: `pool` is a live pool handle (see above); `desc` is one initialized descriptor and we
    // pass count 1; the driver only reads it during the call.
    unsafe { sys::cuMemPoolSetAccess(pool, &desc, 1) }
        .result()
        .call("cuMemPoolSetAccess")
}

/// Reads one pointer attribute; `Ok(None)` when the driver does not know the address
/// (`CUDA_ERROR_INVALID_VALUE`: pageable host memory, a freed or made-up pointer).
///
/// # Safety
/// `T` must be exactly the type the driver writes for `attribute` (`MEMORY_TYPE`: `c_uint`,
/// `DEVICE_ORDINAL`: `c_int`, `MEMPOOL_HANDLE`: `CUmemoryPool`); `init` is returned if unchanged.
unsafe fn pointer_attribute<T>(
    ptr: u64,
    attribute: sys::CUpointer_attribute,
    init: T,
) -> Result<Option<T>> {
    let mut value = init;
    // SAFETY: `value` is a live, writable T, and the caller guarantees T is the attribute's type,
    // so the driver's write stays inside it. `ptr` is only looked up, never dereferenced.
    let status = unsafe {
        sys::cuPointerGetAttribute((&mut value as *mut T).cast::<c_void>(), attribute, ptr)
    };
    match status.result() {
        Ok(()) => Ok(Some(value)),
        Err(DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE)) => Ok(None),
        Err(err) => Err(check("cuPointerGetAttribute")(err)),
    }
}

/// The device whose memory `ptr` points into (`CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`); `None` for
/// host memory (pinned or pageable) and for addresses the driver does not know.
pub fn pointer_device(ptr: u64) -> Result<Option<usize>> {
    driver_available()?;
    guard("cuPointerGetAttribute", || {
        // SAFETY: the driver writes CU_POINTER_ATTRIBUTE_MEMORY_TYPE as a CUmemorytype, a 32-bit
        // C enum: a c_uint.
        let memory_type = unsafe {
            pointer_attribute::<c_uint>(
                ptr,
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                0,
            )
        }?;
        match memory_type {
            None => return Ok(None),
            Some(t) if t == sys::CUmemorytype::CU_MEMORYTYPE_HOST as c_uint => return Ok(None),
            Some(_) => {}
        }
        // SAFETY: the driver writes CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL as a C int.
        let ordinal = unsafe {
            pointer_attribute::<c_int>(
                ptr,
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                -1,
            )
        }?;
        Ok(ordinal.and_then(|ordinal| usize::try_from(ordinal).ok()))
    })
}

/// The pool `ptr`'s memory came from, or `None` outside pools.
fn pointer_pool(ptr: u64) -> Result<Option<sys::CUmemoryPool>> {
    driver_available()?;
    guard("cuPointerGetAttribute", || {
        // SAFETY: the driver writes CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE as a CUmemoryPool.
        let pool = unsafe {
            pointer_attribute::<sys::CUmemoryPool>(
                ptr,
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
                std::ptr::null_mut(),
            )
        }?;
        Ok(pool.filter(|pool| !pool.is_null()))
    })
}

/// Whether `ptr` lies in memory from a stream-ordered pool (`CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE` is
/// not null) — cudarc's `CudaSlice`s usually are. Such a buffer needs [`grant_pointer_pool_access`]
/// before peers copy into or out of it at link speed. `false` for unknown addresses.
pub fn pointer_is_pool_memory(ptr: u64) -> Result<bool> {
    Ok(pointer_pool(ptr)?.is_some())
}

// ---------------------------------------------------------------------------------------------
// Memory outside the pools.
// ---------------------------------------------------------------------------------------------

/// Device memory from plain `cuMemAlloc` in one context — outside every stream-ordered pool, so
/// peer access enabled with [`enable_peer_access`] applies to it (module doc, the pool trap).
/// Uninitialized when made with [`DeviceBuffer::new`].
#[derive(Debug)]
pub struct DeviceBuffer {
    /// 0 only after the memory was freed.
    ptr: sys::CUdeviceptr,
    len_bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DeviceBuffer {
    /// Allocates `len_bytes` (> 0) on `ctx`'s device with `cuMemAlloc`; binds `ctx`.
    pub fn new(ctx: &Arc<CudaContext>, len_bytes: usize) -> Result<Self> {
        if len_bytes == 0 {
            return Err(Error::InvalidArgument(
                "a device buffer needs at least one byte".to_string(),
            ));
        }
        bind(ctx)?;
        // SAFETY: `ctx` is current, so the memory lands on its device; the memory is uninitialized,
        // which is fine for device bytes we only ever copy, never read as typed host values.
        let ptr = unsafe { result::malloc_sync(len_bytes) }.call("cuMemAlloc")?;
        Ok(Self {
            ptr,
            len_bytes,
            ctx: Arc::clone(ctx),
        })
    }

    /// [`DeviceBuffer::new`] followed by [`DeviceBuffer::fill_zero`].
    pub fn zeroed(ctx: &Arc<CudaContext>, len_bytes: usize) -> Result<Self> {
        let mut buffer = Self::new(ctx, len_bytes)?;
        buffer.fill_zero()?;
        Ok(buffer)
    }

    /// The device address (`CUdeviceptr`), valid in every context through unified addressing.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// The device ordinal the memory is on.
    pub fn device(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The context the memory was allocated in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    fn check_len(&self, what: &str, host_len: usize) -> Result<()> {
        if host_len == self.len_bytes {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "{what}: host slice has {host_len} bytes, device buffer {}",
                self.len_bytes
            )))
        }
    }

    /// Copies `src` (exactly [`len_bytes`](Self::len_bytes) long) into the buffer. Synchronous with
    /// respect to the whole context: waits for all work queued in the buffer's context before and
    /// after (`cuCtxSynchronize`; a pageable host-to-device `cuMemcpyHtoD` may return before its DMA
    /// lands, and does not order against non-blocking streams). Work queued in *other* contexts that
    /// touches this buffer (a neighbour's peer copy into it) is not waited for. A setup and test
    /// helper, not for the hot path.
    pub fn copy_from_host(&mut self, src: &[u8]) -> Result<()> {
        self.check_len("copy_from_host", src.len())?;
        bind(&self.ctx)?;
        result::ctx::synchronize().call("cuCtxSynchronize")?;
        // SAFETY: `self.ptr` is a live cuMemAlloc allocation of len_bytes == src.len() bytes, and
        // `src` is a live slice for the whole call (the copy has left it when the call returns).
        unsafe { result::memcpy_htod_sync(self.ptr, src) }.call("cuMemcpyHtoD")?;
        result::ctx::synchronize().call("cuCtxSynchronize")
    }

    /// Copies the buffer into `dst` (exactly [`len_bytes`](Self::len_bytes) long). Waits for all
    /// work queued in the buffer's context first (`cuCtxSynchronize`), then copies; complete on
    /// return. Same caveat about other contexts as [`copy_from_host`](Self::copy_from_host).
    pub fn copy_to_host(&self, dst: &mut [u8]) -> Result<()> {
        self.check_len("copy_to_host", dst.len())?;
        bind(&self.ctx)?;
        result::ctx::synchronize().call("cuCtxSynchronize")?;
        // SAFETY: `self.ptr` is a live allocation of len_bytes == dst.len() bytes; `dst` is an
        // exclusive, live slice, and a device-to-pageable-host copy is complete when it returns.
        unsafe { result::memcpy_dtoh_sync(dst, self.ptr) }.call("cuMemcpyDtoH")
    }

    /// Sets every byte to 0 (`cuMemsetD8`), synchronous with respect to the context like
    /// [`copy_from_host`](Self::copy_from_host).
    pub fn fill_zero(&mut self) -> Result<()> {
        bind(&self.ctx)?;
        result::ctx::synchronize().call("cuCtxSynchronize")?;
        // SAFETY: `self.ptr` is a live allocation of len_bytes bytes, all of which we write.
        unsafe { result::memset_d8_sync(self.ptr, 0, self.len_bytes) }.call("cuMemsetD8")?;
        result::ctx::synchronize().call("cuCtxSynchronize")
    }

    /// Frees the memory now and returns the driver's error, if any (`Drop` does the same silently).
    pub fn free(mut self) -> Result<()> {
        self.release()
    }

    fn release(&mut self) -> Result<()> {
        let ptr = std::mem::replace(&mut self.ptr, 0);
        if ptr == 0 {
            return Ok(());
        }
        bind(&self.ctx)?;
        // SAFETY: `ptr` came from cuMemAlloc in `self.ctx` (now current) and is freed exactly once:
        // it was swapped for 0 above, and `free` and `Drop` both come through here. Queued work that
        // still uses it is excluded by the `# Safety` contracts of the enqueue functions.
        unsafe { result::free_sync(ptr) }.call("cuMemFree")
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        teardown_in_drop(|| self.release());
    }
}

/// Page-locked ("pinned") host memory from `cuMemHostAlloc` with `CU_MEMHOSTALLOC_PORTABLE`: pinned
/// for every context, not only the one that allocated it, so any GPU's copy engine can DMA to and
/// from it at full PCIe speed (55 GB/s each way measured). Zeroed at allocation.
///
/// Not cudarc's `PinnedHostSlice`: its `Drop` synchronizes an extra event and records errors in the
/// context (see the module doc).
#[derive(Debug)]
pub struct PinnedHost {
    /// Null only after the memory was freed.
    ptr: *mut u8,
    len_bytes: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: a PinnedHost owns its allocation exclusively, like a Box<[u8]>: pinned memory is ordinary
// host memory that any thread may read and write, `&PinnedHost` hands out only `&[u8]` and a const
// pointer, and writing needs `&mut`. Freeing binds the owning context on whichever thread drops it,
// and the driver API is thread-safe; PORTABLE makes the memory pinned for every context, so the
// thread (and GPU) that uses it need not be the one that allocated it.
unsafe impl Send for PinnedHost {}
// SAFETY: see Send; shared references only read.
unsafe impl Sync for PinnedHost {}

impl PinnedHost {
    /// Allocates `len_bytes` (> 0) of portable pinned host memory in `ctx`, zeroed; binds `ctx`.
    /// The memory lives as long as this value (which holds `ctx` alive: destroying the allocating
    /// context would free it).
    pub fn new(ctx: &Arc<CudaContext>, len_bytes: usize) -> Result<Self> {
        if len_bytes == 0 {
            return Err(Error::InvalidArgument(
                "a pinned host buffer needs at least one byte".to_string(),
            ));
        }
        bind(ctx)?;
        let ptr = guard("cuMemHostAlloc", || {
            // SAFETY: `ctx` is current; the returned memory is uninitialized, and we zero it below
            // before anything can read it.
            unsafe { result::malloc_host(len_bytes, sys::CU_MEMHOSTALLOC_PORTABLE) }
                .call("cuMemHostAlloc")
        })?
        .cast::<u8>();
        debug_assert!(
            !ptr.is_null(),
            "cuMemHostAlloc succeeded with a null pointer"
        );
        // SAFETY: cuMemHostAlloc succeeded, so `ptr` is valid for writes of len_bytes bytes, and no
        // one else has it yet.
        unsafe { std::ptr::write_bytes(ptr, 0, len_bytes) };
        Ok(Self {
            ptr,
            len_bytes,
            ctx: Arc::clone(ctx),
        })
    }

    /// The first byte, for reading.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// The first byte, for writing (including handing to an asynchronous copy as its destination).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    /// The address as a unified-addressing pointer, for [`memcpy_async`]'s `dst`/`src`.
    pub fn uva_ptr(&self) -> u64 {
        self.ptr as u64
    }

    /// The size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// The context the memory was allocated in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The bytes. No asynchronous copy into this memory may be in flight (the `# Safety` contract
    /// of [`memcpy_async`] makes that the enqueuer's duty).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for len_bytes bytes for as long as `self` lives, and initialized
        // (zeroed at allocation, written since only through `&mut self` or by copies whose contract
        // forbids host access while they run); the borrow of `self` keeps it alive and unaliased
        // by writers.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len_bytes) }
    }

    /// The bytes, mutably. Same condition as [`as_slice`](Self::as_slice).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len_bytes) }
    }

    /// Frees the memory now and returns the driver's error, if any (`Drop` does the same silently).
    pub fn free(mut self) -> Result<()> {
        self.release()
    }

    fn release(&mut self) -> Result<()> {
        let ptr = std::mem::replace(&mut self.ptr, std::ptr::null_mut());
        if ptr.is_null() {
            return Ok(());
        }
        bind(&self.ctx)?;
        // SAFETY: `ptr` came from cuMemHostAlloc in `self.ctx` (now current) and is freed exactly
        // once: it was swapped for null above, and `free` and `Drop` both come through here.
        unsafe { result::free_host(ptr.cast()) }.call("cuMemFreeHost")
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        teardown_in_drop(|| self.release());
    }
}

// ---------------------------------------------------------------------------------------------
// Streams and events.
// ---------------------------------------------------------------------------------------------

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

/// Makes work queued on `stream` after this call wait until the work captured by `event`'s latest
/// record has completed (`cuStreamWaitEvent`); binds the stream's context. Works across contexts: a
/// stream on GPU 1 may wait on an event of GPU 0, on the GPU, without blocking the host. An event
/// never recorded is already complete.
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

/// Queues a copy of `bytes` bytes from `src_ptr` (memory of `src_ctx`) to `dst_ptr` (memory of
/// `dst_ctx`) on `stream` (`cuMemcpyPeerAsync`); binds the stream's context. Returns once queued.
///
/// Runs over the direct link only when peer access is enabled and the memory is outside pools or
/// granted (module doc); otherwise it still succeeds, staged through the host at ~38 GB/s.
/// Push (the copy on the sender's stream) measured 15–30% faster than pull on the test machine.
/// `stream` must belong to `src_ctx` or `dst_ctx` ([`Error::InvalidArgument`]); `bytes == 0` queues
/// nothing.
///
/// # Safety
///
/// - `[src_ptr, src_ptr + bytes)` is device memory allocated in `src_ctx`, and
///   `[dst_ptr, dst_ptr + bytes)` is device memory allocated in `dst_ctx`; the two do not overlap.
/// - Both allocations stay allocated until the copy has completed on `stream` — observed through an
///   event recorded on `stream` after this call, or [`stream_synchronize`]. Dropping a
///   [`DeviceBuffer`] earlier is a use after free on the GPU.
/// - Until then nothing else writes the source range or reads or writes the destination range:
///   every other use is ordered before or after this copy with events (or a synchronize).
pub unsafe fn memcpy_peer_async(
    dst_ptr: u64,
    dst_ctx: &CudaContext,
    src_ptr: u64,
    src_ctx: &CudaContext,
    bytes: usize,
    stream: &Stream,
) -> Result<()> {
    if !same_context(&stream.ctx, src_ctx) && !same_context(&stream.ctx, dst_ctx) {
        return Err(Error::InvalidArgument(format!(
            "a peer copy from device {} to device {} was queued on a stream of device {}",
            src_ctx.ordinal(),
            dst_ctx.ordinal(),
            stream.device()
        )));
    }
    if bytes == 0 {
        return Ok(());
    }
    bind(&stream.ctx)?;
    // SAFETY: the ranges, their lifetimes and exclusive use are the caller's contract above; both
    // contexts are live (borrowed CudaContexts keep them retained) and the stream is live and
    // belongs to the bound context.
    unsafe {
        result::memcpy_peer_async(
            dst_ctx.cu_ctx(),
            dst_ptr,
            src_ctx.cu_ctx(),
            src_ptr,
            bytes,
            stream.raw,
        )
    }
    .call("cuMemcpyPeerAsync")
}

/// Queues a copy of `bytes` bytes from `src` to `dst` on `stream` with unified addressing
/// (`cuMemcpyAsync`; the driver infers the direction from the addresses); binds the stream's
/// context. Returns once queued. For device → pinned host, pinned host → device, local device →
/// device, and peer device → device with peer access on (the form CUDA graph capture accepts).
/// `bytes == 0` queues nothing.
///
/// # Safety
///
/// - `[src, src + bytes)` and `[dst, dst + bytes)` are each inside one allocation the driver knows:
///   device memory of any context (a [`DeviceBuffer`], a user's buffer) or page-locked host memory
///   (a [`PinnedHost`], via [`PinnedHost::uva_ptr`]); the two ranges do not overlap.
///   (Pageable host memory is accepted by the driver but makes the copy synchronous and slow.)
/// - Both allocations stay allocated until the copy has completed on `stream` (an event recorded
///   after it, or [`stream_synchronize`]).
/// - Until then nothing else writes the source or reads or writes the destination. For host memory
///   this includes the host: no `&`/`&mut` to the destination bytes, and no `&mut` to the source
///   bytes, may be used before completion.
pub unsafe fn memcpy_async(dst: u64, src: u64, bytes: usize, stream: &Stream) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    bind(&stream.ctx)?;
    // SAFETY: the ranges, their lifetimes and exclusive use are the caller's contract above; the
    // stream is live and its context is bound.
    unsafe { sys::cuMemcpyAsync(dst, src, bytes, stream.raw) }
        .result()
        .call("cuMemcpyAsync")
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

// ---------------------------------------------------------------------------------------------
// Small queries and fills for the diagnostic commands (`ringreduce p2p`, `sync`).
// ---------------------------------------------------------------------------------------------

/// Queues a fill of `count` 32-bit words at `ptr` with `value` on `stream` (`cuMemsetD32Async`);
/// binds the stream's context. Returns once queued. Lets a diagnostic "write" a known,
/// per-iteration value on a GPU without a kernel, and makes a cheap delay (a large fill keeps the
/// stream busy for a predictable time). `count == 0` queues nothing.
///
/// # Safety
///
/// - `[ptr, ptr + 4 * count)` is device memory inside one live allocation (a [`DeviceBuffer`] or
///   another allocation the driver knows), and `ptr` is 4-byte aligned (`cuMemAlloc` returns
///   256-byte-aligned memory, so any 4-byte-multiple offset into a [`DeviceBuffer`] is).
/// - The allocation stays allocated until the fill has completed on `stream` (an event recorded
///   after it, or [`stream_synchronize`]).
/// - Until then nothing else reads or writes the range unless ordered after the fill by an event
///   (or a synchronize) — reading it unordered is exactly the race `ringreduce sync` demonstrates.
pub unsafe fn memset_d32_async(ptr: u64, value: u32, count: usize, stream: &Stream) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    if ptr % 4 != 0 {
        return Err(Error::InvalidArgument(format!(
            "memset_d32_async needs a 4-byte-aligned pointer, got {ptr:#x}"
        )));
    }
    bind(&stream.ctx)?;
    // SAFETY: the range, its alignment (also checked above), lifetime and exclusive use are the
    // caller's contract; the stream is live and its context is bound.
    unsafe { sys::cuMemsetD32Async(ptr, value as c_uint, count, stream.raw) }
        .result()
        .call("cuMemsetD32Async")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank- and index-dependent bytes, so a chunk landing in the wrong place shows.
    fn pattern(device: usize, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| ((i * 31 + device * 17 + i / 251) % 253) as u8)
            .collect()
    }

    /// Panics with the first few (index, got, want) mismatches.
    fn assert_bytes_eq(what: &str, got: &[u8], want: &[u8]) {
        assert_eq!(got.len(), want.len(), "{what}: lengths differ");
        let wrong: Vec<_> = (0..got.len())
            .filter(|&i| got[i] != want[i])
            .map(|i| (i, got[i], want[i]))
            .collect();
        assert!(
            wrong.is_empty(),
            "{what}: {} wrong bytes, first (index, got, want): {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(5)]
        );
    }

    fn assert_no_gpu<T: std::fmt::Debug>(what: &str, result: Result<T>) {
        match result {
            Err(Error::NoGpu { reason }) => assert!(!reason.is_empty(), "{what}: empty reason"),
            other => panic!("{what}: expected Err(NoGpu) on a host without a GPU, got {other:?}"),
        }
    }

    /// On a GPU host: `Some` of the count. Elsewhere: prints the waiver and returns `None`.
    fn gpus(needed: usize, test: &str) -> Option<usize> {
        match device_count() {
            Ok(count) if count >= needed => Some(count),
            _ => {
                eprintln!("{test}: waived: needs ≥ {needed} GPU(s)");
                None
            }
        }
    }

    #[test]
    fn driver_errors_carry_call_code_and_message() {
        let err = check("cuMemcpyPeerAsync")(DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE));
        match &err {
            Error::Cuda {
                call,
                code,
                message,
            } => {
                assert_eq!(*call, "cuMemcpyPeerAsync");
                assert_eq!(code, "CUDA_ERROR_INVALID_VALUE");
                assert!(!message.is_empty());
            }
            other => panic!("expected Error::Cuda, got {other:?}"),
        }
        let shown = err.to_string();
        assert!(shown.contains("cuMemcpyPeerAsync") && shown.contains("CUDA_ERROR_INVALID_VALUE"));

        let status: std::result::Result<(), DriverError> =
            Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY));
        assert!(matches!(
            status.call("cuEventQuery"),
            Err(Error::Cuda { call: "cuEventQuery", ref code, .. }) if code == "CUDA_ERROR_NOT_READY"
        ));
    }

    #[test]
    fn driver_versions_decode() {
        assert_eq!(decode_driver_version(13000), (13, 0));
        assert_eq!(decode_driver_version(12080), (12, 8));
        assert_eq!(decode_driver_version(11040), (11, 4));
        assert_eq!(decode_driver_version(-1), (0, 0));
    }

    #[test]
    fn c_strings_stop_at_the_first_nul() {
        assert_eq!(c_buf_to_string(b"0000:19:00.0\0\0junk"), "0000:19:00.0");
        assert_eq!(c_buf_to_string(b"no nul"), "no nul");
        assert_eq!(c_buf_to_string(b"\0"), "");
    }

    #[test]
    fn panics_become_no_gpu_errors() {
        // The default hook would print this expected panic; it is one line in the test's output.
        let result: Result<()> = guard("a test call", || panic!("Missing symbol cuFoo"));
        match result {
            Err(Error::NoGpu { reason }) => {
                assert!(reason.contains("a test call") && reason.contains("Missing symbol cuFoo"))
            }
            other => panic!("expected NoGpu, got {other:?}"),
        }
    }

    /// Without a GPU every entry point returns Err(NoGpu), none panics; with one, the answers are
    /// sane.
    #[test]
    fn probe_and_queries_agree() {
        match driver_available() {
            Err(Error::NoGpu { .. }) => {
                assert_no_gpu("driver_available", driver_available());
                assert_no_gpu("device_count", device_count());
                assert_no_gpu("devices", devices());
                assert_no_gpu("context(0)", context(0));
                assert_no_gpu("can_access_peer", can_access_peer(0, 1));
                assert_no_gpu("peer_matrix", peer_matrix(2));
                assert_no_gpu("p2p_attributes", p2p_attributes(0, 1));
                assert_no_gpu("pointer_device", pointer_device(0x1000));
                assert_no_gpu("pointer_is_pool_memory", pointer_is_pool_memory(0x1000));
                assert_no_gpu(
                    "grant_pointer_pool_access",
                    grant_pointer_pool_access(0x1000, 0),
                );
                if !libcuda_present() {
                    assert_no_gpu("driver_version", driver_version());
                }
            }
            Err(other) => panic!("driver_available must fail only with NoGpu, got {other:?}"),
            Ok(()) => {
                let count = device_count().expect("device_count after driver_available");
                assert!(count >= 1);
                let infos = devices().expect("devices");
                assert_eq!(infos.len(), count);
                for (index, info) in infos.iter().enumerate() {
                    eprintln!("{info:?}");
                    assert_eq!(info.index, index);
                    assert!(!info.name.is_empty());
                    assert!(info.total_memory_bytes > 0);
                    assert!(info.sm_count > 0);
                    assert!(info.compute_capability.0 >= 5, "{info:?}");
                    assert!(info.pci_bus_id.contains(':'), "{info:?}");
                }
                let (major, minor) = driver_version().expect("driver_version");
                eprintln!("driver CUDA version {major}.{minor}");
                assert!(major >= 11);
                assert!(matches!(context(count), Err(Error::InvalidArgument(_))));
                assert!(matches!(
                    can_access_peer(0, count),
                    Err(Error::InvalidArgument(_))
                ));
                let matrix = peer_matrix(count).expect("peer_matrix");
                eprintln!("peer matrix: {matrix:?}");
                assert!((0..count).all(|d| matrix[d][d]));
                assert!(matches!(
                    p2p_attributes(0, 0),
                    Err(Error::InvalidArgument(_))
                ));
                assert_eq!(pointer_device(0).expect("pointer_device(0)"), None);
                assert!(!pointer_is_pool_memory(0).expect("pointer_is_pool_memory(0)"));
            }
        }
    }

    #[test]
    fn buffers_round_trip_and_know_their_device() -> Result<()> {
        let Some(count) = gpus(1, "buffers_round_trip_and_know_their_device") else {
            return Ok(());
        };
        for device in 0..count {
            let ctx = context(device)?;
            let len = 4096 * 3 + 5; // not a multiple of anything convenient
            let want = pattern(device, len);
            let mut buffer = DeviceBuffer::new(&ctx, len)?;
            buffer.copy_from_host(&want)?;
            let mut got = vec![0u8; len];
            buffer.copy_to_host(&mut got)?;
            assert_bytes_eq("round trip", &got, &want);
            buffer.fill_zero()?;
            buffer.copy_to_host(&mut got)?;
            assert_bytes_eq("fill_zero", &got, &vec![0u8; len]);

            assert_eq!(pointer_device(buffer.ptr())?, Some(device));
            assert_eq!(pointer_device(buffer.ptr() + 100)?, Some(device));
            assert!(
                !pointer_is_pool_memory(buffer.ptr())?,
                "cuMemAlloc is not pool memory"
            );
            assert!(matches!(
                buffer.copy_from_host(&want[1..]),
                Err(Error::InvalidArgument(_))
            ));
            assert!(matches!(
                DeviceBuffer::new(&ctx, 0),
                Err(Error::InvalidArgument(_))
            ));

            let pinned = PinnedHost::new(&ctx, 1000)?;
            assert!(pinned.as_slice().iter().all(|&b| b == 0));
            assert_eq!(
                pointer_device(pinned.uva_ptr())?,
                None,
                "pinned host memory"
            );
            let pageable = [1u8; 64];
            assert_eq!(pointer_device(pageable.as_ptr() as u64)?, None, "pageable");
            pinned.free()?;
            buffer.free()?;
        }
        Ok(())
    }

    /// Pointer queries on a thread with no current context, and handles made on one thread used
    /// and dropped on another (the executor creates everything up front, then hands it to one
    /// thread per GPU).
    #[test]
    fn handles_work_from_a_thread_with_no_current_context() -> Result<()> {
        if gpus(1, "handles_work_from_a_thread_with_no_current_context").is_none() {
            return Ok(());
        }
        let ctx = context(0)?;
        let len = 4096;
        let mut buffer = DeviceBuffer::new(&ctx, len)?;
        let want = pattern(5, len);
        buffer.copy_from_host(&want)?;
        let stream = Stream::new(&ctx)?;
        let event = Event::new(&ctx)?;
        let pinned = PinnedHost::new(&ctx, len)?;
        std::thread::spawn(move || -> Result<()> {
            let current = result::ctx::get_current().call("cuCtxGetCurrent")?;
            assert_eq!(current, None, "a fresh thread has no current context");
            assert_eq!(pointer_device(buffer.ptr())?, Some(0));
            assert!(!pointer_is_pool_memory(buffer.ptr())?);
            assert_eq!(pointer_device(pinned.uva_ptr())?, None);
            // SAFETY: both are len-byte allocations owned by this closure and alive until the
            // event_synchronize below; nothing else touches them meanwhile.
            unsafe { memcpy_async(pinned.uva_ptr(), buffer.ptr(), len, &stream)? };
            record(&event, &stream)?;
            event_synchronize(&event)?;
            assert_bytes_eq("D2H on another thread", pinned.as_slice(), &want);
            drop((buffer, stream, event, pinned));
            Ok(())
        })
        .join()
        .expect("the worker thread panicked")
    }

    #[test]
    fn streams_events_and_async_copies_on_one_gpu() -> Result<()> {
        if gpus(1, "streams_events_and_async_copies_on_one_gpu").is_none() {
            return Ok(());
        }
        let ctx = context(0)?;
        let len = 1 << 20;
        let stream = Stream::new(&ctx)?;
        let done = Event::new(&ctx)?;
        let (start, end) = (Event::with_timing(&ctx)?, Event::with_timing(&ctx)?);
        let a = DeviceBuffer::new(&ctx, len)?;
        let b = DeviceBuffer::new(&ctx, len)?;
        let mut host_in = PinnedHost::new(&ctx, len)?;
        let host_out = PinnedHost::new(&ctx, len)?;
        let want = pattern(3, len);
        host_in.as_mut_slice().copy_from_slice(&want);

        assert!(event_query(&done)?, "an event never recorded is complete");
        record(&start, &stream)?;
        // SAFETY: all four ranges are len-byte allocations owned by this test and alive until the
        // event_synchronize below; nothing else touches them meanwhile, and no slice of host_out
        // or &mut of host_in is used before then.
        unsafe {
            memcpy_async(a.ptr(), host_in.uva_ptr(), len, &stream)?;
            memcpy_async(b.ptr(), a.ptr(), len, &stream)?;
            memcpy_async(host_out.uva_ptr(), b.ptr(), len, &stream)?;
        }
        record(&end, &stream)?;
        record(&done, &stream)?;
        event_synchronize(&done)?;
        assert!(event_query(&done)?);
        assert_bytes_eq("H2D, D2D, D2H", host_out.as_slice(), &want);
        let ms = event_elapsed_ms(&start, &end)?;
        assert!(ms >= 0.0, "elapsed {ms} ms");
        assert!(matches!(
            event_elapsed_ms(&done, &end),
            Err(Error::InvalidArgument(_))
        ));
        stream_synchronize(&stream)?;
        assert_eq!(stream.cudarc().cu_stream(), stream.raw());
        assert_eq!(stream.cudarc().context().cu_ctx(), ctx.cu_ctx());
        stream.cudarc().synchronize().call("cuStreamSynchronize")?;
        stream.close()?;
        done.close()?;
        Ok(())
    }

    #[test]
    fn peer_copies_between_two_gpus() -> Result<()> {
        if gpus(2, "peer_copies_between_two_gpus").is_none() {
            return Ok(());
        }
        let (ctx0, ctx1) = (context(0)?, context(1)?);
        eprintln!("p2p 0→1 {:?}", p2p_attributes(0, 1)?);
        eprintln!("p2p 1→0 {:?}", p2p_attributes(1, 0)?);
        if !(can_access_peer(0, 1)? && can_access_peer(1, 0)?) {
            eprintln!("peer_copies_between_two_gpus: waived: GPUs 0 and 1 have no peer access");
            return Ok(());
        }
        for _ in 0..2 {
            // The second round checks that "already enabled" is success.
            enable_peer_access(&ctx0, &ctx1)?;
            enable_peer_access(&ctx1, &ctx0)?;
        }
        enable_peer_access(&ctx0, &ctx0)?;

        let len = 3 << 20;
        let mut src = DeviceBuffer::new(&ctx0, len)?;
        let mut dst = DeviceBuffer::zeroed(&ctx1, len)?;
        let want = pattern(0, len);
        src.copy_from_host(&want)?;
        let (stream0, stream1) = (Stream::new(&ctx0)?, Stream::new(&ctx1)?);
        let (sent, landed) = (Event::new(&ctx0)?, Event::new(&ctx1)?);
        let mut host = PinnedHost::new(&ctx1, len)?;
        assert!(matches!(
            record(&sent, &stream1),
            Err(Error::InvalidArgument(_))
        ));
        // SAFETY: src and dst are len-byte buffers on devices 0 and 1 alive until the
        // event_synchronize below; the copies are ordered by `sent` (cross-GPU wait) and nothing
        // else touches the buffers or `host` meanwhile.
        unsafe {
            // Push: the sender's stream writes into the receiver.
            memcpy_peer_async(dst.ptr(), &ctx1, src.ptr(), &ctx0, len, &stream0)?;
            record(&sent, &stream0)?;
            wait(&stream1, &sent)?;
            memcpy_async(host.uva_ptr(), dst.ptr(), len, &stream1)?;
            record(&landed, &stream1)?;
        }
        event_synchronize(&landed)?;
        assert_bytes_eq("push 0→1 then D2H", host.as_slice(), &want);

        // Pool memory is detected, and access to it can be granted.
        let cudarc_stream = ctx1.default_stream();
        let pool_slice = cudarc_stream
            .alloc_zeros::<u8>(1 << 20)
            .call("cuMemAllocAsync")?;
        let (pool_ptr, _record) =
            cudarc::driver::DevicePtr::device_ptr(&pool_slice, &cudarc_stream);
        if ctx1.has_async_alloc() {
            assert!(
                pointer_is_pool_memory(pool_ptr)?,
                "cudarc's alloc comes from the pool"
            );
            assert!(grant_pointer_pool_access(pool_ptr, 0)?);
        }
        grant_pool_access(&ctx1, 0)?;
        grant_pool_access(&ctx1, 1)?;
        assert!(!grant_pointer_pool_access(src.ptr(), 1)?);
        host.as_mut_slice()[0] = 0;
        dst.fill_zero()?;
        Ok(())
    }

    /// Prints peer-copy bandwidth for `cuMemAlloc` and pool buffers, before and after granting pool
    /// access: the pool trap, measured. Run on a 2-GPU host with `--ignored --nocapture`.
    #[test]
    #[ignore = "benchmark: run by hand on a GPU host with ≥ 2 GPUs"]
    fn peer_copy_bandwidth_report() -> Result<()> {
        if gpus(2, "peer_copy_bandwidth_report").is_none() {
            return Ok(());
        }
        let (ctx0, ctx1) = (context(0)?, context(1)?);
        enable_peer_access(&ctx0, &ctx1)?;
        enable_peer_access(&ctx1, &ctx0)?;
        let len = 256 << 20;
        let stream = Stream::new(&ctx0)?;
        let (start, end) = (Event::with_timing(&ctx0)?, Event::with_timing(&ctx0)?);
        let gbps = |dst: u64, src: u64| -> Result<f64> {
            // SAFETY: dst and src are live len-byte allocations on devices 1 and 0 that outlive
            // this closure's synchronous use; nothing else touches them.
            unsafe {
                memcpy_peer_async(dst, &ctx1, src, &ctx0, len, &stream)?; // warm-up
                record(&start, &stream)?;
                for _ in 0..5 {
                    memcpy_peer_async(dst, &ctx1, src, &ctx0, len, &stream)?;
                }
                record(&end, &stream)?;
            }
            let ms = f64::from(event_elapsed_ms(&start, &end)?);
            Ok(5.0 * len as f64 / (ms * 1e-3) / 1e9)
        };
        let (a, b) = (
            DeviceBuffer::new(&ctx0, len)?,
            DeviceBuffer::new(&ctx1, len)?,
        );
        eprintln!(
            "cuMemAlloc → cuMemAlloc: {:.1} GB/s",
            gbps(b.ptr(), a.ptr())?
        );

        let (s0, s1) = (ctx0.default_stream(), ctx1.default_stream());
        let pa = s0.alloc_zeros::<u8>(len).call("cuMemAllocAsync")?;
        let pb = s1.alloc_zeros::<u8>(len).call("cuMemAllocAsync")?;
        s0.synchronize().call("cuStreamSynchronize")?;
        s1.synchronize().call("cuStreamSynchronize")?;
        let (pa_ptr, _ra) = cudarc::driver::DevicePtr::device_ptr(&pa, &s0);
        let (pb_ptr, _rb) = cudarc::driver::DevicePtr::device_ptr(&pb, &s1);
        eprintln!(
            "pool memory: {} {}",
            pointer_is_pool_memory(pa_ptr)?,
            pointer_is_pool_memory(pb_ptr)?
        );
        // Revoke first, so the "before" figure holds even if another test granted access already.
        for (ptr, peer) in [(pa_ptr, 1), (pb_ptr, 0)] {
            if let Some(pool) = pointer_pool(ptr)? {
                set_pool_access(
                    pool,
                    peer,
                    sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE,
                )?;
            }
        }
        eprintln!(
            "pool → pool, no pool access: {:.1} GB/s",
            gbps(pb_ptr, pa_ptr)?
        );
        grant_pointer_pool_access(pa_ptr, 1)?;
        grant_pointer_pool_access(pb_ptr, 0)?;
        eprintln!(
            "pool → pool, pool access granted: {:.1} GB/s",
            gbps(pb_ptr, pa_ptr)?
        );
        stream_synchronize(&stream)?;
        Ok(())
    }

    #[test]
    fn memset_d32_fills_words_and_checks_alignment() -> Result<()> {
        if gpus(1, "memset_d32_fills_words_and_checks_alignment").is_none() {
            return Ok(());
        }
        let ctx = context(0)?;
        let stream = Stream::new(&ctx)?;
        let buffer = DeviceBuffer::zeroed(&ctx, 64)?;
        // SAFETY: words 4..12 lie inside the 64-byte buffer (16 words), which outlives the
        // synchronize below; nothing else touches it meanwhile.
        unsafe { memset_d32_async(buffer.ptr() + 16, 0xA1B2_C3D4, 8, &stream)? };
        // SAFETY: as above; the call is refused before anything is queued.
        let misaligned = unsafe { memset_d32_async(buffer.ptr() + 2, 1, 1, &stream) };
        assert!(matches!(misaligned, Err(Error::InvalidArgument(_))));
        stream_synchronize(&stream)?;
        let mut got = vec![0u8; 64];
        buffer.copy_to_host(&mut got)?;
        let words: Vec<u32> = got
            .chunks_exact(4)
            .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
            .collect();
        let want: Vec<u32> = (0..16)
            .map(|i| if (4..12).contains(&i) { 0xA1B2_C3D4 } else { 0 })
            .collect();
        assert_eq!(words, want);
        Ok(())
    }
}
