//! The fabric: what the rank executors of one communicator exchange, whatever their placement.
//!
//! A rank executor (`executor::rank`) owns one rank's GPU resources and enqueues only that
//! rank's program; what it needs of its peers it gets through a [`Fabric`]:
//! - **small records, all-gathered**: each rank contributes a list of words (its buffers'
//!   handles, its GPU's identity) and receives every rank's, by rank — at creation, and when a
//!   new message shape is prepared (a collective step every rank takes in the same order, since
//!   every rank prepares the same shapes in the same order);
//! - **memory, exported and imported**: a rank exports device memory (or pinned host memory)
//!   its peers write or read — staging slots, counters' mailboxes, the peer kernels' flags — as
//!   a handle in its record; each peer imports the handle as an address valid in its own
//!   context;
//! - **a lost peer**: the rank that is gone, once the fabric knows;
//! - **reach**: how a rank's context reaches a peer's GPU ([`Reach`]: the same GPU, peer access,
//!   or not directly), asked by the peer's [`Identity`] (its UUID), never by an ordinal — and
//!   made so where that takes a step in this process.
//!
//! [`InProcess`] is the fabric of ranks that share one process (today's `Communicator`): its
//! records need no transport (the driver holds every rank's), a handle is the address itself
//! (one address space: identity addresses, reached over peer access, which it enables between
//! the ranks' contexts), and no peer can be lost without the whole process. A fabric between processes ([`Joined`]: file descriptors or CUDA IPC
//! handles, a rendezvous over TCP) implements the same trait under the same rank executor.
//!
//! Invariant: `all_gather` returns every rank's record exactly as that rank gave it, in rank
//! order; `import(export(m))` is an address of the same memory in the importing rank's context.

mod joined;

use super::kernels::CallGate;
use crate::device::{self, DeviceBuffer, PinnedHost};
use crate::error::{Error, Result};
use crate::exec::job::{CallShape, CallerRefs};
pub(crate) use crate::exec::rendezvous::push_text;
use crate::exec::rendezvous::text_of;
use crate::topo;
use cudarc::driver::CudaContext;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) use joined::Joined;
pub use joined::MemorySharing;

/// A record a rank contributes to an all-gather: a few 64-bit words.
pub(crate) type Record = Vec<u64>;

/// Memory a rank makes reachable to its peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exported {
    /// Device memory of the exporting rank's context, `bytes` long from `addr`.
    Device { addr: u64, bytes: usize },
    /// Pinned host memory the exporting rank allocated (portable, mapped), `bytes` long from
    /// its device address `addr`.
    Host { addr: u64, bytes: usize },
}

/// What ranks exchange (module doc).
pub(crate) trait Fabric: Send + Sync {
    /// The number of ranks.
    fn world(&self) -> usize;

    /// The ranks whose executors live in this process.
    fn local_ranks(&self) -> Range<usize>;

    /// Every rank's record, by rank, given the records of this process's ranks (by local rank,
    /// in `local_ranks` order).
    fn all_gather(&self, local: Vec<Record>) -> Result<Vec<Record>>;

    /// The handle under which local rank `rank`'s `memory` is imported by its peers.
    fn export(&self, rank: usize, memory: Exported) -> Result<Record>;

    /// The address, in local rank `rank`'s context, of the memory rank `from` exported as
    /// `handle`.
    fn import(&self, rank: usize, from: usize, handle: &[u64]) -> Result<u64>;

    /// A peer the fabric knows is gone or failed, as the error that names it, if any.
    fn lost_peer(&self) -> Option<Error>;

    /// Publishes this process's rank's next call, of `shape`, with where its buffers lie in the
    /// memory it registered (`refs`), without waiting for the peers (`exec::job::calls`; only
    /// a host `CALL_SLOTS` calls ahead of a rank's check waits, until `deadline`, `timeout`
    /// after the call began); `gated`: the call is left to the call gate ([`Fabric::gate`]),
    /// else the caller meets it ([`Fabric::meet_call`]). Returns the call's number. In one
    /// process there is nothing to publish (the driver validates every rank's call, and every
    /// rank's buffers are at hand).
    fn publish_call(
        &self,
        _shape: CallShape,
        _refs: CallerRefs,
        _gated: bool,
        _deadline: Instant,
        _timeout: Duration,
    ) -> Result<u64> {
        Ok(0)
    }

