//! One rank's executor: everything of one rank, and nothing of another's but the addresses its
//! peers exported to it through the fabric ([`crate::exec::cuda::fabric`]).
//!
//! A [`RankExecutor`] owns its rank's context, four streams (Main, Send, Recv, Reduce), kernels,
//! completion and fence events and error word ([`RankRes`]); the peer kernels' words it owns and
//! the ones its peers exported (`peer_words::PeerWords`); its exposure region; and, per prepared
//! message shape, a [`RankPlan`]: its own events, staging buffers and event counters, and the
//! address of every buffer of the plan it does not own but uses — its peers' staging slots and
//! exposed copies, their counters' mailboxes — imported from their records. It enqueues only its
//! own rank's program of a checked plan (`launch::enqueue_rank`).
//!
//! Preparing a shape is a collective step in two phases, so that it needs no thread per rank
//! in one process and no more than one all-gather between processes: [`RankExecutor::allocate`]
//! makes the rank's own resources and returns its record (its buffers' export handles); the
//! fabric all-gathers the records; [`RankExecutor::connect`] imports every peer's. A kernel plan
//! that each rank prepares alone (across processes, [`Placed`] in the arenas) skips the
//! exchange: [`RankExecutor::allocate_placed`] makes only its events, and `connect` finds every
//! rank's buffers at their offsets of their owners' arenas. Every rank prepares the same shapes
//! in the same order, so their caches move in step.
//!
//! Invariant: a `RankPlan` references only memory that outlives it — its own, or a peer's that
//! the peer keeps for as long as it keeps the same plan (every rank drops a plan only after its
//! streams are idle, in the same order).

use super::counters::Counters;
use super::exposure::Exposure;
use super::peer_words::PeerWords;
use super::Dispatch;
use crate::check::check_reach_placed;
use crate::device::{self, DeviceBuffer, Event, PinnedHost, Stream};
use crate::error::{Error, Result};
use crate::exec::cuda::fabric::{Exported, Fabric, Fields, Identity, Imports, Record};
use crate::exec::cuda::kernels::KernelModule;
use crate::exec::Shape;
use crate::plan::arena::arena_layout;
use crate::plan::{BufKind, Memory, Plan, StreamKind};
use cudarc::driver::{CudaContext, CudaStream};
use std::collections::VecDeque;
use std::sync::Arc;

/// A rank's GPU resources, made once per communicator.
pub(super) struct RankRes {
    pub(super) rank: usize,
    /// The ordinal of its GPU in this process (the caller's name for it).
    pub(super) device: usize,
    pub(super) ctx: Arc<CudaContext>,
    /// Indexed by `StreamKind::index()`.
    pub(super) streams: Vec<Stream>,
    pub(super) kernels: Arc<KernelModule>,
    /// Recorded on Main after each call that waits for its completion, polled to learn that the
    /// rank is done (`enqueue::record_done`).
    pub(super) done: Event,
    /// A call on a caller's stream: recorded there before the call, waited for by Main.
    pub(super) fence_in: Event,
    /// A call on a caller's stream: recorded on Main after the call, waited for there.
    pub(super) fence_out: Event,
    /// The word this rank's kernels leave a code in when they give up (a peer kernel's barrier,
    /// a counter wait): pinned host memory, mapped for the device, zeroed at creation, read by
    /// the host after calls (`CudaExecutor::check_error_words`).
    error: PinnedHost,
    /// A cudarc stream of `ctx`, never used: it puts this context handle in cudarc's multi-stream
    /// mode, the only mode in which cudarc records a slice's read and write events on a stream —
    /// so a cudarc slice's use by a collective is recorded on Main (`cudarc_buffers`).
    _tracking: Arc<CudaStream>,
}

impl RankRes {
    /// Rank `rank`'s resources on GPU `device`.
    fn new(rank: usize, device: usize) -> Result<RankRes> {
        let ctx = device::context(device)?;
        let streams = StreamKind::ALL
            .iter()
            .map(|_| Stream::new(&ctx))
            .collect::<Result<Vec<_>>>()?;
        let kernels = KernelModule::shared(&ctx)?;
        let done = Event::new(&ctx)?;
        let (fence_in, fence_out) = (Event::new(&ctx)?, Event::new(&ctx)?);
        let mut error = PinnedHost::new(&ctx, 4)?;
        error.as_mut_slice().fill(0);
        // The first cudarc stream of a context handle synchronizes the context once.
        let tracking = device::tracking_stream(&ctx)?;
        Ok(RankRes {
            rank,
            device,
            ctx,
            streams,
            kernels,
            done,
            fence_in,
            fence_out,
            error,
            _tracking: tracking,
        })
    }

