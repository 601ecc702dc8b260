//! NCCL's symmetric memory: one buffer per rank from `ncclMemAlloc`, registered with every rank's
//! communicator as a window with `NCCL_WIN_COLL_SYMMETRIC` (NCCL ≥ 2.27), which lets NCCL run its
//! symmetric kernels on it (nccl-tests' `-R 2`).
//!
//! The C API (NCCL's `nccl.h`): `ncclMemAlloc(void** ptr, size_t size)`, `ncclMemFree(void* ptr)`,
//! `ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
//! int winFlags)`, `ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win)`. Registration
//! is collective over the communicator's ranks; with every rank's communicator in this thread
//! (`ncclCommInitAll`), each registration and each deregistration is one group over all ranks.
//! An older libnccl lacks the window calls (or `ncclMemAlloc`): calling one is [`Error::NoGpu`]
//! naming the call and NCCL's version.
//!
//! Invariant: while a [`SymmetricBuffers`] lives, rank r's memory is registered with rank r's
//! communicator at offset 0 on every rank (symmetric); it is deregistered (one group) before it
//! is freed, in `free` or, with errors dropped, in `Drop`.

use super::{cuda_error, NcclAllReduce};
use ringreduce::device;
use ringreduce::exec::nccl::ncclWindow_t;
use ringreduce::{Element, Error, GpuViewMut, Result};
use std::ffi::c_void;
use std::marker::PhantomData;

/// `NCCL_WIN_COLL_SYMMETRIC` from NCCL's `nccl.h`: every rank passes the same offset into its
/// window to a collective.
pub const NCCL_WIN_COLL_SYMMETRIC: std::ffi::c_int = 0x01;

/// One `ncclMemAlloc` buffer per rank of `count` elements of `T`, registered as symmetric windows
/// with the communicators of the [`NcclAllReduce`] it borrows.
pub struct SymmetricBuffers<'a, T: Element> {
    nccl: &'a NcclAllReduce,
    /// Device addresses by rank; empty after `release`.
    ptrs: Vec<u64>,
    /// Windows by rank (null where registration did not happen).
    windows: Vec<ncclWindow_t>,
    count: usize,
    _elements: PhantomData<T>,
}

impl NcclAllReduce {
    /// `count` elements of `T` per rank in NCCL's symmetric memory (see the module doc).
    /// [`Error::NoGpu`] when this libnccl lacks `ncclMemAlloc` or the window calls (NCCL < 2.27),
    /// [`Error::Nccl`] when NCCL refuses.
    pub fn symmetric_buffers<T: Element>(
        &self,
        count: usize,
    ) -> Result<SymmetricBuffers<'_, T>, Error> {
        let bytes =
            count
                .max(1)
                .checked_mul(std::mem::size_of::<T>())
                .ok_or(Error::SizeOverflow {
                    count,
                    dtype: T::DTYPE,
                })?;
        let mut bufs = SymmetricBuffers {
            nccl: self,
            ptrs: Vec::with_capacity(self.devices.len()),
            windows: vec![std::ptr::null_mut(); self.devices.len()],
            count,
            _elements: PhantomData,
        };
        for &d in &self.devices {
            bind(d)?;
            let mut ptr: *mut c_void = std::ptr::null_mut();
            // SAFETY: `ptr` is a live out-parameter; ncclMemAlloc allocates `bytes` on the current
            // device (GPU d: its primary context is bound on this thread just above).
            unsafe { self.api.mem_alloc(&mut ptr, bytes) }.map_err(needs_2_27(self))?;
            bufs.ptrs.push(ptr as u64);
        }
        self.api.group_start()?;
        let mut registered = Ok(());
        for (rank, &comm) in self.comms.iter().enumerate() {
            let ptr = bufs.ptrs[rank] as *mut c_void;
            let win: *mut ncclWindow_t = &mut bufs.windows[rank];
            // SAFETY: `comm` is rank's live communicator, `ptr` rank's `bytes` from ncclMemAlloc on
            // the same GPU, and `win` a live out-parameter filled by the group's end; every rank
            // registers in this one group (the call is collective).
            let call = unsafe {
                self.api
                    .comm_window_register(comm, ptr, bytes, win, NCCL_WIN_COLL_SYMMETRIC)
            };
            if let Err(e) = call {
                registered = Err(needs_2_27(self)(e));
                break;
            }
        }
        let ended = self.api.group_end();
        registered?;
        ended?;
        Ok(bufs)
    }
}

