//! Topology-aware ring order: which device follows which in the ring, and why.
//!
//! A ring all-reduce on `n` devices pushes data along the directed edges
//! `d0 → d1 → … → d(n−1) → d0` (the sender's copy engine writes into the receiver, so the sender
//! needs peer access to the receiver). Every step moves one segment over every edge at once, so the
//! ring runs at the speed of its slowest edge. This module picks the order of the devices that makes
//! that slowest edge as fast as possible — the idea of NCCL's ring search (`src/graph/search.cc`:
//! try NVLink paths before PCIe before the CPU interconnect), reduced to one host and exact search.
//!
//! # What a topology is
//!
//! [`Topology`] holds what `nvidia-smi topo -m` prints — one [`Link`] per pair of devices (`NV#`,
//! `PIX`, `PXB`, `PHB`, `NODE`, `SYS`; symmetric, since a physical path is) — and what
//! `cuDeviceCanAccessPeer(from, to)` says per *direction* (not symmetric: `nvidia-smi topo -p2p w`
//! can show OK one way and not the other). NVSwitch boxes show `NV#` between every pair, so they need
//! no variant of their own.
//!
//! # How an edge is scored
//!
//! Each directed edge gets an estimated one-way bandwidth ([`Link::estimate`]), kept as integer MB/s
//! so that ties are exact. The numbers rank paths; they do not predict throughput:
//!
//! | link (`topo -m`), GB/s   | with peer access       | without: staged through host      |
//! |--------------------------|------------------------|-----------------------------------|
//! | `NV#` (# bonded links)   | # × 26.6 (NV18: 478.8) | min(27.8, # × 13.3): NV1 13.3     |
//! | `PIX` (one PCIe switch)  | 24.0                   | 12.0                              |
//! | `PXB` (several switches) | 20.0                   | 10.0                              |
//! | `PHB` (host bridge)      | 16.0                   | 8.0                               |
//! | `NODE` (bridges, 1 NUMA) | 12.0                   | 6.0                               |
//! | `SYS` (across sockets)   | 10.0                   | 5.0                               |
//!
//! Peer edges rank NVLink first, then PCIe by how far up the tree the path goes, `SYS` last. An edge
//! without peer access in its sending direction is staged through pinned host memory (device→host,
//! then host→device, [`crate::plan::EdgeTransport::Staged`]); every byte crosses PCIe twice, so it
//! is scored at half its link's peer estimate, capped at the measured host path — always strictly
//! below a peer edge over the same link. The provenance of each number is on its constant.
//!
//! # The ring order, and where each part lives
//!
//! [`choose_ring`] returns the order whose slowest edge is fastest, with ties broken as its doc
//! explains; [`detect()`] reads this host's [`Topology`] from NVML and the CUDA driver;
//! [`all_gpus_ring`] puts the two together for [`crate::Communicator::all_gpus`] (index order,
//! with the reason, where the links cannot be read).
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | link classes ([`Link`]) and their bandwidth constants, [`Bandwidth`], [`Topology`] |
//! | `ring.rs` | the ring order search: [`choose_ring`], [`ring_for_order`], exact and heuristic search, the one-line reason; [`ring_or_index_order`] where the topology may be unknown |
//! | `detect.rs` | [`detect()`]: bus ids and peer access from [`crate::device`], links from NVML; [`parse_pci_bus_id`]; [`all_gpus_ring`] |
//!
//! This module builds on [`crate::device`] (below it) and never on the executors (above it).

mod detect;
mod numa;
mod ring_order;

pub use detect::{all_gpus_ring, detect, parse_pci_bus_id, Detected};
pub use numa::{pci_affinity, pci_numa_node};
pub use ring_order::{
    choose_ring, ring_for_order, ring_or_index_order, EdgeChoice, RingChoice, Search,
    MAX_EXACT_DEVICES,
};

use crate::error::{Error, Result};

use std::fmt;
use std::str::FromStr;

