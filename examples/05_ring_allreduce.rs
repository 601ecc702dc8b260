//! Guide chapter 5, the ring all-reduce (`docs/guide/05-ring-allreduce.md`).
//!
//! Runs the ring on host ranks (always: one thread per rank, the same checked plans the GPUs run)
//! and, where there are GPUs, on every GPU with `Algorithm::Ring` forced: each ring edge and why,
//! then 64 MiB per GPU, every element checked, timed, with bus bandwidth as nccl-tests reports it.
//!
//! Run: `cargo run --release --example 05_ring_allreduce`

use ringreduce::verify::{compare, make_expected, make_input};
use ringreduce::{device, Algorithm, Communicator, CudaConfig, GpuBuffer, HostConfig, ReduceOp};
use std::time::Instant;

fn main() -> ringreduce::Result<()> {
    // The one-call form: a sum in place over one buffer per rank; host Vecs run on host threads.
    let mut bufs = vec![
        vec![1.0f32, 2.0, 3.0],
        vec![10.0, 20.0, 30.0],
        vec![100.0, 200.0, 300.0],
    ];
    ringreduce::ring_allreduce(&mut bufs)?;
    println!(
        "ring_allreduce on 3 host ranks: {:?} on every rank",
        bufs[0]
    );
    assert!(bufs.iter().all(|b| b == &[111.0, 222.0, 333.0]));

    // A communicator is built once and reused; inputs depend on rank and index (all-ones would
    // hide a segment delivered to the wrong place) and are exact, so the check is bitwise.
    let world = 4;
    let count = 1 << 20;
    let ring = HostConfig {
        algorithm: Algorithm::Ring,
        ..HostConfig::default()
    };
    let comm = Communicator::host_with(world, ring)?;
    let inputs: Vec<Vec<f32>> = (0..world)
        .map(|r| make_input(ReduceOp::Sum, r, count))
        .collect();
    let mut outputs = vec![vec![0.0f32; count]; world];
    let start = Instant::now();
    comm.all_reduce(&inputs, &mut outputs, ReduceOp::Sum)?;
    let secs = start.elapsed().as_secs_f64();
    let want = make_expected::<f32>(ReduceOp::Sum, world, count);
    let wrong: usize = outputs
        .iter()
        .enumerate()
        .map(|(r, o)| compare(r, o, &want, 3).0)
        .sum();
    println!(
        "host ring, {world} ranks × {} MiB f32: {wrong} wrong, {:.1} ms (host threads: a reference, not a benchmark)",
        (count * 4) >> 20,
        secs * 1e3
    );
    assert_eq!(wrong, 0);
    comm.close()?;

    let n = match device::device_count() {
        Ok(n) => n,
        Err(why) => {
            println!();
            println!("no GPU: {why}");
            println!("On GPUs this example runs the copy-engine ring over every GPU at 64 MiB per");
            println!("GPU. On the 2×H200 test machine the ring took 207.94 µs out of place at");
            println!(
                "64 MiB (`ringreduce bench`, commit b622f79, 2026-11-30, docs/PERFORMANCE.md),"
            );
            println!("against NCCL's 256.71 µs.");
            return Ok(());
        }
    };
    let devices: Vec<usize> = (0..n).collect();
    let config = CudaConfig {
        algorithm: Algorithm::Ring,
        ..CudaConfig::default()
    };
    let comm = Communicator::with_config(&devices, config)?;
    println!();
    for edge in comm.edges() {
        println!("{}", edge.describe());
    }
    let count = (64 << 20) / 4;
    let inputs = devices
        .iter()
        .enumerate()
        .map(|(r, &d)| GpuBuffer::from_host(d, &make_input::<f32>(ReduceOp::Sum, r, count)))
        .collect::<ringreduce::Result<Vec<_>>>()?;
    let mut outputs = devices
        .iter()
        .map(|&d| GpuBuffer::<f32>::zeroed(d, count))
        .collect::<ringreduce::Result<Vec<_>>>()?;
    comm.all_reduce(&inputs, &mut outputs, ReduceOp::Sum)?; // checked call, and warm-up
    let want = make_expected::<f32>(ReduceOp::Sum, n, count);
    let mut wrong = 0;
    for (r, out) in outputs.iter().enumerate() {
        wrong += compare(r, &out.to_host()?, &want, 3).0;
    }
    let iters = 20;
    let start = Instant::now();
    for _ in 0..iters {
        comm.all_reduce(&inputs, &mut outputs, ReduceOp::Sum)?;
    }
    let us = start.elapsed().as_secs_f64() * 1e6 / iters as f64;
    let algbw = (count * 4) as f64 / (us * 1e3);
    let busbw = algbw * 2.0 * (n - 1) as f64 / n as f64;
    println!("ring on {n} GPU(s), 64 MiB f32 sum out of place: {us:.1} µs, busbw {busbw:.1} GB/s, {wrong} wrong");
    comm.close()
}