    pub(super) fn stream(&self, kind: StreamKind) -> &Stream {
        &self.streams[kind.index()]
    }

    /// The code this rank's kernels left in its error word (0: none). Read through the host
    /// mapping; the kernels write it with a plain system-scope store.
    pub(super) fn error_code(&self) -> u32 {
        // SAFETY: the pinned allocation is at least 4 bytes and page-aligned, and lives as long
        // as `self`; a volatile read, since the GPU may write the word at any time.
        unsafe { std::ptr::read_volatile(self.error.as_ptr().cast::<u32>()) }
    }

    /// The error word as a device address (its host mapping).
    pub(super) fn error_word(&self) -> u64 {
        self.error.uva_ptr()
    }

    /// Gives this rank's call up from the host: leaves `code` in its error word unless a code
    /// is there already, so that every spinning wait of its kernels stops within microseconds
    /// (`rr_give_up` in `cuda/peer.cuh`).
    pub(super) fn give_up(&self, code: u32) {
        if self.error_code() == 0 {
            // SAFETY: the pinned allocation is at least 4 bytes, page-aligned and ours for as
            // long as `self`; it is never borrowed as a Rust reference, only read and written
            // through raw pointers (volatile: the GPU reads it at any time). A kernel's write
            // racing this one leaves one code or the other, either of which fails the call.
            unsafe { std::ptr::write_volatile(self.error.as_ptr().cast::<u32>().cast_mut(), code) }
        }
    }
}

/// Memory a rank owns and exports to its peers: a plan's staging (device slots and scratch, host
/// slots and host copies), and the peer kernels' flag words (device memory, or pinned host
/// memory where the GPUs do not reach each other: `peer_words::allocate_peer_words`).
pub(super) enum Owned {
    Device(DeviceBuffer),
    Host(PinnedHost),
}

impl Owned {
    /// The memory as a peer imports it.
    pub(super) fn exported(&self) -> Exported {
        match self {
            Owned::Device(b) => Exported::Device {
                addr: b.ptr(),
                bytes: b.len_bytes(),
            },
            Owned::Host(h) => Exported::Host {
                addr: h.uva_ptr(),
                bytes: h.len_bytes(),
            },
        }
    }
}

/// A checked plan's resources on one rank.
pub(super) struct RankPlan {
    pub(super) plan: Arc<Plan>,
    /// How the plan runs (the same on every rank: decided once, from the plan).
    pub(super) dispatch: Arc<Dispatch>,
    /// This rank's events of the plan (the ones it records), by event; `None` for other ranks'.
    pub(super) events: Vec<Option<Event>>,
    /// This rank's staging, kept alive for the plan's life (reached through `addrs`).
    _staging: Vec<Owned>,
    /// This rank's event counters, where events cross ranks (`Dispatch::CopyEngines`).
    pub(super) counters: Option<Counters>,
    /// The base address of every buffer of the plan that the ranks own (staging, exposed
    /// copies), as this rank reaches it — its own, or a peer's as imported; 0 for the caller's
    /// buffers, whose addresses come with each call.
    pub(super) addrs: Vec<u64>,
    /// What this rank imported from its peers for the plan (released when it leaves the cache).
    imports: Imports,
}

impl RankPlan {
    /// Whether dropping the plan frees or unmaps anything the GPU may still use: its own
    /// staging and counters, or peers' memory it imported. Not its events: CUDA releases an
    /// event destroyed before it completes once it has (`cuEventDestroy`), and waits already
    /// queued keep what they saw — so a plan laid out in the arenas, which owns only events,
    /// leaves the cache without waiting for anything.
    fn owns_gpu_resources(&self) -> bool {
        !self._staging.is_empty() || self.counters.is_some() || !self.imports.is_empty()
    }
}

/// A rank's part of a plan between [`RankExecutor::allocate`] and [`RankExecutor::connect`].
pub(super) struct Allocated {
    plan: Arc<Plan>,
    dispatch: Arc<Dispatch>,
    events: Vec<Option<Event>>,
    staging: Vec<Owned>,
    counters: Option<Counters>,
    staged: Staged,
}

