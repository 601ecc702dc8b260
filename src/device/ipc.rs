//! Device memory shared between processes, two ways.
//!
//! **File descriptors** (the current way): memory made with `cuMemCreate`
//! ([`create_shareable`]), exported as a POSIX file descriptor ([`export_fd`]) that travels to a
//! peer process over a Unix-domain socket (`exec::fds`, `SCM_RIGHTS`), which maps it
//! ([`import_fd`]: import, reserve addresses, map, grant its device access). It needs the
//! driver's virtual memory management and descriptor handles ([`fd_sharing_supported`]), works
//! whatever allocator the rest of the process uses (PyTorch's `expandable_segments` makes
//! `cuMemCreate` memory, which legacy handles refuse), and needs no `pidfd_getfd` (and so no
//! `CAP_SYS_PTRACE`). A [`DeviceBuffer`](super::DeviceBuffer) made shareable registers its
//! descriptor here until freed, so that an exporter finds it by any address inside
//! ([`shareable_fd`]).
//!
//! **Legacy CUDA IPC handles** (the fallback): `cuIpcGetMemHandle` in the exporting process,
//! `cuIpcOpenMemHandle` in the importing one. A handle names a whole allocation made with
//! `cuMemAlloc` (not the stream-ordered pool's memory, not `cuMemCreate`'s); [`export_handle`]
//! finds the allocation an address lies in and says the address's offset in it, so that any
//! address of such memory can be passed. [`open_handle`] maps a peer's allocation into this
//! process's current context with peer access enabled lazily; the same handle may be opened once
//! per context, so callers keep what they opened ([`close_handle`] unmaps it).
//!
//! **Pinned host memory** crosses the same way: an anonymous file (`memfd_create`) mapped shared
//! in each process and registered with the driver there ([`create_shared_host`],
//! [`map_shared_host`]), its descriptor registered and passed like device memory's.
//!
//! Invariant: a mapping or handle opened here is closed at most once, and only by its opener; a
//! registered descriptor is closed before its memory is released.

use super::{bind, DriverResultExt};
use crate::error::Result;
use cudarc::driver::{sys, CudaContext};
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::Mutex;

/// A shareable allocation of this process, as [`shareable_fd`] finds it.
#[derive(Debug)]
pub struct Shareable {
    /// Its first address.
    pub base: u64,
    /// Its length in bytes.
    pub size: usize,
    /// A number no other allocation of this process has had: what peers key what they mapped by
    /// (a freed allocation's addresses may be given to a new one, its serial never).
    pub serial: u64,
    /// A duplicate of its descriptor, the caller's to send and close.
    pub fd: OwnedFd,
}

/// The shareable allocations of this process, by base address: their size, serial and a
/// descriptor exported for each (module doc).
static SHAREABLE: Mutex<BTreeMap<u64, (usize, u64, OwnedFd)>> = Mutex::new(BTreeMap::new());

/// The serial of the next allocation registered.
static NEXT_SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Registers `memory`'s descriptor (made now) so that [`shareable_fd`] finds it.
pub(crate) fn register_shareable(memory: &Mapped) -> Result<()> {
    register_fd(memory.base, memory.size, export_fd(memory)?);
    Ok(())
}

/// Registers `fd`, the descriptor of the `size` bytes of shareable memory at `base` (device
/// memory, or shared pinned host memory), so that [`shareable_fd`] finds it.
pub(crate) fn register_fd(base: u64, size: usize, fd: OwnedFd) {
    let serial = NEXT_SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut shareable = SHAREABLE.lock().unwrap_or_else(|p| p.into_inner());
    shareable.insert(base, (size, serial, fd));
}

/// Forgets (and closes) the descriptor registered for the allocation at `base`.
pub(crate) fn unregister_shareable(base: u64) {
    let mut shareable = SHAREABLE.lock().unwrap_or_else(|p| p.into_inner());
    shareable.remove(&base);
}

