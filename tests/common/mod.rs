//! Helpers shared by integration tests (each test file that needs them says `mod common;`).
// Each test file is its own crate and uses only some of these.
#![allow(dead_code)]

use std::time::{Duration, Instant};

pub mod launch;
pub mod ranks;
pub mod waiver;

/// Threads of this process named `ringreduce-*` (rank threads and stream workers); the kernel
/// keeps the first 15 bytes of a name, enough for the prefix.
pub fn ringreduce_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("ringreduce"))
        .count()
}

/// Waits up to ten seconds for every `ringreduce-*` thread to be gone (a joined thread leaves the
/// kernel's list a moment after `join` returns); returns how many are left.
pub fn settle_threads() -> usize {
    let start = Instant::now();
    while ringreduce_threads() > 0 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    ringreduce_threads()
}

/// What the in-process host executor gives every rank of `world` for `collective` of `count`
/// f32 (out of place, inputs from [`ringreduce::verify::input_value`] by rank and index), by
/// rank (`None` where a rank gets no output): the reference every test of ranks in processes
/// compares with.
pub fn host_reference(
    collective: &ringreduce::plan::Collective,
    world: usize,
    count: usize,
    op: ringreduce::ReduceOp,
    config: ringreduce::HostConfig,
) -> Vec<Option<Vec<f32>>> {
    use ringreduce::verify::input_value;
    let comm = ringreduce::Communicator::host_with(world, config).unwrap();
    let ins: Vec<Vec<f32>> = collective
        .input_ranks(world)
        .iter()
        .map(|&r| {
            let len = collective.input_len(r, world, count).unwrap();
            (0..len).map(|k| input_value(op, r, k)).collect()
        })
        .collect();
    let mut outs: Vec<Vec<f32>> = collective
        .output_ranks(world)
        .iter()
        .map(|&r| vec![-7.0; collective.output_len(r, world, count).unwrap()])
        .collect();
    comm.collective(collective, Some(&ins), &mut outs, op)
        .unwrap();
    let mut by_rank = vec![None; world];
    for (out, &r) in outs.into_iter().zip(&collective.output_ranks(world)) {
        by_rank[r] = Some(out);
    }
    by_rank
}

/// The send/recv of a 2×2 job's tests: a pipeline's exchange (each rank to the next: across
/// two hosts at 1 → 2 and 3 → 0), a transfer within a host (2 → 3) and one to itself (1 → 1).
pub fn pipeline_transfers(world: usize) -> Vec<ringreduce::Transfer> {
    use ringreduce::Transfer;
    let mut transfers: Vec<Transfer> = (0..world)
        .map(|r| Transfer {
            from: r,
            to: (r + 1) % world,
            count: 100 + r,
        })
        .collect();
    transfers.push(Transfer {
        from: 2,
        to: 3,
        count: 7,
    });
    transfers.push(Transfer {
        from: 1,
        to: 1,
        count: 5,
    });
    transfers
}

/// What transfer `i` carries: values that name the transfer and the element.
pub fn transfer_data(i: usize, t: &ringreduce::Transfer) -> Vec<f32> {
    (0..t.count).map(|k| (1000 * i + k) as f32).collect()
}

/// Rank `rank`'s ends of `transfers`: the data it sends (one per transfer from it, in order) and
/// the data it must receive (one per transfer to it), by [`transfer_data`].
pub fn transfer_ends(
    transfers: &[ringreduce::Transfer],
    rank: usize,
) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let of = |end: fn(&ringreduce::Transfer) -> usize| -> Vec<Vec<f32>> {
        transfers
            .iter()
            .enumerate()
            .filter(|(_, t)| end(t) == rank)
            .map(|(i, t)| transfer_data(i, t))
            .collect()
    };
    (of(|t| t.from), of(|t| t.to))
}

/// The rank a lost or failed peer's error names — directly, or through the level of a job on
/// several hosts where it was met; `None` for any other error.
pub fn failed_rank(err: &ringreduce::Error) -> Option<usize> {
    use ringreduce::Error;
    match err {
        Error::RankFailed { rank, .. } => Some(*rank),
        Error::Level { source, .. } => failed_rank(source),
        _ => None,
    }
}

/// SplitMix64: a small deterministic generator for seeded tests.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }

    /// One of `items`, uniformly.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.range(0, items.len() - 1)]
    }
}

/// A fault of `kind` on rank 0's first copy of the ring plan a host communicator of `world`
/// ranks with `Algorithm::Ring` and the default chunking runs for `count` elements in place
/// (faults hit data operations only).
pub fn fault_at_first_copy(
    world: usize,
    count: usize,
    kind: ringreduce::FaultKind,
) -> ringreduce::Fault {
    use ringreduce::plan::{EdgeTransport, Op, RingSpec};
    let config = ringreduce::HostConfig::default();
    let plan = RingSpec::new(
        world,
        count,
        config.chunk_elems,
        config.slots,
        EdgeTransport::Peer,
    )
    .build()
    .unwrap();
    let instr = plan.ranks[0]
        .iter()
        .position(|i| matches!(i.op, Op::Copy { .. }))
        .unwrap();
    ringreduce::Fault {
        rank: 0,
        instr,
        kind,
    }
}

