//! `ringreduce bench`: an nccl-tests-style sweep of ringreduce's all-reduce against NCCL's on the
//! same GPUs, with the machine, versions, commit and date beside the numbers; `--json` and `--plot`.
//!
//! # What one row is
//!
//! For each size (bytes per rank; count = bytes / element size): out of place, then in place —
//! time (µs), algbw = bytes / time (GB/s, 1 GB = 10⁹ B), busbw = algbw · 2(n−1)/n, #wrong — and
//! per-iteration times (min, median, p99). ringreduce runs in this process; NCCL runs in child
//! processes of this same executable (`--nccl-only --json-stdout`), because NCCL reads its
//! environment (`NCCL_ALGO`, `NCCL_P2P_DISABLE`) once, at communicator creation: once with NCCL's
//! defaults and once with `NCCL_ALGO=Ring` (ring against ring); with `--transport staged`, both
//! with `NCCL_P2P_DISABLE=1` (NCCL's host shared-memory path, the counterpart of staging).
//!
//! # Timing (as nccl-tests)
//!
//! Per size and placement: one checked call on fresh inputs (every element of every rank compared
//! with the exact host reference, [`ringreduce::verify`]), `-w` warm-up iterations, then `-n`
//! iterations enqueued back to back and timed on the host from the first enqueue to the end of the
//! wait for completion, divided by `-n`. Then a second pass of `-n` iterations with a CUDA timing
//! event recorded on rank 0's stream between consecutive iterations gives per-iteration times
//! (rank 0's view: its part of iteration i ends when it has received everything it needs).

use crate::{parse_bytes, parse_transport, require_gpus, Failure};
use ringreduce::device;
use ringreduce::exec::cuda::kernels;
use ringreduce::verify::{compare, make_expected, make_input};
use ringreduce::{Communicator, DType, Element, GpuBuffer, ReduceOp, Transport};
use ringreduce_cli::baseline::{self, NcclAllReduce};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// Smallest message in bytes per rank (suffixes K, M, G: powers of 1024).
    #[arg(short = 'b', long, default_value = "8", value_parser = parse_bytes)]
    pub min_bytes: usize,
    /// Largest message in bytes per rank.
    #[arg(short = 'e', long, default_value = "1G", value_parser = parse_bytes)]
    pub max_bytes: usize,
    /// Size multiplier between rows.
    #[arg(short = 'f', long, default_value_t = 2)]
    pub factor: usize,
    /// Element type: f16, bf16, f32, f64, i8, u8, i32, u32, i64, u64.
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
    /// Measure nothing: read a report written earlier with --json and draw it (--plot); no GPU
    /// needed.
    #[arg(long)]
    pub from_json: Option<PathBuf>,
    /// Skip the staged pass (ringreduce staged through pinned host memory against NCCL with
    /// NCCL_P2P_DISABLE=1, up to 256 MiB) that follows the main one unless --transport staged.
    #[arg(long)]
    pub no_staged: bool,
    /// Internal: run NCCL only (in a child process of `bench`).
    #[arg(long, hide = true)]
    pub nccl_only: bool,
    /// Internal: with --nccl-only, print the rows as JSON on stdout and nothing else there.
    #[arg(long, hide = true)]
    pub json_stdout: bool,
}

fn parse_dtype(text: &str) -> Result<DType, String> {
    DType::from_name(text).ok_or_else(|| {
        let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
        format!("unknown type {text:?}: use one of {}", names.join(", "))
    })
}

fn parse_op(text: &str) -> Result<ReduceOp, String> {
    ReduceOp::from_name(text)
        .ok_or_else(|| format!("unknown op {text:?}: use sum, prod, min, max or avg"))
}

// ---------------------------------------------------------------------------------------------
// Rows, the report, and the formulas.
// ---------------------------------------------------------------------------------------------

/// One placement's numbers for one size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measure {
    /// Host wall clock over `iters` back-to-back iterations including completion, per iteration.
    pub time_us: f64,
    /// Bytes per rank / time, GB/s (10⁹ B).
    pub algbw_gbps: f64,
    /// algbw · 2(n−1)/n.
    pub busbw_gbps: f64,
    /// Wrong elements over all ranks in the checked call.
    pub wrong: u64,
    /// Per-iteration times from CUDA events on rank 0's stream.
    pub iter_min_us: f64,
    pub iter_median_us: f64,
    pub iter_p99_us: f64,
}

/// One size of one library: nccl-tests' row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// "ringreduce (auto)", "NCCL", "NCCL (NCCL_ALGO=Ring)", ...
    pub library: String,
    pub size_bytes: u64,
    pub count: u64,
    pub dtype: String,
    pub redop: String,
    /// ringreduce's algorithm for this size ("ring", "oneshot"); absent for NCCL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<String>,
    pub out_of_place: Measure,
    pub in_place: Measure,
}

/// Everything a run says: the header lines, ringreduce's ring knobs and every row. What `--json`
/// writes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub header: Vec<(String, String)>,
    /// ringreduce's ring chunk in bytes (`--chunk`, both passes); `null` = automatic per size.
    /// Absent in reports from before the flag, which read as `null` (they all ran automatic).
    #[serde(default)]
    pub chunk_bytes: Option<u64>,
    /// ringreduce's staging slots per receiver (`--slots`, both passes). Absent in reports from
    /// before the flag: `None`, not recorded.
    #[serde(default)]
    pub slots: Option<u64>,
    /// Libraries that were not measured, with why.
    pub not_measured: Vec<(String, String)>,
    pub rows: Vec<Row>,
}

/// What a `--nccl-only --json-stdout` child prints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChildOutput {
    pub nccl_version: String,
    pub rows: Vec<Row>,
}