/// The caller's buffers a plan's ranks stage — copy into memory of their own before the call
/// (and back after it, if written), since ranks in other processes cannot reach the caller's:
/// of a peer kernel's plan, the caller's kinds some rank touches of another's
/// (`check::touched_across_ranks`); a buffer only its own rank touches (a one-shot's output, an
/// all-gather's, a receive) is not staged — its kernel reads or writes the caller's buffer
/// where it lies. Of any other plan, and of a strided piece (module `pieces`), every caller's
/// buffer ([`Staged::for_plan`]). [`Staged::NONE`] where nothing is (ranks in one process,
/// registered buffers, the LL one-shot).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Staged(Vec<BufKind>);

impl Staged {
    pub(super) const NONE: Staged = Staged(Vec::new());

    /// The caller's buffers `plan` stages: where `touched_only` (a peer kernel's plan), those
    /// some rank touches of another's; else (the copy engines' plans, a strided piece's — module
    /// `pieces` — or where GPUs do not reach each other, through host slots) every one.
    ///
    /// Why that is exact where a caller passes overlapping buffers out of place (NCCL's in-place
    /// forms, which ringreduce-nccl runs out of place): a peer kernel reads every input it
    /// reads — its own rank's too — from the staged copy its peers read, and writes unstaged
    /// memory only where no peer reads; the copy engines' plans read and write the caller's
    /// buffers in rounds, so they keep every buffer staged.
    pub(super) fn for_plan(plan: &Plan, touched_only: bool) -> Staged {
        let through_host = plan.buffers.iter().any(|d| d.kind == BufKind::HostSlots);
        let candidates = match touched_only && !through_host {
            true => crate::check::touched_across_ranks(plan),
            false => plan.buffers.iter().map(|d| d.kind).collect(),
        };
        let mut kinds = Vec::new();
        for kind in candidates {
            if kind.is_callers() && !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        Staged(kinds)
    }

    /// Whether any caller's buffer is staged.
    pub(super) fn any(&self) -> bool {
        !self.0.is_empty()
    }

    /// Whether a plan's ranks own their buffers of `kind`: their staging and exposed copies,
    /// and the caller's buffers they stage. The rest are the caller's, by address. What a rank
    /// owns it exports to its peers (`check::check_exports` proves a plan needs no more).
    pub(super) fn owns(&self, kind: BufKind) -> bool {
        matches!(
            kind,
            BufKind::Slots
                | BufKind::Scratch
                | BufKind::HostSlots
                | BufKind::HostExposed
                | BufKind::Exposed
        ) || self.0.contains(&kind)
    }
}

/// Where a plan prepared alone has every rank's owned buffers: at these offsets (in elements of
/// the shape's type, by buffer: `plan::arena::arena_layout`) of their owners' arenas (as each
/// rank reaches them: `peer_words::PeerWords::arena_of`).
pub(super) struct Placed(pub(super) Vec<Option<usize>>);

impl Placed {
    /// Where `plan`'s buffers that a rank owns (`staged.owns`) lie in arenas of `memory` and
    /// `capacity` elements (`plan::arena::arena_layout`); `None` where they do not fit. In
    /// arenas of host memory (GPUs that do not all reach each other) the plan is also proven to
    /// touch no peer's device memory: every buffer a peer touches is owned, so placed there, or
    /// host memory by kind (`check::check_reach_placed`) — an internal error otherwise.
    pub(super) fn lay_out(
        plan: &Plan,
        staged: &Staged,
        capacity: usize,
        memory: Memory,
    ) -> Result<Option<Placed>> {
        let owns = |k| staged.owns(k);
        let Some(offsets) = arena_layout(plan, owns, capacity, memory) else {
            return Ok(None);
        };
        if memory == Memory::Host {
            check_reach_placed(plan, owns).map_err(|e| Error::Internal {
                what: format!("a plan laid out in host arenas: {e}"),
            })?;
        }
        Ok(Some(Placed(offsets)))
    }
}

/// A rank's prepared plans by shape, oldest first, moved in step with every other rank's.
struct RankPlans {
    entries: VecDeque<(Shape, Arc<RankPlan>)>,
    /// Plans captured into CUDA graphs, kept for the communicator's life.
    pinned: Vec<(Shape, Arc<RankPlan>)>,
}

/// One rank's executor (module doc).
pub(super) struct RankExecutor {
    pub(super) res: Arc<RankRes>,
    pub(super) identity: Identity,
    /// The peer kernels' words, where they can run (set up after creation, collectively).
    pub(super) peer: Option<Arc<PeerWords>>,
    exposure: Exposure,
    plans: RankPlans,
}

impl RankExecutor {
    /// Rank `rank` on this process's GPU `device`: its context, streams, kernels, events and
    /// error word. Its record for the creation all-gather is its [`Identity`].
    pub(super) fn new(rank: usize, device: usize) -> Result<RankExecutor> {
        Ok(RankExecutor {
            res: Arc::new(RankRes::new(rank, device)?),
            identity: Identity::of(device)?,
            peer: None,
            exposure: Exposure::new(),
            plans: RankPlans {
                entries: VecDeque::new(),
                pinned: Vec::new(),
            },
        })
    }

