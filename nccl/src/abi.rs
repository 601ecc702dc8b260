//! NCCL's C types, bit for bit, written from NCCL's documented API (its user guide's "Types"
//! and "Communicator creation" pages): result codes, data types, reduction operators, the
//! 128-byte unique id, the communicator handle and the configuration's leading fields.

#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

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

/// `cudaStream_t` (the runtime's name for a driver `CUstream`).
pub type cudaStream_t = cudarc_stream;
/// A driver stream handle, as `cudaStream_t` carries it.
pub type cudarc_stream = *mut std::ffi::c_void;

/// The NCCL version this library reports without a real NCCL beside it (NCCL ≥ 2.9's encoding:
/// major·10000 + minor·100 + patch): the release whose API the declarations follow.
pub const VERSION_CODE: c_int = 2 * 10000 + 28 * 100;

/// The magic number of an initialized `ncclSimInfo_t` (`NCCL_SIM_INFO_INITIALIZER`).
pub const NCCL_SIM_INFO_MAGIC: c_uint = 0x7468_5283;

/// `ncclSimInfo_t`: what `ncclGroupSimulateEnd` fills in.
#[repr(C)]
pub struct ncclSimInfo_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub estimatedTime: f32,
}
