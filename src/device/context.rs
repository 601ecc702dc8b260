//! Contexts and what the driver says about each device: the primary context of a device
//! ([`context`]), binding a context to the calling thread ([`bind`]) and putting a caller's binding
//! back ([`SavedContext`]), [`DeviceInfo`] and [`memory_info`].
//!
//! The idea is the driver's own: a context owns a device's allocations, streams and events, and
//! driver calls act in whichever context is current on the calling thread (facts 1 and 2 of the
//! [device layer's doc](super)). The invariant every caller relies on: a function that acts in a
//! context makes it current first, through [`bind`], which never consumes an error cudarc stored
//! in the context.

use super::{cu_device, device_count, guard, DriverResultExt};
use crate::error::Result;
use cudarc::driver::result;
use cudarc::driver::sys;
use cudarc::driver::CudaContext;

use std::ffi::c_int;
use std::sync::Arc;

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
    /// The device's UUID (`cuDeviceGetUuid`): the same GPU has the same UUID in every process,
    /// whatever `CUDA_VISIBLE_DEVICES` makes its ordinal there. [`DeviceInfo::uuid_string`]
    /// prints it as `nvidia-smi -L` does.
    pub uuid: [u8; 16],
}

impl DeviceInfo {
    /// The UUID as `nvidia-smi -L` prints it: `GPU-` and five dash-separated groups of hex
    /// digits (8-4-4-4-12).
    pub fn uuid_string(&self) -> String {
        let hex: String = self.uuid.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "GPU-{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        )
    }
}

/// Every device the driver reports, in ordinal order. Creates no context.
pub fn devices() -> Result<Vec<DeviceInfo>> {
    let count = device_count()?;
    guard("device queries", || (0..count).map(device_info).collect())
}

/// What the driver says about device `index` (an ordinal below [`device_count`]). Creates no
/// context.
pub fn device_info(index: usize) -> Result<DeviceInfo> {
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
        uuid: result::device::get_uuid(dev)
            .call("cuDeviceGetUuid")?
            .bytes
            .map(|b| b as u8),
    })
}

/// The ordinal, in this process, of the GPU whose UUID is `uuid` ([`DeviceInfo::uuid`]); `None`
/// when no visible device has it (`CUDA_VISIBLE_DEVICES` may hide a GPU that another process
/// uses). Creates no context.
pub fn ordinal_of(uuid: &[u8; 16]) -> Result<Option<usize>> {
    let count = device_count()?;
    for index in 0..count {
        let dev = cu_device(index)?;
        let theirs = result::device::get_uuid(dev).call("cuDeviceGetUuid")?;
        if theirs.bytes.map(|b| b as u8) == *uuid {
            return Ok(Some(index));
        }
    }
    Ok(None)
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
pub(super) fn c_buf_to_string(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

// ---------------------------------------------------------------------------------------------
// Contexts.
// ---------------------------------------------------------------------------------------------

/// The primary context of `device`, retained (cudarc's `CudaContext::new`); it is bound to the
/// calling thread as a side effect. Checks [`driver_available`](super::driver_available) and the
/// index first, so it returns [`Error::NoGpu`](crate::Error::NoGpu) or
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) instead of panicking. Each call
/// retains the primary context once more; it is released when the last clone of the returned `Arc`
/// is dropped. Event tracking is left on: see the [device layer's doc](super).
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
/// recorded in the context (see the [device layer's doc](super)).
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

/// The device of the calling thread's current context (what `cudaGetDevice` answers after
/// `cudaSetDevice`), or 0 when the thread has none (the runtime's default device).
pub fn current_device() -> Result<usize> {
    super::driver_available()?;
    if result::ctx::get_current()
        .call("cuCtxGetCurrent")?
        .is_none()
    {
        return Ok(0);
    }
    let mut dev: sys::CUdevice = 0;
    // SAFETY: `dev` is a live local and a context is current on this thread.
    unsafe { sys::cuCtxGetDevice(&mut dev) }
        .result()
        .call("cuCtxGetDevice")?;
    Ok(dev as usize)
}

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

pub(super) fn same_context(a: &CudaContext, b: &CudaContext) -> bool {
    a.cu_ctx() == b.cu_ctx()
}
