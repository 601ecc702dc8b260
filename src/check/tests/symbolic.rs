//! The run-by-run symbolic execution ([`check_result`]) against an element-by-element one:
//! [`Runs`] against a plain vector, and both executions on every planted fault of a few plans
//! and on random plans and programs — the same `Result`, message for message.

use super::{oneshot, spec};
use crate::check::result::{combine, expectations, initial, judge, ranks_in, Runs, Sym};
use crate::check::*;
use crate::element::ReduceOp;
use crate::plan::{
    BufId, BufKind, EdgeTransport, Instr, Op, Plan, Region, RingSpec, StreamKind, Tag,
};
use proptest::prelude::*;

/// Check 4 element by element: the reference that [`check_result`] (run by run) must agree
/// with exactly, message for message.
fn check_result_per_element(plan: &Plan, order: &[(usize, usize)]) -> Check {
    if plan.world > MAX_SYMBOLIC_WORLD {
        return reject(format!(
            "the symbolic check handles at most {MAX_SYMBOLIC_WORLD} ranks"
        ));
    }
    let expected = expectations(plan)?;
    let mut memory: Vec<Vec<Option<Sym>>> = plan
        .buffers
        .iter()
        .map(|decl| {
            initial(plan, decl)
                .into_iter()
                .flat_map(|(len, v)| std::iter::repeat_n(v, len))
                .collect()
        })
        .collect();
    let full: u128 = if plan.world == 128 {
        u128::MAX
    } else {
        (1u128 << plan.world) - 1
    };
    let ranks_of = |set: u128| ranks_in(set, plan.world);
    // A meeting's writes, held back until every participant has read (its members are adjacent
    // in `order`, rank 0 first): peers read each other's sources concurrently.
    let mut meeting: Vec<(Region, Vec<Sym>)> = Vec::new();
    for &(rank, index) in order {
        let here = || describe(plan, rank, index);
        let read = |memory: &Vec<Vec<Option<Sym>>>, region: Region, k: usize| -> Check<Sym> {
            memory[region.buf.0][region.offset + k].ok_or_else(|| {
                let decl = plan.decl(region.buf);
                Rejection(format!(
                    "{} reads element {} of {:?} of rank {}, which nothing has written",
                    here(),
                    region.offset + k,
                    decl.kind,
                    decl.rank
                ))
            })
        };
        match plan.ranks[rank][index].op {
            Op::Copy { src, dst } | Op::Expose { src, dst } => {
                for k in 0..src.count {
                    let v = read(&memory, src, k)?;
                    memory[dst.buf.0][dst.offset + k] = Some(v.moved(src.offset, dst.offset));
                }
            }
            Op::Reduce { dst, a, b } => {
                for k in 0..dst.count {
                    let (x, y) = (read(&memory, a, k)?, read(&memory, b, k)?);
                    let (x, y) = (x.moved(a.offset, dst.offset), y.moved(b.offset, dst.offset));
                    memory[dst.buf.0][dst.offset + k] =
                        Some(combine(here, x, y, dst.offset + k, plan.world)?);
                }
            }
            Op::Scale { region } => {
                for k in 0..region.count {
                    let v = read(&memory, region, k)?;
                    if v.ranks != full {
                        return reject(format!(
                            "{} averages a partial sum (ranks {:?})",
                            here(),
                            ranks_of(v.ranks)
                        ));
                    }
                    memory[region.buf.0][region.offset + k] = Some(Sym {
                        scaled: v.scaled + 1,
                        ..v
                    });
                }
            }
            Op::Record(_) | Op::Wait(_) => {}
            op @ Op::PeerReduce { dst, .. } => {
                let sources = peer_sources(plan, &op);
                let mut values = Vec::with_capacity(dst.count);
                for k in 0..dst.count {
                    let mut acc: Option<Sym> = None;
                    for &src in &sources {
                        let v = read(&memory, src, k)?.moved(src.offset, dst.offset);
                        acc = Some(match acc {
                            None if v.scaled > 0 && sources.len() > 1 => {
                                return reject(format!(
                                    "{} reduces an already averaged value",
                                    here()
                                ))
                            }
                            None => v,
                            Some(acc) => combine(here, acc, v, dst.offset + k, plan.world)?,
                        });
                    }
                    values.push(acc.expect("a peer reduce reads at least one rank"));
                }
                for to in peer_destinations(plan, &op) {
                    meeting.push((to, values.clone()));
                }
                if rank + 1 == plan.world {
                    for (dst, values) in meeting.drain(..) {
                        for (k, v) in values.into_iter().enumerate() {
                            memory[dst.buf.0][dst.offset + k] = Some(v);
                        }
                    }
                }
            }
        }
    }
    for e in &expected {
        let values = &memory[e.buf.0][e.offset..e.offset + e.len];
        for (k, &v) in values.iter().enumerate() {
            judge(plan, e.buf, e.offset + k, v, e.want)?;
        }
    }
    Ok(())
}

