//! NCCL's C API on ringreduce: `libringreduce_nccl.so`, whose soname is `libnccl.so.2`, so that a
//! program built against NCCL — PyTorch's ProcessGroupNCCL, vLLM's pynccl, nccl-tests — runs on
//! ringreduce unchanged, through `LD_PRELOAD` or a link named `libnccl.so.2` on its library path.
//!
//! Each communicator is one rank of a job with a process per GPU
//! ([`ringreduce::RankCommunicator::gpu`]): `ncclGetUniqueId` makes the id rank 0 hands to every
//! rank, `ncclCommInitRank` joins on the calling thread's current GPU, and every collective is
//! enqueued on the stream passed in, NCCL's in-place forms included (each rank may choose on its
//! own: `Call` says how). Every
//! call's shape is compared across ranks before anything is enqueued, so mismatched calls are an
//! error on every rank, never a hang. Errors become NCCL's codes with the message kept for
//! `ncclGetLastError`; a panic never crosses into C.
//!
//! Sends and receives are kept until their group ends (run at once outside a group); then the
//! ranks exchange what each sends and receives and run one grouped send/recv. Every rank of the
//! communicator must take part in each group: a rank with nothing to send or receive calls
//! nothing in NCCL, and its peers' group then fails at the timeout, naming it.
//!
//! Several ranks in one process (`ncclCommInitAll`) are the real NCCL's to run, when one is found
//! (module `fallback`): such a communicator, and any split of it, runs every call on NCCL; so
//! does every communicator with `RINGREDUCE_NCCL_FALLBACK=1`. On ringreduce's communicators what
//! it does not run yet is refused with `ncclInvalidUsage` and a message saying so — never a
//! wrong result: `ncclCommSplit`, `ncclCommShrink`, `ncclRedOpCreatePreMulSum`, the device API
//! (`ncclDevCommCreate`), `ncclGroupSimulateEnd`'s estimate (nccl/README.md has the table of
//! every function). A job on several hosts runs each collective in two levels, the real NCCL
//! between hosts (`RankCommunicator::gpu` does that by itself). The fp8 types run with
//! ringreduce's semantics (src/element.rs: f32 accumulation, saturating rounding).
//! `RINGREDUCE_NCCL_LOG=1` prints which side ran each kind of call.
//!
//! Ranks that share one GPU (as on a one-GPU test machine) need `RINGREDUCE_NCCL_ALLOW_SHARED_GPU=1`.
//!
//! The declarations C programs compile against are `include/nccl.h`, written from NCCL's
//! documented API; `tests/c_api.rs` compiles a C program against them and runs it.

// The exported functions take raw pointers from C: each checks for null where NCCL's contract
// allows a caller to pass one by mistake, and says in its `# Safety` what it relies on.
#![allow(clippy::missing_safety_doc, non_upper_case_globals)]

pub mod abi;
mod fallback;
mod status;

use abi::*;
use ringreduce::device::CallerStream;
use ringreduce::plan::Collective;
use ringreduce::{CudaConfig, DType, DeviceMemory, Element, RankCommunicator, ReduceOp, UniqueId};
use status::{guarded, invalid, unsupported, Failure};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Mutex;

/// A communicator handle (`ncclComm_t` points to one): ringreduce's, or the real NCCL's
/// (module `fallback`).
pub struct Comm {
    rank: usize,
    world: usize,
    device: usize,
    /// The same number on every rank of the communicator, different for every other: the order
    /// in which a group's communicators are flushed on every rank.
    job: u64,
    backend: Backend,
}

/// Who runs a communicator's calls.
enum Backend {
    /// ringreduce's communicator, and the handle that gives it up from any thread (while a call
    /// holds the lock).
    Ring(
        Box<Mutex<Option<RankCommunicator>>>,
        ringreduce::AbortHandle,
    ),
    /// The real NCCL's communicator, made by NCCL.
    Nccl(NcclComm),
}

/// A communicator of the real NCCL.
#[derive(Clone, Copy)]
struct NcclComm(*mut c_void);

// SAFETY: NCCL's handles may be passed between threads (NCCL's thread rules are the caller's).
unsafe impl Send for NcclComm {}
// SAFETY: as above.
unsafe impl Sync for NcclComm {}

/// The real NCCL's communicator behind a handle, when NCCL made it.
///
/// # Safety
/// `comm` is null or a live handle.
unsafe fn nccl_of(comm: ncclComm_t) -> Option<*mut c_void> {
    // SAFETY: our caller's contract.
    match unsafe { comm.as_ref() }.map(|c| &c.backend) {
        Some(Backend::Nccl(real)) => Some(real.0),
        _ => None,
    }
}

/// The real NCCL's function `name` (logged as run by NCCL), or its absence as an error code
/// with a message.
///
/// # Safety
/// `F` is the C signature NCCL documents for `name`.
unsafe fn real<F: Copy>(name: &CStr) -> Result<F, ncclResult_t> {
    let call = name.to_string_lossy();
    let Some(nccl) = fallback::Real::get() else {
        return Err(status::fail(
            ncclInvalidUsage,
            &format!("{call}: no real NCCL to hand it to (set RINGREDUCE_NCCL_PATH)"),
        ));
    };
    // SAFETY: our caller's contract.
    match unsafe { nccl.function::<F>(name) } {
        Some(f) => {
            fallback::log(&call, "NCCL");
            Ok(f)
        }
        None => Err(status::fail(
            ncclInvalidUsage,
            &format!("{call}: the NCCL at {} lacks it", nccl.path.display()),
        )),
    }
}

/// Wraps a communicator the real NCCL made in a handle of ours.
///
/// # Safety
/// `real_comm` is a live communicator of the real NCCL.
unsafe fn wrap(real_comm: *mut c_void) -> Result<ncclComm_t, ncclResult_t> {
    type Number = unsafe extern "C" fn(*mut c_void, *mut c_int) -> ncclResult_t;
    let ask = |name: &CStr| -> Result<usize, ncclResult_t> {
        // SAFETY: NCCL's documented signature for these three.
        let f = unsafe { real::<Number>(name) }?;
        let mut value: c_int = 0;
        // SAFETY: a live communicator of NCCL's and a writable int.
        match unsafe { f(real_comm, &mut value) } {
            ncclSuccess => Ok(value as usize),
            code => Err(code),
        }
    };
    let handle = Comm {
        rank: ask(c"ncclCommUserRank")?,
        world: ask(c"ncclCommCount")?,
        device: ask(c"ncclCommCuDevice")?,
        job: 0,
        backend: Backend::Nccl(NcclComm(real_comm)),
    };
    fallback::mark_made();
    Ok(Box::into_raw(Box::new(handle)))
}

/// `ncclComm_t`.
#[allow(non_camel_case_types)]
pub type ncclComm_t = *mut Comm;

impl Comm {
    fn with<R>(
        &self,
        f: impl FnOnce(&mut RankCommunicator) -> Result<R, Failure>,
    ) -> Result<R, Failure> {
        let Backend::Ring(inner, _) = &self.backend else {
            return Err(Failure::Nccl(
                ncclInternalError,
                "a call of NCCL's communicator reached ringreduce".into(),
            ));
        };
        let mut inner = inner.lock().unwrap_or_else(|p| p.into_inner());
        match inner.as_mut() {
            Some(comm) => f(comm),
            None => Err(Failure::Nccl(
                ncclInvalidUsage,
                "the communicator was aborted".into(),
            )),
        }
    }
}

