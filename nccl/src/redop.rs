//! NCCL's custom reduction operators: `ncclRedOpCreatePreMulSum` makes one (each rank's input
//! multiplied by a factor, then summed), a collective of its communicator and type runs it
//! ([`ringreduce::RankCommunicator::enqueue_premul_sum`]), `ncclRedOpDestroy` ends it.
//!
//! An operator's handle is `ncclNumOps + i`, `i` its slot in [`MADE`]. Callers do not always
//! check what creation returns (PyTorch does not), so a creation that fails on a ringreduce
//! communicator still hands out a handle when it can — one whose every use fails with the
//! reason — never a handle that means another operator (a left-over 0 is `ncclSum`).

use crate::*;
use ringreduce::PreMul;

/// `ncclScalarDevice` and `ncclScalarHostImmediate` (`ncclScalarResidence_t`).
const SCALAR_DEVICE: c_int = 0;
const SCALAR_HOST_IMMEDIATE: c_int = 1;

/// NCCL's count of built-in operators: the first handle of a made one.
const FIRST_MADE: ncclRedOp_t = 5;

/// One operator `ncclRedOpCreatePreMulSum` made: for which communicator and type, and its
/// factor — or why it could not be made.
struct Made {
    comm: usize,
    datatype: ncclDataType_t,
    factor: Result<PreMul, String>,
}

/// Every operator made and not destroyed, by slot.
static MADE: Mutex<Vec<Option<Made>>> = Mutex::new(Vec::new());

/// Keeps `made` in a free slot: its handle.
fn keep(made: Made) -> ncclRedOp_t {
    let mut all = MADE.lock().unwrap_or_else(|p| p.into_inner());
    let slot = match all.iter().position(Option::is_none) {
        Some(slot) => slot,
        None => {
            all.push(None);
            all.len() - 1
        }
    };
    all[slot] = Some(made);
    FIRST_MADE + slot as ncclRedOp_t
}

/// The slot of handle `op`, if it is one of ours.
fn slot_of(op: ncclRedOp_t) -> Option<usize> {
    usize::try_from(op.checked_sub(FIRST_MADE)?).ok()
}

/// The factor of operator `op` for a call on `comm` of `datatype` elements: the operator must
/// be one made for both.
pub(crate) fn premul_of(
    comm: ncclComm_t,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
) -> Result<PreMul, Failure> {
    let all = MADE.lock().unwrap_or_else(|p| p.into_inner());
    let made = slot_of(op)
        .and_then(|slot| all.get(slot))
        .and_then(Option::as_ref)
        .ok_or_else(|| {
            invalid(format!(
                "reduction operator {op} is not one of NCCL's or made"
            ))
        })?;
    if made.comm != comm as usize {
        return Err(invalid(format!(
            "reduction operator {op} was made for another communicator"
        )));
    }
    if made.datatype != datatype {
        return Err(invalid(format!(
            "reduction operator {op} was made for data type {}, and the call passes {datatype}",
            made.datatype
        )));
    }
    made.factor.clone().map_err(|why| {
        unsupported(format!(
            "reduction operator {op}: its ncclRedOpCreatePreMulSum failed ({why})"
        ))
    })
}

/// The factor of a PreMulSum as NCCL passes it: one element of `datatype` at `scalar`, in host
/// memory (read now) or device memory (read by each call's kernel).
///
/// # Safety
/// `scalar` is null or points at one element of `datatype` in the memory `residence` says.
unsafe fn factor_of(
    scalar: *mut c_void,
    datatype: ncclDataType_t,
    residence: c_int,
) -> Result<PreMul, String> {
    let bytes = dtype_of(datatype).map_err(|_| format!("unknown data type {datatype}"))?;
    let bytes = bytes.size_bytes();
    if scalar.is_null() {
        return Err("the scalar is null".into());
    }
    match residence {
        SCALAR_HOST_IMMEDIATE => {
            let mut word = [0u8; 8];
            // SAFETY: our caller's contract: one element (at most 8 bytes) readable at `scalar`.
            unsafe { std::ptr::copy_nonoverlapping(scalar.cast::<u8>(), word.as_mut_ptr(), bytes) };
            Ok(PreMul::Host(u64::from_le_bytes(word)))
        }
        SCALAR_DEVICE if (scalar as usize) % bytes == 0 => Ok(PreMul::Device(scalar as u64)),
        SCALAR_DEVICE => Err(format!("the device scalar at {scalar:?} is misaligned")),
        other => Err(format!("unknown scalar residence {other}")),
    }
}

