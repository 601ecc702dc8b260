//! Criterion benchmarks of ringreduce's all-reduce, and of NCCL's on the same GPUs beside it.
//!
//! Two groups, f32 sum throughout:
//!
//! - **`host`**: the host executor (one thread per rank), in place, 2 and 4 ranks, 4 KiB to 4 MiB.
//!   It runs everywhere; on a 2-core machine the whole group takes well under a minute.
//! - **`gpu`**: GPUs 0 and 1, 4 KiB to 256 MiB, out of place and in place: ringreduce's
//!   copy-engine ring (`ringreduce_*`) and, where libnccl loads, NCCL through cudarc (`nccl_*`),
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
//! - On a GPU host without Rust: `../shared/gpu/stage.sh` stages this as `.gpu/bin/bench-allreduce`;
//!   run it there with `--bench` (without it, criterion runs its test mode).
//!
//! # NCCL
//!
//! Loaded at run time through cudarc (`nccl-02028`, `dynamic-loading`). The communicators come
//! from `ncclCommInitAll` (one process, one thread, one communicator per GPU), so every
//! collective is a group: `ncclGroupStart`, one `ncclAllReduce` per GPU, `ncclGroupEnd`. We use
//! cudarc's `result` layer with our own non-blocking streams and [`GpuBuffer`]s (plain
//! `cuMemAlloc`, the same memory ringreduce is timed on), not cudarc's safe `Comm`: that one
//! works on `CudaSlice`s, which with cudarc's default event tracking record events around every
//! use (time NCCL itself does not spend), keeps its communicator handle private, and panics in
//! `Drop`. cudarc's `NcclError` prints only
//! "NcclError", so failures here become [`Error::Nccl`] with NCCL's own text.
//!
//! cudarc looks for libnccl under its own list of names (printed when it finds none), which has
//! `libnccl.so` but not `libnccl.so.2`: on a host with only the runtime package, put a link named
//! `libnccl.so` to it in a folder on `LD_LIBRARY_PATH`. `NCCL_NVLS_ENABLE` is set to 0 when unset
//! (NVLink multicast must stay off on the shared test machines, and NCCL's anchor figures were
//! measured so); set it yourself to override.

use criterion::{BenchmarkId, Criterion, Throughput};
use cudarc::nccl::{result as nccl, sys as nccl_sys};
use ringreduce::exec::cuda::{device, kernels};
use ringreduce::verify::{compare, make_expected, make_input};
use ringreduce::{Buffer, BufferMut, Communicator, Error, GpuBuffer, HostConfig, ReduceOp, Result};
use std::cell::OnceCell;
use std::ffi::{c_int, c_void, CStr};
use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant};

const OP: ReduceOp = ReduceOp::Sum;
const ELEM_BYTES: usize = std::mem::size_of::<f32>();

const HOST_WORLDS: [usize; 2] = [2, 4];
const HOST_SIZES_BYTES: [usize; 3] = [4 << 10, 256 << 10, 4 << 20];

const GPU_DEVICES: [usize; 2] = [0, 1];
const GPU_SIZES_BYTES: [usize; 5] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20];

fn main() {
    // Before any thread exists (set_var races with getenv on other threads) and before NCCL reads
    // its environment, which it does once at communicator creation.
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        std::env::set_var("NCCL_NVLS_ENABLE", "0");
    }
    let mut criterion = Criterion::default().configure_from_args();
    bench_host(&mut criterion);
    bench_gpu(&mut criterion);
    criterion.final_summary();
}

// ---------------------------------------------------------------------------------------------
// Host executor.
// ---------------------------------------------------------------------------------------------

