//! NCCL's C API as ringreduce calls it, through the loader ([`Library`]): the signatures NCCL
//! documents (`nccl.h`) as function-pointer types; [`Api`], which looks each up by name once per
//! process and calls it; [`Api::check`], the one place an NCCL status becomes an error
//! ([`Error::Nccl`], with NCCL's own text). A function this libnccl lacks (an older NCCL) is
//! [`Error::Nccl`] with code −1 naming it and the file when called, never a panic. Its users:
//! the engine between hosts (`super::Comm`) and the CLI's NCCL baseline.

// The C names, as NCCL's documentation writes them.
#![allow(non_camel_case_types)]

use super::abi::*;
use super::Library;
use crate::error::{Error, Result};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::Path;
use std::sync::OnceLock;

/// `ncclComm_t`, NCCL's opaque handle of a communicator.
pub type ncclComm_t = *mut c_void;
/// `ncclWindow_t`, NCCL's opaque handle of a registered window (NCCL ≥ 2.27).
pub type ncclWindow_t = *mut c_void;
/// `cudaStream_t` (the driver's `CUstream`).
pub type cudaStream_t = *mut c_void;

/// `const char* ncclGetErrorString(ncclResult_t result)`.
type GetErrorString = unsafe extern "C" fn(ncclResult_t) -> *const c_char;
/// `const char* ncclGetLastError(ncclComm_t comm)`.
type GetLastError = unsafe extern "C" fn(ncclComm_t) -> *const c_char;

/// `name` with its NUL, as a C string (checked when the constant is evaluated, at build time).
const fn c_name(name: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(name.as_bytes()) {
        Ok(name) => name,
        Err(_) => panic!("an NCCL symbol name is one C string"),
    }
}

