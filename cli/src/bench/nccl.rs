//! NCCL's side of `bench`: each NCCL configuration runs in a child process of this executable
//! (`bench --nccl-only --json-stdout`), because NCCL reads its environment once, at communicator
//! creation. The configurations are NCCL's defaults, `NCCL_ALGO=Ring`, symmetric registration
//! (`ncclMemAlloc` + `ncclCommWindowRegister`, nccl-tests' `-R 2`) and, with `--graph N`, the
//! defaults and symmetric registration again with N all-reduces captured per CUDA graph; with
//! staged transport the first two (and the graph) with `NCCL_P2P_DISABLE=1`.
//! `NCCL_NVLS_ENABLE` is 0 unless the parent's environment says otherwise. The children inherit
//! the rest of the environment and find NCCL as the library does (`RINGREDUCE_NCCL_PATH`, else a
//! `libnccl.so.2` on `LD_LIBRARY_PATH` or in the system folders: `ringreduce_cli::baseline`);
//! without one, each run is listed as not measured with the loader's reason, which says to set
//! `RINGREDUCE_NCCL_PATH` or put NCCL's folder on `LD_LIBRARY_PATH`.
//!
//! Invariant: the child runs the same sweep (sizes, type, op, iterations) as the parent and never
//! ringreduce's ring knobs; its rows are the last line of its stdout that is JSON
//! ([`ChildOutput`]), relabelled with the configuration that produced them.

use super::args::{BenchArgs, Sizes};
use super::collective::BenchCollective;
use super::library::Lib;
use super::measure::{Mode, Sweep};
use super::memory::Memory;
use super::random::RandomRun;
use super::report::{print_row, print_table_header, ChildOutput, Row};
use crate::{require_gpus, Failure};
use ringreduce::Transport;
use ringreduce_cli::baseline::NcclAllReduce;

/// One NCCL configuration run in its own process.
#[derive(Clone, Debug, PartialEq)]
pub struct NcclRun {
    pub label: String,
    /// Variables set for the child (NCCL reads them at init).
    pub set: Vec<(String, String)>,
    /// Variables removed from the child's environment.
    pub remove: Vec<String>,
    /// Buffers in NCCL's symmetric memory, registered as windows.
    pub symmetric: bool,
    /// All-reduces per CUDA graph, when captured.
    pub graph: Option<usize>,
}

/// The NCCL runs for this sweep: defaults, `NCCL_ALGO=Ring` and symmetric registration; with
/// `graph`, the defaults and symmetric registration in CUDA graphs of that many all-reduces. With
/// staged transport every run gets `NCCL_P2P_DISABLE=1` and symmetric registration is left out
/// (it needs peer access). `NCCL_NVLS_ENABLE` is 0 unless `nvls` (the parent's value) says
/// otherwise.
pub fn nccl_runs(transport: Transport, nvls: Option<&str>, graph: Option<usize>) -> Vec<NcclRun> {
    let nvls = nvls.unwrap_or("0").to_string();
    let p2p_off = transport == Transport::Staged;
    // (NCCL_ALGO=Ring, symmetric, graph)
    let mut shapes = vec![(false, false, None), (true, false, None)];
    if !p2p_off {
        shapes.push((false, true, None));
    }
    if let Some(n) = graph {
        shapes.push((false, false, Some(n)));
        if !p2p_off {
            shapes.push((false, true, Some(n)));
        }
    }
    shapes
        .into_iter()
        .map(|(ring, symmetric, graph)| {
            let mut set = vec![("NCCL_NVLS_ENABLE".to_string(), nvls.clone())];
            let mut remove = Vec::new();
            let mut notes = Vec::new();
            if ring {
                set.push(("NCCL_ALGO".into(), "Ring".into()));
                notes.push("NCCL_ALGO=Ring".to_string());
            } else {
                remove.push("NCCL_ALGO".to_string());
            }
            if p2p_off {
                set.push(("NCCL_P2P_DISABLE".into(), "1".into()));
                notes.push("NCCL_P2P_DISABLE=1".to_string());
            }
            if symmetric {
                notes.push("symmetric".to_string());
            }
            if let Some(n) = graph {
                notes.push(format!("graph {n}"));
            }
            let label = if notes.is_empty() {
                "NCCL".to_string()
            } else {
                format!("NCCL ({})", notes.join(", "))
            };
            NcclRun {
                label,
                set,
                remove,
                symmetric,
                graph,
            }
        })
        .collect()
}

/// The child's command line (after the executable): the same sweep, NCCL only, JSON on stdout,
/// in `run`'s configuration; the random-size workload too when asked for and not in a graph.
pub fn child_args(args: &BenchArgs, run: &NcclRun) -> Vec<String> {
    let mut argv: Vec<String> = vec![
        "bench".into(),
        "--nccl-only".into(),
        "--json-stdout".into(),
        "-b".into(),
        args.min_bytes.to_string(),
        "-e".into(),
        args.max_bytes.to_string(),
        "-f".into(),
        args.factor.to_string(),
        "-d".into(),
        args.dtype.name().into(),
        "-o".into(),
        args.op.name().into(),
        "-n".into(),
        args.iters.to_string(),
        "-w".into(),
        args.warmup.to_string(),
    ];
    if args.all {
        argv.push("--all".into());
    } else {
        argv.extend(["--collective".into(), args.collective.name().into()]);
    }
    if run.symmetric {
        argv.push("--nccl-symmetric".into());
    }
    if let Some(n) = run.graph {
        argv.extend(["--graph".into(), n.to_string()]);
    } else if args.sizes == Sizes::Random {
        argv.extend([
            "--sizes".into(),
            "random".into(),
            "--random-calls".into(),
            args.random_calls.to_string(),
            "--seed".into(),
            args.seed.to_string(),
        ]);
    }
    argv
}

