//! The ring's edges: how each moves data ([`EdgeInfo`]: peer copies or pinned-host staging, and
//! why), the probe that times each edge at creation, and the chunk size a message is cut into.
//!
//! Peer edges push: the sender's copy engine writes into the receiver's staging slot
//! (`cuMemcpyPeerAsync` on the sender's Send stream), the receiver's Reduce stream folds it in with
//! a kernel. Push measured 15–30% faster than pull on the 2×H200 test machine. Staged edges copy
//! device→pinned host on the sender's Send stream and host→device on the receiver's Recv stream
//! (two PCIe directions busy at once), with events between.
//!
//! Invariant: edge `r` runs from rank `r` to rank `(r + 1) mod world`, and an edge is `Peer` only
//! where peer access from its sender to its receiver was enabled.

use super::rank::RankRes;
use super::Transport;
use crate::device;
use crate::error::{Error, Result};
use crate::exec::cuda::probe::{self, Probe};
use crate::plan::{EdgeTransport, StreamKind};
use crate::topo::{self, Link};
use std::sync::Arc;

/// The chunk size for a message: about a quarter of a segment, at least 4 MiB (or the whole
/// segment when smaller), at most 64 MiB; from 32 MiB segments on, half a segment, at most
/// 128 MiB; at most 4 MiB when any edge is staged. From the prototype on the 2×H200 machine:
/// every CUDA call costs ~2 µs of host time, so small chunks only pay when the host keeps up; the
/// best push chunk was 512 KiB at 1 MiB, 4 MiB at 8–32 MiB. From ringreduce's own sweeps
/// (`bench --chunk`, 2×H200, docs/runs/2026-11-30-s3-*): fewer,
/// larger chunks win on large segments — 64 MiB messages: 16 MiB chunks 198.6 µs against 214.3
/// for 8 MiB and 225.6 for 32 MiB (one chunk); 128 MiB: 32 MiB chunks 374.9 against 392.3 for
/// 16 MiB; 256 MiB: 64 MiB 718 against 740 for 32 MiB; 512 MiB: 128 MiB 1405–1412 against
/// 1427–1437 for 64 MiB; 1 GiB: 128 MiB 2805–2818 against 2858–2879 for 64 MiB; 2, 3 or 4 slots
/// within 1%. (Out of place; in place alike.) A staged edge is a three-stage pipeline
/// (device→host, host→device, reduce) at ~55 GB/s per PCIe direction, where the prototype did
/// best with 4 MiB chunks (38–44 GB/s); ringreduce with 32 MiB chunks measured 32–34 GB/s at
/// 256 MiB.
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
    /// The sending rank's CUDA device ordinal.
    pub from_device: usize,
    /// The receiving rank's CUDA device ordinal.
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

/// Decides each edge's transport and enables peer access where it is used.
pub(super) fn decide_edges(ranks: &[Arc<RankRes>], transport: Transport) -> Result<Vec<EdgeInfo>> {
    let n = ranks.len();
    if n == 1 {
        return Ok(Vec::new());
    }
    (0..n)
        .map(|from_rank| {
            let to_rank = (from_rank + 1) % n;
            let (a, b) = (&ranks[from_rank], &ranks[to_rank]);
            let info = |transport, reason: String| EdgeInfo {
                from_rank,
                to_rank,
                from_device: a.device,
                to_device: b.device,
                transport,
                reason,
                link: None,
                probe: None,
            };
            if transport == Transport::Staged {
                return Ok(info(
                    EdgeTransport::Staged,
                    "staged through pinned host memory: forced by Transport::Staged".into(),
                ));
            }
            if !device::can_access_peer(a.device, b.device)? {
                if transport == Transport::Peer {
                    return Err(Error::NoPeerAccess {
                        from: a.device,
                        to: b.device,
                    });
                }
                return Ok(info(
                    EdgeTransport::Staged,
                    format!(
                        "staged through pinned host memory: cuDeviceCanAccessPeer({}, {}) = 0",
                        a.device, b.device
                    ),
                ));
            }
            device::enable_peer_access(&a.ctx, &b.ctx)?;
            Ok(info(
                EdgeTransport::Peer,
                format!(
                    "peer copies: GPU {} pushes into GPU {} (peer access enabled)",
                    a.device, b.device
                ),
            ))
        })
        .collect()
}

/// Fills in each edge's link (NVML, when it loads) and probe figure. Edges between two ranks on
/// one GPU are not probed: a copy within a device says nothing about a link.
pub(super) fn probe_edges(ranks: &[Arc<RankRes>], edges: &mut [EdgeInfo]) -> Result<()> {
    let links = topo::detect().ok().map(|d| d.links);
    for edge in edges.iter_mut() {
        let (a, b) = (&ranks[edge.from_rank], &ranks[edge.to_rank]);
        edge.link = links
            .as_ref()
            .and_then(|l| l.get(a.device)?.get(b.device).copied().flatten());
        if a.device == b.device {
            continue;
        }
        let measured = match edge.transport {
            EdgeTransport::Peer => probe::peer_edge(
                &a.ctx,
                &b.ctx,
                &a.streams[StreamKind::Send.index()],
                edge.link,
            ),
            EdgeTransport::Staged => probe::staged_edge(
                &a.streams[StreamKind::Send.index()],
                &b.streams[StreamKind::Recv.index()],
                edge.link,
            ),
        };
        // The probe is a diagnosis: its failure is reported on the edge, not on the communicator.
        match measured {
            Ok(p) => edge.probe = Some(p),
            Err(err) => edge
                .reason
                .push_str(&format!("; not probed: the probe failed: {err}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::auto_chunk_bytes;

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
