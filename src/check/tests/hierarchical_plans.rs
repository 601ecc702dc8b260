//! The hierarchical plans proven for every collective and layout, and the proof held to a
//! concrete execution: stages run on numbers (each collective stage by NCCL's definition, what
//! NCCL leaves undefined filled with poison) must give the job's collective wherever the
//! checker accepts — for the real plans and for thousands of mutants of them, most of which it
//! must reject.

use crate::check::check_hierarchy;
use crate::element::ReduceOp;
use crate::plan::hierarchy::{build, Area, HierarchyPlan, Hosts, Level, Span, Stage, Who};
use crate::plan::Collective;

fn collectives(world: usize) -> Vec<Collective> {
    let mut all = vec![
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::AllToAll,
    ];
    for root in [0, world / 2, world - 1] {
        all.push(Collective::Broadcast { root });
        all.push(Collective::Reduce { root });
    }
    all
}

fn plans(hosts: Hosts, count: usize) -> Vec<HierarchyPlan> {
    let mut out = Vec::new();
    for c in collectives(hosts.world()) {
        for in_place in [false, true] {
            for op in [ReduceOp::Sum, ReduceOp::Avg] {
                if (in_place && !c.has_in_place()) || (op == ReduceOp::Avg && !c.reduces()) {
                    continue;
                }
                out.push(build(hosts, &c, count, in_place, op).unwrap());
            }
        }
    }
    out
}

#[test]
fn every_collective_is_proven_on_every_small_layout() {
    let mut proven = 0;
    for h in 1..=4 {
        for l in 1..=4 {
            for count in [0, 1, 3, 5, 8] {
                let hosts = Hosts { hosts: h, local: l };
                for plan in plans(hosts, count) {
                    check_hierarchy(&plan).unwrap_or_else(|e| {
                        panic!(
                            "{h} hosts × {l}: {} count {count}: {e}",
                            plan.collective.name()
                        )
                    });
                    let (got, want) = concrete(&plan, 7);
                    assert_eq!(
                        got,
                        want,
                        "{h}×{l} {} count {count}",
                        plan.collective.name()
                    );
                    proven += 1;
                }
            }
        }
    }
    assert!(proven > 1000, "{proven}");
}

#[test]
fn a_job_beyond_one_hosts_limit_is_proven() {
    // 32 hosts of 8 GPUs: 256 ranks, past the symbolic check's 128 — the proof has no limit.
    let hosts = Hosts {
        hosts: 32,
        local: 8,
    };
    for c in [Collective::AllReduce, Collective::Reduce { root: 200 }] {
        let plan = build(hosts, &c, 1 << 20, false, ReduceOp::Avg).unwrap();
        check_hierarchy(&plan).unwrap();
    }
    let plan = build(hosts, &Collective::ReduceScatter, 1000, true, ReduceOp::Sum).unwrap();
    check_hierarchy(&plan).unwrap();
}

#[test]
fn the_messages_name_the_stage_and_the_fault() {
    let hosts = Hosts { hosts: 2, local: 2 };
    let mut plan = build(hosts, &Collective::AllReduce, 8, true, ReduceOp::Sum).unwrap();
    let inter = plan
        .stages
        .iter()
        .position(|s| {
            matches!(
                s,
                Stage::Collective {
                    level: Level::Inter,
                    ..
                }
            )
        })
        .unwrap();
    let mut twice = plan.clone();
    plan.stages.remove(inter);
    let e = check_hierarchy(&plan).unwrap_err().0;
    assert!(
        e.contains("rank 0's output") && e.contains("want ranks [0, 1, 2, 3]"),
        "{e}"
    );
    twice.stages.insert(inter, twice.stages[inter].clone());
    let e = check_hierarchy(&twice).unwrap_err().0;
    assert!(
        e.contains("all-reduce across hosts") && e.contains("counts a rank twice"),
        "{e}"
    );
    let mut plan = build(hosts, &Collective::AllReduce, 8, true, ReduceOp::Avg).unwrap();
    let scale = plan
        .stages
        .iter()
        .position(|s| matches!(s, Stage::Scale { .. }))
        .unwrap();
    let twice = plan.stages[scale].clone();
    plan.stages.insert(scale, twice);
    let e = check_hierarchy(&plan).unwrap_err().0;
    assert!(e.contains("Avg's division") && e.contains("twice"), "{e}");
}