/// The communicator behind a handle.
///
/// # Safety
/// `comm` is null or a handle from `ncclCommInitRank*` not yet destroyed.
unsafe fn comm_ref<'a>(comm: ncclComm_t) -> Result<&'a Comm, Failure> {
    // SAFETY: our caller's contract.
    unsafe { comm.as_ref() }.ok_or_else(|| invalid("the communicator is null"))
}

/// Hands the call to the real NCCL when `comm` is one of its communicators (the calling
/// function returns NCCL's result).
macro_rules! to_nccl {
    ($comm:expr, $name:literal, fn($($t:ty),* $(,)?), |$real:ident| ($($arg:expr),* $(,)?) $(,)?) => {
        // SAFETY: our caller's contract: a live handle, or null.
        if let Some($real) = unsafe { nccl_of($comm) } {
            type F = unsafe extern "C" fn($($t),*) -> ncclResult_t;
            // SAFETY: NCCL's documented signature, its own handle, our caller's arguments.
            return match unsafe { real::<F>($name) } {
                // SAFETY: as above.
                Ok(f) => unsafe { f($($arg),*) },
                Err(code) => code,
            };
        }
    };
}

/// `ncclGetVersion`.
#[no_mangle]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> ncclResult_t {
    guarded(|| {
        // SAFETY: null is refused; otherwise NCCL's contract: a writable int.
        let out = unsafe { version.as_mut() }.ok_or_else(|| invalid("version is null"))?;
        *out = VERSION_CODE;
        Ok(())
    })
}

/// `ncclGetUniqueId`: an id whose rendezvous port is bound now, in this process (rank 0's), at
/// `NCCL_COMM_ID` (`ip:port`) when set, else at 127.0.0.1 on a free port.
#[no_mangle]
pub unsafe extern "C" fn ncclGetUniqueId(unique_id: *mut ncclUniqueId) -> ncclResult_t {
    if fallback::forced() {
        type F = unsafe extern "C" fn(*mut ncclUniqueId) -> ncclResult_t;
        // SAFETY: NCCL's documented signature; the caller's out-pointer.
        return match unsafe { real::<F>(c"ncclGetUniqueId") } {
            // SAFETY: as above.
            Ok(f) => unsafe { f(unique_id) },
            Err(code) => code,
        };
    }
    guarded(|| {
        // SAFETY: null is refused; otherwise NCCL's contract: a writable ncclUniqueId.
        let out = unsafe { unique_id.as_mut() }.ok_or_else(|| invalid("uniqueId is null"))?;
        let id = match std::env::var("NCCL_COMM_ID") {
            Ok(addr) => UniqueId::new(addr.as_str())?,
            Err(_) => UniqueId::new("127.0.0.1:0")?,
        };
        for (dst, src) in out.internal.iter_mut().zip(id.to_bytes()) {
            *dst = src as c_char;
        }
        Ok(())
    })
}

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

/// `ncclCommInitRank`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    comm_id: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    // SAFETY: our caller's contract, passed on; no config.
    unsafe { ncclCommInitRankConfig(comm, nranks, comm_id, rank, std::ptr::null_mut()) }
}

/// `ncclCommInitRankConfig`: `blocking = 0` is accepted (creation completes before returning,
/// which a non-blocking caller sees as an immediate `ncclSuccess`); the CTA and cluster hints
/// are ignored (they tune NCCL's kernels, not results).
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    comm: *mut ncclComm_t,
    nranks: c_int,
    comm_id: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    if fallback::forced() && !comm.is_null() {
        type F = unsafe extern "C" fn(
            *mut *mut c_void,
            c_int,
            ncclUniqueId,
            c_int,
            *mut ncclConfig_t,
        ) -> ncclResult_t;
        // SAFETY: NCCL's documented signature.
        let f = match unsafe { real::<F>(c"ncclCommInitRankConfig") } {
            Ok(f) => f,
            Err(code) => return code,
        };
        let mut made = std::ptr::null_mut();
        // SAFETY: the caller's arguments (the id NCCL's: `ncclGetUniqueId` forwarded too).
        match unsafe { f(&mut made, nranks, comm_id, rank, config) } {
            ncclSuccess => {}
            code => return code,
        }
        // SAFETY: a communicator NCCL just made; `comm` checked non-null.
        return match unsafe { wrap(made) } {
            Ok(handle) => {
                // SAFETY: as above.
                unsafe { *comm = handle };
                ncclSuccess
            }
            Err(code) => code,
        };
    }
    fallback::log("ncclCommInitRank", "ringreduce");
    guarded(|| {
        if comm.is_null() {
            return Err(invalid("comm is null"));
        }
        if nranks < 1 || rank < 0 || rank >= nranks {
            return Err(invalid(format!(
                "rank {rank} of {nranks} ranks: need 0 <= rank < nranks"
            )));
        }
        // SAFETY: null means no config; otherwise NCCL's contract: an initialized ncclConfig_t.
        if let Some(config) = unsafe { config.as_ref() } {
            if config.magic != NCCL_CONFIG_MAGIC
                || config.size < std::mem::size_of::<ncclConfig_t>()
            {
                return Err(invalid(
                    "the config was not initialized with NCCL_CONFIG_INITIALIZER",
                ));
            }
        }
        let bytes: Vec<u8> = comm_id.internal.iter().map(|&b| b as u8).collect();
        let id = UniqueId::from_bytes(&bytes)?;
        let device = ringreduce::device::current_device()?;
        let config = CudaConfig {
            allow_shared_device: std::env::var("RINGREDUCE_NCCL_ALLOW_SHARED_GPU")
                .is_ok_and(|v| v == "1"),
            ..CudaConfig::default()
        };
        let (rank, world) = (rank as usize, nranks as usize);
        let inner = RankCommunicator::gpu(&id, rank, world, device, config)?;
        let job = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        let handle = Box::new(Comm {
            rank,
            world,
            device,
            job,
            backend: {
                let abort = inner.abort_handle();
                Backend::Ring(Box::new(Mutex::new(Some(inner))), abort)
            },
        });
        // SAFETY: checked non-null above; NCCL's contract: a writable ncclComm_t.
        unsafe { *comm = Box::into_raw(handle) };
        Ok(())
    })
}

/// Calls NCCL's `name` on its communicator alone (destroy, abort).
fn forward_one(name: &CStr, real_comm: NcclComm) -> Result<(), Failure> {
    type F = unsafe extern "C" fn(*mut c_void) -> ncclResult_t;
    // SAFETY: NCCL's documented signature for destroy and abort, on its own handle.
    let code = match unsafe { real::<F>(name) } {
        // SAFETY: as above.
        Ok(f) => unsafe { f(real_comm.0) },
        Err(code) => code,
    };
    match code {
        ncclSuccess => Ok(()),
        code => Err(Failure::Nccl(
            code,
            format!("{}: NCCL failed", name.to_string_lossy()),
        )),
    }
}

