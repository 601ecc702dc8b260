//! Collectives captured into CUDA graphs: what changes when the caller's streams are being
//! captured, and the event counters that replace the ring's cross-GPU events there.
//!
//! A captured collective becomes nodes of the caller's graph(s): it must replay correctly any
//! number of times, with nothing call-specific baked in, and it may be captured one graph per
//! GPU (as one process per GPU would) — where an event recorded in one capture cannot be waited
//! for in another. So:
//! - the peer kernels (one-shot, two-shot) capture as they are: their barrier epochs live in
//!   device memory and advance on the device (`cuda/peer.cuh`);
//! - the ring keeps its events between a rank's own streams (they become graph edges), and each
//!   cross-GPU wait becomes a pair of counter kernels (`cuda/counters.cuh`): a signal after the
//!   record on the recording rank's stream, a wait with a deadline on the waiting rank's stream,
//!   over counters in device memory laid out here ([`EventCounters`], one set per plan, made
//!   when the plan is prepared). Peer copies become plain UVA copies (`cuMemcpyPeerAsync`
//!   cannot be captured);
//! - a plan captured once is pinned for the communicator's life (the graph holds its staging
//!   and counters; an in-place one-shot's exposed copies are in the exposure regions, which
//!   outlive every plan: module `exposure`), and nothing is recorded for the host to poll: the host learns of a failed
//!   replay from the kernels' error words (`Communicator::health`, the next call, `synchronize`).
//!
//! What cannot be captured is refused before anything is enqueued, with
//! [`Error::NotCapturable`] naming why: a shape that has not run on the communicator before
//! (preparing it allocates and synchronises), edges staged through host memory (a host-side
//! handoff), and rings without peer access between every pair of GPUs (the event counters are
//! written across GPUs).
//!
//! Invariant: a captured plan's k-th signal of an event pairs with the k-th wait for it on each
//! waiting stream, on every replay, because each counter has exactly one writer and every rank
//! replays the same sequence of collectives.

use super::{CudaExecutor, RankRes};
use crate::device::{self, DeviceBuffer};
use crate::error::{Error, Result};
use crate::exec::cuda::kernels::COUNTER_ERR_BIT;
use crate::exec::Shape;
use crate::plan::{EdgeTransport, EventId, Op, Plan, StreamKind};
use cudarc::driver::{sys, CudaStream};
use std::sync::Arc;

/// The event counters of one plan: per rank one zeroed device buffer of
/// `events × (world + 1 + 4)` words — `sent[e × world + waiter]` (events this rank records),
/// then `mailbox[e]` (events this rank waits for), then `seen[e × 4 + stream]`.
pub(super) struct EventCounters {
    world: usize,
    events: usize,
    words: Vec<DeviceBuffer>,
}

impl EventCounters {
    /// The counters for `plan`, or `None` when no event of it is waited for by another rank.
    pub(super) fn new(ranks: &[Arc<RankRes>], plan: &Plan) -> Result<Option<EventCounters>> {
        if plan.remote_waiters().iter().all(Vec::is_empty) {
            return Ok(None);
        }
        let (world, events) = (plan.world, plan.events.len());
        let bytes = events * (world + 1 + StreamKind::ALL.len()) * 4;
        let words = ranks
            .iter()
            .map(|r| DeviceBuffer::zeroed(&r.ctx, bytes))
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(EventCounters {
            world,
            events,
            words,
        }))
    }

    fn word(&self, rank: usize, index: usize) -> u64 {
        self.words[rank].ptr() + 4 * index as u64
    }

    /// The recorder's count of signals of event `e` sent to `waiter`.
    pub(super) fn sent(&self, recorder: usize, e: EventId, waiter: usize) -> u64 {
        self.word(recorder, e.0 * self.world + waiter)
    }

    /// Where `waiter` receives the counts of event `e`.
    pub(super) fn mailbox(&self, waiter: usize, e: EventId) -> u64 {
        self.word(waiter, self.events * self.world + e.0)
    }

    /// How many signals of event `e` `waiter`'s stream `stream` has consumed.
    pub(super) fn seen(&self, waiter: usize, e: EventId, stream: StreamKind) -> u64 {
        self.word(
            waiter,
            self.events * (self.world + 1) + e.0 * StreamKind::ALL.len() + stream.index(),
        )
    }
}

