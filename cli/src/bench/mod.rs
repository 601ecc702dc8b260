//! `ringreduce bench`: an nccl-tests-style sweep of ringreduce's all-reduce against NCCL's on the
//! same GPUs, with the machine, versions, commit and date beside the numbers; `--json` and `--plot`.
//!
//! # What one row is
//!
//! For each size (bytes per rank; count = bytes / element size): out of place, then in place —
//! time (µs), algbw = bytes / time (GB/s, 1 GB = 10⁹ B), busbw = algbw · 2(n−1)/n, #wrong — and
//! per-iteration times (min, median, p99). ringreduce runs in this process; NCCL runs in child
//! processes of this same executable (`--nccl-only --json-stdout`), because NCCL reads its
//! environment (`NCCL_ALGO`, `NCCL_P2P_DISABLE`) once, at communicator creation: once with NCCL's
//! defaults and once with `NCCL_ALGO=Ring` (ring against ring); with `--transport staged`, both
//! with `NCCL_P2P_DISABLE=1` (NCCL's host shared-memory path, the counterpart of staging).
//!
//! # Timing (as nccl-tests)
//!
//! Per size and placement: one checked call on fresh inputs (every element of every rank compared
//! with the exact host reference, [`ringreduce::verify`]), `-w` warm-up iterations, then `-n`
//! iterations enqueued back to back and timed on the host from the first enqueue to the end of the
//! wait for completion, divided by `-n`. Then a second pass of `-n` iterations with a CUDA timing
//! event recorded on rank 0's stream between consecutive iterations gives per-iteration times
//! (rank 0's view: its part of iteration i ends when it has received everything it needs).
//!
//! # Where each part lives
//!
//! This module reads the arguments and runs the passes; [`measure`] times one library over the
//! sweep ([`measure_random`] over the random-size workload), [`library`] drives ringreduce and
//! NCCL through the same calls, [`stats`] holds a row's arithmetic, [`nccl`] runs NCCL in its
//! child processes, [`report`] holds the rows, the JSON report and the printed tables, and
//! [`plot`] draws a report (SVG, or PNG through resvg).

mod args;
mod collective;
mod compare;
mod graph;
mod library;
mod measure;
mod measure_random;
mod memory;
mod nccl;
mod plot;
mod processes;
mod random;
mod report;
mod stats;
mod torch;

pub use args::BenchArgs;
pub use stats::{algbw_gbps, busbw_gbps};

use crate::{require_gpus, Failure};
use args::{cuda_config, knobs_suffix, Sizes};
use collective::BenchCollective;
use compare::{print_comparison, print_random};
use library::Lib;
use measure::{Mode, Sweep};
use memory::Memory;
use nccl::run_nccl_only;
use plot::check_plot_path;
use report::{Header, Report, Row};
use ringreduce::{Communicator, Transport};

/// The staged pass's arguments: the ring with every edge staged, up to [`STAGED_MAX_BYTES`],
/// eager and fixed sizes only; the ring knobs (`--chunk`, `--slots`) and everything else as in
/// the main pass.
pub fn staged_pass_args(args: &BenchArgs) -> BenchArgs {
    let max_bytes = args.max_bytes.min(STAGED_MAX_BYTES);
    BenchArgs {
        transport: Transport::Staged,
        algorithm: ringreduce::Algorithm::Ring,
        max_bytes,
        min_bytes: args.min_bytes.min(max_bytes),
        graph: None,
        sizes: Sizes::Sweep,
        ..args.clone()
    }
}

/// The main pass's label: "ringreduce (auto)", with the algorithm when forced, ", low-latency"
/// with `--low-latency`, and the ring's knobs (`knobs`, [`knobs_suffix`]).
fn main_label(args: &BenchArgs, knobs: &str) -> String {
    format!(
        "ringreduce ({}{}{}{knobs})",
        format!("{:?}", args.transport).to_lowercase(),
        match args.algorithm {
            ringreduce::Algorithm::Auto => String::new(),
            a => format!(", {}", format!("{a:?}").to_lowercase()),
        },
        if args.low_latency {
            ", low-latency"
        } else {
            ""
        },
    ) + if args.profile_host {
        // Its calls carry the profile's marks: a fraction of a µs each.
        " [profiled]"
    } else {
        ""
    }
}