/// Neighbouring runs must hold different values, and the runs must cover the buffer.
fn assert_canonical(runs: &Runs) {
    if runs.len == 0 {
        assert!(runs.starts.is_empty());
        return;
    }
    assert_eq!(runs.starts.keys().next(), Some(&0));
    assert!(runs.starts.keys().all(|&k| k < runs.len));
    let values: Vec<_> = runs.starts.values().collect();
    assert!(values.windows(2).all(|w| w[0] != w[1]), "{values:?}");
}

fn sym(ranks: u128) -> Option<Sym> {
    Some(Sym {
        ranks,
        scaled: 0,
        shift: 0,
        source: 0,
    })
}

#[test]
fn runs_split_write_and_merge() {
    let mut runs = Runs::new(10, None);
    runs.write(2, &[(3, sym(1))]);
    assert_eq!(runs.read(0, 10), vec![(2, None), (3, sym(1)), (5, None)]);
    runs.write(5, &[(2, sym(1)), (1, sym(2))]);
    assert_eq!(
        runs.read(1, 8),
        vec![(1, None), (5, sym(1)), (1, sym(2)), (1, None)]
    );
    runs.write(0, &[(10, None)]);
    assert_eq!(runs.starts.len(), 1);
    runs.write(9, &[(1, sym(3))]);
    runs.write(0, &[(4, sym(3)), (5, sym(3))]);
    assert_eq!(runs.read(0, 10), vec![(10, sym(3))]);
    assert_canonical(&runs);
    assert_eq!(runs.read(3, 0), vec![]);
}

/// Random writes and reads of [`Runs`] against a plain vector of values.
#[test]
fn runs_agree_with_a_plain_vector() {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    for _ in 0..200 {
        let len = 1 + next(20);
        let mut runs = Runs::new(len, None);
        let mut plain = vec![None; len];
        for _ in 0..30 {
            let offset = next(len);
            let mut pieces = Vec::new();
            let mut at = offset;
            while at < len && next(3) > 0 {
                let piece = 1 + next(len - at);
                let value = [None, sym(1), sym(2)][next(3)];
                pieces.push((piece, value));
                plain[at..at + piece].fill(value);
                at += piece;
            }
            runs.write(offset, &pieces);
            assert_canonical(&runs);
            let (lo, hi) = (next(len), next(len + 1));
            let (lo, hi) = (lo.min(hi), lo.max(hi));
            let expanded: Vec<_> = runs
                .read(lo, hi - lo)
                .into_iter()
                .flat_map(|(n, v)| std::iter::repeat_n(v, n))
                .collect();
            assert_eq!(expanded, plain[lo..hi]);
        }
    }
}

/// A fault planted into a plan, for the equivalence tests.
#[derive(Clone, Copy, Debug)]
enum Plant {
    Drop,
    /// Move the `region`-th region of the instruction one element up or down.
    Shift {
        region: usize,
        up: bool,
    },
    SwapCopy,
    DuplicateReduce,
}

const PLANTS: [Plant; 13] = [
    Plant::Drop,
    Plant::Shift {
        region: 0,
        up: true,
    },
    Plant::Shift {
        region: 0,
        up: false,
    },
    Plant::Shift {
        region: 1,
        up: true,
    },
    Plant::Shift {
        region: 1,
        up: false,
    },
    Plant::Shift {
        region: 2,
        up: true,
    },
    Plant::Shift {
        region: 2,
        up: false,
    },
    Plant::SwapCopy,
    Plant::DuplicateReduce,
    Plant::Drop,
    Plant::Drop,
    Plant::SwapCopy,
    Plant::DuplicateReduce,
];