/// The error code of a counter wait for event `e` of pinned plan `pin` (see
/// `RR_COUNTER_ERR_BIT`): the pin in bits 16..31, the event in bits 0..16 (0xffff: too many to
/// name).
pub(super) fn wait_code(pin: usize, e: EventId) -> u32 {
    let pin = pin.min(0x7fff) as u32;
    let event = e.0.min(0xffff) as u32;
    pin << 16 | event
}

/// Whether the caller's streams are being captured: all of them or none (a mix, or a capture
/// already invalidated, is refused).
pub(super) fn capturing(streams: &[Arc<CudaStream>]) -> Result<bool> {
    use sys::CUstreamCaptureStatus as S;
    let mut states = Vec::with_capacity(streams.len());
    for (rank, stream) in streams.iter().enumerate() {
        let status = stream
            .capture_status()
            .map_err(device::check("cuStreamGetCaptureInfo"))?;
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
    /// allocates and synchronises, which a capture does not allow), and a plan that cannot be
    /// captured.
    pub(super) fn pin_for_capture(&mut self, shape: Shape) -> Result<usize> {
        let Some(prepared) = self.prepared(&shape) else {
            return Err(Error::NotCapturable {
                reason: format!(
                    "this shape ({} elements of {} bytes, {}{}) has not run on this communicator yet: make one call of it outside the capture first (preparing a shape allocates memory, which a capture does not allow)",
                    shape.count,
                    shape.elem_bytes,
                    if shape.in_place { "in place" } else { "out of place" },
                    if shape.average { ", Avg" } else { "" },
                ),
            });
        };
        let prepared = &prepared;
        let plan = &prepared.plan;
        let staged = plan.ranks.iter().flatten().any(|i| match i.op {
            Op::Copy { src, dst } => {
                plan.decl(src.buf).kind.memory() != plan.decl(dst.buf).kind.memory()
            }
            _ => false,
        });
        if staged
            || self
                .edges
                .iter()
                .any(|e| e.transport == EdgeTransport::Staged)
        {
            return Err(Error::NotCapturable {
                reason: "this communicator's ring stages edges through pinned host memory, whose handoffs the host threads make".into(),
            });
        }
        if prepared.counters.is_none() && plan.remote_waiters().iter().any(|w| !w.is_empty()) {
            return Err(Error::NotCapturable {
                reason: "the ring's event counters between GPUs need peer access between every pair of GPUs, which this communicator does not have".into(),
            });
        }
        if let Some(pin) = self
            .pinned
            .iter()
            .position(|(_, p)| Arc::ptr_eq(p, prepared))
        {
            return Ok(pin);
        }
        self.pinned.push((shape, prepared.clone()));
        Ok(self.pinned.len() - 1)
    }

    /// The timeout a captured ring's counter wait for `code` reported, by name: which rank
    /// waited for which event of which captured plan.
    pub(super) fn counter_timeout(&self, rank: usize, code: u32) -> Error {
        let pin = ((code & !COUNTER_ERR_BIT) >> 16) as usize;
        let event = (code & 0xffff) as usize;
        let what = self
            .pinned
            .get(pin)
            .and_then(|(_, p)| p.plan.events.get(event))
            .map_or_else(
                || "an event of a captured ring".to_string(),
                |d| d.to_string(),
            );
        Error::Timeout {
            rank,
            waiting_on: format!(
                "on GPU {} waited in a captured graph for {what} and gave up: that rank's graph was not replayed (or is stuck); replay every rank's graph, the same number of times",
                self.ranks[rank].device
            ),
            after: self.config.timeout,
        }
    }
}
