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
//! # The objective, and the invariant `choose_ring` keeps
//!
//! Among all rings (orders starting at device 0), [`choose_ring`] returns the one that
//!
//! 1. maximises the slowest edge's estimate (the bottleneck);
//! 2. then has the fewest edges at that bottleneck — slow hops that share a path (all `SYS` hops
//!    share the one CPU interconnect) slow each other down, so fewer is better;
//! 3. then maximises the sum of all edge estimates;
//! 4. then is the lexicographically smallest order — so the answer is deterministic.
//!
//! For `n ≤` [`MAX_EXACT_DEVICES`] this is exact: the bottleneck is the largest threshold for which
//! the edges at or above it contain a Hamiltonian cycle (binary search over the distinct edge scores,
//! each test a bitmask DP over subsets, `O(2ⁿ·n)`), and criteria 2–4 are a second DP over
//! `(visited set, last device)` with an additive cost, `O(2ⁿ·n²)` — 8.4 M steps for 16 devices.
//! Beyond that a documented heuristic (greedy: always the fastest next edge) takes over, and
//! [`RingChoice::search`] says so.
//!
//! ```text
//!   two 4-GPU NVSwitch domains joined through the CPU (NV12 inside, SYS across):
//!
//!     ┌──── NVSwitch ────┐          ┌──── NVSwitch ────┐
//!     0 ─▶ 1 ─▶ 2 ─▶ 3 ──┼── SYS ──▶ 4 ─▶ 5 ─▶ 6 ─▶ 7 ──┼── SYS ──▶ 0
//!     └──────────────────┘          └──────────────────┘
//!   any ring leaves each domain at least once, so it crosses SYS ≥ 2 times; the chosen ring
//!   crosses exactly twice (criterion 2), while e.g. 0→4→1→5→… crosses eight times.
//! ```

use crate::error::{Error, Result};

use std::cmp::Reverse;
use std::fmt;
use std::str::FromStr;

/// One NVLink link, one direction: what `nvidia-smi nvlink -s` reports per NVLink 4 link on the
/// 2×H200 test machine (26.562 GB/s; `../shared/gpu/README.md`). NV18 → 478.8 GB/s on paper; a
/// 256 MiB peer copy measured 395 GB/s there. NVLink 3 (A100, 25 GB/s) ranks the same way.
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

/// An edge staged through pinned host memory, at best: NCCL with `NCCL_P2P_DISABLE=1` (its host
/// path) reached 27.8 GB/s busbw on the 2×H200 machine; a device→host then host→device copy measured
/// 27.7 GB/s there, half the 55 GB/s of one direction — each byte crosses PCIe twice
/// (`../shared/gpu/README.md`, `../shared/anchors/h200x2-nccl.md`). The multi-GPU article's 8×A100
/// box staged at ~13 GB/s. A staged edge scores `min(this, link's peer estimate / 2)`.
pub const HOST_STAGED_MB_PER_S: u32 = 27_800;

/// A copy within one device, one way: 4.16 TB/s measured counting read + write on an H200
/// (`../shared/gpu/README.md`). Only the diagonal of a topology has it; no ring edge does.
pub const SAME_DEVICE_MB_PER_S: u32 = 2_080_000;

/// The largest topology [`choose_ring`] searches exactly; above it the order is heuristic.
/// The exact search keeps a table of `2ⁿ⁻¹ · n` costs: 8 MiB at 16 devices.
pub const MAX_EXACT_DEVICES: usize = 16;

/// An estimated one-way bandwidth, in whole MB/s (10⁶ bytes per second), so that comparisons and
/// sums are exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bandwidth {
    mb_per_s: u32,
}

impl Bandwidth {
    pub const fn from_mb_per_s(mb_per_s: u32) -> Self {
        Bandwidth { mb_per_s }
    }

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
    NvLink { links: u32 },
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

/// One directed edge of a ring: `from` pushes to `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EdgeChoice {
    pub from: usize,
    pub to: usize,
    pub link: Link,
    /// Whether `from` has peer access to `to`; if not, the edge is staged through host memory.
    pub peer: bool,
    /// The edge's estimate: `link.estimate(peer)`.
    pub est: Bandwidth,
}