    /// Checks published call `seq`, of `shape`, against every peer's on the host: waits until
    /// every peer has published it ([`Error::CallMismatch`] on every rank if the calls differ).
    /// Returns every rank's refs of it, by rank. In one process: no refs.
    fn meet_call(
        &self,
        _seq: u64,
        _shape: CallShape,
        _deadline: Instant,
        _timeout: Duration,
    ) -> Result<Vec<CallerRefs>> {
        Ok(Vec::new())
    }

    /// What the call gate (`kernels::CallGate`) of this process's rank needs, where its GPU reaches
    /// every rank's control words: a call may then be checked there instead of by
    /// [`Fabric::meet_call`] (its call number `seq` left 0, for the call to set). `None` in
    /// one process.
    fn gate(&self) -> Option<CallGate> {
        None
    }

    /// The call this rank's gate found different from a peer's, as the error.
    fn gate_fault(&self) -> Option<Error> {
        None
    }

    /// Where a peer's gate found call `next` — the one this rank is about to publish, its next —
    /// different from another rank's: the mismatch as this rank names it (`Job::named_mismatch`),
    /// for a failure this rank sees before it publishes the call.
    fn mismatch_of_next(&self, _next: CallShape) -> Option<Error> {
        None
    }

    /// This process's rank finished its part of its latest call: its process may end without
    /// failing slower peers.
    fn finished(&self) {}

    /// This process's rank launched a point-to-point channel kernel, which may wait for any
    /// peer until [`Fabric::finished`].
    fn channel_launched(&self) {}

    /// This process's rank's latest call failed with `err`: tells the peers, whose waits then
    /// fail naming the rank to blame.
    fn fail(&self, _err: &Error) {}

    /// How local rank `rank`'s context `ctx` (on this process's GPU `own`) reaches the GPU of a
    /// peer that reported `peer` ([`Reach`]), making it reachable where that takes a step in
    /// this process (enabling peer access between the two contexts). `Err` when that step
    /// failed; the peer is then not reached. Every fabric so far asks from this process
    /// ([`reach_from_this_process`]): a peer's GPU found by its UUID among this process's.
    fn reach(
        &self,
        _rank: usize,
        ctx: &Arc<CudaContext>,
        own: &Identity,
        peer: &Identity,
    ) -> Result<Reach> {
        reach_from_this_process(ctx, own, peer)
    }

    /// Device memory of `bytes` on `ctx`'s GPU that this fabric can export to the peers
    /// (`cuMemAlloc` memory, unless the fabric shares memory another way).
    fn exportable(&self, ctx: &Arc<CudaContext>, bytes: usize) -> Result<DeviceBuffer> {
        DeviceBuffer::new(ctx, bytes)
    }

    /// Pinned host memory of `bytes` (zeroed, portable, mapped for the GPUs) that this fabric can
    /// export to the peers (`cuMemHostAlloc` memory, unless the fabric shares it another way).
    fn exportable_host(&self, ctx: &Arc<CudaContext>, bytes: usize) -> Result<PinnedHost> {
        PinnedHost::new(ctx, bytes)
    }

    /// Releases one import of `handle` (rank `from`'s record, imported earlier): the memory is
    /// unmapped here once every import of it is released. The caller promises that nothing
    /// queued uses that import any more.
    fn release(&self, _from: usize, _handle: &[u64]) -> Result<()> {
        Ok(())
    }

    /// Unmaps what this process imported from other processes, once nothing uses it (every
    /// local stream idle); left mapped when a stuck GPU may still use it.
    fn close_imports(&self) -> Result<()> {
        Ok(())
    }

    /// Waits (bounded) until every rank is closing too, with its streams idle: no rank then
    /// needs another's memory, and none is taken for lost because it ended first.
    fn farewell(&self) -> Result<()> {
        Ok(())
    }

    /// The communicator's teardown left GPU work running (a stuck kernel): what this fabric
    /// maps for the GPUs (the call gate's view of the control words) stays mapped when it is
    /// dropped, as the executor's own memory does.
    fn keep_mapped(&self) {}

    /// Gives this process's rank up, from any thread (NCCL's `ncclCommAbort`): its waits end
    /// at once, its peers' fail naming it, and its teardown says no farewell. Nothing to do in
    /// one process.
    fn abort(&self) {}

