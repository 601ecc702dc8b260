//! Ring order on synthetic topologies, checked against brute force over every order.
//!
//! Each scenario is a box from the topology issue: two NVSwitch domains joined through the CPU,
//! PCIe-only boxes, asymmetric peer access, a fully connected NVSwitch box. The brute force scores
//! edges with `Topology::estimate` alone and ranks orders by its own key, so it checks the search,
//! not the search against itself.

use proptest::prelude::*;
use ringreduce::topo::{
    all_gpus_ring, choose_ring, ring_for_order, ring_or_index_order, Bandwidth, Link, RingChoice,
    Search, Topology, MAX_EXACT_DEVICES, NVLINK_PER_LINK_MB_PER_S, SYS_MB_PER_S,
};
use ringreduce::{Communicator, Error};

use std::cmp::Reverse;
use std::time::Instant;

/// The module's objective, computed independently: bottleneck (higher is better), edges at the
/// bottleneck (fewer), total (higher), then the order itself (smaller).
type Key = (u32, Reverse<usize>, u64, Reverse<Vec<usize>>);

fn key(topo: &Topology, order: &[usize]) -> Key {
    let n = order.len();
    let est: Vec<u32> = (0..n)
        .map(|i| {
            topo.estimate(order[i], order[(i + 1) % n])
                .expect("devices in range")
                .mb_per_s()
        })
        .collect();
    let bottleneck = *est.iter().min().expect("n ≥ 2");
    let at_bottleneck = est.iter().filter(|&&e| e == bottleneck).count();
    let total = est.iter().map(|&e| u64::from(e)).sum();
    (
        bottleneck,
        Reverse(at_bottleneck),
        total,
        Reverse(order.to_vec()),
    )
}

/// Every order starting at device 0, in lexicographic order.
fn all_orders(n: usize) -> Vec<Vec<usize>> {
    fn go(n: usize, order: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if order.len() == n {
            out.push(order.clone());
            return;
        }
        for d in 1..n {
            if !order.contains(&d) {
                order.push(d);
                go(n, order, out);
                order.pop();
            }
        }
    }
    let mut out = Vec::new();
    go(n, &mut vec![0], &mut out);
    out
}

/// The best order by brute force, and the best bottleneck any order reaches.
fn brute_force(topo: &Topology) -> (Vec<usize>, u32) {
    let best = all_orders(topo.device_count())
        .into_iter()
        .max_by_key(|order| key(topo, order))
        .expect("at least one order");
    let bottleneck = key(topo, &best).0;
    (best, bottleneck)
}

fn bottleneck_mb_per_s(ring: &RingChoice) -> u32 {
    ring.bottleneck.expect("n ≥ 2 has edges").mb_per_s()
}

fn count_link(ring: &RingChoice, link: Link) -> usize {
    ring.edges.iter().filter(|e| e.link == link).count()
}

/// Checks that hold for any ring `choose_ring` returns on `topo`.
fn assert_well_formed(topo: &Topology, ring: &RingChoice) {
    let n = topo.device_count();
    assert_eq!(ring.order.first(), Some(&0), "{ring:?}");
    let mut sorted = ring.order.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..n).collect::<Vec<_>>(),
        "not a permutation: {ring:?}"
    );
    assert_eq!(ring.edges.len(), if n == 1 { 0 } else { n });
    for (i, e) in ring.edges.iter().enumerate() {
        assert_eq!((e.from, e.to), (ring.order[i], ring.order[(i + 1) % n]));
        assert_eq!(Some(e.est), topo.estimate(e.from, e.to));
        assert_eq!(Some(e.link), topo.link(e.from, e.to));
        assert_eq!(Some(e.peer), topo.peer(e.from, e.to));
    }
    assert_eq!(ring.bottleneck, ring.edges.iter().map(|e| e.est).min());
    let path: Vec<String> = ring.order.iter().map(usize::to_string).collect();
    assert!(
        ring.reason.starts_with(&format!("ring {}", path.join("→"))),
        "{}",
        ring.reason
    );
}

/// Two NVSwitch domains of four GPUs each (NV12 inside, SYS between): `domain_of(d)` says which.
fn two_domains(domain_of: impl Fn(usize) -> usize) -> Topology {
    let link = (0..8)
        .map(|i| {
            (0..8)
                .map(|j| match () {
                    _ if i == j => Link::SameDevice,
                    _ if domain_of(i) == domain_of(j) => Link::NvLink { links: 12 },
                    _ => Link::Sys,
                })
                .collect()
        })
        .collect();
    Topology::with_full_peer(link).unwrap()
}

