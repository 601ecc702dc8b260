//! What the NCCL baseline's calls return: ringreduce's own [`ringreduce::Error`] for what the
//! baseline shares with the library (argument checks, CUDA calls, no GPU), or a failed NCCL call.
//! NCCL errors belong to this crate, not to the library, which never calls NCCL.

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
