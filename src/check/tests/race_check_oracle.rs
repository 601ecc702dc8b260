//! The race check ([`check_races`], one sweep that remembers each run of elements' last write
//! and latest reads) against the obvious one: every two overlapping accesses of one allocation,
//! at least one a write, compared by their vector clocks. Both on random ring plans with random
//! faults planted, and on the planted faults of every test plan: the same verdict, and the
//! faulty plans must reach both (so that "they agree" is not only "both accept").

use super::symbolic::{count_agreeing, plant_all, plants_strategy, ring_strategy};
use crate::check::*;
use crate::plan::{BufKind, Op, Plan, Region, StreamKind};
use std::collections::HashMap;

/// The memory an access touches: (0 caller's | 1 exposed | 2 staging, kind, rank or buffer).
type Memory = (usize, BufKind, usize);

/// One access: (memory, region, write, instruction number, stream, seq, clock, call).
type Access = (Memory, Region, bool, usize, usize, u32, Vec<u32>, usize);

/// Check 3 pair by pair, for `calls` back-to-back calls of one plan: the reference. Its verdict
/// only (the sweep may name another pair of the same race).
fn check_races_pairwise(plan: &Plan, order: &[(usize, usize)], calls: usize) -> bool {
    let world = plan.world;
    let streams = world * StreamKind::ALL.len();
    let main_of = |rank: usize| rank * StreamKind::ALL.len() + StreamKind::Main.index();
    let mut stream_clock = vec![vec![0u32; streams]; streams];
    let mut event_clock: Vec<Option<Vec<u32>>> = vec![None; plan.events.len()];
    let mut accesses: Vec<Access> = Vec::new();
    let mut done: Vec<Vec<u32>> = Vec::new(); // per instruction: its completion clock
    let mut main_of_instr: Vec<Option<usize>> = Vec::new(); // rank, when on Main
    let mut ticks: Vec<Vec<u32>> = Vec::new();
    for call in 0..calls {
        ticks.push(
            (0..world)
                .map(|r| {
                    let m = main_of(r);
                    stream_clock[m][m] += 1;
                    stream_clock[m][m]
                })
                .collect(),
        );
        let mut next = 0;
        while next < order.len() {
            let (rank, index) = order[next];
            let meeting = matches!(plan.ranks[rank][index].op, Op::PeerReduce { .. });
            let group = &order[next..next + if meeting { world } else { 1 }];
            let stream = |&(r, i): &(usize, usize)| {
                r * StreamKind::ALL.len() + plan.ranks[r][i].stream.index()
            };
            let join = |clocks: &Vec<Vec<u32>>, group: &[(usize, usize)]| -> Vec<u32> {
                (0..streams)
                    .map(|c| {
                        group
                            .iter()
                            .map(|g| clocks[stream(g)][c])
                            .max()
                            .unwrap_or(0)
                    })
                    .collect()
            };
            if meeting {
                let j = join(&stream_clock, group);
                for g in group {
                    stream_clock[stream(g)] = j.clone();
                }
            }
            let first = done.len();
            for g @ &(r, i) in group {
                let s = stream(g);
                let instr = &plan.ranks[r][i];
                if let Op::Wait(e) = instr.op {
                    let Some(rec) = &event_clock[e.0] else {
                        return false;
                    };
                    for (m, t) in stream_clock[s].iter_mut().zip(rec) {
                        *m = (*m).max(*t);
                    }
                }
                stream_clock[s][s] += 1;
                if let Op::Record(e) = instr.op {
                    event_clock[e.0] = Some(stream_clock[s].clone());
                }
                let at = done.len();
                done.push(stream_clock[s].clone());
                main_of_instr.push((instr.stream == StreamKind::Main).then_some(r));
                let (reads, writes) = super::super::accesses(plan, &instr.op);
                for (region, write) in reads
                    .into_iter()
                    .map(|x| (x, false))
                    .chain(writes.into_iter().map(|x| (x, true)))
                {
                    if region.count == 0 {
                        continue;
                    }
                    let decl = plan.decl(region.buf);
                    let memory = match decl.kind {
                        k if k.is_callers() => (0, k, decl.rank),
                        BufKind::Exposed => (1, BufKind::Exposed, decl.rank),
                        _ => (2, decl.kind, region.buf.0),
                    };
                    let (seq, clock) = (stream_clock[s][s], stream_clock[s].clone());
                    accesses.push((memory, region, write, at, s, seq, clock, call));
                }
            }
            if meeting {
                let j = join(&stream_clock, group);
                for g in group {
                    stream_clock[stream(g)] = j.clone();
                }
                for d in &mut done[first..] {
                    d.clone_from(&j);
                }
            }
            next += group.len();
        }
    }
    let mut by_memory: HashMap<(usize, BufKind, usize), Vec<usize>> = HashMap::new();
    for (k, a) in accesses.iter().enumerate() {
        by_memory.entry(a.0).or_default().push(k);
    }
    for list in by_memory.values() {
        for (n, &x) in list.iter().enumerate() {
            for &y in &list[n + 1..] {
                let (a, b) = (&accesses[x], &accesses[y]);
                let overlap = a.1.offset < b.1.end() && b.1.offset < a.1.end();
                if !overlap || !(a.2 || b.2) || a.3 == b.3 {
                    continue;
                }
                let (early, late) = if a.3 < b.3 { (a, b) } else { (b, a) };
                if late.6[early.4] < early.5 {
                    return false;
                }
            }
        }
    }
    for a in &accesses {
        if let (0, _, owner) = a.0 {
            if a.6[main_of(owner)] < ticks[a.7][owner] {
                return false;
            }
        }
    }
    for rank in 0..world {
        let Some(last) = (0..done.len())
            .rev()
            .find(|&i| main_of_instr[i] == Some(rank))
        else {
            continue;
        };
        for a in &accesses {
            if a.0 .0 == 0 && a.0 .2 == rank && a.3 != last && done[last][a.4] < a.5 {
                return false;
            }
        }
    }
    true
}

