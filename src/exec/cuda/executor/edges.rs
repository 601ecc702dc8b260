//! The ring's edges: how each moves data ([`EdgeInfo`]: peer copies or pinned-host staging, and
//! why), the probe that times each edge at creation, and the chunk size a message is cut into.
//!
//! Peer edges push: the sender's copy engine writes into the receiver's staging slot
//! (`cuMemcpyPeerAsync` on the sender's Send stream), the receiver's Reduce stream folds it in with
//! a kernel. Push measured 15–30% faster than pull on the 2×H200 test machine. Staged edges copy
//! device→pinned host on the sender's Send stream and host→device on the receiver's Recv stream
//! (two PCIe directions busy at once), with events between.
//!
//! Each rank decides its own outgoing edge from how its context reaches the receiver's GPU
//! (the fabric's [`Reach`], asked by the receiver's identity), and probes its own halves of its
//! two edges; the ranks all-gather what they found (module `fabric`), so the decision and the
//! probe are the same code whatever the ranks' placement.
//!
//! Invariant: edge `r` runs from rank `r` to rank `(r + 1) mod world`, and an edge is `Peer` only
//! where its sender reaches its receiver's memory directly (the same GPU, or peer access enabled).

use super::rank::RankRes;
use super::Transport;
use crate::device::DeviceBuffer;
use crate::error::{Error, Result};
use crate::exec::cuda::fabric::{
    pack_bus_id, push_text, Exported, Fabric, Fields, Identity, Reach, Record,
};
use crate::exec::cuda::probe::{self, Probe};
use crate::plan::{EdgeTransport, StreamKind};
use crate::topo::{self, Link};

/// The chunk size for a message: about a quarter of a segment, at least 4 MiB (or the whole
/// segment when smaller), at most 64 MiB; from 32 MiB segments on, half a segment, at most
/// 128 MiB; at most 4 MiB when any edge is staged. Every CUDA call costs host time, so small
/// chunks only pay while the host keeps up, and fewer, larger chunks win on large segments; a
/// staged edge is a three-stage pipeline (device→host, host→device, reduce) that does best with
/// small chunks. The sweeps that set these numbers are in docs/PERFORMANCE.md, "Choosing the
/// ring's chunk".
pub fn auto_chunk_bytes(count: usize, world: usize, elem_bytes: usize, staged: bool) -> usize {
    let segment_bytes = count.div_ceil(world.max(1)) * elem_bytes;
    if staged {
        return (segment_bytes / 4)
            .max(segment_bytes.min(4 << 20))
            .clamp(elem_bytes.max(1), 4 << 20);
    }
    if segment_bytes >= 32 << 20 {
        return (segment_bytes / 2).min(128 << 20);
    }
    (segment_bytes / 4)
        .max(segment_bytes.min(4 << 20))
        .clamp(elem_bytes.max(1), 64 << 20)
}

/// How one ring edge was set up, why, and (when probed) how fast it measured.
#[derive(Clone, Debug, PartialEq)]
pub struct EdgeInfo {
    /// The sending rank.
    pub from_rank: usize,
    /// The receiving rank, `(from_rank + 1) mod world`.
    pub to_rank: usize,
    /// The sending rank's CUDA device ordinal, in the sending rank's process.
    pub from_device: usize,
    /// The receiving rank's CUDA device ordinal, in the receiving rank's process.
    pub to_device: usize,
    /// How the edge moves data: peer copies or staged through pinned host memory.
    pub transport: EdgeTransport,
    /// Why that transport was chosen, for people (and, if the probe failed, why it has no figure).
    pub reason: String,
    /// The link between the two GPUs as `nvidia-smi topo -m` names it, when NVML could read it.
    pub link: Option<Link>,
    /// The edge probe's figure at creation ([`crate::exec::cuda::probe`]); `None` when not probed (probe off,
    /// or both ranks on one GPU).
    pub probe: Option<Probe>,
}

