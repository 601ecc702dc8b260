//! Peer access and the pointer queries that go with it: whether one device can map another's
//! memory ([`can_access_peer`], [`peer_matrix`], [`p2p_attributes`]), switching it on per direction
//! ([`enable_peer_access`]), granting peers access to stream-ordered pools
//! ([`grant_pool_access`], [`grant_pointer_pool_access`]), and asking the driver which device and
//! which pool an address belongs to ([`pointer_device`], [`pointer_is_pool_memory`]).
//!
//! The idea is the CUDA driver's peer model (facts 3 to 5 of the [device layer's doc](super)):
//! access is asked at run time, per direction, and enabled explicitly; memory from a pool has its
//! own access list. Without either, peer copies still succeed — staged through host memory, ten
//! times slower. The invariant: every function here answers per *direction* (`from` reaches `to`),
//! never assuming symmetry, and "already enabled" or "already granted" is success.

use super::context::same_context;
use super::{bind, check, cu_device, device_count, driver_available, guard, DriverResultExt};
use crate::error::{Error, Result};
use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;
use cudarc::driver::CudaContext;

use std::ffi::{c_int, c_uint, c_void};

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
/// This covers `cuMemAlloc` memory only — pool memory needs [`grant_pool_access`] (the pool trap,
/// in the [device layer's doc](super)).
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
/// error: the silent fallback that the executor's edge probe (`exec::cuda::probe`) exists to
/// catch. For tests and teaching.
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
/// out of pool buffers take the 37.6 GB/s staged path even with peer access enabled (the pool
/// trap, in the [device layer's doc](super)).
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
    // Changing a pool's mappings may wait for the GPUs (module `gate`).
    let _quiet = super::gate::quiet();
    guard("cuMemPoolSetAccess", || {
        set_pool_access(pool, peer_device, READ_WRITE)
    })?;
    Ok(true)
}

const READ_WRITE: sys::CUmemAccess_flags =
    sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

/// `cuMemPoolSetAccess(pool, {device peer_device, flags})`. `pool` must be a live pool handle from
/// the driver; every caller passes one it just obtained from the driver.
pub(super) fn set_pool_access(
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

/// The device allocation `ptr` lies in, as the driver knows it: its base and size
/// (`cuMemGetAddressRange`) and its id (`CU_POINTER_ATTRIBUTE_BUFFER_ID`, unique over the
/// process's life: memory freed and allocated again at the same address gets a new one). `None`
/// for addresses the driver does not know as device memory.
pub fn pointer_allocation(ptr: u64) -> Result<Option<Allocation>> {
    if pointer_device(ptr)?.is_none() {
        return Ok(None);
    }
    guard("cuMemGetAddressRange", || {
        // SAFETY: the driver writes CU_POINTER_ATTRIBUTE_BUFFER_ID as an unsigned 64-bit word.
        let Some(id) = (unsafe {
            pointer_attribute::<u64>(
                ptr,
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
                0,
            )
        })?
        else {
            return Ok(None);
        };
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: the out-pointers are live locals; the driver only looks `ptr` up.
        unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) }
            .result()
            .map_err(check("cuMemGetAddressRange"))?;
        Ok(Some(Allocation { base, size, id }))
    })
}

/// Whether the allocation `ptr` lies in can be shared by a legacy CUDA IPC handle
/// (`CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE`): `cuMemAlloc` memory can, memory from a
/// stream-ordered pool or mapped by `cuMemCreate` (PyTorch's `expandable_segments`, for one)
/// cannot. `false` for addresses the driver does not know.
pub fn pointer_ipc_capable(ptr: u64) -> Result<bool> {
    driver_available()?;
    guard("cuPointerGetAttribute", || {
        // SAFETY: the driver writes this attribute as a C int (a boolean).
        let capable = unsafe {
            pointer_attribute::<c_int>(
                ptr,
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                0,
            )
        }?;
        Ok(capable.is_some_and(|c| c != 0))
    })
}

/// A device allocation ([`pointer_allocation`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// Its first address.
    pub base: u64,
    /// Its length in bytes.
    pub size: usize,
    /// The driver's id of it, unique over the process's life.
    pub id: u64,
}

/// The pool `ptr`'s memory came from, or `None` outside pools.
pub(super) fn pointer_pool(ptr: u64) -> Result<Option<sys::CUmemoryPool>> {
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
