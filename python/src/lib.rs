//! # ringreduce for Python: the extension module `ringreduce._native`
//!
//! The Python package (python/ringreduce/, documented in its `__init__.py` and in
//! python/README.md) is the API; this crate is its engine, built with PyO3 for CPython's stable
//! ABI (abi3, CPython ≥ 3.9: one build for every version, and no torch C++ ABI — torch is met
//! only through Python, in ringreduce/torch.py). What lives where:
//!
//! | file | what it does |
//! |---|---|
//! | `communicator.rs` | one rank of a job (the core's `RankCommunicator`): host buffers, or device addresses on a raw CUDA stream; the interpreter released during every call |
//! | `buffer.rs` | Python objects' memory through the buffer protocol, checked: type, contiguity, alignment, writability |
//! | `layout.rs` | in place or out of place, from the `x` and `out` a call was given (NCCL's rule) |
//! | `dtype.rs` | element types by name and by format character; the one dispatch to the core's generic calls |
//! | `unique_id.rs` | `UniqueId`: where the ranks meet |
//! | `errors.rs` | the core's `Error` as `ringreduce.Error`'s subclasses |
//!
//! Nothing here panics on a caller's input: every refusal is a `ringreduce.ArgumentError`, and
//! a panic inside the core becomes `ringreduce.InternalError` (never an abort).

mod arguments;
mod buffer;
mod communicator;
mod dtype;
mod errors;
mod layout;
mod unique_id;

use pyo3::prelude::*;

/// The extension module: `UniqueId` and `Communicator` (wrapped by the Python package).
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<unique_id::UniqueId>()?;
    m.add_class::<communicator::Communicator>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