/// `ncclCommInitRankScalable`: NCCL's ids of several roots (`nId` of them, id i made by rank
/// ⌊i·nranks/nId⌋, every rank holding all of them) are for spreading NCCL's bootstrap; one
/// rendezvous serves here, so every rank joins through the first id — made by rank 0, whose
/// process holds its rendezvous — as `ncclCommInitRankConfig` with it.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankScalable(
    newcomm: *mut ncclComm_t,
    nranks: c_int,
    myrank: c_int,
    n_id: c_int,
    comm_ids: *mut ncclUniqueId,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    if fallback::forced() && !newcomm.is_null() {
        type F = unsafe extern "C" fn(
            *mut *mut c_void,
            c_int,
            c_int,
            c_int,
            *mut ncclUniqueId,
            *mut ncclConfig_t,
        ) -> ncclResult_t;
        // SAFETY: NCCL's documented signature.
        let f = match unsafe { real::<F>(c"ncclCommInitRankScalable") } {
            Ok(f) => f,
            Err(code) => return code,
        };
        let mut made = std::ptr::null_mut();
        // SAFETY: the caller's arguments, passed on; `made` is writable.
        match unsafe { f(&mut made, nranks, myrank, n_id, comm_ids, config) } {
            ncclSuccess => {}
            code => return code,
        }
        // SAFETY: a communicator NCCL just made.
        return match unsafe { wrap(made) } {
            Ok(handle) => {
                // SAFETY: checked non-null above; NCCL's contract: writable.
                unsafe { *newcomm = handle };
                ncclSuccess
            }
            Err(code) => code,
        };
    }
    // SAFETY: NCCL's contract: `comm_ids` holds `n_id` ids.
    let first = match (n_id >= 1, unsafe { comm_ids.as_ref() }) {
        (true, Some(id)) => *id,
        _ => {
            return guarded(|| {
                Err(invalid(format!(
                    "{n_id} ids at {comm_ids:?}: need at least one"
                )))
            })
        }
    };
    // SAFETY: our caller's contract, passed on.
    unsafe { ncclCommInitRankConfig(newcomm, nranks, first, myrank, config) }
}

/// `ncclCommInitAll`: several ranks in one process are NCCL's to run (this library runs one
/// process per GPU): handed to the real NCCL, or refused by name without one.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitAll(
    comms: *mut ncclComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> ncclResult_t {
    if comms.is_null() || ndev < 1 {
        return guarded(|| Err(invalid("comms is null or ndev < 1")));
    }
    if fallback::Real::get().is_none() {
        return guarded(|| {
            Err(unsupported(
                "ncclCommInitAll (several ranks in one process) is not run by ringreduce-nccl \
                 (one process per GPU: ncclCommInitRank), and no real NCCL was found to hand it \
                 to (set RINGREDUCE_NCCL_PATH)",
            ))
        });
    }
    type F = unsafe extern "C" fn(*mut *mut c_void, c_int, *const c_int) -> ncclResult_t;
    // SAFETY: NCCL's documented signature.
    let f = match unsafe { real::<F>(c"ncclCommInitAll") } {
        Ok(f) => f,
        Err(code) => return code,
    };
    let mut made = vec![std::ptr::null_mut::<c_void>(); ndev as usize];
    // SAFETY: room for `ndev` handles; `devlist` is the caller's (null or `ndev` ordinals).
    match unsafe { f(made.as_mut_ptr(), ndev, devlist) } {
        ncclSuccess => {}
        code => return code,
    }
    for (i, real_comm) in made.into_iter().enumerate() {
        // SAFETY: a communicator NCCL just made.
        match unsafe { wrap(real_comm) } {
            // SAFETY: the caller's array of `ndev` handles.
            Ok(handle) => unsafe { *comms.add(i) = handle },
            Err(code) => return code,
        }
    }
    ncclSuccess
}

/// `ncclCommSplit`: a communicator of the real NCCL is split by NCCL; one of ringreduce's is
/// refused by name (not run yet).
#[no_mangle]
pub unsafe extern "C" fn ncclCommSplit(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    // SAFETY: our caller's contract: a live handle, or null.
    if let Some(real_comm) = unsafe { nccl_of(comm) } {
        type F = unsafe extern "C" fn(
            *mut c_void,
            c_int,
            c_int,
            *mut *mut c_void,
            *mut ncclConfig_t,
        ) -> ncclResult_t;
        // SAFETY: NCCL's documented signature.
        let f = match unsafe { real::<F>(c"ncclCommSplit") } {
            Ok(f) => f,
            Err(code) => return code,
        };
        let mut made = std::ptr::null_mut();
        // SAFETY: NCCL's own handle; the caller's config.
        match unsafe { f(real_comm, color, key, &mut made, config) } {
            ncclSuccess => {}
            code => return code,
        }
        // SAFETY: what NCCL just made; the caller's newcomm (NCCL's contract).
        return unsafe { hand_out(made, newcomm) };
    }
    // SAFETY: our caller's contract.
    unsafe { refuse_new(comm, newcomm, "ncclCommSplit") }
}

/// `ncclCommShrink`: a communicator of the real NCCL is shrunk by NCCL; one of ringreduce's is
/// refused by name (not run yet), as [`ncclCommSplit`].
#[no_mangle]
pub unsafe extern "C" fn ncclCommShrink(
    comm: ncclComm_t,
    exclude_ranks: *mut c_int,
    exclude_count: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
    shrink_flags: c_int,
) -> ncclResult_t {
    // SAFETY: our caller's contract: a live handle, or null.
    if let Some(real_comm) = unsafe { nccl_of(comm) } {
        type F = unsafe extern "C" fn(
            *mut c_void,
            *mut c_int,
            c_int,
            *mut *mut c_void,
            *mut ncclConfig_t,
            c_int,
        ) -> ncclResult_t;
        // SAFETY: NCCL's documented signature.
        let f = match unsafe { real::<F>(c"ncclCommShrink") } {
            Ok(f) => f,
            Err(code) => return code,
        };
        let mut made = std::ptr::null_mut();
        // SAFETY: NCCL's own handle; the caller's other arguments.
        match unsafe {
            f(
                real_comm,
                exclude_ranks,
                exclude_count,
                &mut made,
                config,
                shrink_flags,
            )
        } {
            ncclSuccess => {}
            code => return code,
        }
        // SAFETY: what NCCL just made; the caller's newcomm (NCCL's contract).
        return unsafe { hand_out(made, newcomm) };
    }
    // SAFETY: our caller's contract.
    unsafe { refuse_new(comm, newcomm, "ncclCommShrink") }
}

/// Hands a communicator NCCL made from another (a split, a shrink) to the caller: wrapped, or
/// null where NCCL made none (a rank left out: `NCCL_SPLIT_NOCOLOR`, an excluded rank).
///
/// # Safety
/// `made` is null or a communicator NCCL just made; `newcomm` is null or writable.
unsafe fn hand_out(made: *mut c_void, newcomm: *mut ncclComm_t) -> ncclResult_t {
    // SAFETY: null is refused; otherwise writable (our caller's contract).
    let Some(out) = (unsafe { newcomm.as_mut() }) else {
        return guarded(|| Err(invalid("newcomm is null")));
    };
    *out = match made.is_null() {
        true => std::ptr::null_mut(),
        // SAFETY: a communicator NCCL just made.
        false => match unsafe { wrap(made) } {
            Ok(handle) => handle,
            Err(code) => {
                // Not handed out: NCCL's communicator is destroyed, not leaked.
                type F = unsafe extern "C" fn(*mut c_void) -> ncclResult_t;
                // SAFETY: NCCL's documented signature; its own, unused handle.
                if let Ok(destroy) = unsafe { real::<F>(c"ncclCommDestroy") } {
                    // SAFETY: as above.
                    unsafe { destroy(made) };
                }
                *out = std::ptr::null_mut();
                return code;
            }
        },
    };
    ncclSuccess
}

