//! Criterion benchmarks of ringreduce's all-reduce, and of NCCL's on the same GPUs beside it.
//!
//! The all-reduce groups, f32 sum throughout (the host executor's two in `allreduce/host.rs`; a
//! group per other collective, `gpu_all_gather` … `gpu_sendrecv`, in `allreduce/collectives.rs`,
//! on the same GPUs and with the same waivers):
//!
//! - **`host`**: the host executor (one thread per rank), in place, 2 and 4 ranks, 4 KiB to 4 MiB.
//!   It runs everywhere; on a 2-core machine the whole group takes well under a minute.
//! - **`host_vs_loop`**: host ranks against the loop a user would write instead (`rayon_loop`:
//!   blocks of 16 Ki elements, each summed across every rank's buffer into a block-sized
//!   accumulator and copied back into every buffer), in place, 2, 4 and 8 ranks, 1, 4 and 64
//!   MiB: `loop`, `ring`, `one_shot`, `two_shot` (the pushed two-shot: `plan::twoshot`). About
//!   two minutes on a 2-core machine.
//! - **`plan`**: what a message size never seen before costs a ring call before anything is
//!   enqueued, 2, 4 and 8 ranks, 64 MiB and 1 GiB, the GPU's automatic chunk: building the
//!   copy-engine ring's plan and proving it with the four checks (`ring_build_check_*`), and
//!   building it and proving it by the cell lemma against its coarse form proven before, what the
//!   executors do (`ring_build_coarse_*`: `check::coarsen` and a comparison). Runs everywhere, no
//!   GPU.
//! - **`gpu`**: GPUs 0 and 1, 4 KiB to 256 MiB, out of place and in place: ringreduce's
//!   copy-engine ring (`ringreduce_*`) and, where libnccl loads, NCCL (`nccl_*`),
//!   so each size shows both side by side. Needs ≥ 2 GPUs; otherwise it prints
//!   `waived: gpu benches need ≥ 2 GPUs` and registers nothing. Without NCCL it prints a
//!   `waived: nccl benches …` line and runs ringreduce's alone.
//!
//! # How a GPU iteration is timed
//!
//! As in nccl-tests and `ringreduce run`: criterion asks for `iters` iterations; we enqueue `iters`
//! collectives back to back (ringreduce's `enqueue_all_reduce*`; NCCL's grouped `ncclAllReduce`
//! per GPU), then wait for all of them (`Communicator::synchronize`; every NCCL stream), and return
//! the host wall clock from the first enqueue to the end of the wait. Criterion divides by `iters`:
//! the time per iteration includes completion. Buffers are allocated once per size, outside the
//! timing; criterion's warm-up runs first for every size.
//!
//! # Reading the numbers (the nccl-tests columns)
//!
//! Criterion's `thrpt` is **algbw** = size of one rank's buffer / time per iteration, in decimal
//! GB/s (10⁹ B). **busbw** = algbw · 2(n−1)/n, the bandwidth each link of a ring must carry:
//! equal to algbw for 2 ranks, 1.5 × algbw for 4. The `#wrong` column is the check below.
//!
//! # Correctness
//!
//! Before anything of a size is timed, one collective of exactly the kind being timed runs on
//! rank- and index-dependent inputs ([`ringreduce::verify`]), and every element of every rank is
//! compared with the host reference; a wrong element panics with the first mismatches (a benchmark
//! of a wrong collective is worthless). In-place iterations afterwards keep summing into the same
//! buffers; the values grow (to ±inf in the end) but the work per iteration does not change.
//!
//! # Running
//!
//! - `cargo bench --bench allreduce`; one group: `cargo bench --bench allreduce -- gpu/`.
//! - `cargo bench --bench allreduce -- --test` (and `cargo test --benches`) runs every benchmark
//!   once, checks included: a quick smoke test, also on a GPU host.
//! - On a GPU host without Rust: `scripts/stage.sh` stages this as `.gpu/bin/bench-allreduce`;
//!   run it there with `--bench` (without it, criterion runs its test mode).
//!
//! # NCCL
//!
//! Through [`ringreduce_cli::baseline::NcclAllReduce`], the same NCCL driver `ringreduce bench` uses
//! (`ncclCommInitAll`, one grouped `ncclAllReduce` per GPU, our own streams and `GpuBuffer`s).
//! Loaded at run time as the library finds NCCL: `RINGREDUCE_NCCL_PATH` (the file), else a
//! `libnccl.so.2` on `LD_LIBRARY_PATH` or in the system folders; without one the waiver line says
//! how to name it (docs/BENCH.md). `NCCL_NVLS_ENABLE` is set to 0 when unset (NVLink multicast
//! must stay off on the shared test machines, and NCCL's anchor figures were measured so); set it
//! yourself to override.