fn duplicate(fd: &OwnedFd) -> Result<OwnedFd> {
    fd.try_clone().map_err(|e| crate::error::Error::Resource {
        what: format!("cannot duplicate a memory descriptor: {e}"),
    })
}

/// The shareable allocation `addr` lies in, if any.
pub fn shareable_fd(addr: u64) -> Result<Option<Shareable>> {
    let shareable = SHAREABLE.lock().unwrap_or_else(|p| p.into_inner());
    let Some((&base, (size, serial, fd))) = shareable.range(..=addr).next_back() else {
        return Ok(None);
    };
    if addr >= base + *size as u64 {
        return Ok(None);
    }
    Ok(Some(Shareable {
        base,
        size: *size,
        serial: *serial,
        fd: duplicate(fd)?,
    }))
}

/// A duplicate of the descriptor of the live shareable allocation numbered `serial`, if any.
pub fn shareable_by_serial(serial: u64) -> Option<OwnedFd> {
    let shareable = SHAREABLE.lock().unwrap_or_else(|p| p.into_inner());
    shareable
        .values()
        .find(|(_, s, _)| *s == serial)
        .and_then(|(_, _, fd)| duplicate(fd).ok())
}

/// The IPC handle of the allocation `addr` lies in, and `addr`'s offset in it, for a peer
/// process to [`open_handle`]. Binds `ctx` (the context the memory belongs to).
pub fn export_handle(ctx: &CudaContext, addr: u64) -> Result<([u8; 64], u64)> {
    bind(ctx)?;
    let (mut base, mut size) = (0u64, 0usize);
    // SAFETY: the out-pointers are live locals; the driver only reads `addr`.
    unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, addr) }
        .result()
        .call("cuMemGetAddressRange")?;
    let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: `handle` is a live, writable handle; `base` is an allocation's base, just asked.
    unsafe { sys::cuIpcGetMemHandle(&mut handle, base) }
        .result()
        .call("cuIpcGetMemHandle")?;
    Ok((handle.reserved.map(|c| c as u8), addr - base))
}

/// Maps a peer process's allocation, named by `handle`, into `ctx` and returns its base address
/// there. Binds `ctx`.
pub fn open_handle(ctx: &CudaContext, handle: &[u8; 64]) -> Result<u64> {
    bind(ctx)?;
    let handle = sys::CUipcMemHandle {
        reserved: handle.map(|b| b as std::ffi::c_char),
    };
    let mut base = 0u64;
    // SAFETY: `base` is a live local; the handle is 64 bytes by value, the flag a valid one.
    unsafe {
        sys::cuIpcOpenMemHandle_v2(
            &mut base,
            handle,
            sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
        )
    }
    .result()
    .call("cuIpcOpenMemHandle")?;
    Ok(base)
}

/// Unmaps what [`open_handle`] mapped at `base` in `ctx`.
///
/// # Safety
/// `base` came from [`open_handle`] in `ctx`, is closed once, and nothing queued or to be
/// queued uses it any more.
pub unsafe fn close_handle(ctx: &CudaContext, base: u64) -> Result<()> {
    bind(ctx)?;
    // SAFETY: the caller's contract.
    unsafe { sys::cuIpcCloseMemHandle(base) }
        .result()
        .call("cuIpcCloseMemHandle")
}

/// Whether GPU `ordinal`'s driver makes memory with `cuMemCreate` that it exports as a POSIX file
/// descriptor (virtual memory management and the descriptor handle type both supported).
pub fn fd_sharing_supported(ordinal: usize) -> Result<bool> {
    let dev = super::cu_device(ordinal)?;
    let attribute = |attribute: sys::CUdevice_attribute| {
        // SAFETY: `dev` came from cuDeviceGet for a valid ordinal.
        unsafe { cudarc::driver::result::device::get_attribute(dev, attribute) }
            .call("cuDeviceGetAttribute")
    };
    use sys::CUdevice_attribute::*;
    Ok(
        attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED)? != 0
            && attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)? != 0,
    )
}

