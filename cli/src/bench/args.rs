//! The arguments of `ringreduce bench` ([`BenchArgs`], [`Sizes`]) and what follows from them
//! alone: the collectives a run measures, ringreduce's communicator options for a pass
//! ([`cuda_config`]) and the label suffix of the ring's knobs ([`knobs_suffix`]). The bench
//! modules that need the arguments import them from here; this module uses no other bench
//! module but `collective` (the collectives' names) and `random` (the workload's seed).

use super::collective::{parse_collective, BenchCollective};
use super::random;
use crate::{parse_bytes, parse_op, parse_transport};
use ringreduce::{DType, ReduceOp, Transport};
use std::path::PathBuf;

#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// The collective, by nccl-tests' name: all_reduce, all_gather, reduce_scatter, broadcast,
    /// reduce, alltoall, sendrecv. Sizes are nccl-tests' (see docs/BENCH.md).
    #[arg(long, default_value = "all_reduce", value_parser = parse_collective)]
    pub collective: BenchCollective,
    /// Every collective, one after the other (in place of --collective).
    #[arg(long, conflicts_with = "collective")]
    pub all: bool,
    /// Smallest message in bytes per rank (suffixes K, M, G: powers of 1024).
    #[arg(short = 'b', long, default_value = "8", value_parser = parse_bytes)]
    pub min_bytes: usize,
    /// Largest message in bytes per rank.
    #[arg(short = 'e', long, default_value = "1G", value_parser = parse_bytes)]
    pub max_bytes: usize,
    /// Size multiplier between rows.
    #[arg(short = 'f', long, default_value_t = 2)]
    pub factor: usize,
    /// Element type: f16, bf16, f32, f64, i8, u8, i32, u32, i64, u64, f8e4m3, f8e5m2.
    #[arg(short = 'd', long, default_value = "f32", value_parser = parse_dtype)]
    pub dtype: DType,
    /// Reduction: sum, prod, min, max, avg.
    #[arg(short = 'o', long, default_value = "sum", value_parser = parse_op)]
    pub op: ReduceOp,
    /// How ringreduce's ring edges move data: auto, peer or staged (staged: NCCL runs with
    /// NCCL_P2P_DISABLE=1).
    #[arg(long, default_value = "auto", value_parser = parse_transport)]
    pub transport: Transport,
    /// ringreduce's algorithm: auto (by size, see the header), ring, oneshot or twoshot.
    #[arg(long, default_value = "auto", value_parser = crate::parse_algorithm)]
    pub algorithm: ringreduce::Algorithm,
    /// ringreduce's ring chunk in bytes (suffixes K, M, G), in place of the automatic size per
    /// message (`CudaConfig::chunk_bytes`). Applies to the staged pass too (whose automatic chunk
    /// is at most 4 MiB); not to NCCL, nor to the one-shot.
    #[arg(long, value_parser = crate::parse_chunk_bytes)]
    pub chunk: Option<usize>,
    /// Staging slots per receiver of ringreduce's ring (`CudaConfig::slots`). Applies to the
    /// staged pass too; not to NCCL, nor to the one-shot.
    #[arg(long, default_value_t = ringreduce::CudaConfig::default().slots,
          value_parser = crate::parse_positive)]
    pub slots: usize,
    /// Timed iterations per size.
    #[arg(short = 'n', long, default_value_t = 20)]
    pub iters: usize,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long, default_value_t = 5)]
    pub warmup: usize,
    /// Write the header and all rows as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw busbw and time against size for every library (SVG).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Skip NCCL.
    #[arg(long)]
    pub no_nccl: bool,
    /// Launch ringreduce's peer calls on every GPU at once from launcher threads
    /// (`CudaConfig::launch_threads`), instead of one GPU after the other from the caller's thread.
    #[arg(long)]
    pub launch_threads: bool,
    /// Run ringreduce's one-shot all-reduce of at most 64 KiB per rank with the LL kernel
    /// (`CudaConfig::low_latency`: pushed words, no barrier) instead of the read one-shot; the
    /// label gets ", low-latency".
    #[arg(long)]
    pub low_latency: bool,
    /// Time the host phases of ringreduce's calls (`CudaConfig::profile_host`): per size and
    /// placement, the median of each phase over the call-to-completion pass (enqueue, then
    /// synchronize) and over as many blocking calls; printed after the sweep and kept in the JSON.
    #[arg(long)]
    pub profile_host: bool,
    /// Development on a one-GPU machine: two ranks share GPU 0 (`allow_shared_device`; the peer
    /// kernels split its SMs), NCCL skipped (it refuses two ranks on one GPU). The times show the
    /// host's part of a call and the kernels without NVLink: never a result to publish.
    #[arg(long)]
    pub shared_gpu: bool,
    /// Measure nothing: read a report written earlier with --json and draw it (--plot); no GPU
    /// needed.
    #[arg(long)]
    pub from_json: Option<PathBuf>,
    /// Skip the staged pass (ringreduce staged through pinned host memory against NCCL with
    /// NCCL_P2P_DISABLE=1, up to 256 MiB) that follows the main one unless --transport staged.
    #[arg(long)]
    pub no_staged: bool,
    /// Also capture N back-to-back all-reduces per CUDA graph, for ringreduce (on the bench's own
    /// streams) and NCCL alike, and time the replays (per all-reduce = replay / N); `-n` and `-w`
    /// count replays there.
    #[arg(long, value_name = "N", value_parser = crate::parse_positive)]
    pub graph: Option<usize>,
    /// `random`: after the sweep, a workload whose size changes on every call (sizes from -b..-e,
    /// log-uniform, fixed seed), each call timed to its completion, against the fixed sizes.
    #[arg(long, value_enum, default_value = "sweep")]
    pub sizes: Sizes,
    /// Calls in the random-size workload.
    #[arg(long, default_value_t = 1000, value_parser = crate::parse_positive)]
    pub random_calls: usize,
    /// Seed of the random-size workload.
    #[arg(long, default_value_t = random::DEFAULT_SEED)]
    pub seed: u64,
    /// The JSON of scripts/torch_symm_mem_bench.py: PyTorch's symmetric-memory all-reduces as
    /// columns and in the best-competitor comparison.
    #[arg(long, value_name = "FILE")]
    pub torch_json: Option<PathBuf>,
    /// Run the all-reduce with one process per rank, N processes (started as `ringreduce
    /// launch` starts them): GPU `LOCAL_RANK` each, or GPU 0 shared by all where there are fewer
    /// GPUs than ranks (then the table says so: a correctness run, not a result). ringreduce
    /// only.
    #[arg(long, value_name = "N", value_parser = crate::parse_positive)]
    pub processes: Option<usize>,
    /// With `--processes`: every rank registers each size's buffer first
    /// (`RankCommunicator::register`), so the calls run on it in place, with no copies through
    /// the ranks' own memory.
    #[arg(long, requires = "processes")]
    pub registered: bool,
    /// Internal: one rank of `--processes` (set by the launching bench).
    #[arg(long, hide = true)]
    pub rank_process: bool,
    /// Internal: run NCCL only (in a child process of `bench`).
    #[arg(long, hide = true)]
    pub nccl_only: bool,
    /// Internal: with --nccl-only, NCCL's buffers in symmetric memory (registered windows).
    #[arg(long, hide = true)]
    pub nccl_symmetric: bool,
    /// Internal: with --nccl-only, print the rows as JSON on stdout and nothing else there.
    #[arg(long, hide = true)]
    pub json_stdout: bool,
}

