//! NCCL's C types, bit for bit, written from NCCL's documented API (its user guide's "Types"
//! and "Communicator creation" pages): the result codes, data types, operators and unique id
//! are ringreduce's (`ringreduce::exec::nccl::abi`, which calls NCCL too); here the
//! configuration's leading fields and what this library reports as its version.

#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

pub use ringreduce::exec::nccl::abi::*;
use std::ffi::{c_int, c_uint};

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

/// `ncclCommSplit`'s color of a rank that joins no new communicator.
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;

/// `ncclCommWindowRegister`'s flag: every rank's buffers in the window lie at the same offsets.
pub const NCCL_WIN_COLL_SYMMETRIC: c_int = 0x01;

/// `ncclWaitSignalDesc_t` (NCCL 2.29, `ncclWaitSignal`): how many signals to wait for from a
/// peer, on a signal index and context.
#[repr(C)]
pub struct ncclWaitSignalDesc_t {
    pub opCnt: c_int,
    pub peer: c_int,
    pub sigIdx: c_int,
    pub ctx: c_int,
}
