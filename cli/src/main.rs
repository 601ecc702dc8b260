//! The `ringreduce` command: a user of the library, not part of it.
//!
//! `ringreduce` (no subcommand) is the main job, [`run`]: it looks for GPUs, runs the all-reduce on
//! them — or, where no GPU or driver is found, on host ranks — checks every result exactly, and
//! prints a table in the style of nccl-tests. [`info`] says what this build and machine have;
//! [`topo`], [`p2p`], [`sync`] and [`tour`] look at the machine; [`bench`](mod@bench) measures against NCCL;
//! [`plan`] shows and checks one plan, with no GPU; [`launch`] starts the processes of a job
//! with one process per rank.
//! This file holds the command line, the exit codes and the flag parsers the subcommands share.
//!
//! Invariant: every failure leaves through [`Failure`], so that each cause has one exit code and
//! one line on stderr.

use clap::{Parser, Subcommand};
use ringreduce::device;
use ringreduce::{Communicator, ReduceOp};
use std::process::ExitCode;

/// `println!` that ends the program quietly when stdout is closed (`ringreduce run | head`)
/// instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if writeln!(std::io::stdout(), $($arg)*).is_err() {
            std::process::exit(0);
        }
    }};
}

// Subcommands (declared after `out!` so they can use it).
mod bench;
mod info;
mod launch;
mod p2p;
mod plan;
mod run;
mod sync;
mod topo;
mod tour;

#[derive(Parser)]
#[command(
    name = "ringreduce",
    version,
    about = "Ring all-reduce across the GPUs of one host"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run and check all-reduce over a range of sizes (the default).
    Run(run::RunArgs),
    /// What this build and machine have: kernel build path, driver, GPUs.
    Info,
    /// GPUs, peer access, links and the ring order a communicator would choose.
    Topo(topo::TopoArgs),
    /// Peer-copy, staged and host-copy bandwidth, and the n×n bandwidth/latency matrix.
    P2p(p2p::P2pArgs),
    /// The cross-GPU event handoff, shown and checked (and the pitfall it prevents).
    Sync(sync::SyncArgs),
    /// The four checks in order: peer access, P2P bandwidth, cross-GPU sync, all-reduce vs NCCL.
    Tour(tour::TourArgs),
    /// nccl-tests-style sweep: ringreduce against NCCL, JSON and plots.
    Bench(bench::BenchArgs),
    /// A plan's step table and timeline (SVG), checked: one all-reduce for a given algorithm, rank
    /// count and chunking. No GPU needed.
    Plan(plan::PlanArgs),
    /// Start N processes of one job with torchrun's variables, and stop them all when one fails.
    Launch(launch::LaunchArgs),
}

/// Why a command failed; each cause has its own exit code.
#[derive(Debug)]
pub enum Failure {
    /// The command needs GPUs and there are none (or not enough): exit code 3.
    NoGpu(String),
    /// Anything else (a CUDA error, a wrong result, a rejected plan): exit code 1.
    Failed(String),
    /// Flags that parse one by one but not together (`plan --staged` with the one-shot): exit
    /// code 2, as for the usage errors clap finds.
    Usage(String),
}

impl From<String> for Failure {
    fn from(msg: String) -> Failure {
        Failure::Failed(msg)
    }
}

impl From<ringreduce::Error> for Failure {
    fn from(err: ringreduce::Error) -> Failure {
        match err {
            ringreduce::Error::NoGpu { reason } => Failure::NoGpu(reason),
            // A function this NCCL lacks: not measured here, as without NCCL.
            missing if ringreduce::exec::nccl::Api::is_missing(&missing) => {
                Failure::NoGpu(missing.to_string())
            }
            other => Failure::Failed(other.to_string()),
        }
    }
}

/// The number of visible GPUs, or [`Failure::NoGpu`] (one line saying why) below `min`.
pub fn require_gpus(min: usize) -> Result<usize, Failure> {
    let n = device::driver_available()
        .and_then(|()| device::device_count())
        .map_err(|e| Failure::NoGpu(e.to_string()))?;
    if n < min {
        return Err(Failure::NoGpu(format!(
            "this command needs {min} GPU(s), found {n}"
        )));
    }
    Ok(n)
}

/// Exit codes: 0 all correct; 1 a collective failed, a result was wrong or a plan was rejected;
/// 2 bad usage (clap, or flags that do not go together); 3 no GPU (for the commands that need one).
fn main() -> ExitCode {
    let cli = Cli::parse();
    let result: Result<(), Failure> =
        match cli.command.unwrap_or(Command::Run(run::RunArgs::default())) {
            Command::Run(args) => run::run(&args).map_err(Failure::from),
            Command::Info => info::run().map_err(Failure::from),
            Command::Topo(args) => topo::run(&args),
            Command::P2p(args) => p2p::run(&args),
            Command::Sync(args) => sync::run(&args),
            Command::Tour(args) => tour::run(&args),
            Command::Bench(args) => bench::run(&args),
            Command::Plan(args) => plan::run(&args),
            Command::Launch(args) => launch::run(&args),
        };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::NoGpu(why)) => {
            eprintln!("ringreduce: no GPU: {why}");
            ExitCode::from(3)
        }
        Err(Failure::Failed(msg)) => {
            eprintln!("ringreduce: {msg}");
            ExitCode::from(1)
        }
        Err(Failure::Usage(msg)) => {
            eprintln!("ringreduce: {msg}");
            ExitCode::from(2)
        }
    }
}

