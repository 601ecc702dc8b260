//! NCCL's communicator management calls of 2.28 and 2.29 beyond those of `init.rs` (NCCL's
//! "Communicator Creation and Management Functions"): revoking a communicator, growing one
//! (`ncclCommGetUniqueId`, `ncclCommGrow`), suspending and resuming its memory, its memory
//! statistics, a window's user pointer, and `ncclResetDebugInit`. PyTorch 2.15 (built against
//! NCCL 2.30) and cudarc's `nccl` module import them: the library exports them so that such a
//! program loads.
//!
//! On NCCL's communicators each call is NCCL's. On ringreduce's: a window's user pointer and the
//! memory statistics that are known (nothing to suspend, never suspended) are answered; revoke,
//! grow, suspend and resume are refused with `ncclInvalidUsage` and a message — never a silent
//! wrong result.

use crate::*;

/// `ncclCommRevoke` (NCCL 2.28): NCCL's on its communicators; on ringreduce's, refused — a
/// revoked communicator is quiesced for a shrink or split, which ringreduce's do not run either
/// (`ncclCommAbort` gives one up).
#[no_mangle]
pub unsafe extern "C" fn ncclCommRevoke(comm: ncclComm_t, revoke_flags: c_int) -> ncclResult_t {
    to_nccl!(comm, c"ncclCommRevoke", fn(*mut c_void, c_int), |real| (
        real,
        revoke_flags
    ));
    guarded(|| {
        // SAFETY: our caller's contract.
        unsafe { comm_ref(comm) }?;
        Err(unsupported(
            "ncclCommRevoke of a ringreduce communicator is not run by ringreduce-nccl \
             (ncclCommAbort gives it up; ncclCommShrink and ncclCommSplit are not run either)",
        ))
    })
}

/// `ncclCommGetUniqueId` (NCCL 2.29): the id new ranks join an `ncclCommGrow` with — NCCL's on
/// its communicators; refused on ringreduce's (not grown).
#[no_mangle]
pub unsafe extern "C" fn ncclCommGetUniqueId(
    comm: ncclComm_t,
    unique_id: *mut ncclUniqueId,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclCommGetUniqueId",
        fn(*mut c_void, *mut ncclUniqueId),
        |real| (real, unique_id)
    );
    guarded(|| {
        // SAFETY: our caller's contract.
        unsafe { comm_ref(comm) }?;
        Err(unsupported(GROW_REFUSED))
    })
}

const GROW_REFUSED: &str =
    "ncclCommGrow of a ringreduce communicator is not run by ringreduce-nccl yet";

/// `ncclCommGrow` (NCCL 2.29): a communicator of NCCL's grows in NCCL. A new rank passes no
/// communicator and the id the coordinator's `ncclCommGetUniqueId` made — NCCL's, since that call
/// is refused on ringreduce's communicators — so it joins through the real NCCL (refused without
/// one). On ringreduce's communicators it is refused, `newcomm` left null.
#[no_mangle]
pub unsafe extern "C" fn ncclCommGrow(
    comm: ncclComm_t,
    n_ranks: c_int,
    unique_id: *const ncclUniqueId,
    rank: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    // SAFETY: our caller's contract: a live handle, or null.
    let real_comm = unsafe { nccl_of(comm) };
    if real_comm.is_none() && !comm.is_null() {
        // SAFETY: our caller's contract.
        return unsafe { refuse_new(comm, newcomm, "ncclCommGrow") };
    }
    if newcomm.is_null() {
        return guarded(|| Err(invalid("newcomm is null")));
    }
    if real_comm.is_none() && fallback::Real::get().is_none() {
        return guarded(|| {
            Err(unsupported(
                "ncclCommGrow of a new rank (no communicator) joins a communicator of the real \
                 NCCL, and none was found (set RINGREDUCE_NCCL_PATH); ringreduce's communicators \
                 are not grown",
            ))
        });
    }
    type F = unsafe extern "C" fn(
        *mut c_void,
        c_int,
        *const ncclUniqueId,
        c_int,
        *mut *mut c_void,
        *mut ncclConfig_t,
    ) -> ncclResult_t;
    // SAFETY: NCCL's documented signature.
    let f = match unsafe { real::<F>(c"ncclCommGrow") } {
        Ok(f) => f,
        Err(code) => return code,
    };
    let mut made = std::ptr::null_mut();
    let parent = real_comm.unwrap_or(std::ptr::null_mut());
    // SAFETY: NCCL's own handle (or null, a new rank's); the caller's other arguments.
    match unsafe { f(parent, n_ranks, unique_id, rank, &mut made, config) } {
        ncclSuccess => {}
        code => return code,
    }
    // SAFETY: what NCCL just made; the caller's newcomm, checked non-null.
    unsafe { hand_out(made, newcomm) }
}