/// For each function returning an `ncclResult_t`: its signature as a type, a field of [`Api`]
/// holding it (`None` where this libnccl lacks it), and a method of [`Api`] that calls it and
/// checks the status. `[unsafe]` marks a call with preconditions (pointers, handles).
macro_rules! nccl_api {
    ($($(#[$doc:meta])* [$($unsafety:tt)*] $method:ident: $Type:ident =
        $symbol:ident($($arg:ident: $ty:ty),* $(,)?);)*) => {
        $($(#[$doc])* pub type $Type = unsafe extern "C" fn($($ty),*) -> ncclResult_t;)*

        /// NCCL's functions, looked up once in the library the loader found (module doc).
        pub struct Api {
            /// The file they come from.
            path: &'static Path,
            $($method: Option<$Type>,)*
            error_string: Option<GetErrorString>,
            last_error: Option<GetLastError>,
        }

        impl Api {
            fn load(lib: &'static Library) -> Api {
                // SAFETY: each type is the C signature NCCL documents for its symbol's name.
                unsafe {
                    Api {
                        path: &lib.path,
                        $($method: lib.function::<$Type>(
                            const { c_name(concat!(stringify!($symbol), "\0")) },
                        ),)*
                        error_string: lib.function(c"ncclGetErrorString"),
                        last_error: lib.function(c"ncclGetLastError"),
                    }
                }
            }

            /// None of NCCL's functions, as if `path` had none (the tests' missing symbols).
            #[cfg(test)]
            fn absent(path: &'static Path) -> Api {
                Api { path, $($method: None,)* error_string: None, last_error: None }
            }

            $(
                #[doc = concat!("`", stringify!($symbol), "` ([`", stringify!($Type),
                    "`]), its status checked by [`Api::check`].")]
                ///
                /// # Safety
                /// NCCL's preconditions for the call: handles NCCL made and has not destroyed,
                /// pointers valid for what NCCL reads and writes until the stream passes the call.
                #[allow(clippy::too_many_arguments)] // NCCL's own calls take up to eight.
                pub $($unsafety)* fn $method(&self, $($arg: $ty),*) -> Result<()> {
                    let name = stringify!($symbol);
                    let f = self.$method.ok_or_else(|| self.missing(name))?;
                    // SAFETY: NCCL's documented signature (`load`); the arguments meet NCCL's
                    // preconditions by our caller's contract (the group calls have none).
                    self.check(name, unsafe { f($($arg),*) })
                }
            )*
        }
    };
}

nccl_api! {
    /// `ncclResult_t ncclGetVersion(int* version)`.
    [unsafe] get_version: GetVersion = ncclGetVersion(version: *mut c_int);
    /// `ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId)`.
    [unsafe] get_unique_id: GetUniqueId = ncclGetUniqueId(unique_id: *mut ncclUniqueId);
    /// `ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId,
    /// int rank)`.
    [unsafe] comm_init_rank: CommInitRank = ncclCommInitRank(comm: *mut ncclComm_t,
        nranks: c_int, comm_id: ncclUniqueId, rank: c_int);
    /// `ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist)`.
    [unsafe] comm_init_all: CommInitAll =
        ncclCommInitAll(comm: *mut ncclComm_t, ndev: c_int, devlist: *const c_int);
    /// `ncclResult_t ncclCommCount(const ncclComm_t comm, int* count)`.
    [unsafe] comm_count: CommCount = ncclCommCount(comm: ncclComm_t, count: *mut c_int);
    /// `ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError)`.
    [unsafe] comm_get_async_error: CommGetAsyncError =
        ncclCommGetAsyncError(comm: ncclComm_t, async_error: *mut ncclResult_t);
    /// `ncclResult_t ncclCommFinalize(ncclComm_t comm)`.
    [unsafe] comm_finalize: CommFinalize = ncclCommFinalize(comm: ncclComm_t);
    /// `ncclResult_t ncclCommDestroy(ncclComm_t comm)`.
    [unsafe] comm_destroy: CommDestroy = ncclCommDestroy(comm: ncclComm_t);
    /// `ncclResult_t ncclCommAbort(ncclComm_t comm)`.
    [unsafe] comm_abort: CommAbort = ncclCommAbort(comm: ncclComm_t);
    /// `ncclResult_t ncclGroupStart()`.
    [] group_start: GroupStart = ncclGroupStart();
    /// `ncclResult_t ncclGroupEnd()`.
    [] group_end: GroupEnd = ncclGroupEnd();
    /// `ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
    /// ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)`.
    [unsafe] all_reduce: AllReduce = ncclAllReduce(sendbuff: *const c_void, recvbuff: *mut c_void,
        count: usize, datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t,
        stream: cudaStream_t);
    /// `ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
    /// ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)`.
    [unsafe] reduce_scatter: ReduceScatter = ncclReduceScatter(sendbuff: *const c_void,
        recvbuff: *mut c_void, recvcount: usize, datatype: ncclDataType_t, op: ncclRedOp_t,
        comm: ncclComm_t, stream: cudaStream_t);
    /// `ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
    /// ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)`.
    [unsafe] all_gather: AllGather = ncclAllGather(sendbuff: *const c_void, recvbuff: *mut c_void,
        sendcount: usize, datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t);
    /// `ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
    /// ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)`.
    [unsafe] broadcast: Broadcast = ncclBroadcast(sendbuff: *const c_void, recvbuff: *mut c_void,
        count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t,
        stream: cudaStream_t);
    /// `ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
    /// ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)`.
    [unsafe] reduce: Reduce = ncclReduce(sendbuff: *const c_void, recvbuff: *mut c_void,
        count: usize, datatype: ncclDataType_t, op: ncclRedOp_t, root: c_int, comm: ncclComm_t,
        stream: cudaStream_t);
    /// `ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
    /// int peer, ncclComm_t comm, cudaStream_t stream)`.
    [unsafe] send: SendFn = ncclSend(sendbuff: *const c_void, count: usize,
        datatype: ncclDataType_t, peer: c_int, comm: ncclComm_t, stream: cudaStream_t);
    /// `ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
    /// ncclComm_t comm, cudaStream_t stream)`.
    [unsafe] recv: RecvFn = ncclRecv(recvbuff: *mut c_void, count: usize,
        datatype: ncclDataType_t, peer: c_int, comm: ncclComm_t, stream: cudaStream_t);
    /// `ncclResult_t ncclMemAlloc(void** ptr, size_t size)`.
    [unsafe] mem_alloc: MemAlloc = ncclMemAlloc(ptr: *mut *mut c_void, size: usize);
    /// `ncclResult_t ncclMemFree(void* ptr)`.
    [unsafe] mem_free: MemFree = ncclMemFree(ptr: *mut c_void);
    /// `ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
    /// ncclWindow_t* win, int winFlags)`.
    [unsafe] comm_window_register: CommWindowRegister = ncclCommWindowRegister(comm: ncclComm_t,
        buff: *mut c_void, size: usize, win: *mut ncclWindow_t, win_flags: c_int);
    /// `ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win)`.
    [unsafe] comm_window_deregister: CommWindowDeregister =
        ncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t);
}

/// NCCL's result codes by name, in code order.
const RESULTS: [&str; 8] = [
    "ncclSuccess",
    "ncclUnhandledCudaError",
    "ncclSystemError",
    "ncclInternalError",
    "ncclInvalidArgument",
    "ncclInvalidUsage",
    "ncclRemoteError",
    "ncclInProgress",
];