/// Runs one NCCL configuration in a child process; its rows, or why there are none.
fn run_child(args: &BenchArgs, run: &NcclRun) -> Result<ChildOutput, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(child_args(args, run));
    for (k, v) in &run.set {
        cmd.env(k, v);
    }
    for k in &run.remove {
        cmd.env_remove(k);
    }
    let output = cmd
        .stderr(std::process::Stdio::piped())
        .output()
        .map_err(|e| format!("could not start the NCCL child: {e}"))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("(no message)");
        return Err(format!("{} ({})", last.trim(), output.status));
    }
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        out!("#   [{}] {line}", run.label);
    }
    // NCCL may print to stdout too (NCCL_DEBUG); the rows are the last line that is JSON.
    let stdout = String::from_utf8_lossy(&output.stdout);
    let json = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("{\"nccl_version\""))
        .ok_or_else(|| "the NCCL child printed no rows".to_string())?;
    for line in stdout
        .lines()
        .filter(|l| *l != json && !l.trim().is_empty())
    {
        out!("#   [{}] {line}", run.label);
    }
    let mut child: ChildOutput = serde_json::from_str(json)
        .map_err(|e| format!("the NCCL child's JSON could not be read: {e}"))?;
    for row in &mut child.rows {
        row.library = run.label.clone();
    }
    for r in &mut child.random {
        r.library = run.label.clone();
    }
    Ok(child)
}

/// The NCCL runs that match `args`' pass, each in a child process: their rows appended to `rows`,
/// their random-size workloads to `random`, their versions to `header`, and the ones that could
/// not run to `not_measured` with why. Returns the labels of the runs measured, for the
/// comparison table.
pub fn measure_nccl(
    args: &BenchArgs,
    rows: &mut Vec<Row>,
    random: &mut Vec<RandomRun>,
    header: &mut Vec<(String, String)>,
    not_measured: &mut Vec<(String, String)>,
) -> Vec<String> {
    let mut against = Vec::new();
    if args.no_nccl {
        not_measured.push(("NCCL".to_string(), "--no-nccl".to_string()));
    } else {
        let nvls = std::env::var("NCCL_NVLS_ENABLE").ok();
        for nrun in nccl_runs(args.transport, nvls.as_deref(), args.graph) {
            match run_child(args, &nrun) {
                Ok(child) => {
                    out!("#");
                    out!(
                        "# {} {} ({})",
                        nrun.label,
                        child.nccl_version,
                        nrun.set
                            .iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .join(" ")
                    );
                    print_table_header();
                    for r in &child.rows {
                        print_row(r);
                    }
                    header.push((nrun.label.clone(), format!("NCCL {}", child.nccl_version)));
                    against.push(nrun.label.clone());
                    rows.extend(child.rows);
                    random.extend(child.random);
                }
                Err(why) => {
                    out!("#");
                    out!("# {}: not measured: {why}", nrun.label);
                    not_measured.push((nrun.label.clone(), why));
                }
            }
        }
    }
    against
}

