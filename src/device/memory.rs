//! Memory outside the pools, and the copies and fills that move bytes through it:
//! [`DeviceBuffer`] (plain `cuMemAlloc`), [`PinnedHost`] (portable page-locked host memory), and
//! the enqueue functions [`memcpy_peer_async`], [`memcpy_async`] and [`memset_d32_async`].
//!
//! The ring's own memory comes from `cuMemAlloc`, not a stream-ordered pool, because peer access
//! enabled on contexts covers only such memory (the pool trap, fact 5 of the
//! [device layer's doc](super)); pinned host memory is what staged edges copy through. The
//! invariant: an allocation is freed exactly once (`free` or `Drop`, whichever comes first), and
//! the enqueue functions are `unsafe` because only their callers can promise the memory outlives
//! the queued work — their `# Safety` sections say exactly what.

use super::context::same_context;
use super::ipc;
use super::{bind, guard, teardown_in_drop, DriverResultExt, Stream};
use crate::error::{Error, Result};
use cudarc::driver::result;
use cudarc::driver::sys;
use cudarc::driver::CudaContext;

use std::ffi::c_uint;
use std::sync::Arc;

/// Device memory from plain `cuMemAlloc` in one context — outside every stream-ordered pool, so
/// peer access enabled with [`enable_peer_access`](super::enable_peer_access) applies to it (the
/// pool trap, in the [device layer's doc](super)). Uninitialized when made with
/// [`DeviceBuffer::new`].
#[derive(Debug)]
pub struct DeviceBuffer {
    /// 0 only after the memory was freed.
    ptr: sys::CUdeviceptr,
    len_bytes: usize,
    ctx: Arc<CudaContext>,
    /// The mapping of memory made shareable with `cuMemCreate` ([`DeviceBuffer::shareable`]);
    /// `None` for `cuMemAlloc` memory.
    mapped: Option<ipc::Mapped>,
}

impl DeviceBuffer {
    /// Allocates `len_bytes` (> 0) on `ctx`'s device with `cuMemAlloc`; binds `ctx`.
    pub fn new(ctx: &Arc<CudaContext>, len_bytes: usize) -> Result<Self> {
        if len_bytes == 0 {
            return Err(Error::InvalidArgument(
                "a device buffer needs at least one byte".to_string(),
            ));
        }
        let _quiet = super::gate::quiet();
        bind(ctx)?;
        // SAFETY: `ctx` is current, so the memory lands on its device; the memory is uninitialized,
        // which is fine for device bytes we only ever copy, never read as typed host values.
        let ptr = unsafe { result::malloc_sync(len_bytes) }.call("cuMemAlloc")?;
        Ok(Self {
            ptr,
            len_bytes,
            ctx: Arc::clone(ctx),
            mapped: None,
        })
    }