/// `ncclRedOpCreatePreMulSum`: an operator that multiplies each rank's input by the scalar,
/// then sums (module doc). Every floating and integer type.
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
        // SAFETY: null is refused; otherwise NCCL's contract: a writable ncclRedOp_t.
        let out = unsafe { op.as_mut() }.ok_or_else(|| invalid("op is null"))?;
        // SAFETY: our caller's contract.
        let factor = match unsafe { comm_ref(comm) } {
            // SAFETY: NCCL's contract: one element of `datatype` where `residence` says.
            Ok(_) => unsafe { factor_of(scalar, datatype, residence) },
            Err(_) => Err("the communicator is null".into()),
        };
        let failed = factor.clone().err();
        *out = keep(Made {
            comm: comm as usize,
            datatype,
            factor,
        });
        match failed {
            None => Ok(()),
            Some(why) => Err(invalid(format!("ncclRedOpCreatePreMulSum: {why}"))),
        }
    })
}

/// `ncclRedOpDestroy`: ends an operator `ncclRedOpCreatePreMulSum` made for `comm`.
#[no_mangle]
pub unsafe extern "C" fn ncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclRedOpDestroy",
        fn(ncclRedOp_t, *mut c_void),
        |real| (op, real)
    );
    guarded(|| {
        // SAFETY: our caller's contract.
        unsafe { comm_ref(comm) }?;
        forget(op, comm as usize)
    })
}

/// Ends operator `op` of communicator `comm` (its slot freed for the next one made).
fn forget(op: ncclRedOp_t, comm: usize) -> Result<(), Failure> {
    let mut all = MADE.lock().unwrap_or_else(|p| p.into_inner());
    match slot_of(op).and_then(|slot| all.get_mut(slot)) {
        Some(slot) if slot.as_ref().is_some_and(|m| m.comm == comm) => {
            *slot = None;
            Ok(())
        }
        _ => Err(invalid(format!(
            "reduction operator {op} was not made for this communicator"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_made_operator_is_found_for_its_communicator_and_type_only() {
        let comm = 0x1000 as ncclComm_t;
        let other = 0x2000 as ncclComm_t;
        let half: f32 = 0.5;
        // SAFETY: one f32 in host memory.
        let factor = unsafe {
            factor_of(
                (&half as *const f32).cast_mut().cast(),
                ncclFloat32,
                SCALAR_HOST_IMMEDIATE,
            )
        };
        assert_eq!(factor, Ok(PreMul::Host(u64::from(0.5f32.to_bits()))));
        let op = keep(Made {
            comm: comm as usize,
            datatype: ncclFloat32,
            factor,
        });
        assert!(op >= FIRST_MADE);
        assert_eq!(
            premul_of(comm, ncclFloat32, op).ok(),
            Some(PreMul::Host(u64::from(0.5f32.to_bits())))
        );
        assert!(premul_of(other, ncclFloat32, op).is_err());
        assert!(premul_of(comm, ncclFloat16, op).is_err());
        assert!(forget(op, other as usize).is_err());
        assert!(forget(op, comm as usize).is_ok());
        assert!(premul_of(comm, ncclFloat32, op).is_err());
    }

    #[test]
    fn a_failed_creation_hands_out_an_operator_that_fails_every_call() {
        let comm = 0x3000 as ncclComm_t;
        // SAFETY: a null scalar is refused before it is read.
        let factor = unsafe { factor_of(std::ptr::null_mut(), ncclFloat32, SCALAR_DEVICE) };
        assert!(factor.is_err());
        let op = keep(Made {
            comm: comm as usize,
            datatype: ncclFloat32,
            factor,
        });
        let err = premul_of(comm, ncclFloat32, op).unwrap_err();
        assert!(format!("{err:?}").contains("scalar is null"), "{err:?}");
        // A device scalar is kept by address; a misaligned one is refused.
        // SAFETY: device scalars are not read here.
        let at = unsafe { factor_of(0x1002 as *mut c_void, ncclFloat32, SCALAR_DEVICE) };
        assert!(at.is_err());
        // SAFETY: as above.
        let at = unsafe { factor_of(0x1004 as *mut c_void, ncclFloat32, SCALAR_DEVICE) };
        assert_eq!(at, Ok(PreMul::Device(0x1004)));
    }
}