/// How a [`RingChoice`] was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Search {
    /// One or two devices: there is only one ring.
    Trivial,
    /// Exact search: no ring is better under the module's objective.
    Exact,
    /// More than [`MAX_EXACT_DEVICES`] devices: the best of the greedy order and the index order;
    /// the bottleneck is not proven the best.
    Heuristic,
    /// The order was given by the caller ([`ring_for_order`]) and only described.
    Given,
}

/// A ring order with its edges and the reason it was chosen.
#[derive(Clone, Debug, PartialEq)]
pub struct RingChoice {
    /// The devices in ring order; `order[i]` pushes to `order[(i + 1) % n]`. Starts at device 0
    /// for [`choose_ring`].
    pub order: Vec<usize>,
    /// The `n` directed edges in ring order (`n = 2`: both directions; `n = 1`: none).
    pub edges: Vec<EdgeChoice>,
    /// The slowest edge's estimate; `None` for one device.
    pub bottleneck: Option<Bandwidth>,
    pub search: Search,
    /// One line for people: the order, its slowest edge, and what the order avoids.
    pub reason: String,
}

impl RingChoice {
    pub fn bottleneck_gb_per_s(&self) -> Option<f64> {
        self.bottleneck.map(Bandwidth::gb_per_s)
    }

    /// How many edges run at the bottleneck estimate (tie-break 2 of the module doc).
    pub fn edges_at_bottleneck(&self) -> usize {
        self.edges
            .iter()
            .filter(|e| Some(e.est) == self.bottleneck)
            .count()
    }

    /// The sum of all edge estimates, in MB/s (tie-break 3 of the module doc).
    pub fn total_mb_per_s(&self) -> u64 {
        self.edges.iter().map(|e| u64::from(e.est.mb_per_s())).sum()
    }

    /// The edges staged through host memory (no peer access in their direction).
    pub fn staged_edges(&self) -> impl Iterator<Item = &EdgeChoice> {
        self.edges.iter().filter(|e| !e.peer)
    }
}

/// The best ring order for `topo` under the module's objective, with its reason.
pub fn choose_ring(topo: &Topology) -> RingChoice {
    let n = topo.device_count();
    if n <= 2 {
        describe(topo, (0..n).collect(), Search::Trivial)
    } else if n <= MAX_EXACT_DEVICES {
        describe(topo, exact_order(&topo.scores()), Search::Exact)
    } else {
        heuristic_ring(topo)
    }
}

/// The edges, bottleneck and reason of a ring order chosen by the caller (any rotation), e.g. to
/// compare it with [`choose_ring`]'s. `Err` unless `order` holds each device exactly once.
pub fn ring_for_order(topo: &Topology, order: &[usize]) -> Result<RingChoice> {
    let n = topo.device_count();
    let mut seen = vec![false; n];
    for &d in order {
        match seen.get_mut(d) {
            Some(s) if !*s => *s = true,
            Some(_) => {
                return Err(Error::InvalidArgument(format!(
                    "ring order {order:?} names device {d} twice"
                )))
            }
            None => {
                return Err(Error::InvalidArgument(format!(
                    "ring order {order:?} names device {d}, but the topology has {n} devices"
                )))
            }
        }
    }
    if order.len() != n {
        return Err(Error::InvalidArgument(format!(
            "ring order {order:?} has {} devices, the topology {n}",
            order.len()
        )));
    }
    Ok(describe(topo, order.to_vec(), Search::Given))
}

/// The directed edges of the ring `order` (a permutation of the topology's devices).
fn ring_edges(topo: &Topology, order: &[usize]) -> Vec<EdgeChoice> {
    let n = order.len();
    if n < 2 {
        return Vec::new();
    }
    (0..n)
        .map(|i| {
            let (from, to) = (order[i], order[(i + 1) % n]);
            let link = topo.link[from][to];
            let peer = topo.peer[from][to];
            EdgeChoice {
                from,
                to,
                link,
                peer,
                est: link.estimate(peer),
            }
        })
        .collect()
}

fn describe(topo: &Topology, order: Vec<usize>, search: Search) -> RingChoice {
    let edges = ring_edges(topo, &order);
    let bottleneck = edges.iter().map(|e| e.est).min();
    let mut ring = RingChoice {
        order,
        edges,
        bottleneck,
        search,
        reason: String::new(),
    };
    ring.reason = explain(topo, &ring);
    ring
}

