//! The edge probe: at creation a GPU communicator times one copy over each ring edge and compares it
//! with what the edge's link promises, so that silent degradation is reported, not suffered.
//!
//! A peer copy between GPUs without usable peer access still succeeds — the driver stages it
//! through host memory at a tenth of the link's speed, with no error. The communicator enables
//! peer access and grants pool access itself, so what is left for the probe to catch is what no
//! API call reports: PCIe ACS or a hypervisor redirecting peer traffic through the root complex, a
//! link running degraded, peer access that the driver accepted but does not honour. Each shows up
//! only as a slow copy. So each edge is measured once, the way the ring will use it (its own
//! `cuMemAlloc` buffers, after peer access is enabled; the caller's pool memory is not probed:
//! the pool-access grant covers it, `device::grant_pointer_pool_access`):
//!
//! | edge | what is timed | compared with |
//! |---|---|---|
//! | peer | a push of [`PROBE_BYTES`] from the sender's memory into the receiver's, on the sender's Send stream | the link's peer estimate ([`Link::peer_estimate`], from NVML); without NVML, the sender's device→host copy |
//! | staged | device→host on the sender and host→device on the receiver (pinned), the slower of the two | the link's staged estimate ([`Link::staged_estimate`]) |
//!
//! A figure under half its estimate, or a peer figure under the host path, makes the edge
//! [`EdgeInfo::slow`]. Timing is GPU time between two timing events around [`PROBE_REPS`] copies,
//! after one untimed warm-up; buffers, events and pinned memory are freed before the probe returns.
//! It costs a few milliseconds per edge, mostly allocation. [`CudaConfig::probe_edges`] turns it
//! off. A probe that fails (out of memory, say) fails nothing else: the edge is reported as not
//! probed, with why. With more than two ranks only the ring's edges are probed, not every pair
//! the one-shot reads over.
//!
//! [`EdgeInfo::slow`]: super::EdgeInfo::slow
//! [`CudaConfig::probe_edges`]: super::CudaConfig::probe_edges

use crate::device::{self, DeviceBuffer, Event, PinnedHost, Stream};
use crate::error::Result;
use crate::topo::Link;
use cudarc::driver::CudaContext;
use std::sync::Arc;

/// Bytes per probe copy: large enough to reach a link's bandwidth (a 16 MiB peer push takes ~42 µs
/// at 395 GB/s, well past the ~2 µs launch cost), small enough to cost nothing at creation.
pub const PROBE_BYTES: usize = 16 << 20;

/// Timed copies per figure.
pub const PROBE_REPS: usize = 4;

/// What the probe measured over one edge.
#[derive(Clone, Debug, PartialEq)]
pub struct Probe {
    /// Measured GB/s (10⁹ bytes per second).
    pub measured_gb_per_s: f64,
    /// What the edge's link promises, in GB/s; `None` when the link is unknown (no NVML).
    pub expected_gb_per_s: Option<f64>,
    /// `Some(why)` when the edge is far below what it should give.
    pub slow: Option<String>,
}

/// Why a measured figure counts as slow, or `None`: below half the link's estimate, or (for a peer
/// edge) below the host path it is supposed to beat. Shared with `ringreduce p2p`.
pub fn slow_reason(
    measured: f64,
    link_estimate: Option<f64>,
    host_path: Option<f64>,
) -> Option<String> {
    let why = match (link_estimate, host_path) {
        (Some(est), _) if measured < 0.5 * est => {
            format!("{measured:.1} GB/s < 50% of the link's {est:.1} GB/s estimate")
        }
        (_, Some(host)) if measured < host => {
            format!("{measured:.1} GB/s, below the host path's {host:.1} GB/s")
        }
        _ => return None,
    };
    Some(format!(
        "SLOW ({why}): check peer access / pool access / ACS"
    ))
}

/// Times a push from `from` to `to`, on `stream` (a stream of `from`), as the ring's peer edges
/// copy — whether or not peer access is enabled, which is the point.
pub fn peer_edge(
    from: &Arc<CudaContext>,
    to: &Arc<CudaContext>,
    stream: &Stream,
    link: Option<Link>,
) -> Result<Probe> {
    let src = DeviceBuffer::zeroed(from, PROBE_BYTES)?;
    let dst = DeviceBuffer::new(to, PROBE_BYTES)?;
    let measured = timed(stream, || {
        // SAFETY: both buffers are ours, PROBE_BYTES long, and live until `timed` has
        // synchronized the stream.
        unsafe { device::memcpy_peer_async(dst.ptr(), to, src.ptr(), from, PROBE_BYTES, stream) }
    })?;
    peer_figure(measured, link, || host_copy(from, stream, true))
}