/// The child: NCCL alone over the same sweep, in the configuration its flags name; JSON on
/// stdout.
pub(super) fn run_nccl_only(args: &BenchArgs) -> Result<(), Failure> {
    let n = require_gpus(2)?;
    let devices: Vec<usize> = (0..n).collect();
    let nccl = NcclAllReduce::new(&devices)?;
    let print = !args.json_stdout;
    let version = nccl.version().to_string();
    let memory = if args.nccl_symmetric {
        Memory::Symmetric
    } else {
        Memory::Plain
    };
    let mode = args.graph.map_or(Mode::Eager, Mode::Graph);
    let sweep = Sweep::new(args, devices)?;
    let lib = Lib::Nccl(&nccl);
    let rows = sweep.run(&lib, "NCCL", print, mode, memory);
    let all_reduce = args.collectives().contains(&BenchCollective::AllReduce);
    let random = match (&rows, args.sizes, mode) {
        (Ok(_), Sizes::Random, Mode::Eager) if all_reduce => {
            let (calls, seed) = (args.random_calls, args.seed);
            [false, true]
                .map(|in_place| sweep.run_random(&lib, "NCCL", memory, calls, seed, in_place))
                .into()
        }
        _ => Vec::new(),
    };
    drop(sweep);
    let closed = nccl.close();
    let rows = rows?;
    closed?;
    if args.json_stdout {
        let text = serde_json::to_string(&ChildOutput {
            nccl_version: version,
            rows,
            random,
        })
        .map_err(|e| e.to_string())?;
        out!("{text}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::tests::{Sub, Wrap};
    use super::*;
    use clap::Parser;
    use ringreduce::{DType, ReduceOp};

    #[test]
    fn child_command_line_round_trips() {
        let Sub::Bench(args) = Wrap::parse_from([
            "ringreduce",
            "bench",
            "-b",
            "1K",
            "-e",
            "64M",
            "-f",
            "4",
            "-d",
            "bf16",
            "-o",
            "max",
            "-n",
            "7",
            "-w",
            "2",
            "--transport",
            "staged",
            "--json",
            "x.json",
        ])
        .command;
        let plain = &nccl_runs(args.transport, None, None)[0];
        let argv = child_args(&args, plain);
        let Sub::Bench(child) =
            Wrap::parse_from(std::iter::once("ringreduce".to_string()).chain(argv)).command;
        assert!(child.nccl_only && child.json_stdout);
        assert_eq!(
            (child.min_bytes, child.max_bytes, child.factor),
            (1024, 64 << 20, 4)
        );
        assert_eq!((child.dtype, child.op), (DType::BF16, ReduceOp::Max));
        assert_eq!((child.iters, child.warmup), (7, 2));
        assert!(child.json.is_none() && child.plot.is_none());
        assert!(!child.nccl_symmetric && child.graph.is_none() && child.sizes == Sizes::Sweep);
        assert!(child.collective == BenchCollective::AllReduce && !child.all);
        // The collective, or --all, reaches the child.
        for (flags, want) in [
            (
                &["--collective", "alltoall"][..],
                vec![BenchCollective::AllToAll],
            ),
            (&["--all"][..], BenchCollective::ALL.to_vec()),
        ] {
            let Sub::Bench(parent) =
                Wrap::parse_from(["ringreduce", "bench"].iter().chain(flags).copied()).command;
            let Sub::Bench(c) = Wrap::parse_from(
                std::iter::once("ringreduce".to_string()).chain(child_args(&parent, plain)),
            )
            .command;
            assert_eq!(c.collectives(), want, "{flags:?}");
        }
        // The ring knobs are ringreduce's: never passed to the NCCL child.
        let Sub::Bench(with_knobs) =
            Wrap::parse_from(["ringreduce", "bench", "--chunk", "32M", "--slots", "4"]).command;
        assert!(child_args(&with_knobs, plain)
            .iter()
            .all(|a| a != "--chunk" && a != "--slots"));

        // Graph, symmetric and the random workload reach the child that runs them.
        let Sub::Bench(args) = Wrap::parse_from([
            "ringreduce",
            "bench",
            "--graph",
            "10",
            "--sizes",
            "random",
            "--random-calls",
            "50",
            "--seed",
            "7",
            "-e",
            "32M",
        ])
        .command;
        let runs = nccl_runs(args.transport, None, args.graph);
        let labels: Vec<&str> = runs.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "NCCL",
                "NCCL (NCCL_ALGO=Ring)",
                "NCCL (symmetric)",
                "NCCL (graph 10)",
                "NCCL (symmetric, graph 10)"
            ]
        );
        let child = |run: &NcclRun| {
            let Sub::Bench(c) = Wrap::parse_from(
                std::iter::once("ringreduce".to_string()).chain(child_args(&args, run)),
            )
            .command;
            c
        };
        let sym = child(&runs[2]);
        assert!(sym.nccl_symmetric && sym.graph.is_none());
        assert_eq!(
            (sym.sizes, sym.random_calls, sym.seed),
            (Sizes::Random, 50, 7)
        );
        let sym_graph = child(&runs[4]);
        assert!(sym_graph.nccl_symmetric && sym_graph.graph == Some(10));
        // A graph holds one size: no random workload there.
        assert_eq!(sym_graph.sizes, Sizes::Sweep);
        assert_eq!(child(&runs[1]).graph, None);

        let runs = nccl_runs(Transport::Staged, None, None);
        assert_eq!(runs.len(), 2);
        let env = |r: &NcclRun, k: &str| {
            r.set
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        };
        assert!(runs
            .iter()
            .all(|r| env(r, "NCCL_NVLS_ENABLE").as_deref() == Some("0")));
        assert!(runs
            .iter()
            .all(|r| env(r, "NCCL_P2P_DISABLE").as_deref() == Some("1")));
        assert_eq!(env(&runs[1], "NCCL_ALGO").as_deref(), Some("Ring"));
        assert!(runs[0].remove.contains(&"NCCL_ALGO".to_string()));
        assert!(runs.iter().all(|r| !r.symmetric));
        let runs = nccl_runs(Transport::Auto, Some("0"), None);
        assert_eq!(runs[0].label, "NCCL");
        assert_eq!(runs[1].label, "NCCL (NCCL_ALGO=Ring)");
        assert_eq!(runs[2].label, "NCCL (symmetric)");
        assert!(runs[2].symmetric && runs[2].remove.contains(&"NCCL_ALGO".to_string()));
        assert!(runs.iter().all(|r| env(r, "NCCL_P2P_DISABLE").is_none()));
    }
}
