//! A shape's plan on the host, prepared once and reused ([`HostPlan`]): the checked plan, as the
//! host executor's options ask (`checked_host_plan`: the algorithm, the ring's chunk and slots,
//! proven through the plan cache's lemmas where they apply), the waiters of its events, its
//! events, zeroed host memory for its staging buffers ([`Scratch`]) and, where the pool can run
//! it, its phases (module `pool`).
//!
//! Invariant: staging memory lives as long as its plan, and a call in flight holds its plan, so
//! a plan evicted from the cache is freed only once no call can touch its staging.

use super::{pool, HostConfig, HostEvent, HostExecutor};
use crate::error::{Error, Result};
use crate::exec::algorithm::{select, Ask, Form, Ran, Reach};
use crate::exec::config::Transport;
use crate::exec::{Algorithm, PlanCache, Shape};
use crate::plan::{BufKind, Collective, Gather, Plan};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;
use std::sync::Arc;

/// Host memory for the plan's staging slots, zeroed, 64-byte aligned.
pub(super) struct Scratch {
    pub(super) ptr: NonNull<u8>,
    pub(super) layout: Layout,
}

// SAFETY: Scratch is a plain owned allocation; the executor hands out raw pointers into it only to
// operations the checker proved race-free, and frees it only when no call is running.
unsafe impl Send for Scratch {}
// SAFETY: as above; `&Scratch` only exposes the base address.
unsafe impl Sync for Scratch {}

impl Scratch {
    fn new(bytes: usize) -> Result<Scratch> {
        let layout = Layout::from_size_align(bytes.max(1), 64).map_err(|_| Error::Resource {
            what: format!("staging of {bytes} bytes is too large"),
        })?;
        // SAFETY: the layout has non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| Error::Resource {
            what: format!("cannot allocate {bytes} bytes of staging"),
        })?;
        Ok(Scratch { ptr, layout })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A checked plan with what running it needs, built once per shape and reused.
pub(super) struct HostPlan {
    pub(super) plan: Plan,
    /// The selection's algorithm, which the plan is of.
    pub(super) algorithm: Algorithm,
    pub(super) waiters: Vec<Vec<usize>>,
    pub(super) events: Vec<HostEvent>,
    /// One allocation per Slots / HostSlots / Exposed buffer, by buffer index.
    pub(super) scratch: Vec<Option<Scratch>>,
    /// Where the pool can run the plan: each rank's program cut at its barriers (module `pool`).
    pub(super) phases: Option<pool::Phases>,
}

impl HostExecutor {
    pub(super) fn prepare(&mut self, shape: Shape) -> Result<Arc<HostPlan>> {
        if let Some(p) = self.cache.get(&shape) {
            return Ok(p);
        }
        let (plan, algorithm) =
            checked_host_plan(&shape, self.world, &self.config, &mut self.cache)?;
        let scratch = plan
            .buffers
            .iter()
            .map(|decl| match decl.kind {
                BufKind::Slots
                | BufKind::HostSlots
                | BufKind::Exposed
                | BufKind::HostExposed
                | BufKind::Scratch => decl
                    .len
                    .checked_mul(shape.elem_bytes)
                    .ok_or(Error::Internal {
                        what: "staging size overflows".into(),
                    })
                    .and_then(Scratch::new)
                    .map(Some),
                _ => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        let prepared = Arc::new(HostPlan {
            algorithm,
            waiters: plan.remote_waiters(),
            events: plan.events.iter().map(|_| HostEvent::default()).collect(),
            scratch,
            phases: pool::phases(&plan),
            plan,
        });
        // A call in flight holds its plan (and the plan's staging) alive: evicting is safe.
        self.cache.insert(shape, prepared.clone());
        Ok(prepared)
    }
}

/// The checked plan of `shape` over `world` host ranks, as `config` asks (the algorithm, the
/// ring's chunk and slots), proven through `cache`'s lemmas where they apply, and the selected
/// algorithm it is of.
pub(super) fn checked_host_plan<P>(
    shape: &Shape,
    world: usize,
    config: &HostConfig,
    cache: &mut PlanCache<P>,
) -> Result<(Plan, Algorithm)> {
    let bytes = shape.count.saturating_mul(shape.elem_bytes);
    let transports = vec![config.transport.on_host(); world];
    let (chunk, slots) = (config.chunk_elems, config.slots);
    // Staged edges: the host runs the plans ranks without peer access would (the staged
    // one-shot reads only host copies; the ring moves chunks through host slots).
    let staged = config.transport == Transport::Staged;
    let reach = host_reach(config);
    let algorithm = select(&Ask {
        chosen: config.algorithm,
        collective: &shape.collective,
        count_bytes: bytes,
        world,
        in_place: shape.in_place,
        reach,
        deterministic: config.deterministic,
        ll_grid: None,
        gated: false,
    })
    .algorithm;
    // Every collective has a one-shot form and a ring form; the all-reduce also a staged
    // one-shot and a two-shot.
    let all_reduce = shape.collective == Collective::AllReduce;
    let plan = match (algorithm, staged) {
        (Algorithm::OneShot, true) if all_reduce => shape.checked_staged_oneshot_plan(world),
        (Algorithm::TwoShot, true) if all_reduce => Err(Error::InvalidArgument(
            "the two-shot reads its peers' buffers: it cannot run over staged edges (use the \
             ring, the one-shot or Auto)"
                .into(),
        )),
        (Algorithm::OneShot, _) => cache.checked_oneshot_plan(shape, world),
        (Algorithm::TwoShot, false) if all_reduce => {
            shape.checked_twoshot_plan(world, 1, Gather::Push)
        }
        _ => cache.checked_ring_plan(shape, chunk, slots, 1, transports),
    };
    plan.map(|plan| (plan, algorithm))
}

impl HostPlan {
    /// What a call of this plan ran, on ranks that reach each other through `reach`.
    pub(super) fn ran(&self, reach: Reach) -> Ran {
        Ran {
            algorithm: self.algorithm,
            form: Form::HostThreads,
            reach,
            in_place: self.plan.in_place,
            copied: false,
            registered: false,
            captured: false,
            pieces: 1,
        }
    }
}

/// How host ranks of `config` reach each other, for the selection.
pub(super) fn host_reach(config: &HostConfig) -> Reach {
    match config.transport == Transport::Staged {
        true => Reach::HostStaged,
        false => Reach::Host,
    }
}
