//! The core's one error type as Python exceptions: one class per cause, under one base.
//!
//! The classes live in Python (`ringreduce/_errors.py`, where their docstrings are), so that
//! they can also derive from Python's own (`ringreduce.Timeout` is a `TimeoutError`,
//! `ringreduce.ArgumentError` a `ValueError`). Every failure of this module's calls is a
//! [`ringreduce::Error`] until it reaches Python — the module's own refusals of arguments are
//! `Error::InvalidArgument`, a panic caught in the core is `Error::Internal` — and [`to_python`]
//! is the one place it becomes an exception: the class for its variant ([`class_of`]), the core's
//! message, and the attributes `kind` (the variant's name) and `rank` (the rank it names, or
//! `None`). A `CommunicatorFailed` keeps the failure that broke the communicator as its
//! `__cause__`.

use pyo3::prelude::*;
use pyo3::types::PyTuple;
use ringreduce::Error;

/// A core error on its way to Python: what this module's functions return, so that `?` turns
/// it into the exception [`to_python`] makes.
#[derive(Debug)]
pub struct Failure(pub Error);

impl From<Error> for Failure {
    fn from(err: Error) -> Failure {
        Failure(err)
    }
}

impl From<Failure> for PyErr {
    fn from(failure: Failure) -> PyErr {
        Python::attach(|py| to_python(py, &failure.0))
    }
}

/// The module's own refusal of an argument: [`Error::InvalidArgument`], so
/// `ringreduce.ArgumentError` in Python.
pub fn argument(message: impl Into<String>) -> Failure {
    Failure(Error::InvalidArgument(message.into()))
}

/// The Python class (in `ringreduce._errors`) for `err`'s variant.
pub fn class_of(err: &Error) -> &'static str {
    match err {
        // A level of a hierarchical collective failed: the class of what failed there.
        Error::Level { source, .. } => class_of(source),
        Error::NoBuffers
        | Error::WorldMismatch { .. }
        | Error::LengthMismatch { .. }
        | Error::BufferLength { .. }
        | Error::BufferCount { .. }
        | Error::NoInPlace { .. }
        | Error::RootOutOfRange { .. }
        | Error::TransferOutOfRange { .. }
        | Error::OutputTooShort { .. }
        | Error::Overlap { .. }
        | Error::OutputsOverlap { .. }
        | Error::DuplicateDevice { .. }
        | Error::WrongDevice { .. }
        | Error::WrongPlacement { .. }
        | Error::SizeOverflow { .. }
        | Error::UnsupportedOp { .. }
        | Error::NoRanks
        | Error::TooManyRanks { .. }
        | Error::InvalidConfig { .. }
        | Error::InvalidArgument(_) => "ArgumentError",
        Error::Timeout { .. } | Error::RanksMissing { .. } => "Timeout",
        Error::RankFailed { .. } => "PeerLost",
        Error::CallMismatch { .. }
        | Error::WorldSizeMismatch { .. }
        | Error::DuplicateRank { .. }
        | Error::ConfigMismatch { .. } => "Mismatch",
        Error::CommunicatorFailed(_) => "CommunicatorFailed",
        Error::Closed => "Closed",
        Error::NoGpu { .. } => "NoGpu",
        Error::Cuda { .. } => "CudaError",
        Error::Internal { .. } | Error::PlanRejected(_) => "InternalError",
        // The rest (Resource, NoPeerAccess, NotCapturable, LaunchBlocked, HostLayout,
        // NoInterHost, and variants the core adds later) are the base class.
        _ => "Error",
    }
}

/// The rank `err` names, where it names one: the rank concerned, the one that failed or
/// whose call differs.
fn rank_of(err: &Error) -> Option<usize> {
    match err {
        Error::LengthMismatch { rank, .. }
        | Error::BufferLength { rank, .. }
        | Error::OutputTooShort { rank, .. }
        | Error::Overlap { rank }
        | Error::WrongDevice { rank, .. }
        | Error::WrongPlacement { rank, .. }
        | Error::Timeout { rank, .. }
        | Error::LaunchBlocked { rank, .. }
        | Error::RankFailed { rank, .. }
        | Error::WorldSizeMismatch { rank, .. }
        | Error::DuplicateRank { rank }
        | Error::ConfigMismatch { rank }
        | Error::CallMismatch { rank, .. } => Some(*rank),
        Error::RanksMissing { missing, .. } => missing.first().copied(),
        Error::CommunicatorFailed(cause) | Error::Level { source: cause, .. } => rank_of(cause),
        _ => None,
    }
}

/// The variant's name, as `Debug` spells it (`RankFailed`, `CallMismatch`, ...).
fn kind_of(err: &Error) -> String {
    let debug = format!("{err:?}");
    debug
        .split(|c: char| !c.is_ascii_alphanumeric())
        .next()
        .unwrap_or("Error")
        .to_string()
}

/// The Python exception for `err` (module doc).
pub fn to_python(py: Python<'_>, err: &Error) -> PyErr {
    match build(py, err) {
        Ok(exception) => exception,
        // Only when `ringreduce._errors` cannot be imported (a broken install): the message,
        // in Python's own class, rather than no exception at all.
        Err(import_failed) => {
            let message = format!("{err} (and ringreduce._errors failed: {import_failed})");
            pyo3::exceptions::PyRuntimeError::new_err(message)
        }
    }
}

fn build(py: Python<'_>, err: &Error) -> PyResult<PyErr> {
    let module = py.import("ringreduce._errors")?;
    let class = module.getattr(class_of(err))?;
    let value = class.call1(PyTuple::new(py, [err.to_string()])?)?;
    value.setattr("kind", kind_of(err))?;
    value.setattr("rank", rank_of(err))?;
    if let Error::RanksMissing { missing, .. } = err {
        value.setattr("missing", missing.clone())?;
    }
    if let Error::CommunicatorFailed(cause) = err {
        let cause = build(py, cause)?;
        value.setattr("__cause__", cause.value(py))?;
    }
    Ok(PyErr::from_value(value))
}
