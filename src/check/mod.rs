//! The plan checker: proves, on the CPU, that a [`Plan`] computes its collective
//! ([`Plan::collective`]: all-reduce, reduce-scatter, all-gather, broadcast, reduce, all-to-all,
//! grouped send/recv) before any executor runs it.
//!
//! Four checks, in order; the first failure is returned as a message that names the rank, the
//! instruction and the place in the algorithm:
//!
//! 1. **Shape** — every region lies inside its buffer, copies have equal lengths, a reduction's
//!    destination is its first operand or disjoint from both, nothing writes an input, each event
//!    is recorded exactly once, on the rank and stream its declaration names; and what an
//!    executor may fuse or drop — meetings `fused` into one kernel, an [`Op::Expose`] done inside
//!    a kernel or skipped — changes neither the results nor the race verdict (`fused.rs`).
//! 2. **Enqueue** — the host threads are simulated: each rank walks its program in order and may
//!    enqueue a wait only once the event's record has been enqueued (by itself earlier, or by
//!    another rank, which then hands the event over). On CUDA a wait enqueued before its record is a
//!    silent no-op; here it is a rejected plan. If the ranks get stuck, the plan would deadlock the
//!    host threads, and is rejected too. The order the simulation enqueues in is one legal
//!    execution order.
//! 3. **No data race** — happens-before is program order within a stream plus record → wait edges
//!    (vector clocks, one component per stream). Any two accesses to overlapping elements of one
//!    buffer, at least one a write, must be ordered. Checking `calls = 2` runs the plan twice back
//!    to back (streams and events persist, the caller's barrier between calls), which proves that
//!    the next call cannot trample a slot the previous call is still reading; [`check_sequence`]
//!    does the same for calls of *different* plans (shapes change from call to call; each plan has
//!    its own events and staging, the caller's buffers may be the same). Each rank's last Main
//!    instruction must also come after every access to its input and output: when Main is done,
//!    the caller's buffers are free.
//! 4. **Symbolic result** — the plan is executed on symbolic values: element p holds "the fold
//!    over ranks R of input element p + shift" (rank r's input holds `{r}` with shift 0; a copy
//!    moves the shift with the data); a reduction takes the union and rejects operands that share
//!    a rank (a contribution counted twice) or name different elements, a read of memory nothing
//!    wrote is rejected. Every output range must end holding exactly what the collective defines
//!    (for the all-reduce every rank once, at its own element; for an all-gather block j, rank
//!    j's input; and so on) and, for `Avg`, scaled exactly once, after the sum was complete.
//!    Because the plan is race-free, the order of execution cannot change this.
//!    Memory is held as runs of equal values, not element by element: the check costs the
//!    number of instructions times the runs they touch, the same for 1 GiB as for 1 KiB.
//!
//! Every check is invariant under multiplying all of a plan's ranges by one factor, which
//! `scaled.rs` turns into a shortcut: a plan that is a proven plan scaled is proven (the one-shot
//! form of every collective but send/recv is checked once per collective, world and placement,
//! at one element, and compared for every other count).
//! More generally each check is invariant under the lengths of the cells a plan's ranges cut its
//! buffers into, which `coarse.rs` turns into the cell lemma: a plan is proven when its coarse form
//! (every cell one element) is, and the ring's plans of one family of counts share a handful of
//! coarse forms, each checked once and compared for every other count ([`coarsen`]).
//!
//! Which lemma proves which plan: the scaling lemma, the one-shot form of every collective but
//! send/recv; the cell lemma, the all-reduce's ring (the other collectives' expectations carry
//! block offsets in elements, which cells would have to preserve too). Every other plan — the
//! other collectives' ring forms, send/recv, the two-shot, the staged one-shot — passes the four
//! checks itself. Both executors take each form through one function, whatever the collective:
//! `PlanCache::checked_oneshot_plan` and `PlanCache::checked_ring_plan` (`exec/mod.rs`).
//!
//! Beside the four, [`check_exports`] proves what a plan needs of memory across processes: a
//! rank touches another rank's buffers only where that rank exports them; [`check_staged`],
//! that a plan runs on ranks without peer access (no rank touches another's device memory,
//! `reach.rs`); and
//! [`check_hierarchy`] proves a job on several hosts ([`crate::plan::hierarchy`]): its stages,
//! each a collective of one level or a local copy, compose into the job's collective.
//!
//! Where each check lives: the shape in `shape.rs` (the fusion lemmas in `fused.rs`), the enqueue simulation (and the rule for
//! laying out an order that the later checks read) in `enqueue_order.rs`, the vector-clock race check
//! in `races.rs`, the symbolic execution in `result.rs`, the hierarchical proof in
//! `hierarchy.rs`; their unit tests in `tests/`. This file
//! holds what they share: [`Rejection`], the regions an instruction touches ([`peer_sources`] for
//! a meeting, [`peer_destinations`]) and the helpers that tests use to find an instruction to break ([`find_instr`],
//! [`waited`]).