fn sys_crossings(ring: &RingChoice) -> usize {
    count_link(ring, Link::Sys)
}

#[test]
fn two_nvswitch_domains_cross_sys_exactly_twice() {
    let topo = two_domains(|d| d / 4);
    let ring = choose_ring(&topo);
    assert_well_formed(&topo, &ring);
    assert_eq!(ring.search, Search::Exact);
    assert_eq!(ring.order, (0..8).collect::<Vec<_>>());
    assert_eq!(sys_crossings(&ring), 2, "{}", ring.reason);
    assert_eq!(bottleneck_mb_per_s(&ring), SYS_MB_PER_S);

    // Two is the minimum over all 5040 rings, and the bottleneck is the best any reaches.
    let (best, best_bottleneck) = brute_force(&topo);
    let fewest = all_orders(8)
        .iter()
        .map(|o| sys_crossings(&ring_for_order(&topo, o).unwrap()))
        .min();
    assert_eq!(fewest, Some(2));
    assert_eq!(bottleneck_mb_per_s(&ring), best_bottleneck);
    assert_eq!(ring.order, best);

    // The tie-break is real: an interleaved order has the same bottleneck but eight SYS hops.
    let bad = ring_for_order(&topo, &[0, 4, 1, 5, 2, 6, 3, 7]).unwrap();
    assert_eq!(bad.search, Search::Given);
    assert_eq!(bad.bottleneck, ring.bottleneck);
    assert_eq!(sys_crossings(&bad), 8);
    assert!(bad.edges_at_bottleneck() > ring.edges_at_bottleneck());
    assert!(bad.total_mb_per_s() < ring.total_mb_per_s());

    println!("{}", ring.reason);
    for needle in [
        "2 NVLink domains {0,1,2,3} {4,5,6,7}",
        "2 times",
        "fewest possible",
    ] {
        assert!(
            ring.reason.contains(needle),
            "{needle:?} in {}",
            ring.reason
        );
    }
    assert!(
        ring.reason.contains("every other hop NVLink"),
        "{}",
        ring.reason
    );
}

#[test]
fn interleaved_domains_are_not_walked_in_index_order() {
    // GPUs numbered alternately across the two domains: the index order 0→1→…→7 would cross SYS
    // at every hop, so only the bottleneck-count tie-break finds the two-crossing ring.
    let topo = two_domains(|d| d % 2);
    let ring = choose_ring(&topo);
    assert_well_formed(&topo, &ring);
    // Of the two-crossing rings, the smallest order leaves 0's domain at once and comes back last.
    assert_eq!(ring.order, vec![0, 1, 3, 5, 7, 2, 4, 6]);
    assert_eq!(sys_crossings(&ring), 2);
    assert_eq!(ring.order, brute_force(&topo).0);
    let index_order = ring_for_order(&topo, &(0..8).collect::<Vec<_>>()).unwrap();
    assert_eq!(sys_crossings(&index_order), 8);
    assert!(
        ring.reason.contains("{0,2,4,6} {1,3,5,7}"),
        "{}",
        ring.reason
    );
}

#[test]
fn two_domains_without_peer_across_still_cross_twice() {
    // The article's box with no peer access across the CPU: the crossings are staged.
    let mut topo = two_domains(|d| d / 4);
    for a in 0..4 {
        for b in 4..8 {
            topo = topo.deny_peer(a, b).unwrap().deny_peer(b, a).unwrap();
        }
    }
    let ring = choose_ring(&topo);
    assert_well_formed(&topo, &ring);
    assert_eq!(sys_crossings(&ring), 2);
    assert_eq!(ring.staged_edges().count(), 2);
    assert_eq!(
        bottleneck_mb_per_s(&ring),
        Link::Sys.staged_estimate().mb_per_s()
    );
    assert_eq!(ring.order, brute_force(&topo).0);
    assert!(
        ring.reason.contains("staged through host memory"),
        "{}",
        ring.reason
    );
}

