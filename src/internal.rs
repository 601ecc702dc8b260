//! **Not part of the API.** The one path into the crate's internals, for its own GPU tests: the
//! kernel module and its raw launchers (`unsafe`, nothing validated), so that a test can launch
//! one peer kernel alone and watch what it does. Hidden from the docs; may change in any
//! release. A user never needs it: every kernel runs through a [`crate::Communicator`].

pub use crate::exec::cuda::kernels;
