//! Code loaded into a context: a module image (a fatbin, or PTX from NVRTC) and its functions,
//! resolved once by name ([`load_module`], [`load_function`]), and the compute capability that
//! decides which code a device runs ([`compute_capability`]). Launching what they return is
//! [`launch_kernel`](super::launch_kernel)'s, in module `stream`.
//!
//! Invariant: like every function of the device layer, each returns the driver's failure as
//! [`Error::Cuda`](crate::Error::Cuda) through [`check`](super::check), never a cudarc panic.

use super::{guard, DriverResultExt};
use crate::error::Result;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;
use std::sync::Arc;

/// Loads `image` into `ctx` (`cuModuleLoadData`): an embedded fatbin or PTX.
pub fn load_module(ctx: &Arc<CudaContext>, image: Ptx) -> Result<Arc<CudaModule>> {
    guard("cuModuleLoadData", || {
        ctx.load_module(image).call("cuModuleLoadData")
    })
}

/// The function `symbol` of `module` (`cuModuleGetFunction`).
pub fn load_function(module: &Arc<CudaModule>, symbol: &str) -> Result<CudaFunction> {
    guard("cuModuleGetFunction", || {
        module.load_function(symbol).call("cuModuleGetFunction")
    })
}

/// The compute capability of `ctx`'s device as (major, minor) (`cuDeviceGetAttribute`).
pub fn compute_capability(ctx: &Arc<CudaContext>) -> Result<(i32, i32)> {
    guard("cuDeviceGetAttribute", || {
        ctx.compute_capability().call("cuDeviceGetAttribute")
    })
}
