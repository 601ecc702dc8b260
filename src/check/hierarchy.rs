//! The proof of a hierarchical plan ([`crate::plan::hierarchy`]): its stages executed on symbolic
//! values over every rank of the job, each collective stage by its collective's semantics.
//!
//! As in the plan checker's symbolic result (`result.rs`), element p holding a value means "the
//! fold over a set of ranks of their input element p + shift"; rank g's input holds `{g}` at
//! shift 0 (an in-place buffer holds it where the collective puts the input). A stage of one
//! level works on each of its groups (one host's ranks, or one local index's ranks across the
//! hosts) as that collective's table defines for a world of the group's size
//! ([`crate::plan::Collective`]), the table the plan checker proves every intra-host plan
//! against; where NCCL leaves memory undefined (the other blocks of an in-place reduce-scatter,
//! a reduce's non-root buffers) the value becomes unknown, and reading it later is rejected. A
//! fold rejects operands that share a rank (a contribution counted twice), name different
//! elements, or were never written. At the end every range the job's collective defines must
//! hold exactly its value, and for `Avg` be divided exactly once, after the sum was complete.
//!
//! Spans are checked against their buffers on every rank that uses them, and a collective stage
//! against its group: every member of a group takes part, roots lie in the group, the span's
//! length is the collective's in-place length for the group.
//!
//! Memory is held as runs of equal values, so the cost is the stages times the ranks times the
//! runs a span touches, whatever the count. Rank sets are bit sets as wide as the world: the
//! proof has no world limit of its own (the job's size is limited by what one host's plans
//! prove, not by this).

use super::{reject, Check};
use crate::plan::hierarchy::{Area, HierarchyPlan, Hosts, Span, Stage};
use crate::plan::Collective;

/// A symbolic value: the fold over `ranks` of their input element `p + shift` at element p,
/// divided by the world `scaled` times.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Val {
    ranks: Vec<u64>,
    shift: i64,
    scaled: u8,
}

impl Val {
    fn input(rank: usize, world: usize, shift: i64) -> Val {
        let mut ranks = vec![0u64; world.div_ceil(64)];
        ranks[rank / 64] |= 1 << (rank % 64);
        Val {
            ranks,
            shift,
            scaled: 0,
        }
    }

    fn full(world: usize, shift: i64, scaled: u8) -> Val {
        let mut ranks = vec![u64::MAX; world.div_ceil(64)];
        if world % 64 != 0 {
            ranks[world / 64] = (1u64 << (world % 64)) - 1;
        }
        Val {
            ranks,
            shift,
            scaled,
        }
    }

    fn moved(&self, by: i64) -> Val {
        Val {
            shift: self.shift + by,
            ..self.clone()
        }
    }
}

/// `len` elements holding one value (`None`: nothing defined there).
type Run = (usize, Option<Val>);

/// One buffer of one rank, as runs covering it.
#[derive(Clone, Debug)]
struct Mem {
    runs: Vec<Run>,
}

impl Mem {
    fn new(len: usize, init: Vec<Run>) -> Mem {
        let mut runs: Vec<Run> = init.into_iter().filter(|r| r.0 > 0).collect();
        if runs.is_empty() && len > 0 {
            runs.push((len, None));
        }
        Mem { runs }
    }

    fn len(&self) -> usize {
        self.runs.iter().map(|r| r.0).sum()
    }

    /// The runs of elements `lo..hi`, values as they are (each relative to its own element).
    fn cut(&self, lo: usize, hi: usize) -> Vec<Run> {
        let mut out = Vec::new();
        let mut at = 0;
        for (n, v) in &self.runs {
            let (a, b) = (at.max(lo), (at + n).min(hi));
            if a < b {
                out.push((b - a, v.clone()));
            }
            at += n;
        }
        out
    }

    /// Elements `offset..offset + len`, each value's shift counted from the range's start.
    fn read(&self, offset: usize, len: usize) -> Vec<Run> {
        let mut runs = self.cut(offset, offset + len);
        for v in runs.iter_mut().filter_map(|r| r.1.as_mut()) {
            v.shift += offset as i64;
        }
        runs
    }