/// algbw in GB/s (10⁹ B/s): one rank's buffer over the time of one all-reduce.
pub fn algbw_gbps(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

/// busbw = algbw · 2(n−1)/n: in a ring all-reduce each rank sends (and receives) 2(n−1)/n of the
/// buffer, so this is the bandwidth every link carried; comparable with the link's speed and
/// across world sizes. For n = 1 nothing moves: 0.
pub fn busbw_gbps(algbw: f64, world: usize) -> f64 {
    if world == 0 {
        return 0.0;
    }
    algbw * 2.0 * (world as f64 - 1.0) / world as f64
}

/// Sizes in bytes: `min` up to `max`, ×`factor` per row (at least ×2), each rounded down to whole
/// elements of `elem_bytes` and at least one element; duplicates after rounding dropped.
pub fn sizes(min: usize, max: usize, factor: usize, elem_bytes: usize) -> Vec<usize> {
    let factor = factor.max(2);
    let mut out: Vec<usize> = std::iter::successors(Some(min.max(1)), |s| s.checked_mul(factor))
        .take_while(|&s| s <= max)
        .map(|s| (s / elem_bytes).max(1) * elem_bytes)
        .collect();
    out.dedup();
    out
}

/// (min, median, p99) of `samples` (sorted in place); zeros when empty.
pub fn percentiles(samples: &mut [f64]) -> (f64, f64, f64) {
    if samples.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    let median = if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    };
    let p99 = samples[((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1];
    (samples[0], median, p99)
}

/// "YYYY-MM-DD HH:MM:SS UTC" for seconds since the Unix epoch (proleptic Gregorian calendar;
/// Howard Hinnant's days-to-civil algorithm).
pub fn utc_date(unix_seconds: u64) -> String {
    let days = (unix_seconds / 86_400) as i64;
    let secs = unix_seconds % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// ringreduce's commit: `RINGREDUCE_COMMIT` at build time, else `git rev-parse` in the current
/// folder at run time, else "unknown".
fn commit() -> String {
    if let Some(c) = option_env!("RINGREDUCE_COMMIT") {
        return c.to_string();
    }
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(hash) if !hash.is_empty() => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{hash} + uncommitted changes (git, at run time)")
            } else {
                format!("{hash} (git, at run time)")
            }
        }
        _ => "unknown".to_string(),
    }
}

/// ringreduce's communicator options for one pass: `args`' transport, algorithm and ring knobs.
pub fn cuda_config(args: &BenchArgs) -> ringreduce::CudaConfig {
    ringreduce::CudaConfig {
        transport: args.transport,
        algorithm: args.algorithm,
        chunk_bytes: args.chunk,
        slots: args.slots,
        ..Default::default()
    }
}

/// The staged pass's arguments: the ring with every edge staged, up to [`STAGED_MAX_BYTES`]; the
/// ring knobs (`--chunk`, `--slots`) and everything else as in the main pass.
pub fn staged_pass_args(args: &BenchArgs) -> BenchArgs {
    let max_bytes = args.max_bytes.min(STAGED_MAX_BYTES);
    BenchArgs {
        transport: Transport::Staged,
        algorithm: ringreduce::Algorithm::Ring,
        max_bytes,
        min_bytes: args.min_bytes.min(max_bytes),
        ..args.clone()
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

// ---------------------------------------------------------------------------------------------
// NCCL child processes.
// ---------------------------------------------------------------------------------------------

/// One NCCL configuration run in its own process.
#[derive(Clone, Debug, PartialEq)]
pub struct NcclRun {
    pub label: String,
    /// Variables set for the child (NCCL reads them at init).
    pub set: Vec<(String, String)>,
    /// Variables removed from the child's environment.
    pub remove: Vec<String>,
}

/// The NCCL runs for this sweep: defaults and `NCCL_ALGO=Ring`; with staged transport both with
/// `NCCL_P2P_DISABLE=1`. `NCCL_NVLS_ENABLE` is 0 unless `nvls` (the parent's value) says
/// otherwise.
pub fn nccl_runs(transport: Transport, nvls: Option<&str>) -> Vec<NcclRun> {
    let nvls = nvls.unwrap_or("0").to_string();
    let p2p_off = transport == Transport::Staged;
    [false, true]
        .into_iter()
        .map(|ring| {
            let mut set = vec![("NCCL_NVLS_ENABLE".to_string(), nvls.clone())];
            let mut remove = Vec::new();
            let mut label = "NCCL".to_string();
            let mut notes = Vec::new();
            if ring {
                set.push(("NCCL_ALGO".into(), "Ring".into()));
                notes.push("NCCL_ALGO=Ring");
            } else {
                remove.push("NCCL_ALGO".to_string());
            }
            if p2p_off {
                set.push(("NCCL_P2P_DISABLE".into(), "1".into()));
                notes.push("NCCL_P2P_DISABLE=1");
            }
            if !notes.is_empty() {
                label = format!("{label} ({})", notes.join(", "));
            }
            NcclRun { label, set, remove }
        })
        .collect()
}

/// The child's command line (after the executable): the same sweep, NCCL only, JSON on stdout.
pub fn child_args(args: &BenchArgs) -> Vec<String> {
    vec![
        "bench".into(),
        "--nccl-only".into(),
        "--json-stdout".into(),
        "-b".into(),
        args.min_bytes.to_string(),
        "-e".into(),
        args.max_bytes.to_string(),
        "-f".into(),
        args.factor.to_string(),
        "-d".into(),
        args.dtype.name().into(),
        "-o".into(),
        args.op.name().into(),
        "-n".into(),
        args.iters.to_string(),
        "-w".into(),
        args.warmup.to_string(),
    ]
}

/// Runs one NCCL configuration in a child process; its rows, or why there are none.
fn run_child(
    args: &BenchArgs,
    run: &NcclRun,
    lib_dir: Option<&Path>,
) -> Result<ChildOutput, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(child_args(args));
    for (k, v) in &run.set {
        cmd.env(k, v);
    }
    for k in &run.remove {
        cmd.env_remove(k);
    }
    if let Some(dir) = lib_dir {
        let mut paths = vec![dir.to_path_buf()];
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
            paths.extend(std::env::split_paths(&old));
        }
        if let Ok(joined) = std::env::join_paths(paths) {
            cmd.env("LD_LIBRARY_PATH", joined);
        }
    }
    let output = cmd
        .stderr(std::process::Stdio::piped())
        .output()
        .map_err(|e| format!("could not start the NCCL child: {e}"))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("(no message)");
        return Err(format!("{} ({})", last.trim(), output.status));
    }
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        out!("#   [{}] {line}", run.label);
    }
    // NCCL may print to stdout too (NCCL_DEBUG); the rows are the last line that is JSON.
    let stdout = String::from_utf8_lossy(&output.stdout);
    let json = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("{\"nccl_version\""))
        .ok_or_else(|| "the NCCL child printed no rows".to_string())?;
    for line in stdout
        .lines()
        .filter(|l| *l != json && !l.trim().is_empty())
    {
        out!("#   [{}] {line}", run.label);
    }
    let mut child: ChildOutput = serde_json::from_str(json)
        .map_err(|e| format!("the NCCL child's JSON could not be read: {e}"))?;
    for row in &mut child.rows {
        row.library = run.label.clone();
    }
    Ok(child)
}