/// Both verdicts on one plan, `None` where the enqueue simulation rejects it first (the race
/// check never sees such a plan).
fn verdicts(plan: &Plan) -> Option<(bool, bool)> {
    check_shape(plan).ok()?;
    let order = enqueue_order(plan).ok()?;
    Some((
        check_races(plan, &order, 2).is_ok(),
        check_races_pairwise(plan, &order, 2),
    ))
}

/// The plan without its `pick`-th wait (counted over all ranks, modulo their number): the
/// fault a race check exists for.
fn drop_wait(mut plan: Plan, pick: usize) -> Plan {
    let waits: Vec<(usize, usize)> = (0..plan.world)
        .flat_map(|r| {
            let program = &plan.ranks[r];
            (0..program.len())
                .filter(move |&i| matches!(program[i].op, Op::Wait(_)))
                .map(move |i| (r, i))
        })
        .collect();
    if let Some(&(r, i)) = waits.get(pick % waits.len().max(1)) {
        plan.ranks[r].remove(i);
    }
    plan
}

/// Random ring plans (peer and staged edges, in place and not, Avg) with up to three random
/// faults planted (dropped instructions, shifted ranges, …) and, in most, one wait dropped: the
/// sweep and the pairwise check agree on every one; both accept every unplanted plan; and at
/// least a tenth of the compared plans are races (rejected by both), so the agreement covers
/// rejections too.
#[test]
fn the_sweep_agrees_with_every_pair_on_random_planted_ring_plans() {
    let rejected = std::cell::Cell::new(0u32);
    let compared = count_agreeing(
        600,
        (
            ring_strategy(),
            plants_strategy(),
            proptest::option::of(0usize..1000),
        ),
        |(spec, plants, wait)| {
            let plan = spec.build().unwrap();
            assert_eq!(verdicts(&plan), Some((true, true)), "{spec:?}");
            let planted = plant_all(plan, &plants);
            let broken = match wait {
                Some(pick) => drop_wait(planted, pick),
                None => planted,
            };
            let Some((sweep, pairs)) = verdicts(&broken) else {
                return false;
            };
            assert_eq!(sweep, pairs, "{spec:?} with {plants:?}, wait {wait:?}");
            rejected.set(rejected.get() + u32::from(!sweep));
            true
        },
    );
    println!("{} of {compared} compared plans were races", rejected.get());
    assert!(
        compared >= 200,
        "{compared} of 600 planted plans were compared"
    );
    assert!(
        rejected.get() >= compared / 10,
        "only {} of {compared} compared plans were races",
        rejected.get()
    );
}
