//! The event counters: how a rank waits for another rank's event, eager or captured — one
//! mechanism, which needs neither the other rank's CUDA event nor a host thread of it.
//!
//! The recording rank's stream runs a signal kernel (`cuda/counters.cuh`) just before the
//! record: `sent += 1`, then the count into the waiter's mailbox (a store into the waiter's
//! memory). The waiting rank's stream runs a wait kernel where the plan waits: it spins until
//! the mailbox has reached `seen + 1`, then consumes it, and gives up at three quarters of the
//! call's timeout (leaving a code in its rank's error word). Counts, not values from the host,
//! so the k-th signal of an event pairs with the k-th wait for it on each waiting stream
//! whatever the order in which the ranks enqueued — and replay after replay of a captured call.
//!
//! Words, per rank and per plan (zeroed once, when the plan is prepared):
//! - `local`, this rank's device memory: `sent[e × world + waiter]` for the events it records,
//!   then `seen[e × 4 + stream]` for the events it waits for (written only by its own kernels);
//! - `mailbox`, one word per event, where its recorder's signals land: this rank's device memory
//!   when every pair of GPUs has peer access (the signal is a store over NVLink or PCIe, the
//!   wait spins on local memory), else its pinned host memory, which every GPU reaches. The
//!   mailbox is exported through the fabric; every other rank imports it (`mailbox_of`).
//!
//! Invariant: each word has exactly one writer (a `sent` and a `mailbox[e]` the recording
//! stream of `e`, a `seen` its waiting stream), and a stream waits for a remote event at most
//! once per call (`check_shape`), so counts stay paired call after call while every rank runs
//! the same sequence of collectives.

use super::rank::RankRes;
use crate::device::{DeviceBuffer, PinnedHost};
use crate::error::Result;
use crate::exec::cuda::fabric::{Exported, Fabric, Fields, Imports, Record};
use crate::plan::{EventId, Plan, StreamKind};

/// Where a rank's mailboxes of one plan live (module doc).
enum Mailboxes {
    Device(DeviceBuffer),
    Host(PinnedHost),
}

impl Mailboxes {
    /// The mailboxes as memory a peer imports.
    fn exported(&self, events: usize) -> Exported {
        match self {
            Mailboxes::Device(b) => Exported::Device {
                addr: b.ptr(),
                bytes: events * 4,
            },
            Mailboxes::Host(h) => Exported::Host {
                addr: h.uva_ptr(),
                bytes: events * 4,
            },
        }
    }
}

/// One rank's event counters of one plan, with every rank's mailboxes as it reaches them.
pub(super) struct Counters {
    /// Per event, the other ranks that wait for it ([`Plan::remote_waiters`]): whom its
    /// recorder signals.
    pub(super) waiters: Vec<Vec<usize>>,
    world: usize,
    events: usize,
    local: DeviceBuffer,
    /// Kept alive for the peers that signal into it; reached through `mailbox_of[rank]`.
    _mailbox: Mailboxes,
    /// Every rank's mailbox base, as an address valid in this rank's context (this rank's own
    /// among them); empty until `connect`.
    mailbox_of: Vec<u64>,
}

impl Counters {
    /// This rank's counters of `plan`, or `None` when no event of it is waited for by another
    /// rank; the mailboxes in device memory when `peer_access` holds between every pair of
    /// GPUs, else in pinned host memory. Returns the record entry its peers import the
    /// mailboxes from. Not usable until [`Counters::connect`].
    pub(super) fn allocate(
        res: &RankRes,
        fabric: &dyn Fabric,
        plan: &Plan,
        peer_access: bool,
    ) -> Result<Option<(Counters, Record)>> {
        let waiters = plan.remote_waiters();
        if waiters.iter().all(Vec::is_empty) {
            return Ok(None);
        }
        let (world, events) = (plan.world, plan.events.len());
        let local = DeviceBuffer::zeroed(&res.ctx, events * (world + StreamKind::ALL.len()) * 4)?;
        let mailbox = match peer_access {
            true => {
                let mut mailboxes = fabric.exportable(&res.ctx, events * 4)?;
                mailboxes.fill_zero()?;
                Mailboxes::Device(mailboxes)
            }
            false => {
                let mut words = fabric.exportable_host(&res.ctx, events * 4)?;
                words.as_mut_slice().fill(0);
                Mailboxes::Host(words)
            }
        };
        let handle = fabric.export(res.rank, mailbox.exported(events))?;
        let mut record = vec![handle.len() as u64];
        record.extend(handle);
        let counters = Counters {
            waiters,
            world,
            events,
            local,
            _mailbox: mailbox,
            mailbox_of: Vec::new(),
        };
        Ok(Some((counters, record)))
    }

    /// Imports every rank's mailboxes from its record entry (`fields`, one cursor per rank,
    /// each at this entry).
    pub(super) fn connect(
        &mut self,
        res: &RankRes,
        imports: &Imports,
        fields: &mut [Fields<'_>],
    ) -> Result<()> {
        self.mailbox_of = fields
            .iter_mut()
            .enumerate()
            .map(|(from, f)| {
                let len = f.word()? as usize;
                imports.import(res.rank, from, f.take(len)?)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(())
    }

    fn local_word(&self, index: usize) -> u64 {
        self.local.ptr() + 4 * index as u64
    }

    /// This rank's count of signals of event `e` (one it records) sent to `waiter`.
    pub(super) fn sent(&self, e: EventId, waiter: usize) -> u64 {
        self.local_word(e.0 * self.world + waiter)
    }

    /// Where rank `rank` receives the counts of event `e` (this rank's own mailbox, or a peer's
    /// as imported).
    pub(super) fn mailbox(&self, rank: usize, e: EventId) -> u64 {
        self.mailbox_of[rank] + 4 * e.0 as u64
    }

    /// How many signals of event `e` this rank's stream `stream` has consumed.
    pub(super) fn seen(&self, e: EventId, stream: StreamKind) -> u64 {
        self.local_word(self.events * self.world + e.0 * StreamKind::ALL.len() + stream.index())
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