/// "4096", "64K", "256M", "1G" (powers of 1024).
fn parse_bytes(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let (digits, shift) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("not a size: {text:?} (e.g. 4096, 64K, 256M, 1G)"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("size too large: {text}"))
}

/// A ring chunk for `--chunk`: a size as [`parse_bytes`] reads it, at least 1 byte.
pub fn parse_chunk_bytes(text: &str) -> Result<usize, String> {
    match parse_bytes(text)? {
        0 => Err(format!(
            "the chunk must be at least 1 byte, got {text:?} (leave --chunk out for the automatic size)"
        )),
        bytes => Ok(bytes),
    }
}

/// A count that must be at least 1 (`--slots`, `p2p --iters`).
pub fn parse_positive(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("expected a whole number ≥ 1, got {text:?}")),
    }
}

/// The inverse of [`parse_bytes`] where it is exact: "32M" for 32 MiB, "1000" for 1000.
pub fn format_bytes(bytes: usize) -> String {
    for (shift, unit) in [(30, "G"), (20, "M"), (10, "K")] {
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// "ring chunk: 32M (33554432 B, --chunk); staging slots per receiver: 4" — the ring's knobs as
/// `run` and `bench` print them; `None` is the automatic chunk.
pub fn describe_knobs(chunk_bytes: Option<usize>, slots: usize) -> String {
    let chunk = match chunk_bytes {
        Some(b) => format!("{} ({b} B, --chunk)", format_bytes(b)),
        None => "automatic (per size: a quarter of a segment within 4 MiB to 64 MiB, the whole \
                 segment below 4 MiB, half a segment up to 128 MiB from 32 MiB segments; at \
                 most 4 MiB when an edge is staged)"
            .to_string(),
    };
    format!("ring chunk: {chunk}; staging slots per receiver: {slots}")
}

/// A reduction by name: sum, prod, min, max or avg (`bench -o`, `plan --op`).
pub fn parse_op(text: &str) -> Result<ReduceOp, String> {
    ReduceOp::from_name(text)
        .ok_or_else(|| format!("unknown op {text:?}: use sum, prod, min, max or avg"))
}

pub fn parse_algorithm(text: &str) -> Result<ringreduce::Algorithm, String> {
    match text {
        "auto" => Ok(ringreduce::Algorithm::Auto),
        "ring" => Ok(ringreduce::Algorithm::Ring),
        "oneshot" | "one-shot" => Ok(ringreduce::Algorithm::OneShot),
        "twoshot" | "two-shot" => Ok(ringreduce::Algorithm::TwoShot),
        _ => Err(format!(
            "unknown algorithm {text:?}: use auto, ring, oneshot or twoshot"
        )),
    }
}

/// "one-shot (SM kernel reading peers) up to 33554432 B per rank, ring above" —
/// what the communicator's algorithm does by size on `comm`, out of place and, where it differs,
/// in place.
pub fn describe_algorithm(comm: &Communicator) -> String {
    let oop = describe_by_size(|b| comm.algorithm_for(b, false));
    let ip = describe_by_size(|b| comm.algorithm_for(b, true));
    if oop == ip {
        oop
    } else {
        format!("out of place: {oop}; in place: {ip}")
    }
}

/// The same for a collective other than the all-reduce on `comm`: which form (the one-shot's or
/// the ring's) runs by the collective's count in bytes.
pub fn describe_collective_algorithm(
    comm: &Communicator,
    collective: &ringreduce::plan::Collective,
) -> String {
    describe_by_size(|b| comm.algorithm_for_collective(collective, b, false))
        .replace("B per rank", "B of count")
}

fn describe_by_size(algorithm_for: impl Fn(usize) -> ringreduce::Algorithm) -> String {
    let name = |a: ringreduce::Algorithm| match a {
        ringreduce::Algorithm::OneShot => "one-shot (SM kernel reading peers)",
        ringreduce::Algorithm::TwoShot => "two-shot (SM kernel: reduce-scatter, gather from peers)",
        _ => "ring",
    };
    // Auto's rule is a series of thresholds: find each by bisection between powers of two.
    let mut parts = Vec::new();
    let mut lo = 1usize;
    let mut current = algorithm_for(lo);
    for shift in 1..usize::BITS {
        let hi = 1usize << shift;
        if algorithm_for(hi) == current {
            lo = hi;
            continue;
        }
        let (mut a, mut b) = (lo, hi);
        while b - a > 1 {
            let mid = a + (b - a) / 2;
            if algorithm_for(mid) == current {
                a = mid
            } else {
                b = mid
            }
        }
        parts.push(format!("{} up to {a} B per rank", name(current)));
        current = algorithm_for(b);
        lo = b;
    }
    if parts.is_empty() {
        format!("{} at every size", name(current))
    } else {
        format!("{}, {} above", parts.join(", "), name(current))
    }
}

fn parse_transport(text: &str) -> Result<ringreduce::Transport, String> {
    match text {
        "auto" => Ok(ringreduce::Transport::Auto),
        "peer" => Ok(ringreduce::Transport::Peer),
        "staged" => Ok(ringreduce::Transport::Staged),
        _ => Err(format!(
            "unknown transport {text:?}: use auto, peer or staged"
        )),
    }
}
