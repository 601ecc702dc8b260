//! One process per rank, as every real multi-GPU job runs (torchrun, vLLM, DeepSpeed): each
//! process is one rank, finds the others through the variables its launcher set, and passes its
//! own buffer to each call. Here the ranks are host ranks (the same checked plans, shared memory
//! between the processes); a process that dies is named on the others, never waited for.
//!
//! Launch it with the CLI's launcher (or torchrun, which sets the same variables):
//!
//! ```text
//! cargo build --release --example 12_processes
//! cargo run --release -p ringreduce-cli -- launch -n 3 -- target/release/examples/12_processes
//! ```
//!
//! Started alone, it says how to launch it.

use ringreduce::verify::{expected_value, input_value};
use ringreduce::{Collective, HostConfig, LaunchEnv, RankCommunicator, ReduceOp};

fn main() -> ringreduce::Result<()> {
    if LaunchEnv::from_env().is_err() {
        eprintln!(
            "12_processes is one rank of a job: start it with `ringreduce launch -n 3 -- {}`",
            std::env::args().next().unwrap_or_default()
        );
        std::process::exit(2);
    }
    let mut comm = RankCommunicator::from_env_host(HostConfig::default())?;
    let (rank, world) = (comm.rank(), comm.world());

    // An all-reduce of this rank's gradients, in place: every rank ends with the same sum.
    let count = 1 << 20;
    let mut grads: Vec<f32> = (0..count)
        .map(|i| input_value(ReduceOp::Sum, rank, i))
        .collect();
    let started = std::time::Instant::now();
    comm.all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
    let took = started.elapsed();
    let wrong = (0..count)
        .filter(|&i| grads[i] != expected_value::<f32>(ReduceOp::Sum, world, i))
        .count();

    // An all-gather: every rank's block, on every rank.
    let block: Vec<i32> = (0..4).map(|i| (rank * 10 + i) as i32).collect();
    let mut gathered = vec![0i32; 4 * world];
    comm.collective(
        &Collective::AllGather,
        Some(&block),
        Some(&mut gathered),
        ReduceOp::Sum,
    )?;

    println!(
        "rank {rank} of {world} (pid {}): all-reduce of {count} f32 in {took:?}, {wrong} wrong; \
         all-gather {gathered:?}",
        std::process::id()
    );
    if wrong > 0 {
        std::process::exit(1);
    }
    Ok(())
}
