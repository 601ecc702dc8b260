//! The ring order search: which device follows which, chosen by [`choose_ring`] under the
//! objective its doc states, or given by the caller and described by [`ring_for_order`]. Every
//! [`RingChoice`] carries its edges, its bottleneck and a one-line reason for people.
//!
//! The idea is NCCL's ring search (`src/graph/search.cc`), reduced to one host and made exact: a
//! bitmask dynamic program over subsets of devices, as for the travelling-salesman problem. Edges
//! are scored by [`Link::estimate`] (the table in the [`topo` module doc](super)).

use super::{Bandwidth, Link, Topology};
use crate::error::{Error, Result};

use std::cmp::Reverse;

/// The largest topology [`choose_ring`] searches exactly; above it the order is heuristic.
/// The exact search keeps a table of `2ⁿ⁻¹ · n` costs: 8 MiB at 16 devices.
pub const MAX_EXACT_DEVICES: usize = 16;

/// One directed edge of a ring: `from` pushes to `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EdgeChoice {
    /// The sending device's index.
    pub from: usize,
    /// The receiving device's index.
    pub to: usize,
    /// How the two devices are connected.
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
    /// Exact search: no ring is better under [`choose_ring`]'s objective.
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
    /// How the order was found.
    pub search: Search,
    /// One line for people: the order, its slowest edge, and what the order avoids.
    pub reason: String,
}

impl RingChoice {
    /// The slowest edge's estimate in GB/s (10⁹ bytes per second); `None` for one device.
    pub fn bottleneck_gb_per_s(&self) -> Option<f64> {
        self.bottleneck.map(Bandwidth::gb_per_s)
    }

    /// How many edges run at the bottleneck estimate (tie-break 2 of [`choose_ring`]).
    pub fn edges_at_bottleneck(&self) -> usize {
        self.edges
            .iter()
            .filter(|e| Some(e.est) == self.bottleneck)
            .count()
    }

    /// The sum of all edge estimates, in MB/s (tie-break 3 of [`choose_ring`]).
    pub fn total_mb_per_s(&self) -> u64 {
        self.edges.iter().map(|e| u64::from(e.est.mb_per_s())).sum()
    }

    /// The edges staged through host memory (no peer access in their direction).
    pub fn staged_edges(&self) -> impl Iterator<Item = &EdgeChoice> {
        self.edges.iter().filter(|e| !e.peer)
    }
}

/// The best ring order for `topo` under the objective below, with its reason.
///
/// # The objective: the invariant this function keeps
///
/// Among all rings (orders starting at device 0), it returns the one that
///
/// 1. maximises the slowest edge's estimate (the bottleneck);
/// 2. then has the fewest edges at that bottleneck — slow hops that share a path (all `SYS` hops
///    share the one CPU interconnect) slow each other down, so fewer is better;
/// 3. then maximises the sum of all edge estimates;
/// 4. then is the lexicographically smallest order — so the answer is deterministic.
///
/// For `n ≤` [`MAX_EXACT_DEVICES`] this is exact: the bottleneck is the largest threshold for which
/// the edges at or above it contain a Hamiltonian cycle (binary search over the distinct edge scores,
/// each test a bitmask DP over subsets, `O(2ⁿ·n)`), and criteria 2–4 are a second DP over
/// `(visited set, last device)` with an additive cost, `O(2ⁿ·n²)` — 8.4 M steps for 16 devices.
/// Beyond that a documented heuristic (greedy: always the fastest next edge) takes over, and
/// [`RingChoice::search`] says so.
///
/// ```text
///   two 4-GPU NVSwitch domains joined through the CPU (NV12 inside, SYS across):
///
///     ┌──── NVSwitch ────┐          ┌──── NVSwitch ────┐
///     0 ─▶ 1 ─▶ 2 ─▶ 3 ──┼── SYS ──▶ 4 ─▶ 5 ─▶ 6 ─▶ 7 ──┼── SYS ──▶ 0
///     └──────────────────┘          └──────────────────┘
///   any ring leaves each domain at least once, so it crosses SYS ≥ 2 times; the chosen ring
///   crosses exactly twice (criterion 2), while e.g. 0→4→1→5→… crosses eight times.
/// ```
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

/// The ring order over devices `0..devices` when their topology may be unknown, and a one-line
/// reason: [`choose_ring`]'s order and reason when `topology` is known and covers exactly those
/// devices, else index order and why (`topology`'s error says what could not be read). The order
/// [`crate::Communicator::all_gpus`] builds its ring over, through
/// [`all_gpus_ring`](super::all_gpus_ring).
pub fn ring_or_index_order(
    devices: usize,
    topology: std::result::Result<Topology, String>,
) -> (Vec<usize>, String) {
    let known = topology.and_then(|topo| match topo.device_count() {
        n if n == devices => Ok(topo),
        n => Err(format!(
            "the topology has {n} devices, the driver {devices}"
        )),
    });
    match known {
        Ok(topo) => {
            let ring = choose_ring(&topo);
            (ring.order, ring.reason)
        }
        Err(why) => {
            let order: Vec<usize> = (0..devices).collect();
            let reason = format!(
                "ring {}: index order, since the topology is unknown: {why}",
                ring_path(&order)
            );
            (order, reason)
        }
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

/// The exact best order for 3 ≤ n ≤ [`MAX_EXACT_DEVICES`] ([`choose_ring`]: objective and search).
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

/// For n > [`MAX_EXACT_DEVICES`]: the better (by [`choose_ring`]'s objective) of the greedy order —
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
