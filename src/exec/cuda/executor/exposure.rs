//! The exposure regions: the device memory that every in-place one-shot all-reduce plan's
//! [`BufKind::Exposed`](crate::plan::BufKind::Exposed) buffers live in, one region per rank,
//! shared by all of a communicator's plans.
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
//! Invariant: memory handed out stays allocated until teardown. A region outgrown is retired,
//! not freed: enqueued calls and captured CUDA graphs may still read it. A region grows to the
//! next power of two at or above the need, so the retired ones of a rank together are smaller
//! than its current one (when that much cannot be allocated, to the need exactly).

use super::RankRes;
use crate::device::DeviceBuffer;
use crate::error::Result;
use std::sync::Arc;

/// The smallest region: small in-place calls of any size up to it never grow the region.
const MIN_REGION_BYTES: usize = 1 << 20;

/// Every rank's exposure region.
pub(super) struct Exposure {
    /// The size of every rank's current region (0 before the first in-place one-shot).
    bytes: usize,
    /// The current region, by rank (empty before the first in-place one-shot).
    current: Vec<DeviceBuffer>,
    /// Regions outgrown, kept until teardown (module invariant).
    retired: Vec<DeviceBuffer>,
}

impl Exposure {
    pub(super) fn new() -> Exposure {
        Exposure {
            bytes: 0,
            current: Vec::new(),
            retired: Vec::new(),
        }
    }

    /// Makes every rank's region at least `bytes` long: a new region per rank (the next power
    /// of two, at least [`MIN_REGION_BYTES`]; `bytes` exactly if that cannot be allocated) when
    /// the current one is shorter, the old ones retired. On an allocation error nothing changes.
    pub(super) fn reserve(&mut self, ranks: &[Arc<RankRes>], bytes: usize) -> Result<()> {
        if bytes <= self.bytes {
            return Ok(());
        }
        let allocate = |len: usize| {
            ranks
                .iter()
                .map(|r| DeviceBuffer::new(&r.ctx, len))
                .collect::<Result<Vec<_>>>()
        };
        let rounded = bytes.max(MIN_REGION_BYTES).next_power_of_two();
        let (grown, regions) = match allocate(rounded) {
            Ok(regions) => (rounded, regions),
            Err(_) if rounded > bytes => (bytes, allocate(bytes)?),
            Err(err) => return Err(err),
        };
        self.retired
            .extend(std::mem::replace(&mut self.current, regions));
        self.bytes = grown;
        Ok(())
    }

    /// The device address of `rank`'s region; [`Exposure::reserve`] made it long enough.
    pub(super) fn address(&self, rank: usize) -> u64 {
        debug_assert!(rank < self.current.len(), "reserve before address");
        self.current[rank].ptr()
    }
}