    /// Until [`Fabric::unwatch_join`], this rank's abort also gives up the joins of `id` (a
    /// sub-communicator's, while this rank joins it: [`crate::exec::rendezvous::UniqueId::give_up`]),
    /// at once where the rank has aborted already. Nothing to do in one process.
    fn watch_join(&self, _id: &crate::exec::rendezvous::UniqueId) {}

    /// Ends [`Fabric::watch_join`] of `id` (its join is over: a later abort leaves the new
    /// communicator alone).
    fn unwatch_join(&self, _id: &crate::exec::rendezvous::UniqueId) {}
}

/// What one prepared plan imported from its peers, so that its imports can be released when
/// the plan is dropped from the cache (after its streams were synchronised): a workload whose
/// message size keeps changing would otherwise keep every evicted plan's peer memory mapped.
pub(crate) struct Imports {
    fabric: Arc<dyn Fabric>,
    /// (exporting rank, its record) of every import, in order.
    list: Mutex<Vec<(usize, Record)>>,
}

impl Imports {
    pub(crate) fn new(fabric: Arc<dyn Fabric>) -> Imports {
        Imports {
            fabric,
            list: Mutex::new(Vec::new()),
        }
    }

    /// [`Fabric::import`], remembered — but a rank's own buffer, which every fabric hands back
    /// by its address, mapping nothing: a plan that imported only its own rank's buffers holds
    /// nothing to release, so the plan cache drops it without waiting.
    pub(crate) fn import(&self, rank: usize, from: usize, handle: &[u64]) -> Result<u64> {
        let at = self.fabric.import(rank, from, handle)?;
        if from != rank {
            let mut list = self.list.lock().unwrap_or_else(|p| p.into_inner());
            list.push((from, handle.to_vec()));
        }
        Ok(at)
    }

    /// True when nothing was imported.
    pub(crate) fn is_empty(&self) -> bool {
        self.list
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Releases every import remembered ([`Fabric::release`]); the first error.
    ///
    /// # Safety
    /// Nothing queued or to be queued uses the imported memory through this plan any more.
    pub(crate) unsafe fn release_all(&self) -> Result<()> {
        let list = std::mem::take(&mut *self.list.lock().unwrap_or_else(|p| p.into_inner()));
        let mut first = Ok(());
        for (from, handle) in list {
            let released = self.fabric.release(from, &handle);
            if first.is_ok() {
                first = released;
            }
        }
        first
    }
}

/// How a context of this process reaches the GPU a peer reported: the same GPU; peer access
/// between this context and that GPU's primary context (enabled here); or not, and why. The
/// peer's GPU is found by its UUID among this process's devices.
fn reach_from_this_process(
    ctx: &Arc<CudaContext>,
    own: &Identity,
    peer: &Identity,
) -> Result<Reach> {
    if own.same_gpu(peer) {
        return Ok(Reach::SameGpu);
    }
    let Some(theirs) = device::ordinal_of(&peer.uuid)? else {
        return Ok(Reach::NotVisible);
    };
    if !device::can_access_peer(own.ordinal, theirs)? {
        return Ok(Reach::NoPeerAccess);
    }
    let peer_ctx = device::context(theirs)?;
    device::enable_peer_access(ctx, &peer_ctx)?;
    Ok(Reach::Peer)
}

/// The fabric of ranks that share one process (module doc).
#[derive(Clone, Copy, Debug)]
pub(crate) struct InProcess {
    world: usize,
}

impl InProcess {
    pub(crate) fn new(world: usize) -> InProcess {
        InProcess { world }
    }
}

impl Fabric for InProcess {
    fn world(&self) -> usize {
        self.world
    }

    fn local_ranks(&self) -> Range<usize> {
        0..self.world
    }

    fn all_gather(&self, local: Vec<Record>) -> Result<Vec<Record>> {
        if local.len() != self.world {
            return Err(Error::Internal {
                what: format!(
                    "an in-process all-gather with {} records for {} ranks",
                    local.len(),
                    self.world
                ),
            });
        }
        Ok(local)
    }

    fn export(&self, _rank: usize, memory: Exported) -> Result<Record> {
        let (Exported::Device { addr, .. } | Exported::Host { addr, .. }) = memory;
        Ok(vec![addr])
    }