/// Cost of one edge in the tie-break DP, for edges at or above the bottleneck `threshold`:
/// `(1 if at the threshold) << 40 | (u32::MAX − score)`. Summed over ≤ 16 edges the low part stays
/// below 2³⁶, so comparing sums compares (edges at the bottleneck, then −total) lexicographically.
fn edge_cost(score: u32, threshold: u32) -> Option<u64> {
    (score >= threshold)
        .then(|| (u64::from(score == threshold) << 40) | u64::from(u32::MAX - score))
}

/// Whether the edges with score ≥ `threshold` hold a Hamiltonian cycle. `reach[mask >> 1]` is the
/// set of devices at which a path from 0 through exactly the devices of `mask` can end (every mask
/// holds device 0, so bit 0 is dropped from the index).
fn has_ring_at(score: &[Vec<u32>], threshold: u32) -> bool {
    let n = score.len();
    let full = (1usize << n) - 1;
    // pred[u]: the devices v with an edge v → u at or above the threshold.
    let pred: Vec<u32> = (0..n)
        .map(|u| {
            (0..n)
                .filter(|&v| v != u && score[v][u] >= threshold)
                .fold(0, |set, v| set | 1 << v)
        })
        .collect();
    let mut reach = vec![0u32; 1 << (n - 1)];
    reach[0] = 1;
    for mask in (1..=full).step_by(2) {
        let ends = reach[mask >> 1];
        if ends == 0 {
            continue;
        }
        for (u, &from) in pred.iter().enumerate() {
            if mask & (1 << u) == 0 && from & ends != 0 {
                reach[(mask | 1 << u) >> 1] |= 1 << u;
            }
        }
    }
    reach[full >> 1] & pred[0] != 0
}

/// The exact best order for 3 ≤ n ≤ [`MAX_EXACT_DEVICES`] (module doc: objective and search).
fn exact_order(score: &[Vec<u32>]) -> Vec<usize> {
    let n = score.len();
    debug_assert!((3..=MAX_EXACT_DEVICES).contains(&n));
    let mut thresholds: Vec<u32> = (0..n)
        .flat_map(|v| (0..n).filter(move |&u| u != v).map(move |u| score[v][u]))
        .collect();
    thresholds.sort_unstable_by(|a, b| b.cmp(a));
    thresholds.dedup();
    // Feasibility only grows as the threshold falls, and the smallest score admits every edge of a
    // complete graph, so the first feasible threshold exists.
    let first_feasible = thresholds.partition_point(|&t| !has_ring_at(score, t));
    let threshold = thresholds.get(first_feasible).copied().unwrap_or(0);

    // best[(mask >> 1) * n + v]: the least cost of visiting every device outside `mask`, starting
    // at v (the last device visited), and closing the ring back to 0. None: impossible.
    let full = (1usize << n) - 1;
    let at = |mask: usize, v: usize| (mask >> 1) * n + v;
    let mut best: Vec<Option<u64>> = vec![None; (1 << (n - 1)) * n];
    for v in 1..n {
        best[at(full, v)] = edge_cost(score[v][0], threshold);
    }
    for mask in (1..full).rev().filter(|mask| mask & 1 == 1) {
        for v in (0..n).filter(|&v| mask & (1 << v) != 0) {
            if v == 0 && mask != 1 {
                continue; // a path from 0 that has visited others never ends at 0
            }
            best[at(mask, v)] = (0..n)
                .filter(|&u| mask & (1 << u) == 0)
                .filter_map(|u| {
                    Some(edge_cost(score[v][u], threshold)? + best[at(mask | 1 << u, u)]?)
                })
                .min();
        }
    }

    // Walk forward from 0, always to the smallest device that keeps the optimal cost: the
    // lexicographically smallest of the best orders.
    let mut order = vec![0];
    let (mut mask, mut v) = (1usize, 0usize);
    while order.len() < n {
        let want = best[at(mask, v)];
        let next = (0..n).filter(|&u| mask & (1 << u) == 0).find(|&u| {
            let cost = edge_cost(score[v][u], threshold)
                .zip(best[at(mask | 1 << u, u)])
                .map(|(c, rest)| c + rest);
            cost.is_some() && cost == want
        });
        debug_assert!(next.is_some(), "the DP found a ring at the threshold");
        // Unreachable by the argument above; stay total all the same: finish in index order.
        let u = next.unwrap_or_else(|| (0..n).find(|&u| mask & (1 << u) == 0).unwrap_or(0));
        order.push(u);
        mask |= 1 << u;
        v = u;
    }
    order
}