/// Refuses by name (not run yet) to make a communicator from one of ringreduce's (`call`: a
/// split, a shrink), leaving `newcomm` null.
///
/// # Safety
/// `comm` is null or a live handle; `newcomm` is null or writable.
unsafe fn refuse_new(comm: ncclComm_t, newcomm: *mut ncclComm_t, call: &str) -> ncclResult_t {
    guarded(|| {
        // SAFETY: null is skipped; otherwise writable (our caller's contract).
        if let Some(out) = unsafe { newcomm.as_mut() } {
            *out = std::ptr::null_mut();
        }
        // SAFETY: our caller's contract.
        unsafe { comm_ref(comm) }?;
        Err(unsupported(format!(
            "{call} of a ringreduce communicator is not run by ringreduce-nccl yet"
        )))
    })
}

/// `ncclCommFinalize`: waits for every collective this rank enqueued.
#[no_mangle]
pub unsafe extern "C" fn ncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
    to_nccl!(comm, c"ncclCommFinalize", fn(*mut c_void), |real| (real));
    guarded(|| {
        // SAFETY: our caller's contract.
        let comm = unsafe { comm_ref(comm) }?;
        comm.with(|c| c.synchronize().map_err(Failure::from))
    })
}

/// `ncclCommDestroy`: frees the communicator (after its work is done).
#[no_mangle]
pub unsafe extern "C" fn ncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
    guarded(|| {
        if comm.is_null() {
            return Err(invalid("the communicator is null"));
        }
        // SAFETY: a handle from ncclCommInitRank*, destroyed once (NCCL's contract).
        let comm = unsafe { Box::from_raw(comm) };
        match &comm.backend {
            Backend::Ring(..) => Ok(()),
            Backend::Nccl(real_comm) => forward_one(c"ncclCommDestroy", *real_comm),
        }
    })
}

/// `ncclCommAbort`: the peers' waits end with an error naming this rank; frees the
/// communicator.
#[no_mangle]
pub unsafe extern "C" fn ncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
    guarded(|| {
        if comm.is_null() {
            return Err(invalid("the communicator is null"));
        }
        // SAFETY: a handle from ncclCommInitRank*, destroyed once (NCCL's contract).
        let comm = unsafe { Box::from_raw(comm) };
        match &comm.backend {
            Backend::Ring(inner, abort) => {
                // First, without the lock (a call may hold it, waiting for peers): that call
                // returns at once.
                abort.abort();
                let inner = inner.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(inner) = inner {
                    inner.abort();
                }
                Ok(())
            }
            Backend::Nccl(real_comm) => forward_one(c"ncclCommAbort", *real_comm),
        }
    })
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
                status::remember(&format!("ringreduce-nccl: {err}"));
                status::code_of(&err)
            }
        };
        Ok(())
    })
}

/// Writes one number of a communicator.
unsafe fn answer(
    comm: ncclComm_t,
    out: *mut c_int,
    what: &str,
    of: impl FnOnce(&Comm) -> usize,
) -> ncclResult_t {
    guarded(|| {
        // SAFETY: our caller's contract.
        let comm = unsafe { comm_ref(comm) }?;
        // SAFETY: null is refused; otherwise a writable int.
        let out = unsafe { out.as_mut() }.ok_or_else(|| invalid(format!("{what} is null")))?;
        *out = of(comm) as c_int;
        Ok(())
    })
}

/// `ncclCommCount`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclCommCount",
        fn(*mut c_void, *mut c_int),
        |real| (real, count)
    );
    // SAFETY: our caller's contract, passed on.
    unsafe { answer(comm, count, "count", |c| c.world) }
}

/// `ncclCommCuDevice`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclCommCuDevice",
        fn(*mut c_void, *mut c_int),
        |real| (real, device)
    );
    // SAFETY: our caller's contract, passed on.
    unsafe { answer(comm, device, "device", |c| c.device) }
}

/// `ncclCommUserRank`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclCommUserRank",
        fn(*mut c_void, *mut c_int),
        |real| (real, rank)
    );
    // SAFETY: our caller's contract, passed on.
    unsafe { answer(comm, rank, "rank", |c| c.rank) }
}

/// ringreduce's element type for NCCL's.
fn dtype_of(datatype: ncclDataType_t) -> Result<DType, Failure> {
    DATA_TYPES
        .iter()
        .find(|(code, _)| *code == datatype)
        .map(|(_, dtype)| *dtype)
        .ok_or_else(|| invalid(format!("unknown data type {datatype}")))
}

/// ringreduce's operator for NCCL's built-in ones.
fn op_of(op: ncclRedOp_t) -> Result<ReduceOp, Failure> {
    OPS.iter()
        .find(|(code, _)| *code == op)
        .map(|(_, o)| *o)
        .ok_or_else(|| {
            unsupported(format!(
                "reduction operator {op} (a custom one) is not run by ringreduce-nccl yet"
            ))
        })
}

/// One collective call as NCCL passes it: the send and receive buffers with their lengths in
/// elements (a side this rank does not pass is null).
///
/// Every call runs out of place, NCCL's in-place forms included (the same buffer, the
/// all-gather's send buffer inside its receive buffer, the reduce-scatter's receive buffer
/// inside its send buffer): NCCL lets each rank choose in place on its own, and every rank must
/// run the same plan. That is exact, since a rank's buffers are copied into the memory it shares
/// before the collective and out of it after: nothing is written to the caller's memory before
/// everything was read from it.
struct Call {
    /// NCCL's name of the call.
    name: &'static str,
    collective: Collective,
    send: (*const c_void, usize),
    recv: (*mut c_void, usize),
    dtype: DType,
    op: ReduceOp,
}

/// Enqueues `call` on `stream` (module doc).
///
/// # Safety
/// NCCL's contract for the collective: the buffers are device memory of the communicator's GPU
/// with the lengths given, untouched until the stream passes the call; `stream` is live.
unsafe fn enqueue(comm: ncclComm_t, call: Call, stream: cudaStream_t) -> ncclResult_t {
    fallback::log(call.name, "ringreduce");
    guarded(|| {
        // SAFETY: our caller's contract.
        let comm = unsafe { comm_ref(comm) }?;
        // SAFETY: our caller's contract: a live stream (or 0, the legacy default stream).
        let stream = unsafe { CallerStream::from_raw(stream.cast()) }?;
        macro_rules! typed {
            ($($d:ident => $t:ty),*) => {
                match call.dtype {
                    // SAFETY: our caller's contract, passed on.
                    $(DType::$d => comm.with(|c| unsafe { typed::<$t>(c, comm.device, &call, stream) }),)*
                }
            };
        }
        typed!(F16 => half::f16, BF16 => half::bf16, F32 => f32, F64 => f64, I8 => i8,
               U8 => u8, I32 => i32, U32 => u32, I64 => i64, U64 => u64,
               F8E4M3 => ringreduce::F8E4M3, F8E5M2 => ringreduce::F8E5M2)
    })
}

/// [`enqueue`] on elements of `T`.
///
/// # Safety
/// As for [`enqueue`].
unsafe fn typed<T: Element>(
    comm: &mut RankCommunicator,
    device: usize,
    call: &Call,
    stream: CallerStream,
) -> Result<(), Failure> {
    // SAFETY: our caller's contract: device memory of `device`, of these lengths.
    let memory = |addr: u64, len: usize| unsafe { DeviceMemory::<T>::new(addr, len, device) };
    let input = (!call.send.0.is_null()).then(|| memory(call.send.0 as u64, call.send.1));
    let mut output = (!call.recv.0.is_null()).then(|| memory(call.recv.0 as u64, call.recv.1));
    // SAFETY: our caller's contract, passed on.
    unsafe {
        comm.enqueue_collective_on_raw(
            &call.collective,
            input.as_ref(),
            output.as_mut(),
            call.op,
            stream,
        )
    }
    .map_err(Failure::from)
}

