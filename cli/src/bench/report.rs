//! What `bench` reports: one [`Row`] per size and library (out of place and in place), the
//! [`Report`] that `--json` writes and `--from-json` reads, the child's [`ChildOutput`], the
//! header (machine, versions, commit, date) and the nccl-tests-style tables printed as it goes.
//!
//! Invariant: a report written by any version of `bench` still reads — fields added later
//! (`chunk_bytes`, `slots`) have defaults that say what the older runs did.

use super::args::BenchArgs;
use super::collective::BenchCollective;
use super::random::RandomRun;
use super::torch::TorchReport;
use crate::Failure;
use ringreduce::device;
use ringreduce::exec::cuda as kernels;
use serde::{Deserialize, Serialize};
use std::time::{SystemTime, UNIX_EPOCH};

/// One placement's numbers for one size. The optional fields are absent in reports written
/// before they were measured.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iter_mean_us: Option<f64>,
    /// Call-to-completion latency: each call timed on the host from the call to the end of the
    /// wait for its completion (`-n` calls; with `--graph N`, one replay / N).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_median_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_p99_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_mean_us: Option<f64>,
    /// With `--profile-host`: where ringreduce's host time went in the call pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_profile: Option<HostProfile>,
}

/// Median host time per phase (µs), in the order the phases end (`ringreduce::exec::profile`),
/// for each kind of call: the call pass's enqueue and synchronize, and blocking calls.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostProfile {
    pub enqueue: Vec<(String, f64)>,
    pub synchronize: Vec<(String, f64)>,
    pub blocking: Vec<(String, f64)>,
}

impl HostProfile {
    /// Per phase, the median over the calls it ended in of its time (µs), in the order phases
    /// first ended, then `total`: the median of the calls' whole times (not the sum of the
    /// medians). A phase that ends several times in one call (a launch per rank) is numbered
    /// from its second: `launch`, `launch 2`, …
    pub fn medians(calls: &[ringreduce::exec::profile::CallProfile]) -> Vec<(String, f64)> {
        let mut order: Vec<String> = Vec::new();
        let mut samples: std::collections::HashMap<String, Vec<f64>> = Default::default();
        for call in calls {
            let mut seen: std::collections::HashMap<&str, usize> = Default::default();
            for (phase, time) in &call.phases {
                let k = seen.entry(phase.name()).or_insert(0);
                *k += 1;
                let label = match *k {
                    1 => phase.name().to_string(),
                    k => format!("{} {k}", phase.name()),
                };
                if !samples.contains_key(&label) {
                    order.push(label.clone());
                }
                samples
                    .entry(label)
                    .or_default()
                    .push(time.as_secs_f64() * 1e6);
            }
        }
        let mut totals: Vec<f64> = calls
            .iter()
            .map(|c| c.total().as_secs_f64() * 1e6)
            .collect();
        order
            .into_iter()
            .map(|label| {
                let mut s = samples.remove(&label).unwrap_or_default();
                let (_, median, _) = super::stats::percentiles(&mut s);
                (label, median)
            })
            .chain((!totals.is_empty()).then(|| {
                (
                    "total".to_string(),
                    super::stats::percentiles(&mut totals).1,
                )
            }))
            .collect()
    }
}

/// `--profile-host`: one line per size and placement with its phases' medians.
pub fn print_host_profiles(rows: &[Row]) {
    out!("#");
    out!("# host time per call (--profile-host): median µs per phase (ringreduce::exec::profile)");
    let line = |phases: &[(String, f64)]| {
        let each: Vec<String> = phases.iter().map(|(p, t)| format!("{p} {t:.2}")).collect();
        each.join(", ")
    };
    for row in rows {
        for (placement, m) in [("oop", &row.out_of_place), ("ip", &row.in_place)] {
            let Some(p) = &m.host_profile else { continue };
            out!(
                "# {} {:>10} B {placement:>3} {} | enqueue: {} | synchronize: {} | blocking: {}",
                row.collective.name(),
                row.size_bytes,
                row.algorithm.as_deref().unwrap_or("-"),
                line(&p.enqueue),
                line(&p.synchronize),
                line(&p.blocking)
            );
        }
    }
}

/// The consistency bounds a row is held to: p99 at most 1.5× the median, the mean within 1.2× of
/// the median (of the call-to-completion latency; of the per-iteration times where a report has
/// no call latency).
pub const P99_OVER_MEDIAN_MAX: f64 = 1.5;
pub const MEAN_OVER_MEDIAN_MAX: f64 = 1.2;