/// Every way to change one thing in a plan (module doc).
fn mutants(plan: &HierarchyPlan) -> Vec<HierarchyPlan> {
    let mut out = Vec::new();
    let with = |f: &dyn Fn(&mut Vec<Stage>)| {
        let mut m = plan.clone();
        f(&mut m.stages);
        m
    };
    let n = plan.stages.len();
    for i in 0..n {
        out.push(with(&|s| {
            s.remove(i);
        }));
        if i + 1 < n {
            out.push(with(&|s| s.swap(i, i + 1)));
        }
        out.push(with(&|s| {
            let copy = s[i].clone();
            s.insert(i, copy);
        }));
        let spans: &[fn(&mut Span)] = &[
            |s| s.base += 1,
            |s| s.base = s.base.saturating_sub(1),
            |s| s.per_host += 1,
            |s| s.per_local += 1,
            |s| s.per_local = 0,
            |s| s.count = s.count.saturating_sub(1),
            |s| {
                s.area = if s.area == Area::Work {
                    Area::Output
                } else {
                    Area::Work
                }
            },
        ];
        for f in spans {
            out.push(with(&|s| match &mut s[i] {
                Stage::Copy { dst, .. } | Stage::Scale { span: dst, .. } => f(dst),
                Stage::Collective { span, .. } => f(span),
            }));
            out.push(with(&|s| {
                if let Stage::Copy { src, .. } = &mut s[i] {
                    f(src)
                }
            }));
        }
        out.push(with(&|s| match &mut s[i] {
            Stage::Copy { who, .. } | Stage::Scale { who, .. } | Stage::Collective { who, .. } => {
                *who = match *who {
                    Who::All => Who::Local(0),
                    Who::Local(l) => Who::Rank(l),
                    Who::Rank(_) => Who::All,
                }
            }
        }));
        out.push(with(&|s| {
            if let Stage::Collective {
                level, collective, ..
            } = &mut s[i]
            {
                *level = match level {
                    Level::Intra => Level::Inter,
                    Level::Inter => Level::Intra,
                };
                if let Collective::Broadcast { root } | Collective::Reduce { root } = collective {
                    *root = 0;
                }
            }
        }));
        out.push(with(&|s| {
            if let Stage::Collective { collective, .. } = &mut s[i] {
                match collective {
                    Collective::Broadcast { root } | Collective::Reduce { root } => {
                        *root = (*root + 1) % 2
                    }
                    Collective::AllReduce => *collective = Collective::Reduce { root: 0 },
                    Collective::AllGather => *collective = Collective::Broadcast { root: 0 },
                    _ => {}
                }
            }
        }));
    }
    out.retain(|m| m != plan);
    out
}

#[test]
fn the_proof_never_accepts_a_plan_that_computes_something_else() {
    let (mut rejected, mut accepted) = (0, 0);
    for (h, l) in [(2, 2), (2, 3), (3, 2)] {
        let hosts = Hosts { hosts: h, local: l };
        for plan in plans(hosts, 5) {
            for mutant in mutants(&plan) {
                match check_hierarchy(&mutant) {
                    Err(_) => rejected += 1,
                    Ok(()) => {
                        accepted += 1;
                        for seed in 0..3 {
                            let (got, want) = concrete(&mutant, seed);
                            assert_eq!(got, want, "accepted mutant computes otherwise: {mutant:?}");
                        }
                    }
                }
            }
        }
    }
    // Most changes break a plan; the ones accepted (stages that commute, a copy done twice)
    // compute the collective, as the concrete runs above showed.
    assert!(
        rejected > 4 * accepted.max(1),
        "rejected {rejected}, accepted {accepted}"
    );
}

#[test]
fn dropping_any_stage_breaks_the_plan() {
    let hosts = Hosts { hosts: 2, local: 3 };
    for plan in plans(hosts, 7) {
        for i in 0..plan.stages.len() {
            let mut m = plan.clone();
            m.stages.remove(i);
            assert!(
                check_hierarchy(&m).is_err(),
                "{} without stage {i} passed",
                plan.collective.name()
            );
        }
    }
}

