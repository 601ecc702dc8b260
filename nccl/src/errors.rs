//! NCCL's error calls: the text of a code, the last error of this thread, and the error a
//! communicator met without a call returning it.

use crate::*;

/// `ncclGetErrorString`: a static text per code.
#[no_mangle]
pub extern "C" fn ncclGetErrorString(result: ncclResult_t) -> *const c_char {
    let text: &'static CStr = match result {
        ncclSuccess => c"no error",
        ncclUnhandledCudaError => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        ncclSystemError => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        ncclInternalError => {
            c"internal error - please report this issue to the ringreduce developers"
        }
        ncclInvalidArgument => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        ncclInvalidUsage => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        ncclRemoteError => c"remote process exited or there was a network error",
        ncclInProgress => c"NCCL operation in progress",
        _ => c"unknown result code",
    };
    text.as_ptr()
}

/// `ncclGetLastError`: the message of this thread's last failing call (any communicator).
#[no_mangle]
pub unsafe extern "C" fn ncclGetLastError(comm: ncclComm_t) -> *const c_char {
    // SAFETY: our caller's contract: a live handle, or null.
    if let Some(real_comm) = unsafe { nccl_of(comm) } {
        type F = unsafe extern "C" fn(*mut c_void) -> *const c_char;
        if let Some(nccl) = fallback::Real::get() {
            // SAFETY: NCCL's documented signature, its own handle.
            if let Some(f) = unsafe { nccl.function::<F>(c"ncclGetLastError") } {
                // SAFETY: as above.
                return unsafe { f(real_comm) };
            }
        }
    }
    status::last_error()
}

/// `ncclCommGetAsyncError`: `ncclSuccess`, or the code of an error met without a call
/// returning it (a lost peer, a kernel that gave up, a CUDA error). Never waits.
#[no_mangle]
pub unsafe extern "C" fn ncclCommGetAsyncError(
    comm: ncclComm_t,
    async_error: *mut ncclResult_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclCommGetAsyncError",
        fn(*mut c_void, *mut ncclResult_t),
        |real| (real, async_error)
    );
    guarded(|| {
        // SAFETY: our caller's contract.
        let comm = unsafe { comm_ref(comm) }?;
        // SAFETY: null is refused; otherwise a writable ncclResult_t.
        let out = unsafe { async_error.as_mut() }.ok_or_else(|| invalid("asyncError is null"))?;
        // Never waits: while a call holds the communicator (it may wait for its peers), there
        // is nothing new to say yet.
        let found = match &comm.backend {
            Backend::Ring(inner, _) => match inner.try_lock() {
                Ok(mut guard) => guard.as_mut().and_then(|c| c.async_error()),
                Err(std::sync::TryLockError::Poisoned(p)) => {
                    p.into_inner().as_mut().and_then(|c| c.async_error())
                }
                Err(std::sync::TryLockError::WouldBlock) => None,
            },
            Backend::Nccl(_) => None,
        };
        *out = match found {
            None => ncclSuccess,
            Some(err) => {
                fallback::log("ncclCommGetAsyncError", &err.to_string());
                status::remember(&format!("ringreduce-nccl: {err}"));
                status::code_of(&err)
            }
        };
        Ok(())
    })
}