mod coarse;
mod enqueue_order;
mod exports;
mod fused;
mod hierarchy;
mod races;
mod reach;
mod result;
mod scaled;
mod shape;

pub use coarse::coarsen;
pub use enqueue_order::enqueue_order;
pub use exports::{check_exports, touched_across_ranks};
pub use hierarchy::check_hierarchy;
pub use races::{check_races, check_sequence, check_sequence_in_arenas};
pub use reach::check_reach_placed;
pub use result::{check_result, MAX_SYMBOLIC_WORLD};
pub use scaled::{scale_plan, scaled_from};
pub use shape::check_shape;

use crate::plan::{EventId, Instr, Op, Plan, Region};

/// Why a plan was rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection(pub String);

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<Rejection> for crate::error::Error {
    fn from(r: Rejection) -> Self {
        crate::error::Error::PlanRejected(r.0)
    }
}

type Check<T = ()> = Result<T, Rejection>;

fn reject<T>(msg: String) -> Check<T> {
    Err(Rejection(msg))
}

/// Runs all four checks on one call of the plan and on two back-to-back calls.
pub fn check(plan: &Plan) -> Check {
    check_shape(plan)?;
    let order = enqueue_order(plan)?;
    check_races(plan, &order, 2)?;
    check_result(plan, &order)
}

/// [`check`], and that the plan runs on ranks without peer access: it touches no other rank's
/// device memory (`reach.rs`).
pub fn check_staged(plan: &Plan) -> Check {
    check(plan)?;
    reach::check_reach(plan)
}

/// How messages name an instruction: its rank, index, operation, stream and place in the algorithm.
fn describe(plan: &Plan, rank: usize, index: usize) -> String {
    let instr = &plan.ranks[rank][index];
    format!(
        "rank {rank} instruction {index} ({:?} on {:?}, {})",
        instr.op, instr.stream, instr.tag
    )
}

/// Regions an instruction reads and writes.
fn accesses(plan: &Plan, op: &Op) -> (Vec<Region>, Vec<Region>) {
    match *op {
        Op::Copy { src, dst } | Op::Expose { src, dst } => (vec![src], vec![dst]),
        Op::Reduce { dst, a, b } => (vec![a, b], vec![dst]),
        Op::Scale { region } => (vec![region], vec![region]),
        Op::Record(_) | Op::Wait(_) => (vec![], vec![]),
        Op::PeerReduce { .. } => (peer_sources(plan, op), peer_destinations(plan, op)),
    }
}

/// The regions a [`Op::PeerReduce`] writes: its `dst`, then the same range of the buffer of
/// `dst`'s kind of every rank in `push`, in rank order (ranks without such a buffer, and an
/// undeclared `dst`, are left out here and rejected by the shape check).
pub fn peer_destinations(plan: &Plan, op: &Op) -> Vec<Region> {
    let Op::PeerReduce { dst, push, .. } = *op else {
        return Vec::new();
    };
    // An undeclared `dst` is the shape check's to reject.
    let Some(kind) = plan.buffers.get(dst.buf.0).map(|d| d.kind) else {
        return vec![dst];
    };
    let pushed = (0..plan.world)
        .filter(|&r| push.contains(r))
        .filter_map(|r| plan.buffer(r, kind))
        .map(|buf| Region { buf, ..dst });
    std::iter::once(dst).chain(pushed).collect()
}

/// The regions a [`Op::PeerReduce`] reads, in rank order: what an executor folds (ranks without
/// a buffer of the source's kind are left out here and rejected by the shape check).
pub fn peer_sources(plan: &Plan, op: &Op) -> Vec<Region> {
    let Op::PeerReduce {
        src,
        offset,
        count,
        ranks,
        ..
    } = *op
    else {
        return Vec::new();
    };
    (0..plan.world)
        .filter(|&r| ranks.contains(r))
        .filter_map(|r| plan.buffer(r, src))
        .map(|buf| Region { buf, offset, count })
        .collect()
}

/// Finds the first instruction (in rank order) matching `pred`: a helper for tests that plant
/// faults in plans.
pub fn find_instr(plan: &Plan, pred: impl Fn(usize, &Instr) -> bool) -> Option<(usize, usize)> {
    plan.ranks.iter().enumerate().find_map(|(rank, program)| {
        program
            .iter()
            .position(|i| pred(rank, i))
            .map(|i| (rank, i))
    })
}

/// The event that an instruction waits on, if it is a wait.
pub fn waited(instr: &Instr) -> Option<EventId> {
    match instr.op {
        Op::Wait(e) => Some(e),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
