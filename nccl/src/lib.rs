//! NCCL's C API on ringreduce: `libringreduce_nccl.so`, whose soname is `libnccl.so.2`, so that a
//! program built against NCCL — PyTorch's ProcessGroupNCCL, vLLM's pynccl, nccl-tests — runs on
//! ringreduce unchanged, through `LD_PRELOAD` or a link named `libnccl.so.2` on its library path.
//!
//! Each communicator is one rank of a job with a process per GPU
//! ([`ringreduce::RankCommunicator::gpu`]): `ncclGetUniqueId` makes the id rank 0 hands to every
//! rank, `ncclCommInitRank` joins on the calling thread's current GPU, and every collective is
//! enqueued on the stream passed in, NCCL's in-place forms included (each rank may choose on its
//! own: `Call` says how). A call returns once enqueued, whatever the peers' processes are doing
//! (but for the few that nccl/README.md lists): every call's shape is checked by the GPUs before
//! any peer's memory is touched (the call gate), so mismatched calls are an error on every rank,
//! never a wrong result. Errors become NCCL's
//! codes with the message kept for `ncclGetLastError`; a panic never crosses into C.
//!
//! Sends and receives are kept until their group ends (run at once outside a group); then they
//! run as NCCL defines them but for one condition: a send meets its receive per (sender,
//! receiver) pair, in call order, and ranks not party to a transfer take no part (module
//! `pairs`: on three ranks or more, a communicator per pair, made at the pair's first transfer;
//! module `transfers`: a group as a list of transfers), and a pair's two ranks must group their
//! sends and receives to each other alike — NCCL does not ask that. That is the path of
//! communicators without a point-to-point channel (`RINGREDUCE_NCCL_CHANNEL=0`,
//! `RINGREDUCE_CALL_GATE=off`, more than 8 ranks, GPUs that do not all reach each other, a region
//! that could not be allocated, ranks across hosts); on the others, the default,
//! each group is one kernel of the core's point-to-point channel (module `p2p`), matched per
//! direction whatever either rank grouped. `ncclCommSplit` and `ncclCommShrink` make sub-communicators (modules
//! `subcomm`, `pairs`) and
//! `ncclRedOpCreatePreMulSum` operators (module `redop`). No call has a deadline unless
//! `RINGREDUCE_NCCL_TIMEOUT` gives one (NCCL has none); a peer whose process is gone is named at
//! once.
//!
//! Several ranks in one process (`ncclCommInitAll`) are the real NCCL's to run, when one is found
//! (module `fallback`): such a communicator, and any split of it, runs every call on NCCL; so
//! does every communicator with `RINGREDUCE_NCCL_FALLBACK=1`. On ringreduce's communicators what
//! it does not run yet is refused with `ncclInvalidUsage` and a message saying so — never a
//! wrong result: the device API (`ncclDevCommCreate`), `ncclGroupSimulateEnd`'s
//! estimate (nccl/README.md has the table of every function). A job on several hosts runs each
//! collective in two levels, the real NCCL between hosts (`RankCommunicator::gpu` does that by
//! itself). The fp8 types run with ringreduce's semantics (src/element.rs: f32 accumulation,
//! saturating rounding). `RINGREDUCE_NCCL_LOG=1` prints which side ran each kind of call.
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
    /// How many splits of this communicator were made (each rank counts the same).
    splits: std::sync::atomic::AtomicU64,
    /// The communicators of this rank's pairs, for point-to-point (module `pairs`).
    pairs: Option<pairs::Pairs>,
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
        splits: Default::default(),
        pairs: None,
        backend: Backend::Nccl(NcclComm(real_comm)),
    };
    fallback::mark_made();
    Ok(Box::into_raw(Box::new(handle)))
}

/// `ncclComm_t`.
#[allow(non_camel_case_types)]
pub type ncclComm_t = *mut Comm;

