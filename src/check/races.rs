//! Check 3, no data race: every two accesses to overlapping elements of one allocation, at
//! least one a write, are ordered by happens-before.
//!
//! Happens-before is program order within a stream plus record → wait edges, tracked with vector
//! clocks (Lamport, Fidge/Mattern), one component per stream. A meeting joins its members' clocks
//! at its start and end barriers. Checking `calls = 2` runs the plan twice back to back (streams
//! and events persist, the caller's barrier between calls), which proves that the next call
//! cannot trample a slot the previous call is still reading; [`check_sequence`] does the same for
//! calls of *different* plans. Each rank's last Main instruction must also come after every access
//! to its input and output: when Main is done, the caller's buffers are free.
//!
//! The pairs are not enumerated: one sweep over the accesses in the execution order remembers,
//! for each run of elements of each allocation, its last write and the latest read on each
//! stream since (FastTrack's argument, [`Seen`]); a new access is checked against those alone.
//! So the check costs the accesses times the runs each covers — linear in the plan for the
//! ring's chunks — where every pair of overlapping accesses grew with the square of a plan with
//! many chunks. `check/tests/race_check_oracle.rs` holds it to the pairwise definition on random plans with
//! planted faults.

use super::enqueue_order::{check_order, enqueue_order};
use super::{accesses, describe, reject, Check};
use crate::plan::{BufId, BufKind, Instr, Op, Plan, StreamKind};
use std::collections::{BTreeMap, HashMap};

/// An allocation as the race check identifies it across calls: a caller's buffer (by rank and
/// kind) is the same memory in every call (the worst case: the caller passes the same buffers
/// again); an exposed copy (by rank) is the same memory in every call of every plan, as the GPU
/// executor keeps them all in one region per rank (`exec::cuda::executor::exposure`); a buffer
/// laid out in its rank's arena ([`crate::plan::arena`]) lies at its offset of the one arena of
/// that rank, which every plan laid out shares; other staging (by plan and buffer) belongs to
/// one prepared plan and is shared only by the calls of that plan.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Allocation {
    Caller(usize, BufKind),
    Exposure(usize),
    Arena(usize),
    Staging(usize, BufId),
}

/// Check 3: no data race over `calls` back-to-back calls; every access to the caller's buffers
/// follows the work queued on its rank's Main stream before the call (a caller's stream can
/// stand in for Main), and completion on Main covers them all.
pub fn check_races(plan: &Plan, order: &[(usize, usize)], calls: usize) -> Check {
    races(&[(plan, order)], &[None], &vec![0; calls])
}

/// Check 3 for a sequence of calls of different plans of one world — what an executor does when
/// shapes change from call to call (a size sweep, a training step with tensors of several
/// sizes): streams persist, each plan has its own events and staging but shares the exposed
/// copies (`Allocation`), and the caller's buffers may be the same in every call.
pub fn check_sequence(plans: &[&Plan], sequence: &[usize]) -> Check {
    check_sequence_in_arenas(plans, &vec![None; plans.len()], sequence)
}

/// [`check_sequence`] where plan k's buffers with an offset in `layouts[k]` (an
/// [`arena_layout`](crate::plan::arena::arena_layout), in elements) lie in their rank's one
/// arena at that offset, shared by every plan laid out — what the GPU executor does across
/// processes for the plans each rank prepares alone. The caller's buffers a layout places are
/// the executor's staged copies of them (the caller's own are then never touched by a peer).
pub fn check_sequence_in_arenas(
    plans: &[&Plan],
    layouts: &[Option<&[Option<usize>]>],
    sequence: &[usize],
) -> Check {
    if layouts.len() != plans.len() {
        return reject(format!(
            "{} layouts for {} plans",
            layouts.len(),
            plans.len()
        ));
    }
    let orders = plans
        .iter()
        .map(|p| enqueue_order(p))
        .collect::<Check<Vec<_>>>()?;
    let with_orders: Vec<(&Plan, &[(usize, usize)])> = plans
        .iter()
        .zip(&orders)
        .map(|(p, o)| (*p, o.as_slice()))
        .collect();
    races(&with_orders, layouts, sequence)
}