impl EdgeInfo {
    /// `Some(why)` when the probe found this edge far below what its link promises: silent
    /// degradation that no API call reports (ACS or a hypervisor in the peer path, a degraded
    /// link). The communicator still works, slowly; `ringreduce run` and `bench` print this as a
    /// warning.
    pub fn slow(&self) -> Option<&str> {
        self.probe.as_ref().and_then(|p| p.slow.as_deref())
    }

    /// One line for logs: `rank 0 (GPU 0) → rank 1 (GPU 1): peer copies…; NV18; probe 391.2 GB/s`.
    pub fn describe(&self) -> String {
        let mut line = format!(
            "rank {} (GPU {}) → rank {} (GPU {}): {}",
            self.from_rank, self.from_device, self.to_rank, self.to_device, self.reason
        );
        if let Some(link) = self.link {
            line.push_str(&format!("; link {link}"));
        }
        match &self.probe {
            Some(p) => {
                line.push_str(&format!("; probe {:.1} GB/s", p.measured_gb_per_s));
                if let Some(e) = p.expected_gb_per_s {
                    line.push_str(&format!(" (link estimate {e:.1})"));
                }
                if let Some(why) = &p.slow {
                    line.push_str(&format!(" — {why}"));
                }
            }
            None => line.push_str("; not probed"),
        }
        line
    }
}

/// How a rank's outgoing edge moves data, and why: what the rank decides about its own edge
/// from its reach to the receiver ([`Reach`]), and tells the others in its record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EdgeWay {
    /// Peer copies: the sender's copy engine pushes into the receiver's GPU.
    PeerCopies,
    /// Both ranks on one GPU: copies within it.
    SameGpu,
    /// Staged through pinned host memory because [`Transport::Staged`] forces it.
    StagedForced,
    /// Staged: `cuDeviceCanAccessPeer` says the sender's GPU cannot map the receiver's.
    StagedNoPeerAccess,
    /// Staged: the receiver's GPU is not visible in the sender's process.
    StagedNotVisible,
}

impl EdgeWay {
    const ALL: [EdgeWay; 5] = [
        EdgeWay::PeerCopies,
        EdgeWay::SameGpu,
        EdgeWay::StagedForced,
        EdgeWay::StagedNoPeerAccess,
        EdgeWay::StagedNotVisible,
    ];

    fn transport(self) -> EdgeTransport {
        match self {
            EdgeWay::PeerCopies | EdgeWay::SameGpu => EdgeTransport::Peer,
            _ => EdgeTransport::Staged,
        }
    }

    fn code(self) -> u64 {
        EdgeWay::ALL.iter().position(|&w| w == self).unwrap_or(0) as u64
    }

    fn from_code(from: usize, code: u64) -> Result<EdgeWay> {
        EdgeWay::ALL
            .get(code as usize)
            .copied()
            .ok_or_else(|| Error::Internal {
                what: format!("rank {from}'s edge record names way {code}"),
            })
    }

    /// Why, for people; `a` and `b` are the two ends' GPUs (ordinals in their own processes).
    fn reason(self, a: usize, b: usize) -> String {
        match self {
            EdgeWay::PeerCopies => {
                format!("peer copies: GPU {a} pushes into GPU {b} (peer access enabled)")
            }
            EdgeWay::SameGpu => format!("copies within one GPU (both ranks on GPU {a})"),
            EdgeWay::StagedForced => {
                "staged through pinned host memory: forced by Transport::Staged".into()
            }
            EdgeWay::StagedNoPeerAccess => {
                format!("staged through pinned host memory: cuDeviceCanAccessPeer({a}, {b}) = 0")
            }
            EdgeWay::StagedNotVisible => format!(
                "staged through pinned host memory: the receiver's GPU is not visible in the \
                 sender's process (GPU {b} of its own)"
            ),
        }
    }
}

