//! The `ringreduce` command: a user of the library, not part of it.
//!
//! `ringreduce` (no subcommand) is the main job: it looks for GPUs, runs the all-reduce on them —
//! or, where no GPU or driver is found, on host ranks — checks every result exactly, and prints a
//! table in the style of nccl-tests. `ringreduce info` says what this build and machine have.

use clap::{Parser, Subcommand};
use ringreduce::device;
use ringreduce::exec::cuda::kernels;
use ringreduce::verify::{compare, make_expected, make_input};
use ringreduce::{Communicator, EdgeTransport, GpuBuffer, HostConfig, ReduceOp};
use std::process::ExitCode;
use std::time::{Duration, Instant};

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
mod p2p;
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
    Run(RunArgs),
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
}

#[derive(clap::Args, Clone)]
struct RunArgs {
    /// Host ranks to use when no GPU is found.
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Smallest message in bytes per rank (suffixes K, M, G: powers of 1024).
    #[arg(short = 'b', long, default_value = "1K", value_parser = parse_bytes)]
    min_bytes: usize,
    /// Largest message in bytes per rank (default: 256M on GPUs, 8M on host ranks).
    #[arg(short = 'e', long, value_parser = parse_bytes)]
    max_bytes: Option<usize>,
    /// Size multiplier between rows.
    #[arg(short = 'f', long, default_value_t = 8)]
    factor: usize,
    /// How GPU ring edges move data: auto, peer or staged.
    #[arg(long, default_value = "auto", value_parser = parse_transport)]
    transport: ringreduce::Transport,
    /// Which all-reduce runs on GPUs: auto (one-shot for small messages, ring above), ring or
    /// oneshot.
    #[arg(long, default_value = "auto", value_parser = parse_algorithm)]
    algorithm: ringreduce::Algorithm,
    /// Force host ranks even where GPUs exist.
    #[arg(long)]
    host: bool,
    /// Ring chunk in bytes (suffixes K, M, G), in place of the default: on GPUs the automatic
    /// size (`CudaConfig::chunk_bytes = None`, see `auto_chunk_bytes`), on host ranks 1M. The
    /// one-shot has no chunks.
    #[arg(long, value_parser = parse_chunk_bytes)]
    chunk: Option<usize>,
    /// Staging slots per receiver of the ring (default: 3 on GPUs, `CudaConfig`'s; 4 on host
    /// ranks).
    #[arg(long, value_parser = parse_positive)]
    slots: Option<usize>,
}

impl Default for RunArgs {
    fn default() -> Self {
        RunArgs {
            ranks: 4,
            min_bytes: 1024,
            max_bytes: None,
            factor: 8,
            transport: ringreduce::Transport::Auto,
            algorithm: ringreduce::Algorithm::Auto,
            host: false,
            chunk: None,
            slots: None,
        }
    }
}

