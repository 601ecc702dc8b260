//! The exposure region: the device memory that a rank's [`BufKind::Exposed`](crate::plan::BufKind::Exposed)
//! buffers of the in-place one-shot all-reduce plans prepared with the peers live in, one region
//! per rank (owned by its rank executor, exported to its peers with each plan), shared by all of
//! those plans.
//!
//! An in-place one-shot rank first copies its buffer into an exposed copy that its peers read,
//! since it overwrites its own buffer with the result while they may still be reading
//! ([`crate::plan`]'s module doc). If every plan owned its exposed buffers, each new message
//! size would allocate them on its first call (a `cuMemAlloc` per rank, which waits for the
//! device), and the plan cache could drop such a plan only after a device synchronisation, since
//! enqueued calls might still read them — a workload whose size changes on every call would pay
//! both on every call. With one region per rank that grows on demand, a new size allocates
//! nothing once the region is large enough, and the plan owns no GPU memory, so the cache drops
//! it without waiting.
//!
//! Why plans of different sizes may share a region: every eager call of a communicator runs on
//! each rank's Main stream, one after another (`callers` fences a caller's streams around Main);
//! replays of captured calls must be ordered with the communicator's other work anyway, since
//! all its peer kernels share the barrier words (`Communicator::enqueue_all_reduce_in_place_on`). Rank
//! r writes its region (the exposure copy, or the kernel's fused copy before its start barrier)
//! only after its previous one-shot kernel has completed, and that kernel completed only after
//! every peer reached its end barrier, which a peer's blocks reach after their reads of r's
//! region. So no peer still reads what r overwrites, whatever the sizes of the two calls — the
//! same argument that lets one plan reuse its buffers call after call. The checker's race check
//! over sequences of different plans models the exposed copies as this one region per rank
//! (`check::check_sequence`; `tests/plan_check.rs` runs it on random sequences of shapes).
//!
//! Across processes, a plan each rank prepares alone has its exposed copies in the arena instead
//! (`plan::arena`, made with the communicator): the region serves the plans prepared with the
//! peers.
//!
//! Invariant: memory handed out stays allocated until teardown. A region outgrown is retired,
//! not freed: enqueued calls and captured CUDA graphs may still read it. A region grows to the
//! next power of two at or above the need, so the retired ones of a rank together are smaller
//! than its current one (when that much cannot be allocated, to the need exactly).

use crate::device::DeviceBuffer;
use crate::error::Result;
use crate::exec::cuda::fabric::Fabric;
use cudarc::driver::CudaContext;

/// The smallest region: small in-place calls of any size up to it never grow the region.
const MIN_REGION_BYTES: usize = 1 << 20;

/// One rank's exposure region.
pub(super) struct Exposure {
    /// The size of the current region (0 before the first in-place one-shot).
    bytes: usize,
    /// The current region (`None` before the first in-place one-shot).
    current: Option<DeviceBuffer>,
    /// Regions outgrown, kept until teardown (module invariant).
    retired: Vec<DeviceBuffer>,
}

impl Exposure {
    pub(super) fn new() -> Exposure {
        Exposure {
            bytes: 0,
            current: None,
            retired: Vec::new(),
        }
    }

    /// Makes the region at least `bytes` long: a new region (the next power of two, at least
    /// [`MIN_REGION_BYTES`]; `bytes` exactly if that cannot be allocated) when the current one
    /// is shorter, the old one retired. On an allocation error nothing changes. Every rank
    /// reserves the same sizes in the same order, so every rank's regions grow alike.
    pub(super) fn reserve(
        &mut self,
        fabric: &dyn Fabric,
        ctx: &std::sync::Arc<CudaContext>,
        bytes: usize,
    ) -> Result<()> {
        if bytes <= self.bytes {
            return Ok(());
        }
        let allocate = |len: usize| fabric.exportable(ctx, len);
        let rounded = bytes.max(MIN_REGION_BYTES).next_power_of_two();
        let (grown, regions) = match allocate(rounded) {
            Ok(regions) => (rounded, regions),
            Err(_) if rounded > bytes => (bytes, allocate(bytes)?),
            Err(err) => return Err(err),
        };
        self.retired.extend(self.current.replace(regions));
        self.bytes = grown;
        Ok(())
    }

    /// The device address of the region; [`Exposure::reserve`] made it long enough (0 before
    /// any reservation).
    pub(super) fn address(&self) -> u64 {
        debug_assert!(self.current.is_some(), "reserve before address");
        self.current.as_ref().map_or(0, DeviceBuffer::ptr)
    }
}
