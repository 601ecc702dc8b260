//! Each rank's peer-kernel words on the executor's side: the words the peer kernels share
//! across ranks, and across processes the arenas of the plans each rank prepares alone
//! ([`PeerWords`], made in two phases around the fabric's all-gather:
//! [`allocate_peer_words`], [`connect_peer_words`]), which kernel a call launches
//! ([`PeerKernel`]), and on how many ranks the peer kernels can run ([`peer_kernels_fit`]).
//! The peer kernels are the one-shot and the two-shot all-reduce and the steps kernel of the
//! other collectives' one-shot form, one kernel per rank that reads the other ranks' memory
//! directly (peer access) and meets their kernels at flag barriers, and the LL one-shot, which
//! pushes each rank's input into its peers' receive buffers instead
//! ([`crate::exec::cuda::kernels`] launches them; `cuda/peer.cuh` and `cuda/ll.cuh` describe the
//! protocols). Module `peer_enqueue` launches them from a plan; module `error_words` reads what
//! they leave in the error words.
//!
//! With [`CudaConfig::low_latency`](super::CudaConfig::low_latency) on, a one-shot all-reduce
//! plan's peer reduce runs the LL kernel when the message fits it (the selection's form,
//! [`crate::exec::algorithm::select`]), else the read one-shot: the plan is the same (the
//! checker proves its result; both kernels compute it, with the same fold in the same order),
//! only the executor's way of running the meeting differs.
//!
//! Invariant: the grid cap keeps every block of every rank resident at once.

use super::rank::{Owned, RankRes};
use super::Transport;
use crate::device::{self, DeviceBuffer};
use crate::error::Result;
use crate::exec::cuda::fabric::Identity;
use crate::exec::cuda::fabric::{Exported, Fabric, Fields, Record};
use crate::exec::cuda::kernels::{channel_bytes, ll_recv_bytes, PEER_FLAG_BYTES, PEER_MAX_RANKS};
use crate::plan::{Memory, StreamKind};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which peer kernel a call launches; names the kernel in its errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PeerKernel {
    OneShot,
    TwoShot,
    /// The one-shot form of a collective other than the all-reduce.
    Steps,
    /// The LL one-shot: a one-shot all-reduce plan run by pushed words, no barrier (when:
    /// [`crate::exec::algorithm::Form::LlKernel`]).
    OneShotLl,
    /// The staged one-shot ([`crate::plan::staged`]): the read one-shot kernel over every
    /// rank's host copy, its barrier words in pinned host memory, for ranks whose GPUs do not
    /// reach each other.
    OneShotStaged,
}

impl fmt::Display for PeerKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PeerKernel::OneShot => "one-shot",
            PeerKernel::TwoShot => "two-shot",
            PeerKernel::Steps => "one-shot collective",
            PeerKernel::OneShotLl => "LL one-shot",
            PeerKernel::OneShotStaged => "staged one-shot",
        })
    }
}

