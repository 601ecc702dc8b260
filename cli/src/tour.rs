//! `ringreduce tour`: the four checks of the multi-GPU article's companion benchmark, in its order,
//! as a one-command overview of a machine — each step prints what it measured and one verdict line
//! (PASS / WARN / FAIL and why), and a summary repeats the four verdicts at the end.
//!
//! 1. **Peer access** ([`crate::topo::gather`]): can every GPU reach every other directly? A missing
//!    direction is not an error — copies still work, staged through host memory — so it is a WARN.
//! 2. **P2P bandwidth** ([`crate::p2p::measure`]): the path table and the n×n matrix; any figure
//!    flagged SLOW (far below its link, or below the staged path) is a WARN: silent degradation.
//! 3. **Cross-GPU sync** ([`crate::sync::measure`]): the event handoff must read no stale value
//!    (FAIL otherwise); the pitfall's stale count is shown, not judged.
//! 4. **All-reduce against NCCL**: ringreduce's ring on all GPUs at 1 MiB, 64 MiB and 256 MiB,
//!    every element checked (FAIL on any wrong one), timed as `ringreduce run` times it; then NCCL
//!    at the same sizes through [`ringreduce_cli::baseline::NcclAllReduce`], timed the same way, when
//!    this process finds NCCL as the library does (otherwise the step says how to name it:
//!    `RINGREDUCE_NCCL_PATH`, or its folder on `LD_LIBRARY_PATH`). The verdict judges ringreduce;
//!    NCCL's figures are the yardstick.
//!
//! The steps reuse those commands' functions: no measurement is written twice. A step that errors
//! is a FAIL and the tour goes on; the exit code is 1 when any step failed, 3 without a GPU.

use crate::Failure;
use ringreduce::{Communicator, CudaConfig};

#[derive(clap::Args, Clone, Debug)]
pub struct TourArgs {
    /// Bytes per bandwidth copy in the P2P step (suffixes K, M, G).
    #[arg(long, default_value = "256M", value_parser = crate::parse_bytes)]
    pub bytes: usize,
    /// Iterations of the sync step.
    #[arg(long, default_value_t = 1000)]
    pub sync_iters: usize,
}

/// A step's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Warn,
    Fail,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "PASS",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
        })
    }
}

/// One step's verdict line.
#[derive(Clone, Debug)]
pub struct StepResult {
    pub step: &'static str,
    pub verdict: Verdict,
    pub why: String,
}

/// One step: its verdict and why, after printing what it measured.
type Step = fn(&TourArgs) -> Result<(Verdict, String), Failure>;

/// All-reduce sizes of step 4, bytes per rank.
const ALL_REDUCE_BYTES: [usize; 3] = [1 << 20, 64 << 20, 256 << 20];

pub fn run(args: &TourArgs) -> Result<(), Failure> {
    crate::require_gpus(1)?;
    let steps: [(&'static str, Step); 4] = [
        ("1 peer access", peer_access),
        ("2 P2P bandwidth", bandwidth),
        ("3 cross-GPU sync", sync),
        ("4 all-reduce", all_reduce),
    ];
    let mut results = Vec::new();
    for (step, f) in steps {
        out!("");
        out!("## step {step}");
        let (verdict, why) = match f(args) {
            Ok(v) => v,
            Err(Failure::NoGpu(e) | Failure::Failed(e) | Failure::Usage(e)) => (Verdict::Fail, e),
        };
        out!("{verdict} {step}: {why}");
        results.push(StepResult { step, verdict, why });
    }
    out!("");
    out!("## summary");
    for r in &results {
        out!("{} {}: {}", r.verdict, r.step, r.why);
    }
    let failed = results
        .iter()
        .filter(|r| r.verdict == Verdict::Fail)
        .count();
    if failed > 0 {
        return Err(Failure::Failed(format!("tour: {failed} of 4 steps failed")));
    }
    Ok(())
}

fn peer_access(_args: &TourArgs) -> Result<(Verdict, String), Failure> {
    let report = crate::topo::gather()?;
    crate::topo::print(&report);
    let n = report.devices.len();
    let unknown = if report.detected.notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", report.detected.notes.join("; "))
    };
    if n < 2 {
        return Ok((
            Verdict::Warn,
            format!("one GPU: no peers to check{unknown}"),
        ));
    }
    let missing = report.pairs_without_peer();
    let total = n * (n - 1);
    if missing.is_empty() {
        Ok((
            Verdict::Pass,
            format!("all {total} directions have peer access{unknown}"),
        ))
    } else {
        let list: Vec<String> = missing.iter().map(|(a, b)| format!("{a}→{b}")).collect();
        Ok((
            Verdict::Warn,
            format!(
                "{} of {total} directions without peer access ({}): those copies are staged \
                 through host memory{unknown}",
                missing.len(),
                list.join(", ")
            ),
        ))
    }
}