    /// Writes runs whose shifts count from the range's start, at `offset`.
    fn write(&mut self, offset: usize, runs: &[Run]) {
        let (len, end) = (self.len(), offset + runs.iter().map(|r| r.0).sum::<usize>());
        let placed = runs
            .iter()
            .map(|(n, v)| (*n, v.as_ref().map(|v| v.moved(-(offset as i64)))));
        let all: Vec<Run> = self
            .cut(0, offset)
            .into_iter()
            .chain(placed)
            .chain(self.cut(end, len))
            .filter(|r| r.0 > 0)
            .collect();
        // Neighbouring equal runs merge, so the number of runs follows the values, not the
        // history of writes.
        let mut merged: Vec<Run> = Vec::with_capacity(all.len());
        for (n, v) in all {
            match merged.last_mut() {
                Some(last) if last.1 == v => last.0 += n,
                _ => merged.push((n, v)),
            }
        }
        self.runs = merged;
    }
}

/// Every rank's three buffers (`None` where the rank has no such buffer).
struct State {
    mem: Vec<[Option<Mem>; 3]>,
}

fn area_index(area: Area) -> usize {
    match area {
        Area::Input => 0,
        Area::Output => 1,
        Area::Work => 2,
    }
}

fn area_name(area: Area) -> &'static str {
    match area {
        Area::Input => "input",
        Area::Output => "output",
        Area::Work => "work buffer",
    }
}

/// Proves that the hierarchical plan computes its collective (module doc).
pub fn check_hierarchy(plan: &HierarchyPlan) -> Check {
    let hosts = plan.hosts;
    let world = hosts.world();
    let mut state = initial(plan);
    for (i, stage) in plan.stages.iter().enumerate() {
        run_stage(plan, &mut state, stage)
            .map_err(|e| super::Rejection(format!("stage {i} ({}): {}", describe(stage), e.0)))?;
    }
    for (rank, want) in expectations(plan) {
        let (offset, len, val) = want;
        let Some(out) = &state.mem[rank][1] else {
            return reject(format!("rank {rank} has no output"));
        };
        if out.len() < offset + len {
            return reject(format!(
                "rank {rank}'s output has {} elements, the collective needs {}",
                out.len(),
                offset + len
            ));
        }
        let (mut at, want) = (offset, val.moved(offset as i64));
        for (n, got) in out.read(offset, len) {
            if got.as_ref() != Some(&want) {
                return reject(format!(
                    "rank {rank}'s output elements {at}..{} of {world} ranks' {}: got {}, want {}",
                    at + n,
                    plan.collective.name(),
                    show(got.as_ref(), world),
                    show(Some(&want), world)
                ));
            }
            at += n;
        }
    }
    Ok(())
}

fn describe(stage: &Stage) -> String {
    match stage {
        Stage::Copy { .. } => "a local copy".into(),
        Stage::Scale { .. } => "Avg's division".into(),
        Stage::Collective {
            level, collective, ..
        } => format!("{} {}", collective.name(), level.name()),
    }
}

fn show(v: Option<&Val>, world: usize) -> String {
    match v {
        None => "nothing defined".into(),
        Some(v) => {
            let ranks: Vec<usize> = (0..world)
                .filter(|&r| v.ranks[r / 64] >> (r % 64) & 1 == 1)
                .collect();
            format!(
                "ranks {ranks:?} at shift {}, divided {} times",
                v.shift, v.scaled
            )
        }
    }
}

fn initial(plan: &HierarchyPlan) -> State {
    let (c, n) = (plan.count, plan.hosts.world());
    let col = &plan.collective;
    let mem = (0..n)
        .map(|g| {
            let input = (!plan.in_place)
                .then(|| col.input_len(g, n, c))
                .flatten()
                .map(|len| Mem::new(len, vec![(len, Some(Val::input(g, n, 0)))]));
            let output = match plan.in_place {
                true => {
                    let len = col.in_place_len(n, c);
                    let init = match col {
                        Collective::AllGather => {
                            let at = g * c;
                            vec![
                                (at, None),
                                (c, Some(Val::input(g, n, -(at as i64)))),
                                (len - at - c, None),
                            ]
                        }
                        Collective::Broadcast { root } if *root != g => vec![(len, None)],
                        _ => vec![(len, Some(Val::input(g, n, 0)))],
                    };
                    Some(Mem::new(len, init))
                }
                false => col.output_len(g, n, c).map(|len| Mem::new(len, vec![])),
            };
            let work = Some(Mem::new(plan.work, vec![]));
            [input, output, work]
        })
        .collect();
    State { mem }
}

