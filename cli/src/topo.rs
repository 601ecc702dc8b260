//! `ringreduce topo`: what this host's GPUs are and how they are connected — the first stop of the
//! multi-GPU article's road (devices → peer access → peer copies → cross-GPU events → collectives →
//! topology), in one screen.
//!
//! It prints, in order:
//!
//! 1. **Devices**: index, name, memory, SM count, compute capability, PCI bus id, and the NUMA node
//!    and CPUs closest to the GPU (`/sys/bus/pci/devices/<bus id>/numa_node`, `local_cpulist`) —
//!    the CPUs a host thread driving that GPU should run on.
//! 2. **Peer access** (`cuDeviceCanAccessPeer`), as `nvidia-smi topo -p2p r` shows it: `OK` / `NS`,
//!    row = the GPU that reads or writes, column = the GPU whose memory it reaches. It is asked per
//!    direction because it is not symmetric.
//! 3. **Peer attributes** (`cuDeviceGetP2PAttribute`): the driver's relative performance rank of each
//!    directed pair and whether native atomics work over it.
//! 4. **Links**, as `nvidia-smi topo -m` shows them (`NV#`, `PIX`, `PXB`, `PHB`, `NODE`, `SYS`), from
//!    NVML loaded at run time ([`ringreduce::topo::detect`]); without NVML the links are marked
//!    unknown, never guessed.
//! 5. **Versions**: driver (NVML), CUDA driver API, NCCL (where the library finds it).
//! 6. **The ring order** [`ringreduce::topo::choose_ring`] picks for these links and this peer matrix,
//!    with its reason.
//!
//! Nothing here enables peer access or allocates memory: `topo` only asks. [`gather`] returns the
//! data (used by `ringreduce tour` as well), [`print()`] shows it.

use crate::Failure;
use ringreduce::device::{self, DeviceInfo, P2pAttributes};
use ringreduce::topo::{self, Detected, RingChoice};

#[derive(clap::Args, Clone, Debug, Default)]
pub struct TopoArgs {}

/// Everything `topo` found.
#[derive(Clone, Debug)]
pub struct TopoReport {
    pub devices: Vec<DeviceInfo>,
    /// Per device: (NUMA node, local CPU list) from sysfs, `None` where unreadable.
    pub affinity: Vec<(Option<String>, Option<String>)>,
    pub detected: Detected,
    /// `attributes[from][to]`: `None` on the diagonal; `Err` text where the driver refused.
    pub attributes: Vec<Vec<Option<Result<P2pAttributes, String>>>>,
    pub versions: Versions,
    /// The ring [`topo::choose_ring`] picks, or why it cannot (unknown links).
    pub ring: Result<RingChoice, String>,
}

impl TopoReport {
    /// The directed pairs (from, to), from ≠ to, without peer access.
    pub fn pairs_without_peer(&self) -> Vec<(usize, usize)> {
        let n = self.devices.len();
        (0..n)
            .flat_map(|a| (0..n).map(move |b| (a, b)))
            .filter(|&(a, b)| a != b && !self.detected.peer[a][b])
            .collect()
    }
}

/// Software versions, each as text ready to print (the reason when unknown).
#[derive(Clone, Debug)]
pub struct Versions {
    pub driver: String,
    pub cuda_driver_api: String,
    pub nccl: String,
}

pub fn run(_args: &TopoArgs) -> Result<(), Failure> {
    let report = gather()?;
    print(&report);
    Ok(())
}

/// Asks the driver, NVML and sysfs; allocates nothing and enables nothing.
pub fn gather() -> Result<TopoReport, Failure> {
    crate::require_gpus(1)?;
    let devices = device::devices()?;
    let detected = topo::detect()?;
    let n = devices.len();
    let affinity = devices
        .iter()
        .map(|d| ringreduce::topo::pci_affinity(&d.pci_bus_id))
        .collect();
    let attributes = (0..n)
        .map(|a| {
            (0..n)
                .map(|b| (a != b).then(|| device::p2p_attributes(a, b).map_err(|e| e.to_string())))
                .collect()
        })
        .collect();
    let ring = detected
        .topology()
        .map(|t| topo::choose_ring(&t))
        .map_err(|e| e.to_string());
    let versions = Versions {
        driver: detected
            .nvml_driver_version
            .clone()
            .unwrap_or_else(|| "unknown (NVML not available)".to_string()),
        cuda_driver_api: match device::driver_version() {
            Ok((major, minor)) => format!("{major}.{minor}"),
            Err(e) => format!("unknown ({e})"),
        },
        nccl: nccl_version(),
    };
    Ok(TopoReport {
        devices,
        affinity,
        detected,
        attributes,
        versions,
        ring,
    })
}

