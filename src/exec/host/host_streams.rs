//! The host executor's streams: each (rank, stream) runs what its rank thread enqueues, in
//! order, with CUDA's event semantics — the Send, Recv and Reduce streams on a worker thread
//! each, the Main stream on the rank thread itself, once it has enqueued the call (one thread
//! hand-off fewer per rank and call; a stream may run behind its enqueue, never ahead of it).
//!
//! A record completes when the worker reaches it; a wait blocks the worker until the event's
//! completed records reach the count captured when the wait was enqueued. A `PeerReduce` is a
//! meeting on threads: a start barrier, the fold of every rank's source in rank order (as the GPU
//! kernel folds), an end barrier — but none between a meeting and the next one when that one is
//! `fused` (the plan's run of meetings then overlaps across ranks, as in one GPU kernel); an
//! `Expose` is a copy. Invariant: every blocking wait here has the call's deadline and
//! watches its abort flag, and defers at the deadline to an operation still running elsewhere,
//! which names itself as the root cause.

use super::{Cmd, FaultKind, HostCall};
use crate::error::{Error, Result};
use crate::exec::{aborted, panic_message};
use crate::plan::{Instr, Op, StreamKind};
use crossbeam_channel::Receiver;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A tiny deterministic generator for schedule delays.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A stream: runs what its rank thread enqueues, in order. Inside a call it looks for the next
/// command a while before it sleeps (`exec::spin_recv`: the rank thread is enqueuing it);
/// between calls it sleeps at once, leaving the cores to the streams still at work.
pub(super) fn stream_worker(rank: usize, stream: StreamKind, cmds: Receiver<Cmd>) {
    let mut state = Stream::new(rank, stream);
    loop {
        let next = match state.current {
            Some(_) => crate::exec::spin_recv(&cmds),
            None => cmds.recv().ok(),
        };
        let Some(cmd) = next else { break };
        state.run(cmd);
    }
}

/// One stream of one rank as it runs commands: the call it is in and its delay generator. A
/// stream worker thread holds one; the rank thread holds its Main stream's (module `host`).
pub(super) struct Stream {
    rank: usize,
    stream: StreamKind,
    current: Option<Arc<HostCall>>,
    rng: XorShift,
}

impl Stream {
    pub(super) fn new(rank: usize, stream: StreamKind) -> Stream {
        Stream {
            rank,
            stream,
            current: None,
            rng: XorShift(1),
        }
    }

    /// Runs one command: `Begin` enters a call, `End` leaves it and reports the stream done;
    /// the rest run inside the call, as CUDA's streams would.
    pub(super) fn run(&mut self, cmd: Cmd) {
        let (rank, stream) = (self.rank, self.stream);
        match cmd {
            Cmd::Begin(call) => {
                if let Some(seed) = call.delay_seed {
                    self.rng = XorShift(seed ^ ((rank as u64) << 32 | stream.index() as u64) | 1);
                }
                self.current = Some(call);
            }
            Cmd::End => {
                if let Some(call) = self.current.take() {
                    call.done.report((rank, Some(stream)));
                }
            }
            Cmd::Record { event, generation } => {
                if let Some(call) = &self.current {
                    let ev = &call.prepared.events[event];
                    let held = ev.lock.lock().unwrap_or_else(|p| p.into_inner());
                    ev.completed.fetch_max(generation, Ordering::Release);
                    ev.reached.notify_all();
                    drop(held);
                    // Peers in other processes count this call's record (module `process`) —
                    // unless the call is aborted: its operations before the record may have
                    // been skipped, and a peer must not take the record for their data.
                    if let Some(shared) = call.shared.as_ref().filter(|_| !call.aborted()) {
                        shared.signal(event);
                    }
                }
            }
            Cmd::WaitShared { event, index } => {
                let Some(call) = &self.current else { return };
                if call.aborted() {
                    return;
                }
                if let Some(shared) = &call.shared {
                    let recorder = call.prepared.plan.events[event].rank;
                    let waited = shared.wait_for(call, rank, recorder, event, || {
                        let tag = call.prepared.plan.ranks[rank][index].tag;
                        format!(
                            "({stream:?} stream, {tag}) waited for {}",
                            call.prepared.plan.events[event]
                        )
                    });
                    if let Err(err) = waited {
                        call.fail(err);
                    }
                }
            }
            Cmd::Wait {
                event,
                target,
                index,
            } => {
                let Some(call) = &self.current else { return };
                if call.aborted() {
                    return;
                }
                if let Err(err) = wait_event(call, rank, stream, event, target, index) {
                    call.fail(err);
                }
            }
            Cmd::Run { index } => {
                let Some(call) = &self.current else { return };
                if call.aborted() {
                    return;
                }
                if call.delay_seed.is_some() && self.rng.next() % 4 == 0 {
                    std::thread::sleep(Duration::from_micros(self.rng.next() % 100));
                }
                run_data(call, rank, index, Meetings::OnThreads);
            }
        }
    }
}