/// The allocation properties of shareable memory on `ordinal`: pinned device memory that can be
/// exported as a POSIX file descriptor.
fn shareable_properties(ordinal: usize) -> sys::CUmemAllocationProp {
    // SAFETY: the properties are plain data; all-zero is the documented default for the fields
    // not set below.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes =
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal as i32;
    prop
}

/// Memory mapped at `base`, `size` bytes (a multiple of the allocation granularity), backed by
/// a physical allocation this process holds a handle to: made by `create_shareable` (a shareable [`DeviceBuffer`](super::DeviceBuffer)) or
/// imported by [`import_fd`], undone by [`unmap`].
#[derive(Debug)]
pub struct Mapped {
    /// The mapping's first address, in every context of the process (unified addressing).
    pub base: u64,
    /// Its length in bytes.
    pub size: usize,
    handle: sys::CUmemGenericAllocationHandle,
}

/// Reserves `size` bytes of addresses, maps `handle` there and gives `ctx`'s device read and
/// write access. Takes `handle`: on failure everything done is undone and the handle released.
fn map(
    ctx: &CudaContext,
    handle: sys::CUmemGenericAllocationHandle,
    size: usize,
) -> Result<Mapped> {
    let mut base = 0u64;
    // SAFETY: `base` is a live local; no fixed address, default alignment and flags.
    let reserved = unsafe { sys::cuMemAddressReserve(&mut base, size, 0, 0, 0) }
        .result()
        .call("cuMemAddressReserve");
    if let Err(err) = reserved {
        // SAFETY: `handle` is ours and mapped nowhere.
        let _ = unsafe { sys::cuMemRelease(handle) };
        return Err(err);
    }
    // SAFETY: `base` is a fresh reservation of `size` bytes; `handle` backs `size` bytes.
    let mapped = unsafe { sys::cuMemMap(base, size, 0, handle, 0) }
        .result()
        .call("cuMemMap");
    let accessible = mapped.and_then(|()| {
        let access = sys::CUmemAccessDesc {
            location: shareable_properties(ctx.ordinal()).location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: `base..base + size` is mapped just above; one descriptor is passed.
        unsafe { sys::cuMemSetAccess(base, size, &access, 1) }
            .result()
            .call("cuMemSetAccess")
    });
    let memory = Mapped { base, size, handle };
    match accessible {
        Ok(()) => Ok(memory),
        Err(err) => {
            // SAFETY: ours, used by nothing yet.
            let _ = unsafe { unmap(ctx, memory) };
            Err(err)
        }
    }
}

/// Makes `len` bytes (rounded up to the granularity) of device memory on `ctx`'s GPU with
/// `cuMemCreate`, exportable as a POSIX file descriptor ([`export_fd`]), mapped for `ctx`'s
/// device. Binds `ctx`.
pub fn create_shareable(ctx: &CudaContext, len: usize) -> Result<Mapped> {
    bind(ctx)?;
    let prop = shareable_properties(ctx.ordinal());
    let mut granularity = 0usize;
    // SAFETY: `granularity` is a live local, `prop` a valid description.
    unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut granularity,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    }
    .result()
    .call("cuMemGetAllocationGranularity")?;
    let size = len.max(1).next_multiple_of(granularity.max(1));
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: `handle` is a live local, `prop` a valid description, no flags.
    unsafe { sys::cuMemCreate(&mut handle, size, &prop, 0) }
        .result()
        .call("cuMemCreate")?;
    map(ctx, handle, size)
}