/// For n > [`MAX_EXACT_DEVICES`]: the better (by the module's objective) of the greedy order —
/// from 0, always to the unvisited device with the fastest edge, ties to the smallest index — and
/// the index order. `O(n²)`; no guarantee on the bottleneck.
fn heuristic_ring(topo: &Topology) -> RingChoice {
    let n = topo.device_count();
    let score = topo.scores();
    let mut greedy = vec![0];
    let mut visited = vec![false; n];
    visited[0] = true;
    let mut v = 0;
    while greedy.len() < n {
        // max_by_key keeps the last maximum; scan from the top so that it is the smallest index.
        let Some(u) = (0..n)
            .rev()
            .filter(|&u| !visited[u])
            .max_by_key(|&u| score[v][u])
        else {
            break;
        };
        visited[u] = true;
        greedy.push(u);
        v = u;
    }
    let [greedy, identity] =
        [greedy, (0..n).collect()].map(|order| describe(topo, order, Search::Heuristic));
    let key = |r: &RingChoice| {
        let smaller_order_first = Reverse(r.order.clone());
        (
            r.bottleneck,
            Reverse(r.edges_at_bottleneck()),
            r.total_mb_per_s(),
            smaller_order_first,
        )
    };
    if key(&greedy) > key(&identity) {
        greedy
    } else {
        identity
    }
}

/// `0→1→3→2→0` (or `0` for one device).
fn ring_path(order: &[usize]) -> String {
    let mut path: Vec<String> = order.iter().map(usize::to_string).collect();
    if order.len() > 1 {
        path.push(order[0].to_string());
    }
    path.join("→")
}

fn edge_label(e: &EdgeChoice) -> String {
    if e.peer {
        e.link.to_string()
    } else {
        format!("{} staged through host memory", e.link)
    }
}

fn explain(topo: &Topology, ring: &RingChoice) -> String {
    let n = ring.order.len();
    let path = ring_path(&ring.order);
    let Some(bottleneck) = ring.bottleneck else {
        return format!("ring {path}: one device, no edges: nothing crosses a link");
    };
    let mut parts: Vec<String> = Vec::new();

    let domains = topo.nvlink_domains();
    let mut domain_of = vec![0; n];
    for (id, members) in domains.iter().enumerate() {
        for &d in members {
            domain_of[d] = id;
        }
    }
    let crossing = |e: &&EdgeChoice| domain_of[e.from] != domain_of[e.to];
    let mut said_sys = false;
    if domains.len() >= 2 && domains.iter().any(|d| d.len() >= 2) {
        let k = domains.len();
        let sets: Vec<String> = domains
            .iter()
            .map(|d| {
                let ids: Vec<String> = d.iter().map(usize::to_string).collect();
                format!("{{{}}}", ids.join(","))
            })
            .collect();
        let mut via: Vec<String> = ring
            .edges
            .iter()
            .filter(crossing)
            .map(|e| e.link.to_string())
            .collect();
        via.sort();
        via.dedup();
        said_sys = via.iter().any(|l| l == "SYS");
        let crossings = ring.edges.iter().filter(crossing).count();
        let fewest = if crossings == k {
            "the fewest possible, one exit per domain".to_string()
        } else {
            format!("any ring needs at least {k}")
        };
        parts.push(format!(
            "{k} NVLink domains {} joined through {}: the ring crosses between them {crossings} \
             times ({fewest})",
            sets.join(" "),
            via.join("/")
        ));
        if ring
            .edges
            .iter()
            .filter(|e| !crossing(e))
            .all(|e| e.link.is_nvlink() && e.peer)
        {
            parts.push("every other hop NVLink".into());
        }
    } else if ring.edges.iter().all(|e| e.link.is_nvlink() && e.peer) {
        parts.push("every hop NVLink with peer access".into());
    }

    let slow: Vec<&EdgeChoice> = ring.edges.iter().filter(|e| e.est == bottleneck).collect();
    let same_label = slow
        .windows(2)
        .all(|w| edge_label(w[0]) == edge_label(w[1]));
    match slow.first() {
        Some(first) if slow.len() == ring.edges.len() && same_label => parts.push(format!(
            "all {} edges {} (~{bottleneck} est.)",
            slow.len(),
            edge_label(first)
        )),
        Some(_) if slow.len() == ring.edges.len() => {
            parts.push(format!("all {} edges at ~{bottleneck} est.", slow.len()))
        }
        Some(first) => {
            let share = if slow.len() > 1 {
                format!(
                    ", {} of {} edges at that rate",
                    slow.len(),
                    ring.edges.len()
                )
            } else {
                String::new()
            };
            parts.push(format!(
                "slowest edge {}→{} {} (~{bottleneck} est.){share}",
                first.from,
                first.to,
                edge_label(first)
            ));
        }
        None => {}
    }

    let topo_has_sys = topo.link.iter().flatten().any(|&l| l == Link::Sys);
    let ring_sys = ring.edges.iter().filter(|e| e.link == Link::Sys).count();
    if topo_has_sys && ring_sys == 0 {
        parts.push("avoids SYS hops".into());
    } else if ring_sys > 0 && !said_sys {
        parts.push(format!("crosses SYS {ring_sys} times"));
    }

    let staged: Vec<String> = ring
        .staged_edges()
        .map(|e| format!("{}→{}", e.from, e.to))
        .collect();
    let one_way_gaps = (0..n)
        .flat_map(|v| (0..n).map(move |u| (v, u)))
        .filter(|&(v, u)| v != u && !topo.peer[v][u])
        .count();
    if !staged.is_empty() {
        parts.push(format!(
            "staged through host memory for lack of peer access: {}",
            staged.join(", ")
        ));
    } else if one_way_gaps > 0 {
        parts.push(format!(
            "peer access on every edge (avoids the {one_way_gaps} directions without it)"
        ));
    }

    parts.push(match ring.search {
        Search::Trivial => "the only ring on two devices: it uses both directions".into(),
        Search::Exact => "exact search: no ring has a faster slowest edge".into(),
        Search::Heuristic => format!(
            "heuristic order ({n} devices > {MAX_EXACT_DEVICES}): the slowest edge is not proven \
             the best"
        ),
        Search::Given => "order given by the caller".into(),
    });
    format!("ring {path}: {}", parts.join("; "))
}

