//! Guide chapter 6, the one-shot and the two-shot (`docs/guide/06-one-and-two-shot.md`).
//!
//! Prints the rule by which `Algorithm::Auto` picks the ring, the one-shot or the two-shot for a
//! message size, placement and world; runs all three on host ranks (the same plans, barriers on
//! threads) and checks them; and, on two or more GPUs with peer access, times each algorithm in
//! place at 1, 8 and 32 MiB per GPU.
//!
//! Run: `cargo run --release --example 06_one_and_two_shot`

use ringreduce::exec::algorithm::{select, Ask, Reach};
use ringreduce::plan::Collective;
use ringreduce::verify::{compare, make_expected, make_input};
use ringreduce::{device, Algorithm, Communicator, CudaConfig, GpuBuffer, HostConfig, ReduceOp};
use std::time::Instant;

const MIB: usize = 1 << 20;

fn main() -> ringreduce::Result<()> {
    println!("# what Algorithm::Auto runs (bytes per rank; peer access between every pair)");
    println!(
        "{:>8}  {:<24} {:<24}",
        "size", "2 ranks: out / in place", "4 ranks: out / in place"
    );
    let all_reduce = Collective::AllReduce;
    let pick = |bytes, world, in_place, reach| {
        let ask = Ask {
            chosen: Algorithm::Auto,
            collective: &all_reduce,
            count_bytes: bytes,
            world,
            in_place,
            reach,
            deterministic: false,
            ll_grid: None,
            gated: false,
        };
        select(&ask).algorithm
    };
    for mib in [1, 4, 8, 16, 32, 64] {
        let cell = |world| {
            let (out, inp) = (false, true);
            let at = |p| pick(mib * MIB, world, p, Reach::Peers);
            format!("{:?} / {:?}", at(out), at(inp))
        };
        println!("{:>5} MiB  {:<24} {:<24}", mib, cell(2), cell(4));
    }
    // Without peer access between every pair (2 to 8 GPUs), the staged forms.
    let staged = |bytes| pick(bytes, 2, false, Reach::Staged);
    println!(
        "without peer access, 2 ranks: {:?} at 64 KiB (its staged form), {:?} at 1 MiB",
        staged(64 << 10),
        staged(MIB)
    );

    // The host executor runs the same three plans; the one- and two-shot's barriers are on threads.
    let (world, count) = (4, 100_003); // an odd count: uneven segments, a tail
    let want = make_expected::<f32>(ReduceOp::Sum, world, count);
    println!();
    for algorithm in [Algorithm::Ring, Algorithm::OneShot, Algorithm::TwoShot] {
        let comm = Communicator::host_with(
            world,
            HostConfig {
                algorithm,
                ..HostConfig::default()
            },
        )?;
        let mut bufs: Vec<Vec<f32>> = (0..world)
            .map(|r| make_input(ReduceOp::Sum, r, count))
            .collect();
        comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum)?;
        let wrong: usize = bufs
            .iter()
            .enumerate()
            .map(|(r, b)| compare(r, b, &want, 3).0)
            .sum();
        println!("host, {world} ranks, {count} f32 in place, {algorithm:?}: {wrong} wrong");
        assert_eq!(wrong, 0);
        comm.close()?;
    }

    let n = device::device_count().unwrap_or(0);
    let peers = n >= 2 && device::peer_matrix(n)?.iter().flatten().all(|&ok| ok);
    if !peers {
        println!();
        match device::driver_available() {
            Err(why) => println!("no GPU: {why}"),
            Ok(()) => println!("{n} GPU(s) without peer access between every pair: the one- and two-shot cannot run"),
        }
        println!("On two GPUs with peer access this example times the three algorithms in place.");
        println!("On the 2×H200 test machine (commit 3f26871, 2026-11-30, docs/PERFORMANCE.md),");
        println!("in place, µs: 8 MiB one-shot 42.66, two-shot 36.78; 32 MiB one-shot 140.88,");
        println!("two-shot 117.03; 64 MiB ring (16 MiB chunks) 200.51, two-shot 216.37.");
        return Ok(());
    }
    let devices: Vec<usize> = (0..n).collect();
    println!();
    println!("# {n} GPUs, f32 sum in place, µs per call (host wall clock over 20 calls)");
    for algorithm in [Algorithm::Ring, Algorithm::OneShot, Algorithm::TwoShot] {
        let config = CudaConfig {
            algorithm,
            ..CudaConfig::default()
        };
        let comm = Communicator::with_config(&devices, config)?;
        let mut line = format!("{:<8}", format!("{algorithm:?}"));
        for bytes in [MIB, 8 * MIB, 32 * MIB] {
            let count = bytes / 4;
            let mut bufs = devices
                .iter()
                .enumerate()
                .map(|(r, &d)| GpuBuffer::from_host(d, &make_input::<f32>(ReduceOp::Sum, r, count)))
                .collect::<ringreduce::Result<Vec<_>>>()?;
            comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum)?; // checked call
            let want = make_expected::<f32>(ReduceOp::Sum, n, count);
            let mut wrong = 0;
            for (r, buf) in bufs.iter().enumerate() {
                wrong += compare(r, &buf.to_host()?, &want, 3).0;
            }
            let start = Instant::now();
            for _ in 0..20 {
                // Repeated sums change the values; only the first call is checked.
                comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum)?;
            }
            let us = start.elapsed().as_secs_f64() * 1e6 / 20.0;
            line += &format!("  {:>2} MiB {us:8.1} ({wrong} wrong)", bytes / MIB);
        }
        println!("{line}");
        comm.close()?;
    }
    Ok(())
}
