//! NCCL's memory calls: buffer and window registration, `ncclMemAlloc`/`ncclMemFree`, and the
//! device API (refused on ringreduce's communicators).

use crate::*;

/// `ncclCommRegister`: accepted, with nothing to do — this library stages every buffer
/// through memory it shares itself, so registration is a no-op handle.
#[no_mangle]
pub unsafe extern "C" fn ncclCommRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclCommRegister",
        fn(*mut c_void, *mut c_void, usize, *mut *mut c_void),
        |real| (real, buff, size, handle)
    );
    guarded(|| {
        // SAFETY: our caller's contract.
        unsafe { comm_ref(comm) }?;
        // SAFETY: null is refused; otherwise a writable pointer.
        let out = unsafe { handle.as_mut() }.ok_or_else(|| invalid("handle is null"))?;
        *out = Box::into_raw(Box::new(0u8)).cast();
        Ok(())
    })
}

/// `ncclCommDeregister`: releases a handle from `ncclCommRegister`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclCommDeregister",
        fn(*mut c_void, *mut c_void),
        |real| (real, handle)
    );
    guarded(|| {
        // SAFETY: our caller's contract.
        unsafe { comm_ref(comm) }?;
        if handle.is_null() {
            return Err(invalid("handle is null"));
        }
        // SAFETY: a handle from ncclCommRegister, released once (NCCL's contract).
        drop(unsafe { Box::from_raw(handle.cast::<u8>()) });
        Ok(())
    })
}

/// `ncclCommWindowRegister`: NCCL's collective registration (every rank registers its window
/// in the same turn) is ringreduce's (`RankCommunicator::register`): the allocation the window
/// lies in is exported to every peer once, and a later call whose every rank's buffers lie in
/// registered memory runs on them, without copies — unless a rank's input and output overlap
/// (NCCL's in-place forms, which run here as out-of-place calls): then it copies. Where ringreduce refuses the memory
/// (pool memory, `cuMemCreate` memory of another allocator) the window is still accepted, as a
/// handle that changes nothing (calls on it copy, as before), and `RINGREDUCE_NCCL_LOG=1` says
/// why; a registration that fails because the job failed returns the error. With
/// `NCCL_WIN_COLL_SYMMETRIC` the window is registered symmetric
/// (`RankCommunicator::register_symmetric`): where every rank's window lies at the same offset
/// into its allocation, a call on it is decided by each rank alone and returns once enqueued
/// (the call gate checks that every rank's buffers lie at the same offsets); otherwise, and
/// without the flag, a call on it that runs as a kernel (every collective across processes
/// whose GPUs reach each other) copies, as on unregistered memory, and returns once enqueued
/// too — whether a call runs on a window is decided without asking the peers.
#[no_mangle]
pub unsafe extern "C" fn ncclCommWindowRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    win: *mut *mut c_void,
    win_flags: c_int,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclCommWindowRegister",
        fn(*mut c_void, *mut c_void, usize, *mut *mut c_void, c_int),
        |real| (real, buff, size, win, win_flags)
    );
    guarded(|| {
        // SAFETY: our caller's contract.
        let c = unsafe { comm_ref(comm) }?;
        // SAFETY: null is refused; otherwise a writable pointer.
        let out = unsafe { win.as_mut() }.ok_or_else(|| invalid("win is null"))?;
        if buff.is_null() || size == 0 {
            return Err(invalid("the window is null or empty"));
        }
        // SAFETY: NCCL's contract: `size` bytes of device memory of the communicator's GPU
        // at `buff`, which registration only looks up and exports (it reads and writes none).
        let memory = unsafe { DeviceMemory::<u8>::new(buff as u64, size, c.device) };
        let symmetric = win_flags & NCCL_WIN_COLL_SYMMETRIC != 0;
        let registered = c.with(|rank| match symmetric {
            // SAFETY: NCCL's contract for windows: deregistered (every rank's
            // ncclCommWindowDeregister returned) before the memory is freed.
            false => Ok(unsafe { rank.register(&memory) }),
            // SAFETY: as above.
            true => Ok(unsafe { rank.register_symmetric(&memory) }),
        });
        let registration = match registered {
            Ok(Ok(registration)) => {
                fallback::log("ncclCommWindowRegister", "ringreduce (registered)");
                Some(registration)
            }
            Ok(Err(
                refused @ (ringreduce::Error::InvalidArgument(_)
                | ringreduce::Error::WrongDevice { .. }),
            )) => {
                fallback::log(
                    "ncclCommWindowRegister",
                    &format!("ringreduce (not registered, calls on it copy: {refused})"),
                );
                None
            }
            Ok(Err(failed)) => return Err(failed.into()),
            Err(failure) => return Err(failure),
        };
        *out = Box::into_raw(Box::new(Window(registration))).cast();
        remember_window(*out, comm, buff);
        Ok(())
    })
}

/// A window of `ncclCommWindowRegister`: the registration, or none where ringreduce refused
/// the memory.
pub(crate) struct Window(Option<ringreduce::Registration>);

/// The live windows of ringreduce's communicators: (window, its communicator, the pointer it was
/// registered at) — what `ncclWinGetUserPtr` answers, and how a call that names only a window
/// (the device API's pointer calls) tells a window of ringreduce's from one of NCCL's.
static WINDOWS: Mutex<Vec<(usize, usize, usize)>> = Mutex::new(Vec::new());

