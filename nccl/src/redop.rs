//! NCCL's custom reduction operators (`ncclRedOpCreatePreMulSum`, `ncclRedOpDestroy`).

use crate::*;

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
