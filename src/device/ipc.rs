//! Device memory shared between processes, the legacy way: CUDA IPC handles
//! (`cuIpcGetMemHandle` in the exporting process, `cuIpcOpenMemHandle` in the importing one).
//!
//! A handle names a whole allocation made with `cuMemAlloc` (not the stream-ordered pool's
//! memory, not `cuMemCreate`'s: those need other handles); [`export_handle`] finds the
//! allocation an address lies in and says the address's offset in it, so that any address of
//! such memory can be passed. [`open_handle`] maps a peer's allocation into this process's
//! current context with peer access enabled lazily (the driver enables it when the GPUs
//! differ and can reach each other); the same handle may be opened once per context, so callers
//! keep what they opened ([`close_handle`] unmaps it).
//!
//! Invariant: a handle opened here is closed at most once, and only by its opener.

use super::{bind, DriverResultExt};
use crate::error::Result;
use cudarc::driver::{sys, CudaContext};

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