/// Every rank's output, element by element (`None` where the collective defines nothing).
type Outputs = Vec<Vec<Option<u64>>>;

/// Runs the plan on numbers: (every rank's output, what the collective defines there; `None`
/// where it defines nothing). Undefined memory and what NCCL leaves undefined hold poison.
fn concrete(plan: &HierarchyPlan, seed: u64) -> (Outputs, Outputs) {
    let hosts = plan.hosts;
    let (n, c, col) = (hosts.world(), plan.count, &plan.collective);
    let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let inputs: Vec<Vec<u64>> = (0..n)
        .map(|g| {
            let len = col
                .input_len(g, n, c)
                .unwrap_or(0)
                .max(col.in_place_len(n, c));
            (0..len).map(|_| next() >> 34).collect()
        })
        .collect();
    let poison = |next: &mut dyn FnMut() -> u64| next() | 1 << 63;
    let mut mem: Vec<[Option<Vec<u64>>; 3]> = (0..n)
        .map(|g| {
            let mut fill = |len: usize| (0..len).map(|_| poison(&mut next)).collect::<Vec<_>>();
            let input = (!plan.in_place)
                .then(|| col.input_len(g, n, c))
                .flatten()
                .map(|len| inputs[g][..len].to_vec());
            let output = match plan.in_place {
                true => {
                    let len = col.in_place_len(n, c);
                    let mut buf = fill(len);
                    match col {
                        Collective::AllGather => {
                            buf[g * c..(g + 1) * c].copy_from_slice(&inputs[g][..c])
                        }
                        Collective::Broadcast { root } if *root != g => {}
                        _ => buf.copy_from_slice(&inputs[g][..len]),
                    }
                    Some(buf)
                }
                false => col.output_len(g, n, c).map(&mut fill),
            };
            [input, output, Some(fill(plan.work))]
        })
        .collect();
    let idx = |a: Area| match a {
        Area::Input => 0,
        Area::Output => 1,
        Area::Work => 2,
    };
    let get = |mem: &Vec<[Option<Vec<u64>>; 3]>, g: usize, s: &Span, at: usize, len: usize| {
        let o = s.offset(hosts, g) + at;
        mem[g][idx(s.area)]
            .as_ref()
            .and_then(|b| b.get(o..o + len))
            .map(<[u64]>::to_vec)
    };
    for stage in &plan.stages {
        match stage {
            Stage::Copy { who, src, dst } => {
                for g in (0..n).filter(|&g| who.includes(hosts, g)) {
                    let data = get(&mem, g, src, 0, src.count).unwrap_or_default();
                    put(&mut mem[g][idx(dst.area)], dst.offset(hosts, g), &data);
                }
            }
            Stage::Scale { who, span } => {
                for g in (0..n).filter(|&g| who.includes(hosts, g)) {
                    let data = get(&mem, g, span, 0, span.count).unwrap_or_default();
                    let scaled: Vec<u64> = data.iter().map(|x| x / n as u64).collect();
                    put(&mut mem[g][idx(span.area)], span.offset(hosts, g), &scaled);
                }
            }
            Stage::Collective {
                level,
                who,
                collective,
                count,
                src,
                span,
            } => {
                let mut seen = vec![false; n];
                for g in (0..n).filter(|&g| who.includes(hosts, g)) {
                    if seen[g] {
                        continue;
                    }
                    let group = hosts.group(*level, g);
                    let k = group.len();
                    let cnt = *count;
                    let from = src.as_ref().unwrap_or(span);
                    let len = match collective {
                        Collective::AllToAll => k * cnt,
                        _ => collective.in_place_len(k, cnt),
                    };
                    let bufs: Vec<Vec<u64>> = group
                        .iter()
                        .map(|&q| get(&mem, q, from, 0, len).unwrap_or_else(|| vec![1 << 62; len]))
                        .collect();
                    let sum = |at: usize| -> Vec<u64> {
                        (0..cnt)
                            .map(|e| bufs.iter().fold(0u64, |s, b| s.wrapping_add(b[at + e])))
                            .collect()
                    };
                    let mut out: Vec<Vec<u64>> = match src {
                        Some(_) => (0..k).map(|_| vec![0; len]).collect(),
                        None => group
                            .iter()
                            .map(|&q| get(&mem, q, span, 0, len).unwrap_or_else(|| vec![0; len]))
                            .collect(),
                    };
                    match *collective {
                        Collective::AllReduce => out.iter_mut().for_each(|o| *o = sum(0)),
                        Collective::ReduceScatter => {
                            for (i, o) in out.iter_mut().enumerate() {
                                o.iter_mut().for_each(|x| *x = poison(&mut next));
                                o[i * cnt..(i + 1) * cnt].copy_from_slice(&sum(i * cnt));
                            }
                        }
                        Collective::AllGather => {
                            for o in out.iter_mut() {
                                for (j, b) in bufs.iter().enumerate() {
                                    o[j * cnt..(j + 1) * cnt]
                                        .copy_from_slice(&b[j * cnt..(j + 1) * cnt]);
                                }
                            }
                        }
                        Collective::Broadcast { root } => {
                            let r = root.min(k - 1);
                            out.iter_mut().for_each(|o| *o = bufs[r].clone())
                        }
                        Collective::Reduce { root } => {
                            let total = sum(0);
                            for (i, o) in out.iter_mut().enumerate() {
                                match i == root {
                                    true => *o = total.clone(),
                                    false => o.iter_mut().for_each(|x| *x = poison(&mut next)),
                                }
                            }
                        }
                        Collective::AllToAll => {
                            for (r, o) in out.iter_mut().enumerate() {
                                for (j, b) in bufs.iter().enumerate() {
                                    o[j * cnt..(j + 1) * cnt]
                                        .copy_from_slice(&b[r * cnt..(r + 1) * cnt]);
                                }
                            }
                        }
                        Collective::SendRecv { .. } => {}
                    }
                    for (i, &q) in group.iter().enumerate() {
                        seen[q] = true;
                        put(&mut mem[q][idx(span.area)], span.offset(hosts, q), &out[i]);
                    }
                }
            }
        }
    }
    // What the collective defines, from the inputs directly.
    let total = |at: usize| -> u64 {
        let s = (0..n).fold(0u64, |s, g| s.wrapping_add(inputs[g][at]));
        match plan.average {
            true => s / n as u64,
            false => s,
        }
    };
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for g in 0..n {
        let out = mem[g][1].clone().unwrap_or_default();
        let mut w: Vec<Option<u64>> = vec![None; out.len()];
        match *col {
            Collective::AllReduce => (0..c).for_each(|e| w[e] = Some(total(e))),
            Collective::ReduceScatter => match plan.in_place {
                true => (0..c).for_each(|e| w[g * c + e] = Some(total(g * c + e))),
                false => (0..c).for_each(|e| w[e] = Some(total(g * c + e))),
            },
            Collective::AllGather => {
                (0..n * c).for_each(|e| w[e] = Some(inputs[e / c.max(1)][e % c.max(1)]))
            }
            Collective::Broadcast { root } => (0..c).for_each(|e| w[e] = Some(inputs[root][e])),
            Collective::Reduce { root } if root == g => (0..c).for_each(|e| w[e] = Some(total(e))),
            Collective::Reduce { .. } => {}
            Collective::AllToAll => {
                (0..n * c).for_each(|e| w[e] = Some(inputs[e / c.max(1)][g * c + e % c.max(1)]))
            }
            Collective::SendRecv { .. } => {}
        }
        got.push(out.iter().zip(&w).map(|(x, w)| w.map(|_| *x)).collect());
        want.push(w);
    }
    (got, want)
}

/// Writes `data` at `at` of a buffer, as far as it reaches (a mutant may write past the end).
fn put(buf: &mut Option<Vec<u64>>, at: usize, data: &[u64]) {
    if let Some(b) = buf {
        for (i, x) in data.iter().enumerate() {
            if let Some(slot) = b.get_mut(at + i) {
                *slot = *x;
            }
        }
    }
}