#[test]
fn pcie_box_keeps_switch_pairs_adjacent() {
    // Four GPUs, pairs {0,2} and {1,3} under one PCIe switch each, the switches under the CPU.
    let topo = Topology::from_labels(&[
        "X   PHB PIX PHB",
        "PHB X   PHB PIX",
        "PIX PHB X   PHB",
        "PHB PIX PHB X",
    ])
    .unwrap();
    let ring = choose_ring(&topo);
    assert_well_formed(&topo, &ring);
    assert_eq!(count_link(&ring, Link::Pix), 2, "{}", ring.reason);
    assert_eq!(ring.bottleneck, Some(Link::Phb.peer_estimate()));
    assert_eq!(ring.edges_at_bottleneck(), 2);
    assert_eq!(ring.order, brute_force(&topo).0);
    // The index order has the same bottleneck but four PHB hops.
    let index_order = ring_for_order(&topo, &[0, 1, 2, 3]).unwrap();
    assert_eq!(index_order.edges_at_bottleneck(), 4);
}

#[test]
fn two_socket_pcie_box_uses_every_switch_pair_and_crosses_sys_twice() {
    // Eight GPUs: switch pairs (0,4) (1,5) (2,6) (3,7) (PIX); pairs {0,4,1,5} and {2,6,3,7} share a
    // socket (PXB between their switches); SYS across sockets.
    let socket = |d: usize| (d % 4) / 2;
    let link = (0..8)
        .map(|i| {
            (0..8)
                .map(|j| match () {
                    _ if i == j => Link::SameDevice,
                    _ if i % 4 == j % 4 => Link::Pix,
                    _ if socket(i) == socket(j) => Link::Pxb,
                    _ => Link::Sys,
                })
                .collect()
        })
        .collect();
    let topo = Topology::with_full_peer(link).unwrap();
    let ring = choose_ring(&topo);
    assert_well_formed(&topo, &ring);
    assert_eq!(count_link(&ring, Link::Sys), 2, "{}", ring.reason);
    assert_eq!(count_link(&ring, Link::Pix), 4, "{}", ring.reason);
    assert_eq!(ring.bottleneck, Some(Link::Sys.peer_estimate()));
    assert_eq!(ring.order, brute_force(&topo).0);
    assert!(
        ring.reason.contains("crosses SYS 2 times"),
        "{}",
        ring.reason
    );
}

#[test]
fn pcie_box_without_sys_says_it_avoids_nothing_it_does_not_have() {
    let topo = Topology::uniform(3, Link::Pix).unwrap();
    let ring = choose_ring(&topo);
    assert!(!ring.reason.contains("SYS"), "{}", ring.reason);
    let with_sys = Topology::from_labels(&["X PIX SYS", "PIX X PIX", "SYS PIX X"]).unwrap();
    let ring = choose_ring(&with_sys);
    // On three devices every ring uses all three pairs, one way or the other.
    assert_eq!(count_link(&ring, Link::Sys), 1);
}

#[test]
fn asymmetric_peer_access_picks_the_direction_that_has_it() {
    // Four NV4 GPUs; peer access is missing exactly along the index-order ring 0→1→2→3→0, so the
    // smallest order would be staged: the ring must run the other way round.
    let topo = Topology::uniform(4, Link::NvLink { links: 4 })
        .and_then(|t| t.deny_peer(0, 1))
        .and_then(|t| t.deny_peer(1, 2))
        .and_then(|t| t.deny_peer(2, 3))
        .and_then(|t| t.deny_peer(3, 0))
        .unwrap();
    let ring = choose_ring(&topo);
    assert_well_formed(&topo, &ring);
    assert_eq!(ring.order, vec![0, 3, 2, 1]);
    assert_eq!(ring.staged_edges().count(), 0, "{}", ring.reason);
    assert_eq!(ring.order, brute_force(&topo).0);
    let forward = ring_for_order(&topo, &[0, 1, 2, 3]).unwrap();
    assert_eq!(forward.staged_edges().count(), 4);
    assert!(forward.bottleneck < ring.bottleneck);
    assert!(
        ring.reason.contains("peer access on every edge"),
        "{}",
        ring.reason
    );
}

