//! The host executor's options ([`HostConfig`]) and their defaults, and the faults a test can
//! inject into it ([`Fault`], [`FaultKind`]): fail, panic, stall or slow rank r at instruction k.
//! `exec::config` checks the options against its limits before an executor is made.

use crate::exec::config::Transport;
use crate::exec::Algorithm;
use std::time::Duration;

/// Tuning and test options of the host executor.
#[derive(Clone, Debug, PartialEq)]
pub struct HostConfig {
    /// Chunk length in elements.
    pub chunk_elems: usize,
    /// Staging slots per receiver.
    pub slots: usize,
    /// How the ring's edges move data ([`Transport`], shared with [`crate::CudaConfig`]);
    /// `Staged` exercises the pinned-host plan shape on the CPU.
    pub transport: Transport,
    /// How long a collective may take before every caller gets [`Error::Timeout`].
    ///
    /// [`Error::Timeout`]: crate::Error::Timeout
    pub timeout: Duration,
    /// Test knob, hidden from the API's docs: seed for random delays (0–100 µs) before a quarter
    /// of all operations; `None` for none.
    #[doc(hidden)]
    pub delay_seed: Option<u64>,
    /// Test knob, hidden from the API's docs: a fault to inject, for tests of failure handling.
    #[doc(hidden)]
    pub fault: Option<Fault>,
    /// Which all-reduce runs. `Auto` (the default) runs the two-shot with its gather pushed,
    /// the host ranks' fastest (the selection, [`crate::exec::algorithm::select`]; over `Staged`
    /// edges the staged one-shot or the ring by size); `Ring` and `OneShot` run those plans (a test of the
    /// ring's chunking sets `Ring`, so that it gets the ring).
    pub algorithm: Algorithm,
    /// Fold every element of a reducing collective (all-reduce, reduce-scatter, reduce) in rank
    /// order on every algorithm and size, so results do not depend on which algorithm runs (see
    /// [`crate::exec::algorithm::deterministic_needs_peers`] for what it costs and what it
    /// refuses, and docs/guide/07-other-collectives.md, "Fold order"). Off by default.
    pub deterministic: bool,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            chunk_elems: 64 * 1024,
            slots: 4,
            transport: Transport::Auto,
            timeout: Duration::from_secs(60),
            delay_seed: None,
            fault: None,
            algorithm: Algorithm::Auto,
            deterministic: false,
        }
    }
}

/// A fault injected into the host executor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The rank whose program the fault hits.
    pub rank: usize,
    /// Index of the instruction in the rank's program (taken modulo its length).
    pub instr: usize,
    /// What the fault does there.
    pub kind: FaultKind,
}

/// What an injected fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// The operation returns an error.
    Fail,
    /// The operation panics (the executor catches it).
    Panic,
    /// The operation never finishes (until the call is aborted).
    Stall,
    /// The operation starts this much later (or fails at the call's deadline, or stops when the
    /// call is aborted), then runs: a slow rank, whose call completes late but right.
    Slow(Duration),
}
