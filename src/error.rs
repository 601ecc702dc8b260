//! The one error type of ringreduce.
//!
//! Every fallible call returns [`Error`]; each variant is one cause and carries the context a user
//! needs to act on it (which rank, which call, what was expected). `Display` includes the driver's
//! own message for CUDA failures.

use crate::element::{DType, ReduceOp};

use std::time::Duration;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in ringreduce.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An NCCL call failed (NCCL carries a job's collectives between hosts: `exec::nccl`).
    #[error("NCCL call {call} failed with {code}: {message}")]
    Nccl {
        /// The NCCL function that failed.
        call: &'static str,
        /// NCCL's `ncclResult_t` (−1: the function is missing from the library loaded).
        code: i32,
        /// NCCL's text for the code, or what is missing.
        message: String,
    },

    /// A CUDA driver or NVRTC call failed.
    #[error("CUDA call {call} failed with {code}: {message}")]
    Cuda {
        /// The driver or NVRTC function that failed.
        call: &'static str,
        /// The status code, by name.
        code: String,
        /// The driver's own text for the code.
        message: String,
    },
    /// No CUDA driver library (libcuda) could be loaded, or it reports no device.
    #[error("no GPU available: {reason}")]
    NoGpu {
        /// Why no GPU could be used.
        reason: String,
    },
    /// The collective was called with no buffers.
    #[error("no buffers: a collective needs one buffer per rank, got none")]
    NoBuffers,
    /// The number of buffers does not match the communicator's world size.
    #[error("wrong number of buffers: the communicator has {world} ranks, got {got} buffers")]
    WorldMismatch {
        /// The communicator's world size.
        world: usize,
        /// What was given.
        got: usize,
    },
    /// A rank's buffer length differs from rank 0's.
    #[error("length mismatch on rank {rank}: expected {expected} elements (rank 0's), got {got}")]
    LengthMismatch {
        /// The rank concerned.
        rank: usize,
        /// What was expected there.
        expected: usize,
        /// What was given.
        got: usize,
    },
    /// A buffer of a collective has the wrong length for the collective's count (see the table in
    /// [`crate::plan::Collective`]'s module: all-gather outputs are world × count, and so on).
    #[error("{collective}: rank {rank}'s {buffer} has {got} elements, expected {expected}")]
    BufferLength {
        /// The collective called.
        collective: &'static str,
        /// The rank concerned.
        rank: usize,
        /// Which buffer ("input", "output", "in-place buffer", "send buffer of transfer 2", ...).
        buffer: String,
        /// What the collective needs there.
        expected: usize,
        /// What was given.
        got: usize,
    },
    /// A collective was given the wrong number of buffers in one of its lists (a broadcast's
    /// input list holds the root's buffer alone, a send/recv's one buffer per transfer, ...).
    #[error("{collective}: expected {expected} {what}, got {got}")]
    BufferCount {
        /// The collective called.
        collective: &'static str,
        /// Which list ("input buffers (the root's alone)", "send buffers (one per transfer)", ...).
        what: &'static str,
        /// How many the collective needs.
        expected: usize,
        /// How many were given.
        got: usize,
    },
    /// The collective has no in-place form (all-to-all, send/recv): pass inputs.
    #[error("{collective} has no in-place form: pass separate inputs")]
    NoInPlace {
        /// The collective called.
        collective: &'static str,
    },
    /// A rooted collective (broadcast, reduce) was given a root outside the world.
    #[error("root {root} is out of range: the communicator has {world} ranks")]
    RootOutOfRange {
        /// The root given.
        root: usize,
        /// The communicator's world size.
        world: usize,
    },
    /// A send/recv transfer names a rank outside the world.
    #[error("transfer {index} ({from} → {to}) names a rank outside the world of {world}")]
    TransferOutOfRange {
        /// The transfer's index in the list.
        index: usize,
        /// Its sending rank.
        from: usize,
        /// Its receiving rank.
        to: usize,
        /// The communicator's world size.
        world: usize,
    },
    /// An out-of-place output is shorter than its input.
    #[error("output too short on rank {rank}: input has {input} elements, output {output}")]
    OutputTooShort {
        /// The rank concerned.
        rank: usize,
        /// The input's length in elements.
        input: usize,
        /// The output's length in elements.
        output: usize,
    },
    /// An out-of-place output overlaps its input.
    #[error("output overlaps input on rank {rank}: use the in-place call instead")]
    Overlap {
        /// The rank concerned.
        rank: usize,
    },
    /// Two ranks were given overlapping output (or in-place) buffers.
    #[error(
        "ranks {first} and {second} were given overlapping output buffers; each rank needs its own"
    )]
    OutputsOverlap {
        /// The lower-numbered rank.
        first: usize,
        /// The higher-numbered rank.
        second: usize,
    },
    /// Two ranks were given buffers on the same device.
    #[error("ranks {first} and {second} both have buffers on device {device}")]
    DuplicateDevice {
        /// The device (GPU index) concerned.
        device: usize,
        /// The lower-numbered rank.
        first: usize,
        /// The higher-numbered rank.
        second: usize,
    },
    /// A buffer lives on a device the communicator does not own.
    #[error("rank {rank}'s buffer is on device {device}, but the communicator's rank {rank} is device {expected}")]
    WrongDevice {
        /// The rank concerned.
        rank: usize,
        /// The device (GPU index) concerned.
        device: usize,
        /// What was expected there.
        expected: usize,
    },
    /// A buffer is in the wrong kind of memory for this communicator.
    #[error("rank {rank}'s buffer is in {got:?}, expected {expected}")]
    WrongPlacement {
        /// The rank concerned.
        rank: usize,
        /// Where the buffer is.
        got: crate::buffer::Placement,
        /// The kind of memory this communicator needs.
        expected: &'static str,
    },
    /// count × element size does not fit in memory addresses.
    #[error("size overflow: {count} elements of {dtype} do not fit in a byte count")]
    SizeOverflow {
        /// The element count asked for.
        count: usize,
        /// The element type.
        dtype: DType,
    },
    /// The operator is not defined for the type.
    #[error("{op} is not supported for {dtype}: {why}")]
    UnsupportedOp {
        /// The operator.
        op: ReduceOp,
        /// The element type.
        dtype: DType,
        /// Why the pair is not supported.
        why: &'static str,
    },
    /// A communicator was asked for with no ranks (no devices, or a host world of 0).
    #[error("a communicator needs at least one rank, got none")]
    NoRanks,
    /// A communicator was asked for with more ranks than plans can be proven for.
    #[error("too many ranks: {world} asked for, at most {max} are supported (plans are proven for at most {max} ranks)")]
    TooManyRanks {
        /// The ranks asked for.
        world: usize,
        /// The most ranks a communicator may have.
        max: usize,
    },
    /// A communicator option is outside its limits (`crate::exec::config`).
    #[error("invalid option {field} = {value}: {why}")]
    InvalidConfig {
        /// The option's field name (`slots`, `timeout`, `chunk_bytes`, ...).
        field: &'static str,
        /// The value given, as `Debug` prints it.
        value: String,
        /// The limit it breaks.
        why: String,
    },
    /// An invalid argument that none of the variants above names (a device index, a config value).
    /// Always the caller's input: a state ringreduce's own code should not reach is
    /// [`Error::Internal`].
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A state ringreduce's own code should never reach (a launch without the resources its
    /// algorithm was chosen for, a staging size no plan of a valid call has): a bug in
    /// ringreduce, never in the caller's input. (A plan the checker refuses is
    /// [`Error::PlanRejected`].)
    #[error(
        "internal error: {what} (this is a bug in ringreduce; please report it with this message)"
    )]
    Internal {
        /// What was found wrong.
        what: String,
    },
    /// The host could not give ringreduce what it needs: memory for host staging, a thread.
    #[error("out of resources: {what}")]
    Resource {
        /// What could not be had, with the system's reason where it gave one.
        what: String,
    },
    /// GPU a cannot reach GPU b's memory, and the transport was forced to peer copies.
    #[error("no peer access from device {from} to device {to}")]
    NoPeerAccess {
        /// The device that would read or write.
        from: usize,
        /// The device whose memory it cannot reach.
        to: usize,
    },
    /// A collective was enqueued on streams being captured into a CUDA graph, and this
    /// communicator cannot make it part of a graph (the reason says why); nothing was enqueued,
    /// and the capture is left as it was.
    #[error("this collective cannot be captured into a CUDA graph: {reason}")]
    NotCapturable {
        /// Why not.
        reason: String,
    },
    /// A plan failed the plan checker: a bug in a planner, never in user input.
    #[error("plan rejected by the checker: {0}")]
    PlanRejected(String),
    /// A rank did not make progress before the collective's deadline.
    #[error("timeout after {after:?}: rank {rank} {waiting_on}")]
    Timeout {
        /// The rank concerned.
        rank: usize,
        /// What the rank was waiting for (a step, an event, a barrier).
        waiting_on: String,
        /// The timeout that expired.
        after: Duration,
    },
    /// A peer call's kernels waited for each other in vain because launching a later rank's
    /// kernel was held up in the CUDA driver — typically by another thread's call that waits for
    /// these GPUs (a memory allocation or free, a copy to or from pageable host memory, a device
    /// synchronize) while the first rank's kernel waited at its barrier. Don't make such calls on
    /// a communicator's GPUs from other threads while its collectives run (docs/ERRORS.md).
    #[error("GPU {device}'s kernel (rank {rank}) was launched {late:?} after the first rank's: the CUDA driver held the launch, most likely for another thread's blocking CUDA call outside ringreduce on these GPUs (an allocation, a free, a copy with pageable host memory) while the first kernel waited at its barrier; the collective gave up")]
    LaunchBlocked {
        /// The rank whose launch came late.
        rank: usize,
        /// Its GPU.
        device: usize,
        /// How long after the first rank's launch it was launched.
        late: Duration,
    },
    /// A rank's thread failed (an error or a caught panic) while running a collective.
    #[error("rank {rank} failed during {during}: {message}")]
    RankFailed {
        /// The rank concerned.
        rank: usize,
        /// What the rank was doing.
        during: String,
        /// The error or panic message.
        message: String,
    },
    /// Ranks that never joined the rendezvous within the creation timeout (every rank that came
    /// gets this; a rank that could not reach rank 0 names rank 0).
    #[error("ranks {missing:?} never arrived at the rendezvous within {after:?}")]
    RanksMissing {
        /// The ranks that did not arrive, in order.
        missing: Vec<usize>,
        /// The timeout waited.
        after: std::time::Duration,
    },

    /// A rank joined a rendezvous with another world size than rank 0's.
    #[error("rank {rank} joined with a world of {said}, rank 0 with {expected}")]
    WorldSizeMismatch {
        /// The rank that differs.
        rank: usize,
        /// Its world size.
        said: usize,
        /// Rank 0's.
        expected: usize,
    },

    /// Two processes joined a rendezvous as the same rank.
    #[error("two processes joined the rendezvous as rank {rank}")]
    DuplicateRank {
        /// The rank claimed twice.
        rank: usize,
    },

    /// A rank's configuration differs from rank 0's (its fingerprint does).
    #[error("rank {rank}'s configuration differs from rank 0's")]
    ConfigMismatch {
        /// The rank that differs.
        rank: usize,
    },

    /// The ranks' hosts (each rank reports its host name, or `RINGREDUCE_HOST_ID`) do not form
    /// the layout a job on several hosts needs: each host's ranks consecutive (torchrun's
    /// numbering), the same number of ranks on every host.
    #[error("the ranks' hosts do not form a job's layout: {what}")]
    HostLayout {
        /// What is wrong, naming the ranks and hosts.
        what: String,
    },

    /// The ranks run on several hosts, and nothing carries collectives between hosts: GPU
    /// ranks need NCCL (`libnccl.so.2`, loaded at run time), host ranks an engine their
    /// creator passes ([`crate::InterHostFactory`]).
    #[error("the ranks run on {hosts} hosts and {why}")]
    NoInterHost {
        /// The number of hosts.
        hosts: usize,
        /// Why no engine between hosts is there.
        why: String,
    },

    /// One level of a hierarchical collective failed on this rank: within its host
    /// (ringreduce's plans) or across hosts (the engine between hosts). Ranks in `source` are
    /// the job's.
    #[error("rank {rank}'s collective {level} failed: {source}")]
    Level {
        /// "within a host" or "across hosts".
        level: &'static str,
        /// This rank (the job's).
        rank: usize,
        /// What failed there.
        source: Box<Error>,
    },

    /// The ranks of a communicator made different calls: every rank must make the same
    /// collective calls (collective, count, type, operator, root, placement) in the same order.
    #[error("rank {rank} called {theirs} where rank {this} called {ours}: every rank must make the same collective calls in the same order")]
    CallMismatch {
        /// The rank whose call differs from this one's.
        rank: usize,
        /// Its call.
        theirs: String,
        /// This rank.
        this: usize,
        /// This rank's call.
        ours: String,
    },

    /// An earlier collective failed; this communicator cannot be used again (make a new one).
    #[error("communicator failed earlier and cannot be used: {0}")]
    CommunicatorFailed(Box<Error>),
    /// The communicator has been closed or aborted.
    #[error("communicator is closed")]
    Closed,
}

/// Turns a caught panic payload into a message.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".into()
    }
}

#[cfg(test)]
mod tests {
    use super::Error;

    /// An internal error says whose bug it is and asks for a report, keeping its own message.
    #[test]
    fn internal_errors_say_they_are_bugs() {
        let text = Error::Internal {
            what: "staging size overflows".into(),
        }
        .to_string();
        assert!(text.contains("staging size overflows"), "{text}");
        assert!(text.contains("bug in ringreduce"), "{text}");
        assert!(text.contains("report"), "{text}");
        assert!(!text.contains("invalid argument"), "{text}");
    }
}