#[path = "allreduce/collectives.rs"]
mod collectives;
#[path = "allreduce/host.rs"]
mod host;

use criterion::{BenchmarkId, Criterion, Throughput};
use ringreduce::device;
use ringreduce::exec::cuda as kernels;
use ringreduce::verify::{compare, make_expected, make_input};
use ringreduce::{Communicator, GpuBuffer, ReduceOp, Result};
use ringreduce_cli::baseline::NcclAllReduce;
use std::cell::OnceCell;
use std::time::{Duration, Instant};

const OP: ReduceOp = ReduceOp::Sum;
const ELEM_BYTES: usize = std::mem::size_of::<f32>();

const GPU_DEVICES: [usize; 2] = [0, 1];
const GPU_SIZES_BYTES: [usize; 5] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20];

fn main() {
    // Before any thread exists (set_var races with getenv on other threads) and before NCCL reads
    // its environment, which it does once at communicator creation.
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        std::env::set_var("NCCL_NVLS_ENABLE", "0");
    }
    let mut criterion = Criterion::default().configure_from_args();
    host::bench_host(&mut criterion);
    host::bench_host_vs_loop(&mut criterion);
    bench_plan(&mut criterion);
    bench_first_call(&mut criterion);
    bench_gpu(&mut criterion);
    criterion.final_summary();
}

// ---------------------------------------------------------------------------------------------
// Planning a new size.
// ---------------------------------------------------------------------------------------------

fn bench_plan(c: &mut Criterion) {
    use ringreduce::plan::{EdgeTransport, RingSpec};
    let mut group = c.benchmark_group("plan");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1000));
    for world in [2, 4, 8] {
        for bytes in [64 << 20, 1 << 30] {
            // An odd count, as a new size mostly is: segments and chunks of unequal lengths.
            let count = bytes / ELEM_BYTES + 13;
            let chunk_bytes =
                ringreduce::exec::cuda::auto_chunk_bytes(count, world, ELEM_BYTES, false);
            let spec = RingSpec {
                world,
                count,
                in_place: false,
                op: OP,
                chunk_elems: chunk_bytes / ELEM_BYTES,
                slots: 3,
                align_elems: 16 / ELEM_BYTES,
                transports: vec![EdgeTransport::Peer; world],
            };
            let function = format!("ring_build_check_world{world}");
            group.bench_function(BenchmarkId::new(function, size_label(bytes)), |b| {
                b.iter(|| {
                    let plan = spec.build().expect("a ring plan");
                    ringreduce::check::check(&plan).expect("a proven plan");
                    plan
                })
            });
            // The coarse form, proven once, as the cache holds it (what a count of the same
            // family finds there; the comparison costs the same).
            let proven = {
                let coarse = ringreduce::check::coarsen(&spec.build().expect("a ring plan"))
                    .expect("a coarse form");
                ringreduce::check::check(&coarse).expect("a proven coarse form");
                coarse
            };
            let function = format!("ring_build_coarse_world{world}");
            group.bench_function(BenchmarkId::new(function, size_label(bytes)), |b| {
                b.iter(|| {
                    let plan = spec.build().expect("a ring plan");
                    let coarse = ringreduce::check::coarsen(&plan).expect("a coarse form");
                    assert!(coarse == proven, "the same plan, another coarse form");
                    plan
                })
            });
        }
    }
    group.finish();
}