// ---------------------------------------------------------------------------------------------
// Detection: the topology of this host, from the CUDA driver and NVML.
// ---------------------------------------------------------------------------------------------

/// What [`detect`] found about this host's GPUs: the input of [`choose_ring`], and what is unknown.
///
/// Links come from NVML (libnvidia-ml, loaded at run time), the way `nvidia-smi topo -m` gets them:
/// for each pair (a, b), the number of *active* NVLinks of `a` whose remote end is `b` (`NV#`);
/// NVLinks that end at something that is not a GPU (an NVSwitch) connect `a` to every other GPU
/// that also has switch links — assuming one switch fabric, as on HGX boards, where `topo -m` also
/// shows `NV#` between every pair; otherwise the deepest common PCIe ancestor
/// (`nvmlDeviceGetTopologyCommonAncestor`: `PIX`, `PXB`, `PHB`, `NODE`, `SYS`). Peer access
/// comes from the CUDA driver (`cuDeviceCanAccessPeer`, per direction).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detected {
    /// Each CUDA device's PCI bus id, in CUDA ordinal order.
    pub bus_ids: Vec<String>,
    /// `links[a][b]`: the link as `nvidia-smi topo -m` labels it; `None` when it could not be
    /// read (no NVML, or a query failed — see `notes`). The diagonal is [`Link::SameDevice`].
    pub links: Vec<Vec<Option<Link>>>,
    /// `peer[from][to]`: `cuDeviceCanAccessPeer(from, to)`; the diagonal is `true`.
    pub peer: Vec<Vec<bool>>,
    /// The driver version string from NVML ("580.159.04"), when NVML loaded.
    pub nvml_driver_version: Option<String>,
    /// One line per thing that could not be read (why links are unknown); empty when all is known.
    pub notes: Vec<String>,
}

impl Detected {
    /// The [`Topology`] for [`choose_ring`]; `Err` when any link is unknown (a ring order chosen
    /// from guessed links would be a guess presented as a choice).
    pub fn topology(&self) -> Result<Topology> {
        let links = self
            .links
            .iter()
            .enumerate()
            .map(|(a, row)| {
                row.iter()
                    .enumerate()
                    .map(|(b, l)| {
                        l.ok_or_else(|| {
                            Error::InvalidArgument(format!(
                                "the link between GPU {a} and GPU {b} is unknown"
                            ))
                        })
                    })
                    .collect::<Result<Vec<Link>>>()
            })
            .collect::<Result<Vec<Vec<Link>>>>()?;
        Topology::new(links, self.peer.clone())
    }
}

