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

use super::enqueue::{check_order, enqueue_order};
use super::{accesses, describe, reject, Check};
use crate::plan::{BufId, BufKind, Instr, Op, Plan, Region, StreamKind};
use std::collections::HashMap;

/// One memory access, for the race check.
struct Access {
    region: Region,
    write: bool,
    /// Index into the executed-instruction list.
    at: usize,
}

/// An allocation as the race check identifies it across calls: a caller's buffer (by rank and
/// kind) is the same memory in every call (the worst case: the caller passes the same buffers
/// again); an exposed copy (by rank) is the same memory in every call of every plan, as the GPU
/// executor keeps them all in one region per rank (`exec::cuda::executor::exposure`); other
/// staging (by plan and buffer) belongs to one prepared plan and is shared only by the calls of
/// that plan.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Allocation {
    Caller(usize, BufKind),
    Exposure(usize),
    Staging(usize, BufId),
}

/// Check 3: no data race over `calls` back-to-back calls; every access to the caller's buffers
/// follows the work queued on its rank's Main stream before the call (a caller's stream can
/// stand in for Main), and completion on Main covers them all.
pub fn check_races(plan: &Plan, order: &[(usize, usize)], calls: usize) -> Check {
    races(&[(plan, order)], &vec![0; calls])
}

/// Check 3 for a sequence of calls of different plans of one world — what an executor does when
/// shapes change from call to call (a size sweep, a training step with tensors of several
/// sizes): streams persist, each plan has its own events and staging but shares the exposed
/// copies (`Allocation`), and the caller's buffers may be the same in every call.
pub fn check_sequence(plans: &[&Plan], sequence: &[usize]) -> Check {
    let orders = plans
        .iter()
        .map(|p| enqueue_order(p))
        .collect::<Check<Vec<_>>>()?;
    let with_orders: Vec<(&Plan, &[(usize, usize)])> = plans
        .iter()
        .zip(&orders)
        .map(|(p, o)| (*p, o.as_slice()))
        .collect();
    races(&with_orders, sequence)
}