/// cudarc does not look for `libnccl.so.2`: when NCCL is not found under its names but
/// `libnccl.so.2` exists, a private folder with a `libnccl.so` link to it, for the children's
/// `LD_LIBRARY_PATH`. `Ok(None)` when no link is needed (or there is nothing to link to).
fn nccl_link_dir() -> Result<Option<PathBuf>, String> {
    if baseline::nccl_present() {
        return Ok(None);
    }
    let Some(target) = baseline::find_libnccl_so2() else {
        return Ok(None);
    };
    let dir = std::env::temp_dir().join(format!("ringreduce-nccl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let link = dir.join("libnccl.so");
    let _ = std::fs::remove_file(&link);
    #[cfg(unix)]
    std::os::unix::fs::symlink(&target, &link)
        .map_err(|e| format!("linking {}: {e}", link.display()))?;
    out!(
        "# libnccl: cudarc looks for {:?}, not libnccl.so.2; for the NCCL runs, {} -> {} is put \
         first on LD_LIBRARY_PATH (by hand: the same link in a folder on LD_LIBRARY_PATH)",
        baseline::nccl_library_candidates(),
        link.display(),
        target.display()
    );
    Ok(Some(dir))
}

// ---------------------------------------------------------------------------------------------
// Measuring.
// ---------------------------------------------------------------------------------------------

/// The library under test, driven the same way.
enum Lib<'a> {
    Ring(&'a Communicator),
    Nccl(&'a NcclAllReduce),
}

/// One buffer per rank (inputs; in place, the results too) and, out of place, the outputs.
struct Bufs<T: Element> {
    inputs: Vec<GpuBuffer<T>>,
    outputs: Vec<GpuBuffer<T>>,
}

impl Lib<'_> {
    /// # Safety
    /// The buffers stay allocated and untouched until `synchronize` has returned.
    unsafe fn enqueue<T: Element>(
        &self,
        bufs: &mut Bufs<T>,
        in_place: bool,
        op: ReduceOp,
    ) -> ringreduce::Result<()> {
        // SAFETY: the caller's contract is each library's.
        unsafe {
            match (self, in_place) {
                (Lib::Ring(c), true) => c.enqueue_all_reduce_in_place(&mut bufs.inputs, op),
                (Lib::Ring(c), false) => c.enqueue_all_reduce(&bufs.inputs, &mut bufs.outputs, op),
                (Lib::Nccl(n), true) => n.enqueue_all_reduce_in_place(&mut bufs.inputs, op),
                (Lib::Nccl(n), false) => n.enqueue_all_reduce(&bufs.inputs, &mut bufs.outputs, op),
            }
        }
    }

    fn synchronize(&self) -> ringreduce::Result<()> {
        match self {
            Lib::Ring(c) => c.synchronize(),
            Lib::Nccl(n) => n.synchronize(),
        }
    }

    /// Records `event` on rank 0's stream.
    fn record(&self, event: &device::Event) -> ringreduce::Result<()> {
        match self {
            Lib::Ring(c) => {
                let stream = c.main_stream(0).ok_or_else(|| {
                    ringreduce::Error::InvalidArgument("not a GPU communicator".into())
                })?;
                // SAFETY: `stream` is rank 0's main stream, live while `c` is, in the primary
                // context of devices()[0], where `event` was made (see `measure_size`).
                unsafe { device::record_on_raw_stream(event, stream) }
            }
            Lib::Nccl(n) => match n.stream(0) {
                Some(stream) => device::record(event, stream),
                None => Err(ringreduce::Error::NoBuffers),
            },
        }
    }
}

/// Everything the sweep needs that does not change between sizes.
struct Sweep<'a> {
    args: &'a BenchArgs,
    devices: Vec<usize>,
    /// `iters + 1` timing events on rank 0's GPU.
    events: Vec<device::Event>,
}

impl Sweep<'_> {
    fn new(args: &BenchArgs, devices: Vec<usize>) -> ringreduce::Result<Sweep<'_>> {
        let ctx = device::context(devices[0])?;
        let events = (0..=args.iters.max(1))
            .map(|_| device::Event::with_timing(&ctx))
            .collect::<ringreduce::Result<_>>()?;
        Ok(Sweep {
            args,
            devices,
            events,
        })
    }

    /// Every size for `lib`, printed as it goes.
    fn run(&self, lib: &Lib, label: &str, print: bool) -> Result<Vec<Row>, Failure> {
        macro_rules! typed {
            ($($d:ident => $t:ty),*) => {
                match self.args.dtype {
                    $(DType::$d => self.run_typed::<$t>(lib, label, print),)*
                }
            };
        }
        typed!(F16 => half::f16, BF16 => half::bf16, F32 => f32, F64 => f64, I8 => i8,
               U8 => u8, I32 => i32, U32 => u32, I64 => i64, U64 => u64)
    }

    fn run_typed<T: Element>(
        &self,
        lib: &Lib,
        label: &str,
        print: bool,
    ) -> Result<Vec<Row>, Failure> {
        let args = self.args;
        let world = self.devices.len();
        let elem = std::mem::size_of::<T>();
        let mut rows = Vec::new();
        if print {
            out!("#");
            out!("# {label}");
            print_table_header();
        }
        for bytes in sizes(args.min_bytes, args.max_bytes, args.factor, elem) {
            let count = bytes / elem;
            let inputs: Vec<Vec<T>> = (0..world).map(|r| make_input(args.op, r, count)).collect();
            let want: Vec<T> = make_expected(args.op, world, count);
            let oop = self.measure::<T>(lib, &inputs, &want, false)?;
            let ip = self.measure::<T>(lib, &inputs, &want, true)?;
            let row = Row {
                library: label.to_string(),
                size_bytes: bytes as u64,
                count: count as u64,
                dtype: args.dtype.name().into(),
                redop: args.op.name().into(),
                algorithm: match lib {
                    Lib::Ring(comm) => {
                        let name = |in_place| {
                            format!("{:?}", comm.algorithm_for(bytes, in_place)).to_lowercase()
                        };
                        let (oop, ip) = (name(false), name(true));
                        Some(if oop == ip {
                            oop
                        } else {
                            format!("{oop}/{ip}")
                        })
                    }
                    _ => None,
                },
                out_of_place: oop,
                in_place: ip,
            };
            if print {
                print_row(&row);
            }
            rows.push(row);
        }
        Ok(rows)
    }

    /// One placement of one size: checked call, warm-up, back-to-back timing, event timing.
    fn measure<T: Element>(
        &self,
        lib: &Lib,
        inputs: &[Vec<T>],
        want: &[T],
        in_place: bool,
    ) -> ringreduce::Result<Measure> {
        let args = self.args;
        let count = want.len();
        let mut bufs = Bufs {
            inputs: self
                .devices
                .iter()
                .zip(inputs)
                .map(|(&d, x)| GpuBuffer::from_host(d, x))
                .collect::<ringreduce::Result<_>>()?,
            outputs: if in_place {
                Vec::new()
            } else {
                self.devices
                    .iter()
                    .map(|&d| GpuBuffer::zeroed(d, count))
                    .collect::<ringreduce::Result<_>>()?
            },
        };
        // Every enqueue below is followed by `lib.synchronize()` before `bufs` is read or dropped,
        // on the error paths too (`queue` waits before returning an error).
        let queue = |bufs: &mut Bufs<T>,
                     n: usize,
                     mut between: Option<&mut dyn FnMut(usize) -> ringreduce::Result<()>>|
         -> ringreduce::Result<()> {
            for i in 0..n {
                if let Some(f) = between.as_mut() {
                    if let Err(e) = f(i) {
                        let _ = lib.synchronize();
                        return Err(e);
                    }
                }
                // SAFETY: `bufs` is neither read nor dropped before the `synchronize` below (or
                // the one on this error path).
                if let Err(e) = unsafe { lib.enqueue(bufs, in_place, args.op) } {
                    let _ = lib.synchronize();
                    return Err(e);
                }
            }
            if let Some(f) = between.as_mut() {
                if let Err(e) = f(n) {
                    let _ = lib.synchronize();
                    return Err(e);
                }
            }
            lib.synchronize()
        };
        // Checked call.
        queue(&mut bufs, 1, None)?;
        let results = if in_place {
            &bufs.inputs
        } else {
            &bufs.outputs
        };
        let mut wrong = 0u64;
        for (rank, b) in results.iter().enumerate() {
            let (w, first) = compare(rank, &b.to_host()?, want, 3);
            wrong += w as u64;
            for m in first {
                eprintln!("ringreduce bench: wrong element {m} ({count} elements)");
            }
        }
        // Warm-up, then back-to-back iterations timed on the host.
        queue(&mut bufs, args.warmup, None)?;
        let n = args.iters.max(1);
        let start = Instant::now();
        queue(&mut bufs, n, None)?;
        let seconds = start.elapsed().as_secs_f64() / n as f64;
        // Per-iteration times: an event between consecutive iterations on rank 0's stream.
        let mut record = |i: usize| lib.record(&self.events[i]);
        queue(&mut bufs, n, Some(&mut record))?;
        let mut per_iter = (0..n)
            .map(|i| {
                device::event_elapsed_ms(&self.events[i], &self.events[i + 1])
                    .map(|ms| f64::from(ms) * 1e3)
            })
            .collect::<ringreduce::Result<Vec<f64>>>()?;
        let (min, median, p99) = percentiles(&mut per_iter);
        let bytes = std::mem::size_of_val(want);
        let algbw = algbw_gbps(bytes, seconds);
        Ok(Measure {
            time_us: seconds * 1e6,
            algbw_gbps: algbw,
            busbw_gbps: busbw_gbps(algbw, self.devices.len()),
            wrong,
            iter_min_us: min,
            iter_median_us: median,
            iter_p99_us: p99,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Printing.
// ---------------------------------------------------------------------------------------------

fn print_table_header() {
    out!(
        "#{:>11} {:>11} {:>5} {:>5} | {:>10} {:>8} {:>8} {:>6} | {:>10} {:>8} {:>8} {:>6} | {:>9} {:>9} {:>9} | algo",
        "size (B)", "count", "type", "redop", "oop (us)", "algbw", "busbw", "#wrong",
        "ip (us)", "algbw", "busbw", "#wrong", "it min", "it med", "it p99"
    );
}

fn print_row(r: &Row) {
    let m = |m: &Measure| {
        format!(
            "{:>10.2} {:>8.2} {:>8.2} {:>6}",
            m.time_us, m.algbw_gbps, m.busbw_gbps, m.wrong
        )
    };
    out!(
        " {:>11} {:>11} {:>5} {:>5} | {} | {} | {:>9.2} {:>9.2} {:>9.2} | {}",
        r.size_bytes,
        r.count,
        r.dtype,
        r.redop,
        m(&r.out_of_place),
        m(&r.in_place),
        r.out_of_place.iter_min_us,
        r.out_of_place.iter_median_us,
        r.out_of_place.iter_p99_us,
        r.algorithm.as_deref().unwrap_or("-")
    );
}

/// busbw ratio ringreduce / each NCCL run, per size (> 1: ringreduce is faster).
fn print_comparison(report: &Report, ring_label: &str, against: &[String]) {
    let others: Vec<&str> = against.iter().map(String::as_str).collect();
    if others.is_empty() {
        return;
    }
    out!("#");
    out!("# {ring_label} / NCCL: time(NCCL) / time(ringreduce), out of place | in place (> 1: ringreduce faster)");
    let mut head = format!("#{:>11}", "size (B)");
    for o in &others {
        head += &format!(" | {o}");
    }
    out!("{head}");
    for ring in report.rows.iter().filter(|r| r.library == ring_label) {
        let mut line = format!(" {:>11}", ring.size_bytes);
        for o in &others {
            let cell = report
                .rows
                .iter()
                .find(|r| r.library == *o && r.size_bytes == ring.size_bytes)
                .map_or_else(
                    || "n/a".to_string(),
                    |n| {
                        format!(
                            "{:.2} | {:.2}",
                            n.out_of_place.time_us / ring.out_of_place.time_us,
                            n.in_place.time_us / ring.in_place.time_us
                        )
                    },
                );
            line += &format!(" | {:>w$}", cell, w = o.len().max(11));
        }
        out!("{line}");
    }
}

// ---------------------------------------------------------------------------------------------
// Plot.
// ---------------------------------------------------------------------------------------------

/// Writes the plot to `path`: SVG as drawn, or PNG rasterised from the SVG (resvg, with the
/// system's fonts; where none are found the PNG has no text and a note says so).
pub fn write_plot(path: &Path, rows: &[Row], title: &str) -> Result<(), String> {
    let svg = render_svg(rows, title).map_err(|e| format!("plot {}: {e}", path.display()))?;
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    if is_png(path) {
        let mut options = resvg::usvg::Options::default();
        options.fontdb_mut().load_system_fonts();
        if options.fontdb.is_empty() {
            out!(
                "# note: no system fonts found: {} has no text (the SVG does)",
                path.display()
            );
        } else if let Some(family) = ["DejaVu Sans", "Liberation Sans", "Arial", "Noto Sans"]
            .into_iter()
            .find(|f| {
                options
                    .fontdb
                    .faces()
                    .any(|face| face.families.iter().any(|(n, _)| n == f))
            })
        {
            options.fontdb_mut().set_sans_serif_family(family);
        }
        let tree = resvg::usvg::Tree::from_str(&svg, &options).map_err(|e| err(&e))?;
        let size = tree.size().to_int_size();
        let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height())
            .ok_or_else(|| err(&"empty image"))?;
        resvg::render(
            &tree,
            resvg::tiny_skia::Transform::default(),
            &mut pixmap.as_mut(),
        );
        pixmap.save_png(path).map_err(|e| err(&e))
    } else {
        std::fs::write(path, svg).map_err(|e| err(&e))
    }
}

fn is_png(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("png"))
}

/// Draws busbw (left) and time (right) against size, out of place, one series per library, as
/// an SVG document.
pub fn render_svg(rows: &[Row], title: &str) -> Result<String, String> {
    let mut svg = String::new();
    draw(&mut svg, rows, title)?;
    Ok(svg)
}

fn draw(svg: &mut String, rows: &[Row], title: &str) -> Result<(), String> {
    use plotters::prelude::*;
    let mut libs: Vec<&str> = Vec::new();
    for r in rows {
        if !libs.contains(&r.library.as_str()) {
            libs.push(&r.library);
        }
    }
    let (smin, smax) = rows.iter().fold((f64::MAX, 1.0f64), |(lo, hi), r| {
        let s = r.size_bytes as f64;
        (lo.min(s), hi.max(s))
    });
    let smin = if smin > smax { 1.0 } else { smin };
    let bmax = rows
        .iter()
        .map(|r| r.out_of_place.busbw_gbps)
        .fold(1.0, f64::max)
        * 1.1;
    let (tmin, tmax) = rows.iter().fold((f64::MAX, 1.0f64), |(lo, hi), r| {
        (
            lo.min(r.out_of_place.time_us),
            hi.max(r.out_of_place.time_us),
        )
    });
    let tmin = if tmin > tmax {
        0.1
    } else {
        (tmin / 2.0).max(1e-3)
    };
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let root = SVGBackend::with_string(svg, (1400, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root
        .titled(title, ("sans-serif", 18))
        .map_err(|e| err(&e))?;
    let (left, right) = root.split_horizontally(700);
    let colors = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    let xr = (smin..smax * 1.5).log_scale();
    {
        let mut chart = ChartBuilder::on(&left)
            .caption("busbw (GB/s), out of place", ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(xr.clone(), 0.0..bmax)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("size (B)")
            .x_label_formatter(&|x| size_tick(*x))
            .y_desc("busbw (GB/s)")
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()
            .map_err(|e| err(&e))?;
        for (i, lib) in libs.iter().enumerate() {
            let c = colors[i % colors.len()];
            let pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.library == *lib)
                .map(|r| (r.size_bytes as f64, r.out_of_place.busbw_gbps))
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), c))
                .map_err(|e| err(&e))?
                .label(*lib)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
            chart
                .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, c.filled())))
                .map_err(|e| err(&e))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
    }
    {
        let mut chart = ChartBuilder::on(&right)
            .caption("time per all-reduce (us), out of place", ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(xr, (tmin..tmax * 2.0).log_scale())
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("size (B)")
            .x_label_formatter(&|x| size_tick(*x))
            .y_desc("time (us)")
            .y_label_formatter(&|y| format!("{y}"))
            .draw()
            .map_err(|e| err(&e))?;
        for (i, lib) in libs.iter().enumerate() {
            let c = colors[i % colors.len()];
            let pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.library == *lib)
                .map(|r| (r.size_bytes as f64, r.out_of_place.time_us))
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), c))
                .map_err(|e| err(&e))?
                .label(*lib)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
            chart
                .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, c.filled())))
                .map_err(|e| err(&e))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// An axis tick for a size in bytes: "8", "64K", "1M", "1G" (powers of 1024, as `-b`/`-e`).