/// Detects this host's topology: bus ids and peer access from the CUDA driver, links from NVML.
/// [`Error::NoGpu`] without a usable driver; a missing or failing NVML is not an error — its links
/// are `None` and [`Detected::notes`] says why. Never panics (NVML calls are guarded).
pub fn detect() -> Result<Detected> {
    use crate::device;
    let devices = device::devices()?;
    let n = devices.len();
    let bus_ids: Vec<String> = devices.iter().map(|d| d.pci_bus_id.clone()).collect();
    let peer = device::peer_matrix(n)?;
    let mut notes = Vec::new();
    let unknown = || {
        (0..n)
            .map(|a| {
                (0..n)
                    .map(|b| (a == b).then_some(Link::SameDevice))
                    .collect()
            })
            .collect()
    };
    let (links, nvml_driver_version) = match std::panic::catch_unwind(|| nvml_links(&bus_ids)) {
        Ok(Ok(found)) => found,
        Ok(Err(why)) => {
            notes.push(why);
            (unknown(), None)
        }
        Err(_) => {
            notes.push("NVML panicked while reading links; links unknown".to_string());
            (unknown(), None)
        }
    };
    if n > 1 && links.iter().flatten().any(Option::is_none) && notes.is_empty() {
        notes.push("NVML could not place some pairs; those links are unknown".to_string());
    }
    Ok(Detected {
        bus_ids,
        links,
        peer,
        nvml_driver_version,
        notes,
    })
}

/// A PCI bus id as (domain, bus, device, function), from either spelling: CUDA's
/// `"0000:19:00.0"` or NVML's `"00000000:19:00.0"`, any case. `None` if it is neither.
pub fn parse_pci_bus_id(text: &str) -> Option<(u32, u32, u32, u32)> {
    let mut parts = text.trim().split(':');
    let (domain, bus, rest) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let (device, function) = rest.split_once('.')?;
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    Some((hex(domain)?, hex(bus)?, hex(device)?, hex(function)?))
}

/// The `topo -m` label for NVML's common-ancestor level.
#[cfg(target_os = "linux")]
fn link_from_level(level: nvml_wrapper::enum_wrappers::device::TopologyLevel) -> Link {
    use nvml_wrapper::enum_wrappers::device::TopologyLevel;
    match level {
        // Two GPUs on one board (K80): nvidia-smi prints PIX for them.
        TopologyLevel::Internal | TopologyLevel::Single => Link::Pix,
        TopologyLevel::Multiple => Link::Pxb,
        TopologyLevel::HostBridge => Link::Phb,
        TopologyLevel::Node => Link::Node,
        TopologyLevel::System => Link::Sys,
    }
}

/// Combines per-pair NVLink counts and PCIe levels into `topo -m` links. `direct[a][b]`: active
/// NVLinks of `a` whose remote end is GPU `b`; `to_switch[a]`: active NVLinks of `a` that end at
/// something else (an NVSwitch); `pcie[a][b]`: the PCIe link, when known.
fn combine_links(
    direct: &[Vec<u32>],
    to_switch: &[u32],
    pcie: &[Vec<Option<Link>>],
) -> Vec<Vec<Option<Link>>> {
    let n = direct.len();
    (0..n)
        .map(|a| {
            (0..n)
                .map(|b| {
                    if a == b {
                        return Some(Link::SameDevice);
                    }
                    // Both ends see a direct link; take the larger count should they disagree.
                    let mut links = direct[a][b].max(direct[b][a]);
                    if to_switch[a] > 0 && to_switch[b] > 0 {
                        links += to_switch[a].min(to_switch[b]);
                    }
                    if links > 0 {
                        Some(Link::NvLink { links })
                    } else {
                        pcie[a][b].or(pcie[b][a])
                    }
                })
                .collect()
        })
        .collect()
}

/// `NVML_NVLINK_MAX_LINKS` of NVML 12/13 (nvml.h): link numbers run below it (18 on Hopper).
#[cfg(target_os = "linux")]
const NVML_NVLINK_MAX_LINKS: u32 = 18;