/// The parts of a call every collective checks alike: its type and operator.
fn types(datatype: ncclDataType_t, op: Option<ncclRedOp_t>) -> Result<(DType, ReduceOp), Failure> {
    Ok((dtype_of(datatype)?, op.map_or(Ok(ReduceOp::Sum), op_of)?))
}

/// Runs `body` to build a call, then enqueues it.
unsafe fn submit(
    comm: ncclComm_t,
    stream: cudaStream_t,
    body: impl FnOnce() -> Result<Call, Failure>,
) -> ncclResult_t {
    match body() {
        // SAFETY: our caller's contract, passed on.
        Ok(call) => unsafe { enqueue(comm, call, stream) },
        Err(failure) => guarded(|| Err(failure)),
    }
}

/// `ncclAllReduce`.
#[no_mangle]
pub unsafe extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclAllReduce",
        fn(
            *const c_void,
            *mut c_void,
            usize,
            ncclDataType_t,
            ncclRedOp_t,
            *mut c_void,
            cudaStream_t,
        ),
        |real| (sendbuff, recvbuff, count, datatype, op, real, stream)
    );
    // SAFETY: NCCL's contract for the call, passed on.
    unsafe {
        submit(comm, stream, || {
            let (dtype, op) = types(datatype, Some(op))?;
            Ok(Call {
                name: "ncclAllReduce",
                collective: Collective::AllReduce,
                send: (sendbuff, count),
                recv: (recvbuff, count),
                dtype,
                op,
            })
        })
    }
}

/// The rank and world of a communicator, for the calls whose buffers depend on them.
unsafe fn place(comm: ncclComm_t) -> Result<(usize, usize), Failure> {
    // SAFETY: our caller's contract.
    let comm = unsafe { comm_ref(comm) }?;
    Ok((comm.rank, comm.world))
}

/// A root as NCCL passes it, checked against the world.
fn root_of(root: c_int, world: usize) -> Result<usize, Failure> {
    match usize::try_from(root) {
        Ok(r) if r < world => Ok(r),
        _ => Err(invalid(format!("root {root} is not a rank of {world}"))),
    }
}

/// `ncclBroadcast`: the root's `sendbuff` into every rank's `recvbuff`.
#[no_mangle]
pub unsafe extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclBroadcast",
        fn(*const c_void, *mut c_void, usize, ncclDataType_t, c_int, *mut c_void, cudaStream_t),
        |real| (sendbuff, recvbuff, count, datatype, root, real, stream)
    );
    // SAFETY: NCCL's contract for the call, passed on.
    unsafe {
        submit(comm, stream, || {
            let (rank, world) = place(comm)?;
            let root = root_of(root, world)?;
            let (dtype, op) = types(datatype, None)?;
            let mine = rank == root;
            Ok(Call {
                name: "ncclBroadcast",
                collective: Collective::Broadcast { root },
                send: (if mine { sendbuff } else { std::ptr::null() }, count),
                recv: (recvbuff, count),
                dtype,
                op,
            })
        })
    }
}

/// `ncclBcast`: NCCL's in-place broadcast, `ncclBroadcast(buff, buff, …)` (PyTorch's
/// `broadcast` calls this one).
#[no_mangle]
pub unsafe extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclBcast",
        fn(*mut c_void, usize, ncclDataType_t, c_int, *mut c_void, cudaStream_t),
        |real| (buff, count, datatype, root, real, stream)
    );
    // SAFETY: NCCL's contract for the call, passed on.
    unsafe { ncclBroadcast(buff, buff, count, datatype, root, comm, stream) }
}

/// `ncclReduce`: every rank's `sendbuff` reduced into the root's `recvbuff`.
#[no_mangle]
pub unsafe extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclReduce",
        fn(
            *const c_void,
            *mut c_void,
            usize,
            ncclDataType_t,
            ncclRedOp_t,
            c_int,
            *mut c_void,
            cudaStream_t,
        ),
        |real| (sendbuff, recvbuff, count, datatype, op, root, real, stream)
    );
    // SAFETY: NCCL's contract for the call, passed on.
    unsafe {
        submit(comm, stream, || {
            let (rank, world) = place(comm)?;
            let root = root_of(root, world)?;
            let (dtype, op) = types(datatype, Some(op))?;
            let mine = rank == root;
            Ok(Call {
                name: "ncclReduce",
                collective: Collective::Reduce { root },
                send: (sendbuff, count),
                recv: (if mine { recvbuff } else { std::ptr::null_mut() }, count),
                dtype,
                op,
            })
        })
    }
}

/// `ncclAllGather` (in place when `sendbuff` is this rank's block of `recvbuff`: `Call`).
#[no_mangle]
pub unsafe extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclAllGather",
        fn(*const c_void, *mut c_void, usize, ncclDataType_t, *mut c_void, cudaStream_t),
        |real| (sendbuff, recvbuff, sendcount, datatype, real, stream)
    );
    // SAFETY: NCCL's contract for the call, passed on.
    unsafe {
        submit(comm, stream, || {
            let (_, world) = place(comm)?;
            let (dtype, op) = types(datatype, None)?;
            Ok(Call {
                name: "ncclAllGather",
                collective: Collective::AllGather,
                send: (sendbuff, sendcount),
                recv: (recvbuff, sendcount * world),
                dtype,
                op,
            })
        })
    }
}

/// `ncclReduceScatter` (in place when `recvbuff` is this rank's block of `sendbuff`: `Call`).
#[no_mangle]
pub unsafe extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclReduceScatter",
        fn(
            *const c_void,
            *mut c_void,
            usize,
            ncclDataType_t,
            ncclRedOp_t,
            *mut c_void,
            cudaStream_t,
        ),
        |real| (sendbuff, recvbuff, recvcount, datatype, op, real, stream)
    );
    // SAFETY: NCCL's contract for the call, passed on.
    unsafe {
        submit(comm, stream, || {
            let (_, world) = place(comm)?;
            let (dtype, op) = types(datatype, Some(op))?;
            Ok(Call {
                name: "ncclReduceScatter",
                collective: Collective::ReduceScatter,
                send: (sendbuff, recvcount * world),
                recv: (recvbuff, recvcount),
                dtype,
                op,
            })
        })
    }
}

/// `ncclAlltoAll`: block j of this rank's `sendbuff` to rank j, block i of `recvbuff` from rank
/// i (out of place).
#[no_mangle]
pub unsafe extern "C" fn ncclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclAlltoAll",
        fn(*const c_void, *mut c_void, usize, ncclDataType_t, *mut c_void, cudaStream_t),
        |real| (sendbuff, recvbuff, count, datatype, real, stream)
    );
    // SAFETY: NCCL's contract for the call, passed on.
    unsafe {
        submit(comm, stream, || {
            let (_, world) = place(comm)?;
            let (dtype, op) = types(datatype, None)?;
            if sendbuff == recvbuff.cast_const() {
                return Err(invalid("ncclAlltoAll has no in-place form"));
            }
            Ok(Call {
                name: "ncclAlltoAll",
                collective: Collective::AllToAll,
                send: (sendbuff, count * world),
                recv: (recvbuff, count * world),
                dtype,
                op,
            })
        })
    }
}

