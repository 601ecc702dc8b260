//! The device API's host-accessible device pointer calls (NCCL 2.29, "Device API – Host-Side
//! Setup: Host-Accessible Device Pointer Functions") that PyTorch 2.15 imports: a pointer, for the
//! caller's kernels, into a registered window — a peer's, or its multicast (NVLS) mapping. They
//! name a window and no communicator: on a window of NCCL's (its communicators' windows are
//! NCCL's own handles) the call is NCCL's; on a window of ringreduce's it is refused with
//! `ncclInvalidUsage` and a message, as the device API is (`ncclDevCommCreate`).

use crate::*;

/// Hands a call naming only `window` to NCCL when the window is NCCL's; otherwise the refusal
/// (a window of ringreduce's) or the argument error (null, or no window at all).
macro_rules! window_call {
    ($window:expr, $name:literal, fn($($t:ty),* $(,)?), ($($arg:expr),* $(,)?) $(,)?) => {{
        let call = $name.to_string_lossy();
        if $window.is_null() {
            return guarded(|| Err(invalid(format!("{call}: window is null"))));
        }
        if registration::window_of_ours($window).is_some() {
            return guarded(|| {
                Err(unsupported(format!(
                    "NCCL's device API ({call}) does not run on a window of a ringreduce \
                     communicator"
                )))
            });
        }
        if !fallback::made_any() {
            return guarded(|| {
                Err(invalid(format!(
                    "{call}: {:?} is not a live window (ncclCommWindowRegister)",
                    $window
                )))
            });
        }
        type F = unsafe extern "C" fn($($t),*) -> ncclResult_t;
        // SAFETY: NCCL's documented signature; a window that is not ours is NCCL's (NCCL made
        // communicators in this process), with the caller's other arguments.
        match unsafe { real::<F>($name) } {
            // SAFETY: as above.
            Ok(f) => unsafe { f($($arg),*) },
            Err(code) => code,
        }
    }};
}

/// `ncclGetLsaMultimemDevicePointer`: the multicast (NVLS) address of `window` at `offset`
/// across its load/store-accessible team.
#[no_mangle]
pub unsafe extern "C" fn ncclGetLsaMultimemDevicePointer(
    window: *mut c_void,
    offset: usize,
    out_ptr: *mut *mut c_void,
) -> ncclResult_t {
    window_call!(
        window,
        c"ncclGetLsaMultimemDevicePointer",
        fn(*mut c_void, usize, *mut *mut c_void),
        (window, offset, out_ptr)
    )
}

/// `ncclGetPeerDevicePointer`: the address, usable by this rank's kernels, of `peer`'s memory of
/// `window` at `offset`.
#[no_mangle]
pub unsafe extern "C" fn ncclGetPeerDevicePointer(
    window: *mut c_void,
    offset: usize,
    peer: c_int,
    out_ptr: *mut *mut c_void,
) -> ncclResult_t {
    window_call!(
        window,
        c"ncclGetPeerDevicePointer",
        fn(*mut c_void, usize, c_int, *mut *mut c_void),
        (window, offset, peer, out_ptr)
    )
}