/// Links between the CUDA devices with these bus ids, and the driver version, from NVML.
/// `Err` (one line) when NVML cannot be loaded or a GPU cannot be found in it.
#[cfg(target_os = "linux")]
#[allow(clippy::type_complexity)]
fn nvml_links(
    bus_ids: &[String],
) -> std::result::Result<(Vec<Vec<Option<Link>>>, Option<String>), String> {
    use nvml_wrapper::Nvml;
    let nvml = Nvml::init()
        .map_err(|e| format!("NVML (libnvidia-ml) not available ({e}): links unknown"))?;
    let driver = nvml.sys_driver_version().ok();
    // Every GPU NVML sees (also those hidden from CUDA), so that an NVLink to a hidden GPU is not
    // mistaken for a switch link.
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML device count failed ({e}): links unknown"))?;
    let mut all_gpus = Vec::new();
    for index in 0..count {
        if let Ok(info) = nvml.device_by_index(index).and_then(|d| d.pci_info()) {
            if let Some(id) = parse_pci_bus_id(&info.bus_id) {
                all_gpus.push(id);
            }
        }
    }
    // NVML numbers GPUs in PCI order, CUDA fastest first (and after CUDA_VISIBLE_DEVICES): match
    // them by bus id, never by index.
    let mut handles = Vec::with_capacity(bus_ids.len());
    let mut nvml_index = Vec::with_capacity(bus_ids.len());
    for bus_id in bus_ids {
        let wanted = parse_pci_bus_id(bus_id);
        let found = (0..count).find_map(|index| {
            let device = nvml.device_by_index(index).ok()?;
            let id = parse_pci_bus_id(&device.pci_info().ok()?.bus_id);
            (id.is_some() && id == wanted).then_some((index, device))
        });
        let Some((index, device)) = found else {
            return Err(format!(
                "NVML does not list the GPU at {bus_id}: links unknown"
            ));
        };
        handles.push(device);
        nvml_index.push(index);
    }
    let n = handles.len();
    let mut direct = vec![vec![0u32; n]; n];
    let mut to_switch = vec![0u32; n];
    for (a, device) in handles.iter().enumerate() {
        for link in 0..NVML_NVLINK_MAX_LINKS {
            let wrapper = device.link_wrapper_for(link);
            // Errors (NotSupported: a GPU without NVLink, or a link number it does not have) mean
            // "not an active link".
            if !wrapper.is_active().unwrap_or(false) {
                continue;
            }
            let remote = wrapper
                .remote_pci_info()
                .ok()
                .and_then(|info| parse_pci_bus_id(&info.bus_id));
            let target = remote.and_then(|r| {
                bus_ids
                    .iter()
                    .position(|id| parse_pci_bus_id(id) == Some(r))
            });
            match target {
                Some(b) if b != a => direct[a][b] += 1,
                Some(_) => {}
                None if remote.is_some_and(|r| all_gpus.contains(&r)) => {} // a GPU hidden from CUDA
                None => to_switch[a] += 1,
            }
        }
    }
    let mut pcie = vec![vec![None; n]; n];
    for a in 0..n {
        for b in (a + 1)..n {
            // The call takes the other device by value; `Device` is a plain handle, so ask again.
            let Ok(other) = nvml.device_by_index(nvml_index[b]) else {
                continue;
            };
            pcie[a][b] = handles[a]
                .topology_common_ancestor(other)
                .ok()
                .map(link_from_level);
        }
    }
    Ok((combine_links(&direct, &to_switch, &pcie), driver))
}

