//! Criterion groups for every collective beside the all-reduce, one group per collective
//! (`gpu_all_gather`, `gpu_reduce_scatter`, `gpu_broadcast`, `gpu_reduce`, `gpu_alltoall`,
//! `gpu_sendrecv`), f32 sum, out of place, on GPUs 0 and 1: ringreduce's
//! `Communicator::enqueue_collective` (`ringreduce_*`) beside NCCL's calls through
//! `NcclAllReduce::enqueue_collective` (`nccl_*`: `ncclAllGather`, `ncclReduceScatter`,
//! `ncclBroadcast`, `ncclReduce` root 0, grouped `ncclSend`/`ncclRecv` per peer, and the ring
//! exchange r → r+1).
//!
//! Sizes and throughput follow nccl-tests: the parameter is S (all_gather and reduce_scatter:
//! the total array; alltoall: each rank's whole buffer; the others: bytes per rank) and
//! criterion's `thrpt` is algbw = S / time; busbw = algbw · (n−1)/n for all_gather,
//! reduce_scatter and alltoall, algbw for the others (docs/BENCH.md). Timing as the all-reduce
//! groups: `iters` enqueues back to back, one wait. Before timing, one call per library is
//! checked element by element against a host reference built from the inputs by the
//! collective's definition; a wrong element panics. Without 2 GPUs nothing registers (the `gpu`
//! group's waiver line says why); without NCCL, ringreduce's alone.

use super::{size_label, time_back_to_back, ELEM_BYTES, GPU_DEVICES, OP};
use criterion::{BenchmarkId, Criterion, Throughput};
use ringreduce::verify::{compare, make_expected, make_input};
use ringreduce::{Collective, Communicator, GpuBuffer, GpuViewMut, Transfer};
use ringreduce_cli::baseline::NcclAllReduce;

const SIZES_BYTES: [usize; 2] = [64 << 10, 16 << 20];

/// (group name, whether S is split into world blocks, the collective for `count`).
fn collectives(world: usize, count: usize) -> Vec<(&'static str, bool, Collective)> {
    let ring = (0..world)
        .map(|r| Transfer {
            from: r,
            to: (r + 1) % world,
            count,
        })
        .collect();
    vec![
        ("gpu_all_gather", true, Collective::AllGather),
        ("gpu_reduce_scatter", true, Collective::ReduceScatter),
        ("gpu_broadcast", false, Collective::Broadcast { root: 0 }),
        ("gpu_reduce", false, Collective::Reduce { root: 0 }),
        ("gpu_alltoall", true, Collective::AllToAll),
        (
            "gpu_sendrecv",
            false,
            Collective::SendRecv { transfers: ring },
        ),
    ]
}

/// Every rank's expected output (`None`: not checked), from the inputs by definition.
fn expected(c: &Collective, world: usize, count: usize) -> Vec<Option<Vec<f32>>> {
    let input = |rank, len| make_input::<f32>(OP, rank, len);
    (0..world)
        .map(|r| match c {
            Collective::AllGather => Some((0..world).flat_map(|j| input(j, count)).collect()),
            Collective::ReduceScatter => {
                Some(make_expected::<f32>(OP, world, world * count)[r * count..][..count].to_vec())
            }
            Collective::Broadcast { root } => Some(input(*root, count)),
            Collective::Reduce { root } => (r == *root).then(|| make_expected(OP, world, count)),
            Collective::AllToAll => Some(
                (0..world)
                    .flat_map(|j| input(j, world * count)[r * count..][..count].to_vec())
                    .collect(),
            ),
            Collective::SendRecv { .. } => Some(input((r + world - 1) % world, count)),
            Collective::AllReduce => Some(make_expected(OP, world, count)),
        })
        .collect()
}

/// Slices of the buffers of `ranks`, in that order.
fn pick<'b>(
    bufs: &'b mut [GpuBuffer<f32>],
    len: usize,
    ranks: &[usize],
) -> ringreduce::Result<Vec<GpuViewMut<'b, f32>>> {
    let mut slots: Vec<Option<&mut GpuBuffer<f32>>> = bufs.iter_mut().map(Some).collect();
    ranks
        .iter()
        .filter_map(|&r| slots.get_mut(r)?.take())
        .map(|b| b.view_mut(0, len))
        .collect()
}

/// One group per collective; `nccl` beside ringreduce where it loaded.
pub fn bench_collectives(c: &mut Criterion, comm: &Communicator, nccl: Option<&NcclAllReduce>) {
    let world = GPU_DEVICES.len();
    for k in 0..collectives(world, 1).len() {
        let (name, split, _) = collectives(world, 1).swap_remove(k);
        let mut group = c.benchmark_group(name);
        group.sample_size(10);
        for size in SIZES_BYTES {
            let count = size / ELEM_BYTES / if split { world } else { 1 };
            let collective = collectives(world, count).swap_remove(k).2;
            group.throughput(Throughput::BytesDecimal(size as u64));
            let in_len = (0..world)
                .filter_map(|r| collective.input_len(r, world, count))
                .max()
                .unwrap_or(count);
            let out_len = (0..world)
                .filter_map(|r| collective.output_len(r, world, count))
                .max()
                .unwrap_or(count);
            let alloc = |len| -> Vec<GpuBuffer<f32>> {
                GPU_DEVICES
                    .iter()
                    .map(|&d| GpuBuffer::zeroed(d, len).unwrap_or_else(|e| panic!("{name}: {e}")))
                    .collect()
            };
            let mut ins = alloc(in_len);
            for (rank, b) in ins.iter_mut().enumerate() {
                b.copy_from_host(&make_input(OP, rank, in_len))
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
            }
            let want = expected(&collective, world, count);
            for lib in ["ringreduce", "nccl"] {
                if lib == "nccl" && nccl.is_none() {
                    continue;
                }
                let mut outs = alloc(out_len);
                let what = format!("{name}/{lib}/{}", size_label(size));
                let mut run = |outs: &mut Vec<GpuBuffer<f32>>| -> Result<(), ringreduce::Error> {
                    let mut i = pick(&mut ins, in_len, &collective.input_ranks(world))?;
                    let mut o = pick(outs, out_len, &collective.output_ranks(world))?;
                    let i = &mut i[..];
                    // SAFETY: `ins` and `outs` outlive every call; each caller waits for
                    // completion (synchronize) before reading or dropping them.
                    unsafe {
                        match (lib, nccl) {
                            ("nccl", Some(n)) => {
                                n.enqueue_collective(&collective, Some(&*i), &mut o, OP, None)
                            }
                            _ => Ok(comm.enqueue_collective(
                                &collective,
                                Some(&*i),
                                &mut o,
                                OP,
                                None,
                            )?),
                        }
                    }
                };
                let sync = || match (lib, nccl) {
                    ("nccl", Some(n)) => n.synchronize(),
                    _ => comm.synchronize(),
                };
                let checked = run(&mut outs).and_then(|()| sync());
                checked.unwrap_or_else(|e| panic!("{what}: checked call failed: {e}"));
                for (rank, w) in want.iter().enumerate() {
                    let Some(w) = w else { continue };
                    let got = outs[rank]
                        .to_host()
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let (wrong, first) = compare(rank, &got, w, 4);
                    assert_eq!(wrong, 0, "{what}: WRONG RESULT on rank {rank}: {first:?}");
                }
                println!("{what}: checked {world} ranks, #wrong 0");
                group.bench_function(BenchmarkId::new(lib, size_label(size)), |b| {
                    b.iter_custom(|iters| time_back_to_back(&what, iters, || run(&mut outs), sync))
                });
            }
        }
        group.finish();
    }
}
