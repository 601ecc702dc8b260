//! The comparison tables: each ringreduce row against the best competitor measured in the same
//! run at the same size and placement — the fastest NCCL configuration (defaults,
//! `NCCL_ALGO=Ring`, symmetric registration, and in a CUDA graph with `--graph`), and the fastest
//! of those and PyTorch's symmetric-memory all-reduces (`--torch-json`) — named in each cell; and
//! the random-size workload against the fixed sizes.
//!
//! Ratio = time(competitor) / time(ringreduce): above 1, ringreduce is faster. Rows with an error
//! and zero or missing times never count as a competitor. [`best`] is the one rule for "the
//! best"; every table uses it.

use super::collective::BenchCollective;
use super::random::bands;
use super::report::{Report, Row};

/// Which time a comparison uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// Back-to-back time per all-reduce (nccl-tests' time).
    Time,
    /// Median call-to-completion latency.
    CallMedian,
}

/// One competitor's time at one size and placement.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub label: String,
    pub us: f64,
}

fn metric_of(row: &Row, in_place: bool, metric: Metric) -> Option<f64> {
    if row.error.is_some() || (in_place && !row.collective.has_in_place()) {
        return None;
    }
    let m = if in_place {
        &row.in_place
    } else {
        &row.out_of_place
    };
    match metric {
        Metric::Time => Some(m.time_us),
        Metric::CallMedian => m.call_median_us,
    }
}

/// The competitors of `collective` at `size` and placement: the rows of `nccl_labels`, and with
/// `torch` the PyTorch rows of that placement (all-reduces: the all-reduce's alone).
pub fn candidates(
    report: &Report,
    nccl_labels: &[String],
    collective: BenchCollective,
    size: u64,
    in_place: bool,
    metric: Metric,
    torch: bool,
) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = report
        .rows
        .iter()
        .filter(|r| {
            r.collective == collective && r.size_bytes == size && nccl_labels.contains(&r.library)
        })
        .filter_map(|r| {
            metric_of(r, in_place, metric).map(|us| Candidate {
                label: r.library.clone(),
                us,
            })
        })
        .collect();
    let all_reduce = collective == BenchCollective::AllReduce;
    if let (true, true, Some(t)) = (torch, all_reduce, &report.torch) {
        out.extend(
            t.rows
                .iter()
                .filter(|r| r.size_bytes == size && r.in_place() == in_place && r.error.is_none())
                .filter_map(|r| {
                    let us = match metric {
                        Metric::Time => r.time_us,
                        Metric::CallMedian => r.call_median_us,
                    }?;
                    Some(Candidate {
                        label: r.label(),
                        us,
                    })
                }),
        );
    }
    out
}

/// The fastest candidate (smallest positive, finite time; the first of equals).
pub fn best(candidates: &[Candidate]) -> Option<&Candidate> {
    candidates
        .iter()
        .filter(|c| c.us.is_finite() && c.us > 0.0)
        .fold(None, |b: Option<&Candidate>, c| match b {
            Some(b) if b.us <= c.us => Some(b),
            _ => Some(c),
        })
}

/// "1.23 (NCCL (symmetric))": the ratio against `best`, named; "n/a" without one.
fn cell(best: Option<&Candidate>, ring_us: Option<f64>) -> String {
    match (best, ring_us) {
        (Some(b), Some(r)) if r > 0.0 => format!("{:.2} ({})", b.us / r, b.label),
        _ => "n/a".to_string(),
    }
}

/// Per collective of the report, the comparison of `ring_label`'s rows against each NCCL run of
/// `nccl_labels` and against the best competitor, by time, then by call-to-completion median.
pub(super) fn print_comparison(report: &Report, ring_label: &str, nccl_labels: &[String]) {
    for &collective in &report.collectives {
        print_comparison_of(report, ring_label, nccl_labels, collective);
    }
}

