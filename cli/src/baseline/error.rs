//! What the NCCL baseline's calls return: ringreduce's own [`ringreduce::Error`] for what the
//! baseline shares with the library (argument checks, CUDA calls, no GPU or no NCCL, a function
//! an older NCCL lacks), or a failed NCCL call. The baseline's NCCL errors belong to this crate;
//! the library's own NCCL use (between hosts) has its own `Error::Nccl`.

/// An error of the NCCL baseline.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BaselineError {
    /// A check or CUDA call the baseline shares with ringreduce failed; its error as is.
    #[error(transparent)]
    Ring(#[from] ringreduce::Error),
    /// An NCCL call failed.
    #[error("NCCL call {call} failed with {code}: {message}")]
    Nccl {
        /// The NCCL function that failed.
        call: &'static str,
        /// The status code, by name (`ncclInvalidArgument`, ...).
        code: String,
        /// NCCL's own text for the status, and its last error message.
        message: String,
    },
}