/// A new POSIX file descriptor for `memory`'s physical allocation, for a peer process to
/// [`import_fd`] (passed over a Unix-domain socket). The caller owns it.
pub fn export_fd(memory: &Mapped) -> Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let mut fd: std::ffi::c_int = -1;
    // SAFETY: `fd` is a live int, where the driver writes the descriptor for this handle type;
    // `memory.handle` is a live handle made with that type requested.
    unsafe {
        sys::cuMemExportToShareableHandle(
            (&mut fd as *mut std::ffi::c_int).cast(),
            memory.handle,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    }
    .result()
    .call("cuMemExportToShareableHandle")?;
    // SAFETY: the driver opened `fd` for us.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Maps the allocation of `size` bytes that a peer exported as `fd` into `ctx` (its device given
/// read and write access). Binds `ctx`. The descriptor may be closed afterwards.
pub fn import_fd(ctx: &CudaContext, fd: &std::os::fd::OwnedFd, size: usize) -> Result<Mapped> {
    use std::os::fd::AsRawFd;
    bind(ctx)?;
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: `handle` is a live local; for this handle type the "OS handle" argument is the
    // descriptor's number itself, cast to a pointer, and `fd` is open.
    unsafe {
        sys::cuMemImportFromShareableHandle(
            &mut handle,
            fd.as_raw_fd() as isize as *mut std::ffi::c_void,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        )
    }
    .result()
    .call("cuMemImportFromShareableHandle")?;
    map(ctx, handle, size)
}

/// Unmaps `memory`, frees its addresses and releases this process's handle to the physical
/// allocation (freed once no process holds one). Binds `ctx`; every step is tried, the first
/// error returned.
///
/// # Safety
/// `memory` was mapped in `ctx`'s process and nothing queued or to be queued uses it any more.
pub unsafe fn unmap(ctx: &CudaContext, memory: Mapped) -> Result<()> {
    bind(ctx)?;
    let Mapped { base, size, handle } = memory;
    // SAFETY: the caller's contract; each undoes one step of `map`, in reverse.
    let unmapped = unsafe { sys::cuMemUnmap(base, size) }
        .result()
        .call("cuMemUnmap");
    // SAFETY: as above.
    let freed = unsafe { sys::cuMemAddressFree(base, size) }
        .result()
        .call("cuMemAddressFree");
    // SAFETY: as above.
    let released = unsafe { sys::cuMemRelease(handle) }
        .result()
        .call("cuMemRelease");
    unmapped.and(freed).and(released)
}

/// Host memory shared between processes and pinned for every context of each: `len` bytes of an
/// anonymous file (`memfd_create`, so nothing is named in `/dev/shm` and its size limit does not
/// apply), mapped shared here and registered with the driver (`cuMemHostRegister`, portable and
/// device-mapped). Returns the mapping's address — the same for the host and, through unified
/// addressing, the GPUs — and the file's descriptor, for peers to map ([`map_shared_host`]).
/// Its pages are reserved now (`posix_fallocate`), so a host without the room is an error here,
/// never a `SIGBUS` later.
pub fn create_shared_host(ctx: &CudaContext, len: usize) -> Result<(*mut u8, OwnedFd)> {
    use std::os::fd::FromRawFd;
    // SAFETY: a NUL-terminated name and valid flags; the descriptor returned is ours.
    let fd = unsafe { libc::memfd_create(c"ringreduce-pinned".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(os_error("memfd_create for shared pinned host memory"));
    }
    // SAFETY: just opened, owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor and a range from 0.
    let reserved = unsafe { libc::posix_fallocate(fd.as_raw_fd(), 0, len as libc::off_t) };
    if reserved != 0 {
        return Err(crate::error::Error::Resource {
            what: format!(
                "cannot reserve {len} bytes of host memory shared between processes: {}",
                std::io::Error::from_raw_os_error(reserved)
            ),
        });
    }
    let ptr = map_shared_host(ctx, &fd, len)?;
    Ok((ptr, fd))
}

/// Maps `len` bytes of the shared host memory `fd` names (made by [`create_shared_host`], here
/// or in a peer process) and registers them with the driver, pinned for every context and
/// mapped for the GPUs. Binds `ctx` (registration needs a current context). Undone by
/// [`unmap_shared_host`].
pub fn map_shared_host(ctx: &CudaContext, fd: &OwnedFd, len: usize) -> Result<*mut u8> {
    use std::os::fd::AsRawFd;
    bind(ctx)?;
    // SAFETY: a fresh shared mapping of an open descriptor at least `len` long; no fixed address.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(os_error("mmap of shared pinned host memory"));
    }
    // SAFETY: `ptr..ptr + len` is a fresh mapping of ours, unmapped below only if this fails.
    if let Err(err) = unsafe { register_host(ctx, ptr.cast(), len) } {
        // SAFETY: our mapping, used by nothing.
        unsafe { libc::munmap(ptr, len) };
        return Err(err);
    }
    Ok(ptr.cast())
}

/// Registers `len` bytes of host memory at `ptr` with the driver (binds `ctx`):
/// pinned for every context and mapped for the GPUs at the same address (unified addressing;
/// an error where the GPU would see it elsewhere, and nothing stays registered then). Undone by
/// `cuMemHostUnregister` ([`unregister_host`]).
///
/// # Safety
/// `ptr..ptr + len` is a live mapping of this process, page-aligned, that stays mapped until it
/// is unregistered.
pub(crate) unsafe fn register_host(ctx: &CudaContext, ptr: *mut u8, len: usize) -> Result<()> {
    bind(ctx)?;
    let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
    // SAFETY: the caller's contract.
    unsafe { sys::cuMemHostRegister_v2(ptr.cast(), len, flags) }
        .result()
        .call("cuMemHostRegister")?;
    let mut device = 0u64;
    // SAFETY: `device` is a live local; `ptr` was registered just above.
    let same = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, ptr.cast(), 0) }
        .result()
        .call("cuMemHostGetDevicePointer")
        .and_then(|()| match device == ptr as u64 {
            true => Ok(()),
            false => Err(crate::error::Error::Resource {
                what: "this GPU maps registered host memory at another address than the \
                       host's (no unified addressing for it): shared pinned memory is not \
                       supported here"
                    .into(),
            }),
        });
    if same.is_err() {
        // SAFETY: registered just above, used by nothing yet.
        unsafe {
            let _ = sys::cuMemHostUnregister(ptr.cast());
        }
    }
    same
}