fn print_comparison_of(
    report: &Report,
    ring_label: &str,
    nccl_labels: &[String],
    collective: BenchCollective,
) {
    let torch = report.torch.is_some() && collective == BenchCollective::AllReduce;
    if nccl_labels.is_empty() && !torch {
        return;
    }
    let rings: Vec<&Row> = report
        .rows
        .iter()
        .filter(|r| r.library == ring_label && r.collective == collective)
        .collect();
    if rings.is_empty() {
        return;
    }
    let name = collective.name();
    out!("#");
    out!(
        "# {ring_label}, {name}, against NCCL: time(NCCL) / time(ringreduce), out of place | in place \
         (> 1: ringreduce faster); best = the fastest NCCL configuration of this run at that size{}",
        if torch {
            "; best of all = also PyTorch symm_mem"
        } else {
            ""
        }
    );
    let mut head = format!("#{:>11}", "size (B)");
    for o in nccl_labels {
        head += &format!(" | {o}");
    }
    head += " | best NCCL, oop | best NCCL, ip";
    if torch {
        head += " | best of all, oop | best of all, ip";
    }
    out!("{head}");
    for ring in &rings {
        let mut line = format!(" {:>11}", ring.size_bytes);
        for o in nccl_labels {
            let one = [o.clone()];
            let per = |ip| {
                let c = candidates(
                    report,
                    &one,
                    collective,
                    ring.size_bytes,
                    ip,
                    Metric::Time,
                    false,
                );
                best(&c)
                    .zip(metric_of(ring, ip, Metric::Time))
                    .map(|(b, r)| b.us / r)
            };
            let text = match (per(false), per(true)) {
                (Some(a), Some(b)) => format!("{a:.2} | {b:.2}"),
                _ => "n/a".to_string(),
            };
            line += &format!(" | {:>w$}", text, w = o.len().max(11));
        }
        line += &best_cells(report, nccl_labels, collective, ring, torch, Metric::Time);
        out!("{line}");
    }
    out!("#");
    out!(
        "# {ring_label}, {name}, call-to-completion median: best competitor / ringreduce, out of place | \
         in place (> 1: ringreduce faster)"
    );
    out!(
        "#{:>11} | best NCCL, oop | best NCCL, ip{}",
        "size (B)",
        if torch {
            " | best of all, oop | best of all, ip"
        } else {
            ""
        }
    );
    for ring in &rings {
        let mut line = format!(" {:>11}", ring.size_bytes);
        line += &best_cells(
            report,
            nccl_labels,
            collective,
            ring,
            torch,
            Metric::CallMedian,
        );
        out!("{line}");
    }
}

/// The "best NCCL" cells of one row (out of place, in place) and, with `torch`, the "best of
/// all" cells, for `metric`: each the best competitor's ratio to `ring` and its name.
fn best_cells(
    report: &Report,
    nccl_labels: &[String],
    collective: BenchCollective,
    ring: &Row,
    torch: bool,
    metric: Metric,
) -> String {
    let mut cells = String::new();
    for with_torch in [false, true] {
        if with_torch && !torch {
            continue;
        }
        for ip in [false, true] {
            let c = candidates(
                report,
                nccl_labels,
                collective,
                ring.size_bytes,
                ip,
                metric,
                with_torch,
            );
            cells += &format!(" | {}", cell(best(&c), metric_of(ring, ip, metric)));
        }
    }
    cells
}

