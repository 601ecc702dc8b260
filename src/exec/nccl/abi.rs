//! NCCL's C types, bit for bit, written from NCCL's documented API (its user guide's "Types"
//! page): result codes, data types, reduction operators and the 128-byte unique id — what
//! ringreduce needs to call NCCL ([`super`]) and what the NCCL-compatible library
//! (`ringreduce-nccl`) needs to stand in for it.

// Each constant is named as NCCL's documentation names it, and means what it says there.
#![allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    missing_docs
)]

use std::ffi::{c_char, c_int, c_uint};

/// `ncclResult_t`.
pub type ncclResult_t = c_int;
pub const ncclSuccess: ncclResult_t = 0;
pub const ncclUnhandledCudaError: ncclResult_t = 1;
pub const ncclSystemError: ncclResult_t = 2;
pub const ncclInternalError: ncclResult_t = 3;
pub const ncclInvalidArgument: ncclResult_t = 4;
pub const ncclInvalidUsage: ncclResult_t = 5;
pub const ncclRemoteError: ncclResult_t = 6;
pub const ncclInProgress: ncclResult_t = 7;
pub const ncclNumResults: ncclResult_t = 8;

/// `ncclDataType_t`.
pub type ncclDataType_t = c_int;
pub const ncclInt8: ncclDataType_t = 0;
pub const ncclUint8: ncclDataType_t = 1;
pub const ncclInt32: ncclDataType_t = 2;
pub const ncclUint32: ncclDataType_t = 3;
pub const ncclInt64: ncclDataType_t = 4;
pub const ncclUint64: ncclDataType_t = 5;
pub const ncclFloat16: ncclDataType_t = 6;
pub const ncclFloat32: ncclDataType_t = 7;
pub const ncclFloat64: ncclDataType_t = 8;
pub const ncclBfloat16: ncclDataType_t = 9;
pub const ncclFloat8e4m3: ncclDataType_t = 10;
pub const ncclFloat8e5m2: ncclDataType_t = 11;

/// `ncclRedOp_t`: the built-in operators; operators made by `ncclRedOpCreatePreMulSum` come
/// after them.
pub type ncclRedOp_t = c_int;
pub const ncclSum: ncclRedOp_t = 0;
pub const ncclProd: ncclRedOp_t = 1;
pub const ncclMax: ncclRedOp_t = 2;
pub const ncclMin: ncclRedOp_t = 3;
pub const ncclAvg: ncclRedOp_t = 4;

/// `NCCL_UNIQUE_ID_BYTES`.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

/// The magic number of an initialized `ncclConfig_t` (`NCCL_CONFIG_INITIALIZER`).
pub const NCCL_CONFIG_MAGIC: c_uint = 0xcafe_beef;
/// An integer field of `ncclConfig_t` left at NCCL's default (`NCCL_CONFIG_UNDEF_INT`).
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;

/// The leading fields of `ncclConfig_t`, common to every NCCL version that has the struct; its
/// `size` says how long the caller's is, and fields past these (2.28 has eight more:
/// include/nccl.h) are not read — they tune NCCL's own channels and kernels.
#[repr(C)]
pub struct ncclConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub blocking: c_int,
    pub cgaClusterSize: c_int,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub netName: *const c_char,
    pub splitShare: c_int,
}

/// Every data type, NCCL's code beside ringreduce's (the one table both directions read).
pub const DATA_TYPES: [(ncclDataType_t, crate::DType); 12] = {
    use crate::DType::*;
    [
        (ncclInt8, I8),
        (ncclUint8, U8),
        (ncclInt32, I32),
        (ncclUint32, U32),
        (ncclInt64, I64),
        (ncclUint64, U64),
        (ncclFloat16, F16),
        (ncclFloat32, F32),
        (ncclFloat64, F64),
        (ncclBfloat16, BF16),
        (ncclFloat8e4m3, F8E4M3),
        (ncclFloat8e5m2, F8E5M2),
    ]
};

/// NCCL's built-in operators beside ringreduce's.
pub const OPS: [(ncclRedOp_t, crate::ReduceOp); 5] = {
    use crate::ReduceOp::*;
    [
        (ncclSum, Sum),
        (ncclProd, Prod),
        (ncclMax, Max),
        (ncclMin, Min),
        (ncclAvg, Avg),
    ]
};

/// NCCL's code of `dtype`.
pub fn nccl_type(dtype: crate::DType) -> ncclDataType_t {
    DATA_TYPES
        .iter()
        .find(|(_, d)| *d == dtype)
        .map_or(ncclFloat32, |(code, _)| *code)
}

/// NCCL's code of `op`.
pub fn nccl_op(op: crate::ReduceOp) -> ncclRedOp_t {
    OPS.iter()
        .find(|(_, o)| *o == op)
        .map_or(ncclSum, |(code, _)| *code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_and_operator_has_one_code() {
        for dtype in crate::DType::ALL {
            let code = nccl_type(dtype);
            assert_eq!(DATA_TYPES.iter().filter(|(c, _)| *c == code).count(), 1);
            assert!(DATA_TYPES.contains(&(code, dtype)), "{dtype}");
        }
        for op in crate::ReduceOp::ALL {
            assert!(OPS.contains(&(nccl_op(op), op)), "{op}");
        }
    }
}