/// One rank's peer-kernel words, made once per communicator: the flag words its peers write at
/// the barriers (zeroed; device memory reached through peer access, or pinned host memory where
/// the GPUs do not reach each other) and the LL kernel's receive
/// buffer (with `low_latency` only) and, across processes, the arena ([`ARENA_BYTES`]) — its own,
/// and every rank's as imported through the fabric; a kernel that gives up leaves its code in its
/// rank's error word (`RankRes::error`). Calls of every kernel share the flags and the per-block
/// epochs in them.
pub(super) struct PeerWords {
    /// Kept alive for the peers that write into them; reached through `flags_of[rank]`.
    /// Device memory, or pinned host memory where the GPUs do not reach each other (the
    /// staged one-shot; the kernels' flag accesses are system-scope either way, `cuda/peer.cuh`).
    _flags: Owned,
    _ll_recv: Option<DeviceBuffer>,
    /// Kept alive for the peers that read it; reached through `arena_of[rank]`. Device memory,
    /// or pinned host memory where the GPUs do not reach each other.
    _arena: Option<Owned>,
    /// Every rank's arena ([`crate::plan::arena`]), as this rank reaches it: where a plan
    /// prepared alone has every rank's buffers. `None` unless every rank made one.
    pub(super) arena_of: Option<Vec<u64>>,
    /// Kept alive for the peers that push into it; reached through `channel_of[rank]`.
    _channel: Option<DeviceBuffer>,
    /// Every rank's region of the point-to-point channel ([`channel_bytes`]`(world)` bytes,
    /// zeroed: `cuda/channel.cuh`), as this rank reaches it. `None` unless every rank made one
    /// (ranks of a job of one process per GPU whose GPUs reach each other).
    pub(super) channel_of: Option<Vec<u64>>,
    /// Whether every rank's process gates its calls (`Fabric::gate`): what the selection asks
    /// (`exec::algorithm::Ask::gated`), the same on every rank.
    pub(super) gated_everywhere: bool,
    /// Every rank's flag words, as this rank reaches them (its own among them).
    pub(super) flags_of: Vec<u64>,
    /// With [`CudaConfig::low_latency`](super::CudaConfig::low_latency): every rank's
    /// [`ll_recv_bytes`]`(world)` bytes of receive buffer (layout in `cuda/ll.cuh`), as this rank
    /// reaches them. `None` otherwise, and then the LL kernel never runs.
    pub(super) ll_recv_of: Option<Vec<u64>>,
    /// The smallest SM count of the ranks' GPUs, divided by the ranks sharing each: the grid cap
    /// that keeps every block of every rank resident.
    pub(super) max_blocks: u32,
    /// This rank's resources: its Main stream runs its peer kernels (what the gate waits for).
    res: Arc<RankRes>,
    /// The communicator's timeout: a peer kernel gives up within it of its launch.
    timeout: Duration,
    /// When the latest call's kernels were launched (under the gate, `device::gate::launching`).
    last_launch: std::sync::Mutex<Option<Instant>>,
}

impl device::gate::InFlight for PeerWords {
    /// Waits for this rank's latest call to complete on Main, or until the latest launch's
    /// timeout has passed (its kernel has given up by then, or never started).
    fn settle(&self) {
        let launched = *self.last_launch.lock().unwrap_or_else(|p| p.into_inner());
        let Some(launched) = launched else {
            return;
        };
        let deadline = launched + self.timeout;
        let Ok(saved) = device::save_current() else {
            return;
        };
        let main = self.res.stream(StreamKind::Main);
        while Instant::now() < deadline && matches!(device::stream_query(main), Ok(false)) {
            std::thread::sleep(Duration::from_micros(20));
        }
        // (Restoring can only fail if the driver does; the blocking call that follows reports it.)
        let _ = saved.restore();
    }
}

impl PeerWords {
    /// Notes that a call's kernels were launched at `at` (under the gate,
    /// `device::gate::launching`): what `settle` waits from.
    pub(super) fn launched_at(&self, at: Instant) {
        *self.last_launch.lock().unwrap_or_else(|p| p.into_inner()) = Some(at);
    }

    /// The LL kernel's room, when this rank has its receive buffers (`low_latency`): the grid
    /// cap its grid must fit — what the selection asks (`exec::algorithm::Ask::ll_grid`).
    pub(super) fn ll_grid(&self) -> Option<u32> {
        self.ll_recv_of.as_ref().map(|_| self.max_blocks)
    }
}

/// The size of each rank's arena, where the ranks live in several processes and every one of
/// them gates its calls: the room of the plans each rank prepares alone (module
/// `prepare`) — every kernel plan whose buffers a rank owns fit, in place or staged. Enough for
/// the read one-shot up to Auto's limit out of place (its caller's input and output staged, 2 ×
/// 32 MiB on two ranks), and the two-shot in place up to 64 MiB a rank. A larger all-reduce
/// runs as pieces that fit (module `pieces`); other larger plans are prepared with the peers,
/// their buffers allocated for them. Pinned host memory where the GPUs do not reach each other
/// (64 MiB a rank of page-locked memory).
pub(super) const ARENA_BYTES: usize = 64 << 20;

/// The memory of the ranks' arenas: device memory where every GPU reaches every other
/// (`peers_ok`), else pinned host memory, which every GPU maps.
pub(super) fn arena_memory(peers_ok: bool) -> Memory {
    match peers_ok {
        true => Memory::Device,
        false => Memory::Host,
    }
}