/// Which sizes `bench` calls with.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sizes {
    /// The fixed sweep -b..-e, ×-f.
    Sweep,
    /// The fixed sweep, then the random-size workload.
    Random,
}

impl BenchArgs {
    /// The collectives this run measures: every one with `--all`, else `--collective`'s.
    pub fn collectives(&self) -> Vec<BenchCollective> {
        if self.all {
            BenchCollective::ALL.to_vec()
        } else {
            vec![self.collective]
        }
    }
}

fn parse_dtype(text: &str) -> Result<DType, String> {
    DType::from_name(text).ok_or_else(|| {
        let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
        format!("unknown type {text:?}: use one of {}", names.join(", "))
    })
}

/// ringreduce's communicator options for one pass: `args`' transport, algorithm and ring knobs.
pub fn cuda_config(args: &BenchArgs) -> ringreduce::CudaConfig {
    ringreduce::CudaConfig {
        transport: args.transport,
        algorithm: args.algorithm,
        chunk_bytes: args.chunk,
        slots: args.slots,
        allow_shared_device: args.shared_gpu,
        launch_threads: args.launch_threads,
        low_latency: args.low_latency,
        profile_host: args.profile_host,
        ..Default::default()
    }
}

/// ", chunk 32M, slots 4" for a label or a title when either knob differs from `CudaConfig`'s
/// default, so that series from different settings do not share a name; "" otherwise.
pub fn knobs_suffix(chunk_bytes: Option<u64>, slots: Option<u64>) -> String {
    let default_slots = ringreduce::CudaConfig::default().slots as u64;
    if chunk_bytes.is_none() && slots.is_none_or(|s| s == default_slots) {
        return String::new();
    }
    let chunk = chunk_bytes.map_or("auto".to_string(), |b| crate::format_bytes(b as usize));
    match slots {
        Some(s) => format!(", chunk {chunk}, slots {s}"),
        None => format!(", chunk {chunk}"),
    }
}