/// One NVLink link, one direction: what `nvidia-smi nvlink -s` reports per NVLink 4 link on the
/// 2×H200 test machine (26.562 GB/s; docs/PERFORMANCE.md, "The test machine"). NV18 → 478.8 GB/s
/// on paper. NVLink 3 (A100, 25 GB/s) ranks the same way.
pub const NVLINK_PER_LINK_MB_PER_S: u32 = 26_600;

/// Peer copy through one PCIe switch (`PIX`): PCIe Gen4 x16 ≈ 24 GB/s usable per direction, twice
/// NCCL's `PCI_BW` (12 GB/s for Gen3 x16, `src/graph/topo.h`). `topo -m` does not show the PCIe
/// generation; a Gen5 box is faster, but the order of the classes is what matters.
pub const PIX_MB_PER_S: u32 = 24_000;

/// Peer copy across several PCIe switches (`PXB`): same links as `PIX` but shared uplinks; ranked
/// below `PIX` as NCCL ranks `PATH_PXB` after `PATH_PIX`. A ranking choice, not a measurement.
pub const PXB_MB_PER_S: u32 = 20_000;

/// Peer copy through a PCIe host bridge (`PHB`, the CPU's root complex): root complexes forward
/// peer traffic more slowly than switches (NCCL's `AMD_BW` is 16 GB/s). A ranking choice.
pub const PHB_MB_PER_S: u32 = 16_000;

/// Peer copy between host bridges of one NUMA node (`NODE`). A ranking choice between `PHB`
/// and `SYS`.
pub const NODE_MB_PER_S: u32 = 12_000;

/// Peer copy across the CPU interconnect between NUMA nodes (`SYS`, UPI/QPI/Infinity Fabric):
/// NCCL's `SKL_QPI_BW` (10 GB/s, `src/graph/topo.h`). The slowest peer class.
pub const SYS_MB_PER_S: u32 = 10_000;

/// An edge staged through pinned host memory, at best: a device→host then host→device copy, each
/// byte crossing PCIe twice, at the speed NCCL's host path (`NCCL_P2P_DISABLE=1`) reaches on the
/// 2×H200 test machine (docs/PERFORMANCE.md, "The test machine"). The multi-GPU article's 8×A100
/// box staged at ~13 GB/s. A staged edge scores `min(this, link's peer estimate / 2)`.
pub const HOST_STAGED_MB_PER_S: u32 = 27_800;

/// A copy within one device, one way: half the read + write rate of a local copy on an H200
/// (docs/PERFORMANCE.md, "The test machine"). Only the diagonal of a topology has it; no ring
/// edge does.
pub const SAME_DEVICE_MB_PER_S: u32 = 2_080_000;

/// An estimated one-way bandwidth, in whole MB/s (10⁶ bytes per second), so that comparisons and
/// sums are exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bandwidth {
    mb_per_s: u32,
}

impl Bandwidth {
    /// A bandwidth of `mb_per_s` MB/s (10⁶ bytes per second).
    pub const fn from_mb_per_s(mb_per_s: u32) -> Self {
        Bandwidth { mb_per_s }
    }

    /// In whole MB/s (10⁶ bytes per second).
    pub const fn mb_per_s(self) -> u32 {
        self.mb_per_s
    }

    /// In GB/s (10⁹ bytes per second), as the rest of the crate reports bandwidth.
    pub fn gb_per_s(self) -> f64 {
        f64::from(self.mb_per_s) / 1000.0
    }
}

impl fmt::Display for Bandwidth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.1} GB/s", self.gb_per_s())
    }
}

/// How two devices are connected, as `nvidia-smi topo -m` labels it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Link {
    /// `X`: the device itself (the diagonal).
    SameDevice,
    /// `NV#`: `links` bonded NVLink links, directly or through an NVSwitch (≥ 1).
    NvLink {
        /// Number of bonded NVLink links (the `#` of `NV#`).
        links: u32,
    },
    /// `PIX`: PCIe, at most one PCIe bridge (switch) between the two.
    Pix,
    /// `PXB`: PCIe, several bridges, without crossing a host bridge.
    Pxb,
    /// `PHB`: PCIe through a host bridge (typically the CPU).
    Phb,
    /// `NODE`: PCIe plus the interconnect between host bridges within one NUMA node.
    Node,
    /// `SYS`: PCIe plus the SMP interconnect between NUMA nodes (QPI/UPI); older drivers say `SOC`.
    Sys,
}