impl Measure {
    /// (p99 / median, mean / median) of the call latency, else of the per-iteration times;
    /// `None` when neither has a median and a mean.
    pub fn consistency(&self) -> Option<(f64, f64)> {
        let (median, p99, mean) = match (self.call_median_us, self.call_p99_us, self.call_mean_us) {
            (Some(m), Some(p), Some(a)) => (m, p, a),
            _ => (self.iter_median_us, self.iter_p99_us, self.iter_mean_us?),
        };
        (median > 0.0).then(|| (p99 / median, mean / median))
    }

    /// Whether [`Measure::consistency`] breaks [`P99_OVER_MEDIAN_MAX`] or
    /// [`MEAN_OVER_MEDIAN_MAX`].
    pub fn inconsistent(&self) -> bool {
        self.consistency()
            .is_some_and(|(p99, mean)| p99 > P99_OVER_MEDIAN_MAX || mean > MEAN_OVER_MEDIAN_MAX)
    }
}

/// One size of one library: nccl-tests' row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// "ringreduce (auto)", "NCCL", "NCCL (NCCL_ALGO=Ring)", ...
    pub library: String,
    /// The collective (nccl-tests' name); absent in reports from before `--collective`, which
    /// measured the all-reduce alone.
    #[serde(default = "all_reduce")]
    pub collective: BenchCollective,
    pub size_bytes: u64,
    pub count: u64,
    pub dtype: String,
    pub redop: String,
    /// The algorithm ringreduce ran at this size, as it says (`last_ran`: "ring", "oneshot", or
    /// "oneshot/twoshot" out of place / in place); absent for NCCL and for a row that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<String>,
    pub out_of_place: Measure,
    pub in_place: Measure,
    /// Why this size has no numbers (a failed capture with `--graph`); both measures are zero.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Everything a run says: the header lines, ringreduce's ring knobs and every row. What `--json`
/// writes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub header: Vec<(String, String)>,
    /// The collectives measured, in order (`--collective` or `--all`); absent in reports from
    /// before the flag: the all-reduce.
    #[serde(default = "all_reduce_only")]
    pub collectives: Vec<BenchCollective>,
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
    /// `--sizes random`: each library's random-size workload.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub random: Vec<RandomRun>,
    /// `--torch-json`: PyTorch's symmetric-memory all-reduces, from the script's JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch: Option<TorchReport>,
}

/// What a `--nccl-only --json-stdout` child prints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChildOutput {
    pub nccl_version: String,
    pub rows: Vec<Row>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub random: Vec<RandomRun>,
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

fn all_reduce() -> BenchCollective {
    BenchCollective::AllReduce
}

fn all_reduce_only() -> Vec<BenchCollective> {
    vec![BenchCollective::AllReduce]
}

/// The header of a report: (name, value) lines, in the order they are printed.
pub type Header = Vec<(String, String)>;

/// The report's header for a run on `n` GPUs: the machine (GPUs, driver, CUDA), the build
/// (kernels, commit), the date, the command line, how the times are taken and ringreduce's ring
/// knobs; and the detected topology, for the links of each pass.
pub fn machine_header(
    args: &BenchArgs,
    n: usize,
) -> Result<(Header, Option<ringreduce::topo::Detected>), Failure> {
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
    header.push(("reduce kernels".into(), kernels::build_kind()));
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
             (separate pass); call med/p99 = -n blocking calls, each timed on the host from the \
             call to its completion; p99/med, mean/med of the call times (! = p99 > {}x or mean \
             > {}x the median); the last four out of place; size = nccl-tests' S, algbw = S / time, \
             busbw = algbw * nccl-tests' factor ({}), n = {n}; GB = 1e9 B; #wrong from one \
             checked call per size and placement against the host reference{}{}",
            args.iters,
            args.warmup,
            P99_OVER_MEDIAN_MAX,
            MEAN_OVER_MEDIAN_MAX,
            args.collectives()
                .iter()
                .map(|c| format!("{} {}", c.name(), c.busbw_formula()))
                .collect::<Vec<_>>()
                .join(", "),
            if args.collectives().iter().any(|c| c.root().is_some()) {
                format!("; root {}", super::collective::ROOT)
            } else {
                String::new()
            },
            match args.graph {
                Some(g) => format!(
                    "; graph rows: {g} calls captured per CUDA graph (one per rank's \
                     stream), -n/-w count replays, every time divided by {g}, #wrong also from \
                     one replay out of place"
                ),
                None => String::new(),
            }
        ),
    ));
    header.push((
        "ringreduce knobs".into(),
        format!(
            "{} (every ringreduce pass; not NCCL, not the one-shot)",
            crate::describe_knobs(args.chunk, args.slots)
        ),
    ));

    Ok((header, detected))
}

