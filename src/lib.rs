//! ringreduce
pub mod element;
pub mod error;
pub mod exec;

pub use element::{DType, Element, ReduceOp};
pub use error::{Error, Result};