impl Comm {
    /// A handle of ringreduce's communicator `inner` on `device`, with its mailbox open for
    /// point-to-point (a collective step: every rank of a new communicator makes its handle).
    fn ours(mut inner: RankCommunicator, device: usize, job: u64) -> Result<Box<Comm>, Failure> {
        if inner.world() > 1 && inner.hosts().hosts == 1 && !inner.first_calls_alone() {
            fallback::log(
                "a communicator",
                "ringreduce, without arenas: a shape's first call waits for the peers' \
                 processes (RINGREDUCE_CALL_GATE=off, or 64 MiB a rank could not be had)",
            );
        }
        if inner.world() > 1 && inner.hosts().hosts == 1 && !inner.has_peer_groups() {
            fallback::log(
                "a communicator",
                "ringreduce, without the point-to-point channel: groups of sends and receives \
                 run as lists of transfers (RINGREDUCE_NCCL_CHANNEL=0, RINGREDUCE_CALL_GATE=off, \
                 more than 8 ranks, GPUs without peer access, or the region could not be had)",
            );
        }
        let pairs = pairs::Pairs::open(&mut inner)?;
        let abort = inner.abort_handle();
        Ok(Box::new(Comm {
            rank: inner.rank(),
            world: inner.world(),
            device,
            job,
            splits: Default::default(),
            pairs,
            backend: Backend::Ring(Box::new(Mutex::new(Some(inner))), abort),
        }))
    }

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

mod collectives;
mod device_pointers;
mod errors;
mod init;
mod management;
mod p2p;
mod pairs;
mod redop;
mod registration;
mod rma;
mod subcomm;
mod transfers;

pub use collectives::*;
pub use device_pointers::*;
pub use errors::*;
pub use init::*;
pub use management::*;
pub use p2p::*;
pub use redop::*;
pub use registration::*;
pub use rma::*;
pub use subcomm::*;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfers::matched_transfers;
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
    fn two_ranks_build_one_list_of_transfers_from_their_own_calls_alone() {
        let list = |me: usize, ops: &[(bool, usize)]| -> Vec<(usize, usize, usize)> {
            transfers::transfers_of_two(me, ops)
                .iter()
                .map(|t| (t.from, t.to, t.count))
                .collect()
        };
        // Rank 0 sends 10 then 30 and receives 20; rank 1 receives 10, sends 20, receives 30
        // (any interleaving of a rank's sends and receives).
        let zero = list(0, &[(true, 10), (false, 20), (true, 30)]);
        let one = list(1, &[(false, 10), (true, 20), (false, 30)]);
        assert_eq!(zero, vec![(0, 1, 10), (0, 1, 30), (1, 0, 20)]);
        assert_eq!(zero, one);
        // A pipeline's single send and its receive.
        assert_eq!(list(1, &[(true, 7)]), list(0, &[(false, 7)]));
        // Receives in another order, or of another count, than the sends: the lists differ
        // (so do the calls' shapes, which the call gate compares).
        assert_ne!(zero, list(1, &[(false, 30), (true, 20), (false, 10)]));
        assert_ne!(zero, list(1, &[(false, 10), (true, 20), (false, 31)]));
        assert_ne!(
            list(0, &[(true, 7)]),
            list(1, &[(true, 7)]),
            "both send first"
        );
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
            // A deadline passed: never "remote process exited".
            (
                Error::Timeout {
                    rank: 1,
                    waiting_on: "its peers".into(),
                    after: std::time::Duration::from_secs(1),
                },
                ncclSystemError,
            ),
            (
                Error::RanksMissing {
                    missing: vec![1],
                    after: std::time::Duration::from_secs(1),
                },
                ncclSystemError,
            ),
        ];
        for (err, code) in cases {
            assert_eq!(status::code_of(&err), code, "{err}");
            let broken = Error::CommunicatorFailed(Box::new(err.clone()));
            assert_eq!(status::code_of(&broken), code, "{broken}");
        }
    }
}
