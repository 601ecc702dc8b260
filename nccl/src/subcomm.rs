//! NCCL's calls that make communicators from others: `ncclCommSplit` (every rank calls it;
//! ringreduce's `RankCommunicator::split`) and `ncclCommShrink` (only the kept ranks call it;
//! module `pairs`), and how a communicator made that way is handed out or refused.

use crate::*;

/// `ncclCommSplit`: a communicator of the real NCCL is split by NCCL; one of ringreduce's by
/// ringreduce ([`RankCommunicator::split`]): every rank of `comm` calls it; the ranks of one
/// `color` get a new communicator ranked by `key` (ties by their rank in `comm`), a rank with
/// `NCCL_SPLIT_NOCOLOR` gets null. `config` is checked as at creation; its hints are ignored.
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
    fallback::log("ncclCommSplit", "ringreduce");
    guarded(|| {
        // SAFETY: null is refused; otherwise NCCL's contract: a writable ncclComm_t.
        let out = unsafe { newcomm.as_mut() }.ok_or_else(|| invalid("newcomm is null"))?;
        *out = std::ptr::null_mut();
        // SAFETY: our caller's contract.
        let parent = unsafe { comm_ref(comm) }?;
        let color = match color {
            NCCL_SPLIT_NOCOLOR => None,
            c => Some(u32::try_from(c).map_err(|_| {
                invalid(format!(
                    "color {c}: a color is at least 0, or NCCL_SPLIT_NOCOLOR"
                ))
            })?),
        };
        // SAFETY: null or an initialized config (NCCL's contract).
        unsafe { check_config(config) }?;
        let made = parent.with(|c| {
            c.split(color, key, config_from_env()?)
                .map_err(Failure::from)
        })?;
        if let Some(inner) = made {
            let turn = parent
                .splits
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            *out = Box::into_raw(Comm::ours(
                inner,
                parent.device,
                job_of(
                    &[
                        parent.job.to_le_bytes(),
                        turn.to_le_bytes(),
                        u64::from(color.unwrap_or(0)).to_le_bytes(),
                    ]
                    .concat(),
                ),
            )?);
        } else {
            parent
                .splits
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    })
}

/// `NCCL_SHRINK_ABORT` of `include/nccl.h`: abort the parent's operations before shrinking.
const SHRINK_ABORT: c_int = 0x01;

/// `ncclCommShrink`: a communicator of the real NCCL is shrunk by NCCL; one of ringreduce's by
/// ringreduce: the ranks not in `exclude_ranks` — only they call it — get a new communicator, in
/// their order (module `pairs`: the first of them hands its id to the others' mailboxes).
/// With `NCCL_SHRINK_ABORT` in `shrink_flags` the parent and its pair communicators are aborted
/// first, so that kernels still waiting for an excluded rank (a hung one) give up before the
/// new communicator is made (making it waits for this process's kernels in flight); with
/// `NCCL_SHRINK_DEFAULT` the parent is left as it is (NCCL asks it to be idle).
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
    fallback::log("ncclCommShrink", "ringreduce");
    guarded(|| {
        // SAFETY: null is refused; otherwise NCCL's contract: a writable ncclComm_t.
        let out = unsafe { newcomm.as_mut() }.ok_or_else(|| invalid("newcomm is null"))?;
        *out = std::ptr::null_mut();
        // SAFETY: our caller's contract.
        let parent = unsafe { comm_ref(comm) }?;
        // SAFETY: null or an initialized config (NCCL's contract).
        unsafe { check_config(config) }?;
        let excluded: &[c_int] = match (exclude_count, exclude_ranks.is_null()) {
            (0, _) => &[],
            (n, false) if n > 0 => {
                // SAFETY: NCCL's contract: `exclude_count` ranks at `exclude_ranks`.
                unsafe { std::slice::from_raw_parts(exclude_ranks, n as usize) }
            }
            (n, _) => return Err(invalid(format!("{n} excluded ranks at {exclude_ranks:?}"))),
        };
        if let Some(&r) = excluded
            .iter()
            .find(|&&r| usize::try_from(r).map_or(true, |r| r >= parent.world))
        {
            return Err(invalid(format!(
                "excluded rank {r} is not a rank of {}",
                parent.world
            )));
        }
        let kept: Vec<usize> = (0..parent.world)
            .filter(|&r| !excluded.contains(&(r as c_int)))
            .collect();
        let Some(pairs) = &parent.pairs else {
            return Err(unsupported(
                "ncclCommShrink of a communicator of one rank or across hosts is not run by \
                 ringreduce-nccl",
            ));
        };
        if !kept.contains(&parent.rank) {
            return Err(invalid(format!(
                "rank {} is excluded: it does not call ncclCommShrink",
                parent.rank
            )));
        }
        if shrink_flags & SHRINK_ABORT != 0 {
            if let Backend::Ring(_, abort) = &parent.backend {
                abort.abort();
            }
            pairs.abort_comms();
        }
        *out = Box::into_raw(pairs::shrink(parent, pairs, &kept)?);
        Ok(())
    })
}

/// Hands a communicator NCCL made from another (a split, a shrink) to the caller: wrapped, or
/// null where NCCL made none (a rank left out: `NCCL_SPLIT_NOCOLOR`, an excluded rank).
///
/// # Safety
/// `made` is null or a communicator NCCL just made; `newcomm` is null or writable.
pub(crate) unsafe fn hand_out(made: *mut c_void, newcomm: *mut ncclComm_t) -> ncclResult_t {
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
pub(crate) unsafe fn refuse_new(
    comm: ncclComm_t,
    newcomm: *mut ncclComm_t,
    call: &str,
) -> ncclResult_t {
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