fn shift(offset: &mut usize, up: bool) -> bool {
    match (up, offset.checked_sub(1)) {
        (true, _) => *offset += 1,
        (false, Some(lower)) => *offset = lower,
        (false, None) => return false,
    }
    true
}

/// The plan with `plant` at instruction `index` of `rank`, or `None` where it does not apply.
fn planted(plan: &Plan, rank: usize, index: usize, plant: Plant) -> Option<Plan> {
    let mut broken = plan.clone();
    let program = &mut broken.ranks[rank];
    let instr = *program.get(index)?;
    match (plant, instr.op) {
        (Plant::Drop, _) => {
            program.remove(index);
        }
        (Plant::SwapCopy, Op::Copy { src, dst }) => {
            program[index].op = Op::Copy { src: dst, dst: src };
        }
        (Plant::DuplicateReduce, Op::Reduce { .. }) => program.insert(index + 1, instr),
        (Plant::Shift { region, up }, mut op) => {
            let moved = match (&mut op, region) {
                (Op::Copy { src, .. }, 0) => shift(&mut src.offset, up),
                (Op::Copy { dst, .. }, 1) => shift(&mut dst.offset, up),
                (Op::Reduce { dst, .. }, 0) => shift(&mut dst.offset, up),
                (Op::Reduce { a, .. }, 1) => shift(&mut a.offset, up),
                (Op::Reduce { b, .. }, 2) => shift(&mut b.offset, up),
                (Op::Scale { region }, 0) => shift(&mut region.offset, up),
                (Op::PeerReduce { offset, .. }, 0) => shift(offset, up),
                (Op::PeerReduce { dst, .. }, 1) => shift(&mut dst.offset, up),
                _ => false,
            };
            if !moved {
                return None;
            }
            program[index].op = op;
        }
        _ => return None,
    }
    Some(broken)
}

/// Where the first two checks pass (so that the symbolic execution is defined), the run-by-run
/// and element-by-element results must be the same `Result`, message for message. Returns
/// that result, or `None` where the plan did not get that far.
fn agree(plan: &Plan) -> Option<Check> {
    check_shape(plan).ok()?;
    let order = enqueue_order(plan).ok()?;
    let fast = check_result(plan, &order);
    let reference = check_result_per_element(plan, &order);
    assert_eq!(fast, reference, "the two symbolic executions disagree");
    Some(fast)
}

/// Every plant at every instruction of a few small plans: both executions agree, and the
/// faults reach each kind of rejection.
#[test]
fn runs_agree_with_elements_on_every_planted_fault() {
    let mut plans = Vec::new();
    for (world, count, chunk, slots, align) in [
        (2, 13, 3, 2, 1),
        (3, 20, 2, 1, 2),
        (4, 9, 8, 3, 4),
        (1, 5, 2, 1, 1),
    ] {
        for in_place in [true, false] {
            for op in [ReduceOp::Sum, ReduceOp::Avg] {
                for transport in [EdgeTransport::Peer, EdgeTransport::Staged] {
                    let mut s = spec(world, count, chunk, slots, transport);
                    s.align_elems = align;
                    s.in_place = in_place;
                    s.op = op;
                    plans.push(s.build().unwrap());
                }
            }
            plans.push(oneshot(world, count, in_place));
        }
    }
    let mut seen: Vec<String> = Vec::new();
    let (mut accepted, mut rejected) = (0, 0);
    for plan in &plans {
        assert_eq!(agree(plan), Some(Ok(())));
        for rank in 0..plan.world {
            for index in 0..plan.ranks[rank].len() {
                for plant in PLANTS {
                    let Some(broken) = planted(plan, rank, index, plant) else {
                        continue;
                    };
                    match agree(&broken) {
                        Some(Ok(())) => accepted += 1,
                        Some(Err(e)) => {
                            rejected += 1;
                            seen.push(e.0);
                        }
                        None => {}
                    }
                }
            }
        }
    }
    assert!(accepted > 0 && rejected > 100, "{accepted} {rejected}");
    for needle in [
        "nothing has written",
        "counts the contribution",
        "twice",
        "lacks the contribution",
        "never written",
        "averages a partial sum",
    ] {
        assert!(
            seen.iter().any(|m| m.contains(needle)),
            "no planted fault was rejected with {needle:?}"
        );
    }
}