/// `label` with `note` added inside its parentheses: "ringreduce (auto)" + "graph 10" →
/// "ringreduce (auto, graph 10)"; "NCCL" + "graph 10" → "NCCL (graph 10)".
pub fn with_note(label: &str, note: &str) -> String {
    match label.strip_suffix(')') {
        Some(head) if head.contains('(') => format!("{head}, {note})"),
        _ => format!("{label} ({note})"),
    }
}

/// The command: `--from-json` draws an earlier report; otherwise the main pass, then the staged
/// pass unless `--no-staged` (or the main pass is staged), the comparison tables, the random-size
/// tables, `--json` and `--plot`. Fails when any element of any row was wrong.
pub fn run(args: &BenchArgs) -> Result<(), Failure> {
    if let Some(p) = &args.plot {
        check_plot_path(p)?;
    }
    if args.min_bytes > args.max_bytes {
        return Err(Failure::Failed(format!(
            "-b {} is larger than -e {}",
            args.min_bytes, args.max_bytes
        )));
    }
    if args.nccl_only {
        return run_nccl_only(args);
    }
    if let Some(processes) = args.processes {
        return processes::run(args, processes);
    }
    if let Some(source) = &args.from_json {
        return plot::plot_from_json(source, args.plot.as_deref());
    }
    // Read before any GPU work, so a wrong path fails at once.
    let torch = match &args.torch_json {
        Some(path) => Some(torch::read_torch_json(path)?),
        None => None,
    };
    let (n, devices) = if args.shared_gpu {
        (require_gpus(1)?, vec![0, 0])
    } else {
        let n = require_gpus(2)?;
        (n, (0..n).collect())
    };
    let no_nccl = BenchArgs {
        no_nccl: true,
        ..args.clone()
    };
    let args = if args.shared_gpu { &no_nccl } else { args };
    let (chunk_bytes, slots) = (args.chunk.map(|b| b as u64), Some(args.slots as u64));
    let knobs = knobs_suffix(chunk_bytes, slots);
    let ring_label = main_label(args, &knobs);

    let (mut header, detected) = report::machine_header(args, n)?;

    let mut not_measured = Vec::new();
    let mut random = Vec::new();
    let mut pass = |args: &BenchArgs, label: &str, header: &mut Header| {
        measure_pass(
            args,
            &devices,
            label,
            detected.as_ref(),
            header,
            &mut not_measured,
            &mut random,
        )
    };
    let (mut rows, mut comparisons) = pass(args, &ring_label, &mut header)?;
    // The staged fallback against NCCL's host path, in the same report: ringreduce's ring with
    // every edge staged through pinned host memory, and NCCL with NCCL_P2P_DISABLE=1. Up to
    // 256 MiB (the staged path moves ~45 GB/s: a 1 GiB row alone would take seconds per
    // iteration).
    if args.transport != Transport::Staged && !args.no_staged {
        let staged = staged_pass_args(args);
        let label = format!("ringreduce (staged{knobs})");
        let (staged_rows, staged_comparisons) = pass(&staged, &label, &mut header)?;
        rows.extend(staged_rows);
        comparisons.extend(staged_comparisons);
    }
    let report = Report {
        header,
        collectives: args.collectives(),
        chunk_bytes,
        slots,
        not_measured,
        rows,
        random,
        torch,
    };
    if let Some(t) = &report.torch {
        torch::print_torch(t);
    }
    for (label, against) in &comparisons {
        print_comparison(&report, label, against);
    }
    print_random(&report);

    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        out!("# JSON: {}", path.display());
    }
    if let Some(path) = &args.plot {
        let what = format!("{} {} on {n} GPUs{knobs}", args.dtype, args.op);
        plot::write_plots(path, &report.rows, &report.collectives, &what)?;
    }
    let wrong: u64 = report
        .rows
        .iter()
        .map(|r| r.out_of_place.wrong + r.in_place.wrong)
        .chain(report.random.iter().map(|r| r.wrong))
        .sum();
    if wrong > 0 {
        return Err(Failure::Failed(format!(
            "{wrong} wrong elements (see the #wrong columns)"
        )));
    }
    let failed = report.rows.iter().filter(|r| r.error.is_some()).count()
        + report.random.iter().filter(|r| r.error.is_some()).count();
    if failed > 0 {
        out!("# all results measured are correct; {failed} rows or workloads could not be measured (see above)");
    } else {
        out!("# all results correct");
    }
    Ok(())
}