    /// Allocates `len_bytes` (> 0) on `ctx`'s device with `cuMemCreate`, shareable with other
    /// processes as a POSIX file descriptor (the IPC module's registry (`ipc.rs`) holds one
    /// until the buffer is freed: [`super::shareable_fd`]). Only `ctx`'s device has access:
    /// for memory that processes share, each maps it for its own device. Binds `ctx`.
    pub fn shareable(ctx: &Arc<CudaContext>, len_bytes: usize) -> Result<Self> {
        if len_bytes == 0 {
            return Err(Error::InvalidArgument(
                "a device buffer needs at least one byte".to_string(),
            ));
        }
        let _quiet = super::gate::quiet();
        let mapped = ipc::create_shareable(ctx, len_bytes)?;
        if let Err(err) = ipc::register_shareable(&mapped) {
            // SAFETY: just mapped, used by nothing.
            let _ = unsafe { ipc::unmap(ctx, mapped) };
            return Err(err);
        }
        Ok(Self {
            ptr: mapped.base,
            len_bytes,
            ctx: Arc::clone(ctx),
            mapped: Some(mapped),
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
        let _quiet = super::gate::quiet();
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
        let _quiet = super::gate::quiet();
        bind(&self.ctx)?;
        result::ctx::synchronize().call("cuCtxSynchronize")?;
        // SAFETY: `self.ptr` is a live allocation of len_bytes == dst.len() bytes; `dst` is an
        // exclusive, live slice, and a device-to-pageable-host copy is complete when it returns.
        unsafe { result::memcpy_dtoh_sync(dst, self.ptr) }.call("cuMemcpyDtoH")
    }

    /// Sets every byte to 0 (`cuMemsetD8`), synchronous with respect to the context like
    /// [`copy_from_host`](Self::copy_from_host).
    pub fn fill_zero(&mut self) -> Result<()> {
        let _quiet = super::gate::quiet();
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
        let _quiet = super::gate::quiet();
        if let Some(mapped) = self.mapped.take() {
            // The descriptor first: the physical memory is freed once no handle or descriptor
            // refers to it.
            ipc::unregister_shareable(ptr);
            // SAFETY: mapped by `shareable` in `self.ctx`, unmapped once (taken above); queued
            // work that still uses it is excluded as below.
            return unsafe { ipc::unmap(&self.ctx, mapped) };
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
/// context (see the [device layer's doc](super)).
#[derive(Debug)]
pub struct PinnedHost {
    /// Null only after the memory was freed.
    ptr: *mut u8,
    len_bytes: usize,
    ctx: Arc<CudaContext>,
    /// Memory shared with other processes ([`PinnedHost::shareable`]): mapped from an anonymous
    /// file and registered, not `cuMemHostAlloc`'s.
    shared: bool,
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
    /// Allocates `len_bytes` (> 0) of portable pinned host memory in `ctx`, zeroed, on the NUMA
    /// node of `ctx`'s GPU where the host says which (`numa.rs`); binds `ctx`.
    /// The memory lives as long as this value (which holds `ctx` alive: destroying the allocating
    /// context would free it).
    pub fn new(ctx: &Arc<CudaContext>, len_bytes: usize) -> Result<Self> {
        if len_bytes == 0 {
            return Err(Error::InvalidArgument(
                "a pinned host buffer needs at least one byte".to_string(),
            ));
        }
        let _quiet = super::gate::quiet();
        bind(ctx)?;
        // The pages on the GPU's NUMA node (`numa.rs`).
        let _near = super::numa_memory::prefer_node(super::numa_memory::gpu_node(ctx.ordinal()));
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
            shared: false,
        })
    }

    /// Allocates `len_bytes` (> 0) of pinned host memory that other processes can map: an
    /// anonymous file, zeroed, registered with the driver for every context
    /// (`create_shared_host` in `ipc.rs`), whose descriptor the IPC module's registry (`ipc.rs`)
    /// holds until the memory is freed ([`super::shareable_fd`]). Binds `ctx`.
    pub fn shareable(ctx: &Arc<CudaContext>, len_bytes: usize) -> Result<Self> {
        if len_bytes == 0 {
            return Err(Error::InvalidArgument(
                "a pinned host buffer needs at least one byte".to_string(),
            ));
        }
        let _quiet = super::gate::quiet();
        bind(ctx)?;
        // The pages (reserved by `posix_fallocate` there) on the GPU's NUMA node (`numa.rs`).
        let near = super::numa_memory::prefer_node(super::numa_memory::gpu_node(ctx.ordinal()));
        let (ptr, fd) = ipc::create_shared_host(ctx, len_bytes)?;
        drop(near);
        ipc::register_fd(ptr as u64, len_bytes, fd);
        Ok(Self {
            ptr,
            len_bytes,
            ctx: Arc::clone(ctx),
            shared: true,
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
        let _quiet = super::gate::quiet();
        bind(&self.ctx)?;
        if self.shared {
            ipc::unregister_shareable(ptr as u64);
            // SAFETY: mapped by `shareable` in this process, undone once (`ptr` swapped for null
            // above); queued work that still uses it is excluded as below.
            return unsafe { ipc::unmap_shared_host(&self.ctx, ptr, self.len_bytes) };
        }
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
// Asynchronous copies.
// ---------------------------------------------------------------------------------------------

/// Queues a copy of `bytes` bytes from `src_ptr` (memory of `src_ctx`) to `dst_ptr` (memory of
/// `dst_ctx`) on `stream` (`cuMemcpyPeerAsync`); binds the stream's context. Returns once queued.
///
/// Runs over the direct link only when peer access is enabled and the memory is outside pools or
/// granted ([device layer's doc](super)); otherwise it still succeeds, staged through the host at
/// ~38 GB/s.
/// Push (the copy on the sender's stream) measured 15–30% faster than pull on the test machine.
/// `stream` must belong to `src_ctx` or `dst_ctx` ([`Error::InvalidArgument`]); `bytes == 0` queues
/// nothing.
///
/// # Safety
///
/// - `[src_ptr, src_ptr + bytes)` is device memory allocated in `src_ctx`, and
///   `[dst_ptr, dst_ptr + bytes)` is device memory allocated in `dst_ctx`; the two do not overlap.
/// - Both allocations stay allocated until the copy has completed on `stream` — observed through an
///   event recorded on `stream` after this call, or
///   [`stream_synchronize`](super::stream_synchronize). Dropping a [`DeviceBuffer`] earlier is a
///   use after free on the GPU.
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
    if !same_context(stream.context(), src_ctx) && !same_context(stream.context(), dst_ctx) {
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
    bind(stream.context())?;
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
            stream.raw(),
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
///   after it, or [`stream_synchronize`](super::stream_synchronize)).
/// - Until then nothing else writes the source or reads or writes the destination. For host memory
///   this includes the host: no `&`/`&mut` to the destination bytes, and no `&mut` to the source
///   bytes, may be used before completion.
pub unsafe fn memcpy_async(dst: u64, src: u64, bytes: usize, stream: &Stream) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    bind(stream.context())?;
    // SAFETY: the ranges, their lifetimes and exclusive use are the caller's contract above; the
    // stream is live and its context is bound.
    unsafe { sys::cuMemcpyAsync(dst, src, bytes, stream.raw()) }
        .result()
        .call("cuMemcpyAsync")
}

/// [`memcpy_async`] on the caller's `stream`: `bytes` bytes from `src` to `dst`, in the stream's
/// order, from its context.
///
/// # Safety
/// As for [`memcpy_async`]; `stream` is live.
pub unsafe fn memcpy_on(
    dst: u64,
    src: u64,
    bytes: usize,
    stream: &super::CallerStream,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    let saved = super::save_current()?;
    // SAFETY: the stream's own context, current only for the copy, then restored.
    let copied = unsafe { sys::cuCtxPushCurrent_v2(stream.context()) }
        .result()
        .call("cuCtxPushCurrent")
        .and_then(|()| {
            // SAFETY: the ranges, their lifetimes and exclusive use are the caller's contract;
            // the stream is live and its context is current.
            let r = unsafe { sys::cuMemcpyAsync(dst, src, bytes, stream.raw()) }
                .result()
                .call("cuMemcpyAsync");
            let mut popped: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: pops what was pushed just above.
            let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
            r
        });
    saved.restore()?;
    copied
}

/// `bytes` bytes of stream-ordered device memory on the caller's `stream` (`cuMemAllocAsync`,
/// from the device's default pool): usable by work queued on the stream after this call until
/// [`free_async`] on it — scratch memory for one enqueued call, capturable into a CUDA graph.
/// `ctx` is the stream's context.
///
/// # Safety
/// `stream` is live and belongs to `ctx`.
pub unsafe fn alloc_async(
    ctx: &Arc<CudaContext>,
    bytes: usize,
    stream: &super::CallerStream,
) -> Result<u64> {
    bind(ctx)?;
    // SAFETY: a live stream of the bound context (our caller's contract).
    unsafe { result::malloc_async(stream.raw(), bytes.max(1)) }.call("cuMemAllocAsync")
}

/// Gives back what [`alloc_async`] gave, once the work queued on `stream` before it is done.
///
/// # Safety
/// `ptr` came from [`alloc_async`] and was not freed; `stream` is live and belongs to `ctx`;
/// nothing queued after this call on any stream uses `ptr`.
pub unsafe fn free_async(
    ctx: &Arc<CudaContext>,
    ptr: u64,
    stream: &super::CallerStream,
) -> Result<()> {
    bind(ctx)?;
    // SAFETY: our caller's contract.
    unsafe { result::free_async(ptr, stream.raw()) }.call("cuMemFreeAsync")
}

// ---------------------------------------------------------------------------------------------
// Fills, for the diagnostic commands (`ringreduce p2p`, `sync`).
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
///   after it, or [`stream_synchronize`](super::stream_synchronize)).
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
    bind(stream.context())?;
    // SAFETY: the range, its alignment (also checked above), lifetime and exclusive use are the
    // caller's contract; the stream is live and its context is bound.
    unsafe { sys::cuMemsetD32Async(ptr, value as c_uint, count, stream.raw()) }
        .result()
        .call("cuMemsetD32Async")
}
