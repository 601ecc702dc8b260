//! The real NCCL beside this library: what it does not run, it hands to NCCL, loaded at run
//! time by ringreduce's loader (`ringreduce::exec::nccl`: `RINGREDUCE_NCCL_PATH`, else a
//! `libnccl.so.2` the process has already loaded — PyTorch's wheels load theirs from
//! `site-packages/nvidia/nccl/lib` even when this library was preloaded — else the first on the
//! library path; never this library itself, which may be installed under that very name). A
//! communicator made through NCCL (`ncclCommInitAll`,
//! `ncclCommSplit` of one, or every communicator with `RINGREDUCE_NCCL_FALLBACK=1`) runs every
//! call there.
//!
//! `RINGREDUCE_NCCL_LOG=1` prints, once per call kind and side, which side ran it
//! (`ringreduce-nccl: ncclAllReduce: ringreduce` or `…: NCCL`), on stderr.
//!
//! Invariant: a symbol of NCCL is only ever called with the handles NCCL itself made.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

/// The real NCCL, found and opened by ringreduce's loader (`ringreduce::exec::nccl`, whose doc
/// says where it looks).
pub use ringreduce::exec::nccl::Library as Real;

/// Whether NCCL has made a communicator of this process.
pub fn made_any() -> bool {
    MADE.load(std::sync::atomic::Ordering::Acquire)
}

/// NCCL made a communicator of this process ([`made_any`]).
pub fn mark_made() {
    MADE.store(true, std::sync::atomic::Ordering::Release);
}

static MADE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether every communicator is to be made by NCCL (`RINGREDUCE_NCCL_FALLBACK=1`).
pub fn forced() -> bool {
    std::env::var("RINGREDUCE_NCCL_FALLBACK").is_ok_and(|v| v == "1")
}

/// Prints, with `RINGREDUCE_NCCL_LOG=1`, that `side` ran `call` — once per pair.
pub fn log(call: &str, side: &str) {
    static ON: OnceLock<bool> = OnceLock::new();
    if !*ON.get_or_init(|| std::env::var("RINGREDUCE_NCCL_LOG").is_ok_and(|v| v == "1")) {
        return;
    }
    static SEEN: Mutex<Option<HashSet<(String, String)>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if seen
        .get_or_insert_with(HashSet::new)
        .insert((call.to_string(), side.to_string()))
    {
        eprintln!("ringreduce-nccl: {call}: {side}");
    }
}