/// Whether the peer kernels can run on `world` ranks with `transport`: 2 to
/// [`PEER_MAX_RANKS`] ranks, not forced through host staging. (Peer access between every pair
/// is the other condition, which the in-process fabric checks and enables:
/// `CudaExecutor::enable_all_peer_access`.)
pub(super) fn peer_kernels_fit(world: usize, transport: Transport) -> bool {
    (2..=PEER_MAX_RANKS).contains(&world) && transport != Transport::Staged
}

/// Phase 1 of one rank's peer words: its flags (in pinned host memory with `host_flags`: the
/// staged one-shot's, for GPUs that do not reach each other) and (with `low_latency`) its LL
/// receive buffer, zeroed, and (with `arena`) its arena of [`ARENA_BYTES`] in that memory —
/// pinned host memory where the GPUs do not reach each other, so that every buffer a peer
/// touches of a plan prepared alone lies in host memory (`prepare_alone` proves it of each
/// plan); with `channel`, its point-to-point region ([`channel_bytes`], zeroed); and its
/// record (each one's export handle, length first; then whether its process gates its calls, 1
/// or 0; the arena's after its size, 0 for none; the region's after its size, 0 for none).
pub(super) fn allocate_peer_words(
    res: &RankRes,
    fabric: &dyn Fabric,
    low_latency: bool,
    host_flags: bool,
    arena: Option<Memory>,
    channel: bool,
) -> Result<(OwnWords, Record)> {
    let zeroed = |bytes: usize| -> Result<DeviceBuffer> {
        let mut buffer = fabric.exportable(&res.ctx, bytes)?;
        buffer.fill_zero()?;
        Ok(buffer)
    };
    let flags = match host_flags {
        // Pinned host memory comes zeroed.
        true => Owned::Host(fabric.exportable_host(&res.ctx, PEER_FLAG_BYTES)?),
        false => Owned::Device(zeroed(PEER_FLAG_BYTES)?),
    };
    let ll_recv = match low_latency {
        true => Some(zeroed(ll_recv_bytes(fabric.world()))?),
        false => None,
    };
    let mut record = Vec::new();
    let ll_exported = ll_recv.iter().map(|b| Exported::Device {
        addr: b.ptr(),
        bytes: b.len_bytes(),
    });
    for exported in std::iter::once(flags.exported()).chain(ll_exported) {
        let handle = fabric.export(res.rank, exported)?;
        record.push(handle.len() as u64);
        record.extend(handle);
    }
    // Memory too short for an arena is no error: no rank then uses one, and first calls meet.
    let arena = match arena {
        Some(Memory::Device) => fabric
            .exportable(&res.ctx, ARENA_BYTES)
            .ok()
            .map(Owned::Device),
        Some(Memory::Host) => fabric
            .exportable_host(&res.ctx, ARENA_BYTES)
            .ok()
            .map(Owned::Host),
        None => None,
    };
    record.push(u64::from(fabric.gate().is_some()));
    push_optional(
        &mut record,
        fabric,
        res.rank,
        arena.as_ref().map(Owned::exported),
    )?;
    // As for the arena: without one, sends and receives meet their peers (`channel_of`).
    let channel_region = match channel {
        true => zeroed(channel_bytes(fabric.world())).ok(),
        false => None,
    };
    let exported = channel_region.as_ref().map(|b| Exported::Device {
        addr: b.ptr(),
        bytes: b.len_bytes(),
    });
    push_optional(&mut record, fabric, res.rank, exported)?;
    Ok((
        OwnWords {
            flags,
            ll_recv,
            arena,
            channel_region,
        },
        record,
    ))
}

/// Pushes `memory`'s size and export handle (length first) onto `record`, or 0 for none.
fn push_optional(
    record: &mut Record,
    fabric: &dyn Fabric,
    rank: usize,
    memory: Option<Exported>,
) -> Result<()> {
    match memory {
        Some(exported @ (Exported::Device { bytes, .. } | Exported::Host { bytes, .. })) => {
            record.push(bytes as u64);
            let handle = fabric.export(rank, exported)?;
            record.push(handle.len() as u64);
            record.extend(handle);
        }
        None => record.push(0),
    }
    Ok(())
}

/// What [`push_optional`] pushed: the size (0 for none) and the handle.
fn take_optional<'a>(fields: &mut Fields<'a>) -> Result<(u64, Option<&'a [u64]>)> {
    let bytes = fields.word()?;
    let handle = match bytes {
        0 => None,
        _ => {
            let len = fields.word()? as usize;
            Some(fields.take(len)?)
        }
    };
    Ok((bytes, handle))
}