/// Phase 1 of the edge decision, on one rank (rank-local: it asks the fabric how its context
/// reaches its peers' GPUs, by their identities): how its outgoing edge moves data, and —
/// when `all_pairs` (the peer kernels could run) — whether it reaches every peer directly. Its
/// record: the edge's way, then 1 if every peer is reached directly (0 otherwise, or when not
/// asked). A world of one rank has no edge: its record is empty.
pub(super) fn reach_peers(
    res: &RankRes,
    fabric: &dyn Fabric,
    ids: &[Identity],
    transport: Transport,
    all_pairs: bool,
) -> Result<Record> {
    let (n, rank) = (ids.len(), res.rank);
    if n == 1 {
        return Ok(Vec::new());
    }
    let next = (rank + 1) % n;
    let reach = |peer: usize| fabric.reach(rank, &res.ctx, &ids[rank], &ids[peer]);
    let way = match transport {
        Transport::Staged => EdgeWay::StagedForced,
        _ => match reach(next)? {
            Reach::SameGpu => EdgeWay::SameGpu,
            Reach::Peer => EdgeWay::PeerCopies,
            refused if transport == Transport::Peer => {
                let _ = refused;
                return Err(Error::NoPeerAccess {
                    from: ids[rank].ordinal,
                    to: ids[next].ordinal,
                });
            }
            Reach::NoPeerAccess => EdgeWay::StagedNoPeerAccess,
            Reach::NotVisible => EdgeWay::StagedNotVisible,
        },
    };
    // An enable the driver refuses (more than 8 peers of one device, say) only means the peer
    // kernels cannot run here; the ring still can.
    let direct = all_pairs
        && (0..n)
            .filter(|&q| q != rank)
            .all(|q| reach(q).is_ok_and(Reach::direct));
    Ok(vec![way.code(), u64::from(direct)])
}

/// Phase 2 of the edge decision, on every rank alike: every edge from its sender's record, and
/// whether every rank reaches every peer directly (the peer kernels can run).
pub(super) fn edges_from_records(
    records: &[Record],
    ids: &[Identity],
) -> Result<(Vec<EdgeInfo>, bool)> {
    let n = ids.len();
    if n == 1 {
        return Ok((Vec::new(), false));
    }
    let mut all_direct = true;
    let mut edges = Vec::with_capacity(n);
    for (from_rank, record) in records.iter().enumerate() {
        let mut fields = Fields::new(from_rank, record);
        let way = EdgeWay::from_code(from_rank, fields.word()?)?;
        all_direct &= fields.word()? == 1;
        fields.finish()?;
        let to_rank = (from_rank + 1) % n;
        let (a, b) = (ids[from_rank].ordinal, ids[to_rank].ordinal);
        edges.push(EdgeInfo {
            from_rank,
            to_rank,
            from_device: a,
            to_device: b,
            transport: way.transport(),
            reason: way.reason(a, b),
            link: None,
            probe: None,
        });
    }
    Ok((edges, all_direct))
}

/// Each edge's link as `nvidia-smi topo -m` names it, from NVML (when it loads), found by the two
/// ends' PCI bus ids; `None` where NVML or either GPU is not known here.
pub(super) fn links(edges: &[EdgeInfo], ids: &[Identity]) -> Vec<Option<Link>> {
    let detected = topo::detect().ok();
    let ordinal = |id: &Identity| {
        let found = detected.as_ref()?.bus_ids.iter();
        found
            .map(|b| pack_bus_id(b))
            .position(|b| b == id.pci_bus_id)
    };
    edges
        .iter()
        .map(|e| {
            let (a, b) = (ordinal(&ids[e.from_rank])?, ordinal(&ids[e.to_rank])?);
            detected.as_ref()?.links.get(a)?.get(b).copied().flatten()
        })
        .collect()
}