pub(super) fn ring_strategy() -> impl Strategy<Value = RingSpec> {
    (1usize..=5)
        .prop_flat_map(|world| {
            (
                Just(world),
                0usize..48,
                1usize..12,
                1usize..4,
                prop_oneof![Just(1usize), Just(2), Just(4)],
                any::<bool>(),
                any::<bool>(),
                proptest::collection::vec(any::<bool>(), world),
            )
        })
        .prop_map(
            |(world, count, chunk_elems, slots, align_elems, in_place, avg, staged)| RingSpec {
                world,
                count,
                in_place,
                op: if avg { ReduceOp::Avg } else { ReduceOp::Sum },
                chunk_elems,
                slots,
                align_elems,
                transports: staged
                    .into_iter()
                    .map(|s| {
                        if s {
                            EdgeTransport::Staged
                        } else {
                            EdgeTransport::Peer
                        }
                    })
                    .collect(),
            },
        )
}

/// Up to three plants, each at a random place (the place is taken modulo the program).
pub(super) fn plants_strategy() -> impl Strategy<Value = Vec<(usize, usize, usize)>> {
    proptest::collection::vec((0usize..64, 0usize..1024, 0..PLANTS.len()), 0..4)
}

pub(super) fn plant_all(mut plan: Plan, plants: &[(usize, usize, usize)]) -> Plan {
    for &(rank, index, which) in plants {
        let rank = rank % plan.world;
        let len = plan.ranks[rank].len();
        if len == 0 {
            continue;
        }
        if let Some(broken) = planted(&plan, rank, index % len, PLANTS[which]) {
            plan = broken;
        }
    }
    plan
}

