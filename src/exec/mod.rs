//! Executors: run a checked plan on host threads or on GPUs.
pub mod cuda;
