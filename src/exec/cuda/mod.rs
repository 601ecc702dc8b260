//! The CUDA executor.
pub mod device;
pub mod kernels;