impl Link {
    /// The estimate for a copy over this link with peer access (module doc, table).
    pub fn peer_estimate(self) -> Bandwidth {
        Bandwidth::from_mb_per_s(match self {
            Link::SameDevice => SAME_DEVICE_MB_PER_S,
            Link::NvLink { links } => links.saturating_mul(NVLINK_PER_LINK_MB_PER_S),
            Link::Pix => PIX_MB_PER_S,
            Link::Pxb => PXB_MB_PER_S,
            Link::Phb => PHB_MB_PER_S,
            Link::Node => NODE_MB_PER_S,
            Link::Sys => SYS_MB_PER_S,
        })
    }

    /// The estimate for a copy between two devices on this link staged through pinned host memory:
    /// `min(HOST_STAGED_MB_PER_S, peer estimate / 2)` — strictly below the peer estimate.
    pub fn staged_estimate(self) -> Bandwidth {
        let half_peer = self.peer_estimate().mb_per_s() / 2;
        Bandwidth::from_mb_per_s(half_peer.min(HOST_STAGED_MB_PER_S))
    }

    /// The estimate for one direction of this link, with or without peer access that way.
    pub fn estimate(self, peer: bool) -> Bandwidth {
        if peer {
            self.peer_estimate()
        } else {
            self.staged_estimate()
        }
    }

    /// True for [`Link::NvLink`], whatever its link count.
    pub fn is_nvlink(self) -> bool {
        matches!(self, Link::NvLink { .. })
    }
}

impl fmt::Display for Link {
    /// The `nvidia-smi topo -m` label: `X`, `NV12`, `PIX`, …
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Link::SameDevice => f.write_str("X"),
            Link::NvLink { links } => write!(f, "NV{links}"),
            Link::Pix => f.write_str("PIX"),
            Link::Pxb => f.write_str("PXB"),
            Link::Phb => f.write_str("PHB"),
            Link::Node => f.write_str("NODE"),
            Link::Sys => f.write_str("SYS"),
        }
    }
}

impl FromStr for Link {
    type Err = Error;

    /// Parses a `nvidia-smi topo -m` label (`X`, `NV#` with # ≥ 1, `PIX`, `PXB`, `PHB`, `NODE`,
    /// `SYS`, or the older `SOC` for `SYS`), ignoring case and surrounding blanks.
    fn from_str(label: &str) -> Result<Self> {
        let upper = label.trim().to_ascii_uppercase();
        let link = match upper.as_str() {
            "X" => Link::SameDevice,
            "PIX" => Link::Pix,
            "PXB" => Link::Pxb,
            "PHB" => Link::Phb,
            "NODE" => Link::Node,
            "SYS" | "SOC" => Link::Sys,
            other => match other.strip_prefix("NV").map(str::parse::<u32>) {
                Some(Ok(links)) if links >= 1 => Link::NvLink { links },
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "unknown link label {label:?}: expected X, NV# (# ≥ 1), PIX, PXB, PHB, \
                         NODE or SYS"
                    )))
                }
            },
        };
        Ok(link)
    }
}

/// The devices of one host and how each pair is connected.
///
/// Invariants (checked by every constructor): at least one device; `link` and `peer` are `n × n`;
/// `link[i][i]` is [`Link::SameDevice`] and no other entry is; `link` is symmetric; every
/// [`Link::NvLink`] has ≥ 1 link. `peer[from][to]` is whether `from` can write `to`'s memory
/// directly; the diagonal of `peer` is ignored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    link: Vec<Vec<Link>>,
    peer: Vec<Vec<bool>>,
}

