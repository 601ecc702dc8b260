//! Where a call's host time goes: with [`CudaConfig::profile_host`](crate::CudaConfig::profile_host)
//! on, the calling thread marks the end of each phase of every communicator call — validation,
//! the communicator's lock, the plan lookup, the call's set-up, each rank's launch, the wait for
//! completion, the check of the kernels' error words, the return — and the communicator keeps
//! one [`CallProfile`] per call until [`Communicator::host_profile`](crate::Communicator::host_profile)
//! takes them. `ringreduce bench --profile-host` prints their medians per size.
//!
//! The marks live in a thread-local log that only a profiled call opens (`begin`); without
//! one, a `mark` is a read of a thread-local flag. Launcher threads (`launch_threads`) do not
//! mark: rank 0's launch and the wait for the others' are what the caller's thread sees.
//!
//! Invariant: a phase's time is the time since the previous mark of the same call (the first
//! since `begin`), so a call's phases add up to its whole time on the calling thread.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

/// A host phase of a call on the calling thread, named by what ends it. (The algorithm's phases,
/// which tag a plan's instructions, are [`crate::plan::Phase`].)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HostPhase {
    /// The arguments checked against every rank (`comm::validate`), their addresses taken.
    Validate,
    /// The communicator's lock taken.
    Lock,
    /// The call's plan found (or built, checked and prepared), the caller's buffers opened to
    /// the GPUs that write them.
    Plan,
    /// The call set up: peer error words read, pool access granted, the launch gate taken.
    Open,
    /// One rank's work enqueued (for the ring: every rank thread's); one mark per rank.
    Launch,
    /// Completion waited for (blocking calls and `synchronize`).
    Wait,
    /// The peer kernels' error words read after completion.
    Check,
    /// The communicator released and the buffers' stream uses recorded; the call returns.
    Return,
}

impl HostPhase {
    /// The phase's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            HostPhase::Validate => "validate",
            HostPhase::Lock => "lock",
            HostPhase::Plan => "plan",
            HostPhase::Open => "open",
            HostPhase::Launch => "launch",
            HostPhase::Wait => "wait",
            HostPhase::Check => "check",
            HostPhase::Return => "return",
        }
    }
}

/// One call's phases in the order they ended, each with its time.
#[derive(Clone, Debug, PartialEq)]
pub struct CallProfile {
    /// What was called: `"collective"` or `"synchronize"`.
    pub call: &'static str,
    /// Each phase and its time, in order.
    pub phases: Vec<(HostPhase, Duration)>,
}

impl CallProfile {
    /// The call's whole time on the calling thread.
    pub fn total(&self) -> Duration {
        self.phases.iter().map(|(_, d)| *d).sum()
    }
}

thread_local! {
    static RECORDING: Cell<bool> = const { Cell::new(false) };
    static LOG: RefCell<(Instant, Vec<(HostPhase, Duration)>)> =
        RefCell::new((Instant::now(), Vec::new()));
}

/// Opens this thread's log for a profiled call (a call already open is discarded).
pub(crate) fn begin() {
    LOG.with(|log| {
        let mut log = log.borrow_mut();
        log.0 = Instant::now();
        log.1.clear();
    });
    RECORDING.with(|r| r.set(true));
}

/// The most marks one call keeps (a call has about ten; a log left open by a call that returned
/// early stops growing here until the next call closes it).
const MAX_MARKS: usize = 256;

/// Ends `phase` now, if this thread's log is open.
#[inline]
pub(crate) fn mark(phase: HostPhase) {
    if RECORDING.with(Cell::get) {
        LOG.with(|log| {
            let mut log = log.borrow_mut();
            let now = Instant::now();
            let since = now - log.0;
            log.0 = now;
            if log.1.len() < MAX_MARKS {
                log.1.push((phase, since));
            }
        });
    }
}

/// Closes this thread's log: the profile of `call`, or `None` if no log was open.
pub(crate) fn end(call: &'static str) -> Option<CallProfile> {
    if !RECORDING.with(|r| r.replace(false)) {
        return None;
    }
    // A copy, and the log cleared: its capacity stays for the next call's marks.
    let phases = LOG.with(|log| {
        let mut log = log.borrow_mut();
        let phases = log.1.clone();
        log.1.clear();
        phases
    });
    Some(CallProfile { call, phases })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_kept_only_between_begin_and_end() {
        mark(HostPhase::Validate);
        assert_eq!(end("collective"), None);
        begin();
        mark(HostPhase::Validate);
        std::thread::sleep(Duration::from_millis(2));
        mark(HostPhase::Launch);
        let p = end("collective").expect("a log was open");
        let phases: Vec<HostPhase> = p.phases.iter().map(|(ph, _)| *ph).collect();
        assert_eq!(phases, [HostPhase::Validate, HostPhase::Launch]);
        assert!(p.phases[1].1 >= Duration::from_millis(2), "{p:?}");
        assert_eq!(p.total(), p.phases[0].1 + p.phases[1].1);
        mark(HostPhase::Wait);
        assert_eq!(end("collective"), None);
        // A log left open keeps at most MAX_MARKS.
        begin();
        for _ in 0..MAX_MARKS + 10 {
            mark(HostPhase::Lock);
        }
        assert_eq!(end("collective").map(|p| p.phases.len()), Some(MAX_MARKS));
    }
}