    pub(super) fn rank(&self) -> usize {
        self.res.rank
    }

    /// Makes this rank's exposure region at least `bytes` long (module `exposure`).
    pub(super) fn reserve_exposure(&mut self, fabric: &dyn Fabric, bytes: usize) -> Result<()> {
        self.exposure.reserve(fabric, &self.res.ctx, bytes)
    }

    /// Phase 1 of preparing `plan`: this rank's events, staging and counters (mailboxes in
    /// device memory when `peer_access` holds between every pair of GPUs), and its record — for
    /// every buffer of the plan it owns, in buffer order, the export handle (length first), then
    /// its counters' entry.
    pub(super) fn allocate(
        &self,
        fabric: &dyn Fabric,
        plan: &Arc<Plan>,
        dispatch: &Arc<Dispatch>,
        elem_bytes: usize,
        peer_access: bool,
        staged: &Staged,
    ) -> Result<(Allocated, Record)> {
        let rank = self.rank();
        let res = &self.res;
        let events = self.events(plan)?;
        let mut staging = Vec::new();
        let mut record = Vec::new();
        for decl in plan
            .buffers
            .iter()
            .filter(|d| d.rank == rank && staged.owns(d.kind))
        {
            let bytes = (decl.len * elem_bytes).max(1);
            let exported = match decl.kind {
                BufKind::Exposed => Exported::Device {
                    addr: self.exposure.address(),
                    bytes,
                },
                kind => {
                    let own = match kind {
                        BufKind::HostSlots | BufKind::HostExposed => {
                            Owned::Host(fabric.exportable_host(&res.ctx, bytes)?)
                        }
                        _ => Owned::Device(fabric.exportable(&res.ctx, bytes)?),
                    };
                    let exported = own.exported();
                    staging.push(own);
                    exported
                }
            };
            let handle = fabric.export(rank, exported)?;
            record.push(handle.len() as u64);
            record.extend(handle);
        }
        let counters = match **dispatch {
            Dispatch::CopyEngines => match Counters::allocate(res, fabric, plan, peer_access)? {
                Some((counters, entry)) => {
                    record.extend(entry);
                    Some(counters)
                }
                None => None,
            },
            _ => None,
        };
        let allocated = Allocated {
            plan: plan.clone(),
            dispatch: dispatch.clone(),
            events,
            staging,
            counters,
            staged: staged.clone(),
        };
        Ok((allocated, record))
    }

    /// Phase 1 of preparing a kernel plan placed in the arenas (prepared alone: [`Placed`]):
    /// only its events — its buffers lie in the arenas, and a kernel plan has no counters.
    pub(super) fn allocate_placed(
        &self,
        plan: &Arc<Plan>,
        dispatch: &Arc<Dispatch>,
        staged: &Staged,
    ) -> Result<Allocated> {
        Ok(Allocated {
            plan: plan.clone(),
            dispatch: dispatch.clone(),
            events: self.events(plan)?,
            staging: Vec::new(),
            counters: None,
            staged: staged.clone(),
        })
    }

    /// This rank's events of `plan` (the ones it records), by event.
    fn events(&self, plan: &Plan) -> Result<Vec<Option<Event>>> {
        plan.events
            .iter()
            .map(|decl| match decl.rank == self.rank() {
                true => Event::new(&self.res.ctx).map(Some),
                false => Ok(None),
            })
            .collect()
    }

