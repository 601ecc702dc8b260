//! Preparing a shape: its plan built and proven (or taken from the cache), its way of running
//! decided once ([`Dispatch`]: the kernel layouts verified against the plan, or the copy
//! engines), who enqueues it decided once ([`Schedule`]), and every rank's resources of it
//! allocated, exchanged through the fabric and imported (module `rank`) — or, for a kernel plan
//! across processes that fits the arenas, prepared by each rank alone (`prepare_alone`).
//!
//! Invariant: a prepared plan is checked before any rank allocates for it, and a call of a
//! shape prepared earlier allocates nothing.

use super::layout::{oneshot_layout, steps_layout, twoshot_segments};
use super::peer_words::{arena_memory, PeerKernel, ARENA_BYTES};
use super::pieces;
use super::rank::{Placed, Staged};
use super::{auto_chunk_bytes, CudaExecutor, Dispatch, Prepared, Schedule, CACHED_PLANS};
use crate::error::{Error, Result};
use crate::exec::algorithm::{select, Ask, Form, Selection};
use crate::exec::{Algorithm, Shape};
use crate::plan::{BufKind, Collective, EdgeTransport, Gather, Op, Plan};
use std::sync::Arc;

/// A shape's plan built, proven and given its way of running, before any rank allocates for it.
struct Built {
    plan: Arc<Plan>,
    algorithm: Algorithm,
    dispatch: Arc<Dispatch>,
    /// The caller's buffers staged (`CudaExecutor::stages_callers`, `Staged`).
    staged: Staged,
}

impl CudaExecutor {
    /// The prepared plan of `shape`: cached, or built, proven, given its way of running
    /// ([`Dispatch`]) and prepared on every rank now with the peers — each rank allocates its
    /// resources, the fabric all-gathers their records, each rank imports its peers'.
    pub(super) fn prepare(&mut self, shape: Shape) -> Result<Arc<Prepared>> {
        if let Some(p) = self.prepared(&shape) {
            return Ok(p);
        }
        let built = self.build_plan(&shape, self.selection_as(&shape, false))?;
        self.prepare_built(shape, built, None)
    }

    /// The prepared plan of `shape`, prepared by this rank alone — `None` where its first call
    /// meets the peers and [`CudaExecutor::prepare`] prepares it with them. Ranks in several
    /// processes whose calls are gated prepare alone a kernel plan whose owned buffers fit each
    /// rank's arena (module `plan::arena`): every rank's buffers are at offsets of the plan
    /// alone, in arenas exchanged at creation, so nothing is exchanged and the first call is
    /// gated like any later one.
    ///
    /// Decided alike on every rank, from what every rank has alike: the shape, the selection,
    /// the arenas (made by every rank, or used by none: `peer_words`) and the plan cache, which
    /// moves in step on every rank. A prepare that would push out a plan owning GPU memory is
    /// not done alone: that memory is freed only once the kernels in flight are done, which may
    /// wait for a late peer — the call meets instead. (A collective of no elements never comes
    /// here: `run` returns it at once; a send/recv of empty transfers alone runs its barriers.)
    pub(super) fn prepare_alone(&mut self, shape: &Shape) -> Result<Option<Arc<Prepared>>> {
        let selection = self.selection(shape);
        let kernel = selection.form.is_peer_kernel();
        let evicts_owner = self
            .ranks
            .iter()
            .any(|r| r.oldest_owns_gpu_resources(CACHED_PLANS));
        if !self.first_calls_alone() || !kernel || evicts_owner {
            return Ok(None);
        }
        let built = self.build_plan(shape, selection)?;
        if built.dispatch.peer_kernel().is_none() {
            return Ok(None);
        }
        let capacity = ARENA_BYTES / shape.elem_bytes;
        let memory = arena_memory(self.peers_ok);
        let Some(placed) = Placed::lay_out(&built.plan, &built.staged, capacity, memory)? else {
            return Ok(None);
        };
        self.prepare_built(shape.clone(), built, Some(placed))
            .map(Some)
    }

    /// Whether every rank made an arena (made by every rank, or used by none: `peer_words`).
    pub(super) fn arenas_everywhere(&self) -> bool {
        self.ranks
            .iter()
            .all(|r| r.peer.as_ref().is_some_and(|p| p.arena_of.is_some()))
    }