fn races(
    plans: &[(&Plan, &[(usize, usize)])],
    layouts: &[Option<&[Option<usize>]>],
    sequence: &[usize],
) -> Check {
    let Some(&(first, _)) = plans.first() else {
        return Ok(());
    };
    let world = first.world;
    if plans.iter().any(|(p, _)| p.world != world) {
        return reject("a sequence of calls must keep one world".into());
    }
    if let Some(&bad) = sequence.iter().find(|&&k| k >= plans.len()) {
        return reject(format!("the sequence names plan {bad} of {}", plans.len()));
    }
    for (plan, order) in plans {
        check_order(plan, order)?;
    }
    let streams = world * StreamKind::ALL.len();
    let stream_of =
        |rank: usize, instr: &Instr| rank * StreamKind::ALL.len() + instr.stream.index();
    // Each buffer's allocation, and the element of it where the buffer starts.
    let allocation = |k: usize, buf: BufId| {
        let decl = plans[k].0.decl(buf);
        let placed = layouts[k].and_then(|offsets| offsets.get(buf.0).copied().flatten());
        if let Some(base) = placed {
            (Allocation::Arena(decl.rank), base)
        } else if decl.kind.is_callers() {
            (Allocation::Caller(decl.rank, decl.kind), 0)
        } else if decl.kind == BufKind::Exposed {
            (Allocation::Exposure(decl.rank), 0)
        } else {
            (Allocation::Staging(k, buf), 0)
        }
    };
    // Vector clock of each stream and of each event's latest record, per plan.
    let mut stream_clock = vec![vec![0u32; streams]; streams];
    let mut event_clock: Vec<Vec<Option<Vec<u32>>>> = plans
        .iter()
        .map(|(p, _)| vec![None; p.events.len()])
        .collect();
    // Per executed instruction: (plan, rank, index, call), to name it.
    let mut executed: Vec<(usize, usize, usize, usize)> = Vec::new();
    let name = |executed: &[(usize, usize, usize, usize)], at: usize| {
        let (k, rank, index, call) = executed[at];
        format!("{} in call {}", describe(plans[k].0, rank, index), call + 1)
    };
    let what = |k: usize, buf: BufId| {
        let decl = plans[k].0.decl(buf);
        format!("{:?} of rank {}", decl.kind, decl.rank)
    };
    let mut memory: HashMap<Allocation, Runs> = HashMap::new();
    // The first access to a caller's buffer that can run before the caller's earlier work on
    // Main (reported after the race sweep, as a race is the more specific diagnosis).
    let mut early: Option<String> = None;
    // Per rank: the latest access to its caller's buffers on each stream (seq, instruction,
    // kind), and its latest Main instruction's completion clock.
    let mut caller_latest: Vec<Vec<Option<(u32, usize, BufKind)>>> =
        vec![vec![None; streams]; world];
    let mut last_main: Vec<Option<Vec<u32>>> = vec![None; world];
    for (call, &k) in sequence.iter().enumerate() {
        let (plan, order) = plans[k];
        // Per rank: the tick of rank r's Main stream that stands for the work the caller queued
        // there before the call.
        let caller_ticks: Vec<u32> = (0..world)
            .map(|rank| {
                let main = rank * StreamKind::ALL.len() + StreamKind::Main.index();
                stream_clock[main][main] += 1;
                stream_clock[main][main]
            })
            .collect();
        let mut next = 0;
        while next < order.len() {
            let (rank, index) = order[next];
            let instr = &plan.ranks[rank][index];
            // A meeting (`PeerReduce`): the world's instructions are adjacent in `order`, rank 0
            // first (`check_order` above). Its start barrier joins every participant's clock;
            // each then accesses memory concurrently with the others; the end barrier joins them
            // again.
            let group = if matches!(instr.op, Op::PeerReduce { .. }) {
                &order[next..next + world]
            } else {
                &order[next..next + 1]
            };
            let streams_of: Vec<usize> = group
                .iter()
                .map(|&(r, i)| stream_of(r, &plan.ranks[r][i]))
                .collect();
            if group.len() > 1 {
                let joined = join(streams_of.iter().map(|&s| &stream_clock[s]));
                for &s in &streams_of {
                    stream_clock[s].clone_from(&joined);
                }
            }
            for (&(rank, index), &s) in group.iter().zip(&streams_of) {
                let instr = &plan.ranks[rank][index];
                if let Op::Wait(e) = instr.op {
                    let Some(recorded) = event_clock[k].get(e.0).and_then(Option::as_ref) else {
                        return reject(format!(
                            "{} in call {} waits on event {} before the order records it",
                            describe(plan, rank, index),
                            call + 1,
                            e.0
                        ));
                    };
                    for (mine, theirs) in stream_clock[s].iter_mut().zip(recorded) {
                        *mine = (*mine).max(*theirs);
                    }
                }
                stream_clock[s][s] += 1;
                if let Op::Record(e) = instr.op {
                    event_clock[k][e.0] = Some(stream_clock[s].clone());
                }
                let at = executed.len();
                executed.push((k, rank, index, call));
                let me = Epoch {
                    stream: s,
                    seq: stream_clock[s][s],
                    at,
                };
                let clock = &stream_clock[s];
                let ordered = |prev: &Epoch| prev.at == at || clock[prev.stream] >= prev.seq;
                let (reads, writes) = accesses(plan, &instr.op);
                for (region, write) in reads
                    .into_iter()
                    .map(|r| (r, false))
                    .chain(writes.into_iter().map(|w| (w, true)))
                {
                    if region.count == 0 {
                        continue;
                    }
                    let (allocation, base) = allocation(k, region.buf);
                    let mut unordered: Option<Epoch> = None;
                    memory.entry(allocation).or_default().visit(
                        base + region.offset,
                        base + region.end(),
                        |seen| {
                            let conflict = match write {
                                true => seen.write.iter().chain(&seen.reads).find(|p| !ordered(p)),
                                false => seen.write.iter().find(|p| !ordered(p)),
                            };
                            if let Some(p) = conflict {
                                unordered.get_or_insert(*p);
                            }
                            seen.note(me, write);
                        },
                    );
                    if let Some(other) = unordered {
                        return reject(format!(
                            "data race on {} (elements {}..{}): {} and {} are not ordered by any event",
                            what(k, region.buf),
                            region.offset,
                            region.end(),
                            name(&executed, other.at),
                            name(&executed, at)
                        ));
                    }
                    if let Allocation::Caller(owner, kind) = allocation {
                        // Start: every access to rank r's input and output, by any rank,
                        // follows what the caller queued on rank r's Main stream before the
                        // call (the tick above) — the kernel that wrote the input, say.
                        let main = owner * StreamKind::ALL.len() + StreamKind::Main.index();
                        if clock[main] < caller_ticks[owner] && early.is_none() {
                            early = Some(format!(
                                "{} can touch rank {owner}'s {kind:?} before work queued on rank {owner}'s Main stream ahead of the call is done",
                                name(&executed, at),
                            ));
                        }
                        let latest = &mut caller_latest[owner][s];
                        if latest.is_none_or(|(seq, _, _)| seq <= me.seq) {
                            *latest = Some((me.seq, at, kind));
                        }
                    }
                }
                if instr.stream == StreamKind::Main && group.len() == 1 {
                    last_main[rank] = Some(stream_clock[s].clone());
                }
            }
            if group.len() > 1 {
                let joined = join(streams_of.iter().map(|&s| &stream_clock[s]));
                for &s in &streams_of {
                    stream_clock[s].clone_from(&joined);
                }
                // A meeting completes only after its end barrier (every participant's accesses
                // done).
                for &(rank, index) in group {
                    if plan.ranks[rank][index].stream == StreamKind::Main {
                        last_main[rank] = Some(joined.clone());
                    }
                }
            }
            next += group.len();
        }
    }
    if let Some(message) = early {
        return reject(message);
    }
    // Completion: rank r's last Main instruction (of the last call) follows every access to its
    // input and output.
    for rank in 0..world {
        let Some(done) = &last_main[rank] else {
            continue;
        };
        for (s, latest) in caller_latest[rank].iter().enumerate() {
            let Some((seq, at, kind)) = *latest else {
                continue;
            };
            if done[s] < seq {
                return reject(format!(
                    "rank {rank}'s Main stream can finish before {} is done with its {kind:?}: the caller would see the call complete too early",
                    name(&executed, at),
                ));
            }
        }
    }
    Ok(())
}