/// What the first call of a new shape costs before anything runs: building the ring plan, cutting
/// its coarse form and proving that with the four checks (a communicator's plan cache does this
/// once per coarse form; every later count of the form costs the build and the comparison). Odd
/// counts, the host executor's chunk setting and ever smaller ones, down to one element: the
/// chunk count per segment is bounded (`plan::max_chunks`), so the cost is bounded by the world.
fn bench_first_call(c: &mut Criterion) {
    use ringreduce::plan::{EdgeTransport, RingSpec};
    let mut group = c.benchmark_group("first_call");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(1000));
    for world in [2, 4, 8, 16] {
        for chunk_elems in [64 << 10, 16, 1] {
            let spec = RingSpec {
                world,
                count: (16 << 20) / ELEM_BYTES + 13,
                in_place: true,
                op: OP,
                chunk_elems,
                slots: 4,
                align_elems: 1,
                transports: vec![EdgeTransport::Peer; world],
            };
            let function = format!("ring_world{world}");
            let id = BenchmarkId::new(function, format!("chunk{chunk_elems}"));
            group.bench_function(id, |b| {
                b.iter(|| {
                    let plan = spec.build().expect("a ring plan");
                    let coarse = ringreduce::check::coarsen(&plan).expect("a coarse form");
                    ringreduce::check::check(&coarse).expect("a proven coarse form");
                    plan
                })
            });
        }
    }
    group.finish();
}

// ---------------------------------------------------------------------------------------------
// GPUs: ringreduce and NCCL side by side.
// ---------------------------------------------------------------------------------------------

fn bench_gpu(c: &mut Criterion) {
    let waived = |why: String| println!("waived: gpu benches need ≥ 2 GPUs ({why})");
    match device::driver_available().and_then(|()| device::device_count()) {
        Ok(n) if n >= GPU_DEVICES.len() => {}
        Ok(n) => return waived(format!("this host has {n}")),
        Err(err) => return waived(err.to_string()),
    }
    let world = GPU_DEVICES.len();
    let comm = Communicator::new(&GPU_DEVICES)
        .unwrap_or_else(|err| panic!("ringreduce communicator on GPUs {GPU_DEVICES:?}: {err}"));
    let nccl = NcclAllReduce::new(&GPU_DEVICES)
        .map_err(|err| println!("waived: nccl benches: {err}"))
        .ok();
    describe_gpu_run(&comm, nccl.as_ref());

    let mut group = c.benchmark_group("gpu");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    for bytes in GPU_SIZES_BYTES {
        let count = bytes / ELEM_BYTES;
        let label = size_label(bytes);
        // Host inputs and the expected result, shared by this size's benchmarks; built by the
        // first one that runs.
        let reference = OnceCell::new();
        let reference = || reference.get_or_init(|| Reference::new(world, count));
        group.throughput(Throughput::BytesDecimal(bytes as u64));

        for in_place in [false, true] {
            let function = format!("ringreduce_{}", placing(in_place));
            let what = format!("gpu/{function}/{label}");
            let enqueue = |bufs: &mut GpuBuffers| {
                // SAFETY: every call of this closure goes through `time_back_to_back`, which waits
                // for the collective (`comm.synchronize()`) before it returns, on its error path
                // too; until then the buffers stay in `bufs` (held by the closure below), and
                // nothing else reads or writes them.
                unsafe {
                    if in_place {
                        comm.enqueue_all_reduce_in_place(&mut bufs.inputs, OP)
                    } else {
                        comm.enqueue_all_reduce(&bufs.inputs, &mut bufs.outputs, OP)
                    }
                }
            };
            let mut bufs: Option<GpuBuffers> = None;
            group.bench_function(BenchmarkId::new(function, &label), |b| {
                let bufs = bufs.get_or_insert_with(|| {
                    let mut bufs = GpuBuffers::new(&GPU_DEVICES, reference(), in_place)
                        .unwrap_or_else(|err| panic!("{what}: buffers: {err}"));
                    // The checked call is one timed iteration: the same path as the timing.
                    time_back_to_back(&what, 1, || enqueue(&mut bufs), || comm.synchronize());
                    reference().check(&what, &bufs.results(&what));
                    bufs
                });
                b.iter_custom(|iters| {
                    time_back_to_back(&what, iters, || enqueue(bufs), || comm.synchronize())
                });
            });
        }

        let Some(nccl) = &nccl else { continue };
        for in_place in [false, true] {
            let function = format!("nccl_{}", placing(in_place));
            let what = format!("gpu/{function}/{label}");
            let enqueue = |bufs: &mut GpuBuffers| {
                // SAFETY: as for ringreduce above: `time_back_to_back` waits for every NCCL stream
                // (`nccl.synchronize()`) before it returns, and the buffers stay untouched in
                // `bufs` until then.
                unsafe {
                    if in_place {
                        nccl.enqueue_all_reduce_in_place(&mut bufs.inputs, OP)
                    } else {
                        nccl.enqueue_all_reduce(&bufs.inputs, &mut bufs.outputs, OP)
                    }
                }
            };
            let mut bufs: Option<GpuBuffers> = None;
            group.bench_function(BenchmarkId::new(function, &label), |b| {
                let bufs = bufs.get_or_insert_with(|| {
                    let mut bufs = GpuBuffers::new(&GPU_DEVICES, reference(), in_place)
                        .unwrap_or_else(|err| panic!("{what}: buffers: {err}"));
                    time_back_to_back(&what, 1, || enqueue(&mut bufs), || nccl.synchronize());
                    reference().check(&what, &bufs.results(&what));
                    bufs
                });
                b.iter_custom(|iters| {
                    time_back_to_back(&what, iters, || enqueue(bufs), || nccl.synchronize())
                });
            });
        }
    }
    group.finish();
    collectives::bench_collectives(c, &comm, nccl.as_ref());

    if let Some(nccl) = nccl {
        nccl.close()
            .unwrap_or_else(|err| panic!("closing the NCCL communicators: {err}"));
    }
    comm.close()
        .unwrap_or_else(|err| panic!("ringreduce communicator on GPUs {GPU_DEVICES:?}: {err}"));
}

