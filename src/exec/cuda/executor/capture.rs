//! Collectives captured into CUDA graphs, and the event counters that carry every wait of one
//! rank for another rank's event, eager or captured.
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
//!   deadline on the waiting rank's stream, over counters laid out here ([`EventCounters`], one
//!   set per plan, made when the plan is prepared). Peer copies become plain UVA copies
//!   (`cuMemcpyPeerAsync` cannot be captured);
//! - a plan captured once is pinned for the communicator's life (the graph holds its staging
//!   and counters; an in-place one-shot's exposed copies are in the exposure regions, which
//!   outlive every plan: module `exposure`), and nothing is recorded for the host to poll: the
//!   host learns of a failed replay from the kernels' error words (`Communicator::health`, the
//!   next call, `synchronize`).
//!
//! What cannot be captured is refused before anything is enqueued, with
//! [`Error::NotCapturable`] naming why: a shape that has not run on the communicator before
//! (preparing it allocates and synchronises). (Edges staged through pinned host memory capture
//! like peer edges: their copies are copies, their waits counters.)
//!
//! Invariant: a plan's k-th signal of an event pairs with the k-th wait for it on each waiting
//! stream, call after call and replay after replay, because each counter has exactly one
//! writer, each stream waits for a remote event at most once per call (`check_shape`), and
//! every rank runs the same sequence of collectives.

use super::{CudaExecutor, RankRes};
use crate::device::{self, DeviceBuffer, PinnedHost};
use crate::error::{Error, Result};
use crate::exec::cuda::kernels::COUNTER_ERR_BIT;
use crate::exec::Shape;
use crate::plan::{EventId, Plan, StreamKind};
use cudarc::driver::{sys, CudaStream};
use std::sync::Arc;

/// Where a rank's mailboxes live: its device memory, which its peers write over peer access, or
/// (without peer access between every pair) its pinned host memory, which every GPU reaches.
enum Mailboxes {
    Device(DeviceBuffer),
    Host(PinnedHost),
}

impl Mailboxes {
    fn address(&self) -> u64 {
        match self {
            Mailboxes::Device(b) => b.ptr(),
            Mailboxes::Host(h) => h.uva_ptr(),
        }
    }
}

/// The event counters of one plan. Per rank: `events × (world + 4)` zeroed words of its device
/// memory — `sent[e × world + waiter]` (events it records), then `seen[e × 4 + stream]` (events
/// it waits for) — and `events` zeroed mailbox words, `mailbox[e]`: the latest count of event
/// `e` its recorder sent it.
pub(super) struct EventCounters {
    /// Per event, the other ranks that wait for it ([`Plan::remote_waiters`]): whom its
    /// recorder signals.
    pub(super) waiters: Vec<Vec<usize>>,
    world: usize,
    events: usize,
    local: Vec<DeviceBuffer>,
    mailboxes: Vec<Mailboxes>,
}

impl EventCounters {
    /// The counters for `plan`, or `None` when no event of it is waited for by another rank;
    /// mailboxes in device memory when `peer_access` holds between every pair of GPUs, else in
    /// pinned host memory.
    pub(super) fn new(
        ranks: &[Arc<RankRes>],
        plan: &Plan,
        peer_access: bool,
    ) -> Result<Option<EventCounters>> {
        let waiters = plan.remote_waiters();
        if waiters.iter().all(Vec::is_empty) {
            return Ok(None);
        }
        let (world, events) = (plan.world, plan.events.len());
        let local_bytes = events * (world + StreamKind::ALL.len()) * 4;
        let local = ranks
            .iter()
            .map(|r| DeviceBuffer::zeroed(&r.ctx, local_bytes))
            .collect::<Result<Vec<_>>>()?;
        let mailboxes = ranks
            .iter()
            .map(|r| match peer_access {
                true => DeviceBuffer::zeroed(&r.ctx, events * 4).map(Mailboxes::Device),
                false => {
                    let mut words = PinnedHost::new(&r.ctx, events * 4)?;
                    words.as_mut_slice().fill(0);
                    Ok(Mailboxes::Host(words))
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(EventCounters {
            waiters,
            world,
            events,
            local,
            mailboxes,
        }))
    }

    fn local_word(&self, rank: usize, index: usize) -> u64 {
        self.local[rank].ptr() + 4 * index as u64
    }

    /// The recorder's count of signals of event `e` sent to `waiter`.
    pub(super) fn sent(&self, recorder: usize, e: EventId, waiter: usize) -> u64 {
        self.local_word(recorder, e.0 * self.world + waiter)
    }

    /// Where `waiter` receives the counts of event `e`.
    pub(super) fn mailbox(&self, waiter: usize, e: EventId) -> u64 {
        self.mailboxes[waiter].address() + 4 * e.0 as u64
    }

    /// How many signals of event `e` `waiter`'s stream `stream` has consumed.
    pub(super) fn seen(&self, waiter: usize, e: EventId, stream: StreamKind) -> u64 {
        self.local_word(
            waiter,
            self.events * self.world + e.0 * StreamKind::ALL.len() + stream.index(),
        )
    }
}

/// The error code of a counter wait for event `e` of the plan numbered `serial` (see
/// `RR_COUNTER_ERR_BIT`): the serial in bits 16..31, the event in bits 0..16 (0xffff: too many
/// to name).
pub(super) fn wait_code(serial: usize, e: EventId) -> u32 {
    let serial = (serial & 0x7fff) as u32;
    let event = e.0.min(0xffff) as u32;
    serial << 16 | event
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
    /// allocates and synchronises, which a capture does not allow).
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

    /// The timeout a counter wait for `code` reported, by name: which rank waited for which
    /// event of which plan (one still cached or pinned; else just "an event").
    pub(super) fn counter_timeout(&self, rank: usize, code: u32) -> Error {
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
            rank,
            waiting_on: format!(
                "on GPU {} waited for {what} and gave up: {}",
                self.ranks[rank].device,
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