    /// Phase 2 of preparing a plan for `shape`: imports every rank's buffers and mailboxes from
    /// `records` (every rank's record from phase 1, by rank) — or, `placed`, finds every
    /// rank's buffers in its arena, importing nothing — and keeps the plan, pushing out the
    /// oldest beyond `capacity` (the caller waited for idle streams first if that one owns GPU
    /// resources: [`RankExecutor::oldest_owns_gpu_resources`]).
    pub(super) fn connect(
        &mut self,
        fabric: &Arc<dyn Fabric>,
        shape: Shape,
        allocated: Allocated,
        records: &[Record],
        capacity: usize,
        placed: Option<&Placed>,
    ) -> Result<Arc<RankPlan>> {
        let rank = self.rank();
        let Allocated {
            plan,
            dispatch,
            events,
            staging,
            mut counters,
            staged,
        } = allocated;
        let mut fields: Vec<Fields<'_>> = records
            .iter()
            .enumerate()
            .map(|(from, r)| Fields::new(from, r))
            .collect();
        let imports = Imports::new(fabric.clone());
        let mut addrs = vec![0u64; plan.buffers.len()];
        let imported = (|| {
            for (buf, decl) in plan.buffers.iter().enumerate() {
                if !staged.owns(decl.kind) {
                    continue;
                }
                addrs[buf] = match placed {
                    Some(placed) => {
                        let arena = self.peer.as_ref().and_then(|p| p.arena_of.as_ref());
                        let offset = placed.0.get(buf).copied().flatten();
                        match (arena, offset) {
                            (Some(arena), Some(offset)) => {
                                arena[decl.rank] + (offset * shape.elem_bytes) as u64
                            }
                            _ => {
                                return Err(crate::error::Error::Internal {
                                    what: format!(
                                        "buffer {buf} of a plan placed alone has no arena"
                                    ),
                                })
                            }
                        }
                    }
                    None => {
                        let f = &mut fields[decl.rank];
                        let len = f.word()? as usize;
                        imports.import(rank, decl.rank, f.take(len)?)?
                    }
                };
            }
            if let Some(counters) = &mut counters {
                counters.connect(&self.res, &imports, &mut fields)?;
            }
            fields.into_iter().try_for_each(Fields::finish)
        })();
        if let Err(e) = imported {
            // SAFETY: the plan never ran, so nothing queued uses what it imported so far.
            let _ = unsafe { imports.release_all() };
            return Err(e);
        }
        let prepared = Arc::new(RankPlan {
            plan,
            dispatch,
            events,
            _staging: staging,
            counters,
            addrs,
            imports,
        });
        let RankPlans { entries, pinned } = &mut self.plans;
        if entries.len() >= capacity.max(1) {
            if let Some((_, old)) = entries.pop_front() {
                // Its peers' memory is unmapped here once no kept plan imported it too: the
                // caller synchronised the streams first when the plan owns GPU resources
                // (`oldest_owns_gpu_resources`); a plan pinned for a graph keeps its imports.
                let kept = pinned.iter().any(|(_, p)| Arc::ptr_eq(p, &old));
                if old.owns_gpu_resources() && !kept {
                    // SAFETY: the streams were synchronised, and no kept plan is this one.
                    unsafe { old.imports.release_all() }?;
                }
            }
        }
        entries.push_back((shape, prepared.clone()));
        Ok(prepared)
    }

    /// Whether the plan the next `connect` pushes out of a cache of `capacity` owns GPU
    /// resources (the caller waits for idle streams before preparing then).
    pub(super) fn oldest_owns_gpu_resources(&self, capacity: usize) -> bool {
        let entries = &self.plans.entries;
        entries.len() >= capacity.max(1)
            && entries.front().is_some_and(|(_, p)| p.owns_gpu_resources())
    }

    /// Keeps the plan of `shape` for this rank's life (a CUDA graph holds its memory).
    pub(super) fn pin(&mut self, shape: &Shape) {
        let RankPlans { entries, pinned } = &mut self.plans;
        if pinned.iter().any(|(s, _)| s == shape) {
            return;
        }
        if let Some((s, p)) = entries.iter().find(|(s, _)| s == shape) {
            pinned.push((s.clone(), p.clone()));
        }
    }

