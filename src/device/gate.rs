//! The peer-kernel gate: this crate's blocking driver calls never overlap a spinning kernel.
//!
//! A peer kernel (the one-shot, the two-shot, the one-shot collectives) spins at a barrier until
//! its partner kernels on the other GPUs arrive. Measured on 2×H200 (docs/runs/2026-12-01-s4-
//! d3835ae): while one waits, another thread's blocking CUDA call on these GPUs — `cuMemAlloc`,
//! `cuMemFree`, a pageable copy — makes the driver hold a partner kernel's *start*, so the
//! waiting kernel times out: a failed call, 4 of 4 tries. NCCL has the same rule for its kernels.
//!
//! This crate's own blocking calls ([`super::DeviceBuffer`] and [`super::PinnedHost`]: allocate,
//! copy to and from pageable memory, fill, free — what every `GpuBuffer` does) take the gate
//! first ([`quiet`]): they wait until every peer kernel already launched has completed, and no
//! new one is launched until they return. A launch of peer kernels holds the gate shared
//! ([`launching`]) while it enqueues every rank, so a blocking call never falls between the
//! launches of one call. What launches peer kernels registers itself ([`register`]) with a way
//! to wait for them ([`InFlight`]).
//!
//! Invariant: a thread holding [`launching`] never calls [`quiet`] (it would wait for itself);
//! the launch paths enqueue kernels, events and nothing that allocates.
//!
//! What the gate cannot cover: CUDA calls made outside this crate (raw cudarc, another library).
//! For those the rule stands (docs/ERRORS.md, "Several threads").

use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};

/// Something that launches spinning kernels and can wait, bounded, until those launched so far
/// have completed.
pub trait InFlight: Send + Sync {
    /// Returns once every spinning kernel launched so far has completed, or once waiting longer
    /// could not help (their deadline has passed: they have given up, or never started).
    fn settle(&self);
}

static GATE: RwLock<()> = RwLock::new(());
static LAUNCHERS: Mutex<Vec<Weak<dyn InFlight>>> = Mutex::new(Vec::new());

/// Registers a launcher of spinning kernels for the whole of its life (dropped ones are
/// forgotten).
pub fn register(launcher: Weak<dyn InFlight>) {
    let mut all = LAUNCHERS.lock().unwrap_or_else(|p| p.into_inner());
    all.retain(|w| w.strong_count() > 0);
    all.push(launcher);
}

/// Held while one call's peer kernels are launched on every rank: blocking calls wait for it.
pub fn launching() -> RwLockReadGuard<'static, ()> {
    GATE.read().unwrap_or_else(|p| p.into_inner())
}

/// Held around a blocking driver call: no peer kernel is launched meanwhile, and every one
/// launched before has completed (or passed its deadline) when this returns.
pub fn quiet() -> RwLockWriteGuard<'static, ()> {
    let guard = GATE.write().unwrap_or_else(|p| p.into_inner());
    let live: Vec<_> = LAUNCHERS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    for launcher in live {
        launcher.settle();
    }
    guard
}