/// A random program on a few small buffers, all on Main: copies (forward and backward onto
/// themselves too), reductions, scalings, and meetings of every rank — most of them wrong,
/// which is the point: both executions must reject them with the same message.
fn program_strategy() -> impl Strategy<Value = Plan> {
    (
        1usize..=3,
        1usize..10,
        1usize..14,
        any::<bool>(),
        any::<bool>(),
        0usize..1000,
        proptest::collection::vec(proptest::collection::vec(0usize..1000, 8), 0..24),
    )
        .prop_map(
            |(world, count, slots, in_place, average, prologue, steps)| {
                let mut plan = Plan {
                    collective: crate::plan::Collective::AllReduce,
                    world,
                    count,
                    in_place,
                    average,
                    buffers: Vec::new(),
                    events: Vec::new(),
                    ranks: vec![Vec::new(); world],
                };
                for rank in 0..world {
                    for (kind, len) in [
                        (BufKind::Input, count),
                        (BufKind::Output, count),
                        (BufKind::Slots, slots),
                    ] {
                        plan.buffers
                            .push(crate::plan::BufferDecl { rank, kind, len });
                    }
                }
                let nbuf = plan.buffers.len();
                // A region of `count` elements in buffer `pick`, at `at` (both taken modulo).
                // Buffers are declared rank by rank, Input, Output, Slots: `read` picks any,
                // `write` an Output or Slots (a write to an input is a shape error, not
                // interesting here).
                let read = |pick: usize| pick % nbuf;
                let write = |pick: usize| pick % world * 3 + 1 + pick / world % 2;
                let region = |plan: &Plan, buf: usize, at: usize, count: usize| {
                    let buf = BufId(buf);
                    let len = plan.buffers[buf.0].len;
                    let count = count.min(len);
                    Region {
                        buf,
                        offset: at % (len - count + 1),
                        count,
                    }
                };
                let main = |op| Instr {
                    stream: StreamKind::Main,
                    op,
                    tag: Tag::ENTRY,
                };
                // A prologue fills the first `filled` elements of every output and slot buffer
                // from the rank's input, so that the random steps get further than their first
                // read of unwritten memory.
                let filled = prologue % (count + 1);
                for rank in 0..world {
                    let input = BufId(rank * 3);
                    for (buf, len) in [(rank * 3 + 1, filled), (rank * 3 + 2, filled.min(slots))] {
                        let at = |buf| Region {
                            buf,
                            offset: 0,
                            count: len,
                        };
                        plan.ranks[rank].push(main(Op::Copy {
                            src: at(input),
                            dst: at(BufId(buf)),
                        }));
                    }
                }
                for s in steps {
                    let rank = s[0] % world;
                    let n = 1 + s[1] % count.min(slots);
                    match s[2] % 5 {
                        0 => {
                            let src = region(&plan, read(s[3]), s[4], n);
                            let dst = region(&plan, write(s[5]), s[6], src.count);
                            plan.ranks[rank].push(main(Op::Copy { src, dst }));
                        }
                        1 => {
                            // Within one buffer: overlapping forward, backward, or not at all.
                            let src = region(&plan, write(s[3]), s[4], n);
                            let dst = region(&plan, src.buf.0, s[6], src.count);
                            plan.ranks[rank].push(main(Op::Copy { src, dst }));
                        }
                        2 => {
                            let a = region(&plan, write(s[3]), s[4], n);
                            let b = region(&plan, read(s[5]), s[6], a.count);
                            let dst = if s[7] % 2 == 0 {
                                a
                            } else {
                                region(&plan, write(s[7] / 2), s[7] / 3, a.count)
                            };
                            plan.ranks[rank].push(main(Op::Reduce { dst, a, b }));
                        }
                        3 => {
                            let region = region(&plan, write(s[3]), s[4], n);
                            plan.ranks[rank].push(main(Op::Scale { region }));
                        }
                        _ => {
                            let kind = [BufKind::Input, BufKind::Output, BufKind::Slots][s[3] % 3];
                            let src = plan.buffer(0, kind).unwrap();
                            let Region { offset, count, .. } = region(&plan, src.0, s[4], n);
                            for r in 0..world {
                                let mine = plan.buffer(
                                    r,
                                    match kind {
                                        BufKind::Output => BufKind::Slots,
                                        BufKind::Slots => BufKind::Output,
                                        _ => [BufKind::Output, BufKind::Slots][s[5] % 2],
                                    },
                                );
                                let dst = Region {
                                    buf: mine.unwrap(),
                                    offset: s[6]
                                        % (plan.decl(mine.unwrap()).len.saturating_sub(count) + 1),
                                    count,
                                };
                                plan.ranks[r].push(main(Op::PeerReduce {
                                    dst,
                                    src: kind,
                                    offset,
                                    count,
                                    // Sometimes a copy from one rank (the two-shot's gather).
                                    ranks: if s[5] % 3 == 0 {
                                        crate::plan::Ranks::only(s[6] % world)
                                    } else {
                                        crate::plan::Ranks::ALL
                                    },
                                    fused: false,
                                    // Sometimes pushed to some ranks (the pushed two-shot),
                                    // its own among them at times (which the shape check
                                    // refuses).
                                    push: match s[7] % 4 {
                                        0 => crate::plan::Ranks(s[7] as u64 >> 2),
                                        _ => crate::plan::Ranks::NONE,
                                    },
                                }));
                            }
                        }
                    }
                }
                plan
            },
        )
}

/// Runs `property` on `cases` values of `strategy` and returns how many of them reached the
/// comparison (`agree` was `Some`): the premise of "both executions agree", counted so that a
/// test whose plants always stop the plan before the symbolic execution fails instead of
/// passing vacuously.
pub(super) fn count_agreeing<S: Strategy>(
    cases: u32,
    strategy: S,
    property: impl Fn(S::Value) -> bool,
) -> u32
where
    S::Value: std::fmt::Debug,
{
    use proptest::test_runner::{Config, TestRunner};
    let held = std::cell::Cell::new(0);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&strategy, |value| {
            held.set(held.get() + u32::from(property(value)));
            Ok(())
        })
        .unwrap();
    println!("{} of {cases} compared", held.get());
    held.get()
}