fn bench_host(c: &mut Criterion) {
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
            // Made and checked on the first call, which only happens when the filter selects it.
            let mut bufs: Option<Vec<Vec<f32>>> = None;
            group.throughput(Throughput::BytesDecimal(bytes as u64));
            group.bench_function(BenchmarkId::new(function, label), |b| {
                let bufs = bufs.get_or_insert_with(|| {
                    let reference = Reference::new(world, count);
                    let mut bufs = reference.inputs.clone();
                    comm.all_reduce_in_place(&mut bufs, OP)
                        .unwrap_or_else(|err| panic!("{what}: checked call failed: {err}"));
                    reference.check(&what, &bufs);
                    bufs
                });
                // The host executor returns when the collective is complete.
                b.iter(|| {
                    comm.all_reduce_in_place(bufs, OP)
                        .unwrap_or_else(|err| panic!("{what}: {err}"))
                });
            });
        }
        comm.close()
            .unwrap_or_else(|err| panic!("host communicator of {world} ranks: {err}"));
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
    let nccl = NcclClique::open(&GPU_DEVICES)
        .map_err(|why| println!("waived: nccl benches: {why}"))
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
                        nccl.enqueue_all_reduce_in_place(&mut bufs.inputs)
                    } else {
                        nccl.enqueue_all_reduce(&bufs.inputs, &mut bufs.outputs)
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
fn time_back_to_back(
    what: &str,
    iters: u64,
    mut enqueue: impl FnMut() -> Result<()>,
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
fn describe_gpu_run(comm: &Communicator, nccl: Option<&NcclClique>) {
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
        println!(
            "# ringreduce edge GPU {} -> GPU {}: {:?}, {}",
            e.from_device, e.to_device, e.transport, e.reason
        );
    }
    if let Some(nccl) = nccl {
        println!(
            "# NCCL {} (NCCL_NVLS_ENABLE={})",
            nccl.version,
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
// NCCL, through cudarc's result layer.
// ---------------------------------------------------------------------------------------------

/// One NCCL communicator per GPU, all made in this process and driven from this thread
/// (`ncclCommInitAll`), with one non-blocking stream per GPU. Rank `r` is GPU `devices[r]`.
///
/// Holds raw NCCL handles, so it is neither `Send` nor `Sync`: one thread issues every group.
struct NcclClique {
    devices: Vec<usize>,
    /// Empty only after `release`.
    comms: Vec<nccl_sys::ncclComm_t>,
    streams: Vec<device::Stream>,
    /// "2.28.3".
    version: String,
}

impl NcclClique {
    /// The communicators, or why NCCL cannot be benchmarked here (a line for the waiver).
    fn open(devices: &[usize]) -> std::result::Result<NcclClique, String> {
        // SAFETY: is_culib_present only tries `dlopen` on cudarc's candidate names and closes what
        // it opened; it is cudarc's way to ask before its loader would panic.
        if !unsafe { nccl_sys::is_culib_present() } {
            return Err(format!(
                "libnccl not found; cudarc looks for {:?} on the loader path (LD_LIBRARY_PATH); \
                 with only libnccl.so.2 installed, link it as libnccl.so in a folder there",
                cudarc::get_lib_name_candidates("nccl")
            ));
        }
        // cudarc's loader panics instead of failing when a symbol is missing (an old libnccl).
        let version = panic::catch_unwind(nccl::get_nccl_version)
            .map_err(|_| "libnccl loaded but ncclGetVersion could not be called".to_string())?
            .map_err(nccl_error("ncclGetVersion"))
            .map_err(|err| err.to_string())?;
        let streams = devices
            .iter()
            .map(|&d| device::context(d).and_then(|ctx| device::Stream::new(&ctx)))
            .collect::<Result<Vec<_>>>()
            .map_err(|err| format!("streams for NCCL: {err}"))?;
        let mut comms = vec![std::ptr::null_mut(); devices.len()];
        let ordinals = devices
            .iter()
            .map(|&d| c_int::try_from(d))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| format!("devices {devices:?} are not CUDA ordinals"))?;
        let ndev = c_int::try_from(devices.len()).map_err(|_| "too many devices".to_string())?;
        // SAFETY: `comms` has room for `ndev` handles and `ordinals` holds `ndev` device ordinals,
        // both live for the call; NCCL writes one communicator per device into `comms`.
        unsafe { nccl::comm_init_all(comms.as_mut_ptr(), ndev, ordinals.as_ptr()) }
            .map_err(nccl_error("ncclCommInitAll"))
            .map_err(|err| err.to_string())?;
        Ok(NcclClique {
            devices: devices.to_vec(),
            comms,
            streams,
            version: format!(
                "{}.{}.{}",
                version / 10000,
                version % 10000 / 100,
                version % 100
            ),
        })
    }

    /// Out-of-place f32 sum: every `outputs[r]` gets the sum of all `inputs`; returns once the
    /// work is enqueued on the clique's streams.
    ///
    /// # Safety
    /// Inputs and outputs must stay allocated, inputs unwritten and outputs neither read nor
    /// written (on any stream or the host), until [`NcclClique::synchronize`] has returned.
    unsafe fn enqueue_all_reduce(
        &self,
        inputs: &[GpuBuffer<f32>],
        outputs: &mut [GpuBuffer<f32>],
    ) -> Result<()> {
        let count = self.check_buffers(inputs)?;
        self.check_buffers(outputs)?;
        if let Some(rank) = outputs.iter().position(|b| b.count() < count) {
            return Err(Error::OutputTooShort {
                rank,
                input: count,
                output: outputs[rank].count(),
            });
        }
        let sends: Vec<u64> = inputs.iter().map(Buffer::address).collect();
        let recvs: Vec<u64> = outputs.iter_mut().map(BufferMut::address_mut).collect();
        // SAFETY: checked above: one buffer per rank on that rank's GPU, each of at least `count`
        // f32s; an input and an output never overlap (distinct allocations, borrowed apart).
        // Their lifetime until completion is our caller's contract.
        unsafe { self.enqueue(&sends, &recvs, count) }
    }

    /// In-place f32 sum: every `bufs[r]` ends with the sum of all; returns once enqueued.
    ///
    /// # Safety
    /// The buffers must stay allocated and untouched (no reads, no writes, on any stream or the
    /// host) until [`NcclClique::synchronize`] has returned.
    unsafe fn enqueue_all_reduce_in_place(&self, bufs: &mut [GpuBuffer<f32>]) -> Result<()> {
        let count = self.check_buffers(bufs)?;
        let addresses: Vec<u64> = bufs.iter_mut().map(BufferMut::address_mut).collect();
        // SAFETY: checked above; send and receive are the same range, which NCCL supports as in
        // place. Lifetimes are our caller's contract.
        unsafe { self.enqueue(&addresses, &addresses, count) }
    }

    /// One buffer per rank, on the rank's GPU, all of rank 0's length; returns that length.
    fn check_buffers(&self, bufs: &[GpuBuffer<f32>]) -> Result<usize> {
        if bufs.len() != self.devices.len() {
            return Err(Error::WorldMismatch {
                world: self.devices.len(),
                got: bufs.len(),
            });
        }
        let count = bufs[0].count();
        for (rank, (buf, &expected)) in bufs.iter().zip(&self.devices).enumerate() {
            if buf.device() != expected {
                return Err(Error::WrongDevice {
                    rank,
                    device: buf.device(),
                    expected,
                });
            }
            if buf.count() != count {
                return Err(Error::LengthMismatch {
                    rank,
                    expected: count,
                    got: buf.count(),
                });
            }
        }
        Ok(count)
    }

    /// # Safety
    /// `sends[r]` and `recvs[r]` are device addresses on GPU `devices[r]`, valid for `count` f32s,
    /// each receive range either equal to its send range or overlapping no send range, and they
    /// stay valid and untouched by others until [`NcclClique::synchronize`] has returned.
    unsafe fn enqueue(&self, sends: &[u64], recvs: &[u64], count: usize) -> Result<()> {
        debug_assert!(sends.len() == self.comms.len() && recvs.len() == self.comms.len());
        nccl::group_start().map_err(nccl_error("ncclGroupStart"))?;
        let mut queued = Ok(());
        for (rank, comm) in self.comms.iter().enumerate() {
            // SAFETY: the addresses and their lifetime are our caller's contract; `comm` is a live
            // communicator of GPU devices[rank] (from ncclCommInitAll, destroyed only in
            // `release`), and `streams[rank]` is a live stream in that GPU's primary context,
            // the context NCCL works in. The call only queues work: inside a group it returns at
            // once.
            let call = unsafe {
                nccl::all_reduce(
                    sends[rank] as *const c_void,
                    recvs[rank] as *mut c_void,
                    count,
                    nccl_sys::ncclDataType_t::ncclFloat32,
                    nccl_sys::ncclRedOp_t::ncclSum,
                    *comm,
                    self.streams[rank].raw() as nccl_sys::cudaStream_t,
                )
            };
            if let Err(err) = call {
                queued = Err(nccl_error("ncclAllReduce")(err));
                break;
            }
        }
        // Always close the group, even after a failed call, so the thread is not left inside it.
        let ended = nccl::group_end().map_err(nccl_error("ncclGroupEnd"));
        queued.and(ended.map(|_| ()))
    }

    /// Waits for all work queued on the clique's streams.
    fn synchronize(&self) -> Result<()> {
        self.streams.iter().try_for_each(device::stream_synchronize)
    }

    /// Finalizes and destroys the communicators, returning the first error.
    fn close(mut self) -> Result<()> {
        self.release()
    }

    fn release(&mut self) -> Result<()> {
        let comms = std::mem::take(&mut self.comms);
        if comms.is_empty() {
            return Ok(());
        }
        // Finalizing is collective over the clique: one thread finalizes all in one group
        // (NVIDIA's single-thread, multi-GPU example), then each is destroyed on its own.
        let mut first_error = nccl::group_start()
            .map_err(nccl_error("ncclGroupStart"))
            .err();
        for &comm in &comms {
            // SAFETY: `comm` is a live communicator from ncclCommInitAll, finalized once here.
            let finalized = unsafe { nccl::comm_finalize(comm) };
            if let Err(err) = finalized {
                first_error.get_or_insert(nccl_error("ncclCommFinalize")(err));
            }
        }
        if let Err(err) = nccl::group_end() {
            first_error.get_or_insert(nccl_error("ncclGroupEnd")(err));
        }
        for comm in comms {
            // SAFETY: `comm` is live and destroyed exactly once: `self.comms` was emptied above.
            if let Err(err) = unsafe { nccl::comm_destroy(comm) } {
                first_error.get_or_insert(nccl_error("ncclCommDestroy")(err));
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for NcclClique {
    fn drop(&mut self) {
        // `close` returns these errors; `Drop` drops them, and never panics (cudarc's loader can).
        let _ = panic::catch_unwind(AssertUnwindSafe(|| self.release()));
    }
}

/// Converts a cudarc `NcclError` from `call` into [`Error::Nccl`] with NCCL's own words: the
/// code's name and description, and NCCL's last error message. The one place an NCCL status
/// becomes an [`Error`].
fn nccl_error(call: &'static str) -> impl FnOnce(nccl::NcclError) -> Error {
    move |err| {
        let code = err.0;
        // SAFETY: ncclGetErrorString takes any result code and returns a static NUL-terminated
        // string (or null, checked); the library is loaded, since it produced `code`.
        let text = c_text(unsafe { nccl_sys::ncclGetErrorString(code) });
        // SAFETY: ncclGetLastError ignores its argument and returns NCCL's last error message,
        // NUL-terminated (or null, checked); it is copied before any other NCCL call.
        let last = c_text(unsafe { nccl_sys::ncclGetLastError(std::ptr::null_mut()) });
        Error::Nccl {
            call,
            message: format!("{code:?}: {text}; NCCL's last error: {last}"),
        }
    }
}

/// The text of a C string from NCCL, or "(none)" for null.
fn c_text(ptr: *const std::ffi::c_char) -> String {
    if ptr.is_null() {
        return "(none)".to_string();
    }
    // SAFETY: non-null, and our callers pass pointers NCCL documents as NUL-terminated strings
    // that stay valid until the next NCCL call on this thread.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
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
