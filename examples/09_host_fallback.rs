//! Guide chapter 9, trade-offs: the host path (`docs/guide/09-trade-offs.md`).
//!
//! Where GPUs cannot reach each other, each ring edge is staged through pinned host memory:
//! device→host on the sender, host→device on the receiver, pipelined in chunks. This example runs
//! the staged plan shape on host ranks (always) beside the peer shape, and on GPUs the same ring
//! with `Transport::Staged` forced beside the default, at 64 MiB per GPU, printing each edge.
//!
//! Run: `cargo run --release --example 09_host_fallback`

use ringreduce::plan::EdgeTransport;
use ringreduce::verify::{compare, make_expected, make_input};
use ringreduce::{
    device, Algorithm, Communicator, CudaConfig, GpuBuffer, HostConfig, ReduceOp, Transport,
};
use std::time::Instant;

fn main() -> ringreduce::Result<()> {
    // Host ranks: the staged plan has more streams and events (a Recv stream, host slots), and
    // the checker proves it like any other; the result is the same bits.
    let (world, count) = (4, 1 << 18);
    let want = make_expected::<f32>(ReduceOp::Sum, world, count);
    for transport in [EdgeTransport::Peer, EdgeTransport::Staged] {
        let config = HostConfig {
            algorithm: Algorithm::Ring,
            transport: transport.into(),
            ..HostConfig::default()
        };
        let comm = Communicator::host_with(world, config)?;
        let inputs: Vec<Vec<f32>> = (0..world)
            .map(|r| make_input(ReduceOp::Sum, r, count))
            .collect();
        let mut outputs = vec![vec![0.0f32; count]; world];
        comm.all_reduce(&inputs, &mut outputs, ReduceOp::Sum)?;
        let wrong: usize = outputs
            .iter()
            .enumerate()
            .map(|(r, o)| compare(r, o, &want, 3).0)
            .sum();
        println!("host ring, {world} ranks, {count} f32, {transport:?} edges: {wrong} wrong");
        assert_eq!(wrong, 0);
        comm.close()?;
    }

    let n = match device::device_count() {
        Ok(n) if n >= 2 => n,
        other => {
            println!();
            match other {
                Err(why) => println!("no GPU: {why}"),
                _ => println!("one GPU: a ring edge needs two"),
            }
            println!("On two or more GPUs this example times the ring at 64 MiB per GPU with peer");
            println!(
                "edges and with every edge staged. On the 2×H200 test machine the staged ring"
            );
            println!("reached 45.73 GB/s busbw at 256 MiB against 27.39 for NCCL with");
            println!("NCCL_P2P_DISABLE=1, but took 92–116 µs per call up to 1 MiB where NCCL took");
            println!("19–64 µs (commit 4d46125, 2026-11-29, docs/PERFORMANCE.md).");
            return Ok(());
        }
    };
    let devices: Vec<usize> = (0..n).collect();
    let count = (64 << 20) / 4;
    let want = make_expected::<f32>(ReduceOp::Sum, n, count);
    for transport in [Transport::Auto, Transport::Staged] {
        let config = CudaConfig {
            transport,
            algorithm: Algorithm::Ring,
            ..CudaConfig::default()
        };
        let comm = Communicator::with_config(&devices, config)?;
        println!();
        println!("# transport {transport:?}");
        for edge in comm.edges() {
            println!("{}", edge.describe());
        }
        let inputs = devices
            .iter()
            .enumerate()
            .map(|(r, &d)| GpuBuffer::from_host(d, &make_input::<f32>(ReduceOp::Sum, r, count)))
            .collect::<ringreduce::Result<Vec<_>>>()?;
        let mut outputs = devices
            .iter()
            .map(|&d| GpuBuffer::<f32>::zeroed(d, count))
            .collect::<ringreduce::Result<Vec<_>>>()?;
        comm.all_reduce(&inputs, &mut outputs, ReduceOp::Sum)?;
        let wrong: usize = (0..n)
            .map(|r| outputs[r].to_host().map(|o| compare(r, &o, &want, 3).0))
            .sum::<ringreduce::Result<usize>>()?;
        let start = Instant::now();
        for _ in 0..10 {
            comm.all_reduce(&inputs, &mut outputs, ReduceOp::Sum)?;
        }
        let us = start.elapsed().as_secs_f64() * 1e6 / 10.0;
        let busbw = (count * 4) as f64 / (us * 1e3) * 2.0 * (n - 1) as f64 / n as f64;
        println!("64 MiB f32 sum out of place: {us:.1} µs, busbw {busbw:.1} GB/s, {wrong} wrong");
        comm.close()?;
    }
    Ok(())
}