/// A ringreduce label and the labels of the NCCL runs its comparison table counts.
type Comparison = (String, Vec<String>);

/// Bytes per rank the staged pass of a default `bench` goes up to.
const STAGED_MAX_BYTES: usize = 256 << 20;

/// One pass of the report: ringreduce with `args`' transport and algorithm over the sweep (eager,
/// then in CUDA graphs with `--graph`, then the random-size workload with `--sizes random`), then
/// each NCCL configuration that matches it (in child processes). Returns the rows and, per
/// ringreduce label, the labels of the NCCL runs it is compared with.
#[allow(clippy::too_many_arguments)]
fn measure_pass(
    args: &BenchArgs,
    devices: &[usize],
    label: &str,
    detected: Option<&ringreduce::topo::Detected>,
    header: &mut Header,
    not_measured: &mut Vec<(String, String)>,
    random: &mut Vec<random::RandomRun>,
) -> Result<(Vec<Row>, Vec<Comparison>), Failure> {
    let first = !header.iter().any(|(k, _)| k.ends_with(" links"));
    let printed = header.len();
    let comm = Communicator::with_config(devices, cuda_config(args))?;
    header.push((
        format!("{label} algorithm"),
        crate::describe_algorithm(&comm),
    ));
    if args
        .collectives()
        .iter()
        .any(|&c| c != BenchCollective::AllReduce)
    {
        // The other collectives share one rule (the one-shot's form up to a limit on the bytes
        // crossing a rank's links): shown for the all-gather, whose count is a rank's block.
        header.push((
            format!("{label} other collectives"),
            format!(
                "{} (send/recv: ring at every size)",
                crate::describe_collective_algorithm(
                    &comm,
                    &ringreduce::plan::Collective::AllGather,
                )
            ),
        ));
    }
    header.push((format!("{label} links"), describe_links(&comm, detected)));
    let from = if first { 0 } else { printed };
    for (k, v) in &header[from..] {
        out!("# {k}: {v}");
    }

    let sweep = Sweep::new(args, devices.to_vec())?;
    let lib = Lib::Ring(&comm);
    let mut rows = sweep.run(&lib, label, true, Mode::Eager, Memory::Plain)?;
    if args.profile_host {
        report::print_host_profiles(&rows);
    }
    let mut labels = vec![label.to_string()];
    // The random workload before the graphs: a failed capture may leave the communicator failed.
    if args.sizes == Sizes::Random && args.collectives().contains(&BenchCollective::AllReduce) {
        for in_place in [false, true] {
            let (calls, seed) = (args.random_calls, args.seed);
            random.push(sweep.run_random(&lib, label, Memory::Plain, calls, seed, in_place));
        }
    }
    if let Some(calls) = args.graph {
        let graph_label = with_note(label, &format!("graph {calls}"));
        rows.extend(sweep.run(&lib, &graph_label, true, Mode::Graph(calls), Memory::Plain)?);
        labels.push(graph_label);
    }
    drop(sweep);
    comm.close()?;

    let against = nccl::measure_nccl(args, &mut rows, random, header, not_measured);
    Ok((
        rows,
        labels.into_iter().map(|l| (l, against.clone())).collect(),
    ))
}

