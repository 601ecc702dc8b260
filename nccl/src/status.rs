//! From ringreduce's errors to NCCL's result codes, with the message kept for
//! `ncclGetLastError`; and the guard every exported function runs its body in, so that a panic
//! never unwinds into C (it becomes `ncclInternalError` with its message).

#![allow(non_upper_case_globals)]

use crate::abi::*;
use ringreduce::Error;
use std::cell::RefCell;
use std::ffi::CString;

thread_local! {
    /// The message of the last error on this thread, for `ncclGetLastError`.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// NCCL's code for one of ringreduce's errors.
pub fn code_of(err: &Error) -> ncclResult_t {
    match err {
        Error::Cuda { .. } | Error::NoGpu { .. } | Error::NoPeerAccess { .. } => {
            ncclUnhandledCudaError
        }
        Error::Resource { .. } => ncclSystemError,
        Error::Internal { .. } | Error::PlanRejected(_) => ncclInternalError,
        // A peer that failed or is gone: NCCL's "remote process exited or there was a network
        // error".
        Error::RankFailed { .. } | Error::Closed => ncclRemoteError,
        // A deadline the caller chose passed (`RINGREDUCE_NCCL_TIMEOUT`): the peers may be alive
        // and late, so not `ncclRemoteError`, whose text says a process exited.
        Error::RanksMissing { .. } | Error::Timeout { .. } | Error::LaunchBlocked { .. } => {
            ncclSystemError
        }
        Error::CommunicatorFailed(cause) | Error::Level { source: cause, .. } => code_of(cause),
        // NCCL's own code, where NCCL (between hosts) gave one.
        Error::Nccl { code, .. } if *code > 0 => *code,
        Error::Nccl { .. } => ncclSystemError,
        Error::CallMismatch { .. }
        | Error::WorldSizeMismatch { .. }
        | Error::DuplicateRank { .. }
        | Error::ConfigMismatch { .. }
        | Error::HostLayout { .. }
        | Error::NoInterHost { .. }
        | Error::NotCapturable { .. } => ncclInvalidUsage,
        _ => ncclInvalidArgument,
    }
}

/// Keeps `message` as this thread's last error.
pub fn remember(message: &str) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = text);
}

/// This thread's last error message, valid until the thread's next failing call.
pub fn last_error() -> *const std::ffi::c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

/// An error of this library's own (a bad argument, an unsupported call): its code, its message
/// kept.
pub fn fail(code: ncclResult_t, message: &str) -> ncclResult_t {
    remember(&format!("ringreduce-nccl: {message}"));
    code
}

/// Runs an exported function's body: its ringreduce error becomes NCCL's code (the message
/// kept), a panic `ncclInternalError`.
pub fn guarded(body: impl FnOnce() -> Result<(), Failure>) -> ncclResult_t {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => ncclSuccess,
        Ok(Err(Failure::Nccl(code, message))) => fail(code, &message),
        Ok(Err(Failure::Ring(err))) => {
            remember(&format!("ringreduce-nccl: {err}"));
            code_of(&err)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("a panic");
            fail(ncclInternalError, &format!("internal error: {what}"))
        }
    }
}

/// Why an exported function failed: one of ringreduce's errors, or a code of NCCL's with a
/// message of this library's.
#[derive(Debug)]
pub enum Failure {
    Ring(Error),
    Nccl(ncclResult_t, String),
}

impl From<Error> for Failure {
    fn from(err: Error) -> Failure {
        Failure::Ring(err)
    }
}

/// A bad argument, by name.
pub fn invalid(message: impl Into<String>) -> Failure {
    Failure::Nccl(ncclInvalidArgument, message.into())
}

/// A call this library does not run (yet), said so.
pub fn unsupported(message: impl Into<String>) -> Failure {
    Failure::Nccl(ncclInvalidUsage, message.into())
}