#[cfg(not(target_os = "linux"))]
#[allow(clippy::type_complexity)]
fn nvml_links(
    _bus_ids: &[String],
) -> std::result::Result<(Vec<Vec<Option<Link>>>, Option<String>), String> {
    Err("NVML topology queries are Linux-only here: links unknown".to_string())
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

    /// Every order starting at 0, by brute force: whether any uses only edges ≥ `threshold`.
    fn brute_has_ring(score: &[Vec<u32>], threshold: u32) -> bool {
        fn go(score: &[Vec<u32>], t: u32, path: &mut Vec<usize>) -> bool {
            let n = score.len();
            let last = path[path.len() - 1];
            if path.len() == n {
                return score[last][0] >= t;
            }
            for u in 1..n {
                if !path.contains(&u) && score[last][u] >= t {
                    path.push(u);
                    if go(score, t, path) {
                        return true;
                    }
                    path.pop();
                }
            }
            false
        }
        go(score, threshold, &mut vec![0])
    }

    #[test]
    fn hamiltonian_test_matches_brute_force() {
        // Scores from a small linear congruential generator: deterministic, varied, directed.
        let mut state: u32 = 12345;
        let mut next = || {
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12345);
            (state >> 16) % 5
        };
        for n in 3..=7 {
            for _ in 0..40 {
                let score: Vec<Vec<u32>> = (0..n)
                    .map(|v| (0..n).map(|u| if u == v { 0 } else { next() }).collect())
                    .collect();
                for t in 0..=5 {
                    assert_eq!(
                        has_ring_at(&score, t),
                        brute_has_ring(&score, t),
                        "n {n}, threshold {t}, scores {score:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn edge_cost_orders_count_before_total() {
        let t = 10;
        let one_at_threshold_else_fast =
            edge_cost(10, t).unwrap() + 3 * edge_cost(1000, t).unwrap();
        let none_at_threshold_all_slowish = 4 * edge_cost(11, t).unwrap();
        assert!(none_at_threshold_all_slowish < one_at_threshold_else_fast);
        assert!(edge_cost(12, t) < edge_cost(11, t));
        assert_eq!(edge_cost(9, t), None);
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

    #[test]
    fn pci_bus_ids_parse_in_both_spellings() {
        assert_eq!(parse_pci_bus_id("0000:19:00.0"), Some((0, 0x19, 0, 0)));
        assert_eq!(parse_pci_bus_id("00000000:19:00.0"), Some((0, 0x19, 0, 0)));
        assert_eq!(parse_pci_bus_id("0001:AB:1f.7"), Some((1, 0xab, 0x1f, 7)));
        assert_eq!(parse_pci_bus_id("19:00.0"), None);
        assert_eq!(parse_pci_bus_id("0000:19:00"), None);
        assert_eq!(parse_pci_bus_id("0000:zz:00.0"), None);
        assert_eq!(parse_pci_bus_id("0:0:0:0.0"), None);
    }

    #[test]
    fn nvlink_counts_and_pcie_levels_combine_like_topo_m() {
        // 2×H200 with 18 direct links each way: NV18.
        let links = combine_links(
            &[vec![0, 18], vec![18, 0]],
            &[0, 0],
            &[vec![None, Some(Link::Sys)], vec![None, None]],
        );
        assert_eq!(links[0][1], Some(Link::NvLink { links: 18 }));
        assert_eq!(links[1][0], Some(Link::NvLink { links: 18 }));
        assert_eq!(links[0][0], Some(Link::SameDevice));
        // Through an NVSwitch: no direct links, 18 switch links each → NV18 between every pair.
        let none = vec![vec![0; 3]; 3];
        let links = combine_links(
            &none,
            &[18, 18, 0],
            &[
                vec![None, None, Some(Link::Pix)],
                vec![None; 3],
                vec![None; 3],
            ],
        );
        assert_eq!(links[0][1], Some(Link::NvLink { links: 18 }));
        // GPU 2 has no NVLink: PCIe from either half of the matrix; unknown stays unknown.
        assert_eq!(links[0][2], Some(Link::Pix));
        assert_eq!(links[2][0], Some(Link::Pix));
        assert_eq!(links[1][2], None);
    }

    #[test]
    fn detected_topology_needs_every_link() {
        let mut d = Detected {
            bus_ids: vec!["0000:19:00.0".into(), "0000:3b:00.0".into()],
            links: vec![
                vec![Some(Link::SameDevice), None],
                vec![None, Some(Link::SameDevice)],
            ],
            peer: vec![vec![true; 2]; 2],
            nvml_driver_version: None,
            notes: vec![],
        };
        assert!(d.topology().is_err());
        d.links[0][1] = Some(Link::NvLink { links: 18 });
        d.links[1][0] = Some(Link::NvLink { links: 18 });
        let ring = choose_ring(&d.topology().expect("all links known"));
        assert_eq!(ring.order, vec![0, 1]);
    }

    #[test]
    fn detect_without_a_gpu_is_no_gpu() {
        if crate::device::driver_available().is_ok() {
            eprintln!("detect_without_a_gpu_is_no_gpu: waived: this host has a GPU");
            return;
        }
        assert!(matches!(detect(), Err(Error::NoGpu { .. })));
    }
}
