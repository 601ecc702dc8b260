//! The cell lemma (`ringreduce::check::coarsen`): a plan whose coarse form passes the checks
//! passes them itself. Property tests on the ring's plans (any world, count, chunk, slots,
//! alignment, placement, `Avg`, transports), on plans broken at random (a range moved or resized,
//! an instruction dropped, swapped or moved to another stream, an event wait removed), and on the
//! family the GPU's automatic chunk gives: many counts, few coarse forms.

use proptest::prelude::*;
use ringreduce::check::{check, coarsen};
use ringreduce::exec::cuda::auto_chunk_bytes;
use ringreduce::plan::{EdgeTransport, Op, Plan, RingSpec, StreamKind};
use ringreduce::ReduceOp;

fn ring_strategy() -> impl Strategy<Value = RingSpec> {
    (1usize..=8)
        .prop_flat_map(|world| {
            (
                Just(world),
                prop_oneof![0usize..40, Just(97usize), Just(1009), 40usize..3000],
                1usize..600,
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

/// One way to break a plan, picked and placed by the numbers given.
fn mutate(plan: &mut Plan, kind: usize, at: usize, by: usize) {
    let world = plan.ranks.len();
    let program = &mut plan.ranks[at % world];
    if program.is_empty() {
        return;
    }
    let i = (at / world) % program.len();
    let delta = by % 3 + 1;
    let nudge = |r: &mut ringreduce::plan::Region, which: usize| match which % 4 {
        0 => r.offset += delta,
        1 => r.offset = r.offset.saturating_sub(delta),
        2 => r.count += delta,
        _ => r.count = r.count.saturating_sub(delta),
    };
    match kind % 6 {
        // A range moved or resized.
        0 => match &mut program[i].op {
            Op::Copy { src, dst } => nudge(if by % 2 == 0 { src } else { dst }, by / 2),
            Op::Reduce { dst, a, b } => nudge(
                match by % 3 {
                    0 => dst,
                    1 => a,
                    _ => b,
                },
                by / 3,
            ),
            Op::Scale { region } => nudge(region, by),
            _ => {}
        },
        // An instruction dropped.
        1 => {
            program.remove(i);
        }
        // Two neighbours swapped.
        2 => {
            let j = (i + 1) % program.len();
            program.swap(i, j);
        }
        // An instruction moved to another stream.
        3 => {
            let kinds = StreamKind::ALL;
            program[i].stream = kinds[(program[i].stream.index() + 1 + by) % kinds.len()];
        }
        // A wait removed (the first from `i` on).
        4 => {
            if let Some(w) = (i..program.len()).find(|&k| matches!(program[k].op, Op::Wait(_))) {
                program.remove(w);
            }
        }
        // A buffer shortened.
        _ => {
            let b = by % plan.buffers.len();
            plan.buffers[b].len = plan.buffers[b].len.saturating_sub(delta);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Every ring all-reduce plan has a coarse form, which passes the checks as the plan does.
    #[test]
    fn ring_plans_are_proven_by_their_coarse_form(spec in ring_strategy()) {
        let plan = spec.build().unwrap();
        let coarse = coarsen(&plan).expect("a ring all-reduce has a coarse form");
        prop_assert!(coarse.ranks.iter().flatten().count() == plan.ranks.iter().flatten().count());
        if let Err(e) = check(&coarse) {
            panic!("{spec:?}: the coarse form was rejected: {e}");
        }
        check(&plan).unwrap();
    }

    /// The lemma's claim on broken plans: whenever a broken plan's coarse form passes the checks,
    /// the broken plan passes them too (the break was harmless); a break the checks reject is
    /// rejected through the coarse form as well, or the lemma declines the plan.
    #[test]
    fn a_coarse_form_passes_only_if_the_plan_does(
        spec in ring_strategy(),
        breaks in proptest::collection::vec((0usize..6, 0usize..10_000, 0usize..1000), 1..3),
    ) {
        let mut plan = spec.build().unwrap();
        for (kind, at, by) in breaks {
            mutate(&mut plan, kind, at, by);
        }
        if let Some(coarse) = coarsen(&plan) {
            if check(&coarse).is_ok() {
                if let Err(e) = check(&plan) {
                    panic!("{spec:?}: the coarse form passed, the plan itself: {e}");
                }
            }
        }
    }
}

/// The family the GPU's automatic chunk gives (a quarter of a segment from 4 MiB segments): a
/// thousand counts from 8 to 64 MiB per rank at two ranks share a handful of coarse forms, so a
/// new size is proven by a comparison with one of them.
#[test]
fn many_counts_share_few_coarse_forms() {
    let mut forms: Vec<Plan> = Vec::new();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..1000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let count = (2 << 20) + (state % (14 << 20)) as usize;
        let chunk_bytes = auto_chunk_bytes(count, 2, 4, false);
        let plan = RingSpec {
            world: 2,
            count,
            in_place: state % 2 == 0,
            op: ReduceOp::Sum,
            chunk_elems: chunk_bytes / 4,
            slots: 3,
            align_elems: 4,
            transports: vec![EdgeTransport::Peer; 2],
        }
        .build()
        .unwrap();
        let coarse = coarsen(&plan).unwrap();
        if !forms.contains(&coarse) {
            check(&coarse).unwrap();
            forms.push(coarse);
        }
    }
    println!("{} coarse forms for 1000 counts", forms.len());
    assert!(forms.len() <= 16, "{} coarse forms", forms.len());
}