    /// Drops every plan, the peer words and the exposure region — or, when `leak`, forgets them
    /// (a stream still busy may touch them: module `teardown`).
    pub(super) fn release(&mut self, leak: bool) {
        let entries = std::mem::take(&mut self.plans.entries);
        let pinned = std::mem::take(&mut self.plans.pinned);
        let exposure = std::mem::replace(&mut self.exposure, Exposure::new());
        let peer = self.peer.take();
        if leak {
            std::mem::forget((entries, pinned, exposure, peer));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::peer_words::ARENA_BYTES;
    use super::{Placed, Staged};
    use crate::check::check;
    use crate::element::ReduceOp;
    use crate::plan::sendrecv::oneshot_count;
    use crate::plan::{Collective, Memory, OneShotSpec, Plan, Transfer};

    /// Whether `plan`, its buffers staged as `staged` says, is laid out in host arenas (what
    /// `prepare_alone` does where GPUs do not all reach each other): it fits, and touches no
    /// peer's device memory.
    fn in_host_arenas(plan: &Plan, staged: &Staged) -> bool {
        let capacity = ARENA_BYTES / 4;
        matches!(
            Placed::lay_out(plan, staged, capacity, Memory::Host),
            Ok(Some(_))
        )
    }

    /// Every kernel plan a rank prepares alone over staged reach — every collective's one-shot
    /// form (send/recv lists with idle ranks too), whole or as a strided piece, and the staged
    /// all-reduce — touches only memory in its peers' host arenas once staged as `Staged` says;
    /// with nothing staged (registered buffers, refused there) a plan whose peers touch a
    /// caller's buffer reads their GPUs.
    #[test]
    fn kernel_plans_prepared_alone_reach_peers_only_in_their_host_arenas() {
        let op = ReduceOp::Sum;
        let p2p = |list: &[(usize, usize, usize)]| -> Vec<Transfer> {
            let to = |&(from, to, count)| Transfer { from, to, count };
            list.iter().map(to).collect()
        };
        for world in 2..=8 {
            let last = world - 1;
            let mut collectives = vec![
                Collective::AllReduce,
                Collective::AllGather,
                Collective::ReduceScatter,
                Collective::AllToAll,
                Collective::Broadcast { root: last },
                Collective::Reduce { root: last },
            ];
            for list in [
                p2p(&[(0, 1, 1000), (1, 0, 7)]),
                p2p(&[(last, 0, 1000)]),
                p2p(&[(0, last, 5), (0, last, 9), (last, 0, 1)]),
            ] {
                collectives.push(Collective::SendRecv { transfers: list });
            }
            let fixed = collectives.len();
            // And lists drawn at random: any pairs (a rank to itself too), empty transfers,
            // ranks that take no part.
            let mut seed = world as u64;
            let mut draw = |below: usize| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (seed >> 33) as usize % below
            };
            for _ in 0..20 {
                let list: Vec<_> = (0..1 + draw(8))
                    .map(|_| (draw(world), draw(world), draw(3) * draw(40)))
                    .collect();
                if list.iter().any(|t| t.2 > 0) {
                    collectives.push(Collective::SendRecv {
                        transfers: p2p(&list),
                    });
                }
            }
            for (index, c) in collectives.iter().enumerate() {
                for in_place in [false, true] {
                    let count = match c {
                        Collective::SendRecv { transfers } => oneshot_count(transfers).unwrap(),
                        _ => 1000,
                    };
                    let spec = OneShotSpec {
                        world,
                        count,
                        in_place,
                        op,
                    };
                    let Ok(plan) = spec.build_collective(c) else {
                        continue;
                    };
                    check(&plan).unwrap();
                    let at = format!("{c:?} on {world} ranks, in place {in_place}");
                    let touched = Staged::for_plan(&plan, true);
                    assert!(in_host_arenas(&plan, &touched), "{at}");
                    assert!(
                        in_host_arenas(&plan, &Staged::for_plan(&plan, false)),
                        "{at}"
                    );
                    // Where the peers touch a caller's buffer, only its staged copy is reachable
                    // (a drawn list's may be one of no elements, which touches nothing).
                    let unstaged = in_host_arenas(&plan, &Staged::NONE);
                    assert!(touched.any() || unstaged, "{at}");
                    assert!(index >= fixed || unstaged != touched.any(), "{at}");
                    if *c == Collective::AllReduce {
                        let plan = spec.build_staged().unwrap();
                        assert!(
                            in_host_arenas(&plan, &Staged::for_plan(&plan, true)),
                            "{at}"
                        );
                        assert!(in_host_arenas(&plan, &Staged::NONE), "{at}");
                    }
                }
            }
        }
    }
}