/// Each ring edge's link and how ringreduce moves data over it; warns about slow edges.
fn describe_links(comm: &Communicator, detected: Option<&ringreduce::topo::Detected>) -> String {
    let mut links = Vec::new();
    for e in comm.edges() {
        let link = detected.and_then(|d| {
            d.links
                .get(e.from_device)?
                .get(e.to_device)
                .copied()
                .flatten()
        });
        let kind = match link {
            Some(l) if l.is_nvlink() => format!("NVLink {l}"),
            Some(l) => format!("PCIe ({l})"),
            None => "link unknown".to_string(),
        };
        let probe = match &e.probe {
            Some(p) => format!(", probe {:.1} GB/s", p.measured_gb_per_s),
            None => String::new(),
        };
        links.push(format!(
            "GPU {} -> GPU {}: {kind}, ringreduce {:?} ({}){probe}",
            e.from_device, e.to_device, e.transport, e.reason
        ));
        if let Some(why) = e.slow() {
            out!(
                "# WARNING: edge GPU {} -> GPU {} is {why}",
                e.from_device,
                e.to_device
            );
        }
    }
    links.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_bytes;
    use clap::Parser;

    #[derive(clap::Parser)]
    pub(super) struct Wrap {
        #[command(subcommand)]
        pub(super) command: Sub,
    }
    #[derive(clap::Subcommand)]
    pub(super) enum Sub {
        Bench(BenchArgs),
    }

    fn parse(argv: &[&str]) -> Result<BenchArgs, clap::Error> {
        let argv = ["ringreduce", "bench"].iter().chain(argv);
        Wrap::try_parse_from(argv).map(|w| match w.command {
            Sub::Bench(args) => args,
        })
    }

    #[test]
    fn ring_knobs_reach_both_passes_and_the_labels() {
        let defaults = ringreduce::CudaConfig::default();
        // Left out: the library's defaults, and labels as before the flags.
        let args = parse(&[]).unwrap();
        assert_eq!((args.chunk, args.slots), (None, defaults.slots));
        let config = cuda_config(&args);
        assert_eq!(
            (config.chunk_bytes, config.slots),
            (defaults.chunk_bytes, defaults.slots)
        );
        assert_eq!(knobs_suffix(None, Some(defaults.slots as u64)), "");
        assert_eq!(knobs_suffix(None, None), "");

        let args = parse(&[
            "--chunk",
            "32M",
            "--slots",
            "4",
            "-b",
            "128M",
            "-e",
            "1G",
            "--algorithm",
            "oneshot",
        ])
        .unwrap();
        let config = cuda_config(&args);
        assert_eq!((config.chunk_bytes, config.slots), (Some(32 << 20), 4));
        assert_eq!(config.algorithm, ringreduce::Algorithm::OneShot);
        // The staged pass: staged ring up to 256 MiB, same knobs.
        let staged = cuda_config(&staged_pass_args(&args));
        assert_eq!((staged.chunk_bytes, staged.slots), (Some(32 << 20), 4));
        assert_eq!(
            (staged.transport, staged.algorithm),
            (Transport::Staged, ringreduce::Algorithm::Ring)
        );
        let staged = staged_pass_args(&args);
        assert_eq!(
            (staged.min_bytes, staged.max_bytes),
            (128 << 20, STAGED_MAX_BYTES)
        );
        assert_eq!(
            knobs_suffix(Some(32 << 20), Some(4)),
            ", chunk 32M, slots 4"
        );
        assert_eq!(knobs_suffix(None, Some(2)), ", chunk auto, slots 2");
        assert_eq!(knobs_suffix(Some(1000), None), ", chunk 1000");

        // 0 is refused when the flags are read, before any GPU is looked for.
        for bad in [&["--chunk", "0"][..], &["--slots", "0"], &["--chunk", "0M"]] {
            let err = parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} was accepted"));
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{bad:?}"
            );
        }
        assert_eq!(crate::format_bytes(32 << 20), "32M");
        assert_eq!(crate::format_bytes(1 << 30), "1G");
        assert_eq!(crate::format_bytes(1536), "1536");
        assert_eq!(crate::format_bytes(3 << 10), "3K");
        for text in ["1", "4K", "128M", "2G", "1000"] {
            assert_eq!(crate::format_bytes(parse_bytes(text).unwrap()), text);
        }
    }

    #[test]
    fn low_latency_reaches_the_config_and_the_label() {
        let args = parse(&[]).unwrap();
        assert!(!cuda_config(&args).low_latency);
        assert_eq!(main_label(&args, ""), "ringreduce (auto)");
        let args = parse(&["--low-latency", "--algorithm", "oneshot"]).unwrap();
        assert!(cuda_config(&args).low_latency);
        assert_eq!(
            main_label(&args, ", chunk 32M"),
            "ringreduce (auto, oneshot, low-latency, chunk 32M)"
        );
        // Everything else stays the library's default.
        let config = ringreduce::CudaConfig {
            low_latency: false,
            algorithm: ringreduce::Algorithm::Auto,
            ..cuda_config(&args)
        };
        assert_eq!(config, ringreduce::CudaConfig::default());
    }

    #[test]
    fn collective_and_all_flags() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.collectives(), [BenchCollective::AllReduce]);
        let args = parse(&["--collective", "reduce_scatter"]).unwrap();
        assert_eq!(args.collectives(), [BenchCollective::ReduceScatter]);
        let args = parse(&["--all"]).unwrap();
        assert_eq!(args.collectives(), BenchCollective::ALL);
        for bad in [
            &["--collective", "allreduce"][..],
            &["--collective", "all_reduce", "--all"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
        let at = |c| plot::plot_path(std::path::Path::new("out/bench.svg"), c);
        assert_eq!(
            at(BenchCollective::AllGather),
            std::path::Path::new("out/bench-all_gather.svg")
        );
        assert_eq!(
            plot::plot_path(std::path::Path::new("b"), BenchCollective::SendRecv),
            std::path::Path::new("b-sendrecv")
        );
    }

    #[test]
    fn graph_sizes_and_torch_flags() {
        let args = parse(&[]).unwrap();
        assert_eq!(
            (args.graph, args.sizes, args.torch_json.clone()),
            (None, Sizes::Sweep, None)
        );
        assert_eq!((args.random_calls, args.seed), (1000, random::DEFAULT_SEED));
        let args = parse(&[
            "--graph",
            "10",
            "--sizes",
            "random",
            "--random-calls",
            "300",
            "--seed",
            "42",
            "--torch-json",
            "t.json",
        ])
        .unwrap();
        assert_eq!((args.graph, args.sizes), (Some(10), Sizes::Random));
        assert_eq!((args.random_calls, args.seed), (300, 42));
        assert_eq!(
            args.torch_json.as_deref(),
            Some(std::path::Path::new("t.json"))
        );
        // The staged pass is eager and fixed-size.
        let staged = staged_pass_args(&args);
        assert_eq!((staged.graph, staged.sizes), (None, Sizes::Sweep));
        for bad in [
            &["--graph", "0"][..],
            &["--random-calls", "0"],
            &["--sizes", "zipf"],
        ] {
            let err = parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} was accepted"));
            assert!(
                matches!(
                    err.kind(),
                    clap::error::ErrorKind::ValueValidation | clap::error::ErrorKind::InvalidValue
                ),
                "{bad:?}: {:?}",
                err.kind()
            );
        }
        assert_eq!(
            with_note("ringreduce (auto)", "graph 10"),
            "ringreduce (auto, graph 10)"
        );
        assert_eq!(
            with_note("ringreduce (auto, chunk 32M, slots 4)", "graph 2"),
            "ringreduce (auto, chunk 32M, slots 4, graph 2)"
        );
        assert_eq!(with_note("NCCL", "graph 10"), "NCCL (graph 10)");
    }
}
