//! ringreduce
pub mod check;
pub mod element;
pub mod error;
pub mod exec;
pub mod plan;

pub use element::{DType, Element, ReduceOp};
pub use error::{Error, Result};
