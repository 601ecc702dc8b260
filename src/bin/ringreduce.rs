//! The `ringreduce` command: a user of the library, not part of it.
//!
//! `ringreduce` (no subcommand) is the main job: it looks for GPUs, runs the all-reduce on them —
//! or, where no GPU or driver is found, on host ranks — checks every result exactly, and prints a
//! table in the style of nccl-tests. `ringreduce info` says what this build and machine have.

use clap::{Parser, Subcommand};
use ringreduce::exec::cuda::{device, kernels};
use ringreduce::verify::{compare, make_expected, make_input};
use ringreduce::{Communicator, EdgeTransport, HostConfig, ReduceOp};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(name = "ringreduce", version, about = "Ring all-reduce across the GPUs of one host")]
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
}

#[derive(clap::Args, Clone)]
struct RunArgs {
    /// Host ranks to use when no GPU is found.
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Largest message in bytes per rank (default: 1 GiB on GPUs, 8 MiB on host ranks).
    #[arg(long)]
    max_bytes: Option<usize>,
    /// Force host ranks even where GPUs exist.
    #[arg(long)]
    host: bool,
}

impl Default for RunArgs {
    fn default() -> Self {
        RunArgs {
            ranks: 4,
            max_bytes: None,
            host: false,
        }
    }
}

/// Exit codes: 0 all correct; 1 a collective failed or a result was wrong; 2 bad usage.
fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Command::Run(RunArgs::default())) {
        Command::Run(args) => run(&args),
        Command::Info => info(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("ringreduce: {msg}");
            ExitCode::from(1)
        }
    }
}

fn info() -> Result<(), String> {
    println!("ringreduce {}", env!("CARGO_PKG_VERSION"));
    println!("reduce kernels: {}", kernels::build_kind());
    match device::driver_available() {
        Err(e) => println!("GPUs: none ({e})"),
        Ok(()) => {
            if let Ok((major, minor)) = device::driver_version() {
                println!("CUDA driver API: {major}.{minor}");
            }
            for d in device::devices().map_err(|e| e.to_string())? {
                println!(
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
        match device::driver_available() {
            Ok(()) => println!("GPUs found; the GPU path of `ringreduce run` comes with the CUDA executor. Running on host ranks."),
            Err(e) => println!("No GPU found ({e}). Running the all-reduce on {} host ranks instead.", args.ranks),
        }
    }
    run_host(args)
}

/// Sizes from 1 KiB up to `max_bytes`, ×8 per row.
fn sizes(max_bytes: usize) -> Vec<usize> {
    std::iter::successors(Some(1024usize), |s| s.checked_mul(8)).take_while(|&s| s <= max_bytes).collect()
}

fn run_host(args: &RunArgs) -> Result<(), String> {
    let world = args.ranks;
    let config = HostConfig {
        chunk_elems: 256 * 1024,
        slots: 4,
        transport: EdgeTransport::Peer,
        ..HostConfig::default()
    };
    let comm = Communicator::host_with(world, config).map_err(|e| e.to_string())?;
    println!("# all-reduce on {world} host ranks (one thread per rank, a worker per stream), f32 sum");
    println!("# busbw = algbw * 2(n-1)/n; GB = 1e9 bytes; time is the median over the iterations");
    println!("#{:>13} {:>12} {:>6} {:>6} {:>10} {:>9} {:>9} {:>7}   {:>10} {:>9} {:>9} {:>7}", "size (B)", "count", "type", "redop", "oop (us)", "algbw", "busbw", "#wrong", "ip (us)", "algbw", "busbw", "#wrong");
    let mut total_wrong = 0;
    for bytes in sizes(args.max_bytes.unwrap_or(8 << 20)) {
        let count = bytes / 4;
        let mut row = format!("  {bytes:>12} {count:>12} {:>6} {:>6}", "f32", "sum");
        for in_place in [false, true] {
            let (time, wrong) = time_host(&comm, count, in_place).map_err(|e| e.to_string())?;
            total_wrong += wrong;
            let algbw = bytes as f64 / time.as_secs_f64() / 1e9;
            let busbw = algbw * 2.0 * (world as f64 - 1.0) / world as f64;
            row += &format!(" {:>10.1} {algbw:>9.2} {busbw:>9.2} {wrong:>7}  ", time.as_secs_f64() * 1e6);
        }
        println!("{row}");
    }
    if total_wrong > 0 {
        return Err(format!("{total_wrong} wrong elements"));
    }
    println!("# all results correct");
    Ok(())
}

/// Median time of one all-reduce over a few iterations, and the number of wrong elements.
fn time_host(comm: &Communicator, count: usize, in_place: bool) -> ringreduce::Result<(Duration, usize)> {
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