fn bandwidth(args: &TourArgs) -> Result<(Verdict, String), Failure> {
    let p2p_args = crate::p2p::P2pArgs {
        bytes: args.bytes,
        chunk: (4 << 20).min(args.bytes.max(1)),
        ..Default::default()
    };
    let report = crate::p2p::measure(&p2p_args)?;
    crate::p2p::print(&report);
    let slow = report.slow_count();
    let Some((a, b)) = report.pair else {
        return Ok((
            Verdict::Warn,
            "one GPU: only host and local copies measured".to_string(),
        ));
    };
    let figure = |prefix: &str| {
        report
            .gbps(prefix)
            .map_or_else(|| "?".to_string(), |g| format!("{g:.1}"))
    };
    let summary = format!(
        "GPU{a}→GPU{b} peer {} GB/s one way, {} both ways, {} with access off, staged {}",
        figure("peer one way"),
        figure("peer both ways"),
        figure("peer, access off GPU"),
        figure("staged, serial"),
    );
    if slow == 0 {
        Ok((Verdict::Pass, format!("{summary}; no edge SLOW")))
    } else {
        Ok((
            Verdict::Warn,
            format!("{summary}; {slow} figure(s) SLOW: check peer access / pool access / ACS"),
        ))
    }
}

fn sync(args: &TourArgs) -> Result<(Verdict, String), Failure> {
    let sync_args = crate::sync::SyncArgs {
        iters: args.sync_iters.max(1),
        ..Default::default()
    };
    let report = crate::sync::measure(&sync_args)?;
    crate::sync::print(&report);
    let why = format!(
        "handoff {} stale / {} wrong of {}; pitfall (wait before record) {} stale",
        report.handoff.stale, report.handoff.wrong, report.iters, report.pitfall.stale
    );
    Ok((
        if report.handoff_ok() {
            Verdict::Pass
        } else {
            Verdict::Fail
        },
        why,
    ))
}