/// One `ncclSend` or `ncclRecv`, kept until its group ends.
struct PointToPoint {
    comm: ncclComm_t,
    send: bool,
    address: u64,
    count: usize,
    datatype: ncclDataType_t,
    peer: usize,
    stream: cudaStream_t,
}

thread_local! {
    /// How deep this thread is in `ncclGroupStart`/`ncclGroupEnd` pairs.
    static GROUP_DEPTH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// The sends and receives of this thread's open group, in call order.
    static PENDING: std::cell::RefCell<Vec<PointToPoint>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Keeps a send or receive for its group's end (runs it at once outside a group).
///
/// # Safety
/// NCCL's contract for the call.
unsafe fn point_to_point(op: PointToPoint) -> ncclResult_t {
    guarded(|| {
        // SAFETY: our caller's contract.
        let comm = unsafe { comm_ref(op.comm) }?;
        if op.peer >= comm.world {
            return Err(invalid(format!(
                "peer {} is not a rank of {}",
                op.peer, comm.world
            )));
        }
        dtype_of(op.datatype)?;
        PENDING.with(|p| p.borrow_mut().push(op));
        match GROUP_DEPTH.with(|d| d.get()) {
            // SAFETY: the kept calls' contracts, passed on.
            0 => unsafe { flush() },
            _ => Ok(()),
        }
    })
}

/// `ncclGather`: every rank's `count` elements into block `rank` of the root's `recvbuff`, as
/// one group of sends and receives.
#[no_mangle]
pub unsafe extern "C" fn ncclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclGather",
        fn(*const c_void, *mut c_void, usize, ncclDataType_t, c_int, *mut c_void, cudaStream_t),
        |real| (sendbuff, recvbuff, count, datatype, root, real, stream)
    );
    // SAFETY: NCCL's contract for the call, passed on.
    unsafe {
        rooted(
            true, sendbuff, recvbuff, count, datatype, root, comm, stream,
        )
    }
}

/// `ncclScatter`: block `rank` of the root's `sendbuff` (`count` elements) into every rank's
/// `recvbuff`, as one group of sends and receives.
#[no_mangle]
pub unsafe extern "C" fn ncclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclScatter",
        fn(*const c_void, *mut c_void, usize, ncclDataType_t, c_int, *mut c_void, cudaStream_t),
        |real| (sendbuff, recvbuff, count, datatype, root, real, stream)
    );
    // SAFETY: NCCL's contract for the call, passed on.
    unsafe {
        rooted(
            false, sendbuff, recvbuff, count, datatype, root, comm, stream,
        )
    }
}

/// Gather (`gather`) or scatter as a group of sends and receives: every rank's block to or from
/// the root, the root's own block a transfer to itself (a local copy). Inside the caller's group
/// it joins that group, as NCCL's do.
///
/// # Safety
/// NCCL's contract for `ncclGather` / `ncclScatter`.
#[allow(clippy::too_many_arguments)]
unsafe fn rooted(
    gather: bool,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: our caller's contract.
    let placed = unsafe { place(comm) }.and_then(|(rank, world)| {
        Ok((
            rank,
            world,
            root_of(root, world)?,
            dtype_of(datatype)?.size_bytes(),
        ))
    });
    let (rank, world, root, bytes) = match placed {
        Ok(placed) => placed,
        Err(failure) => return guarded(|| Err(failure)),
    };
    if count.checked_mul(world * bytes).is_none() {
        return guarded(|| {
            Err(invalid(format!(
                "{world} blocks of {count} elements overflow"
            )))
        });
    }
    let block = |base: u64, r: usize| base + (r * count * bytes) as u64;
    let mut ops = Vec::new();
    let end = |send: bool, address: u64, peer: usize| PointToPoint {
        comm,
        send,
        address,
        count,
        datatype,
        peer,
        stream,
    };
    if rank == root {
        for r in 0..world {
            ops.push(match gather {
                true => end(false, block(recvbuff as u64, r), r),
                false => end(true, block(sendbuff as u64, r), r),
            });
        }
    }
    ops.push(match gather {
        true => end(true, sendbuff as u64, root),
        false => end(false, recvbuff as u64, root),
    });
    let started = ncclGroupStart();
    if started != ncclSuccess {
        return started;
    }
    let mut result = ncclSuccess;
    for op in ops {
        // SAFETY: NCCL's contract for the blocks of the caller's buffers, passed on.
        let r = unsafe { point_to_point(op) };
        if result == ncclSuccess {
            result = r;
        }
    }
    // The group closes whatever the calls said; the first failure is returned.
    match (result, ncclGroupEnd()) {
        (ncclSuccess, ended) => ended,
        (failed, _) => failed,
    }
}

/// `ncclSend`: `count` elements to `peer`, matched by its `ncclRecv` (module doc: every rank of
/// the communicator takes part in each group of sends and receives).
#[no_mangle]
pub unsafe extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclSend",
        fn(*const c_void, usize, ncclDataType_t, c_int, *mut c_void, cudaStream_t),
        |real| (sendbuff, count, datatype, peer, real, stream)
    );
    // SAFETY: NCCL's contract for the call, passed on.
    unsafe {
        point_to_point(PointToPoint {
            comm,
            send: true,
            address: sendbuff as u64,
            count,
            datatype,
            peer: usize::try_from(peer).unwrap_or(usize::MAX),
            stream,
        })
    }
}

/// `ncclRecv`: `count` elements from `peer`, matched by its `ncclSend`.
#[no_mangle]
pub unsafe extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclRecv",
        fn(*mut c_void, usize, ncclDataType_t, c_int, *mut c_void, cudaStream_t),
        |real| (recvbuff, count, datatype, peer, real, stream)
    );
    // SAFETY: NCCL's contract for the call, passed on.
    unsafe {
        point_to_point(PointToPoint {
            comm,
            send: false,
            address: recvbuff as u64,
            count,
            datatype,
            peer: usize::try_from(peer).unwrap_or(usize::MAX),
            stream,
        })
    }
}

/// Runs the kept sends and receives, one grouped send/recv per communicator: the ranks exchange
/// what each sends and receives, every rank builds the same list of transfers from it
/// ([`matched_transfers`]), and enqueues its ends on the group's stream.
///
/// # Safety
/// The kept calls' contracts: live communicators, device buffers of their lengths, live streams.
unsafe fn flush() -> Result<(), Failure> {
    let pending = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    let mut comms: Vec<ncclComm_t> = Vec::new();
    for op in &pending {
        if !comms.contains(&op.comm) {
            comms.push(op.comm);
        }
    }
    // In an order every rank shares (each exchange waits for every rank of its communicator).
    // SAFETY: our caller's contract: live handles (checked for null when kept).
    comms.sort_by_key(|&c| unsafe { c.as_ref() }.map_or(0, |c| c.job));
    for handle in comms {
        let ops: Vec<&PointToPoint> = pending.iter().filter(|op| op.comm == handle).collect();
        // SAFETY: our caller's contract, passed on.
        unsafe { flush_one(handle, &ops) }?;
    }
    Ok(())
}

