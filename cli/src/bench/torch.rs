//! PyTorch's symmetric-memory all-reduces as a competitor: the JSON that
//! `scripts/torch_symm_mem_bench.py` writes, read by `bench --torch-json FILE`, printed as its own
//! table and counted in the comparison's best competitor ([`super::compare`]).
//!
//! Invariant: the field names here are the script's (`TorchReport` ⇄ the script's `report`
//! dictionary); a row with an `error` has no times and never counts as a competitor.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// What the script writes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TorchReport {
    pub torch_version: String,
    pub world: u64,
    pub dtype: String,
    pub op: String,
    /// The environment the script ran with (TORCH_SYMM_MEM_DISABLE_MULTICAST, NCCL_NVLS_ENABLE).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Which `torch.ops.symm_mem` operators this PyTorch has.
    #[serde(default)]
    pub ops_available: BTreeMap<String, bool>,
    #[serde(default)]
    pub device: String,
    pub rows: Vec<TorchRow>,
}

/// One operator at one size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TorchRow {
    /// "one_shot_all_reduce", "two_shot_all_reduce_".
    pub op: String,
    /// "out_of_place" or "in_place".
    pub placement: String,
    pub size_bytes: u64,
    /// Back-to-back calls, one synchronisation, per call (µs).
    #[serde(default)]
    pub time_us: Option<f64>,
    #[serde(default)]
    pub call_median_us: Option<f64>,
    #[serde(default)]
    pub call_p99_us: Option<f64>,
    #[serde(default)]
    pub call_mean_us: Option<f64>,
    /// Wrong elements on rank 0 in the checked call.
    #[serde(default)]
    pub wrong: Option<u64>,
    #[serde(default)]
    pub error: Option<String>,
}

impl TorchRow {
    /// The name this row's operator has in the tables.
    pub fn label(&self) -> String {
        format!("PyTorch symm_mem {}", self.op)
    }

    pub fn in_place(&self) -> bool {
        self.placement == "in_place"
    }
}

/// Reads the script's JSON; a clear error naming the file when it is missing or not the
/// script's.
pub fn read_torch_json(path: &Path) -> Result<TorchReport, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| {
        format!(
            "{}: not the JSON of scripts/torch_symm_mem_bench.py: {e}",
            path.display()
        )
    })
}

/// The PyTorch table: per operator and size, time, call median and p99, p99/median.
pub fn print_torch(t: &TorchReport) {
    out!("#");
    out!(
        "# PyTorch {} symmetric memory, {} ranks, {} {} (from --torch-json); env: {}",
        t.torch_version,
        t.world,
        t.dtype,
        t.op,
        t.env
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let missing: Vec<&str> = t
        .ops_available
        .iter()
        .filter(|(_, &ok)| !ok)
        .map(|(k, _)| k.as_str())
        .collect();
    if !missing.is_empty() {
        out!("# PyTorch lacks: {}", missing.join(", "));
    }
    out!(
        "#{:>11} {:>24} {:>12} | {:>10} {:>9} {:>9} {:>7} {:>6}",
        "size (B)",
        "op",
        "placement",
        "time (us)",
        "call med",
        "call p99",
        "p99/med",
        "#wrong"
    );
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    for r in &t.rows {
        if let Some(e) = &r.error {
            out!(
                " {:>11} {:>24} {:>12} | error: {e}",
                r.size_bytes,
                r.op,
                r.placement
            );
            continue;
        }
        let ratio = match (r.call_p99_us, r.call_median_us) {
            (Some(p), Some(m)) if m > 0.0 => format!("{:.2}", p / m),
            _ => "-".into(),
        };
        out!(
            " {:>11} {:>24} {:>12} | {:>10} {:>9} {:>9} {:>7} {:>6}",
            r.size_bytes,
            r.op,
            r.placement,
            opt(r.time_us),
            opt(r.call_median_us),
            opt(r.call_p99_us),
            ratio,
            r.wrong.map_or("-".to_string(), |w| w.to_string())
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The script's output shape (as `scripts/torch_symm_mem_bench.py` writes it) reads.
    #[test]
    fn script_json_reads() {
        let text = r#"{
          "source": "scripts/torch_symm_mem_bench.py",
          "torch_version": "2.11.0", "world": 2, "dtype": "f32", "op": "sum",
          "device": "NVIDIA H200",
          "env": {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0"},
          "ops_available": {"one_shot_all_reduce": true, "two_shot_all_reduce_": false},
          "iters": 200, "warmup": 20,
          "rows": [
            {"op": "one_shot_all_reduce", "placement": "out_of_place", "size_bytes": 8,
             "time_us": 5.5, "call_median_us": 9.0, "call_p99_us": 12.0, "call_mean_us": 9.4,
             "wrong": 0, "error": null},
            {"op": "two_shot_all_reduce_", "placement": "in_place", "size_bytes": 8,
             "error": "op missing"}
          ]
        }"#;
        let dir = std::env::temp_dir().join(format!("rr-torch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.json");
        std::fs::write(&path, text).unwrap();
        let t = read_torch_json(&path).unwrap();
        std::fs::write(&path, "{\"rows\": 3}").unwrap();
        let bad = read_torch_json(&path).unwrap_err();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(bad.contains("torch_symm_mem_bench.py"), "{bad}");
        assert_eq!(t.rows.len(), 2);
        assert_eq!(t.rows[0].time_us, Some(5.5));
        assert_eq!((t.rows[0].wrong, t.rows[1].wrong), (Some(0), None));
        assert!(!t.rows[0].in_place() && t.rows[1].in_place());
        assert_eq!(t.rows[1].error.as_deref(), Some("op missing"));
        assert_eq!(t.rows[0].label(), "PyTorch symm_mem one_shot_all_reduce");
        assert!(!t.ops_available["two_shot_all_reduce_"]);
        let back: TorchReport = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back, t);
    }
}