/// What the job's collective leaves, per rank: (offset, length, value) of its output.
fn expectations(plan: &HierarchyPlan) -> Vec<(usize, (usize, usize, Val))> {
    let (c, n) = (plan.count, plan.hosts.world());
    let scaled = u8::from(plan.average);
    let mut out = Vec::new();
    for g in 0..n {
        let mut want = |offset: usize, len: usize, val: Val| out.push((g, (offset, len, val)));
        match plan.collective {
            Collective::AllReduce => want(0, c, Val::full(n, 0, scaled)),
            Collective::ReduceScatter => match plan.in_place {
                true => want(g * c, c, Val::full(n, 0, scaled)),
                false => want(0, c, Val::full(n, (g * c) as i64, scaled)),
            },
            Collective::AllGather => {
                for j in 0..n {
                    want(j * c, c, Val::input(j, n, -((j * c) as i64)));
                }
            }
            Collective::Broadcast { root } => want(0, c, Val::input(root, n, 0)),
            Collective::Reduce { root } if root == g => want(0, c, Val::full(n, 0, scaled)),
            Collective::Reduce { .. } => {}
            Collective::AllToAll => {
                for j in 0..n {
                    want(j * c, c, Val::input(j, n, (g * c) as i64 - (j * c) as i64));
                }
            }
            Collective::SendRecv { .. } => {}
        }
    }
    out
}

/// The span's range on `rank`, after checking that the rank has the buffer and the range fits.
fn place(state: &State, hosts: Hosts, span: &Span, rank: usize) -> Check<usize> {
    let offset = span.offset(hosts, rank);
    match &state.mem[rank][area_index(span.area)] {
        None => reject(format!("rank {rank} has no {}", area_name(span.area))),
        Some(m) if m.len() < offset + span.count => reject(format!(
            "elements {offset}..{} of rank {rank}'s {} lie beyond its {} elements",
            offset + span.count,
            area_name(span.area),
            m.len()
        )),
        Some(_) => Ok(offset),
    }
}

fn read(
    state: &State,
    hosts: Hosts,
    span: &Span,
    rank: usize,
    at: usize,
    len: usize,
) -> Check<Vec<Run>> {
    let offset = place(state, hosts, span, rank)?;
    let m = state.mem[rank][area_index(span.area)]
        .as_ref()
        .expect("placed");
    Ok(m.read(offset + at, len))
}

fn write(
    state: &mut State,
    hosts: Hosts,
    span: &Span,
    rank: usize,
    at: usize,
    runs: &[Run],
) -> Check {
    let offset = place(state, hosts, span, rank)?;
    let m = state.mem[rank][area_index(span.area)]
        .as_mut()
        .expect("placed");
    m.write(offset + at, runs);
    Ok(())
}

fn run_stage(plan: &HierarchyPlan, state: &mut State, stage: &Stage) -> Check {
    let hosts = plan.hosts;
    let world = hosts.world();
    match stage {
        Stage::Copy { who, src, dst } => {
            if src.count != dst.count {
                return reject(format!("copies {} elements into {}", src.count, dst.count));
            }
            for g in (0..world).filter(|&g| who.includes(hosts, g)) {
                let runs = read(state, hosts, src, g, 0, src.count)?;
                write(state, hosts, dst, g, 0, &runs)?;
            }
            Ok(())
        }
        Stage::Scale { who, span } => {
            for g in (0..world).filter(|&g| who.includes(hosts, g)) {
                let runs = read(state, hosts, span, g, 0, span.count)?;
                let mut scaled = Vec::with_capacity(runs.len());
                for (n, v) in runs {
                    match v {
                        Some(v) if v.ranks == Val::full(world, 0, 0).ranks && v.scaled == 0 => {
                            scaled.push((n, Some(Val { scaled: 1, ..v })))
                        }
                        v => {
                            return reject(format!(
                                "rank {g} divides {} before the sum is complete or twice",
                                show(v.as_ref(), world)
                            ))
                        }
                    }
                }
                write(state, hosts, span, g, 0, &scaled)?;
            }
            Ok(())
        }
        Stage::Collective {
            level,
            who,
            collective,
            count,
            src,
            span,
        } => {
            let mut done = vec![false; world];
            for g in (0..world).filter(|&g| who.includes(hosts, g)) {
                if done[g] {
                    continue;
                }
                let group = hosts.group(*level, g);
                if let Some(&absent) = group.iter().find(|&&q| !who.includes(hosts, q)) {
                    return reject(format!(
                        "rank {g} runs it without rank {absent} of its group {group:?}"
                    ));
                }
                for &q in &group {
                    done[q] = true;
                }
                group_collective(state, hosts, &group, collective, *count, src.as_ref(), span)?;
            }
            Ok(())
        }
    }
}

