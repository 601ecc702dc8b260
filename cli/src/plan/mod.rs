//! `ringreduce plan`: one all-reduce plan, built by the library's own builders
//! ([`ringreduce::plan`]), proved by its checker ([`ringreduce::check::check`]) and shown — a step
//! table per rank and stream ([`table`]) and, with `--svg`, a timeline with one lane per (rank,
//! stream) ([`timeline`]). The figures in the docs are drawn from real plans this way, not by hand.
//!
//! Needs no GPU: a plan is data, and the checker runs on the CPU. The GPU executor runs these same
//! plans with the segment boundaries aligned to 16 bytes (`--align 4` for f32) and the ring chunk
//! it picks per size; here both are flags.
//!
//! Invariant: what is printed and drawn is the plan the builder returned, instruction for
//! instruction; nothing is added, merged or reordered except by the stated layout rule.

mod table;
mod timeline;

use crate::{parse_op, parse_positive, Failure};
use ringreduce::plan::{
    Collective, CollectiveSpec, EdgeTransport, Gather, OneShotSpec, Plan, RingSpec, Transfer,
    TwoShotSpec,
};
use ringreduce::ReduceOp;
use std::path::PathBuf;

/// The all-reduce algorithms that have a plan builder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanAlgorithm {
    /// [`RingSpec`]: reduce-scatter then all-gather around the ring, chunked, with staging slots.
    Ring,
    /// [`OneShotSpec`]: one peer reduce over every rank's whole buffer.
    OneShot,
    /// [`TwoShotSpec`]: a peer reduce of the rank's own segment, then a gather round per peer.
    TwoShot,
}

impl PlanAlgorithm {
    fn name(self) -> &'static str {
        match self {
            PlanAlgorithm::Ring => "ring",
            PlanAlgorithm::OneShot => "one-shot",
            PlanAlgorithm::TwoShot => "two-shot",
        }
    }
}

fn parse_plan_algorithm(text: &str) -> Result<PlanAlgorithm, String> {
    match text {
        "ring" => Ok(PlanAlgorithm::Ring),
        "oneshot" | "one-shot" => Ok(PlanAlgorithm::OneShot),
        "twoshot" | "two-shot" => Ok(PlanAlgorithm::TwoShot),
        _ => Err(format!(
            "unknown algorithm {text:?}: use ring, oneshot or twoshot (auto picks one per size on \
             a communicator; a plan is one of them)"
        )),
    }
}

fn parse_gather(text: &str) -> Result<Gather, String> {
    match text {
        "pull" => Ok(Gather::Pull),
        "push" => Ok(Gather::Push),
        _ => Err(format!("unknown gather {text:?}: use pull or push")),
    }
}

/// A collective by its command-line name (`root` for broadcast and reduce; send/recv is the
/// pipeline exchange r → r + 1 of `count` elements each).
fn parse_collective(
    text: &str,
    root: usize,
    world: usize,
    count: usize,
) -> Result<Collective, String> {
    Ok(match text {
        "allreduce" | "all-reduce" => Collective::AllReduce,
        "reducescatter" | "reduce-scatter" => Collective::ReduceScatter,
        "allgather" | "all-gather" => Collective::AllGather,
        "broadcast" => Collective::Broadcast { root },
        "reduce" => Collective::Reduce { root },
        "alltoall" | "all-to-all" => Collective::AllToAll,
        "sendrecv" | "send-recv" => Collective::SendRecv {
            transfers: (0..world)
                .map(|r| Transfer {
                    from: r,
                    to: (r + 1) % world,
                    count,
                })
                .collect(),
        },
        _ => {
            return Err(format!(
                "unknown collective {text:?}: use all-reduce, reduce-scatter, all-gather, \
                 broadcast, reduce, all-to-all or send-recv"
            ))
        }
    })
}

