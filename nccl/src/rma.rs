//! NCCL's one-sided point-to-point calls (NCCL 2.29, "One-Sided Point-to-Point Operations
//! (RMA)"): a put into a peer's window with a signal, a signal alone, and waiting for signals.
//! PyTorch 2.15 (built against NCCL 2.30) imports them: the library exports them so that it
//! loads. NCCL's on its communicators; on ringreduce's, refused with `ncclInvalidUsage` and a
//! message (ringreduce runs two-sided sends and receives only).

use crate::*;

/// The refusal of a one-sided call on one of ringreduce's communicators.
///
/// # Safety
/// `comm` is null or a live handle.
unsafe fn refused(comm: ncclComm_t, call: &str) -> ncclResult_t {
    guarded(|| {
        // SAFETY: our caller's contract: a live handle, or null.
        unsafe { comm_ref(comm) }?;
        Err(unsupported(format!(
            "{call} (one-sided, NCCL's RMA) is not run on a ringreduce communicator \
             (ncclSend/ncclRecv are)"
        )))
    })
}

/// `ncclPutSignal`: `count` elements from `localbuff` into `peer`'s window `peerWin` at
/// `peerWinOffset`, then a signal — NCCL's on its communicators, refused on ringreduce's.
#[no_mangle]
pub unsafe extern "C" fn ncclPutSignal(
    localbuff: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    peer_win: *mut c_void,
    peer_win_offset: usize,
    sig_idx: c_int,
    ctx: c_int,
    flags: std::ffi::c_uint,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclPutSignal",
        fn(
            *const c_void,
            usize,
            ncclDataType_t,
            c_int,
            *mut c_void,
            usize,
            c_int,
            c_int,
            std::ffi::c_uint,
            *mut c_void,
            cudaStream_t,
        ),
        |real| (
            localbuff,
            count,
            datatype,
            peer,
            peer_win,
            peer_win_offset,
            sig_idx,
            ctx,
            flags,
            real,
            stream,
        )
    );
    // SAFETY: our caller's contract: a live handle, or null.
    unsafe { refused(comm, "ncclPutSignal") }
}

/// `ncclSignal`: a signal to `peer` without data — as [`ncclPutSignal`].
#[no_mangle]
pub unsafe extern "C" fn ncclSignal(
    peer: c_int,
    sig_idx: c_int,
    ctx: c_int,
    flags: std::ffi::c_uint,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclSignal",
        fn(c_int, c_int, c_int, std::ffi::c_uint, *mut c_void, cudaStream_t),
        |real| (peer, sig_idx, ctx, flags, real, stream)
    );
    // SAFETY: our caller's contract: a live handle, or null.
    unsafe { refused(comm, "ncclSignal") }
}

/// `ncclWaitSignal`: waits on `stream` for the signals `signalDescs` describes — as
/// [`ncclPutSignal`].
#[no_mangle]
pub unsafe extern "C" fn ncclWaitSignal(
    n_desc: c_int,
    signal_descs: *mut ncclWaitSignalDesc_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclWaitSignal",
        fn(c_int, *mut ncclWaitSignalDesc_t, *mut c_void, cudaStream_t),
        |real| (n_desc, signal_descs, real, stream)
    );
    // SAFETY: our caller's contract: a live handle, or null.
    unsafe { refused(comm, "ncclWaitSignal") }
}