/// Per random-size run: per band of the fixed sizes, the random calls' median and p99 against the
/// same library's fixed-size call latency at the band's lower size.
pub(super) fn print_random(report: &Report) {
    for run in &report.random {
        let fixed: Vec<&Row> = report
            .rows
            .iter()
            .filter(|r| r.library == run.library && r.error.is_none())
            .collect();
        let sizes: Vec<u64> = fixed.iter().map(|r| r.size_bytes).collect();
        out!("#");
        out!(
            "# random sizes, {}: {} calls from {} to {} B (log-uniform, seed {:#x}), {}, \
             each timed from call to completion; #wrong {}{}",
            run.library,
            run.calls.len(),
            run.min_bytes,
            run.max_bytes,
            run.seed,
            if run.in_place {
                "in place"
            } else {
                "out of place"
            },
            run.wrong,
            run.error
                .as_ref()
                .map_or(String::new(), |e| format!("; stopped: {e}"))
        );
        out!(
            "#{:>11} {:>6} | {:>9} {:>9} | {:>9} {:>9} | {:>9}",
            "band from",
            "calls",
            "rnd med",
            "rnd p99",
            "fixed med",
            "fixed p99",
            "rnd/fixed"
        );
        for band in bands(run, &sizes) {
            let row = fixed.iter().find(|r| r.size_bytes == band.from_bytes);
            let (fm, fp) = row.map_or((None, None), |r| {
                let fixed = if run.in_place {
                    &r.in_place
                } else {
                    &r.out_of_place
                };
                (fixed.call_median_us, fixed.call_p99_us)
            });
            let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
            out!(
                " {:>11} {:>6} | {:>9.2} {:>9.2} | {:>9} {:>9} | {:>9}",
                band.from_bytes,
                band.calls,
                band.median_us,
                band.p99_us,
                opt(fm),
                opt(fp),
                fm.filter(|&m| m > 0.0)
                    .map_or("-".into(), |m| format!("{:.2}", band.median_us / m))
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::report::tests::row;
    use super::super::torch::{TorchReport, TorchRow};
    use super::*;

    const AR: BenchCollective = BenchCollective::AllReduce;

    fn report(rows: Vec<Row>) -> Report {
        Report {
            header: Vec::new(),
            collectives: vec![AR],
            chunk_bytes: None,
            slots: None,
            not_measured: Vec::new(),
            rows,
            random: Vec::new(),
            torch: None,
        }
    }

    #[test]
    fn best_is_the_fastest_configuration_per_size_and_placement() {
        let labels: Vec<String> = ["NCCL", "NCCL (NCCL_ALGO=Ring)", "NCCL (symmetric)"]
            .map(String::from)
            .to_vec();
        let mut rows = vec![
            row("ringreduce (auto)", 8, 10.0),
            row("NCCL", 8, 18.0),
            row("NCCL (NCCL_ALGO=Ring)", 8, 14.0),
            row("NCCL (symmetric)", 8, 16.0),
            row("NCCL", 1024, 12.0),
            row("NCCL (NCCL_ALGO=Ring)", 1024, 13.0),
        ];
        // In place, the symmetric run is the fastest at 8 B (out of place it is not).
        rows[3].in_place.time_us = 5.0;
        // A failed row never wins, however small its (zero) time.
        let mut failed = row("NCCL (symmetric)", 1024, 0.0);
        failed.error = Some("capture failed".into());
        rows.push(failed);
        let r = report(rows);
        let c = candidates(&r, &labels, AR, 8, false, Metric::Time, false);
        assert_eq!(c.len(), 3);
        assert_eq!(
            best(&c).map(|b| b.label.as_str()),
            Some("NCCL (NCCL_ALGO=Ring)")
        );
        let c = candidates(&r, &labels, AR, 8, true, Metric::Time, false);
        assert_eq!(
            best(&c).map(|b| (b.label.as_str(), b.us)),
            Some(("NCCL (symmetric)", 5.0))
        );
        let c = candidates(&r, &labels, AR, 1024, false, Metric::Time, false);
        assert_eq!(best(&c).map(|b| b.label.as_str()), Some("NCCL"));
        // Only the labels asked for: ringreduce's own row is never its competitor.
        assert!(candidates(&r, &labels, AR, 8, false, Metric::Time, false)
            .iter()
            .all(|c| c.label != "ringreduce (auto)"));
        // Call latency: `row` sets call median = time + 2.
        let c = candidates(&r, &labels, AR, 8, false, Metric::CallMedian, false);
        assert_eq!(best(&c).map(|b| b.us), Some(16.0));
        assert_eq!(cell(best(&c), Some(8.0)), "2.00 (NCCL (NCCL_ALGO=Ring))");
        assert_eq!(cell(None, Some(8.0)), "n/a");
        assert!(best(&[]).is_none());
        // Another collective's rows of the same label and size never compete with the
        // all-reduce's, and a collective without an in-place form has no in-place time.
        let mut other = r.clone();
        let mut gather = row("NCCL", 8, 1.0);
        gather.collective = BenchCollective::AllGather;
        let mut a2a = row("NCCL", 8, 3.0);
        a2a.collective = BenchCollective::AllToAll;
        other.rows.extend([gather, a2a]);
        let c = candidates(&other, &labels, AR, 8, false, Metric::Time, false);
        assert_eq!(best(&c).map(|b| b.us), Some(14.0));
        let c = candidates(
            &other,
            &labels,
            BenchCollective::AllGather,
            8,
            false,
            Metric::Time,
            false,
        );
        assert_eq!(
            best(&c).map(|b| (b.label.as_str(), b.us)),
            Some(("NCCL", 1.0))
        );
        let a2a = BenchCollective::AllToAll;
        assert!(candidates(&other, &labels, a2a, 8, true, Metric::Time, false).is_empty());
        assert_eq!(
            candidates(&other, &labels, a2a, 8, false, Metric::Time, false).len(),
            1
        );
        // Ties: the first.
        let tie = [
            Candidate {
                label: "a".into(),
                us: 2.0,
            },
            Candidate {
                label: "b".into(),
                us: 2.0,
            },
            Candidate {
                label: "z".into(),
                us: f64::NAN,
            },
        ];
        assert_eq!(best(&tie).map(|b| b.label.as_str()), Some("a"));
    }

    #[test]
    fn pytorch_counts_in_best_of_all_by_placement() {
        let labels = vec!["NCCL".to_string()];
        let mut r = report(vec![row("NCCL", 8, 14.0)]);
        let t = |op: &str, placement: &str, us: Option<f64>, error: Option<&str>| TorchRow {
            op: op.into(),
            placement: placement.into(),
            size_bytes: 8,
            time_us: us,
            call_median_us: us,
            call_p99_us: us,
            call_mean_us: us,
            wrong: Some(0),
            error: error.map(String::from),
        };
        r.torch = Some(TorchReport {
            torch_version: "2.11".into(),
            world: 2,
            dtype: "f32".into(),
            op: "sum".into(),
            env: Default::default(),
            ops_available: Default::default(),
            device: String::new(),
            rows: vec![
                t("one_shot_all_reduce", "out_of_place", Some(6.0), None),
                t(
                    "two_shot_all_reduce_",
                    "in_place",
                    Some(1.0),
                    Some("failed"),
                ),
            ],
        });
        let oop = candidates(&r, &labels, AR, 8, false, Metric::Time, true);
        assert_eq!(
            best(&oop).map(|b| b.label.as_str()),
            Some("PyTorch symm_mem one_shot_all_reduce")
        );
        // Without PyTorch (best NCCL), NCCL; in place the failed PyTorch row does not count.
        let nccl_only = candidates(&r, &labels, AR, 8, false, Metric::Time, false);
        assert_eq!(best(&nccl_only).map(|b| b.label.as_str()), Some("NCCL"));
        let ip = candidates(&r, &labels, AR, 8, true, Metric::Time, true);
        assert_eq!(best(&ip).map(|b| b.label.as_str()), Some("NCCL"));
    }
}