pub(super) fn print_table_header() {
    out!(
        "#{:>11} {:>11} {:>5} {:>5} | {:>10} {:>8} {:>8} {:>6} | {:>10} {:>8} {:>8} {:>6} | {:>9} {:>9} {:>9} | {:>9} {:>9} {:>7} {:>8} | algo",
        "size (B)", "count", "type", "redop", "oop (us)", "algbw", "busbw", "#wrong",
        "ip (us)", "algbw", "busbw", "#wrong", "it min", "it med", "it p99",
        "call med", "call p99", "p99/med", "mean/med"
    );
}

pub(super) fn print_row(r: &Row) {
    if let Some(e) = &r.error {
        out!(
            " {:>11} {:>11} {:>5} {:>5} | not measured: {e}",
            r.size_bytes,
            r.count,
            r.dtype,
            r.redop
        );
        return;
    }
    let m = |m: &Measure| {
        format!(
            "{:>10.2} {:>8.2} {:>8.2} {:>6}",
            m.time_us, m.algbw_gbps, m.busbw_gbps, m.wrong
        )
    };
    let in_place = if r.collective.has_in_place() {
        m(&r.in_place)
    } else {
        format!("{:>10} {:>8} {:>8} {:>6}", "n/a", "", "", "")
    };
    let o = &r.out_of_place;
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    let (p99, mean) = o
        .consistency()
        .map_or(("-".to_string(), "-".to_string()), |(p, m)| {
            (format!("{p:.2}"), format!("{m:.2}"))
        });
    out!(
        " {:>11} {:>11} {:>5} {:>5} | {} | {} | {:>9.2} {:>9.2} {:>9.2} | {:>9} {:>9} {:>7} {:>7}{} | {}",
        r.size_bytes,
        r.count,
        r.dtype,
        r.redop,
        m(&r.out_of_place),
        in_place,
        o.iter_min_us,
        o.iter_median_us,
        o.iter_p99_us,
        opt(o.call_median_us),
        opt(o.call_p99_us),
        p99,
        mean,
        if o.inconsistent() { "!" } else { " " },
        r.algorithm.as_deref().unwrap_or("-")
    );
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn measure(t: f64) -> Measure {
        Measure {
            time_us: t,
            algbw_gbps: 1.5,
            busbw_gbps: 1.5,
            wrong: 0,
            iter_min_us: t * 0.9,
            iter_median_us: t,
            iter_p99_us: t * 1.2,
            iter_mean_us: Some(t * 1.05),
            call_median_us: Some(t + 2.0),
            call_p99_us: Some(t + 3.0),
            call_mean_us: Some(t + 2.5),
            host_profile: None,
        }
    }

    pub(in crate::bench) fn row(library: &str, size: u64, t: f64) -> Row {
        Row {
            library: library.into(),
            collective: BenchCollective::AllReduce,
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
            error: None,
        }
    }

    #[test]
    fn consistency_flags_rows_past_the_bounds() {
        let mut m = measure(10.0);
        // Call median 12, p99 13, mean 12.5 (see `measure`).
        let (p99, mean) = m.consistency().unwrap();
        assert!((p99 - 13.0 / 12.0).abs() < 1e-12 && (mean - 12.5 / 12.0).abs() < 1e-12);
        assert!(!m.inconsistent());
        m.call_p99_us = Some(18.1); // > 1.5 × 12
        assert!(m.inconsistent());
        m.call_p99_us = Some(18.0);
        assert!(!m.inconsistent(), "exactly 1.5× is within the bound");
        m.call_mean_us = Some(14.5); // > 1.2 × 12
        assert!(m.inconsistent());
        // Per-iteration times when there is no call latency.
        m.call_median_us = None;
        let (p99, mean) = m.consistency().unwrap();
        assert!((p99 - 1.2).abs() < 1e-12 && (mean - 1.05).abs() < 1e-12);
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
        let mut gather = row("NCCL", 96, 20.0);
        gather.collective = BenchCollective::AllGather;
        let report = Report {
            header: vec![("date".into(), utc_date(0))],
            collectives: vec![BenchCollective::AllReduce, BenchCollective::AllGather],
            chunk_bytes: Some(32 << 20),
            slots: Some(4),
            not_measured: vec![("NCCL".into(), "libnccl not found".into())],
            rows: vec![
                row("ringreduce (auto)", 8, 20.0),
                row("NCCL", 8, 17.5),
                gather,
            ],
            random: Vec::new(),
            torch: None,
        };
        let text = serde_json::to_string(&report).unwrap();
        assert!(
            text.contains("\"chunk_bytes\":33554432,\"slots\":4"),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Report>(&text).unwrap(), report);
        assert!(
            text.contains("\"collectives\":[\"all_reduce\",\"all_gather\"]"),
            "{text}"
        );
        assert!(text.contains("\"collective\":\"all_gather\""), "{text}");
        // A report from before --collective (no collective anywhere) reads as the all-reduce.
        let mut old: serde_json::Value = serde_json::to_value(&report).unwrap();
        old.as_object_mut().unwrap().remove("collectives");
        for row in old["rows"].as_array_mut().unwrap() {
            assert!(row.as_object_mut().unwrap().remove("collective").is_some());
        }
        let old: Report = serde_json::from_value(old).unwrap();
        assert_eq!(old.collectives, [BenchCollective::AllReduce]);
        assert!(old
            .rows
            .iter()
            .all(|r| r.collective == BenchCollective::AllReduce));
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
        // A report from before the call latency, graph errors, random runs and PyTorch: the
        // fields are absent and read as None / empty.
        let mut old: serde_json::Value = serde_json::to_value(&report).unwrap();
        for row in old["rows"].as_array_mut().unwrap() {
            for placement in ["out_of_place", "in_place"] {
                let m = row[placement].as_object_mut().unwrap();
                for f in [
                    "iter_mean_us",
                    "call_median_us",
                    "call_p99_us",
                    "call_mean_us",
                ] {
                    assert!(m.remove(f).is_some(), "{f}");
                }
            }
        }
        let old: Report = serde_json::from_value(old).unwrap();
        assert!(old.random.is_empty() && old.torch.is_none());
        assert_eq!(old.rows[0].out_of_place.call_median_us, None);
        assert_eq!(old.rows[0].error, None);
        // Without call times the consistency comes from the per-iteration times, and without
        // their mean there is none.
        assert_eq!(old.rows[0].out_of_place.consistency(), None);
        let child = ChildOutput {
            nccl_version: "2.28.3".into(),
            rows: report.rows.clone(),
            random: Vec::new(),
        };
        let text = serde_json::to_string(&child).unwrap();
        assert!(
            text.starts_with("{\"nccl_version\""),
            "run_child finds the rows so"
        );
        assert_eq!(serde_json::from_str::<ChildOutput>(&text).unwrap(), child);
    }

    #[test]
    fn host_profile_medians_number_repeated_phases() {
        use ringreduce::exec::profile::{CallProfile, HostPhase};
        use std::time::Duration;
        let us = Duration::from_micros;
        let call = |launch: u64| CallProfile {
            call: "collective",
            phases: vec![
                (HostPhase::Validate, us(1)),
                (HostPhase::Launch, us(launch)),
                (HostPhase::Launch, us(2 * launch)),
                (HostPhase::Return, us(1)),
            ],
        };
        let got = HostProfile::medians(&[call(3), call(5), call(4)]);
        let want: Vec<(String, f64)> = [
            ("validate", 1.0),
            ("launch", 4.0),
            ("launch 2", 8.0),
            ("return", 1.0),
            // Totals 11, 17 and 14 µs: their median, not the sum of the phases' medians.
            ("total", 14.0),
        ]
        .iter()
        .map(|(p, t)| (p.to_string(), *t))
        .collect();
        assert_eq!(got.len(), want.len());
        for ((p, t), (wp, wt)) in got.iter().zip(&want) {
            assert_eq!(p, wp);
            assert!((t - wt).abs() < 1e-9, "{p}: {t} vs {wt}");
        }
    }
}