impl Topology {
    /// A topology from its link matrix (as `nvidia-smi topo -m`) and peer matrix (as
    /// `cuDeviceCanAccessPeer(from, to)`, row = sender).
    pub fn new(link: Vec<Vec<Link>>, peer: Vec<Vec<bool>>) -> Result<Self> {
        let n = link.len();
        if n == 0 {
            return Err(Error::InvalidArgument(
                "a topology needs at least one device, got an empty link matrix".into(),
            ));
        }
        for (i, row) in link.iter().enumerate() {
            if row.len() != n {
                return Err(Error::InvalidArgument(format!(
                    "link matrix is not square: {n} rows, but row {i} has {} entries",
                    row.len()
                )));
            }
        }
        if peer.len() != n {
            return Err(Error::InvalidArgument(format!(
                "peer matrix has {} rows, the link matrix {n}",
                peer.len()
            )));
        }
        for (i, row) in peer.iter().enumerate() {
            if row.len() != n {
                return Err(Error::InvalidArgument(format!(
                    "peer matrix is not {n} × {n}: row {i} has {} entries",
                    row.len()
                )));
            }
        }
        for (i, row) in link.iter().enumerate() {
            for (j, &l) in row.iter().enumerate() {
                if i == j && l != Link::SameDevice {
                    return Err(Error::InvalidArgument(format!(
                        "link {i}→{i} must be X (the device itself), got {l}"
                    )));
                }
                if i != j && l == Link::SameDevice {
                    return Err(Error::InvalidArgument(format!(
                        "link {i}→{j} is X (same device), but a device appears once in a topology"
                    )));
                }
                if l == (Link::NvLink { links: 0 }) {
                    return Err(Error::InvalidArgument(format!(
                        "link {i}→{j} is NV0: an NVLink connection has at least one link"
                    )));
                }
                if l != link[j][i] {
                    return Err(Error::InvalidArgument(format!(
                        "link matrix is not symmetric: {i}→{j} is {l}, {j}→{i} is {}; physical \
                         paths are, and one-way peer access belongs in the peer matrix",
                        link[j][i]
                    )));
                }
            }
        }
        Ok(Topology { link, peer })
    }

    /// A topology with peer access in every direction.
    pub fn with_full_peer(link: Vec<Vec<Link>>) -> Result<Self> {
        let n = link.len();
        Topology::new(link, vec![vec![true; n]; n])
    }

    /// `n` devices, every pair connected by `link` (e.g. an NVSwitch box: `NvLink { links: 18 }`),
    /// peer access everywhere.
    pub fn uniform(n: usize, link: Link) -> Result<Self> {
        let matrix = (0..n)
            .map(|i| {
                (0..n)
                    .map(|j| if i == j { Link::SameDevice } else { link })
                    .collect()
            })
            .collect();
        Topology::with_full_peer(matrix)
    }

    /// A topology from the GPU-to-GPU block of `nvidia-smi topo -m`, one string per row, labels
    /// separated by blanks (`"X NV12 SYS"`), with peer access everywhere.
    pub fn from_labels(rows: &[&str]) -> Result<Self> {
        let link = rows
            .iter()
            .map(|row| row.split_whitespace().map(str::parse).collect())
            .collect::<Result<Vec<Vec<Link>>>>()?;
        Topology::with_full_peer(link)
    }

    /// The same topology without peer access from `from` to `to` (one direction only).
    pub fn deny_peer(mut self, from: usize, to: usize) -> Result<Self> {
        let n = self.device_count();
        if from >= n || to >= n || from == to {
            return Err(Error::InvalidArgument(format!(
                "deny_peer({from}, {to}): needs two different devices below {n}"
            )));
        }
        self.peer[from][to] = false;
        Ok(self)
    }

    /// Number of devices (the side of the link and peer matrices).
    pub fn device_count(&self) -> usize {
        self.link.len()
    }

    /// The link between two devices, or `None` if either index is out of range.
    pub fn link(&self, from: usize, to: usize) -> Option<Link> {
        self.link.get(from)?.get(to).copied()
    }

    /// Whether `from` can write `to`'s memory directly, or `None` if either index is out of range.
    pub fn peer(&self, from: usize, to: usize) -> Option<bool> {
        self.peer.get(from)?.get(to).copied()
    }