/// [`flush`] for one communicator's `ops`.
///
/// # Safety
/// As for [`flush`].
unsafe fn flush_one(handle: ncclComm_t, ops: &[&PointToPoint]) -> Result<(), Failure> {
    fallback::log("ncclSend/ncclRecv", "ringreduce");
    let (stream, datatype) = (ops[0].stream, ops[0].datatype);
    // A group this rank cannot run is still exchanged (flagged), so that its peers fail at once
    // with it instead of waiting for it at the timeout.
    let uniform = ops
        .iter()
        .all(|op| op.stream == stream && op.datatype == datatype);
    // SAFETY: our caller's contract.
    let comm = unsafe { comm_ref(handle) }?;
    let mut words = vec![u64::from(uniform), datatype as u64];
    words.extend(
        ops.iter()
            .flat_map(|op| [u64::from(op.send), op.peer as u64, op.count as u64]),
    );
    let mut records = comm.with(|c| c.exchange(&words).map_err(Failure::from))?;
    if let Some(q) = records.iter().position(|r| r.first() != Some(&1)) {
        return Err(unsupported(format!(
            "rank {q}'s group of sends and receives mixes streams or data types on one \
             communicator, which ringreduce-nccl does not run"
        )));
    }
    if let Some(q) = records
        .iter()
        .position(|r| r.get(1) != Some(&(datatype as u64)))
    {
        return Err(unsupported(format!(
            "rank {q} sends or receives another data type in this group"
        )));
    }
    for record in &mut records {
        record.drain(..2);
    }
    let transfers = matched_transfers(&records)?;
    // SAFETY: our caller's contract: a live stream.
    let stream = unsafe { CallerStream::from_raw(stream.cast()) }?;
    let me = comm.rank;
    // This rank's sends in the list's order are its sends in call order; its receives in the
    // list's order: the k-th transfer from rank p to this rank is its k-th receive from p.
    let sends: Vec<(u64, usize)> = ops
        .iter()
        .filter(|op| op.send)
        .map(|op| (op.address, op.count))
        .collect();
    let mut taken = vec![0usize; comm.world];
    let mut recvs = Vec::new();
    for t in transfers.iter().filter(|t| t.to == me) {
        let from_p: Vec<&&PointToPoint> = ops
            .iter()
            .filter(|op| !op.send && op.peer == t.from)
            .collect();
        recvs.push((from_p[taken[t.from]].address, t.count));
        taken[t.from] += 1;
    }
    macro_rules! typed {
        ($($d:ident => $t:ty),*) => {
            match dtype_of(datatype)? {
                // SAFETY: our caller's contract, passed on.
                $(DType::$d => unsafe {
                    send_recv::<$t>(comm, &transfers, &sends, &recvs, stream)
                },)*
            }
        };
    }
    typed!(F16 => half::f16, BF16 => half::bf16, F32 => f32, F64 => f64, I8 => i8,
           U8 => u8, I32 => i32, U32 => u32, I64 => i64, U64 => u64,
               F8E4M3 => ringreduce::F8E4M3, F8E5M2 => ringreduce::F8E5M2)
}

/// Enqueues this rank's ends of `transfers`: `sends` and `recvs` as (address, count), in the
/// list's order.
///
/// # Safety
/// As for [`flush`].
unsafe fn send_recv<T: Element>(
    comm: &Comm,
    transfers: &[ringreduce::Transfer],
    sends: &[(u64, usize)],
    recvs: &[(u64, usize)],
    stream: CallerStream,
) -> Result<(), Failure> {
    // SAFETY: the kept calls' contracts: device memory of these lengths on this GPU.
    let mem =
        |&(addr, len): &(u64, usize)| unsafe { DeviceMemory::<T>::new(addr, len, comm.device) };
    let send_mem: Vec<DeviceMemory<T>> = sends.iter().map(mem).collect();
    let mut recv_mem: Vec<DeviceMemory<T>> = recvs.iter().map(mem).collect();
    let send_refs: Vec<&DeviceMemory<T>> = send_mem.iter().collect();
    let mut recv_refs: Vec<&mut DeviceMemory<T>> = recv_mem.iter_mut().collect();
    comm.with(|c| {
        // SAFETY: our caller's contract, passed on.
        unsafe { c.enqueue_send_recv_on_raw(transfers, &send_refs, &mut recv_refs, stream) }
            .map_err(Failure::from)
    })
}

/// The transfers of a group of sends and receives, from every rank's record (by rank: triples
/// of (is a send, peer, count) in call order): every send, by sender and in its call order;
/// each receive must match the send aimed at it from its peer, in order and by count.
fn matched_transfers(records: &[Vec<u64>]) -> Result<Vec<ringreduce::Transfer>, Failure> {
    let ops = |rank: usize| {
        records[rank]
            .chunks(3)
            .map(|w| (w[0] == 1, w[1] as usize, w[2] as usize))
    };
    let mut transfers = Vec::new();
    for from in 0..records.len() {
        for (send, to, count) in ops(from) {
            if send {
                transfers.push(ringreduce::Transfer { from, to, count });
            }
        }
    }
    for to in 0..records.len() {
        for from in 0..records.len() {
            let sent: Vec<usize> = transfers
                .iter()
                .filter(|t| t.from == from && t.to == to)
                .map(|t| t.count)
                .collect();
            let received: Vec<usize> = ops(to)
                .filter(|&(send, peer, _)| !send && peer == from)
                .map(|(_, _, count)| count)
                .collect();
            if sent != received {
                return Err(unsupported(format!(
                    "rank {from} sends {sent:?} elements to rank {to}, which receives \
                     {received:?} from it: every send needs its receive, in order and of its \
                     count"
                )));
            }
        }
    }
    Ok(transfers)
}

/// `ncclGroupStart`: collectives inside a group are enqueued as they are called (one rank per
/// process: nothing waits for the group's end); sends and receives wait for it.
#[no_mangle]
pub extern "C" fn ncclGroupStart() -> ncclResult_t {
    let started = group_of_nccl(c"ncclGroupStart");
    if started == ncclSuccess {
        GROUP_DEPTH.with(|d| d.set(d.get() + 1));
    }
    started
}

/// NCCL's own group call, when NCCL runs communicators of this process (its grouped calls on
/// them need it); success otherwise.
fn group_of_nccl(name: &CStr) -> ncclResult_t {
    if !fallback::made_any() {
        return ncclSuccess;
    }
    type F = unsafe extern "C" fn() -> ncclResult_t;
    // SAFETY: NCCL's documented signature for both group calls.
    match unsafe { real::<F>(name) } {
        // SAFETY: as above.
        Ok(f) => unsafe { f() },
        Err(code) => code,
    }
}

/// `ncclGroupEnd`.
#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> ncclResult_t {
    // The group closes here whatever NCCL's own end says; the first failure is returned.
    let nccl = group_of_nccl(c"ncclGroupEnd");
    let ours = guarded(|| {
        GROUP_DEPTH.with(|d| match d.get() {
            0 => Err(Failure::Nccl(
                ncclInvalidUsage,
                "ncclGroupEnd without ncclGroupStart".into(),
            )),
            1 => {
                d.set(0);
                // SAFETY: the kept calls' contracts (NCCL's for each send and receive).
                unsafe { flush() }
            }
            n => {
                d.set(n - 1);
                Ok(())
            }
        })
    });
    match nccl {
        ncclSuccess => ours,
        failed => failed,
    }
}