fn size_tick(bytes: f64) -> String {
    let units = [(30, "G"), (20, "M"), (10, "K")];
    for (shift, unit) in units {
        let scale = (1u64 << shift) as f64;
        if bytes >= scale {
            return format!("{}{unit}", (bytes / scale * 10.0).round() / 10.0);
        }
    }
    format!("{}", bytes.round())
}

/// `Err` unless the plot path ends in `.svg` or `.png`.
pub fn check_plot_path(path: &Path) -> Result<(), String> {
    match path.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("svg") || e.eq_ignore_ascii_case("png") => Ok(()),
        _ => Err(format!(
            "--plot {}: the file must end in .svg or .png",
            path.display()
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// The command.
// ---------------------------------------------------------------------------------------------

pub fn run(args: &BenchArgs) -> Result<(), Failure> {
    if let Some(p) = &args.plot {
        check_plot_path(p)?;
    }
    if args.min_bytes > args.max_bytes {
        return Err(Failure::Failed(format!(
            "-b {} is larger than -e {}",
            args.min_bytes, args.max_bytes
        )));
    }
    if args.nccl_only {
        return run_nccl_only(args);
    }
    if let Some(source) = &args.from_json {
        let text = std::fs::read_to_string(source)
            .map_err(|e| Failure::Failed(format!("{}: {e}", source.display())))?;
        let report: Report = serde_json::from_str(&text).map_err(|e| {
            Failure::Failed(format!("{}: not a bench report: {e}", source.display()))
        })?;
        let Some(path) = &args.plot else {
            return Err(Failure::Failed(
                "--from-json needs --plot FILE.svg|.png".into(),
            ));
        };
        let when = report
            .header
            .iter()
            .find(|(k, _)| k == "date")
            .map_or(String::new(), |(_, v)| format!(", {v}"));
        let title = format!(
            "all-reduce, {}{when}{}",
            source.display(),
            knobs_suffix(report.chunk_bytes, report.slots)
        );
        write_plot(path, &report.rows, &title)?;
        out!("# plot: {}", path.display());
        return Ok(());
    }
    let n = require_gpus(2)?;
    let devices: Vec<usize> = (0..n).collect();
    let (chunk_bytes, slots) = (args.chunk.map(|b| b as u64), Some(args.slots as u64));
    let knobs = knobs_suffix(chunk_bytes, slots);
    let ring_label = format!(
        "ringreduce ({}{}{knobs})",
        format!("{:?}", args.transport).to_lowercase(),
        match args.algorithm {
            ringreduce::Algorithm::Auto => String::new(),
            a => format!(", {}", format!("{a:?}").to_lowercase()),
        }
    );

    let mut header: Vec<(String, String)> = Vec::new();
    let gpus = device::devices()?;
    header.push((
        "GPUs".into(),
        gpus.iter()
            .map(|d| {
                format!(
                    "{}: {} (sm_{}{}, PCI {})",
                    d.index, d.name, d.compute_capability.0, d.compute_capability.1, d.pci_bus_id
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
    ));
    let detected = ringreduce::topo::detect().ok();
    let driver = detected
        .as_ref()
        .and_then(|d| d.nvml_driver_version.clone())
        .unwrap_or_else(|| "unknown (NVML not loaded)".into());
    header.push(("driver".into(), driver));
    header.push((
        "CUDA".into(),
        device::driver_version()
            .map(|(a, b)| format!("{a}.{b} (driver API)"))
            .unwrap_or_else(|e| format!("unknown ({e})")),
    ));
    header.push(("reduce kernels".into(), kernels::build_kind().to_string()));
    header.push((
        "ringreduce".into(),
        format!("{} commit {}", env!("CARGO_PKG_VERSION"), commit()),
    ));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    header.push(("date".into(), utc_date(now)));
    header.push((
        "command".into(),
        std::env::args().collect::<Vec<_>>().join(" "),
    ));
    header.push((
        "timing".into(),
        format!(
            "time = host wall clock over -n {} back-to-back iterations incl. completion, after -w {} \
             warm-up, per size; it min/med/p99 = CUDA events on rank 0's stream between iterations \
             (separate pass, out of place); busbw = algbw * 2(n-1)/n, n = {n}; GB = 1e9 B; #wrong \
             from one checked call per size and placement",
            args.iters, args.warmup
        ),
    ));
    header.push((
        "ringreduce knobs".into(),
        format!(
            "{} (every ringreduce pass; not NCCL, not the one-shot)",
            crate::describe_knobs(args.chunk, args.slots)
        ),
    ));

    let mut not_measured = Vec::new();
    let (mut rows, against) = measure_pass(
        args,
        &devices,
        &ring_label,
        detected.as_ref(),
        &mut header,
        &mut not_measured,
    )?;
    let mut comparisons = vec![(ring_label.clone(), against)];
    // The staged fallback against NCCL's host path, in the same report (issue 4, point 2):
    // ringreduce's ring with every edge staged through pinned host memory, and NCCL with
    // NCCL_P2P_DISABLE=1. Up to 256 MiB (the staged path moves ~45 GB/s: a 1 GiB row alone
    // would take seconds per iteration).
    if args.transport != Transport::Staged && !args.no_staged {
        let staged = staged_pass_args(args);
        let label = format!("ringreduce (staged{knobs})");
        let (staged_rows, against) = measure_pass(
            &staged,
            &devices,
            &label,
            detected.as_ref(),
            &mut header,
            &mut not_measured,
        )?;
        rows.extend(staged_rows);
        comparisons.push((label, against));
    }
    let report = Report {
        header,
        chunk_bytes,
        slots,
        not_measured,
        rows,
    };
    for (label, against) in &comparisons {
        print_comparison(&report, label, against);
    }

    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        out!("# JSON: {}", path.display());
    }
    if let Some(path) = &args.plot {
        let title = format!("all-reduce {} {} on {n} GPUs{knobs}", args.dtype, args.op);
        write_plot(path, &report.rows, &title)?;
        out!("# plot: {}", path.display());
    }
    let wrong: u64 = report
        .rows
        .iter()
        .map(|r| r.out_of_place.wrong + r.in_place.wrong)
        .sum();
    if wrong > 0 {
        return Err(Failure::Failed(format!(
            "{wrong} wrong elements (see the #wrong columns)"
        )));
    }
    out!("# all results correct");
    Ok(())
}

/// Bytes per rank the staged pass of a default `bench` goes up to.
const STAGED_MAX_BYTES: usize = 256 << 20;

/// One pass of the report: ringreduce with `args`' transport and algorithm over the sweep, then
/// each NCCL configuration that matches it (in child processes). Returns the rows and the labels
/// of the NCCL runs measured, for the comparison table.
fn measure_pass(
    args: &BenchArgs,
    devices: &[usize],
    label: &str,
    detected: Option<&ringreduce::topo::Detected>,
    header: &mut Vec<(String, String)>,
    not_measured: &mut Vec<(String, String)>,
) -> Result<(Vec<Row>, Vec<String>), Failure> {
    let first = !header.iter().any(|(k, _)| k.ends_with(" links"));
    let printed = header.len();
    let comm = Communicator::with_config(devices, cuda_config(args))?;
    header.push((
        format!("{label} algorithm"),
        crate::describe_algorithm(&comm),
    ));
    let mut links = Vec::new();
    for e in comm.edges() {
        let link = detected.and_then(|d| {
            d.links
                .get(e.from_device)?
                .get(e.to_device)
                .copied()
                .flatten()
        });
        let kind = match link {
            Some(l) if l.is_nvlink() => format!("NVLink {l}"),
            Some(l) => format!("PCIe ({l})"),
            None => "link unknown".to_string(),
        };
        let probe = match &e.probe {
            Some(p) => format!(", probe {:.1} GB/s", p.measured_gb_per_s),
            None => String::new(),
        };
        links.push(format!(
            "GPU {} -> GPU {}: {kind}, ringreduce {:?} ({}){probe}",
            e.from_device, e.to_device, e.transport, e.reason
        ));
        if let Some(why) = e.slow() {
            out!(
                "# WARNING: edge GPU {} -> GPU {} is {why}",
                e.from_device,
                e.to_device
            );
        }
    }
    header.push((format!("{label} links"), links.join("; ")));
    if first {
        for (k, v) in header.iter() {
            out!("# {k}: {v}");
        }
    } else {
        for (k, v) in &header[printed..] {
            out!("# {k}: {v}");
        }
    }

    let sweep = Sweep::new(args, devices.to_vec())?;
    let mut rows = sweep.run(&Lib::Ring(&comm), label, true)?;
    drop(sweep);
    comm.close()?;

    let mut against = Vec::new();
    if args.no_nccl {
        not_measured.push(("NCCL".to_string(), "--no-nccl".to_string()));
    } else {
        let lib_dir = nccl_link_dir().unwrap_or_else(|why| {
            out!("# libnccl link folder could not be made: {why}");
            None
        });
        let nvls = std::env::var("NCCL_NVLS_ENABLE").ok();
        for nrun in nccl_runs(args.transport, nvls.as_deref()) {
            match run_child(args, &nrun, lib_dir.as_deref()) {
                Ok(child) => {
                    out!("#");
                    out!(
                        "# {} {} ({})",
                        nrun.label,
                        child.nccl_version,
                        nrun.set
                            .iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .join(" ")
                    );
                    print_table_header();
                    for r in &child.rows {
                        print_row(r);
                    }
                    header.push((nrun.label.clone(), format!("NCCL {}", child.nccl_version)));
                    against.push(nrun.label.clone());
                    rows.extend(child.rows);
                }
                Err(why) => {
                    out!("#");
                    out!("# {}: not measured: {why}", nrun.label);
                    not_measured.push((nrun.label.clone(), why));
                }
            }
        }
        if let Some(dir) = lib_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    Ok((rows, against))
}

/// The child: NCCL alone over the same sweep; JSON on stdout.
fn run_nccl_only(args: &BenchArgs) -> Result<(), Failure> {
    let n = require_gpus(2)?;
    let devices: Vec<usize> = (0..n).collect();
    let nccl = NcclAllReduce::new(&devices)?;
    let print = !args.json_stdout;
    let version = nccl.version().to_string();
    let sweep = Sweep::new(args, devices)?;
    let rows = sweep.run(&Lib::Nccl(&nccl), "NCCL", print);
    drop(sweep);
    let closed = nccl.close();
    let rows = rows?;
    closed?;
    if args.json_stdout {
        let text = serde_json::to_string(&ChildOutput {
            nccl_version: version,
            rows,
        })
        .map_err(|e| e.to_string())?;
        out!("{text}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn measure(t: f64) -> Measure {
        Measure {
            time_us: t,
            algbw_gbps: 1.5,
            busbw_gbps: 1.5,
            wrong: 0,
            iter_min_us: t * 0.9,
            iter_median_us: t,
            iter_p99_us: t * 1.2,
        }
    }

    fn row(library: &str, size: u64, t: f64) -> Row {
        Row {
            library: library.into(),
            size_bytes: size,
            count: size / 4,
            dtype: "f32".into(),
            redop: "sum".into(),
            algorithm: None,
            out_of_place: Measure {
                busbw_gbps: size as f64 / t / 1e3,
                ..measure(t)
            },
            in_place: measure(t * 1.01),
        }
    }

    #[test]
    fn sizes_parse_and_sweep() {
        assert_eq!(parse_bytes("8").unwrap(), 8);
        assert_eq!(parse_bytes("64K").unwrap(), 65536);
        assert_eq!(parse_bytes("256M").unwrap(), 256 << 20);
        assert_eq!(parse_bytes("1G").unwrap(), 1 << 30);
        assert!(parse_bytes("1X").is_err());
        let s = sizes(8, 1 << 30, 2, 4);
        assert_eq!(s.first(), Some(&8));
        assert_eq!(s.last(), Some(&(1 << 30)));
        assert_eq!(s.len(), 28);
        // Rounded to whole elements, at least one, no duplicates.
        assert_eq!(sizes(1, 64, 2, 8), vec![8, 16, 32, 64]);
        assert_eq!(sizes(6, 100, 4, 4), vec![4, 24, 96]);
    }

    #[test]
    fn busbw_formula() {
        assert_eq!(algbw_gbps(1_000_000_000, 1.0), 1.0);
        assert_eq!(busbw_gbps(100.0, 2), 100.0);
        assert_eq!(busbw_gbps(100.0, 4), 150.0);
        assert_eq!(busbw_gbps(100.0, 8), 175.0);
        assert_eq!(busbw_gbps(100.0, 1), 0.0);
    }

    #[test]
    fn percentiles_of_samples() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentiles(&mut v), (1.0, 50.5, 99.0));
        assert_eq!(percentiles(&mut [3.0]), (3.0, 3.0, 3.0));
        assert_eq!(percentiles(&mut [2.0, 1.0, 3.0]), (1.0, 2.0, 3.0));
        assert_eq!(percentiles(&mut []), (0.0, 0.0, 0.0));
    }

    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(utc_date(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc_date(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc_date(1_709_251_199), "2024-02-29 23:59:59 UTC");
        assert_eq!(utc_date(1_796_000_000), "2026-11-30 00:53:20 UTC");
        assert_eq!(utc_date(4_102_444_800), "2100-01-01 00:00:00 UTC");
    }

    #[test]
    fn json_rows_round_trip() {
        let report = Report {
            header: vec![("date".into(), utc_date(0))],
            chunk_bytes: Some(32 << 20),
            slots: Some(4),
            not_measured: vec![("NCCL".into(), "libnccl not found".into())],
            rows: vec![row("ringreduce (auto)", 8, 20.0), row("NCCL", 8, 17.5)],
        };
        let text = serde_json::to_string(&report).unwrap();
        assert!(
            text.contains("\"chunk_bytes\":33554432,\"slots\":4"),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Report>(&text).unwrap(), report);
        // The automatic chunk is written as null, not left out.
        let auto = Report {
            chunk_bytes: None,
            ..report.clone()
        };
        let text = serde_json::to_string(&auto).unwrap();
        assert!(text.contains("\"chunk_bytes\":null"), "{text}");
        assert_eq!(serde_json::from_str::<Report>(&text).unwrap(), auto);
        // A report from before --chunk/--slots (no such fields) still reads: automatic chunk,
        // slots not recorded.
        let mut old: serde_json::Value = serde_json::to_value(&report).unwrap();
        let fields = old.as_object_mut().unwrap();
        fields.remove("chunk_bytes");
        fields.remove("slots");
        let old: Report = serde_json::from_value(old).unwrap();
        assert_eq!((old.chunk_bytes, old.slots), (None, None));
        assert_eq!(old.rows, report.rows);
        let child = ChildOutput {
            nccl_version: "2.28.3".into(),
            rows: report.rows.clone(),
        };
        let text = serde_json::to_string(&child).unwrap();
        assert!(
            text.starts_with("{\"nccl_version\""),
            "run_child finds the rows so"
        );
        assert_eq!(serde_json::from_str::<ChildOutput>(&text).unwrap(), child);
    }

    #[test]
    fn svg_has_both_series() {
        let dir =
            std::env::temp_dir().join(format!("ringreduce-bench-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("plot.svg");
        let mut rows = Vec::new();
        for (i, size) in [8u64, 1 << 10, 1 << 20, 1 << 30].into_iter().enumerate() {
            rows.push(row("ringreduce (auto)", size, 20.0 * (i + 1) as f64));
            rows.push(row("NCCL (NCCL_ALGO=Ring)", size, 18.0 * (i + 1) as f64));
        }
        write_plot(&path, &rows, "synthetic").unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let png_path = dir.join("plot.png");
        write_plot(&png_path, &rows, "synthetic").unwrap();
        let png = std::fs::read(&png_path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
        assert!(svg.contains("ringreduce (auto)"));
        assert!(svg.contains("NCCL (NCCL_ALGO=Ring)"));
        // A PNG of the drawing's size (1400 × 560): signature, then IHDR width and height.
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), 1400);
        assert_eq!(u32::from_be_bytes(png[20..24].try_into().unwrap()), 560);
        // Not a blank canvas: the lines and text leave many distinct bytes after compression.
        assert!(png.len() > 10_000, "{} bytes", png.len());
        assert!(check_plot_path(Path::new("a.PNG")).is_ok());
        assert!(check_plot_path(Path::new("a.SVG")).is_ok());
        assert!(check_plot_path(Path::new("a.pdf"))
            .unwrap_err()
            .contains(".svg or .png"));
        assert_eq!(size_tick(8.0), "8");
        assert_eq!(size_tick(65536.0), "64K");
        assert_eq!(size_tick(1073741824.0), "1G");
    }

    #[derive(clap::Parser)]
    struct Wrap {
        #[command(subcommand)]
        command: Sub,
    }
    #[derive(clap::Subcommand)]
    enum Sub {
        Bench(BenchArgs),
    }

    fn parse(argv: &[&str]) -> Result<BenchArgs, clap::Error> {
        let argv = ["ringreduce", "bench"].iter().chain(argv);
        Wrap::try_parse_from(argv).map(|w| match w.command {
            Sub::Bench(args) => args,
        })
    }

    #[test]
    fn ring_knobs_reach_both_passes_and_the_labels() {
        let defaults = ringreduce::CudaConfig::default();
        // Left out: the library's defaults, and labels as before the flags.
        let args = parse(&[]).unwrap();
        assert_eq!((args.chunk, args.slots), (None, defaults.slots));
        let config = cuda_config(&args);
        assert_eq!(
            (config.chunk_bytes, config.slots),
            (defaults.chunk_bytes, defaults.slots)
        );
        assert_eq!(knobs_suffix(None, Some(defaults.slots as u64)), "");
        assert_eq!(knobs_suffix(None, None), "");

        let args = parse(&[
            "--chunk",
            "32M",
            "--slots",
            "4",
            "-b",
            "128M",
            "-e",
            "1G",
            "--algorithm",
            "oneshot",
        ])
        .unwrap();
        let config = cuda_config(&args);
        assert_eq!((config.chunk_bytes, config.slots), (Some(32 << 20), 4));
        assert_eq!(config.algorithm, ringreduce::Algorithm::OneShot);
        // The staged pass: staged ring up to 256 MiB, same knobs.
        let staged = cuda_config(&staged_pass_args(&args));
        assert_eq!((staged.chunk_bytes, staged.slots), (Some(32 << 20), 4));
        assert_eq!(
            (staged.transport, staged.algorithm),
            (Transport::Staged, ringreduce::Algorithm::Ring)
        );
        let staged = staged_pass_args(&args);
        assert_eq!(
            (staged.min_bytes, staged.max_bytes),
            (128 << 20, STAGED_MAX_BYTES)
        );
        assert_eq!(
            knobs_suffix(Some(32 << 20), Some(4)),
            ", chunk 32M, slots 4"
        );
        assert_eq!(knobs_suffix(None, Some(2)), ", chunk auto, slots 2");
        assert_eq!(knobs_suffix(Some(1000), None), ", chunk 1000");

        // 0 is refused when the flags are read, before any GPU is looked for.
        for bad in [&["--chunk", "0"][..], &["--slots", "0"], &["--chunk", "0M"]] {
            let err = parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} was accepted"));
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{bad:?}"
            );
        }
        assert_eq!(crate::format_bytes(32 << 20), "32M");
        assert_eq!(crate::format_bytes(1 << 30), "1G");
        assert_eq!(crate::format_bytes(1536), "1536");
        assert_eq!(crate::format_bytes(3 << 10), "3K");
        for text in ["1", "4K", "128M", "2G", "1000"] {
            assert_eq!(crate::format_bytes(parse_bytes(text).unwrap()), text);
        }
    }

    #[test]
    fn child_command_line_round_trips() {
        let Sub::Bench(args) = Wrap::parse_from([
            "ringreduce",
            "bench",
            "-b",
            "1K",
            "-e",
            "64M",
            "-f",
            "4",
            "-d",
            "bf16",
            "-o",
            "max",
            "-n",
            "7",
            "-w",
            "2",
            "--transport",
            "staged",
            "--json",
            "x.json",
        ])
        .command;
        let argv = child_args(&args);
        let Sub::Bench(child) =
            Wrap::parse_from(std::iter::once("ringreduce".to_string()).chain(argv)).command;
        assert!(child.nccl_only && child.json_stdout);
        assert_eq!(
            (child.min_bytes, child.max_bytes, child.factor),
            (1024, 64 << 20, 4)
        );
        assert_eq!((child.dtype, child.op), (DType::BF16, ReduceOp::Max));
        assert_eq!((child.iters, child.warmup), (7, 2));
        assert!(child.json.is_none() && child.plot.is_none());
        // The ring knobs are ringreduce's: never passed to the NCCL child.
        let Sub::Bench(with_knobs) =
            Wrap::parse_from(["ringreduce", "bench", "--chunk", "32M", "--slots", "4"]).command;
        assert!(child_args(&with_knobs)
            .iter()
            .all(|a| a != "--chunk" && a != "--slots"));

        let runs = nccl_runs(Transport::Staged, None);
        assert_eq!(runs.len(), 2);
        let env = |r: &NcclRun, k: &str| {
            r.set
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        };
        assert!(runs
            .iter()
            .all(|r| env(r, "NCCL_NVLS_ENABLE").as_deref() == Some("0")));
        assert!(runs
            .iter()
            .all(|r| env(r, "NCCL_P2P_DISABLE").as_deref() == Some("1")));
        assert_eq!(env(&runs[1], "NCCL_ALGO").as_deref(), Some("Ring"));
        assert!(runs[0].remove.contains(&"NCCL_ALGO".to_string()));
        let runs = nccl_runs(Transport::Auto, Some("0"));
        assert_eq!(runs[0].label, "NCCL");
        assert_eq!(runs[1].label, "NCCL (NCCL_ALGO=Ring)");
        assert!(runs.iter().all(|r| env(r, "NCCL_P2P_DISABLE").is_none()));
    }
}
