//! The peer-kernel gate: this crate's blocking driver calls never overlap a spinning kernel.
//!
//! A peer kernel (the one-shot, the two-shot, the one-shot collectives) spins at a barrier until
//! its partner kernels on the other GPUs arrive. While one waits, another thread's blocking CUDA
//! call on these GPUs — `cuMemAlloc`, `cuMemFree`, a pageable copy — makes the driver hold a
//! partner kernel's *start*, so the waiting kernel times out: a failed call, every time it was
//! tried on 2×H200 (docs/ERRORS.md, "Several threads"). NCCL has the same rule for its kernels.
//!
//! This crate's own blocking calls take the gate first ([`quiet`]): [`super::DeviceBuffer`] and
//! [`super::PinnedHost`] (allocate, copy to and from pageable memory, fill, free — what every
//! `GpuBuffer` does), pool access grants, and a communicator's creation and teardown (kernels
//! loaded, streams made and destroyed, peer access enabled, edges probed). They wait until every
//! peer kernel already launched has completed (or passed its deadline), and no new one is
//! launched until they return. A launch of peer kernels holds the gate shared ([`launching`])
//! while it enqueues every rank, so a blocking call never falls between the launches of one call;
//! it waits for a blocking call at most the communicator's timeout, then fails by name having
//! launched nothing. What launches peer kernels registers itself ([`register`]) with a way to
//! wait for them ([`InFlight`]). [`quiet`] nests on one thread (a communicator's creation
//! allocates under its own guard).
//!
//! Invariants: a thread holding [`launching`] never calls [`quiet`] (it would wait for itself):
//! the launch paths enqueue kernels and events, and what they drop that could free memory (a
//! displaced launcher job, a call's last reference) is dropped after the gate is released. A
//! [`Quiet`] releases the gate before it drops the launchers it kept alive while waiting, since
//! dropping the last one frees memory, which takes the gate again.
//!
//! What the gate cannot cover: CUDA calls made outside this crate (raw cudarc, another library),
//! and peer kernels replayed from the caller's CUDA graphs (the replay is the caller's, not a
//! launch of this crate). For those the rule stands (docs/ERRORS.md, "Several threads").

use std::cell::Cell;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError, Weak};
use std::time::{Duration, Instant};

/// Something that launches spinning kernels and can wait, bounded, until those launched so far
/// have completed.
pub trait InFlight: Send + Sync {
    /// Returns once every spinning kernel launched so far has completed, or once waiting longer
    /// could not help (their deadline has passed: they have given up, or never started).
    fn settle(&self);
}

static GATE: RwLock<()> = RwLock::new(());
static LAUNCHERS: Mutex<Vec<Weak<dyn InFlight>>> = Mutex::new(Vec::new());

thread_local! {
    /// How many [`Quiet`] guards this thread holds: a blocking call inside another (a
    /// communicator's creation allocating its buffers) is already covered by the outer one.
    static QUIET_DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Registers a launcher of spinning kernels for the whole of its life (dropped ones are
/// forgotten).
pub fn register(launcher: Weak<dyn InFlight>) {
    let mut all = LAUNCHERS.lock().unwrap_or_else(|p| p.into_inner());
    all.retain(|w| w.strong_count() > 0);
    all.push(launcher);
}

/// Held while one call's peer kernels are launched on every rank: blocking calls wait for it.
/// Waits at most `within` for a blocking call of another thread to finish: `None` then (nothing
/// may be launched; the caller reports it).
pub fn launching(within: Duration) -> Option<RwLockReadGuard<'static, ()>> {
    let deadline = Instant::now() + within;
    loop {
        match GATE.try_read() {
            Ok(guard) => return Some(guard),
            Err(TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(TryLockError::WouldBlock) if Instant::now() >= deadline => return None,
            Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_micros(20)),
        }
    }
}

/// The guard of [`quiet`]. Field order matters: the gate is released before the launchers this
/// thread held alive are dropped, since dropping the last one frees GPU memory, which takes the
/// gate again.
pub struct Quiet {
    guard: Option<RwLockWriteGuard<'static, ()>>,
    _alive: Vec<Arc<dyn InFlight>>,
}

impl Drop for Quiet {
    fn drop(&mut self) {
        QUIET_DEPTH.with(|d| d.set(d.get() - 1));
        drop(self.guard.take());
    }
}

/// Held around a blocking driver call: no peer kernel is launched meanwhile, and every one
/// launched before has completed (or passed its deadline) when this returns. Nested calls on one
/// thread take the gate once.
pub fn quiet() -> Quiet {
    let outer = QUIET_DEPTH.with(|d| {
        d.set(d.get() + 1);
        d.get() == 1
    });
    if !outer {
        return Quiet {
            guard: None,
            _alive: Vec::new(),
        };
    }
    let guard = GATE.write().unwrap_or_else(|p| p.into_inner());
    let alive: Vec<Arc<dyn InFlight>> = LAUNCHERS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    for launcher in &alive {
        launcher.settle();
    }
    Quiet {
        guard: Some(guard),
        _alive: alive,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A launcher whose last strong reference, dropped, takes the gate again (as freeing a
    /// communicator's GPU memory does).
    struct Reentrant(Arc<AtomicUsize>);

    impl InFlight for Reentrant {
        fn settle(&self) {}
    }

    impl Drop for Reentrant {
        fn drop(&mut self) {
            let _inner = quiet();
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_last_launcher_dropped_after_a_quiet_call_takes_the_gate_again() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let launcher: Arc<dyn InFlight> = Arc::new(Reentrant(dropped.clone()));
        register(Arc::downgrade(&launcher));
        let held = quiet();
        // Another owner lets go while this thread holds the only other reference.
        drop(launcher);
        drop(held);
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
        // Nested on one thread: the inner call does not wait for the outer.
        let outer = quiet();
        let inner = quiet();
        drop(inner);
        drop(outer);
        assert!(launching(Duration::from_millis(100)).is_some());
    }

    #[test]
    fn a_launch_waits_for_a_blocking_call_at_most_its_bound() {
        let (tx, rx) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            let _held = quiet();
            tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
        });
        rx.recv().unwrap();
        let start = Instant::now();
        assert!(launching(Duration::from_millis(50)).is_none());
        assert!(start.elapsed() < Duration::from_millis(250));
        assert!(launching(Duration::from_secs(5)).is_some());
        holder.join().unwrap();
    }
}