fn remember_window(win: *mut c_void, comm: ncclComm_t, buff: *mut c_void) {
    let mut windows = WINDOWS.lock().unwrap_or_else(|p| p.into_inner());
    windows.push((win as usize, comm as usize, buff as usize));
}

fn forget_window(win: *mut c_void) {
    let mut windows = WINDOWS.lock().unwrap_or_else(|p| p.into_inner());
    windows.retain(|&(w, _, _)| w != win as usize);
}

/// A live window of one of ringreduce's communicators: its communicator and the pointer it was
/// registered at; `None` for any other pointer (null, a window of NCCL's, a freed one).
pub(crate) fn window_of_ours(win: *mut c_void) -> Option<(ncclComm_t, *mut c_void)> {
    let windows = WINDOWS.lock().unwrap_or_else(|p| p.into_inner());
    windows
        .iter()
        .find(|&&(w, _, _)| w == win as usize && !win.is_null())
        .map(|&(_, comm, buff)| (comm as ncclComm_t, buff as *mut c_void))
}

/// `ncclCommWindowDeregister`: collective, as in NCCL — undoes the window's registration on
/// every rank (each unmaps its peers' memory of it), after which its memory may be freed.
#[no_mangle]
pub unsafe extern "C" fn ncclCommWindowDeregister(
    comm: ncclComm_t,
    win: *mut c_void,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclCommWindowDeregister",
        fn(*mut c_void, *mut c_void),
        |real| (real, win)
    );
    guarded(|| {
        // SAFETY: our caller's contract.
        let c = unsafe { comm_ref(comm) }?;
        if win.is_null() {
            return Err(invalid("win is null"));
        }
        forget_window(win);
        // SAFETY: a window from ncclCommWindowRegister, released once (NCCL's contract).
        let window = unsafe { Box::from_raw(win.cast::<Window>()) };
        match window.0 {
            Some(registration) => c.with(|rank| Ok(rank.deregister(registration)?)),
            None => Ok(()),
        }
    })
}

/// Not NCCL's: what `comm`'s latest call ran ([`ringreduce::RankCommunicator::last_ran`]: its
/// algorithm and form, and whether it ran on registered memory — its windows — without copies)
/// — for a Rust program or test that wants to know what ran; `None` before the first call, for
/// a communicator of the real NCCL or one that was aborted.
///
/// # Safety
/// `comm` is null or a handle from `ncclCommInitRank*` not yet destroyed.
pub unsafe fn last_ran(comm: ncclComm_t) -> Option<ringreduce::Ran> {
    // SAFETY: our caller's contract.
    let c = unsafe { comm_ref(comm) }.ok()?;
    c.with(|rank| Ok(rank.last_ran())).ok().flatten()
}

/// `ncclDevCommCreate`: NCCL's device API (kernels of the caller's that call NCCL on the GPU)
/// runs on NCCL's communicators only; on ringreduce's it is refused by name.
#[no_mangle]
pub unsafe extern "C" fn ncclDevCommCreate(
    comm: ncclComm_t,
    reqs: *const c_void,
    out_dev_comm: *mut c_void,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclDevCommCreate",
        fn(*mut c_void, *const c_void, *mut c_void),
        |real| (real, reqs, out_dev_comm)
    );
    guarded(|| {
        // SAFETY: our caller's contract.
        unsafe { comm_ref(comm) }?;
        Err(unsupported(
            "NCCL's device API (ncclDevCommCreate) does not run on a ringreduce communicator",
        ))
    })
}

/// `ncclDevCommDestroy`: as [`ncclDevCommCreate`].
#[no_mangle]
pub unsafe extern "C" fn ncclDevCommDestroy(
    comm: ncclComm_t,
    dev_comm: *const c_void,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclDevCommDestroy",
        fn(*mut c_void, *const c_void),
        |real| (real, dev_comm)
    );
    guarded(|| {
        // SAFETY: our caller's contract.
        unsafe { comm_ref(comm) }?;
        Err(unsupported(
            "NCCL's device API (ncclDevCommDestroy) does not run on a ringreduce communicator",
        ))
    })
}

/// `ncclMemAlloc`: device memory of the calling thread's current GPU (`cuMemAlloc`, which the
/// library shares with its peers by copying through its own memory).
#[no_mangle]
pub unsafe extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
    guarded(|| {
        // SAFETY: null is refused; otherwise a writable pointer.
        let out = unsafe { ptr.as_mut() }.ok_or_else(|| invalid("ptr is null"))?;
        let device = ringreduce::device::current_device()?;
        let ctx = ringreduce::device::context(device)?;
        let buffer = ringreduce::device::DeviceBuffer::new(&ctx, size.max(1))?;
        *out = buffer.ptr() as *mut c_void;
        ALLOCATIONS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(buffer);
        Ok(())
    })
}

/// `ncclMemFree`: frees what `ncclMemAlloc` gave.
#[no_mangle]
pub unsafe extern "C" fn ncclMemFree(ptr: *mut c_void) -> ncclResult_t {
    guarded(|| {
        let mut allocations = ALLOCATIONS.lock().unwrap_or_else(|p| p.into_inner());
        let at = allocations
            .iter()
            .position(|b| b.ptr() == ptr as u64)
            .ok_or_else(|| invalid("the pointer was not allocated by ncclMemAlloc"))?;
        allocations.swap_remove(at).free()?;
        Ok(())
    })
}

/// What `ncclMemAlloc` gave and `ncclMemFree` has not taken back.
pub(crate) static ALLOCATIONS: Mutex<Vec<ringreduce::device::DeviceBuffer>> =
    Mutex::new(Vec::new());