    /// `shape`'s plan of `selection`, built and proven, and its way of running.
    fn build_plan(&mut self, shape: &Shape, selection: Selection) -> Result<Built> {
        let n = self.world;
        let algorithm = selection.algorithm;
        // 16-byte boundaries keep every chunk and segment vector-aligned for the kernels and
        // copies.
        let align_elems = (16 / shape.elem_bytes).max(1);
        let chunk_elems = || {
            let chunk_bytes = self.config.chunk_bytes.unwrap_or_else(|| {
                let staged = self
                    .edges
                    .iter()
                    .any(|e| e.transport == EdgeTransport::Staged);
                auto_chunk_bytes(shape.chunking_count(n), n, shape.elem_bytes, staged)
            });
            (chunk_bytes / shape.elem_bytes).max(1)
        };
        // Every collective has a one-shot form and a ring form; the all-reduce also a staged
        // one-shot and a two-shot.
        let all_reduce = shape.collective == Collective::AllReduce;
        let plan = match algorithm {
            _ if all_reduce && selection.form == Form::StagedKernel => {
                shape.checked_staged_oneshot_plan(n)?
            }
            Algorithm::OneShot => self.cache.checked_oneshot_plan(shape, n)?,
            Algorithm::TwoShot if all_reduce => {
                shape.checked_twoshot_plan(n, align_elems, Gather::Pull)?
            }
            // The ring's form: a copy-engine plan (pushes, pairwise reduces, events).
            _ => {
                let (chunk, transports) = (chunk_elems(), self.edge_transports());
                self.cache.checked_ring_plan(
                    shape,
                    chunk,
                    self.config.slots,
                    align_elems,
                    transports,
                )?
            }
        };
        let dispatch = Arc::new(self.dispatch(&plan, selection)?);
        // A strided piece's kernel finds its blocks nowhere but in the copies (module `pieces`):
        // every caller's buffer is staged.
        let touched_only = dispatch.peer_kernel().is_some() && !pieces::strided(shape);
        let staged = match self.stages_callers(shape.registered, &dispatch) {
            true => Staged::for_plan(&plan, touched_only),
            false => Staged::NONE,
        };
        if !self.in_one_process() && dispatch.peer_kernel() != Some(PeerKernel::OneShotLl) {
            // Peers in other processes: every buffer this plan has a rank touch of another's
            // must be one its owner exports (`Staged::owns`) — or, registered, the caller's.
            // (The LL one-shot touches no buffer of the plan across ranks: `stages_callers`.)
            let registered = shape.registered;
            crate::check::check_exports(&plan, |kind| {
                staged.owns(kind) || registered && kind.is_callers()
            })?;
        }
        Ok(Built {
            plan: Arc::new(plan),
            algorithm,
            dispatch,
            staged,
        })
    }

    /// Prepares `built` on every rank of this process and caches it: with the peers (each
    /// rank's resources allocated, their records all-gathered, the peers' imported), or, where
    /// `placed`, alone — every rank's owned buffers in its arena, nothing allocated or exchanged.
    fn prepare_built(
        &mut self,
        shape: Shape,
        built: Built,
        placed: Option<Placed>,
    ) -> Result<Arc<Prepared>> {
        let n = self.world;
        let Built {
            plan,
            algorithm,
            dispatch,
            staged,
        } = built;
        let exposed_bytes = plan
            .buffers
            .iter()
            .filter(|decl| decl.kind == BufKind::Exposed)
            .map(|decl| decl.len * shape.elem_bytes)
            .max();
        if let (Some(bytes), None) = (exposed_bytes, &placed) {
            for r in &mut self.ranks {
                r.reserve_exposure(&*self.fabric, bytes)?;
            }
        }
        if self
            .ranks
            .iter()
            .any(|r| r.oldest_owns_gpu_resources(CACHED_PLANS))
        {
            // The oldest plan's events and buffers may still be in use by enqueued work. (A
            // plan without any — the one-shot all-reduce, whose in-place exposed copies live in
            // the exposure regions, or one prepared alone — is dropped without waiting.)
            self.drain()?;
        }
        let mut allocated = Vec::with_capacity(n);
        let mut records = Vec::with_capacity(n);
        for r in &self.ranks {
            if placed.is_some() {
                allocated.push(r.allocate_placed(&plan, &dispatch, &staged)?);
                continue;
            }
            let (part, record) = r.allocate(
                &*self.fabric,
                &plan,
                &dispatch,
                shape.elem_bytes,
                self.peers_ok,
                &staged,
            )?;
            allocated.push(part);
            records.push(record);
        }
        let records = match placed {
            Some(_) => vec![Vec::new(); n],
            None => self.fabric.all_gather(records)?,
        };
        let mut ranks = Vec::with_capacity(n);
        for (r, part) in self.ranks.iter_mut().zip(allocated) {
            ranks.push(r.connect(
                &self.fabric,
                shape.clone(),
                part,
                &records,
                CACHED_PLANS,
                placed.as_ref(),
            )?);
        }
        let crosses = ranks.iter().any(|r| r.counters.is_some());
        let schedule = match *dispatch {
            // This process's one rank: enqueued from the caller's thread.
            _ if self.ranks.len() == 1 => Schedule::RankByRank,
            Dispatch::CopyEngines if crosses && self.shared_gpu => {
                Schedule::Checked(crate::check::enqueue_order(&plan)?)
            }
            Dispatch::CopyEngines if crosses => Schedule::RankThreads,
            _ => Schedule::RankByRank,
        };
        self.prepared_plans += 1;
        let prepared = Arc::new(Prepared {
            plan,
            algorithm,
            dispatch,
            serial: self.prepared_plans % 0x8000,
            ranks,
            schedule,
            staged,
        });
        self.cache.insert(shape, prepared.clone());
        Ok(prepared)
    }