#[test]
fn when_no_ring_avoids_staging_the_fastest_staged_edge_is_used() {
    // Device 0 has no peer access to anyone: every ring stages the edge out of 0. Staged over NV4
    // beats staged over PIX, so 0 sends to 1.
    let topo = Topology::from_labels(&["X NV4 PIX", "NV4 X NV4", "PIX NV4 X"])
        .and_then(|t| t.deny_peer(0, 1))
        .and_then(|t| t.deny_peer(0, 2))
        .unwrap();
    let ring = choose_ring(&topo);
    assert_well_formed(&topo, &ring);
    assert_eq!(ring.order, vec![0, 1, 2]);
    assert_eq!(ring.order, brute_force(&topo).0);
    let staged: Vec<(usize, usize)> = ring.staged_edges().map(|e| (e.from, e.to)).collect();
    assert_eq!(staged, vec![(0, 1)]);
    assert!(ring.reason.contains("0→1"), "{}", ring.reason);
}

#[test]
fn fewer_edges_at_the_bottleneck_beats_a_larger_total() {
    // Every ring runs at PIX speed (0 has PIX to 1 and 2, NV1 to 3). The ring 0→1→3→2→0 takes
    // NV18 but both PIX edges; 0→2→1→3→0 takes only one PIX edge and a smaller total. Fewer slow
    // hops wins (criterion 2 before 3).
    let topo = Topology::from_labels(&[
        "X    PIX  PIX  NV1",
        "PIX  X    NV1  NV18",
        "PIX  NV1  X    NV2",
        "NV1  NV18 NV2  X",
    ])
    .unwrap();
    let ring = choose_ring(&topo);
    assert_well_formed(&topo, &ring);
    assert_eq!(ring.order, vec![0, 2, 1, 3]);
    assert_eq!(ring.bottleneck, Some(Link::Pix.peer_estimate()));
    assert_eq!(ring.edges_at_bottleneck(), 1);
    let bigger_total = ring_for_order(&topo, &[0, 1, 3, 2]).unwrap();
    assert_eq!(bigger_total.bottleneck, ring.bottleneck);
    assert_eq!(bigger_total.edges_at_bottleneck(), 2);
    assert!(bigger_total.total_mb_per_s() > ring.total_mb_per_s());
    assert_eq!(ring.order, brute_force(&topo).0);
}

#[test]
fn fully_connected_nvswitch_box_keeps_index_order() {
    let topo = Topology::uniform(8, Link::NvLink { links: 18 }).unwrap();
    let ring = choose_ring(&topo);
    assert_well_formed(&topo, &ring);
    assert_eq!(ring.order, (0..8).collect::<Vec<_>>());
    assert_eq!(
        ring.bottleneck,
        Some(Bandwidth::from_mb_per_s(18 * NVLINK_PER_LINK_MB_PER_S))
    );
    assert_eq!(ring.bottleneck_gb_per_s(), Some(478.8));
    assert_eq!(ring.edges_at_bottleneck(), 8);
    assert!(ring.reason.contains("every hop NVLink"), "{}", ring.reason);
    assert!(
        ring.reason.contains("NV18 (~478.8 GB/s est.)"),
        "{}",
        ring.reason
    );
}

#[test]
fn one_and_two_devices() {
    let one = Topology::uniform(1, Link::Sys).unwrap();
    let ring = choose_ring(&one);
    assert_eq!(ring.order, vec![0]);
    assert!(ring.edges.is_empty());
    assert_eq!(ring.bottleneck, None);
    assert_eq!(ring.search, Search::Trivial);
    assert_well_formed(&one, &ring);

    // Two devices: both directions are edges, and the slower one (no peer 1→0) is the bottleneck.
    let two = Topology::uniform(2, Link::NvLink { links: 18 })
        .and_then(|t| t.deny_peer(1, 0))
        .unwrap();
    let ring = choose_ring(&two);
    assert_well_formed(&two, &ring);
    assert_eq!(ring.order, vec![0, 1]);
    let directions: Vec<(usize, usize, bool)> =
        ring.edges.iter().map(|e| (e.from, e.to, e.peer)).collect();
    assert_eq!(directions, vec![(0, 1, true), (1, 0, false)]);
    assert_eq!(
        ring.bottleneck,
        Some(Link::NvLink { links: 18 }.staged_estimate())
    );
    assert!(ring.reason.contains("1→0"), "{}", ring.reason);
}

