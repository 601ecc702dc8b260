//! NCCL's initialization calls on ringreduce: the version, the unique id, a rank joining its job
//! (`ncclCommInitRank*`), the end of a communicator (finalize, destroy, abort) and what it says
//! of itself (count, device, rank). Communicators made from others: module `subcomm`.

use crate::*;
use ringreduce::exec::config::MAX_TIMEOUT;

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
        // SAFETY: null or an initialized config (NCCL's contract).
        unsafe { check_config(config) }?;
        let bytes: Vec<u8> = comm_id.internal.iter().map(|&b| b as u8).collect();
        let id = UniqueId::from_bytes(&bytes)?;
        let device = ringreduce::device::current_device()?;
        let config = config_from_env()?;
        let (rank, world) = (rank as usize, nranks as usize);
        let inner = RankCommunicator::gpu(&id, rank, world, device, config)?;
        let handle = Comm::ours(inner, device, job_of(&bytes))?;
        // SAFETY: checked non-null above; NCCL's contract: a writable ncclComm_t.
        unsafe { *comm = Box::into_raw(handle) };
        Ok(())
    })
}

/// A config as NCCL passes it: null, or initialized with `NCCL_CONFIG_INITIALIZER`.
///
/// # Safety
/// `config` is null or points at an `ncclConfig_t`-sized readable struct.
pub(crate) unsafe fn check_config(config: *const ncclConfig_t) -> Result<(), Failure> {
    // SAFETY: our caller's contract.
    match unsafe { config.as_ref() } {
        Some(c) if c.magic != NCCL_CONFIG_MAGIC || c.size < std::mem::size_of::<ncclConfig_t>() => {
            Err(invalid(
                "the config was not initialized with NCCL_CONFIG_INITIALIZER",
            ))
        }
        _ => Ok(()),
    }
}

/// A number the same on every rank of a communicator, from what they share (its id's bytes):
/// FNV-1a.
pub(crate) fn job_of(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Calls NCCL's `name` on its communicator alone (destroy, abort).
pub(crate) fn forward_one(name: &CStr, real_comm: NcclComm) -> Result<(), Failure> {
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
                // returns at once, as does one waiting on a pair's communicator.
                abort.abort();
                if let Some(pairs) = &comm.pairs {
                    pairs.abort();
                }
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

/// Writes one number of a communicator.
pub(crate) unsafe fn answer(
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

/// The configuration of every communicator this library makes, from the environment:
/// `RINGREDUCE_NCCL_ALLOW_SHARED_GPU=1` lets ranks share a GPU; the LL one-shot
/// ([`CudaConfig::low_latency`]) runs all-reduces up to 64 KiB a rank, as NCCL's LL protocol
/// runs small messages — one launch a call, no copy of the caller's buffers
/// (`RINGREDUCE_NCCL_LL=0`: the read one-shot, which copies them); `RINGREDUCE_NCCL_TIMEOUT`
/// (seconds) gives every call a deadline; sends and receives run on the
/// point-to-point channel ([`CudaConfig::peer_groups`]) unless `RINGREDUCE_NCCL_CHANNEL=0`.
/// Without a timeout there is none (NCCL has none: a peer that
/// comes an hour late is waited for, and a hung one is the framework's watchdog's to judge, which
/// ends it with `ncclCommAbort`); a peer whose process is gone is still named at once.
/// Technically "none" is ringreduce's longest deadline, a week ([`MAX_TIMEOUT`]).
pub(crate) fn config_from_env() -> Result<CudaConfig, Failure> {
    let timeout = match std::env::var("RINGREDUCE_NCCL_TIMEOUT") {
        Err(_) => MAX_TIMEOUT,
        Ok(text) => timeout_of(&text)?,
    };
    Ok(CudaConfig {
        allow_shared_device: std::env::var("RINGREDUCE_NCCL_ALLOW_SHARED_GPU")
            .is_ok_and(|v| v == "1"),
        timeout,
        low_latency: std::env::var("RINGREDUCE_NCCL_LL").map_or(true, |v| v != "0"),
        peer_groups: std::env::var("RINGREDUCE_NCCL_CHANNEL").map_or(true, |v| v != "0"),
        ..CudaConfig::default()
    })
}

/// `RINGREDUCE_NCCL_TIMEOUT`'s value: seconds, more than zero, at most [`MAX_TIMEOUT`].
fn timeout_of(text: &str) -> Result<std::time::Duration, Failure> {
    text.trim()
        .parse::<f64>()
        .ok()
        .and_then(|secs| std::time::Duration::try_from_secs_f64(secs).ok())
        .filter(|t| !t.is_zero() && *t <= MAX_TIMEOUT)
        .ok_or_else(|| {
            invalid(format!(
                "RINGREDUCE_NCCL_TIMEOUT={text:?}: seconds, more than zero and at most {}",
                MAX_TIMEOUT.as_secs()
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeout_is_seconds_and_bounded() {
        assert_eq!(
            timeout_of("75").ok(),
            Some(std::time::Duration::from_secs(75))
        );
        assert_eq!(
            timeout_of(" 0.5 ").ok(),
            Some(std::time::Duration::from_millis(500))
        );
        for bad in ["0", "-1", "soon", "", "1e12", "NaN"] {
            assert!(timeout_of(bad).is_err(), "{bad}");
        }
    }
}
