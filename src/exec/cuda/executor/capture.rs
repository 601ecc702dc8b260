//! Collectives captured into CUDA graphs: what changes when the caller's streams are being
//! captured.
//!
//! A captured collective becomes nodes of the caller's graph(s): it must replay correctly any
//! number of times, with nothing call-specific baked in, and it may be captured one graph per
//! GPU (as one process per GPU would) — where an event recorded in one capture cannot be waited
//! for in another. So:
//! - the peer kernels (one-shot, two-shot, steps) capture as they are: their barrier epochs live
//!   in device memory and advance on the device (`cuda/peer.cuh`);
//! - the ring keeps its events between a rank's own streams (they become graph edges), and each
//!   wait for another rank's event is a pair of counter kernels (`cuda/counters.cuh`), as in an
//!   eager call: a signal before the record on the recording rank's stream, a wait with a
//!   deadline on the waiting rank's stream, over counters made when the plan is prepared
//!   (module `counters`). Copies are plain copies by address, eager or captured;
//! - a plan captured once is pinned for the communicator's life (the graph holds its staging
//!   and counters; an in-place one-shot's exposed copies are in the exposure regions, and a plan
//!   prepared alone has its buffers in the arenas, both of which outlive every plan: modules
//!   `exposure`, `prepare`), and nothing is recorded for the host to poll: the
//!   host learns of a failed replay from the kernels' error words (`Communicator::health`, the
//!   next call, `synchronize`).
//!
//! What cannot be captured is refused before anything is enqueued, with
//! [`Error::NotCapturable`] naming why: a shape that has not run on the communicator before
//! (preparing it allocates and synchronises), and a ring staged through pinned host memory (its
//! captured replays did not complete on one H200 with ranks sharing the GPU: their counter
//! waits gave up; not yet understood, so refused).
//!
//! Invariant: a plan captured once stays prepared — on every rank — for the communicator's
//! life, so every graph that holds it finds its memory.

use super::CudaExecutor;
use crate::device::CallerStream;
use crate::error::{Error, Result};
use crate::exec::cuda::kernels::COUNTER_ERR_BIT;
use crate::exec::Shape;
use crate::plan::EdgeTransport;
use cudarc::driver::sys;
use std::sync::Arc;

/// Whether the caller's streams are being captured: all of them or none (a mix, or a capture
/// already invalidated, is refused).
pub(super) fn capturing(streams: &[CallerStream]) -> Result<bool> {
    use sys::CUstreamCaptureStatus as S;
    let mut states = Vec::with_capacity(streams.len());
    for (rank, stream) in streams.iter().enumerate() {
        let status = stream.capture_status()?;
        if status == S::CU_STREAM_CAPTURE_STATUS_INVALIDATED {
            return Err(Error::NotCapturable {
                reason: format!("rank {rank}'s stream is in a capture that was invalidated"),
            });
        }
        states.push(status == S::CU_STREAM_CAPTURE_STATUS_ACTIVE);
    }
    match states.iter().position(|&c| c != states[0]) {
        Some(other) => Err(Error::NotCapturable {
            reason: format!(
                "rank 0's stream is {} captured but rank {other}'s is {}: capture every rank's stream, or none",
                if states[0] { "being" } else { "not" },
                if states[other] { "being" } else { "not" },
            ),
        }),
        None => Ok(states.first().copied().unwrap_or(false)),
    }
}

impl CudaExecutor {
    /// The plan of `shape` for a capture, pinned for the communicator's life (a graph holds its
    /// staging and counters); returns its pin. Refused: a shape never prepared (preparing
    /// allocates and synchronises, which a capture does not allow).
    pub(super) fn pin_for_capture(&mut self, shape: Shape) -> Result<usize> {
        let Some(prepared) = self.prepared(&shape) else {
            return Err(Error::NotCapturable {
                reason: format!(
                    "this shape ({} elements of {} bytes, {}{}{}) has not run on this communicator yet: make one call of it outside the capture first (preparing a shape allocates memory, which a capture does not allow)",
                    shape.count,
                    shape.elem_bytes,
                    if shape.in_place { "in place" } else { "out of place" },
                    if shape.average { ", Avg" } else { "" },
                    if shape.registered { ", on registered buffers" } else { "" },
                ),
            });
        };
        if self
            .edges
            .iter()
            .any(|e| e.transport == EdgeTransport::Staged)
        {
            return Err(Error::NotCapturable {
                reason: "a ring staged through pinned host memory cannot be captured (its replays did not complete in testing); use peer copies, or run it eagerly".into(),
            });
        }
        if let Some(pin) = self
            .pinned
            .iter()
            .position(|(_, p)| Arc::ptr_eq(p, &prepared))
        {
            return Ok(pin);
        }
        for rank in &mut self.ranks {
            rank.pin(&shape);
        }
        self.pinned.push((shape, prepared));
        Ok(self.pinned.len() - 1)
    }

    /// The timeout a counter wait for `code` reported on this process's `local`-th rank, by
    /// name: which rank waited for which event of which plan (one still cached or pinned; else
    /// just "an event").
    pub(super) fn counter_timeout(&self, local: usize, code: u32) -> Error {
        let serial = ((code & !COUNTER_ERR_BIT) >> 16) as usize;
        let event = (code & 0xffff) as usize;
        let plan = self
            .cache
            .iter()
            .chain(self.pinned.iter().map(|(_, p)| p))
            .find(|p| p.serial == serial);
        let what = plan
            .and_then(|p| p.plan.events.get(event))
            .map_or_else(|| "an event of a ring".to_string(), |d| d.to_string());
        let captured = self.pinned.iter().any(|(_, p)| p.serial == serial);
        Error::Timeout {
            rank: self.ranks[local].rank(),
            waiting_on: format!(
                "on GPU {} waited for {what} and gave up: {}",
                self.ranks[local].res.device,
                if captured {
                    "that rank's graph was not replayed (or is stuck); replay every rank's graph, the same number of times"
                } else {
                    "that rank never reached it (its GPU is stuck, or its enqueue failed)"
                }
            ),
            after: self.config.timeout,
        }
    }
}