/// Whether the edge's probe means anything: between two GPUs (a copy within one says nothing
/// about a link).
fn probed(edge: &EdgeInfo, ids: &[Identity]) -> bool {
    !ids[edge.from_rank].same_gpu(&ids[edge.to_rank])
}

/// Phase 1 of the edge probe, on one rank: where its incoming edge pushes peer copies from
/// another GPU, a target of [`probe::PROBE_BYTES`] for the sender to push into, and its record
/// (the target's export handle, length first; 0 without a target).
pub(super) fn probe_target(
    res: &RankRes,
    fabric: &dyn Fabric,
    edges: &[EdgeInfo],
    ids: &[Identity],
) -> Result<(Option<DeviceBuffer>, Record)> {
    let n = edges.len();
    let incoming = &edges[(res.rank + n - 1) % n];
    if incoming.transport != EdgeTransport::Peer || !probed(incoming, ids) {
        return Ok((None, vec![0]));
    }
    // A target that cannot be made or exported leaves the edge unprobed (its sender says so),
    // never fails the communicator.
    let made = fabric
        .exportable(&res.ctx, probe::PROBE_BYTES)
        .and_then(|target| {
            let handle = fabric.export(
                res.rank,
                Exported::Device {
                    addr: target.ptr(),
                    bytes: probe::PROBE_BYTES,
                },
            )?;
            Ok((target, handle))
        });
    match made {
        Ok((target, handle)) => {
            let mut record = vec![handle.len() as u64];
            record.extend(handle);
            Ok((Some(target), record))
        }
        Err(_) => Ok((None, vec![0])),
    }
}

/// A figure in a probe record: absent, measured (GB/s), or failed (why).
fn push_figure(record: &mut Record, figure: Option<Result<f64>>) {
    match figure {
        None => record.push(0),
        Some(Ok(gb_per_s)) => record.extend([1, gb_per_s.to_bits()]),
        Some(Err(err)) => {
            record.push(2);
            push_text(record, &err.to_string());
        }
    }
}

fn read_figure(fields: &mut Fields<'_>) -> Result<Option<std::result::Result<f64, String>>> {
    Ok(match fields.word()? {
        0 => None,
        1 => Some(Ok(f64::from_bits(fields.word()?))),
        _ => Some(Err(fields.text()?)),
    })
}

/// Phase 2 of the edge probe, on one rank: it times its own halves of its two edges — out, a
/// push into the receiver's target (imported from `targets`, every rank's phase-1 record) or,
/// staged, device→host on its Send stream (and, for a peer edge whose link is unknown, the
/// host path to compare with); in, host→device on its Recv stream where the incoming edge is
/// staged. Its record: the three figures. A probe that fails (out of memory, say) fails
/// nothing else: its figure says why.
pub(super) fn probe_own(
    res: &RankRes,
    fabric: &dyn Fabric,
    edges: &[EdgeInfo],
    ids: &[Identity],
    links: &[Option<Link>],
    targets: &[Record],
) -> Result<Record> {
    let (n, rank) = (edges.len(), res.rank);
    let (out, incoming) = (&edges[rank], &edges[(rank + n - 1) % n]);
    let send = res.stream(StreamKind::Send);
    let mut record = Vec::new();
    let (figure, host) = match (probed(out, ids), out.transport) {
        (false, _) => (None, None),
        (true, EdgeTransport::Peer) => {
            let mut fields = Fields::new(out.to_rank, &targets[out.to_rank]);
            let len = fields.word()? as usize;
            let handle = fields.take(len)?;
            let pushed = match len {
                0 => Err(Error::Resource {
                    what: format!("rank {} could not make a probe target", out.to_rank),
                }),
                _ => fabric.import(rank, out.to_rank, handle).and_then(|dst| {
                    // SAFETY: the receiver allocated PROBE_BYTES there for this push alone
                    // (phase 1) and keeps it until every rank has reported its figures.
                    unsafe { probe::push_to(send, dst) }
                }),
            };
            let host = links[rank]
                .is_none()
                .then(|| probe::host_copy(&res.ctx, send, true));
            (Some(pushed), host)
        }
        (true, EdgeTransport::Staged) => (Some(probe::host_copy(&res.ctx, send, true)), None),
    };
    push_figure(&mut record, figure);
    push_figure(&mut record, host);
    let received = (probed(incoming, ids) && incoming.transport == EdgeTransport::Staged)
        .then(|| probe::host_copy(&res.ctx, res.stream(StreamKind::Recv), false));
    push_figure(&mut record, received);
    Ok(record)
}