/// Random ring plans agree, and so do they with random plants; at least half of the planted
/// plans get as far as the symbolic execution (about three quarters do).
#[test]
fn runs_agree_with_elements_on_random_ring_plans() {
    let held = count_agreeing(
        400,
        (ring_strategy(), plants_strategy()),
        |(spec, plants)| {
            let plan = spec.build().unwrap();
            assert_eq!(agree(&plan), Some(Ok(())));
            agree(&plant_all(plan, &plants)).is_some()
        },
    );
    assert!(
        held >= 100,
        "{held} of 400 planted ring plans were compared"
    );
}

/// The same on one-shot plans.
#[test]
fn runs_agree_with_elements_on_random_oneshot_plans() {
    let strategy = (
        1usize..=6,
        0usize..40,
        any::<bool>(),
        any::<bool>(),
        plants_strategy(),
    );
    let held = count_agreeing(400, strategy, |(world, count, in_place, avg, plants)| {
        let plan = crate::plan::OneShotSpec {
            world,
            count,
            in_place,
            op: if avg { ReduceOp::Avg } else { ReduceOp::Sum },
        }
        .build()
        .unwrap();
        assert_eq!(agree(&plan), Some(Ok(())));
        agree(&plant_all(plan, &plants)).is_some()
    });
    assert!(
        held >= 100,
        "{held} of 400 planted one-shot plans were compared"
    );
}

/// On random programs, wherever both symbolic executions are defined (`agree`'s premise: the
/// shape and enqueue checks pass), they agree — counted, and the test fails when fewer than a
/// quarter of the programs got that far, so a generator that drifted into rejecting everything
/// would not pass it vacuously.
#[test]
fn runs_agree_with_elements_on_random_programs() {
    use proptest::test_runner::{Config, TestRunner};
    use std::cell::Cell;
    let (cases, compared) = (Cell::new(0usize), Cell::new(0usize));
    let mut runner = TestRunner::new(Config {
        cases: 2000,
        // Counted by hand, outside `proptest!`: no source file to keep failing seeds beside.
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&program_strategy(), |plan| {
            cases.set(cases.get() + 1);
            compared.set(compared.get() + usize::from(agree(&plan).is_some()));
            Ok(())
        })
        .unwrap();
    let (cases, compared) = (cases.get(), compared.get());
    println!("{compared} of {cases} random programs compared");
    assert!(
        compared * 4 >= cases,
        "only {compared} of {cases} random programs compared"
    );
}

/// The random programs above reach every rejection of the symbolic check (and some pass):
/// the agreement they test is not only on "nothing has written".
#[test]
fn random_programs_reach_every_outcome() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut outcomes: Vec<String> = Vec::new();
    for _ in 0..3000 {
        let plan = program_strategy().new_tree(&mut runner).unwrap().current();
        match agree(&plan) {
            Some(Ok(())) => outcomes.push("accepted".into()),
            Some(Err(e)) => outcomes.push(e.0),
            None => {}
        }
    }
    for needle in [
        "accepted",
        "nothing has written",
        "twice",
        "averages a partial sum",
        "reduces an already averaged value",
        "lacks the contribution",
        "never written",
        "was averaged",
    ] {
        assert!(
            outcomes.iter().any(|m| m.contains(needle)),
            "no random program ended with {needle:?}"
        );
    }
}