/// `ncclCommSuspend` (NCCL 2.29): NCCL's on its communicators; refused on ringreduce's, whose
/// memory (the workspace its peers map) stays while the communicator lives.
#[no_mangle]
pub unsafe extern "C" fn ncclCommSuspend(comm: ncclComm_t, flags: c_int) -> ncclResult_t {
    to_nccl!(comm, c"ncclCommSuspend", fn(*mut c_void, c_int), |real| (
        real, flags
    ));
    guarded(|| {
        // SAFETY: our caller's contract.
        unsafe { comm_ref(comm) }?;
        Err(unsupported(SUSPEND_REFUSED))
    })
}

const SUSPEND_REFUSED: &str = "ncclCommSuspend and ncclCommResume of a ringreduce communicator \
     are not run by ringreduce-nccl (its memory stays until ncclCommDestroy)";

/// `ncclCommResume` (NCCL 2.29): as [`ncclCommSuspend`].
#[no_mangle]
pub unsafe extern "C" fn ncclCommResume(comm: ncclComm_t) -> ncclResult_t {
    to_nccl!(comm, c"ncclCommResume", fn(*mut c_void), |real| (real));
    guarded(|| {
        // SAFETY: our caller's contract.
        unsafe { comm_ref(comm) }?;
        Err(unsupported(SUSPEND_REFUSED))
    })
}

/// `ncclCommMemStat_t`'s values (NCCL 2.29).
const ncclStatGpuMemSuspend: c_int = 0;
const ncclStatGpuMemSuspended: c_int = 1;
const ncclStatGpuMemPersist: c_int = 2;
const ncclStatGpuMemTotal: c_int = 3;

/// `ncclCommMemStats` (NCCL 2.29): NCCL's on its communicators. On ringreduce's, what is known:
/// the memory that can be suspended is 0 bytes ([`ncclCommSuspend`] is refused) and the
/// communicator is never suspended (0); the memory it holds is not counted here, so those two
/// statistics are refused.
#[no_mangle]
pub unsafe extern "C" fn ncclCommMemStats(
    comm: ncclComm_t,
    stat: c_int,
    value: *mut u64,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclCommMemStats",
        fn(*mut c_void, c_int, *mut u64),
        |real| (real, stat, value)
    );
    guarded(|| {
        // SAFETY: our caller's contract.
        unsafe { comm_ref(comm) }?;
        // SAFETY: null is refused; otherwise a writable uint64_t.
        let out = unsafe { value.as_mut() }.ok_or_else(|| invalid("value is null"))?;
        *out = match stat {
            ncclStatGpuMemSuspend | ncclStatGpuMemSuspended => 0,
            ncclStatGpuMemPersist | ncclStatGpuMemTotal => {
                return Err(unsupported(format!(
                    "ncclCommMemStats: statistic {stat} (the GPU memory a communicator holds) \
                     is not counted by ringreduce-nccl"
                )))
            }
            _ => return Err(invalid(format!("unknown memory statistic {stat}"))),
        };
        Ok(())
    })
}

/// `ncclWinGetUserPtr` (NCCL 2.29): the pointer a window was registered at — NCCL's on its
/// communicators; on ringreduce's, the `buff` its `ncclCommWindowRegister` was given.
#[no_mangle]
pub unsafe extern "C" fn ncclWinGetUserPtr(
    comm: ncclComm_t,
    win: *mut c_void,
    out_user_ptr: *mut *mut c_void,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclWinGetUserPtr",
        fn(*mut c_void, *mut c_void, *mut *mut c_void),
        |real| (real, win, out_user_ptr)
    );
    guarded(|| {
        // SAFETY: our caller's contract.
        unsafe { comm_ref(comm) }?;
        // SAFETY: null is refused; otherwise a writable pointer.
        let out = unsafe { out_user_ptr.as_mut() }.ok_or_else(|| invalid("outUserPtr is null"))?;
        match registration::window_of_ours(win) {
            Some((owner, buff)) if owner == comm => {
                *out = buff;
                Ok(())
            }
            _ => Err(invalid(format!(
                "{win:?} is not a live window of this communicator (ncclCommWindowRegister)"
            ))),
        }
    })
}

/// `ncclResetDebugInit` (NCCL 2.24–2.29, deprecated by NCCL: "not supported as part of the NCCL
/// API"): NCCL reads its logging variables (`NCCL_DEBUG`, …) again. Passed on to the real NCCL
/// when it runs a communicator of this process (one not yet used reads them when first used);
/// ringreduce-nccl's own `RINGREDUCE_NCCL_LOG` is read once per process.
#[no_mangle]
pub extern "C" fn ncclResetDebugInit() {
    // Nothing to return, and nothing may unwind into C.
    let _ = guarded(|| {
        if !fallback::made_any() {
            return Ok(());
        }
        type F = unsafe extern "C" fn();
        if let Some(nccl) = fallback::Real::get() {
            // SAFETY: NCCL's declared signature (`void ncclResetDebugInit()`).
            if let Some(f) = unsafe { nccl.function::<F>(c"ncclResetDebugInit") } {
                fallback::log("ncclResetDebugInit", "NCCL");
                // SAFETY: as above; it takes nothing.
                unsafe { f() };
            }
        }
        Ok(())
    });
}