/// Why a command failed; each cause has its own exit code.
#[derive(Debug)]
pub enum Failure {
    /// The command needs GPUs and there are none (or not enough): exit code 3.
    NoGpu(String),
    /// Anything else (a CUDA error, a wrong result): exit code 1.
    Failed(String),
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

/// Exit codes: 0 all correct; 1 a collective failed or a result was wrong; 2 bad usage (clap);
/// 3 no GPU (for the commands that need one).
fn main() -> ExitCode {
    let cli = Cli::parse();
    let result: Result<(), Failure> = match cli.command.unwrap_or(Command::Run(RunArgs::default()))
    {
        Command::Run(args) => run(&args).map_err(Failure::from),
        Command::Info => info().map_err(Failure::from),
        Command::Topo(args) => topo::run(&args),
        Command::P2p(args) => p2p::run(&args),
        Command::Sync(args) => sync::run(&args),
        Command::Tour(args) => tour::run(&args),
        Command::Bench(args) => bench::run(&args),
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
    }
}

fn info() -> Result<(), String> {
    out!("ringreduce {}", env!("CARGO_PKG_VERSION"));
    out!("reduce kernels: {}", kernels::build_kind());
    match device::driver_available() {
        Err(e) => out!("GPUs: none ({e})"),
        Ok(()) => {
            if let Ok((major, minor)) = device::driver_version() {
                out!("CUDA driver API: {major}.{minor}");
            }
            for d in device::devices().map_err(|e| e.to_string())? {
                out!(
                    "GPU {}: {}, {:.1} GiB, {} SMs, sm_{}{}, PCI {}",
                    d.index,
                    d.name,
                    d.total_memory_bytes as f64 / (1u64 << 30) as f64,
                    d.sm_count,
                    d.compute_capability.0,
                    d.compute_capability.1,
                    d.pci_bus_id
                );
            }
        }
    }
    Ok(())
}

fn run(args: &RunArgs) -> Result<(), String> {
    if !args.host {
        match device::driver_available().and_then(|()| device::device_count()) {
            Ok(n) if n > 0 => return run_gpu(args),
            Ok(_) => out!("No GPU found (the driver reports none). Running the all-reduce on {} host ranks instead.", args.ranks),
            Err(e) => out!("No GPU found ({e}). Running the all-reduce on {} host ranks instead.", args.ranks),
        }
    }
    run_host(args)
}

fn run_gpu(args: &RunArgs) -> Result<(), String> {
    let n = device::device_count().map_err(|e| e.to_string())?;
    let defaults = ringreduce::CudaConfig::default();
    let config = ringreduce::CudaConfig {
        transport: args.transport,
        algorithm: args.algorithm,
        allow_shared_device: n == 1,
        chunk_bytes: args.chunk,
        slots: args.slots.unwrap_or(defaults.slots),
        ..defaults
    };
    let knobs = describe_knobs(config.chunk_bytes, config.slots);
    let comm = if n == 1 {
        out!("# one GPU: running two ranks that share GPU 0 (no copy crosses between GPUs)");
        Communicator::with_config(&[0, 0], config)
    } else {
        Communicator::with_config(&(0..n).collect::<Vec<_>>(), config)
    }
    .map_err(|e| e.to_string())?;
    let world = comm.world();
    out!(
        "# all-reduce on {world} GPU(s) {:?}, f32 sum, ringreduce; {}",
        comm.devices(),
        describe_algorithm(&comm)
    );
    out!("# {knobs}");
    for e in comm.edges() {
        out!("# edge {}", e.describe());
        if let Some(why) = e.slow() {
            out!(
                "# WARNING: edge GPU {} -> GPU {} is {why}",
                e.from_device,
                e.to_device
            );
        }
    }
    out!(
        "# time: host wall clock over back-to-back iterations including completion, per iteration"
    );
    out!("# busbw = algbw * 2(n-1)/n; GB = 1e9 bytes; #wrong from a separate checked call");
    print_table(args, 256 << 20, world, |count, in_place| {
        time_gpu(&comm, count, in_place)
    })?;
    comm.close().map_err(|e| e.to_string())
}

fn print_header() {
    out!(
        "#{:>13} {:>12} {:>6} {:>6} {:>10} {:>9} {:>9} {:>7}   {:>10} {:>9} {:>9} {:>7}",
        "size (B)",
        "count",
        "type",
        "redop",
        "oop (us)",
        "algbw",
        "busbw",
        "#wrong",
        "ip (us)",
        "algbw",
        "busbw",
        "#wrong"
    );
}

fn cells(bytes: usize, world: usize, time: Duration, wrong: usize) -> String {
    let algbw = bench::algbw_gbps(bytes, time.as_secs_f64());
    let busbw = bench::busbw_gbps(algbw, world);
    format!(
        " {:>10.1} {algbw:>9.2} {busbw:>9.2} {wrong:>7}  ",
        time.as_secs_f64() * 1e6
    )
}

/// Time per iteration over back-to-back enqueued iterations (after a warm-up), and the number of
/// wrong elements of one separately checked call.
fn time_gpu(
    comm: &Communicator,
    count: usize,
    in_place: bool,
) -> ringreduce::Result<(Duration, usize)> {
    let op = ReduceOp::Sum;
    let devices = comm.devices();
    let inputs: Vec<Vec<f32>> = (0..devices.len())
        .map(|r| make_input(op, r, count))
        .collect();
    let mut ins: Vec<GpuBuffer<f32>> = devices
        .iter()
        .zip(&inputs)
        .map(|(&d, x)| GpuBuffer::from_host(d, x))
        .collect::<ringreduce::Result<_>>()?;
    let mut outs: Vec<GpuBuffer<f32>> = devices
        .iter()
        .map(|&d| GpuBuffer::zeroed(d, count))
        .collect::<ringreduce::Result<_>>()?;
    // Checked call first.
    if in_place {
        comm.all_reduce_in_place(&mut ins, op)?;
    } else {
        comm.all_reduce(&ins, &mut outs, op)?;
    }
    let want = make_expected::<f32>(op, devices.len(), count);
    let mut wrong = 0;
    for (rank, b) in (if in_place { &ins } else { &outs }).iter().enumerate() {
        wrong += compare(rank, &b.to_host()?, &want, 0).0;
    }
    let iterations = ((1usize << 30) / (count * 4).max(1)).clamp(5, 200);
    let mut go = |n: usize| -> ringreduce::Result<Duration> {
        let start = Instant::now();
        for _ in 0..n {
            // SAFETY: the buffers outlive the `synchronize` below and nothing else touches them.
            unsafe {
                if in_place {
                    comm.enqueue_all_reduce_in_place(&mut ins, op)?;
                } else {
                    comm.enqueue_all_reduce(&ins, &mut outs, op)?;
                }
            }
        }
        comm.synchronize()?;
        Ok(start.elapsed() / n as u32)
    };
    go(iterations.min(20))?;
    let time = go(iterations)?;
    Ok((time, wrong))
}

/// Sizes from `min_bytes` up to `max_bytes`, ×`factor` per row, whole f32 elements.
fn sizes(args: &RunArgs, default_max: usize) -> Vec<usize> {
    let max = args.max_bytes.unwrap_or(default_max);
    let factor = args.factor.max(2);
    std::iter::successors(Some(args.min_bytes.max(4) / 4 * 4), |s| {
        s.checked_mul(factor)
    })
    .take_while(|&s| s <= max)
    .collect()
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

fn run_host(args: &RunArgs) -> Result<(), String> {
    let world = args.ranks;
    // f32 elements; a chunk below one element is one element (as the GPU executor rounds).
    let chunk_bytes = args.chunk.unwrap_or(1 << 20);
    let config = HostConfig {
        chunk_elems: (chunk_bytes / 4).max(1),
        slots: args.slots.unwrap_or(4),
        transport: EdgeTransport::Peer,
        ..HostConfig::default()
    };
    let knobs = format!(
        "ring chunk: {} ({} f32 elements{}); staging slots per receiver: {}",
        format_bytes(config.chunk_elems * 4),
        config.chunk_elems,
        if args.chunk.is_some() {
            ", --chunk"
        } else {
            ""
        },
        config.slots
    );
    let comm = Communicator::host_with(world, config).map_err(|e| e.to_string())?;
    out!("# all-reduce on {world} host ranks (one thread per rank, a worker per stream), f32 sum");
    out!("# {knobs}");
    out!("# busbw = algbw * 2(n-1)/n; GB = 1e9 bytes; time is the median over the iterations");
    print_table(args, 8 << 20, world, |count, in_place| {
        time_host(&comm, count, in_place)
    })
}

/// Prints the nccl-tests-style table: one row per size, out of place then in place, timed by
/// `time(count, in_place)`; fails when any element was wrong.
fn print_table(
    args: &RunArgs,
    default_max_bytes: usize,
    world: usize,
    mut time: impl FnMut(usize, bool) -> ringreduce::Result<(Duration, usize)>,
) -> Result<(), String> {
    print_header();
    let mut total_wrong = 0;
    for bytes in sizes(args, default_max_bytes) {
        let count = bytes / 4;
        let mut row = format!("  {bytes:>12} {count:>12} {:>6} {:>6}", "f32", "sum");
        for in_place in [false, true] {
            let (t, wrong) = time(count, in_place).map_err(|e| e.to_string())?;
            total_wrong += wrong;
            row += &cells(bytes, world, t, wrong);
        }
        out!("{row}");
    }
    if total_wrong > 0 {
        return Err(format!("{total_wrong} wrong elements"));
    }
    out!("# all results correct");
    Ok(())
}

/// Median time of one all-reduce over a few iterations, and the number of wrong elements.
fn time_host(
    comm: &Communicator,
    count: usize,
    in_place: bool,
) -> ringreduce::Result<(Duration, usize)> {
    let world = comm.world();
    let op = ReduceOp::Sum;
    let inputs: Vec<Vec<f32>> = (0..world).map(|r| make_input(op, r, count)).collect();
    let mut outputs = inputs.clone();
    let iterations = (32 * 1024 * 1024 / (count * 4).max(1)).clamp(3, 50);
    let mut times = Vec::with_capacity(iterations);
    let mut wrong = 0;
    let want = make_expected::<f32>(op, world, count);
    for i in 0..=iterations {
        if in_place {
            for (o, input) in outputs.iter_mut().zip(&inputs) {
                o.copy_from_slice(input);
            }
        }
        let start = Instant::now();
        if in_place {
            comm.all_reduce_in_place(&mut outputs, op)?;
        } else {
            comm.all_reduce(&inputs, &mut outputs, op)?;
        }
        // The first iteration is the warm-up (it also builds and checks the plan).
        if i > 0 {
            times.push(start.elapsed());
        }
        if i == iterations {
            for (rank, out) in outputs.iter().enumerate() {
                wrong += compare(rank, out, &want, 0).0;
            }
        }
    }
    times.sort();
    Ok((times[times.len() / 2], wrong))
}