/// Undoes [`register_host`] (binds `ctx`).
///
/// # Safety
/// `ptr` was registered by [`register_host`] in this process, and nothing queued or to be
/// queued uses it any more.
pub(crate) unsafe fn unregister_host(ctx: &CudaContext, ptr: *mut u8) -> Result<()> {
    bind(ctx)?;
    // SAFETY: the caller's contract.
    unsafe { sys::cuMemHostUnregister(ptr.cast()) }
        .result()
        .call("cuMemHostUnregister")
}

/// Unregisters and unmaps what [`map_shared_host`] mapped; binds `ctx`. When the driver will
/// not unregister it, the mapping is left in place (unmapping registered memory under the
/// driver's feet would be worse than the leak) and the error returned.
///
/// # Safety
/// `ptr` and `len` came from [`map_shared_host`] (or [`create_shared_host`]) in this process,
/// are undone once, and nothing queued or to be queued uses the memory any more.
pub unsafe fn unmap_shared_host(ctx: &CudaContext, ptr: *mut u8, len: usize) -> Result<()> {
    bind(ctx)?;
    // SAFETY: the caller's contract.
    unsafe { sys::cuMemHostUnregister(ptr.cast()) }
        .result()
        .call("cuMemHostUnregister")?;
    // SAFETY: as above.
    if unsafe { libc::munmap(ptr.cast(), len) } != 0 {
        return Err(os_error("munmap of shared pinned host memory"));
    }
    Ok(())
}

fn os_error(what: &str) -> crate::error::Error {
    crate::error::Error::Resource {
        what: format!("{what}: {}", std::io::Error::last_os_error()),
    }
}