#[derive(clap::Args, Clone, Debug)]
pub struct PlanArgs {
    /// Which collective: all-reduce (default), reduce-scatter, all-gather, broadcast, reduce,
    /// all-to-all or send-recv (the pipeline exchange r → r + 1). All but the all-reduce are
    /// copy-engine plans with the ring's knobs; `--count` is NCCL's count for each.
    #[arg(long, default_value = "all-reduce")]
    pub collective: String,
    /// The root of a broadcast or reduce.
    #[arg(long, default_value_t = 0)]
    pub root: usize,
    /// Which all-reduce: ring, oneshot or twoshot.
    #[arg(long, default_value = "ring", value_parser = parse_plan_algorithm)]
    pub algorithm: PlanAlgorithm,
    /// Ranks taking part (the world size).
    #[arg(long, default_value_t = 4, value_parser = parse_positive)]
    pub ranks: usize,
    /// Elements per rank.
    #[arg(long, default_value_t = 16)]
    pub count: usize,
    /// Ring chunk in elements (default: the whole segment, one chunk per step).
    #[arg(long, value_parser = parse_positive)]
    pub chunk: Option<usize>,
    /// Staging slots per receiver of the ring (default: `CudaConfig`'s).
    #[arg(long, value_parser = parse_positive)]
    pub slots: Option<usize>,
    /// Segment and chunk boundaries on multiples of this many elements (the GPU executor: 16
    /// bytes' worth).
    #[arg(long, default_value_t = 1, value_parser = parse_positive)]
    pub align: usize,
    /// How the two-shot's reduced segments reach every rank: pull (each rank reads them from
    /// their owners: the GPU executor's) or push (each owner writes its segment into every rank
    /// as it reduces it: the host executor's).
    #[arg(long, default_value = "pull", value_parser = parse_gather)]
    pub gather: Gather,
    /// In place: the output is the input buffer.
    #[arg(long)]
    pub in_place: bool,
    /// Ranks without peer access: every ring edge staged through pinned host memory
    /// (device→host on the sender, host→device on the receiver) instead of peer copies; the
    /// one-shot's sources published into host copies its peers read. Checked for that too (no
    /// rank touches another's device memory).
    #[arg(long)]
    pub staged: bool,
    /// Reduction: sum, prod, min, max or avg (only avg changes the plan: it adds the scaling).
    #[arg(long, default_value = "sum", value_parser = parse_op)]
    pub op: ReduceOp,
    /// Write the plan's timeline here (SVG).
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

/// Builds the plan `args` describe with the library's builder, and a one-line title for it.
pub fn build(args: &PlanArgs) -> Result<(Plan, String), Failure> {
    let ring_only = [
        (args.chunk.is_some(), "--chunk"),
        (args.slots.is_some(), "--slots"),
        (
            args.staged && args.algorithm != PlanAlgorithm::OneShot,
            "--staged",
        ),
    ];
    if args.algorithm != PlanAlgorithm::Ring {
        if let Some((_, flag)) = ring_only.iter().find(|(given, _)| *given) {
            return Err(Failure::Usage(format!(
                "{flag} applies to the ring only (--staged to the one-shot too), not to the {}",
                args.algorithm.name()
            )));
        }
    }
    let (world, count, in_place, op) = (args.ranks, args.count, args.in_place, args.op);
    let collective =
        parse_collective(&args.collective, args.root, world, count).map_err(Failure::Usage)?;
    if collective != Collective::AllReduce {
        if args.algorithm != PlanAlgorithm::Ring {
            return Err(Failure::Usage(format!(
                "{} has one plan, the copy-engine one: leave out --algorithm",
                collective.name()
            )));
        }
        let transport = if args.staged {
            EdgeTransport::Staged
        } else {
            EdgeTransport::Peer
        };
        let mut spec = CollectiveSpec::new(
            collective,
            world,
            count,
            args.chunk.unwrap_or(count.max(1)),
            args.slots
                .unwrap_or(ringreduce::CudaConfig::default().slots),
            transport,
        );
        spec.ring.in_place = in_place;
        spec.ring.op = op;
        spec.ring.align_elems = args.align;
        let title = format!(
            "{}, {world} rank{} × count {count}, {}, {}; {} edges",
            spec.collective.name(),
            if world == 1 { "" } else { "s" },
            if in_place { "in place" } else { "out of place" },
            op.name(),
            if args.staged { "staged" } else { "peer" },
        );
        return spec
            .build()
            .map(|plan| (plan, title))
            .map_err(|e| Failure::Failed(format!("the plan could not be built: {e}")));
    }
    let shape = format!(
        "{} all-reduce, {world} rank{} × {count} element{}, {}, {}",
        args.algorithm.name(),
        if world == 1 { "" } else { "s" },
        if count == 1 { "" } else { "s" },
        if in_place { "in place" } else { "out of place" },
        op.name()
    );
    let built = match args.algorithm {
        PlanAlgorithm::Ring => {
            let transport = if args.staged {
                EdgeTransport::Staged
            } else {
                EdgeTransport::Peer
            };
            let spec = RingSpec {
                in_place,
                op,
                align_elems: args.align,
                ..RingSpec::new(
                    world,
                    count,
                    args.chunk.unwrap_or(count.max(1)),
                    args.slots
                        .unwrap_or(ringreduce::CudaConfig::default().slots),
                    transport,
                )
            };
            let knobs = format!(
                "; chunk {} elements, {} slots per receiver, {} edges, align {}",
                spec.effective_chunk(),
                spec.slots,
                if args.staged { "staged" } else { "peer" },
                spec.align_elems
            );
            spec.build().map(|plan| (plan, shape + &knobs))
        }
        PlanAlgorithm::OneShot => {
            let spec = OneShotSpec {
                world,
                count,
                in_place,
                op,
            };
            match args.staged {
                true => spec
                    .build_staged()
                    .map(|plan| (plan, shape + "; staged: through host copies")),
                false => spec.build().map(|plan| (plan, shape)),
            }
        }
        PlanAlgorithm::TwoShot => TwoShotSpec {
            world,
            count,
            in_place,
            op,
            align: args.align,
            gather: args.gather,
        }
        .build()
        .map(|plan| {
            let gather = format!("{:?}", args.gather).to_lowercase();
            (
                plan,
                format!("{shape}; align {}; {gather}ed gather", args.align),
            )
        }),
    };
    built.map_err(|e| Failure::Failed(format!("the plan could not be built: {e}")))
}

/// The command: build, check, print the step table; draw the timeline with `--svg`. Fails when the
/// checker rejects the plan (after printing it, so the rejection can be read against it).
pub fn run(args: &PlanArgs) -> Result<(), Failure> {
    let (plan, title) = build(args)?;
    out!("# {title}");
    let verdict = if args.staged {
        ringreduce::check::check_staged(&plan)
    } else {
        ringreduce::check::check(&plan)
    };
    let result = if plan.collective == Collective::AllReduce {
        "every output element holds every rank's contribution once"
    } else {
        "every output holds exactly what the collective defines"
    };
    match &verdict {
        Ok(()) => out!(
            "checked: ok (shape; enqueue order without deadlock; no data race over two \
             back-to-back calls; {result}{})",
            if args.staged {
                "; no rank touches another rank's device memory"
            } else {
                ""
            }
        ),
        Err(why) => out!("checked: REJECTED: {why}"),
    }
    out!("");
    for line in table::render(&plan).lines() {
        out!("{line}");
    }
    if let Some(path) = &args.svg {
        let svg = timeline::render_svg(&plan, &title);
        std::fs::write(path, svg).map_err(|e| format!("{}: {e}", path.display()))?;
        out!("");
        out!("# timeline: {}", path.display());
    }
    verdict.map_err(|why| Failure::Failed(format!("the checker rejected the plan: {why}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Wrap {
        #[command(subcommand)]
        command: Sub,
    }
    #[derive(clap::Subcommand)]
    enum Sub {
        Plan(PlanArgs),
    }

    fn parse(argv: &[&str]) -> Result<PlanArgs, clap::Error> {
        let argv = ["ringreduce", "plan"].iter().chain(argv);
        Wrap::try_parse_from(argv).map(|w| match w.command {
            Sub::Plan(args) => args,
        })
    }

    #[test]
    fn every_algorithm_builds_a_plan_the_checker_accepts() {
        for argv in [
            &[][..],
            &["--ranks", "3", "--count", "7"],
            &[
                "--ranks", "3", "--count", "7", "--chunk", "1", "--slots", "1",
            ],
            &["--ranks", "2", "--count", "9", "--staged", "--in-place"],
            &[
                "--ranks", "5", "--count", "33", "--align", "4", "--op", "avg",
            ],
            &["--algorithm", "oneshot", "--ranks", "3", "--in-place"],
            &["--algorithm", "twoshot", "--ranks", "4", "--count", "10"],
            &["--algorithm", "two-shot", "--ranks", "1"],
        ] {
            let args = parse(argv).unwrap();
            let (plan, title) = build(&args).unwrap_or_else(|_| panic!("{argv:?}"));
            assert_eq!((plan.world, plan.count), (args.ranks, args.count));
            assert!(title.contains(&format!("{} rank", args.ranks)), "{title}");
            ringreduce::check::check(&plan).unwrap_or_else(|r| panic!("{argv:?}: {r}"));
        }
    }

    #[test]
    fn every_collective_builds_a_plan_the_checker_accepts() {
        for name in [
            "reduce-scatter",
            "all-gather",
            "broadcast",
            "reduce",
            "all-to-all",
            "send-recv",
        ] {
            for extra in [&[][..], &["--staged", "--chunk", "2"], &["--root", "2"]] {
                let mut argv = vec!["--collective", name, "--ranks", "3", "--count", "5"];
                argv.extend_from_slice(extra);
                let args = parse(&argv).unwrap();
                let (plan, title) = build(&args).unwrap_or_else(|e| panic!("{argv:?}: {e:?}"));
                assert!(title.starts_with(plan.collective.name()), "{title}");
                ringreduce::check::check(&plan).unwrap_or_else(|r| panic!("{argv:?}: {r}"));
            }
        }
        let args = parse(&["--collective", "gather"]).unwrap();
        assert!(matches!(build(&args), Err(Failure::Usage(_))));
        let args = parse(&["--collective", "all-gather", "--algorithm", "oneshot"]).unwrap();
        assert!(matches!(build(&args), Err(Failure::Usage(_))));
    }

    #[test]
    fn the_ring_knobs_reach_the_spec_and_the_title() {
        let args = parse(&["--ranks", "3", "--count", "12", "--chunk", "2", "--staged"]).unwrap();
        let (plan, title) = build(&args).unwrap();
        assert!(
            title.contains("chunk 2 elements, 3 slots per receiver, staged edges"),
            "{title}"
        );
        assert!(plan
            .buffers
            .iter()
            .any(|b| b.kind == ringreduce::plan::BufKind::HostSlots && b.len == 2 * 3));
    }

    #[test]
    fn bad_input_is_refused() {
        for argv in [
            &["--ranks", "0"][..],
            &["--chunk", "0"],
            &["--slots", "0"],
            &["--algorithm", "auto"],
        ] {
            let err = parse(argv).err().unwrap_or_else(|| panic!("{argv:?}"));
            assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
        }
        let args = parse(&["--algorithm", "twoshot", "--staged"]).unwrap();
        match build(&args) {
            Err(Failure::Usage(why)) => assert!(why.contains("--staged"), "{why}"),
            _ => panic!("--staged with the two-shot was accepted"),
        }
        // The one-shot takes it: its staged form, through host copies.
        let args = parse(&["--algorithm", "oneshot", "--staged"]).unwrap();
        let (plan, title) = build(&args).unwrap();
        assert!(title.contains("staged: through host copies"), "{title}");
        assert!(plan
            .buffers
            .iter()
            .any(|b| b.kind == ringreduce::plan::BufKind::HostExposed));
        let args = parse(&["--algorithm", "twoshot", "--ranks", "65"]).unwrap();
        assert!(matches!(build(&args), Err(Failure::Failed(_))));
    }
}
