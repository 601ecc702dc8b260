//! Guide chapter 7, collectives as data: the plans behind chapters 5–7
//! (`docs/guide/07-other-collectives.md`).
//!
//! Builds the ring, one-shot and two-shot plans for several worlds, proves each with the checker
//! (symbolic result, no race over two back-to-back calls, no deadlock while enqueuing) and prints
//! their sizes: steps, chunks, instructions, events. Then breaks one plan on purpose — a missing
//! cross-rank wait — and prints the checker's rejection. Needs no GPU: plans are compiled and
//! proved on the CPU before any executor runs them.
//!
//! Run: `cargo run --release --example 07_plans`

use ringreduce::check::check;
use ringreduce::plan::{
    ring, EdgeTransport, Gather, OneShotSpec, Op, Phase, Plan, RingSpec, TwoShotSpec,
};
use ringreduce::ReduceOp;
use std::time::Instant;

/// Plan size: instructions over all ranks, events, and waits on another rank's event.
fn sizes(plan: &Plan) -> (usize, usize, usize) {
    let remote_waits = plan
        .ranks
        .iter()
        .enumerate()
        .flat_map(|(r, program)| program.iter().map(move |i| (r, i.op)))
        .filter(|&(r, op)| matches!(op, Op::Wait(e) if plan.events[e.0].rank != r))
        .count();
    (plan.len(), plan.events.len(), remote_waits)
}

fn report(name: &str, steps: String, plan: &Plan) {
    let start = Instant::now();
    let verdict = match check(plan) {
        Ok(()) => "proved".to_string(),
        Err(rejection) => format!("REJECTED: {rejection}"),
    };
    let (instrs, events, remote) = sizes(plan);
    println!(
        "{name:<9} {:>5} {steps:<26} {instrs:>6} {events:>6} {remote:>6}  {verdict} in {:.1} ms",
        plan.world,
        start.elapsed().as_secs_f64() * 1e3
    );
}

fn main() -> ringreduce::Result<()> {
    let count = 1 << 20; // elements per rank; the checker's cost does not grow with it
    println!(
        "# plans for {count} elements per rank, in place, sum; checked with ringreduce::check"
    );
    println!(
        "{:<9} {:>5} {:<26} {:>6} {:>6} {:>6}  check",
        "algorithm", "world", "steps", "instrs", "events", "remote"
    );
    for world in [2, 3, 4, 8] {
        let spec = RingSpec::new(world, count, 64 * 1024, 3, EdgeTransport::Peer);
        let chunks = ring::chunks_per_segment(count, world, 1, spec.effective_chunk());
        let steps = format!("2×{} steps × {chunks} chunks", world - 1);
        report("ring", steps, &spec.build()?);
    }
    for world in [2, 4, 8] {
        let spec = OneShotSpec {
            world,
            count,
            in_place: true,
            op: ReduceOp::Sum,
        };
        report(
            "one-shot",
            "1 meeting (copy + read all)".into(),
            &spec.build()?,
        );
        let mut spec = TwoShotSpec {
            world,
            count,
            in_place: true,
            op: ReduceOp::Sum,
            align: 4,
            gather: Gather::Pull,
        };
        report(
            "two-shot",
            format!("1 reduce + {} gathers (pulled)", world - 1),
            &spec.build()?,
        );
        spec.gather = Gather::Push;
        report(
            "two-shot",
            "1 reduce, pushed to every rank".into(),
            &spec.build()?,
        );
    }
    let mut staged = RingSpec::new(4, count, 64 * 1024, 3, EdgeTransport::Staged);
    staged.transports[1] = EdgeTransport::Peer; // a mixed ring: one edge peer, three staged
    report("ring", "3 staged edges, 1 peer".into(), &staged.build()?);

    // The ring's segment schedule, from the same functions the planner uses (plan module doc).
    let world = 4;
    println!();
    println!("# ring, world {world}: segment each rank sends at each step");
    for (phase, name) in [
        (Phase::ReduceScatter, "reduce-scatter"),
        (Phase::AllGather, "all-gather"),
    ] {
        for step in 0..world - 1 {
            let sends: Vec<String> = (0..world)
                .map(|r| {
                    format!(
                        "{r}→{}: seg {}",
                        ring::send_to(r, world),
                        ring::send_segment(phase, r, step, world)
                    )
                })
                .collect();
            println!("{name:<14} step {step}: {}", sends.join(", "));
        }
    }

    // Break a plan: drop rank 1's first wait on another rank's event. On a GPU that is a read
    // of a chunk before its sender finished writing it — no error, wrong bytes. Here the checker
    // refuses it and names the instruction.
    let mut broken = RingSpec::new(2, 64, 16, 2, EdgeTransport::Peer).build()?;
    let victim = broken.ranks[1]
        .iter()
        .position(|i| matches!(i.op, Op::Wait(e) if broken.events[e.0].rank != 1))
        .expect("rank 1 waits on rank 0");
    let removed = broken.ranks[1].remove(victim);
    println!();
    println!(
        "# rank 1 without its wait at instruction {victim} ({})",
        removed.tag
    );
    match check(&broken) {
        Ok(()) => println!("accepted (unexpected)"),
        Err(rejection) => println!("rejected: {rejection}"),
    }
    assert!(
        check(&broken).is_err(),
        "a plan with a missing wait must be rejected"
    );
    Ok(())
}