impl<T: Element> SymmetricBuffers<'_, T> {
    /// Elements per rank.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Number of ranks (0 once freed).
    pub fn ranks(&self) -> usize {
        self.ptrs.len()
    }

    /// The first `count` elements of every rank's buffer, as collective buffers.
    pub fn views_mut(&mut self, count: usize) -> Result<Vec<GpuViewMut<'_, T>>> {
        if count > self.count {
            return Err(Error::InvalidArgument(format!(
                "{count} elements of a symmetric buffer of {}",
                self.count
            )));
        }
        Ok(self
            .ptrs
            .iter()
            .zip(&self.nccl.devices)
            // SAFETY: rank r's pointer is `self.count` elements of T on GPU devices[r] from
            // ncclMemAlloc (aligned beyond any T), alive while `self` is, and borrowed mutably
            // with `self` for the views' lifetime, so nothing else here uses it meanwhile.
            .map(|(&p, &d)| unsafe { GpuViewMut::from_raw(p, d, count) })
            .collect())
    }

    /// Overwrites rank `rank`'s first `data.len()` elements with `data` (waits for the copy).
    pub fn write(&mut self, rank: usize, data: &[T]) -> Result<()> {
        let ptr = self.checked(rank, data.len())?;
        bind(self.nccl.devices[rank])?;
        // SAFETY: `ptr` holds at least `data.len()` elements of T (checked), on the bound GPU; the
        // copy is synchronous, and `&mut self` keeps collectives off the buffer meanwhile.
        unsafe { cudarc::driver::result::memcpy_htod_sync(ptr, data) }
            .map_err(cuda_error("cuMemcpyHtoD"))
    }

    /// Rank `rank`'s first `count` elements (waits for the copy).
    pub fn read(&self, rank: usize, count: usize) -> Result<Vec<T>> {
        let ptr = self.checked(rank, count)?;
        bind(self.nccl.devices[rank])?;
        let mut out = vec![T::zeroed(); count];
        // SAFETY: as in `write`, reading into a host vector of `count` elements.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut out, ptr) }
            .map_err(cuda_error("cuMemcpyDtoH"))?;
        Ok(out)
    }

    fn checked(&self, rank: usize, count: usize) -> Result<u64> {
        match self.ptrs.get(rank) {
            Some(&p) if count <= self.count => Ok(p),
            _ => Err(Error::InvalidArgument(format!(
                "rank {rank}, {count} elements: the symmetric buffers have {} ranks of {}",
                self.ptrs.len(),
                self.count
            ))),
        }
    }

    /// Deregisters (one group) and frees; returns the first error. `Drop` does the same and
    /// drops it. The caller has waited for every collective on the buffers.
    pub fn free(mut self) -> Result<(), Error> {
        self.release()
    }

    fn release(&mut self) -> Result<(), Error> {
        let ptrs = std::mem::take(&mut self.ptrs);
        if ptrs.is_empty() {
            return Ok(());
        }
        let mut first = self.nccl.synchronize().err();
        let api = self.nccl.api;
        if let Err(e) = api.group_start() {
            first.get_or_insert(e);
        }
        for (&comm, &win) in self.nccl.comms.iter().zip(&self.windows) {
            if win.is_null() {
                continue;
            }
            // SAFETY: `win` was registered with `comm` by `symmetric_buffers` and is deregistered
            // once: `self.ptrs` is emptied above, so `release` does nothing the second time.
            if let Err(e) = unsafe { api.comm_window_deregister(comm, win) } {
                first.get_or_insert(e);
            }
        }
        if let Err(e) = api.group_end() {
            first.get_or_insert(e);
        }
        for p in ptrs {
            // SAFETY: `p` came from ncclMemAlloc, its window is deregistered above, and it is
            // freed once (the list was taken).
            if let Err(e) = unsafe { api.mem_free(p as *mut c_void) } {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl<T: Element> Drop for SymmetricBuffers<'_, T> {
    fn drop(&mut self) {
        // `free` returns these errors; `Drop` drops them.
        let _ = self.release();
    }
}

/// A function this libnccl lacks (an [`Error::Nccl`] of code −1, `Api::is_missing`) as
/// [`Error::NoGpu`], named with NCCL's version and what the symmetric calls need; NCCL's own
/// errors unchanged.
fn needs_2_27(nccl: &NcclAllReduce) -> impl FnOnce(Error) -> Error + '_ {
    move |err| match err {
        Error::Nccl {
            code: -1, message, ..
        } => Error::NoGpu {
            reason: format!(
                "NCCL {}: {message}; symmetric registration needs NCCL >= 2.27",
                nccl.version()
            ),
        },
        other => other,
    }
}

/// Binds GPU `device`'s primary context on this thread (for the copies).
fn bind(device: usize) -> Result<()> {
    device::context(device)?
        .bind_to_thread()
        .map_err(cuda_error("cuCtxSetCurrent"))
}