/// The NCCL version, or why there is none: NCCL found as the library finds it
/// ([`ringreduce_cli::baseline`] does the looking, `RINGREDUCE_NCCL_PATH` first).
pub fn nccl_version() -> String {
    use ringreduce_cli::baseline;
    if let Some(why) = baseline::nccl_missing() {
        return format!("not found ({why})");
    }
    baseline::nccl_version().unwrap_or_else(|e| format!("loaded, but ncclGetVersion failed ({e})"))
}

fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// Prints the report: devices, peer matrix, attributes, links, versions, ring.
pub fn print(r: &TopoReport) {
    let n = r.devices.len();
    out!("# GPUs ({n})");
    for (d, (numa, cpus)) in r.devices.iter().zip(&r.affinity) {
        out!(
            "GPU {}: {}, {:.1} GiB, {} SMs, sm_{}{}, PCI {}, NUMA node {}, CPUs {}",
            d.index,
            d.name,
            gib(d.total_memory_bytes),
            d.sm_count,
            d.compute_capability.0,
            d.compute_capability.1,
            d.pci_bus_id,
            numa.as_deref().unwrap_or("unknown"),
            cpus.as_deref().unwrap_or("unknown")
        );
    }
    out!("");
    out!("# Peer access (cuDeviceCanAccessPeer; row reaches column's memory; like nvidia-smi topo -p2p r)");
    out!("{}", matrix_header(n));
    for a in 0..n {
        let cells: Vec<String> = (0..n)
            .map(|b| {
                let label = if a == b {
                    "X"
                } else if r.detected.peer[a][b] {
                    "OK"
                } else {
                    "NS"
                };
                format!("{label:>6}")
            })
            .collect();
        out!("{:>6}{}", format!("GPU{a}"), cells.join(""));
    }
    if n > 1 {
        out!("");
        out!("# Peer attributes (cuDeviceGetP2PAttribute, row → column): performance rank / native atomics");
        for a in 0..n {
            for b in (0..n).filter(|&b| b != a) {
                match &r.attributes[a][b] {
                    Some(Ok(p)) => out!(
                        "GPU{a} → GPU{b}: rank {}, native atomics {}, access {}",
                        p.performance_rank,
                        yes_no(p.native_atomics),
                        yes_no(p.access_supported)
                    ),
                    Some(Err(e)) => out!("GPU{a} → GPU{b}: unknown ({e})"),
                    None => {}
                }
            }
        }
    }
    out!("");
    out!("# Links (NVML; like nvidia-smi topo -m: NV# = # NVLinks, PIX/PXB/PHB/NODE/SYS = PCIe path)");
    for note in &r.detected.notes {
        out!("# {note}");
    }
    out!("{}", matrix_header(n));
    for a in 0..n {
        let cells: Vec<String> = (0..n)
            .map(|b| {
                let label = r.detected.links[a][b]
                    .map(|l| l.to_string())
                    .unwrap_or_else(|| "?".to_string());
                format!("{label:>6}")
            })
            .collect();
        out!("{:>6}{}", format!("GPU{a}"), cells.join(""));
    }
    out!("");
    out!("# Versions");
    out!("driver: {}", r.versions.driver);
    out!("CUDA driver API: {}", r.versions.cuda_driver_api);
    out!("NCCL: {}", r.versions.nccl);
    out!("");
    out!("# Ring order (ringreduce::topo::choose_ring on the links and peer matrix above)");
    match &r.ring {
        Ok(ring) => {
            out!("{}", ring.reason);
            for e in &ring.edges {
                out!(
                    "  edge GPU{} → GPU{}: {}{}, est. {}",
                    e.from,
                    e.to,
                    e.link,
                    if e.peer {
                        ""
                    } else {
                        " (no peer access: staged through host)"
                    },
                    e.est
                );
            }
            out!("# a Communicator runs its ring in the device order it is given: pass this order");
        }
        Err(why) => out!("unknown: {why}"),
    }
}

fn matrix_header(n: usize) -> String {
    let cols: String = (0..n)
        .map(|b| format!("{:>6}", format!("GPU{b}")))
        .collect();
    format!("{:>6}{cols}", "")
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}