/// An access, as the race check remembers it: its stream, that stream's own count at it, and
/// the executed instruction it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Epoch {
    stream: usize,
    seq: u32,
    at: usize,
}

/// What one run of elements of an allocation has seen: its last write, and the latest read on
/// each stream since that write. Enough to check a new access against every earlier one
/// (FastTrack's argument): accesses are checked in an execution order, and the check stops at
/// the first race, so an accepted write is ordered after every earlier access of its elements,
/// and a later access ordered after it is ordered after them too; two reads on one stream are
/// ordered, so the latest stands for both.
#[derive(Clone, Debug, Default)]
struct Seen {
    write: Option<Epoch>,
    reads: Vec<Epoch>,
}

impl Seen {
    fn note(&mut self, access: Epoch, write: bool) {
        if write {
            self.write = Some(access);
            self.reads.clear();
        } else if let Some(read) = self.reads.iter_mut().find(|r| r.stream == access.stream) {
            *read = access;
        } else {
            self.reads.push(access);
        }
    }
}

/// One allocation's runs of elements (disjoint, by their start: start → (end, seen)), cut at
/// the ends of every access so far; elements never accessed have no run.
#[derive(Default)]
struct Runs {
    runs: BTreeMap<usize, (usize, Seen)>,
}

impl Runs {
    /// Cuts the run that holds element `at` inside (not at its start) in two.
    fn split(&mut self, at: usize) {
        let Some((&start, (end, seen))) = self.runs.range(..at).next_back() else {
            return;
        };
        if *end > at {
            let (end, seen) = (*end, seen.clone());
            self.runs.insert(start, (at, seen.clone()));
            self.runs.insert(at, (end, seen));
        }
    }

    /// Calls `f` on every run of elements `from..to` (making runs for the elements not seen
    /// before), in order.
    fn visit(&mut self, from: usize, to: usize, mut f: impl FnMut(&mut Seen)) {
        self.split(from);
        self.split(to);
        let mut gaps = Vec::new();
        let mut cursor = from;
        for (&start, &(end, _)) in self.runs.range(from..to) {
            if start > cursor {
                gaps.push((cursor, start));
            }
            cursor = end;
        }
        if cursor < to {
            gaps.push((cursor, to));
        }
        for (start, end) in gaps {
            self.runs.insert(start, (end, Seen::default()));
        }
        for (_, (_, seen)) in self.runs.range_mut(from..to) {
            f(seen);
        }
    }
}

/// The elementwise maximum of vector clocks.
fn join<'a>(clocks: impl Iterator<Item = &'a Vec<u32>>) -> Vec<u32> {
    let mut joined: Vec<u32> = Vec::new();
    for c in clocks {
        if joined.is_empty() {
            joined = c.clone();
        } else {
            for (j, x) in joined.iter_mut().zip(c) {
                *j = (*j).max(*x);
            }
        }
    }
    joined
}