/// How a meeting (`PeerReduce`) meets its peers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Meetings {
    /// At its barriers, on the rank threads (every rank runs at once).
    OnThreads,
    /// Not at all: the pool's phases order it (module `pool`).
    Phased,
}

/// Runs data operation `index` of `rank`'s program, and fails the call with its error, or its
/// panic as [`Error::RankFailed`].
pub(super) fn run_data(call: &HostCall, rank: usize, index: usize, meetings: Meetings) {
    let instr = call.prepared.plan.ranks[rank][index];
    call.running.fetch_add(1, Ordering::AcqRel);
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        run_op(call, rank, index, &instr, meetings)
    }));
    let err = match outcome {
        Ok(Ok(())) => None,
        Ok(Err(err)) => Some(err),
        Err(payload) => Some(Error::RankFailed {
            rank,
            during: instr.tag.to_string(),
            message: format!("panic: {}", panic_message(&*payload)),
        }),
    };
    // Fail before leaving `running`, so no wait blames a victim in between.
    if let Some(err) = err {
        call.fail(err);
    }
    call.running.fetch_sub(1, Ordering::AcqRel);
}

/// Which barriers surround meeting `index` (a `PeerReduce`) of `program`: (one before it, one
/// after it). A fused meeting has no start barrier, and the meeting before it no end barrier (the
/// checker proved that they order nothing): the run's meetings overlap across ranks, as in a GPU
/// kernel that runs them all.
pub(super) fn meeting_barriers(program: &[Instr], index: usize) -> (bool, bool) {
    let fused = |i: usize| {
        matches!(
            program.get(i).map(|instr| instr.op),
            Some(Op::PeerReduce { fused: true, .. })
        )
    };
    (!fused(index), !fused(index + 1))
}