/// `ncclGroupSimulateEnd`: ends the group like `ncclGroupEnd` but launches nothing, and fills
/// in NCCL's estimate of its time — in NCCL's order: the group level closes first, whatever
/// follows; at the outermost level a null `simInfo` makes it a plain `ncclGroupEnd`. The estimate
/// is NCCL's to make: with NCCL's communicators only, NCCL answers. With ringreduce's, whose
/// collectives run when called (a simulated group's collectives have run, and written their
/// buffers, by the time it ends), the group's kept sends and receives are dropped — a simulation
/// launches nothing — and the call says it cannot estimate (`ncclInvalidUsage`).
#[no_mangle]
pub unsafe extern "C" fn ncclGroupSimulateEnd(sim_info: *mut ncclSimInfo_t) -> ncclResult_t {
    if sim_info.is_null() {
        return ncclGroupEnd();
    }
    let nccl = if fallback::made_any() {
        type F = unsafe extern "C" fn(*mut ncclSimInfo_t) -> ncclResult_t;
        // SAFETY: NCCL's documented signature; the caller's struct.
        match unsafe { real::<F>(c"ncclGroupSimulateEnd") } {
            // SAFETY: as above.
            Ok(f) => unsafe { f(sim_info) },
            Err(code) => code,
        }
    } else {
        ncclSuccess
    };
    let ours = guarded(|| {
        let outermost = GROUP_DEPTH.with(|d| match d.get() {
            0 => Err(Failure::Nccl(
                ncclInvalidUsage,
                "ncclGroupSimulateEnd without ncclGroupStart".into(),
            )),
            n => {
                d.set(n - 1);
                Ok(n == 1)
            }
        })?;
        if !outermost {
            return Ok(());
        }
        let kept = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut())).len();
        // SAFETY: checked non-null above; NCCL's contract: an initialized ncclSimInfo_t.
        if unsafe { (*sim_info).magic } != NCCL_SIM_INFO_MAGIC {
            return Err(invalid(
                "simInfo was not initialized with NCCL_SIM_INFO_INITIALIZER",
            ));
        }
        if kept > 0 || !fallback::made_any() {
            return Err(unsupported(
                "ringreduce-nccl cannot estimate a group's time (ncclGroupSimulateEnd): its collectives run when called",
            ));
        }
        Ok(())
    });
    match nccl {
        ncclSuccess => ours,
        failed => failed,
    }
}

/// `ncclRedOpCreatePreMulSum`: refused by name (not run yet).
#[no_mangle]
pub unsafe extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut ncclRedOp_t,
    scalar: *mut c_void,
    datatype: ncclDataType_t,
    residence: c_int,
    comm: ncclComm_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclRedOpCreatePreMulSum",
        fn(*mut ncclRedOp_t, *mut c_void, ncclDataType_t, c_int, *mut c_void),
        |real| (op, scalar, datatype, residence, real)
    );
    guarded(|| {
        Err(unsupported(
            "ncclRedOpCreatePreMulSum is not run by ringreduce-nccl yet",
        ))
    })
}

/// `ncclRedOpDestroy`: no custom operator exists to destroy.
#[no_mangle]
pub unsafe extern "C" fn ncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclRedOpDestroy",
        fn(ncclRedOp_t, *mut c_void),
        |real| (op, real)
    );
    guarded(|| {
        Err(invalid(format!(
            "reduction operator {op} was not made here"
        )))
    })
}

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
/// why; a registration that fails because the job failed returns the error. The flags
/// (`NCCL_WIN_COLL_SYMMETRIC`) change nothing here.
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
        // SAFETY: NCCL's contract for windows: deregistered (every rank's
        // ncclCommWindowDeregister returned) before the memory is freed.
        let registered = c.with(|rank| Ok(unsafe { rank.register(&memory) }));
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
        Ok(())
    })
}

/// A window of `ncclCommWindowRegister`: the registration, or none where ringreduce refused
/// the memory.
struct Window(Option<ringreduce::Registration>);

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
        // SAFETY: a window from ncclCommWindowRegister, released once (NCCL's contract).
        let window = unsafe { Box::from_raw(win.cast::<Window>()) };
        match window.0 {
            Some(registration) => c.with(|rank| Ok(rank.deregister(registration)?)),
            None => Ok(()),
        }
    })
}

/// Not NCCL's: how many of `comm`'s calls ran on registered memory (its windows) without copies
/// ([`ringreduce::RankCommunicator::registered_calls`]) — for a Rust program or test that
/// wants to know whether its windows took effect; `None` for a communicator of the real NCCL
/// or one that was aborted.
///
/// # Safety
/// `comm` is null or a handle from `ncclCommInitRank*` not yet destroyed.
pub unsafe fn registered_calls(comm: ncclComm_t) -> Option<u64> {
    // SAFETY: our caller's contract.
    let c = unsafe { comm_ref(comm) }.ok()?;
    c.with(|rank| Ok(rank.registered_calls())).ok()
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
static ALLOCATIONS: Mutex<Vec<ringreduce::device::DeviceBuffer>> = Mutex::new(Vec::new());

#[cfg(test)]
mod tests {
    use super::*;
    use ringreduce::Error;

    #[test]
    fn every_result_code_has_its_own_text() {
        let texts: Vec<String> = (0..ncclNumResults)
            .map(|code| {
                // SAFETY: static, NUL-terminated texts.
                unsafe { CStr::from_ptr(ncclGetErrorString(code)) }
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        let mut distinct = texts.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), texts.len(), "{texts:?}");
    }

    #[test]
    fn sends_and_receives_become_one_list_of_transfers_every_rank_builds_alike() {
        // Three ranks: a ring of sends (r to r+1), and rank 0 also sends twice to rank 2.
        let records = vec![
            vec![1, 1, 10, 0, 2, 30, 1, 2, 5, 1, 2, 6],
            vec![1, 2, 20, 0, 0, 10],
            vec![1, 0, 30, 0, 1, 20, 0, 0, 5, 0, 0, 6],
        ];
        let got: Vec<(usize, usize, usize)> = matched_transfers(&records)
            .unwrap()
            .iter()
            .map(|t| (t.from, t.to, t.count))
            .collect();
        assert_eq!(
            got,
            vec![(0, 1, 10), (0, 2, 5), (0, 2, 6), (1, 2, 20), (2, 0, 30)]
        );
        // Rank 2 receives 6 then 5 from rank 0: out of order, refused by name.
        let mut swapped = records.clone();
        swapped[2] = vec![1, 0, 30, 0, 1, 20, 0, 0, 6, 0, 0, 5];
        let Err(Failure::Nccl(code, message)) = matched_transfers(&swapped) else {
            panic!("a mismatch accepted");
        };
        assert_eq!(code, ncclInvalidUsage);
        assert!(
            message.contains("rank 0 sends [5, 6] elements to rank 2"),
            "{message}"
        );
        // A send nobody receives.
        let mut lonely = records;
        lonely[1] = vec![1, 2, 20, 0, 0, 10, 1, 0, 4];
        assert!(matched_transfers(&lonely).is_err());
    }

    #[test]
    fn errors_map_to_nccls_codes() {
        let cases = [
            (
                Error::NoGpu {
                    reason: "none".into(),
                },
                ncclUnhandledCudaError,
            ),
            (Error::InvalidArgument("x".into()), ncclInvalidArgument),
            (
                Error::RankFailed {
                    rank: 1,
                    during: "a call".into(),
                    message: "gone".into(),
                },
                ncclRemoteError,
            ),
            (Error::Internal { what: "x".into() }, ncclInternalError),
            (Error::Resource { what: "x".into() }, ncclSystemError),
        ];
        for (err, code) in cases {
            assert_eq!(status::code_of(&err), code, "{err}");
            let broken = Error::CommunicatorFailed(Box::new(err.clone()));
            assert_eq!(status::code_of(&broken), code, "{broken}");
        }
    }
}
