//! ringreduce
pub mod buffer;
pub mod check;
pub mod comm;
pub mod device;
pub mod element;
pub mod error;
pub mod exec;
pub mod plan;
pub mod topo;
pub mod verify;

pub use buffer::{Buffer, BufferMut, Placement};
pub use comm::{ring_allreduce, Communicator};
pub use element::{DType, Element, ReduceOp};
pub use error::{Error, Result};
pub use exec::cuda::{CudaConfig, EdgeInfo, GpuBuffer, GpuSlice, Transport};
pub use exec::host::{Fault, FaultKind, HostConfig};
pub use exec::Algorithm;
pub use plan::EdgeTransport;