/// Host wall clock of `iters` collectives enqueued back to back, up to the completion of the last:
/// `enqueue` queues one, `synchronize` waits for all queued. Panics on any failure, after waiting
/// for what was queued, so that no buffer is freed (by the unwinding) under queued work.
fn time_back_to_back<E: std::fmt::Display>(
    what: &str,
    iters: u64,
    mut enqueue: impl FnMut() -> Result<(), E>,
    synchronize: impl Fn() -> Result<()>,
) -> Duration {
    let start = Instant::now();
    for i in 0..iters {
        if let Err(err) = enqueue() {
            let waited = synchronize();
            panic!(
                "{what}: enqueuing call {i} of {iters} failed: {err} (then waiting: {waited:?})"
            );
        }
    }
    synchronize().unwrap_or_else(|err| panic!("{what}: waiting for {iters} calls failed: {err}"));
    start.elapsed()
}

/// The header beside every GPU number: what ran, on what, with which versions.
fn describe_gpu_run(comm: &Communicator, nccl: Option<&NcclAllReduce>) {
    let driver = device::driver_version()
        .map(|(major, minor)| format!("{major}.{minor}"))
        .unwrap_or_else(|err| format!("unknown ({err})"));
    println!(
        "# gpu: ringreduce {}, reduce kernels: {}, CUDA driver API {driver}",
        env!("CARGO_PKG_VERSION"),
        kernels::build_kind()
    );
    match device::devices() {
        Ok(devices) => {
            for d in devices.iter().filter(|d| GPU_DEVICES.contains(&d.index)) {
                println!(
                    "# GPU {}: {}, sm_{}{}, {} SMs, PCI {}",
                    d.index,
                    d.name,
                    d.compute_capability.0,
                    d.compute_capability.1,
                    d.sm_count,
                    d.pci_bus_id
                );
            }
        }
        Err(err) => println!("# GPUs: could not be described ({err})"),
    }
    for e in comm.edges() {
        println!("# ringreduce edge {}", e.describe());
    }
    if let Some(nccl) = nccl {
        println!(
            "# NCCL {} (NCCL_NVLS_ENABLE={})",
            nccl.version(),
            std::env::var("NCCL_NVLS_ENABLE").unwrap_or_default()
        );
    }
    println!(
        "# f32 sum; time per iteration = N calls enqueued back to back, then one wait, / N; \
         thrpt = algbw (GB = 1e9 B); busbw = algbw * 2(n-1)/n = algbw for 2 GPUs"
    );
}

