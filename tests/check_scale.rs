//! The checker at the sizes real users send: `check()` runs on every new message shape at full
//! size, so it must cost the number of instructions, not the number of elements. A 1 GiB `f32`
//! all-reduce on 2 ranks, element by element, would hold 4 buffers × 2^28 elements × 32 bytes =
//! 32 GiB of symbolic memory; 8 ranks at 4 GiB each, far more. Here a counting allocator measures
//! the peak the check adds and holds it to a few MiB (nothing is timed).

use ringreduce::check::check;
use ringreduce::exec::cuda::auto_chunk_bytes;
use ringreduce::plan::{
    Collective, CollectiveSpec, EdgeTransport, Gather, OneShotSpec, Plan, RingSpec, TwoShotSpec,
};
use ringreduce::ReduceOp;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, counting the bytes live and the most ever live.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to `System`, which upholds the `GlobalAlloc`
// contract; the counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: our caller's contract for `alloc` (non-zero size) is passed on as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this `layout` (our `alloc` above).
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Checks `plan` and returns the most memory the check had live beyond what was live before.
fn check_peak_bytes(plan: &Plan) -> usize {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    check(plan).unwrap_or_else(|e| panic!("a correct plan was rejected: {e}"));
    PEAK.load(Ordering::Relaxed) - before
}

/// A ring spec as the GPU executor builds it for `f32` over peer edges: its automatic chunk,
/// 3 slots, 16-byte alignment.
fn gpu_ring(world: usize, count: usize, in_place: bool) -> RingSpec {
    let chunk_bytes = auto_chunk_bytes(count, world, 4, false);
    RingSpec {
        world,
        count,
        in_place,
        op: ReduceOp::Avg,
        chunk_elems: chunk_bytes / 4,
        slots: 3,
        align_elems: 4,
        transports: vec![EdgeTransport::Peer; world],
    }
}

/// Generous: the plans themselves are a few hundred KiB; per element would be tens of GiB.
const LIMIT_BYTES: usize = 64 << 20;

// One test, so that no other test's allocations run concurrently with the measurement.
#[test]
fn one_gib_and_larger_plans_check_without_per_element_memory() {
    let mut cases: Vec<(String, Plan)> = Vec::new();
    for in_place in [false, true] {
        // 1 GiB of f32 on 2 ranks: 32 M-element (128 MiB) chunks, as the executor chooses.
        let spec = gpu_ring(2, 1 << 28, in_place);
        assert_eq!(spec.chunk_elems, 32 << 20);
        cases.push((format!("{spec:?}"), spec.build().unwrap()));
        // 4 GiB of f32 on 8 ranks (512 MiB segments: 128 MiB chunks).
        let spec = gpu_ring(8, 1 << 30, in_place);
        assert_eq!(spec.chunk_elems, 32 << 20);
        cases.push((format!("{spec:?}"), spec.build().unwrap()));
        // A small chunk, so that the check walks many chunks of a large message.
        let mut spec = gpu_ring(2, 1 << 28, in_place);
        spec.chunk_elems = 1 << 20;
        cases.push((format!("{spec:?}"), spec.build().unwrap()));
        for world in [2, 8] {
            let spec = OneShotSpec {
                world,
                count: 1 << 28,
                in_place,
                op: ReduceOp::Avg,
            };
            cases.push((format!("{spec:?}"), spec.build().unwrap()));
            for gather in [Gather::Pull, Gather::Push] {
                let spec = TwoShotSpec {
                    world,
                    count: 1 << 28,
                    in_place,
                    op: ReduceOp::Avg,
                    align: 4,
                    gather,
                };
                cases.push((format!("{spec:?}"), spec.build().unwrap()));
            }
        }
    }
    // Every other collective at 4 GiB of f32 per world·count buffer on 8 ranks, and at 1 GiB
    // with small chunks (many of them per block).
    for in_place in [false, true] {
        for (count, chunk_elems) in [(1 << 27, 32 << 20), (1 << 25, 1 << 20)] {
            for c in [
                Collective::ReduceScatter,
                Collective::AllGather,
                Collective::Broadcast { root: 3 },
                Collective::Reduce { root: 5 },
                Collective::AllToAll,
            ] {
                if in_place && !c.has_in_place() {
                    continue;
                }
                let mut ring = gpu_ring(8, count, in_place);
                ring.chunk_elems = chunk_elems;
                if !c.reduces() {
                    ring.op = ReduceOp::Sum;
                }
                let spec = CollectiveSpec {
                    collective: c,
                    ring,
                };
                cases.push((
                    format!("{:?} {spec:?}", spec.collective),
                    spec.build().unwrap(),
                ));
            }
        }
    }
    for (name, plan) in &cases {
        let peak = check_peak_bytes(plan);
        println!("{name}: {} instructions, check peak {peak} B", plan.len());
        assert!(
            peak < LIMIT_BYTES,
            "{name}: the check allocated {peak} bytes at its peak"
        );
    }
}