fn races(plans: &[(&Plan, &[(usize, usize)])], sequence: &[usize]) -> Check {
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
    let allocation = |k: usize, buf: BufId| {
        let decl = plans[k].0.decl(buf);
        if decl.kind.is_callers() {
            Allocation::Caller(decl.rank, decl.kind)
        } else if decl.kind == BufKind::Exposed {
            Allocation::Exposure(decl.rank)
        } else {
            Allocation::Staging(k, buf)
        }
    };
    // Vector clock of each stream and of each event's latest record, per plan.
    let mut stream_clock = vec![vec![0u32; streams]; streams];
    let mut event_clock: Vec<Vec<Option<Vec<u32>>>> = plans
        .iter()
        .map(|(p, _)| vec![None; p.events.len()])
        .collect();
    // Per executed instruction: (plan, rank, index, call, stream, own sequence number).
    let mut executed: Vec<(usize, usize, usize, usize, usize, u32)> = Vec::new();
    let mut clocks: Vec<Vec<u32>> = Vec::new();
    // The clock at which each executed instruction is complete: its access clock, except for a
    // meeting, which completes only after its end barrier (every participant's accesses done).
    let mut done_clocks: Vec<Vec<u32>> = Vec::new();
    let mut by_allocation: HashMap<Allocation, Vec<(Access, usize)>> = HashMap::new();
    // Per call and rank: the tick of rank r's Main stream that stands for the work the caller
    // queued there before the call.
    let mut caller_ticks: Vec<Vec<u32>> = Vec::new();
    for (call, &k) in sequence.iter().enumerate() {
        let (plan, order) = plans[k];
        caller_ticks.push(
            (0..world)
                .map(|rank| {
                    let main = rank * StreamKind::ALL.len() + StreamKind::Main.index();
                    stream_clock[main][main] += 1;
                    stream_clock[main][main]
                })
                .collect(),
        );
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
                executed.push((k, rank, index, call, s, stream_clock[s][s]));
                clocks.push(stream_clock[s].clone());
                done_clocks.push(stream_clock[s].clone());
                let (reads, writes) = accesses(plan, &instr.op);
                for (region, write) in reads
                    .into_iter()
                    .map(|r| (r, false))
                    .chain(writes.into_iter().map(|w| (w, true)))
                {
                    if region.count > 0 {
                        by_allocation
                            .entry(allocation(k, region.buf))
                            .or_default()
                            .push((Access { region, write, at }, k));
                    }
                }
            }
            if group.len() > 1 {
                let joined = join(streams_of.iter().map(|&s| &stream_clock[s]));
                for &s in &streams_of {
                    stream_clock[s].clone_from(&joined);
                }
                let first = done_clocks.len() - group.len();
                for done in &mut done_clocks[first..] {
                    done.clone_from(&joined);
                }
            }
            next += group.len();
        }
    }
    let before = |a: usize, b: usize| {
        let (_, _, _, _, s, seq) = executed[a];
        clocks[b][s] >= seq
    };
    let name = |at: usize| {
        let (k, rank, index, call, _, _) = executed[at];
        format!("{} in call {}", describe(plans[k].0, rank, index), call + 1)
    };
    let what = |k: usize, buf: BufId| {
        let decl = plans[k].0.decl(buf);
        format!("{:?} of rank {}", decl.kind, decl.rank)
    };
    for list in by_allocation.values_mut() {
        list.sort_by_key(|(a, _)| (a.region.offset, a.at));
        for i in 0..list.len() {
            for j in i + 1..list.len() {
                let ((x, kx), (y, _)) = (&list[i], &list[j]);
                if y.region.offset >= x.region.end() {
                    break;
                }
                if !(x.write || y.write) || x.at == y.at {
                    continue;
                }
                let (first, second) = if x.at < y.at {
                    (x.at, y.at)
                } else {
                    (y.at, x.at)
                };
                if !before(first, second) {
                    return reject(format!(
                        "data race on {} (elements {}..{} and {}..{}): {} and {} are not ordered by any event",
                        what(*kx, x.region.buf),
                        x.region.offset,
                        x.region.end(),
                        y.region.offset,
                        y.region.end(),
                        name(first),
                        name(second)
                    ));
                }
            }
        }
    }
    // Start: every access to rank r's input and output, by any rank, follows what the caller
    // queued on rank r's Main stream before the call (the tick above) — the kernel that wrote
    // the input, say.
    for list in by_allocation.values() {
        for (a, _) in list {
            let (k, _, _, call, _, _) = executed[a.at];
            let Allocation::Caller(owner, kind) = allocation(k, a.region.buf) else {
                continue;
            };
            let main = owner * StreamKind::ALL.len() + StreamKind::Main.index();
            if clocks[a.at][main] < caller_ticks[call][owner] {
                return reject(format!(
                    "{} can touch rank {owner}'s {kind:?} before work queued on rank {owner}'s Main stream ahead of the call is done",
                    name(a.at),
                ));
            }
        }
    }
    // Completion: rank r's last Main instruction (of the last call) follows every access to its
    // input and output.
    for rank in 0..world {
        let Some(last) = (0..executed.len()).rev().find(|&at| {
            let (k, r, index, ..) = executed[at];
            r == rank && plans[k].0.ranks[r][index].stream == StreamKind::Main
        }) else {
            continue;
        };
        for (mem, list) in &by_allocation {
            let Allocation::Caller(owner, kind) = *mem else {
                continue;
            };
            if owner != rank {
                continue;
            }
            if let Some((a, _)) = list.iter().find(|(a, _)| {
                let (_, _, _, _, s, seq) = executed[a.at];
                a.at != last && done_clocks[last][s] < seq
            }) {
                return reject(format!(
                    "rank {rank}'s Main stream can finish before {} is done with its {kind:?}: the caller would see the call complete too early",
                    name(a.at),
                ));
            }
        }
    }
    Ok(())
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