    /// The estimate for the directed edge `from → to` (module doc, table).
    pub fn estimate(&self, from: usize, to: usize) -> Option<Bandwidth> {
        Some(self.link(from, to)?.estimate(self.peer(from, to)?))
    }

    /// The NVLink domains: the sets of devices connected through `NV#` links, each sorted, listed
    /// by their smallest device. A device with no NVLink is a domain of its own. A ring over k ≥ 2
    /// domains leaves each at least once, so it crosses between domains at least k times.
    pub fn nvlink_domains(&self) -> Vec<Vec<usize>> {
        let n = self.device_count();
        let mut domain_of = vec![usize::MAX; n];
        let mut domains: Vec<Vec<usize>> = Vec::new();
        for start in 0..n {
            if domain_of[start] != usize::MAX {
                continue;
            }
            let id = domains.len();
            domain_of[start] = id;
            let mut members = vec![start];
            let mut next = 0;
            while let Some(&d) = members.get(next) {
                next += 1;
                for (e, l) in self.link[d].iter().enumerate() {
                    if l.is_nvlink() && domain_of[e] == usize::MAX {
                        domain_of[e] = id;
                        members.push(e);
                    }
                }
            }
            members.sort_unstable();
            domains.push(members);
        }
        domains
    }

    /// `score[from][to]`: the estimate of every directed edge, in MB/s.
    fn scores(&self) -> Vec<Vec<u32>> {
        self.link
            .iter()
            .zip(&self.peer)
            .map(|(links, peers)| {
                links
                    .iter()
                    .zip(peers)
                    .map(|(l, &p)| l.estimate(p).mb_per_s())
                    .collect()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLASSES: [Link; 6] = [
        Link::NvLink { links: 1 },
        Link::Pix,
        Link::Pxb,
        Link::Phb,
        Link::Node,
        Link::Sys,
    ];

    #[test]
    fn peer_classes_rank_nvlink_then_pcie_depth_then_sys() {
        for pair in CLASSES.windows(2) {
            assert!(
                pair[0].peer_estimate() > pair[1].peer_estimate(),
                "{} should outrank {}",
                pair[0],
                pair[1]
            );
        }
        assert_eq!(
            Link::NvLink { links: 18 }.peer_estimate(),
            Bandwidth::from_mb_per_s(478_800)
        );
    }

    #[test]
    fn staged_is_strictly_below_peer_on_every_link() {
        let links = CLASSES
            .iter()
            .copied()
            .chain((2..=18).map(|links| Link::NvLink { links }))
            .chain([Link::NvLink { links: u32::MAX }]);
        for link in links {
            assert!(link.staged_estimate() < link.peer_estimate(), "{link}");
            assert!(
                link.staged_estimate().mb_per_s() <= HOST_STAGED_MB_PER_S,
                "{link}"
            );
        }
        assert_eq!(
            Link::NvLink { links: 18 }.staged_estimate().mb_per_s(),
            HOST_STAGED_MB_PER_S
        );
        assert_eq!(Link::Sys.staged_estimate().mb_per_s(), SYS_MB_PER_S / 2);
    }

    #[test]
    fn labels_round_trip() {
        for link in CLASSES
            .iter()
            .copied()
            .chain([Link::SameDevice, Link::NvLink { links: 18 }])
        {
            assert_eq!(link.to_string().parse::<Link>(), Ok(link));
        }
        assert_eq!(" soc ".parse::<Link>(), Ok(Link::Sys));
        for bad in ["NV0", "NV", "NV-1", "NVx", "PCI", ""] {
            assert!(
                matches!(bad.parse::<Link>(), Err(Error::InvalidArgument(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn nvlink_domains_are_components() {
        let topo = Topology::from_labels(&[
            "X    NV4  SYS  SYS",
            "NV4  X    SYS  SYS",
            "SYS  SYS  X    PIX",
            "SYS  SYS  PIX  X",
        ])
        .unwrap();
        assert_eq!(topo.nvlink_domains(), vec![vec![0, 1], vec![2], vec![3]]);
    }
}
