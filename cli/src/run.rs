//! `ringreduce run` (and `ringreduce` alone): the all-reduce on every GPU found — or, where no GPU
//! or driver is found, on host ranks — over a range of sizes, every result checked exactly against
//! the host reference ([`ringreduce::verify`]), printed as a table in the style of nccl-tests.
//!
//! Invariant: a row's `#wrong` comes from a separate checked call on fresh inputs, never from the
//! timed iterations; the command fails when any element of any row was wrong.

use crate::{
    bench, describe_algorithm, describe_knobs, format_bytes, parse_algorithm, parse_bytes,
    parse_chunk_bytes, parse_positive, parse_transport,
};
use ringreduce::device;
use ringreduce::verify::{compare, make_expected, make_input};
use ringreduce::{Algorithm, Communicator, GpuBuffer, HostConfig, ReduceOp, Transport};
use std::time::{Duration, Instant};

#[derive(clap::Args, Clone)]
pub struct RunArgs {
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
    /// How edges move data: auto, peer or staged (host ranks: staged runs the plans of ranks
    /// that cannot read each other's memory — the staged one-shot and the ring through host
    /// slots; otherwise peer).
    #[arg(long, default_value = "auto", value_parser = parse_transport)]
    transport: ringreduce::Transport,
    /// Which all-reduce runs: auto, ring, oneshot or twoshot. On GPUs auto picks by size; on
    /// host ranks auto runs the two-shot, their fastest (its gather pushed: docs/PERFORMANCE.md,
    /// "Host executor") — over staged edges the staged one-shot or the ring by size (the
    /// library's selection, `exec::algorithm::select`).
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

/// The command: GPUs where the driver finds any (unless `--host`), host ranks otherwise.
pub fn run(args: &RunArgs) -> Result<(), String> {
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
pub fn time_gpu(
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

fn run_host(args: &RunArgs) -> Result<(), String> {
    let world = args.ranks;
    // f32 elements; a chunk below one element is one element (as the GPU executor rounds).
    let chunk_bytes = args.chunk.unwrap_or(1 << 20);
    // Staged edges (`--transport staged`): the plans of ranks that cannot read each other's
    // memory, which the library's selection picks per size; else the host ranks' (the pushed
    // two-shot for `auto`, at every size), asked of the selection here to name it.
    let staged = args.transport == Transport::Staged;
    let algorithm = match staged {
        true => args.algorithm,
        false => {
            ringreduce::exec::algorithm::select(&ringreduce::exec::algorithm::Ask {
                chosen: args.algorithm,
                collective: &ringreduce::plan::Collective::AllReduce,
                count_bytes: 0,
                world,
                in_place: false,
                reach: ringreduce::exec::algorithm::Reach::Host,
                deterministic: false,
                ll_grid: None,
                gated: false,
            })
            .algorithm
        }
    };
    let config = HostConfig {
        chunk_elems: (chunk_bytes / 4).max(1),
        slots: args.slots.unwrap_or(4),
        transport: if staged {
            Transport::Staged
        } else {
            Transport::Peer
        },
        algorithm,
        ..HostConfig::default()
    };
    let staged_limit = ringreduce::exec::algorithm::STAGED_ONESHOT_AUTO_MAX_BYTES * 2 / world;
    let knobs = format!(
        "algorithm: {}; ring chunk: {} ({} f32 elements{}); staging slots per receiver: {}",
        match (algorithm, staged) {
            (Algorithm::TwoShot, _) => "two-shot, its gather pushed".to_string(),
            (Algorithm::OneShot, true) => "one-shot, staged through host copies".to_string(),
            (Algorithm::OneShot, false) => "one-shot".to_string(),
            (Algorithm::Auto, _) => format!(
                "auto over staged edges: the staged one-shot up to {} per rank, the ring above",
                format_bytes(staged_limit)
            ),
            _ if staged => "ring, staged through host slots".to_string(),
            _ => "ring".to_string(),
        },
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
    out!("# all-reduce on {world} host ranks (blocking calls of the one- and two-shot on a thread per core; the ring on a thread per rank and stream), f32 sum");
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