/// The GPUs this machine has: 0 without a usable driver.
pub fn gpu_count() -> usize {
    ringreduce::device_count().unwrap_or(0)
}

/// The number of GPUs where the machine has at least `needs`; else `None` after the waiver
/// ([`waiver::lacks_gpus`]: `waived: needs ≥ N GPUs (found M): <property>`, or a failure where
/// `RINGREDUCE_REQUIRE_GPUS` promised them). `property` is what the test checks that needs them.
pub fn gpus(needs: usize, property: &str) -> Option<usize> {
    let found = gpu_count();
    (!waiver::lacks_gpus(needs, found, property)).then_some(found)
}

/// Two distinct GPUs for `property` (something ranks sharing one GPU cannot show), or `None`
/// after the waiver ([`gpus`]).
pub fn two_gpus(property: &str) -> Option<[usize; 2]> {
    gpus(2, property).map(|_| [0, 1])
}

/// The line a test prints that ran with ranks sharing GPU 0 where it would have two GPUs (the GPU
/// scripts count such a test as shared, not passed: `scripts/gpu-counts.sh`).
pub const SHARED_NOTE: &str =
    "note: one GPU: the ranks share GPU 0; copies between GPUs are not exercised";

/// Two distinct GPUs where there are, or — on a one-GPU machine — two ranks sharing GPU 0 (every
/// stream, event, kernel and copy path runs, the peer kernels side by side on the one GPU, but
/// nothing crosses between GPUs; the test says so). `None`, after the waiver, without a GPU.
/// Where `RINGREDUCE_REQUIRE_GPUS` promised two GPUs, one is a failure: the copies between GPUs
/// would go untested. Communicators over `[0, 0]` need `allow_shared_device`.
pub fn two_gpus_or_shared() -> Option<[usize; 2]> {
    let found = gpus(
        1,
        "two ranks on GPUs (sharing GPU 0 where it is the only one)",
    )?;
    if found >= 2 {
        return Some([0, 1]);
    }
    waiver::fail_if_promised(2, found, "copies between two GPUs");
    println!("{SHARED_NOTE}");
    Some([0, 0])
}

/// Three ranks sharing GPU 0 (a world of 3 through the GPU executor on any GPU machine), or
/// `None` after the waiver without a GPU. Communicators over it need `allow_shared_device`.
pub fn three_ranks_on_one_gpu() -> Option<[usize; 3]> {
    gpus(1, "three ranks sharing one GPU").map(|_| [0, 0, 0])
}

/// A new cudarc stream on each GPU, in the order given.
pub fn new_streams(gpus: &[usize]) -> Vec<std::sync::Arc<cudarc::driver::CudaStream>> {
    gpus.iter()
        .map(|&g| {
            ringreduce::device::context(g)
                .unwrap()
                .new_stream()
                .unwrap()
        })
        .collect()
}

/// Every algorithm of the all-reduce (ring, one-shot, two-shot), Sum and Max on 10 007 f32, on
/// ranks on `gpus` (`allow_shared_device` where they share one), each result checked exactly:
/// for the tests that load the kernels from one source or another.
pub fn all_reduce_every_algorithm_exactly(gpus: &[usize]) {
    use ringreduce::verify::{expected_value, input_value};
    use ringreduce::{Algorithm, Communicator, CudaConfig, GpuBuffer, ReduceOp};
    for algorithm in [Algorithm::Ring, Algorithm::OneShot, Algorithm::TwoShot] {
        let config = CudaConfig {
            algorithm,
            allow_shared_device: gpus
                .iter()
                .any(|g| gpus.iter().filter(|h| *h == g).count() > 1),
            ..CudaConfig::default()
        };
        let started = std::time::Instant::now();
        let comm = Communicator::with_config(gpus, config).unwrap();
        println!(
            "{algorithm:?}: communicator made in {:?}",
            started.elapsed()
        );
        let count = 10_007;
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            let mut bufs: Vec<GpuBuffer<f32>> = gpus
                .iter()
                .enumerate()
                .map(|(rank, &g)| {
                    let v: Vec<f32> = (0..count).map(|k| input_value(op, rank, k)).collect();
                    GpuBuffer::from_host(g, &v).unwrap()
                })
                .collect();
            comm.all_reduce_in_place(&mut bufs, op).unwrap();
            let want: Vec<f32> = (0..count)
                .map(|k| expected_value(op, gpus.len(), k))
                .collect();
            for b in &bufs {
                assert_eq!(b.to_host().unwrap(), want, "{algorithm:?} {op:?}");
            }
        }
        comm.close().unwrap();
    }
}