/// Every rank's memory of `optional` (by rank, [`take_optional`]'s) imported, where every rank
/// made one of `bytes`: only then does every rank use it (prepares alone what the others do, or
/// pushes into what each peer made).
fn import_every(
    fabric: &dyn Fabric,
    rank: usize,
    optional: &[(u64, Option<&[u64]>)],
    bytes: usize,
) -> Result<Option<Vec<u64>>> {
    if !optional.iter().all(|&(made, _)| made == bytes as u64) {
        return Ok(None);
    }
    optional
        .iter()
        .enumerate()
        .map(|(from, &(_, handle))| fabric.import(rank, from, handle.unwrap_or_default()))
        .collect::<Result<Vec<u64>>>()
        .map(Some)
}

/// A rank's own peer words between [`allocate_peer_words`] and [`connect_peer_words`].
pub(super) struct OwnWords {
    flags: Owned,
    ll_recv: Option<DeviceBuffer>,
    arena: Option<Owned>,
    channel_region: Option<DeviceBuffer>,
}

/// Phase 2: imports every rank's flags and receive buffers from `records` (phase 1's, by rank),
/// and their arenas where every rank made one, and registers the words with the gate. `identities` are every rank's GPU identity: ranks
/// that share a GPU (the test-only shared mode) run their kernels side by side on it, and a
/// block spinning for a partner block that has no SM would wait until the timeout — so the grid
/// cap is each GPU's SM count divided by the ranks on it (one block fits per SM), the smallest
/// over the GPUs, which keeps every block of every rank resident at once.
pub(super) fn connect_peer_words(
    res: &Arc<RankRes>,
    fabric: &dyn Fabric,
    own: OwnWords,
    records: &[Record],
    identities: &[Identity],
    timeout: Duration,
) -> Result<Arc<PeerWords>> {
    let OwnWords {
        flags,
        ll_recv,
        arena,
        channel_region,
    } = own;
    let mut flags_of = Vec::with_capacity(records.len());
    let mut ll_recv_of = Vec::with_capacity(records.len());
    let mut arenas = Vec::with_capacity(records.len());
    let mut regions = Vec::with_capacity(records.len());
    let mut gated_everywhere = true;
    for (from, record) in records.iter().enumerate() {
        let mut fields = Fields::new(from, record);
        let next = |fields: &mut Fields<'_>| -> Result<u64> {
            let len = fields.word()? as usize;
            fabric.import(res.rank, from, fields.take(len)?)
        };
        flags_of.push(next(&mut fields)?);
        if ll_recv.is_some() {
            ll_recv_of.push(next(&mut fields)?);
        }
        gated_everywhere &= fields.word()? == 1;
        arenas.push(take_optional(&mut fields)?);
        regions.push(take_optional(&mut fields)?);
        fields.finish()?;
    }
    // The arenas are used only where every rank made one of the same size: only then does every
    // rank prepare alone what the others do.
    let arena_of = import_every(fabric, res.rank, &arenas, ARENA_BYTES)?;
    // (Unused, this rank's own is freed now.)
    let arena = arena.filter(|_| arena_of.is_some());
    let channel_of = import_every(fabric, res.rank, &regions, channel_bytes(records.len()))?;
    let channel_region = channel_region.filter(|_| channel_of.is_some());
    let max_blocks = identities
        .iter()
        .map(|id| {
            let sharing = identities.iter().filter(|o| o.uuid == id.uuid).count() as u32;
            id.sm_count / sharing.max(1)
        })
        .min()
        .unwrap_or(1)
        .max(1);
    let words = Arc::new(PeerWords {
        ll_recv_of: ll_recv.is_some().then_some(ll_recv_of),
        _flags: flags,
        _ll_recv: ll_recv,
        _arena: arena,
        arena_of,
        _channel: channel_region,
        channel_of,
        gated_everywhere,
        flags_of,
        max_blocks,
        res: res.clone(),
        timeout,
        last_launch: std::sync::Mutex::new(None),
    });
    let weak: std::sync::Weak<dyn device::gate::InFlight> = Arc::downgrade(&words) as _;
    device::gate::register(weak);
    Ok(words)
}