    fn import(&self, _rank: usize, from: usize, handle: &[u64]) -> Result<u64> {
        match handle {
            [addr] => Ok(*addr),
            _ => Err(Error::Internal {
                what: format!(
                    "rank {from}'s in-process handle has {} words, not 1",
                    handle.len()
                ),
            }),
        }
    }

    fn lost_peer(&self) -> Option<Error> {
        None
    }
}

/// What a rank says about its GPU at creation (its record), so that every rank knows its peers'
/// GPUs by identity, not by an ordinal that means another GPU in another process: the device's
/// UUID (as `nvidia-smi -L` prints it), its PCI bus id (as NVML and `nvidia-smi topo` know it),
/// its SM count, and its ordinal in the rank's own process (how that process's user names it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) uuid: [u8; 16],
    /// Domain, bus, device and function, packed ([`pack_bus_id`]).
    pub(crate) pci_bus_id: u64,
    pub(crate) sm_count: u32,
    pub(crate) ordinal: usize,
}

/// A PCI bus id ("0000:19:00.0", either spelling [`topo::parse_pci_bus_id`] reads) as one word:
/// domain, bus, device, function from the high bits down; `u64::MAX` when it does not parse.
pub(crate) fn pack_bus_id(text: &str) -> u64 {
    match topo::parse_pci_bus_id(text) {
        Some((domain, bus, device, function)) => {
            (u64::from(domain) << 32)
                | (u64::from(bus & 0xffff) << 16)
                | (u64::from(device & 0xff) << 8)
                | u64::from(function & 0xff)
        }
        None => u64::MAX,
    }
}

impl Identity {
    /// The identity of this process's GPU `ordinal`.
    pub(crate) fn of(ordinal: usize) -> Result<Identity> {
        let info = device::device_info(ordinal)?;
        Ok(Identity {
            uuid: info.uuid,
            pci_bus_id: pack_bus_id(&info.pci_bus_id),
            sm_count: info.sm_count,
            ordinal,
        })
    }

    /// Whether the two are one GPU.
    pub(crate) fn same_gpu(&self, other: &Identity) -> bool {
        self.uuid == other.uuid
    }

    /// The identity as a record: the UUID in two words, the bus id, the SM count, the ordinal.
    pub(crate) fn record(&self) -> Record {
        let (lo, hi) = self.uuid.split_at(8);
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
        vec![
            word(lo),
            word(hi),
            self.pci_bus_id,
            u64::from(self.sm_count),
            self.ordinal as u64,
        ]
    }

    /// Rank `from`'s identity, from its record.
    pub(crate) fn from_record(from: usize, record: &[u64]) -> Result<Identity> {
        let mut fields = Fields::new(from, record);
        let words = fields.take(2)?;
        let pci_bus_id = fields.word()?;
        let sm_count = u32::try_from(fields.word()?).unwrap_or(u32::MAX);
        let ordinal = usize::try_from(fields.word()?).unwrap_or(usize::MAX);
        fields.finish()?;
        let mut uuid = [0u8; 16];
        uuid[..8].copy_from_slice(&words[0].to_le_bytes());
        uuid[8..].copy_from_slice(&words[1].to_le_bytes());
        Ok(Identity {
            uuid,
            pci_bus_id,
            sm_count,
            ordinal,
        })
    }
}

/// How a rank's context reaches a peer's GPU memory ([`Fabric::reach`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reach {
    /// The peer's GPU is this rank's own.
    SameGpu,
    /// Directly, over peer access (NVLink or PCIe), enabled where it needs enabling.
    Peer,
    /// The driver says this GPU cannot map the peer's (`cuDeviceCanAccessPeer` = 0).
    NoPeerAccess,
    /// The peer's GPU is not visible in this process (`CUDA_VISIBLE_DEVICES`), so whether it
    /// can be reached cannot be asked.
    NotVisible,
}

impl Reach {
    /// Whether the peer's memory is reached directly (same GPU, or peer access).
    pub(crate) fn direct(self) -> bool {
        matches!(self, Reach::SameGpu | Reach::Peer)
    }
}

/// Reads a record as fields of known lengths: the cursor every decoder of a record uses, so that
/// a short record is an error naming its sender, never a panic.
pub(crate) struct Fields<'a> {
    from: usize,
    words: &'a [u64],
}