    /// What `shape` runs here ([`select`] with this communicator's facts), from the shape and
    /// the communicator alone — the same on every rank: above the one-shot's limits it depends
    /// on whether the calls are gated (`Ask::gated`), which counts only where every rank's
    /// process gates them (`PeerWords::gated_everywhere`).
    pub(super) fn selection(&self, shape: &Shape) -> Selection {
        self.selection_as(shape, true)
    }

    /// The selection of `shape` ([`select`]) for a call prepared alone, or (not `alone`) with
    /// the peers: over staged reach a plan prepared with the peers has its buffers allocated
    /// for it, in device memory its peers cannot reach, so it is selected ungated (its ring);
    /// prepared alone, its buffers lie in the host arenas. Where every GPU reaches every other,
    /// alike.
    fn selection_as(&self, shape: &Shape, alone: bool) -> Selection {
        let peer = self.ranks.first().and_then(|r| r.peer.as_ref());
        let arenas = self.peers_ok || alone && self.arenas_everywhere();
        select(&Ask {
            chosen: self.config.algorithm,
            collective: &shape.collective,
            count_bytes: shape.count.saturating_mul(shape.elem_bytes),
            world: self.world,
            in_place: shape.in_place,
            reach: self.reach(),
            deterministic: self.config.deterministic,
            ll_grid: self.ll_grid(),
            gated: arenas && peer.is_some_and(|p| p.gated_everywhere),
        })
    }

    /// How `plan` (of `selection`) runs here: the kernel layouts verified against the plan, or
    /// the copy engines — as the selection's form says; a plan without peer reduces (one rank's)
    /// runs on the copy engines whatever it says.
    fn dispatch(&self, plan: &Plan, selection: Selection) -> Result<Dispatch> {
        let meets = plan
            .ranks
            .iter()
            .flatten()
            .any(|i| matches!(i.op, Op::PeerReduce { .. }));
        if !meets {
            return Ok(Dispatch::CopyEngines);
        }
        let unexpected = || Error::Internal {
            what: format!("a plan of {selection:?} with peer reduces but no meetings"),
        };
        if self.ranks.first().and_then(|r| r.peer.as_ref()).is_none() {
            return Err(Error::Internal {
                what: "a plan with peer reduces on a communicator without peer kernels".into(),
            });
        }
        let oneshot = |kernel| -> Result<Dispatch> {
            oneshot_layout(plan)?;
            Ok(Dispatch::OneShot { kernel })
        };
        match selection.form {
            Form::TwoShotKernel => Ok(Dispatch::TwoShot {
                segments: twoshot_segments(plan)?.ok_or_else(unexpected)?,
            }),
            Form::StepsKernel => Ok(Dispatch::Steps {
                steps: steps_layout(plan)?.ok_or_else(unexpected)?,
            }),
            Form::OneShotKernel => oneshot(PeerKernel::OneShot),
            Form::LlKernel => oneshot(PeerKernel::OneShotLl),
            Form::StagedKernel => oneshot(PeerKernel::OneShotStaged),
            Form::CopyEngines | Form::HostThreads | Form::Channel => Err(Error::Internal {
                what: format!("a plan with peer reduces selected as {selection:?}"),
            }),
        }
    }

    /// The plan prepared for `shape` earlier, if any: cached, or pinned by a capture.
    pub(super) fn prepared(&self, shape: &Shape) -> Option<Arc<Prepared>> {
        self.cache.get(shape).or_else(|| {
            self.pinned
                .iter()
                .find(|(s, _)| s == shape)
                .map(|(_, p)| p.clone())
        })
    }

    /// Each ring edge's transport, by sending rank. One rank has no edge (`decide_edges` makes
    /// none); its plan still names one, which it never uses.
    fn edge_transports(&self) -> Vec<EdgeTransport> {
        if self.world == 1 {
            return vec![EdgeTransport::Peer];
        }
        self.edges.iter().map(|e| e.transport).collect()
    }
}
