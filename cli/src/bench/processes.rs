//! `ringreduce bench --processes N`: the all-reduce with one process per rank, as torchrun jobs
//! run it — N processes of this executable started as `ringreduce launch` starts them, each a GPU
//! rank ([`RankCommunicator::from_env_gpu`]) on GPU `LOCAL_RANK`, or on GPU 0 shared by every
//! rank where there are fewer GPUs than ranks (then said so on every table: the processes'
//! contexts time-slice the GPU, so the times are correctness runs, never results).
//!
//! Per size (bytes per rank), in place, on each process's own stream: one checked call on fresh
//! inputs (every element compared with the exact reference; the ranks' counts of wrong elements
//! summed by an all-reduce of their own), `-w` warm-up calls, then `-n` calls each timed on the
//! host from its enqueue to the end of its stream's synchronisation — min, median and p99 of
//! those, and algbw/busbw from the median. With `--registered` every rank registers each size's
//! buffer first (and deregisters it after), so the calls run on it in place. Rank 0 prints the table and how many calls
//! ran without copies; a wrong element fails the command.

use super::args::{cuda_config, BenchArgs};
use super::stats::{algbw_gbps, busbw_gbps, percentiles};
use crate::launch::{self, LaunchArgs};
use crate::Failure;
use ringreduce::verify::{expected_value, input_value};
use ringreduce::{CudaConfig, Element, GpuBuffer, LaunchEnv, RankCommunicator};
use std::time::Instant;

/// Starts `processes` ranks of this command (each with `--rank-process`) under the launcher, or,
/// in a rank, runs its part.
pub fn run(args: &BenchArgs, processes: usize) -> Result<(), Failure> {
    if args.rank_process {
        return run_rank(args);
    }
    if args.all || args.collective.name() != "all_reduce" {
        return Err(Failure::Usage(
            "--processes measures the all-reduce (the other collectives: bench without it)".into(),
        ));
    }
    crate::require_gpus(1)?;
    let exe = std::env::current_exe()
        .map_err(|e| Failure::Failed(format!("cannot find this executable: {e}")))?;
    let mut program = vec![exe.display().to_string()];
    program.extend(std::env::args().skip(1));
    program.push("--rank-process".into());
    launch::run(&LaunchArgs {
        nproc: processes,
        gpus: None,
        nnodes: 1,
        node_rank: 0,
        master_addr: None,
        master_port: None,
        host_id: None,
        grace: 5,
        program,
    })
}

/// One rank's part (module doc).
fn run_rank(args: &BenchArgs) -> Result<(), Failure> {
    ringreduce::with_element!(args.dtype, T => run_typed::<T>(args))
}