/// What `Communicator::all_gpus` builds its ring over: `choose_ring`'s order where the topology
/// is known — here one whose index order crosses SYS at every hop — and index order, saying why,
/// where it is not (or does not cover the driver's devices).
#[test]
fn all_gpus_order_is_the_chosen_ring_or_index_order_with_the_reason() {
    let topo = two_domains(|d| d % 2);
    let chosen = choose_ring(&topo);
    let (order, reason) = ring_or_index_order(8, Ok(topo.clone()));
    assert_eq!(order, chosen.order);
    assert_ne!(order, (0..8).collect::<Vec<_>>());
    assert_eq!(reason, chosen.reason);

    let why = "the link between GPU 0 and GPU 1 is unknown (NVML not loaded)";
    let (order, reason) = ring_or_index_order(3, Err(why.to_string()));
    assert_eq!(order, vec![0, 1, 2]);
    assert!(reason.starts_with("ring 0→1→2→0: index order"), "{reason}");
    assert!(reason.contains(why), "{reason}");

    let (order, reason) = ring_or_index_order(4, Ok(topo));
    assert_eq!(order, vec![0, 1, 2, 3]);
    assert!(reason.contains("8 devices, the driver 4"), "{reason}");
}

/// Without a GPU, `all_gpus` fails as it always has, with the driver's `device_count` error;
/// with GPUs, its ranks are `all_gpus_ring`'s order.
#[test]
fn all_gpus_follows_all_gpus_ring() {
    match ringreduce::device_count() {
        Err(no_gpu) => {
            assert!(matches!(no_gpu, Error::NoGpu { .. }), "{no_gpu:?}");
            assert_eq!(all_gpus_ring().err(), Some(no_gpu.clone()));
            assert_eq!(Communicator::all_gpus().err(), Some(no_gpu));
        }
        Ok(_) => {
            let (order, reason) = all_gpus_ring().unwrap();
            println!("{reason}");
            let comm = Communicator::all_gpus().unwrap();
            assert_eq!(comm.devices(), order);
            comm.close().unwrap();
        }
    }
}

#[test]
fn invalid_topologies_are_errors() {
    let invalid = |r: Result<Topology, Error>, why: &str| match r {
        Err(Error::InvalidArgument(msg)) => println!("{why}: {msg}"),
        other => panic!("{why}: expected InvalidArgument, got {other:?}"),
    };
    let nv = Link::NvLink { links: 2 };
    invalid(Topology::with_full_peer(vec![]), "empty");
    invalid(
        Topology::with_full_peer(vec![vec![Link::SameDevice, nv], vec![nv]]),
        "not square",
    );
    invalid(
        Topology::new(
            vec![vec![Link::SameDevice, nv], vec![nv, Link::SameDevice]],
            vec![vec![true, true]],
        ),
        "peer has too few rows",
    );
    invalid(
        Topology::new(
            vec![vec![Link::SameDevice, nv], vec![nv, Link::SameDevice]],
            vec![vec![true, true], vec![true]],
        ),
        "peer row too short",
    );
    invalid(
        Topology::from_labels(&["PIX PIX", "PIX X"]),
        "diagonal not X",
    );
    invalid(Topology::from_labels(&["X X", "X X"]), "X off the diagonal");
    invalid(Topology::from_labels(&["X PIX", "PHB X"]), "not symmetric");
    invalid(Topology::from_labels(&["X NV0", "NV0 X"]), "NV0 label");
    invalid(
        Topology::with_full_peer(vec![
            vec![Link::SameDevice, Link::NvLink { links: 0 }],
            vec![Link::NvLink { links: 0 }, Link::SameDevice],
        ]),
        "NV0 value",
    );
    invalid(Topology::from_labels(&["X NVL", "NVL X"]), "unknown label");
    invalid(
        Topology::uniform(2, Link::Sys).and_then(|t| t.deny_peer(0, 2)),
        "deny out of range",
    );
    invalid(
        Topology::uniform(2, Link::Sys).and_then(|t| t.deny_peer(1, 1)),
        "deny self",
    );

    let topo = Topology::uniform(3, Link::Pix).unwrap();
    for bad in [&[0, 1][..], &[0, 1, 1], &[0, 1, 3], &[0, 1, 2, 0]] {
        assert!(
            matches!(ring_for_order(&topo, bad), Err(Error::InvalidArgument(_))),
            "{bad:?}"
        );
    }
    assert_eq!(topo.link(0, 3), None);
    assert_eq!(topo.peer(3, 0), None);
    assert_eq!(topo.estimate(0, 3), None);
    // Any rotation of a ring is accepted as given.
    assert_eq!(
        ring_for_order(&topo, &[2, 0, 1]).unwrap().order,
        vec![2, 0, 1]
    );
}