impl<'a> Fields<'a> {
    pub(crate) fn new(from: usize, words: &'a [u64]) -> Fields<'a> {
        Fields { from, words }
    }

    /// The next `n` words.
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u64]> {
        if self.words.len() < n {
            return Err(Error::Internal {
                what: format!(
                    "rank {}'s record ended {} words early",
                    self.from,
                    n - self.words.len()
                ),
            });
        }
        let (head, rest) = self.words.split_at(n);
        self.words = rest;
        Ok(head)
    }

    /// The next word.
    pub(crate) fn word(&mut self) -> Result<u64> {
        self.take(1).map(|w| w[0])
    }

    /// The next text ([`push_text`] wrote it: its length in bytes, then its bytes in words).
    pub(crate) fn text(&mut self) -> Result<String> {
        let len = usize::try_from(self.word()?).unwrap_or(usize::MAX);
        let words = self.take(len.div_ceil(8))?;
        Ok(text_of(len, words))
    }

    /// Whether every word was read (a longer record than expected is as wrong as a shorter).
    pub(crate) fn finish(self) -> Result<()> {
        match self.words.len() {
            0 => Ok(()),
            extra => Err(Error::Internal {
                what: format!("rank {}'s record has {extra} words too many", self.from),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_and_texts_survive_a_record() {
        let id = Identity {
            uuid: *b"0123456789abcdef",
            pci_bus_id: pack_bus_id("0000:19:00.0"),
            sm_count: 132,
            ordinal: 3,
        };
        assert_eq!(id.pci_bus_id, (0x19 << 16) as u64);
        assert_eq!(
            pack_bus_id("00000000:9A:01.1"),
            (0x9a << 16 | 1 << 8 | 1) as u64
        );
        assert_eq!(pack_bus_id("no bus"), u64::MAX);
        assert_eq!(Identity::from_record(2, &id.record()).unwrap(), id);
        assert!(Identity::from_record(2, &id.record()[..4]).is_err());
        for text in [
            "",
            "peer",
            "exactly8",
            "a reason of some length — with UTF-8",
        ] {
            let mut record = vec![7];
            push_text(&mut record, text);
            record.push(9);
            let mut fields = Fields::new(0, &record);
            assert_eq!(fields.word().unwrap(), 7);
            assert_eq!(fields.text().unwrap(), text);
            assert_eq!(fields.word().unwrap(), 9);
            fields.finish().unwrap();
        }
    }

    #[test]
    fn the_in_process_fabric_hands_every_record_back_and_imports_what_was_exported() {
        let fabric = InProcess::new(3);
        assert_eq!(fabric.local_ranks(), 0..3);
        let records = vec![vec![1, 2], vec![], vec![7]];
        assert_eq!(fabric.all_gather(records.clone()).unwrap(), records);
        assert!(fabric.all_gather(vec![vec![1]]).is_err());
        for memory in [
            Exported::Device {
                addr: 0x7f00_0000_1000,
                bytes: 64,
            },
            Exported::Host {
                addr: 0x2000,
                bytes: 4,
            },
        ] {
            let handle = fabric.export(1, memory).unwrap();
            let (Exported::Device { addr, .. } | Exported::Host { addr, .. }) = memory;
            assert_eq!(fabric.import(2, 1, &handle).unwrap(), addr);
        }
        assert!(fabric.import(0, 1, &[1, 2]).is_err());
        assert_eq!(fabric.lost_peer(), None);
    }

    #[test]
    fn a_record_is_read_field_by_field_and_must_be_read_whole() {
        let words = [5, 6, 7];
        let mut fields = Fields::new(2, &words);
        assert_eq!(fields.word().unwrap(), 5);
        assert_eq!(fields.take(2).unwrap(), &[6, 7]);
        fields.finish().unwrap();
        let mut short = Fields::new(2, &words);
        let err = short.take(4).unwrap_err().to_string();
        assert!(
            err.contains("rank 2") && err.contains("1 words early"),
            "{err}"
        );
        let mut long = Fields::new(1, &words);
        long.word().unwrap();
        assert!(long
            .finish()
            .unwrap_err()
            .to_string()
            .contains("2 words too many"));
    }
}