fn run_typed<T: Element>(args: &BenchArgs) -> Result<(), Failure> {
    let env = LaunchEnv::from_env()?;
    let gpus = crate::require_gpus(1)?;
    let shared = gpus < env.local_world;
    let config = CudaConfig {
        allow_shared_device: shared,
        ..cuda_config(args)
    };
    let mut comm = match shared {
        true => RankCommunicator::gpu(&env.unique_id()?, env.rank, env.world, 0, config)?,
        false => RankCommunicator::from_env_gpu(config)?,
    };
    let device = if shared { 0 } else { env.local_rank };
    let (rank, world, op) = (env.rank, env.world, args.op);
    let stream = ringreduce::device::context(device)?
        .new_stream()
        .map_err(|e| Failure::Failed(format!("cannot make a stream: {e}")))?;
    let elem = std::mem::size_of::<T>();
    if rank == 0 {
        out!(
            "# ringreduce all-reduce, {world} processes (one rank each){}",
            if shared {
                format!(
                    ", sharing GPU 0 ({gpus} GPU(s) for {} ranks): the processes' contexts \
                     time-slice the GPU — a correctness run, not a result",
                    env.local_world
                )
            } else {
                String::new()
            }
        );
        out!(
            "# in place on each process's own stream; {} timed calls per size (enqueue to stream \
             synchronised), {} warm-up; {}",
            args.iters,
            args.warmup,
            match args.registered {
                true => "each size's buffer registered: used in place, no copies",
                false => "buffers copied through memory each rank exports (--registered: none)",
            }
        );
        out!(
            "#{:>11} {:>11} {:>5} {:>5} | {:>10} {:>10} {:>10} | {:>8} {:>8} {:>6}  ran",
            "size (B)",
            "count",
            "type",
            "redop",
            "min (us)",
            "med (us)",
            "p99 (us)",
            "algbw",
            "busbw",
            "#wrong"
        );
    }
    let mut total_wrong = 0u64;
    let mut bytes = args.min_bytes.max(elem);
    while bytes <= args.max_bytes {
        let count = (bytes / elem).max(1);
        let input: Vec<T> = (0..count).map(|k| input_value(op, rank, k)).collect();
        let mut buf = GpuBuffer::from_host(device, &input)?;
        let registration = match args.registered {
            // SAFETY: deregistered on every rank at the end of this size, before `buf` is
            // dropped (on an error the command ends, and its communicator with it).
            true => Some(unsafe { comm.register(&buf) }?),
            false => None,
        };
        let mut call = |buf: &mut GpuBuffer<T>| -> Result<(), Failure> {
            // SAFETY: `buf` is untouched until the stream is synchronised just below.
            unsafe { comm.enqueue_all_reduce_in_place_on(buf, op, &stream) }?;
            stream
                .synchronize()
                .map_err(|e| Failure::Failed(format!("stream synchronisation: {e}")))?;
            comm.synchronize()?;
            Ok(())
        };
        call(&mut buf)?;
        let got = buf.to_host()?;
        let wrong = got
            .iter()
            .enumerate()
            .filter(|&(k, v)| *v != expected_value::<T>(op, world, k))
            .count() as u64;
        for _ in 0..args.warmup {
            call(&mut buf)?;
        }
        let mut times = Vec::with_capacity(args.iters);
        for _ in 0..args.iters {
            let start = Instant::now();
            call(&mut buf)?;
            times.push(start.elapsed().as_secs_f64() * 1e6);
        }
        // What the measured calls ran, as the library says the last one did.
        let ran = comm
            .last_ran()
            .map_or_else(|| "-".to_string(), |r| describe_ran(&r));
        // Every rank's count of wrong elements, summed by the communicator itself.
        let mut wrongs = GpuBuffer::from_host(device, &[wrong])?;
        comm.all_reduce_in_place(&mut wrongs, ringreduce::ReduceOp::Sum)?;
        let wrong_all = wrongs.to_host()?[0];
        if let Some(registration) = registration {
            comm.deregister(registration)?;
        }
        total_wrong += wrong_all;
        let (min, median, p99) = percentiles(&mut times);
        let size = count * elem;
        let algbw = algbw_gbps(size, median * 1e-6);
        if rank == 0 {
            out!(
                " {:>11} {:>11} {:>5} {:>5} | {:>10.1} {:>10.1} {:>10.1} | {:>8.2} {:>8.2} {:>6}  {}",
                size,
                count,
                args.dtype.name(),
                format!("{op:?}").to_lowercase(),
                min,
                median,
                p99,
                algbw,
                busbw_gbps(algbw, world),
                wrong_all,
                ran
            );
        }
        bytes = match bytes.checked_mul(args.factor.max(2)) {
            Some(b) => b,
            None => break,
        };
    }
    if total_wrong > 0 {
        return Err(Failure::Failed(format!(
            "{total_wrong} wrong element(s) over every rank"
        )));
    }
    Ok(())
}

/// A call's [`ringreduce::Ran`] in a word or three: its form, then `registered` (ran on the
/// registered buffers in place) or `copied` (through the memory this rank exports).
fn describe_ran(ran: &ringreduce::Ran) -> String {
    let buffers = match (ran.registered, ran.copied) {
        (true, _) => " registered",
        (false, true) => " copied",
        (false, false) => "",
    };
    format!("{:?}{buffers}", ran.form)
}