/// The collective's semantics on one group, in place on `span` (all-to-all: from `src`).
fn group_collective(
    state: &mut State,
    hosts: Hosts,
    group: &[usize],
    collective: &Collective,
    count: usize,
    src: Option<&Span>,
    span: &Span,
) -> Check {
    let k = group.len();
    collective
        .validate(k)
        .or_else(|e| reject(format!("in a group of {k}: {e}")))?;
    let is_a2a = matches!(collective, Collective::AllToAll);
    // All-to-all, out of place only, reads and writes `k·count`.
    let len = match is_a2a {
        true => k * count,
        false => collective.in_place_len(k, count),
    };
    if span.count != len || (is_a2a != src.is_some()) || src.is_some_and(|s| s.count != len) {
        return reject(format!(
            "{} of count {count} in a group of {k} works on {len} elements; the stage names {}",
            collective.name(),
            span.count
        ));
    }
    // What each member's span (or source) holds before the stage.
    let input = |state: &State, i: usize, at: usize, n: usize| -> Check<Vec<Run>> {
        read(state, hosts, src.unwrap_or(span), group[i], at, n)
    };
    let mut writes: Vec<(usize, usize, Vec<Run>)> = Vec::new();
    let fold = |state: &State, at: usize| -> Check<Vec<Run>> {
        let mut acc = input(state, 0, at, count)?;
        for i in 1..k {
            acc = fold_runs(&acc, &input(state, i, at, count)?, hosts.world())?;
        }
        Ok(acc)
    };
    match *collective {
        Collective::AllReduce => {
            let sum = fold(state, 0)?;
            writes.extend((0..k).map(|i| (i, 0, sum.clone())));
        }
        Collective::ReduceScatter => {
            for i in 0..k {
                writes.push((i, 0, vec![(len, None)]));
                writes.push((i, i * count, fold(state, i * count)?));
            }
        }
        Collective::AllGather => {
            for j in 0..k {
                let block = input(state, j, j * count, count)?;
                writes.extend((0..k).map(|i| (i, j * count, block.clone())));
            }
        }
        Collective::Broadcast { root } => {
            let data = input(state, root, 0, count)?;
            writes.extend((0..k).map(|i| (i, 0, data.clone())));
        }
        Collective::Reduce { root } => {
            let sum = fold(state, 0)?;
            writes.extend(
                (0..k)
                    .filter(|&i| i != root)
                    .map(|i| (i, 0, vec![(len, None)])),
            );
            writes.push((root, 0, sum));
        }
        Collective::AllToAll => {
            for r in 0..k {
                for j in 0..k {
                    writes.push((r, j * count, input(state, j, r * count, count)?));
                }
            }
        }
        Collective::SendRecv { .. } => {
            return reject("send/recv is not a stage collective".into());
        }
    }
    for (i, at, runs) in writes {
        write(state, hosts, span, group[i], at, &runs)?;
    }
    Ok(())
}

/// Two operands folded run by run: both defined, naming the same element, sharing no rank.
fn fold_runs(a: &[Run], b: &[Run], world: usize) -> Check<Vec<Run>> {
    let mut out: Vec<Run> = Vec::new();
    let (mut i, mut j, mut left_a, mut left_b, mut at) = (0, 0, 0, 0, 0);
    while i < a.len() && j < b.len() {
        if left_a == 0 {
            left_a = a[i].0;
        }
        if left_b == 0 {
            left_b = b[j].0;
        }
        let n = left_a.min(left_b);
        let v = match (&a[i].1, &b[j].1) {
            (Some(x), Some(y)) if x.shift != y.shift => {
                return reject(format!(
                    "element {at} folds different elements: {} and {}",
                    show(Some(x), world),
                    show(Some(y), world)
                ))
            }
            (Some(x), Some(y)) if x.ranks.iter().zip(&y.ranks).any(|(p, q)| p & q != 0) => {
                return reject(format!(
                    "element {at} counts a rank twice: {} and {}",
                    show(Some(x), world),
                    show(Some(y), world)
                ))
            }
            (Some(x), Some(y)) if x.scaled != 0 || y.scaled != 0 => {
                return reject(format!("element {at} folds a value already divided"))
            }
            (Some(x), Some(y)) => Val {
                ranks: x.ranks.iter().zip(&y.ranks).map(|(p, q)| p | q).collect(),
                shift: x.shift,
                scaled: 0,
            },
            _ => return reject(format!("element {at} folds memory nothing wrote")),
        };
        match out.last_mut() {
            Some(last) if last.1.as_ref() == Some(&v) => last.0 += n,
            _ => out.push((n, Some(v))),
        }
        left_a -= n;
        left_b -= n;
        at += n;
        if left_a == 0 {
            i += 1;
        }
        if left_b == 0 {
            j += 1;
        }
    }
    Ok(out)
}