fn all_reduce(_args: &TourArgs) -> Result<(Verdict, String), Failure> {
    let n = crate::require_gpus(1)?;
    let (devices, shared) = if n == 1 {
        (vec![0, 0], true)
    } else {
        ((0..n).collect::<Vec<_>>(), false)
    };
    let config = CudaConfig {
        allow_shared_device: shared,
        ..Default::default()
    };
    let comm = Communicator::with_config(&devices, config)?;
    let world = comm.world();
    out!("# ringreduce all-reduce, f32 sum, out of place, ranks on GPUs {devices:?}");
    out!(
        "{:>12} {:>12} {:>10} {:>10} {:>8}",
        "size (B)",
        "time (us)",
        "algbw",
        "busbw",
        "#wrong"
    );
    let mut parts = Vec::new();
    let mut wrong_total = 0;
    let mut outcome = Ok(());
    for bytes in ALL_REDUCE_BYTES {
        match crate::run::time_gpu(&comm, bytes / 4, false) {
            Ok((time, wrong)) => {
                let algbw = crate::bench::algbw_gbps(bytes, time.as_secs_f64());
                let busbw = crate::bench::busbw_gbps(algbw, world);
                out!(
                    "{bytes:>12} {:>12.1} {algbw:>10.2} {busbw:>10.2} {wrong:>8}",
                    time.as_secs_f64() * 1e6
                );
                wrong_total += wrong;
                parts.push(format!("{} MiB {busbw:.0} GB/s busbw", bytes >> 20));
            }
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    // Close even after an error, so the communicator's threads and memory are released.
    let closed = comm.close();
    outcome?;
    closed?;
    let nccl = nccl_comparison(&devices, world);
    if wrong_total > 0 {
        Ok((
            Verdict::Fail,
            format!("{wrong_total} wrong elements; {}; {nccl}", parts.join(", ")),
        ))
    } else {
        Ok((
            Verdict::Pass,
            format!("all results correct; {}; {nccl}", parts.join(", ")),
        ))
    }
}

/// NCCL at the same sizes through [`ringreduce_cli::baseline::NcclAllReduce`], when this process
/// finds it; otherwise why not. One line for the verdict; the table rows are printed here. NCCL's
/// own failures are reported, not judged: the step judges ringreduce.
fn nccl_comparison(devices: &[usize], world: usize) -> String {
    use ringreduce_cli::baseline::{self, NcclAllReduce};
    if world < 2 || devices.windows(2).any(|w| w[0] == w[1]) {
        return "NCCL comparison needs two GPUs".to_string();
    }
    if let Some(why) = baseline::nccl_missing() {
        return format!("NCCL not loadable in this process: {why}");
    }
    let nccl = match NcclAllReduce::new(devices) {
        Ok(nccl) => nccl,
        Err(e) => return format!("NCCL did not start ({e}): compare with `ringreduce bench`"),
    };
    out!(
        "# NCCL {} all-reduce, f32 sum, out of place, same sizes and timing",
        nccl.version()
    );
    let mut parts = Vec::new();
    for bytes in ALL_REDUCE_BYTES {
        match time_nccl(&nccl, devices, bytes / 4) {
            Ok((time, wrong)) => {
                let algbw = crate::bench::algbw_gbps(bytes, time.as_secs_f64());
                let busbw = crate::bench::busbw_gbps(algbw, world);
                out!(
                    "{bytes:>12} {:>12.1} {algbw:>10.2} {busbw:>10.2} {wrong:>8}",
                    time.as_secs_f64() * 1e6
                );
                parts.push(format!("{} MiB {busbw:.0}", bytes >> 20));
            }
            Err(e) => {
                parts.push(format!("{} MiB failed ({e})", bytes >> 20));
                break;
            }
        }
    }
    let version = nccl.version().to_string();
    if let Err(e) = nccl.close() {
        parts.push(format!("close failed ({e})"));
    }
    format!("NCCL {version}: {} GB/s busbw", parts.join(", "))
}

/// [`crate::run::time_gpu`]'s procedure for NCCL: one checked call, a warm-up, then back-to-back
/// iterations timed on the host clock until the streams are synchronized.
fn time_nccl(
    nccl: &ringreduce_cli::baseline::NcclAllReduce,
    devices: &[usize],
    count: usize,
) -> Result<(std::time::Duration, usize), ringreduce::Error> {
    use ringreduce::verify::{compare, make_expected, make_input};
    use ringreduce::{Error, GpuBuffer, ReduceOp};
    let op = ReduceOp::Sum;
    let ins: Vec<GpuBuffer<f32>> = devices
        .iter()
        .enumerate()
        .map(|(rank, &d)| GpuBuffer::from_host(d, &make_input::<f32>(op, rank, count)))
        .collect::<ringreduce::Result<_>>()?;
    let mut outs: Vec<GpuBuffer<f32>> = devices
        .iter()
        .map(|&d| GpuBuffer::zeroed(d, count))
        .collect::<ringreduce::Result<_>>()?;
    // Every enqueue is followed by a synchronize, also when it failed, before the buffers drop.
    let settle = |r: Result<(), Error>| -> Result<(), Error> {
        let synced = nccl.synchronize();
        r.and(synced)
    };
    // SAFETY: `ins` and `outs` live until the end of this function, after every synchronize
    // below; nothing reads or writes them between an enqueue and the synchronize that follows.
    settle(unsafe { nccl.enqueue_all_reduce(&ins, &mut outs, op) })?;
    let want = make_expected::<f32>(op, devices.len(), count);
    let mut wrong = 0;
    for (rank, b) in outs.iter().enumerate() {
        wrong += compare(rank, &b.to_host()?, &want, 0).0;
    }
    let iterations = ((1usize << 30) / (count * 4).max(1)).clamp(5, 200);
    let mut go = |n: usize| -> Result<std::time::Duration, Error> {
        let start = std::time::Instant::now();
        let mut enqueued = Ok(());
        for _ in 0..n {
            // SAFETY: as above.
            enqueued = unsafe { nccl.enqueue_all_reduce(&ins, &mut outs, op) };
            if enqueued.is_err() {
                break;
            }
        }
        settle(enqueued)?;
        Ok(start.elapsed() / n as u32)
    };
    go(iterations.min(20))?;
    let time = go(iterations)?;
    Ok((time, wrong))
}