/// Phase 3 of the edge probe, on every rank alike: each edge's link and probe figure from the
/// ranks' phase-2 records — a peer edge's push by its sender, a staged edge's slower half (the
/// sender's device→host, the receiver's host→device).
pub(super) fn apply_probes(
    edges: &mut [EdgeInfo],
    ids: &[Identity],
    links: &[Option<Link>],
    records: &[Record],
) -> Result<()> {
    let n = edges.len();
    let mut figures = Vec::with_capacity(n);
    for (rank, record) in records.iter().enumerate() {
        let mut fields = Fields::new(rank, record);
        let out = read_figure(&mut fields)?;
        let host = read_figure(&mut fields)?;
        let received = read_figure(&mut fields)?;
        fields.finish()?;
        figures.push((out, host, received));
    }
    for (edge, &link) in edges.iter_mut().zip(links) {
        edge.link = link;
        if !probed(edge, ids) {
            continue;
        }
        let (out, host, _) = &figures[edge.from_rank];
        let (_, _, received) = &figures[edge.to_rank];
        let fail = |why: &String| format!("; not probed: the probe failed: {why}");
        let probe = match (edge.transport, out, received) {
            (EdgeTransport::Peer, Some(Ok(pushed)), _) => {
                let host = || match host {
                    Some(Ok(gb)) => Ok(*gb),
                    Some(Err(why)) => Err(Error::Internal { what: why.clone() }),
                    None => Err(Error::Internal {
                        what: "no host figure".into(),
                    }),
                };
                probe::peer_figure(*pushed, link, host).map_err(|e| e.to_string())
            }
            (EdgeTransport::Staged, Some(Ok(d2h)), Some(Ok(h2d))) => {
                Ok(probe::staged_figure(*d2h, *h2d, link))
            }
            (_, Some(Err(why)), _) | (_, _, Some(Err(why))) => Err(why.clone()),
            _ => Err("a figure is missing".to_string()),
        };
        match probe {
            Ok(p) => edge.probe = Some(p),
            Err(why) => edge.reason.push_str(&fail(&why)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(gpu: u8, ordinal: usize) -> Identity {
        Identity {
            uuid: [gpu; 16],
            pci_bus_id: u64::from(gpu) << 16,
            sm_count: 132,
            ordinal,
        }
    }

    /// Three ranks, each on GPU 0 of its own process (ordinal 0 everywhere): rank 0 and 1 on
    /// different GPUs with peer copies, rank 1 → 2 staged (no peer access), rank 2 → 0 on one GPU.
    fn three_edges() -> (Vec<Identity>, Vec<EdgeInfo>) {
        let ids = vec![id(1, 0), id(2, 0), id(1, 0)];
        let records = vec![
            vec![EdgeWay::PeerCopies.code(), 1],
            vec![EdgeWay::StagedNoPeerAccess.code(), 0],
            vec![EdgeWay::SameGpu.code(), 1],
        ];
        let (edges, all_direct) = edges_from_records(&records, &ids).unwrap();
        assert!(!all_direct, "rank 1 does not reach every peer");
        (ids, edges)
    }

    #[test]
    fn every_rank_learns_every_edge_from_its_senders_record() {
        let (_, edges) = three_edges();
        let got: Vec<_> = edges
            .iter()
            .map(|e| (e.from_rank, e.to_rank, e.transport))
            .collect();
        assert_eq!(
            got,
            [
                (0, 1, EdgeTransport::Peer),
                (1, 2, EdgeTransport::Staged),
                (2, 0, EdgeTransport::Peer)
            ]
        );
        assert!(edges[1].reason.contains("cuDeviceCanAccessPeer(0, 0) = 0"));
        assert!(edges[2].reason.contains("within one GPU"));
        for way in EdgeWay::ALL {
            assert_eq!(EdgeWay::from_code(0, way.code()).unwrap(), way);
        }
        assert!(EdgeWay::from_code(1, 9).is_err());
        let ids = vec![id(1, 0), id(2, 0)];
        let all = vec![vec![0, 1], vec![0, 1]];
        assert!(edges_from_records(&all, &ids).unwrap().1);
        assert!(edges_from_records(&[vec![0], vec![0, 1]], &ids).is_err());
    }

    #[test]
    fn a_probe_combines_the_halves_each_rank_measured() {
        let (ids, mut edges) = three_edges();
        let links = vec![Some(Link::NvLink { links: 18 }), Some(Link::Phb), None];
        // Rank 0 pushed at 390 GB/s; rank 1 sent 50 GB/s to the host, rank 2 received 20 from it.
        let mut records = vec![Vec::new(); 3];
        push_figure(&mut records[0], Some(Ok(390.0)));
        push_figure(&mut records[0], None);
        push_figure(&mut records[0], None);
        push_figure(&mut records[1], Some(Ok(50.0)));
        push_figure(&mut records[1], None);
        push_figure(&mut records[1], None);
        push_figure(&mut records[2], None);
        push_figure(&mut records[2], None);
        push_figure(&mut records[2], Some(Ok(20.0)));
        apply_probes(&mut edges, &ids, &links, &records).unwrap();
        assert_eq!(edges[0].probe.as_ref().unwrap().measured_gb_per_s, 390.0);
        assert_eq!(edges[0].link, links[0]);
        let staged = edges[1].probe.as_ref().unwrap();
        assert_eq!(staged.measured_gb_per_s, 20.0, "the slower half");
        assert!(edges[2].probe.is_none(), "one GPU: not probed");
        // A failed half is reported on its edge, not as an error.
        let (ids, mut edges) = three_edges();
        records[2].clear();
        push_figure(&mut records[2], None);
        push_figure(&mut records[2], None);
        push_figure(
            &mut records[2],
            Some(Err(Error::Resource {
                what: "out of pinned memory".into(),
            })),
        );
        apply_probes(&mut edges, &ids, &links, &records).unwrap();
        assert!(edges[1].probe.is_none());
        assert!(
            edges[1].reason.contains("the probe failed") && edges[1].reason.contains("pinned"),
            "{}",
            edges[1].reason
        );
    }

    #[test]
    fn chunks_follow_the_measurements_for_two_gpus() {
        let mib = 1 << 20;
        // f32, world 2: (message, best push chunk measured in the prototype)
        for (message, chunk) in [
            (mib, mib / 2),
            (8 * mib, 4 * mib),
            (32 * mib, 4 * mib),
            // ringreduce's own sweeps (doc above)
            (64 * mib, 16 * mib),
            (128 * mib, 32 * mib),
            (256 * mib, 64 * mib),
            (512 * mib, 128 * mib),
            (1024 * mib, 128 * mib),
            (4096 * mib, 128 * mib),
        ] {
            assert_eq!(
                auto_chunk_bytes(message / 4, 2, 4, false),
                chunk,
                "message {message}"
            );
        }
        assert_eq!(auto_chunk_bytes(256 * mib / 4, 2, 4, true), 4 * mib);
        assert_eq!(auto_chunk_bytes(1, 2, 4, false), 4);
        assert_eq!(auto_chunk_bytes(0, 2, 4, false), 4);
    }
}