/// One buffer per GPU for the inputs, filled with the reference inputs, and (out of place) one per
/// GPU for the outputs, zeroed.
struct GpuBuffers {
    inputs: Vec<GpuBuffer<f32>>,
    /// Empty for in-place collectives, whose results are in `inputs`.
    outputs: Vec<GpuBuffer<f32>>,
}

impl GpuBuffers {
    fn new(devices: &[usize], reference: &Reference, in_place: bool) -> Result<Self> {
        let inputs = devices
            .iter()
            .zip(&reference.inputs)
            .map(|(&device, input)| GpuBuffer::from_host(device, input))
            .collect::<Result<Vec<_>>>()?;
        let outputs = if in_place {
            Vec::new()
        } else {
            devices
                .iter()
                .map(|&device| GpuBuffer::zeroed(device, reference.count))
                .collect::<Result<Vec<_>>>()?
        };
        Ok(GpuBuffers { inputs, outputs })
    }

    /// Every rank's result, copied to the host (call it only when the collective is complete).
    fn results(&self, what: &str) -> Vec<Vec<f32>> {
        let results = if self.outputs.is_empty() {
            &self.inputs
        } else {
            &self.outputs
        };
        results
            .iter()
            .map(GpuBuffer::to_host)
            .collect::<Result<_>>()
            .unwrap_or_else(|err| panic!("{what}: reading the results back: {err}"))
    }
}

// ---------------------------------------------------------------------------------------------
// Correctness.
// ---------------------------------------------------------------------------------------------

/// Every rank's input and the expected result, exact in f32 ([`ringreduce::verify`]).
struct Reference {
    count: usize,
    inputs: Vec<Vec<f32>>,
    expected: Vec<f32>,
}

impl Reference {
    fn new(world: usize, count: usize) -> Self {
        Reference {
            count,
            inputs: (0..world).map(|rank| make_input(OP, rank, count)).collect(),
            expected: make_expected(OP, world, count),
        }
    }

    /// Prints `#wrong 0` for `what`, or panics with the count and the first mismatches.
    fn check(&self, what: &str, results: &[Vec<f32>]) {
        assert_eq!(
            results.len(),
            self.inputs.len(),
            "{what}: one result per rank"
        );
        let mut wrong = 0;
        let mut first = Vec::new();
        for (rank, got) in results.iter().enumerate() {
            let (rank_wrong, rank_first) = compare(rank, got, &self.expected, 4);
            wrong += rank_wrong;
            first.extend(rank_first);
        }
        let world = results.len();
        if wrong > 0 {
            let first: Vec<String> = first.iter().map(ToString::to_string).collect();
            panic!(
                "{what}: WRONG RESULT, {wrong} of {world} x {} elements wrong; first: {}",
                self.count,
                first.join(", ")
            );
        }
        println!(
            "{what}: checked {world} ranks x {} elements, #wrong 0",
            self.count
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Names.
// ---------------------------------------------------------------------------------------------

fn placing(in_place: bool) -> &'static str {
    if in_place {
        "in_place"
    } else {
        "out_of_place"
    }
}

/// "4KiB", "256MiB": the benchmark's parameter (powers of 1024; throughput is decimal).
fn size_label(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}KiB", b >> 10),
        b => format!("{b}B"),
    }
}