/// The probe of a peer edge that `measured` GB/s over a link `link`; `host` times the host path
/// to compare with where the link is unknown.
pub(crate) fn peer_figure(
    measured: f64,
    link: Option<Link>,
    host: impl FnOnce() -> Result<f64>,
) -> Result<Probe> {
    let expected = link.map(|l| l.peer_estimate().gb_per_s());
    let host = match expected {
        Some(_) => None,
        None => Some(host()?),
    };
    Ok(Probe {
        measured_gb_per_s: measured,
        expected_gb_per_s: expected,
        slow: slow_reason(measured, expected, host),
    })
}

/// Times the two halves of a staged edge: device→host on `from_stream`, host→device on `to_stream`.
pub fn staged_edge(from_stream: &Stream, to_stream: &Stream, link: Option<Link>) -> Result<Probe> {
    let d2h = host_copy(from_stream.context(), from_stream, true)?;
    let h2d = host_copy(to_stream.context(), to_stream, false)?;
    Ok(staged_figure(d2h, h2d, link))
}

/// GB/s of a push of [`PROBE_BYTES`] from a buffer of `stream`'s context into `dst` (memory of
/// another GPU, reachable by address: a peer's buffer as this rank imported it), on `stream`.
///
/// # Safety
/// `dst` is [`PROBE_BYTES`] of device memory that nothing else uses until this returns.
pub(crate) unsafe fn push_to(stream: &Stream, dst: u64) -> Result<f64> {
    let src = DeviceBuffer::zeroed(stream.context(), PROBE_BYTES)?;
    timed(stream, || {
        // SAFETY: `src` is ours and `dst` is the caller's promise, both PROBE_BYTES long, and
        // live until `timed` has synchronized the stream.
        unsafe { device::memcpy_async(dst, src.ptr(), PROBE_BYTES, stream) }
    })
}

/// The probe of a staged edge whose sender measured `d2h` GB/s to the host and whose receiver
/// `h2d` from it, over a link `link`: the slower half.
pub(crate) fn staged_figure(d2h: f64, h2d: f64, link: Option<Link>) -> Probe {
    let measured = d2h.min(h2d);
    let expected = link.map(|l| l.staged_estimate().gb_per_s());
    Probe {
        measured_gb_per_s: measured,
        expected_gb_per_s: expected,
        slow: slow_reason(measured, expected, None),
    }
}

/// GB/s of a copy between `ctx`'s memory and pinned host memory, one direction.
pub(crate) fn host_copy(ctx: &Arc<CudaContext>, stream: &Stream, to_host: bool) -> Result<f64> {
    let dev = DeviceBuffer::zeroed(ctx, PROBE_BYTES)?;
    let host = PinnedHost::new(ctx, PROBE_BYTES)?;
    let (dst, src) = if to_host {
        (host.uva_ptr(), dev.ptr())
    } else {
        (dev.ptr(), host.uva_ptr())
    };
    timed(stream, || {
        // SAFETY: both ranges are ours, PROBE_BYTES long, live until `timed` has synchronized.
        unsafe { device::memcpy_async(dst, src, PROBE_BYTES, stream) }
    })
}

/// GB/s of `copy` (PROBE_BYTES each): one warm-up, then PROBE_REPS between timing events. Always
/// synchronizes the stream before returning, so no copy outlives the caller's buffers.
fn timed(stream: &Stream, mut copy: impl FnMut() -> Result<()>) -> Result<f64> {
    let ctx = stream.context();
    let start = Event::with_timing(ctx)?;
    let end = Event::with_timing(ctx)?;
    let queued = (|| {
        copy()?;
        device::record(&start, stream)?;
        for _ in 0..PROBE_REPS {
            copy()?;
        }
        device::record(&end, stream)
    })();
    let settled = device::stream_synchronize(stream);
    queued?;
    settled?;
    let ms = f64::from(device::event_elapsed_ms(&start, &end)?);
    let bytes = (PROBE_BYTES * PROBE_REPS) as f64;
    Ok(if ms > 0.0 {
        bytes / (ms * 1e6)
    } else {
        f64::INFINITY
    })
}

#[cfg(test)]
mod tests {
    use super::slow_reason;

    #[test]
    fn slow_below_half_the_link_or_below_the_host_path() {
        // The pool trap on the 2×H200 machine: 37.6 GB/s over NV18 (478.8 GB/s estimate).
        let trap = slow_reason(37.6, Some(478.8), None).expect("the pool trap is slow");
        assert!(trap.contains("50%") && trap.contains("478.8"), "{trap}");
        // The measured healthy figure, 395 GB/s, is not.
        assert_eq!(slow_reason(395.0, Some(478.8), None), None);
        // Exactly half is not slow; just under is.
        assert_eq!(slow_reason(239.4, Some(478.8), None), None);
        assert!(slow_reason(239.3, Some(478.8), None).is_some());
        // No link estimate: compared with the host path.
        let host = slow_reason(38.0, None, Some(55.0)).expect("below the host path");
        assert!(host.contains("host path"), "{host}");
        assert_eq!(slow_reason(395.0, None, Some(55.0)), None);
        // Nothing to compare with: never slow.
        assert_eq!(slow_reason(1.0, None, None), None);
    }
}