/// Blocks a stream until `event` reaches `target`, the call aborts, or the deadline passes.
fn wait_event(
    call: &HostCall,
    rank: usize,
    stream: StreamKind,
    event: usize,
    target: u64,
    index: usize,
) -> Result<()> {
    let ev = &call.prepared.events[event];
    if crate::exec::spin_until(|| ev.completed.load(Ordering::Acquire) >= target || call.aborted())
        && !call.aborted()
    {
        return Ok(());
    }
    let mut held = ev.lock.lock().unwrap_or_else(|p| p.into_inner());
    while ev.completed.load(Ordering::Acquire) < target {
        if call.aborted() {
            return Err(aborted(rank));
        }
        let now = Instant::now();
        if now >= call.deadline && call.running.load(Ordering::Acquire) == 0 {
            let tag = call.prepared.plan.ranks[rank][index].tag;
            return Err(Error::Timeout {
                rank,
                waiting_on: format!(
                    "({stream:?} stream, {tag}) waited for {}",
                    call.prepared.plan.events[event]
                ),
                after: call.timeout,
            });
        }
        held = ev
            .reached
            .wait_timeout(held, call.wait_slice(now))
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
    Ok(())
}

/// An injected stall: sleeps until `until` (`Ok`; never, for `None`), the call's abort, or its
/// deadline (the timeout, naming the stalled operation).
fn stall_until(
    call: &HostCall,
    rank: usize,
    index: usize,
    instr: &Instr,
    until: Option<Instant>,
) -> Result<()> {
    while !call.aborted() && until.is_none_or(|t| Instant::now() < t) {
        if Instant::now() >= call.deadline {
            return Err(Error::Timeout {
                rank,
                waiting_on: format!(
                    "did not finish instruction {index} ({:?} stream, {}): the operation stalled",
                    instr.stream, instr.tag
                ),
                after: call.timeout,
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if call.aborted() {
        return Err(aborted(rank));
    }
    Ok(())
}

/// Executes one data operation.
fn run_op(
    call: &HostCall,
    rank: usize,
    index: usize,
    instr: &Instr,
    meetings: Meetings,
) -> Result<()> {
    if let Some(fault) = call.fault {
        let len = call.prepared.plan.ranks[rank].len();
        if fault.rank == rank && len > 0 && fault.instr % len == index {
            match fault.kind {
                FaultKind::Fail => {
                    return Err(Error::RankFailed {
                        rank,
                        during: instr.tag.to_string(),
                        message: format!("injected failure at instruction {index}"),
                    })
                }
                FaultKind::Panic => panic!("injected panic at instruction {index}"),
                // Never `Ok`: the abort or the deadline ends it.
                FaultKind::Stall => return stall_until(call, rank, index, instr, None),
                FaultKind::Slow(delay) => {
                    stall_until(call, rank, index, instr, Some(Instant::now() + delay))?
                }
            }
        }
    }
    let eb = call.elem_bytes;
    match instr.op {
        // The host runs an exposure as the copy it is (the plan allows skipping it only to
        // a meeting that sends sources instead of reading them).
        Op::Copy { src, dst } | Op::Expose { src, dst } => {
            // SAFETY: both regions lie inside their buffers (checked plan) and no other thread
            // touches them now (race-free plan); `copy` allows overlap.
            unsafe { std::ptr::copy(call.ptr(src), call.ptr(dst), src.count * eb) }
        }
        Op::Reduce { dst, a, b } => {
            // SAFETY: as above; the checker proved `dst` is `a` or disjoint from `a` and `b`.
            unsafe {
                call.folds.reduce(
                    call.op.combine_op(),
                    call.ptr(dst),
                    call.ptr(a),
                    call.ptr(b),
                    dst.count,
                )
            }
        }
        Op::Scale { region } => {
            // SAFETY: as above.
            unsafe {
                call.folds
                    .scale(call.ptr(region), region.count, call.prepared.plan.world)
            }
        }
        op @ Op::PeerReduce { dst, .. } => {
            let program = &call.prepared.plan.ranks[rank];
            let meeting = program[..index]
                .iter()
                .filter(|i| matches!(i.op, Op::PeerReduce { .. }))
                .count() as u64;
            let (start_barrier, end_barrier) = meeting_barriers(program, index);
            let on_threads = meetings == Meetings::OnThreads;
            if start_barrier && on_threads {
                meet(call, rank, index, 2 * meeting + 1, "start")?;
            }
            let plan = &call.prepared.plan;
            let sources = crate::check::peer_sources(plan, &op);
            // Folded in rank order, as the GPU kernel does (in `Element::Acc`): every rank gets
            // the same bits. A destination (`dst`, and the ranges the pushed two-shot writes in
            // its peers' buffers) may be one of the sources (the two-shot in place: a segment);
            // the fold reads each block of every source before writing it anywhere.
            let sources: Vec<*const u8> =
                sources.iter().map(|s| call.ptr(*s).cast_const()).collect();
            let destinations: Vec<*mut u8> = crate::check::peer_destinations(plan, &op)
                .into_iter()
                .map(|d| call.ptr(d))
                .collect();
            // Nothing runs on an empty region, whose pointers may dangle.
            if dst.count > 0 {
                // SAFETY: the regions lie inside their buffers (checked plan) and hold dst.count
                // elements; the sources are read by every rank between the barriers and written
                // by no rank but where a range it writes is exactly that source, and the
                // destinations are touched by this rank alone between the barriers (the checker
                // proved the meeting well formed and the plan race-free).
                unsafe {
                    call.folds
                        .fold(call.op.combine_op(), &destinations, &sources, dst.count)
                }
            }
            if end_barrier && on_threads {
                meet(call, rank, index, 2 * meeting + 2, "end")?;
            }
        }
        Op::Record(_) | Op::Wait(_) => unreachable!("records and waits are handled by the worker"),
    }
    Ok(())
}

/// A one-shot barrier on threads: rank `rank` arrives for the `arrival`-th time (1-based) and
/// waits until every rank has, the call aborts, or the deadline passes.
///
/// A rank waiting here is not `running`: like a stream waiting on an event, it defers at the
/// deadline to an operation stuck elsewhere, which names itself as the root cause.
fn meet(call: &HostCall, rank: usize, index: usize, arrival: u64, which: &str) -> Result<()> {
    call.running.fetch_sub(1, Ordering::AcqRel);
    let met = match &call.shared {
        Some(shared) => shared.meet(call, rank, arrival, || {
            let tag = call.prepared.plan.ranks[rank][index].tag;
            format!("(Main stream, {tag}) waited at the {which} barrier")
        }),
        None => meet_waiting(call, rank, index, arrival, which),
    };
    call.running.fetch_add(1, Ordering::AcqRel);
    met
}

fn meet_waiting(
    call: &HostCall,
    rank: usize,
    index: usize,
    arrival: u64,
    which: &str,
) -> Result<()> {
    let mut arrivals = call.arrivals.lock().unwrap_or_else(|p| p.into_inner());
    arrivals[rank] = arrival;
    // Only the last to arrive wakes the others (each arrival waking every waiter is n² wake-ups
    // a barrier; an abort is seen within a wait slice).
    if arrivals.iter().all(|&a| a >= arrival) {
        call.all_arrived.fetch_max(arrival, Ordering::Release);
        call.arrived.notify_all();
        return Ok(());
    }
    drop(arrivals);
    if crate::exec::spin_until(|| {
        call.all_arrived.load(Ordering::Acquire) >= arrival || call.aborted()
    }) && !call.aborted()
    {
        return Ok(());
    }
    let mut arrivals = call.arrivals.lock().unwrap_or_else(|p| p.into_inner());
    while arrivals.iter().any(|&a| a < arrival) {
        if call.aborted() {
            return Err(aborted(rank));
        }
        let now = Instant::now();
        if now >= call.deadline && call.running.load(Ordering::Acquire) == 0 {
            let missing: Vec<usize> = (0..arrivals.len())
                .filter(|&r| arrivals[r] < arrival)
                .collect();
            let tag = call.prepared.plan.ranks[rank][index].tag;
            return Err(Error::Timeout {
                rank,
                waiting_on: format!(
                    "(Main stream, {tag}) waited at the {which} barrier for rank(s) {missing:?}"
                ),
                after: call.timeout,
            });
        }
        arrivals = call
            .arrived
            .wait_timeout(arrivals, call.wait_slice(now))
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
    Ok(())
}
