//! The host executor's groups of the all-reduce bench (benches/allreduce.rs): `host` (a thread
//! per rank, in place, at 2 and 4 ranks) and `host_vs_loop` (host ranks against the all-reduce
//! a user would write with rayon, at 2, 4 and 8 ranks).

use super::{size_label, Reference, ELEM_BYTES, OP};
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use ringreduce::{Communicator, HostConfig};
use std::time::Duration;

const HOST_WORLDS: [usize; 2] = [2, 4];
const HOST_SIZES_BYTES: [usize; 3] = [4 << 10, 256 << 10, 4 << 20];

pub(super) fn bench_host(c: &mut Criterion) {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "# host: ringreduce {} host executor (a thread per rank) on {cpus} CPUs, f32 sum, in \
         place; thrpt = algbw (GB = 1e9 B); busbw = algbw * 2(n-1)/n",
        env!("CARGO_PKG_VERSION")
    );
    let mut group = c.benchmark_group("host");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_millis(1500));
    for world in HOST_WORLDS {
        let comm = Communicator::host_with(world, HostConfig::default())
            .unwrap_or_else(|err| panic!("host communicator of {world} ranks: {err}"));
        for bytes in HOST_SIZES_BYTES {
            let count = bytes / ELEM_BYTES;
            let function = format!("world{world}_in_place");
            let label = size_label(bytes);
            let what = format!("host/{function}/{label}");
            group.throughput(Throughput::BytesDecimal(bytes as u64));
            bench_host_call(
                &mut group,
                BenchmarkId::new(function, label),
                &what,
                &comm,
                count,
            );
        }
        comm.close()
            .unwrap_or_else(|err| panic!("host communicator of {world} ranks: {err}"));
    }
    group.finish();
}

/// Registers `comm`'s in-place all-reduce of `count` f32 per rank as benchmark `id`. The buffers
/// are made and the result checked on the first call, which only happens when the filter
/// selects it; the host executor returns when the collective is complete.
fn bench_host_call(
    group: &mut BenchmarkGroup<'_, WallTime>,
    id: BenchmarkId,
    what: &str,
    comm: &Communicator,
    count: usize,
) {
    let mut bufs: Option<Vec<Vec<f32>>> = None;
    group.bench_function(id, |b| {
        let bufs = bufs.get_or_insert_with(|| {
            let reference = Reference::new(comm.world(), count);
            let mut bufs = reference.inputs.clone();
            comm.all_reduce_in_place(&mut bufs, OP)
                .unwrap_or_else(|err| panic!("{what}: checked call failed: {err}"));
            reference.check(what, &bufs);
            bufs
        });
        b.iter(|| {
            comm.all_reduce_in_place(bufs, OP)
                .unwrap_or_else(|err| panic!("{what}: {err}"))
        });
    });
}

// ---------------------------------------------------------------------------------------------
// Host ranks against a rayon loop.
// ---------------------------------------------------------------------------------------------

const LOOP_WORLDS: [usize; 3] = [2, 4, 8];
const LOOP_SIZES_BYTES: [usize; 3] = [1 << 20, 4 << 20, 64 << 20];
/// Elements the loop sums at a time per rayon task.
const LOOP_BLOCK: usize = 16 * 1024;

/// The all-reduce a user would write without a library: every block of 16 Ki elements summed
/// across every rank's buffer into an accumulator, then copied back into every buffer, the
/// blocks spread over rayon's pool.
fn rayon_loop(bufs: &mut [Vec<f32>]) {
    use rayon::prelude::*;
    let count = bufs.first().map_or(0, Vec::len);
    let mut blocks: Vec<Vec<&mut [f32]>> = (0..count.div_ceil(LOOP_BLOCK))
        .map(|_| Vec::with_capacity(bufs.len()))
        .collect();
    for buf in bufs.iter_mut() {
        for (block, chunk) in blocks.iter_mut().zip(buf.chunks_mut(LOOP_BLOCK)) {
            block.push(chunk);
        }
    }
    blocks.into_par_iter().for_each(|mut block| {
        let Some((first, rest)) = block.split_first_mut() else {
            return;
        };
        let mut acc = first.to_vec();
        for chunk in rest.iter() {
            for (a, x) in acc.iter_mut().zip(chunk.iter()) {
                *a += *x;
            }
        }
        for chunk in block.iter_mut() {
            chunk.copy_from_slice(&acc);
        }
    });
}

pub(super) fn bench_host_vs_loop(c: &mut Criterion) {
    use ringreduce::Algorithm;
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "# host_vs_loop: ringreduce {} host ranks against a rayon loop on {cpus} CPUs, f32 sum, \
         in place; compare the times (ratio = loop / ringreduce)",
        env!("CARGO_PKG_VERSION")
    );
    let mut group = c.benchmark_group("host_vs_loop");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1000));
    let algorithms = [
        ("ring", Algorithm::Ring),
        ("one_shot", Algorithm::OneShot),
        ("two_shot", Algorithm::TwoShot),
    ];
    for world in LOOP_WORLDS {
        let comms: Vec<(&str, Communicator)> = algorithms
            .iter()
            .map(|&(name, algorithm)| {
                let config = HostConfig {
                    algorithm,
                    ..HostConfig::default()
                };
                let comm = Communicator::host_with(world, config)
                    .unwrap_or_else(|err| panic!("host communicator of {world} ranks: {err}"));
                (name, comm)
            })
            .collect();
        for bytes in LOOP_SIZES_BYTES {
            let count = bytes / ELEM_BYTES;
            let label = size_label(bytes);
            group.throughput(Throughput::BytesDecimal(bytes as u64));
            let mut bufs: Option<Vec<Vec<f32>>> = None;
            group.bench_function(
                BenchmarkId::new(format!("world{world}_loop"), &label),
                |b| {
                    let bufs = bufs.get_or_insert_with(|| {
                        let reference = Reference::new(world, count);
                        let mut bufs = reference.inputs.clone();
                        rayon_loop(&mut bufs);
                        reference.check(&format!("host_vs_loop/world{world}_loop/{label}"), &bufs);
                        bufs
                    });
                    b.iter(|| rayon_loop(bufs));
                },
            );
            for (name, comm) in &comms {
                let what = format!("host_vs_loop/world{world}_{name}/{label}");
                let id = BenchmarkId::new(format!("world{world}_{name}"), &label);
                bench_host_call(&mut group, id, &what, comm, count);
            }
        }
        for (_, comm) in comms {
            comm.close()
                .unwrap_or_else(|err| panic!("host communicator of {world} ranks: {err}"));
        }
    }
    group.finish();
}