#[test]
fn sixteen_devices_are_searched_exactly_and_quickly() {
    // Four NVSwitch domains of four, interleaved (domain = d % 4), SYS between.
    let link = (0..16)
        .map(|i| {
            (0..16)
                .map(|j| match () {
                    _ if i == j => Link::SameDevice,
                    _ if i % 4 == j % 4 => Link::NvLink { links: 12 },
                    _ => Link::Sys,
                })
                .collect()
        })
        .collect();
    let topo = Topology::with_full_peer(link).unwrap();
    assert_eq!(topo.device_count(), MAX_EXACT_DEVICES);
    let start = Instant::now();
    let ring = choose_ring(&topo);
    let elapsed = start.elapsed();
    println!("16 devices: {elapsed:?}; {}", ring.reason);
    assert_well_formed(&topo, &ring);
    assert_eq!(ring.search, Search::Exact);
    assert_eq!(sys_crossings(&ring), 4, "{}", ring.reason);
    assert_eq!(
        ring.order,
        vec![0, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 4, 8, 12]
    );
    assert!(ring.reason.contains("4 NVLink domains"), "{}", ring.reason);
    assert!(elapsed.as_secs() < 10, "{elapsed:?}");
}

#[test]
fn beyond_sixteen_devices_the_heuristic_is_labelled_and_sane() {
    // Two interleaved NVSwitch domains of ten: greedy walks one domain, then the other.
    let n = 20;
    let link = (0..n)
        .map(|i| {
            (0..n)
                .map(|j| match () {
                    _ if i == j => Link::SameDevice,
                    _ if i % 2 == j % 2 => Link::NvLink { links: 18 },
                    _ => Link::Sys,
                })
                .collect()
        })
        .collect();
    let topo = Topology::with_full_peer(link).unwrap();
    let ring = choose_ring(&topo);
    assert_well_formed(&topo, &ring);
    assert_eq!(ring.search, Search::Heuristic);
    assert_eq!(sys_crossings(&ring), 2, "{}", ring.reason);
    assert!(ring.reason.contains("heuristic"), "{}", ring.reason);
    assert_eq!(choose_ring(&topo), ring);

    let big = Topology::uniform(200, Link::Pix).unwrap();
    let ring = choose_ring(&big);
    assert_well_formed(&big, &ring);
    assert_eq!(ring.order, (0..200).collect::<Vec<_>>());
}

fn arb_link() -> impl Strategy<Value = Link> {
    prop_oneof![
        (1u32..=18).prop_map(|links| Link::NvLink { links }),
        Just(Link::Pix),
        Just(Link::Pxb),
        Just(Link::Phb),
        Just(Link::Node),
        Just(Link::Sys),
    ]
}

/// A random topology on 3..=8 devices: any symmetric link matrix, peer access missing in about
/// one direction in five.
fn arb_topology() -> impl Strategy<Value = Topology> {
    (3usize..=8).prop_flat_map(|n| {
        (
            proptest::collection::vec(arb_link(), n * n),
            proptest::collection::vec(proptest::bool::weighted(0.8), n * n),
        )
            .prop_map(move |(link_flat, peer_flat)| {
                // Pair {i, j} takes the link drawn for (min, max): symmetric by construction.
                let link = (0..n)
                    .map(|i| {
                        (0..n)
                            .map(|j| {
                                if i == j {
                                    Link::SameDevice
                                } else {
                                    link_flat[i.min(j) * n + i.max(j)]
                                }
                            })
                            .collect()
                    })
                    .collect();
                let peer = peer_flat.chunks(n).map(<[bool]>::to_vec).collect();
                Topology::new(link, peer).expect("generated topologies are valid")
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn chosen_ring_is_the_brute_force_optimum(topo in arb_topology()) {
        let ring = choose_ring(&topo);
        assert_well_formed(&topo, &ring);
        let (best, best_bottleneck) = brute_force(&topo);
        prop_assert_eq!(bottleneck_mb_per_s(&ring), best_bottleneck);
        prop_assert_eq!(&ring.order, &best, "{}", ring.reason);
        prop_assert_eq!(&choose_ring(&topo), &ring);
        prop_assert_eq!(ring_for_order(&topo, &ring.order).unwrap().edges, ring.edges);
    }
}