impl Api {
    /// The functions of the NCCL the loader finds (module doc of `exec::nccl`), looked up on
    /// first use; `None` when there is none.
    pub fn get() -> Option<&'static Api> {
        static API: OnceLock<Option<Api>> = OnceLock::new();
        API.get_or_init(|| Library::get().map(Api::load)).as_ref()
    }

    /// [`Api::get`], or the error that says where NCCL was looked for ([`Library::require`]).
    pub fn require(why: &str) -> Result<&'static Api> {
        Library::require(why)?;
        Api::get().ok_or_else(|| Error::Internal {
            what: "NCCL was found, then not".into(),
        })
    }

    /// NCCL's status `code` from `call` as a `Result`: [`Error::Nccl`] with NCCL's own words —
    /// the code's name, its description and NCCL's last error message. The one place an NCCL
    /// status becomes an error.
    pub fn check(&self, call: &'static str, code: ncclResult_t) -> Result<()> {
        if code == ncclSuccess {
            return Ok(());
        }
        let text = match self.error_string {
            // SAFETY: NCCL's text for any code, static and NUL-terminated (null: `c_text`).
            Some(f) => c_text(unsafe { f(code) }),
            None => "(this NCCL has no ncclGetErrorString)".into(),
        };
        let last = match self.last_error {
            // SAFETY: NCCL ignores the argument; its last message is copied before another call.
            Some(f) => c_text(unsafe { f(std::ptr::null_mut()) }),
            None => "(this NCCL has no ncclGetLastError)".into(),
        };
        let name = usize::try_from(code).ok().and_then(|c| RESULTS.get(c));
        Err(Error::Nccl {
            call,
            code,
            message: format!(
                "{}: {text}; NCCL's last error: {last}",
                name.map_or("an unknown ncclResult_t", |n| n)
            ),
        })
    }

    /// Whether the error is [`Api`]'s for a function this NCCL does not have.
    pub fn is_missing(err: &Error) -> bool {
        matches!(err, Error::Nccl { code: -1, .. })
    }

    /// The error for a function this NCCL does not have.
    fn missing(&self, symbol: &'static str) -> Error {
        Error::Nccl {
            call: symbol,
            code: -1,
            message: format!("{} has no {symbol} (too old an NCCL?)", self.path.display()),
        }
    }
}

/// The text of a C string from NCCL, or "(none)" for null.
fn c_text(ptr: *const c_char) -> String {
    if ptr.is_null() {
        return "(none)".to_string();
    }
    // SAFETY: non-null, and our callers pass pointers NCCL documents as NUL-terminated strings
    // that stay valid until the next NCCL call on this thread.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A status becomes `Ok` or an [`Error::Nccl`] naming the code; a function the library
    /// lacks is an [`Error::Nccl`] of code −1 naming it and the file, never a call.
    #[test]
    fn statuses_and_missing_functions() {
        let api = Api::absent(Path::new("/old/libnccl.so.2"));
        assert_eq!(api.check("ncclAllReduce", ncclSuccess), Ok(()));
        let failed = |code| match api.check("ncclAllReduce", code) {
            Err(Error::Nccl {
                call,
                code: c,
                message,
            }) => {
                assert_eq!((call, c), ("ncclAllReduce", code));
                assert!(message.contains("no ncclGetErrorString"), "{message}");
                message.split(':').next().unwrap().to_string()
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(failed(ncclInvalidArgument), "ncclInvalidArgument");
        assert_eq!(failed(ncclRemoteError), "ncclRemoteError");
        assert_eq!(failed(ncclInProgress), "ncclInProgress");
        assert_eq!(failed(42), "an unknown ncclResult_t");
        assert_eq!(RESULTS.len() as ncclResult_t, ncclNumResults);
        let missing = |symbol: &'static str| {
            Err(Error::Nccl {
                call: symbol,
                code: -1,
                message: format!("/old/libnccl.so.2 has no {symbol} (too old an NCCL?)"),
            })
        };
        assert_eq!(api.group_start(), missing("ncclGroupStart"));
        assert!(Api::is_missing(&api.group_end().unwrap_err()));
        // SAFETY: the function is absent, so nothing is called.
        let version = unsafe { api.get_version(&mut 0) };
        assert_eq!(version, missing("ncclGetVersion"));
        // SAFETY: the function is absent, so nothing is called.
        let freed = unsafe { api.mem_free(std::ptr::null_mut()) };
        assert_eq!(freed, missing("ncclMemFree"));
    }
}