#[test]
fn a_copy_onto_its_own_tail_repeats_its_head_as_element_by_element() {
    // Out of place, world 1: copy input[0..2] to output[0..2], then copy within the output.
    let mut plan = crate::plan::OneShotSpec {
        world: 1,
        count: 8,
        in_place: false,
        op: ReduceOp::Sum,
    }
    .build()
    .unwrap();
    let (input, output) = (
        plan.buffer(0, BufKind::Input).unwrap(),
        plan.buffer(0, BufKind::Output).unwrap(),
    );
    let at = |buf, offset, count| Region { buf, offset, count };
    let copy = |src, dst| Instr {
        stream: StreamKind::Main,
        op: Op::Copy { src, dst },
        tag: Tag::ENTRY,
    };
    plan.ranks[0] = vec![
        copy(at(input, 0, 2), at(output, 0, 2)),
        // Element by element this reads 0, 1, then what it wrote to 2, 3, ...: the whole
        // output ends written, with the head repeated — so element 2 holds input element 0.
        copy(at(output, 0, 6), at(output, 2, 6)),
    ];
    let err = agree(&plan).unwrap().unwrap_err();
    assert!(
        err.0
            .contains("output element 2 holds element 0 of the inputs, want element 2"),
        "{err}"
    );
    // Copied backwards it reads elements never written.
    plan.ranks[0][1] = copy(at(output, 2, 6), at(output, 0, 6));
    let err = agree(&plan).unwrap().unwrap_err();
    assert!(err.0.contains("reads element 2 of Output"), "{err}");
    // A forward overlap whose head (here output[1..4]) is partly unwritten names the first
    // unwritten head element.
    plan.ranks[0][1] = copy(at(output, 1, 4), at(output, 4, 4));
    let err = agree(&plan).unwrap().unwrap_err();
    assert!(err.0.contains("reads element 2 of Output"), "{err}");
}

/// Small plans of every collective but the all-reduce, in and out of place, peer and staged.
fn collective_plans() -> Vec<Plan> {
    use crate::plan::{Collective, CollectiveSpec, Transfer};
    let mut plans = Vec::new();
    for (world, count, chunk, slots) in [(2, 7, 3, 2), (3, 5, 2, 1), (4, 3, 8, 3), (1, 4, 2, 1)] {
        let transfers = (0..world)
            .map(|r| Transfer {
                from: r,
                to: (r + 1) % world,
                count: count + r,
            })
            .collect();
        for c in [
            Collective::ReduceScatter,
            Collective::AllGather,
            Collective::Broadcast { root: world - 1 },
            Collective::Reduce { root: world / 2 },
            Collective::AllToAll,
            Collective::SendRecv { transfers },
        ] {
            for transport in [EdgeTransport::Peer, EdgeTransport::Staged] {
                for in_place in [false, true] {
                    if in_place && !c.has_in_place() {
                        continue;
                    }
                    let mut s =
                        CollectiveSpec::new(c.clone(), world, count, chunk, slots, transport);
                    s.ring.in_place = in_place;
                    if c.reduces() {
                        s.ring.op = ReduceOp::Avg;
                    }
                    plans.push(s.build().unwrap());
                }
            }
        }
    }
    plans
}

/// Every plant at every instruction of small plans of every other collective: both executions
/// agree (the shifts move with the data in runs as element by element), and the faults reach the
/// rejections only shifts can give.
#[test]
fn runs_agree_with_elements_on_every_planted_fault_of_every_collective() {
    let mut seen: Vec<String> = Vec::new();
    let (mut accepted, mut rejected) = (0, 0);
    for plan in &collective_plans() {
        assert_eq!(agree(plan), Some(Ok(())), "{:?}", plan.collective);
        for rank in 0..plan.world {
            for index in 0..plan.ranks[rank].len() {
                for plant in PLANTS {
                    let Some(broken) = planted(plan, rank, index, plant) else {
                        continue;
                    };
                    match agree(&broken) {
                        Some(Ok(())) => accepted += 1,
                        Some(Err(e)) => {
                            rejected += 1;
                            seen.push(e.0);
                        }
                        None => {}
                    }
                }
            }
        }
    }
    assert!(accepted > 0 && rejected > 100, "{accepted} {rejected}");
    for needle in [
        "nothing has written",
        "twice",
        "reduces different elements",
        "holds element",
        "holds the contribution of rank(s)",
        "never written",
    ] {
        assert!(
            seen.iter().any(|m| m.contains(needle)),
            "no planted fault was rejected with {needle:?}"
        );
    }
}

/// The same on every other collective's plans.
#[test]
fn runs_agree_with_elements_on_random_collective_plans() {
    let plans = collective_plans();
    let held = count_agreeing(300, (0usize..32, plants_strategy()), |(which, plants)| {
        let plan = plans[which % plans.len()].clone();
        agree(&plant_all(plan, &plants)).is_some()
    });
    assert!(
        held >= 75,
        "{held} of 300 planted collective plans were compared"
    );
}
