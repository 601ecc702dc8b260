//! The host executor's pool: a blocking call whose plan keeps every rank on its Main stream with
//! no events (the one-shot's and the two-shot's all-reduce) runs on at most as many threads as
//! there are cores — the caller and helper threads — instead of a thread per rank.
//!
//! Such a program is a run of data operations cut by its meetings' barriers: a meeting that is
//! not `fused` has a start barrier before it, and an end barrier after it unless the next meeting
//! is fused. Every rank meets at the same barriers (meetings are collective), so the call falls
//! into phases: phase p is every rank's operations between its barriers p − 1 and p. The pool
//! hands out (phase, rank) units in order, and a unit of phase p starts once every unit of the
//! phases before has finished — what the barriers promise (no rank passes a barrier before every
//! rank has reached it); between two barriers the checker proved any interleaving race-free, so
//! running one rank's operations after another's is one of them. With no more workers than cores
//! no barrier waits for a thread that is not running: a barrier is a count, not n threads taking
//! turns on the cores (docs/PERFORMANCE.md, "Host executor").
//!
//! Failures are the thread path's: the same operations run (`stream::run_data`), so a fault
//! names the same rank and instruction; a worker that finds the call aborted skips its units,
//! and an injected stall ends at the call's deadline, as on threads.

use super::host_streams::{meeting_barriers, run_data, Meetings};
use super::HostCall;
use crate::plan::{Op, Plan, StreamKind};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Each rank's program cut at its barriers: `phases[rank][p]`, the instructions of phase `p`.
pub(super) type Phases = Vec<Vec<Range<usize>>>;

/// The phases of `plan` where the pool can run it: every instruction on the Main stream, none a
/// record or a wait, and every rank with as many barriers; `None` otherwise.
pub(super) fn phases(plan: &Plan) -> Option<Phases> {
    let phases: Vec<Vec<Range<usize>>> = plan
        .ranks
        .iter()
        .map(|program| {
            let mut cuts = Vec::new();
            let mut start = 0;
            for (i, instr) in program.iter().enumerate() {
                if instr.stream != StreamKind::Main
                    || matches!(instr.op, Op::Record(_) | Op::Wait(_))
                {
                    return None;
                }
                if let Op::PeerReduce { .. } = instr.op {
                    let (start_barrier, end_barrier) = meeting_barriers(program, i);
                    if start_barrier {
                        cuts.push(start..i);
                        start = i;
                    }
                    if end_barrier {
                        cuts.push(start..i + 1);
                        start = i + 1;
                    }
                }
            }
            cuts.push(start..program.len());
            Some(cuts)
        })
        .collect::<Option<_>>()?;
    let count = phases.first().map_or(0, Vec::len);
    phases.iter().all(|p| p.len() == count).then_some(phases)
}

/// Returns once `done` holds: looked for for a while, then every 50 µs.
fn wait_for(done: impl Fn() -> bool) {
    if crate::exec::spin_until(&done) {
        return;
    }
    while !done() {
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// One call as the pool runs it: the next unit to hand out and the units finished.
pub(super) struct Job {
    pub(super) call: Arc<HostCall>,
    next: AtomicUsize,
    finished: AtomicUsize,
    units: usize,
}

impl Job {
    pub(super) fn new(call: Arc<HostCall>) -> Job {
        let world = call.prepared.plan.world;
        let phases = call.prepared.phases.as_ref().map_or(0, |p| p[0].len());
        Job {
            call,
            next: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            units: phases * world,
        }
    }

    /// Takes units until none is left: unit u is rank u mod n's part of phase u / n, run once
    /// every unit of the earlier phases has finished (skipped once the call is aborted).
    pub(super) fn work(&self) {
        let call = &self.call;
        let world = call.prepared.plan.world;
        let Some(phases) = call.prepared.phases.as_ref() else {
            return;
        };
        loop {
            let unit = self.next.fetch_add(1, Ordering::AcqRel);
            if unit >= self.units {
                return;
            }
            let (phase, rank) = (unit / world, unit % world);
            // The barrier: the units before this phase are all taken (units go out in order) by
            // workers that finish them, so this wait ends.
            self.wait_finished(phase * world);
            for index in phases[rank][phase].clone() {
                if call.aborted() {
                    break;
                }
                run_data(call, rank, index, Meetings::Phased);
            }
            self.finished.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Waits until `units` units have finished or the call is aborted (an operation still
    /// running then finishes by the call's deadline).
    fn wait_finished(&self, units: usize) {
        wait_for(|| self.finished.load(Ordering::Acquire) >= units || self.call.aborted());
    }

    /// Waits until every unit has finished: then no worker touches the call's buffers.
    pub(super) fn wait_all(&self) {
        wait_for(|| self.finished.load(Ordering::Acquire) >= self.units);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element::ReduceOp;
    use crate::plan::{EdgeTransport, Gather, OneShotSpec, RingSpec, TwoShotSpec};

    fn two_shot(gather: Gather) -> Plan {
        let spec = TwoShotSpec {
            world: 3,
            count: 30,
            in_place: true,
            op: ReduceOp::Sum,
            align: 1,
            gather,
        };
        spec.build().unwrap()
    }

    /// A phase per stretch between barriers: the pushed two-shot's one meeting has two; the
    /// pulled one's fused gather rounds run as one stretch; the one-shot in place exposes before
    /// its start barrier; the ring's events keep it on threads.
    #[test]
    fn programs_are_cut_at_their_barriers() {
        let pushed = phases(&two_shot(Gather::Push)).unwrap();
        assert_eq!(pushed[1], [0..0, 0..1, 1..1]);
        // The reduce's end and the first gather round's start: two barriers, nothing between.
        let pulled = phases(&two_shot(Gather::Pull)).unwrap();
        assert_eq!(pulled[2], [0..0, 0..1, 1..1, 1..3, 3..3]);
        let oneshot = OneShotSpec {
            world: 3,
            count: 30,
            in_place: true,
            op: ReduceOp::Sum,
        };
        let oneshot = phases(&oneshot.build().unwrap()).unwrap();
        assert_eq!(oneshot[0], [0..1, 1..2, 2..2]);
        let ring = RingSpec::new(3, 30, 4, 2, EdgeTransport::Peer)
            .build()
            .unwrap();
        assert!(phases(&ring).is_none());
    }
}
