//! The GPU executor: the same plans as the host executor, enqueued on CUDA streams by one host
//! thread per GPU (the ring) or by the caller's thread (the one-shot).
//!
//! At creation the communicator binds each rank to a GPU, decides how each ring edge moves data
//! ([`Transport`]: peer copies where `cuDeviceCanAccessPeer` allows and peer access could be
//! enabled, pinned-host staging elsewhere, or forced either way), and creates for every rank its
//! context, four non-blocking streams (Main, Send, Recv, Reduce) and its kernels. Per message
//! shape it then builds a plan, checks it, and creates that plan's events and staging buffers —
//! once; later calls of the same shape reuse them. Inside a collective the rank threads only
//! enqueue: no allocation, no event creation, no host synchronisation until the optional final
//! wait for completion.
//!
//! Peer edges push: the sender's copy engine writes into the receiver's staging slot
//! (`cuMemcpyPeerAsync` on the sender's Send stream), the receiver's Reduce stream folds it in with
//! a kernel. Push measured 15–30% faster than pull on the 2×H200 test machine. Staged edges copy
//! device→pinned host on the sender's Send stream and host→device on the receiver's Recv stream
//! (two PCIe directions busy at once), with events between.
//!
//! The one-shot (plans without events: one kernel per rank that meets the others at flag
//! barriers) skips the rank threads: the caller's thread binds each rank's context in turn,
//! launches, and puts its own context back. The kernels meet on the GPUs whenever each starts.
//!
//! A failed enqueue never leaves a GPU waiting forever. For the ring: a CUDA wait binds, when it
//! is enqueued, to the event's latest record, and a record that was never enqueued leaves nothing
//! to wait for. For the one-shot: a kernel whose peers never arrive gives up after three quarters
//! of the call's timeout and leaves a code in its error word, which the call (or the next one, or
//! `synchronize`) turns into [`Error::Timeout`]; a call that fails after launching some ranks
//! waits for their kernels to give up before it returns, so no kernel of it still reads the
//! caller's buffers. A kernel that gives up at its start barrier also withdraws its signal, so
//! that a peer's kernel starting later (queued behind work that was stuck) times out too instead
//! of reading this rank's input after the call has returned its error. (A peer that passed the
//! barrier in the instant before the withdrawal still reads; it is then inside the call's
//! deadline, a quarter of the timeout before the call returns.)
//!
//! Teardown never hangs on a stuck GPU: `synchronize`, `close` and `abort` wait at most the
//! timeout; a GPU still busy then keeps this communicator's streams, events and buffers — leaked
//! on purpose, since freeing memory that stuck work may yet touch would be worse.

use super::kernels::{Kernels, OneShotArgs, TwoShotArgs, ONESHOT_FLAG_BYTES, ONESHOT_MAX_RANKS};
use super::probe::{self, Probe};
use crate::device::{self, DeviceBuffer, Event, PinnedHost, Stream};
use crate::element::{DType, Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::{
    enqueue_rank, panic_message, Algorithm, Enqueue, Handoff, Limits, PlanCache, Shape,
};
use crate::plan::{BufKind, EdgeTransport, Instr, Op, Plan, Ranks, Region, StreamKind, Tag};
use crate::topo::{self, Link};
use crossbeam_channel::{Receiver, Sender};
use cudarc::driver::CudaContext;
use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How the ring's edges move data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Transport {
    /// Peer copies where the GPUs can reach each other, pinned-host staging elsewhere.
    #[default]
    Auto,
    /// Peer copies on every edge; an edge without peer access is an error.
    Peer,
    /// Pinned-host staging on every edge (for tests, benchmarks and teaching).
    Staged,
}

/// Options of the GPU communicator.
#[derive(Clone, Debug, PartialEq)]
pub struct CudaConfig {
    pub transport: Transport,
    /// Staging slots per receiver.
    pub slots: usize,
    /// Chunk size in bytes; `None` grows it with the message (see [`auto_chunk_bytes`]).
    pub chunk_bytes: Option<usize>,
    /// How long a collective may take before it fails with [`Error::Timeout`].
    pub timeout: Duration,
    /// Let several ranks share one GPU (each rank still has its own streams, staging and thread).
    /// For testing the whole GPU path on a one-GPU machine; off by default, where a repeated
    /// device is [`Error::DuplicateDevice`].
    pub allow_shared_device: bool,
    /// Time one copy over each edge at creation and flag edges far below their link
    /// ([`EdgeInfo::slow`], module [`probe`](super::probe)). On by default; costs milliseconds.
    pub probe_edges: bool,
    /// Ring, one-shot, or chosen by message size ([`Algorithm::choose`]). The one-shot needs
    /// peer access between every pair of GPUs and at most 8 ranks; `Auto` falls back to the ring
    /// where it cannot run, `OneShot` is then an error at creation.
    pub algorithm: Algorithm,
}

impl Default for CudaConfig {
    fn default() -> Self {
        CudaConfig {
            transport: Transport::Auto,
            slots: 3,
            chunk_bytes: None,
            timeout: Duration::from_secs(60),
            allow_shared_device: false,
            probe_edges: true,
            algorithm: Algorithm::Auto,
        }
    }
}

/// The chunk size for a message: about a quarter of a segment, at least 4 MiB (or the whole
/// segment when smaller), at most 64 MiB; from 32 MiB segments on, half a segment, at most
/// 128 MiB; at most 4 MiB when any edge is staged. From the prototype on the 2×H200 machine:
/// every CUDA call costs ~2 µs of host time, so small chunks only pay when the host keeps up; the
/// best push chunk was 512 KiB at 1 MiB, 4 MiB at 8–32 MiB. From ringreduce's own sweeps
/// (`bench --chunk`, 2×H200, commits 7347b79 and 3f26871, docs/runs/2026-11-30-s3-*): fewer,
/// larger chunks win on large segments — 64 MiB messages: 16 MiB chunks 198.6 µs against 214.3
/// for 8 MiB and 225.6 for 32 MiB (one chunk); 128 MiB: 32 MiB chunks 374.9 against 392.3 for
/// 16 MiB; 256 MiB: 64 MiB 718 against 740 for 32 MiB; 512 MiB: 128 MiB 1405–1412 against
/// 1427–1437 for 64 MiB; 1 GiB: 128 MiB 2805–2818 against 2858–2879 for 64 MiB; 2, 3 or 4 slots
/// within 1%. (Out of place; in place alike.) A staged edge is a three-stage pipeline
/// (device→host, host→device, reduce) at ~55 GB/s per PCIe direction, where the prototype did
/// best with 4 MiB chunks (38–44 GB/s); ringreduce with 32 MiB chunks measured 32–34 GB/s at
/// 256 MiB.
pub fn auto_chunk_bytes(count: usize, world: usize, elem_bytes: usize, staged: bool) -> usize {
    let segment_bytes = count.div_ceil(world.max(1)) * elem_bytes;
    if staged {
        return (segment_bytes / 4)
            .max(segment_bytes.min(4 << 20))
            .clamp(elem_bytes.max(1), 4 << 20);
    }
    if segment_bytes >= 32 << 20 {
        return (segment_bytes / 2).min(128 << 20);
    }
    (segment_bytes / 4)
        .max(segment_bytes.min(4 << 20))
        .clamp(elem_bytes.max(1), 64 << 20)
}

#[cfg(test)]
mod tests {
    use super::{auto_chunk_bytes, oneshot_layout, twoshot_segments};
    use crate::element::ReduceOp;
    use crate::plan::{BufKind, OneShotSpec, Op, Ranks, TwoShotSpec};

    fn twoshot(world: usize, count: usize, in_place: bool) -> crate::plan::Plan {
        TwoShotSpec {
            world,
            count,
            in_place,
            op: ReduceOp::Avg,
            align: 4,
        }
        .build()
        .unwrap()
    }

    #[test]
    fn twoshot_layout_is_read_from_the_plan_and_tiles_the_buffer() {
        for world in 2..=8 {
            for count in [1, 7, 64, 1001] {
                for in_place in [false, true] {
                    let segments = twoshot_segments(&twoshot(world, count, in_place))
                        .unwrap()
                        .expect("a collective");
                    assert_eq!(segments.len(), world);
                    assert_eq!(segments[0].0, 0);
                    for pair in segments.windows(2) {
                        assert_eq!(pair[0].0 + pair[0].1, pair[1].0);
                    }
                    let (last_offset, last_count) = segments[world - 1];
                    assert_eq!(last_offset + last_count, count);
                }
            }
        }
        assert_eq!(twoshot_segments(&twoshot(1, 10, true)).unwrap(), None);
        assert_eq!(twoshot_segments(&twoshot(3, 0, false)).unwrap(), None);
    }

    #[test]
    fn plans_the_kernels_do_not_implement_are_refused() {
        // A gather round that copies from the wrong rank.
        let mut wrong_owner = twoshot(3, 12, true);
        if let Op::PeerReduce { ranks, .. } = &mut wrong_owner.ranks[0][1].op {
            *ranks = Ranks::only(2);
        }
        assert!(twoshot_segments(&wrong_owner).is_err());
        // Step 0 reading the input of an in-place plan.
        let mut wrong_source = twoshot(2, 12, true);
        if let Op::PeerReduce { src, .. } = &mut wrong_source.ranks[1][0].op {
            *src = BufKind::Input;
        }
        assert!(twoshot_segments(&wrong_source).is_err());
        // A one-shot plan is not a two-shot plan, and the reverse.
        let oneshot = OneShotSpec {
            world: 2,
            count: 12,
            in_place: false,
            op: ReduceOp::Sum,
        }
        .build()
        .unwrap();
        oneshot_layout(&oneshot).unwrap();
        assert!(twoshot_segments(&oneshot).is_err());
        assert!(oneshot_layout(&twoshot(2, 12, false)).is_err());
    }

    #[test]
    fn chunks_follow_the_measurements_for_two_gpus() {
        let mib = 1 << 20;
        // f32, world 2: (message, best push chunk measured in the prototype)
        for (message, chunk) in [
            (mib, mib / 2),
            (8 * mib, 4 * mib),
            (32 * mib, 4 * mib),
            // ringreduce's own sweeps (doc above)
            (64 * mib, 16 * mib),
            (128 * mib, 32 * mib),
            (256 * mib, 64 * mib),
            (512 * mib, 128 * mib),
            (1024 * mib, 128 * mib),
            (4096 * mib, 128 * mib),
        ] {
            assert_eq!(
                auto_chunk_bytes(message / 4, 2, 4, false),
                chunk,
                "message {message}"
            );
        }
        assert_eq!(auto_chunk_bytes(256 * mib / 4, 2, 4, true), 4 * mib);
        assert_eq!(auto_chunk_bytes(1, 2, 4, false), 4);
        assert_eq!(auto_chunk_bytes(0, 2, 4, false), 4);
    }
}

/// How one ring edge was set up, why, and (when probed) how fast it measured.
#[derive(Clone, Debug, PartialEq)]
pub struct EdgeInfo {
    pub from_rank: usize,
    pub to_rank: usize,
    pub from_device: usize,
    pub to_device: usize,
    pub transport: EdgeTransport,
    pub reason: String,
    /// The link between the two GPUs as `nvidia-smi topo -m` names it, when NVML could read it.
    pub link: Option<Link>,
    /// The edge probe's figure at creation ([`super::probe`]); `None` when not probed (probe off,
    /// or both ranks on one GPU).
    pub probe: Option<Probe>,
}

impl EdgeInfo {
    /// `Some(why)` when the probe found this edge far below what its link promises: silent
    /// degradation that no API call reports (ACS or a hypervisor in the peer path, a degraded
    /// link). The communicator still works, slowly; `ringreduce run` and `bench` print this as a
    /// warning.
    pub fn slow(&self) -> Option<&str> {
        self.probe.as_ref().and_then(|p| p.slow.as_deref())
    }

    /// One line for logs: `rank 0 (GPU 0) → rank 1 (GPU 1): peer copies…; NV18; probe 391.2 GB/s`.
    pub fn describe(&self) -> String {
        let mut line = format!(
            "rank {} (GPU {}) → rank {} (GPU {}): {}",
            self.from_rank, self.from_device, self.to_rank, self.to_device, self.reason
        );
        if let Some(link) = self.link {
            line.push_str(&format!("; link {link}"));
        }
        match &self.probe {
            Some(p) => {
                line.push_str(&format!("; probe {:.1} GB/s", p.measured_gb_per_s));
                if let Some(e) = p.expected_gb_per_s {
                    line.push_str(&format!(" (link estimate {e:.1})"));
                }
                if let Some(why) = &p.slow {
                    line.push_str(&format!(" — {why}"));
                }
            }
            None => line.push_str("; not probed"),
        }
        line
    }
}

/// A rank's GPU resources, made once per communicator.
struct RankRes {
    device: usize,
    ctx: Arc<CudaContext>,
    /// Indexed by `StreamKind::index()`.
    streams: Vec<Stream>,
    kernels: Kernels,
    /// Recorded on Main after each call, polled to learn that the rank is done.
    done: Event,
}

/// Staging memory a plan owns.
enum Staging {
    Device(DeviceBuffer),
    Host(PinnedHost),
}

/// A checked plan with its events and staging buffers.
struct Prepared {
    plan: Plan,
    /// For a two-shot plan: each rank's segment (offset, count), which its one fused kernel per
    /// rank needs (`twoshot_segments`).
    twoshot: Option<Vec<(usize, usize)>>,
    waiters: Vec<Vec<usize>>,
    events: Vec<Event>,
    staging: Vec<Option<Staging>>,
}

/// What the one-shot's kernels share across ranks, made once per communicator: per rank, the
/// flag words its peers write at the barriers (device memory, zeroed, reached through peer
/// access), and a pinned word its kernel sets when a barrier times out.
struct OneShotShared {
    flags: Vec<DeviceBuffer>,
    errors: Vec<PinnedHost>,
    /// The smallest SM count of the ranks' GPUs: the grid cap that keeps every block resident.
    max_blocks: u32,
}

impl OneShotShared {
    /// The code rank `rank`'s kernel left (1: start barrier timed out, 2: end barrier, 3: a launch
    /// it could not accept, 4: the two-shot's middle barrier), 0 when none. Read through the host mapping; the kernel writes it
    /// with a plain system-scope store.
    fn error(&self, rank: usize) -> u32 {
        // SAFETY: the pinned allocation is at least 4 bytes and page-aligned, and lives as long
        // as `self`; a volatile read, since the GPU may write the word at any time.
        unsafe { std::ptr::read_volatile(self.errors[rank].as_ptr().cast::<u32>()) }
    }
}

/// Plans kept per communicator; older ones are dropped beyond this (after a device sync).
const CACHED_PLANS: usize = 8;

/// What the threads of one call share.
struct CudaCall {
    id: u64,
    prepared: Arc<Prepared>,
    /// Base address of every plan buffer.
    addrs: Vec<u64>,
    dtype: DType,
    op: ReduceOp,
    wait_complete: bool,
    deadline: Instant,
    timeout: Duration,
    abort: AtomicBool,
    done: Sender<(usize, Result<()>)>,
    /// The one-shot's flags and error words, and this call's barrier epoch (1, 2, … per call).
    oneshot: Option<Arc<OneShotShared>>,
    epoch: u32,
}

/// The GPU executor of one communicator.
pub(crate) struct CudaExecutor {
    ranks: Vec<Arc<RankRes>>,
    threads: Vec<(Sender<Arc<CudaCall>>, JoinHandle<()>)>,
    edges: Vec<EdgeInfo>,
    config: CudaConfig,
    cache: PlanCache<Prepared>,
    pool_granted: HashSet<(u64, usize)>,
    calls: u64,
    /// Present when the one-shot can run here (every pair of GPUs reaches the other).
    oneshot: Option<Arc<OneShotShared>>,
    epoch: u32,
    /// Every rank's context, by rank (for enqueuing from the caller's thread).
    contexts: Vec<Arc<CudaContext>>,
}

impl CudaExecutor {
    /// Sets up rank `r` on GPU `devices[r]`; the ring follows the order given.
    pub(crate) fn new(devices: &[usize], config: CudaConfig) -> Result<CudaExecutor> {
        device::driver_available()?;
        if devices.is_empty() {
            return Err(Error::NoBuffers);
        }
        if config.slots == 0 || config.chunk_bytes == Some(0) {
            return Err(Error::InvalidArgument(
                "slots and chunk_bytes must be at least 1".into(),
            ));
        }
        for (second, d) in devices.iter().enumerate() {
            match devices[..second].iter().position(|x| x == d) {
                Some(first) if !config.allow_shared_device => {
                    return Err(Error::DuplicateDevice {
                        device: *d,
                        first,
                        second,
                    })
                }
                _ => {}
            }
        }
        let count = device::device_count()?;
        if let Some(&bad) = devices.iter().find(|&&d| d >= count) {
            return Err(Error::InvalidArgument(format!(
                "device {bad} does not exist ({count} visible)"
            )));
        }
        let ranks = devices
            .iter()
            .map(|&d| {
                let ctx = device::context(d)?;
                let streams = StreamKind::ALL
                    .iter()
                    .map(|_| Stream::new(&ctx))
                    .collect::<Result<Vec<_>>>()?;
                let kernels = Kernels::new(&ctx)?;
                let done = Event::new(&ctx)?;
                Ok(Arc::new(RankRes {
                    device: d,
                    ctx,
                    streams,
                    kernels,
                    done,
                }))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut edges = decide_edges(&ranks, config.transport)?;
        if config.probe_edges && !edges.is_empty() {
            probe_edges(&ranks, &mut edges)?;
        }
        let oneshot = match config.algorithm {
            Algorithm::Ring => None,
            _ => setup_oneshot(&ranks, config.transport)?,
        };
        if config.algorithm.reads_peers() && oneshot.is_none() {
            return Err(Error::InvalidArgument(format!(
                "Algorithm::{:?} needs 2 to {ONESHOT_MAX_RANKS} ranks on distinct GPUs that all \
                 reach each other over peer access, and a transport other than Staged",
                config.algorithm
            )));
        }
        let threads = Handoff::ring(ranks.len())
            .into_iter()
            .map(|handoff| {
                let res = ranks[handoff.rank].clone();
                let contexts = ranks.iter().map(|r| r.ctx.clone()).collect();
                let (tx, rx) = crossbeam_channel::unbounded();
                let handle = std::thread::Builder::new()
                    .name(format!("ringreduce-gpu-{}", res.device))
                    .spawn(move || rank_thread(handoff, res, contexts, rx))
                    .map_err(|e| {
                        Error::InvalidArgument(format!("cannot start a rank thread: {e}"))
                    })?;
                Ok((tx, handle))
            })
            .collect::<Result<Vec<_>>>()?;
        let contexts = ranks.iter().map(|r| r.ctx.clone()).collect();
        Ok(CudaExecutor {
            ranks,
            threads,
            edges,
            config,
            cache: PlanCache::new(CACHED_PLANS),
            pool_granted: HashSet::new(),
            calls: 0,
            oneshot,
            epoch: 0,
            contexts,
        })
    }

    pub(crate) fn devices(&self) -> Vec<usize> {
        self.ranks.iter().map(|r| r.device).collect()
    }

    pub(crate) fn algorithm_for(&self, bytes: usize, in_place: bool) -> Algorithm {
        self.config
            .algorithm
            .choose(bytes, self.ranks.len(), in_place, self.oneshot.is_some())
    }

    pub(crate) fn edges(&self) -> &[EdgeInfo] {
        &self.edges
    }

    /// The raw handle of rank `rank`'s Main stream, on which each collective starts and ends.
    pub(crate) fn main_stream(&self, rank: usize) -> Option<cudarc::driver::sys::CUstream> {
        self.ranks
            .get(rank)
            .map(|r| r.streams[StreamKind::Main.index()].raw())
    }

    /// Blocks until every rank's streams are idle, at most the communicator's timeout, and
    /// reports what the GPUs left: a CUDA error of queued work, a one-shot kernel's barrier
    /// timeout, or [`Error::Timeout`] naming a GPU that is still busy after the timeout.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.wait_idle(self.config.timeout)?;
        self.check_oneshot_errors()
    }

    /// What the GPUs report without waiting: a one-shot kernel's barrier timeout, or an error of
    /// earlier asynchronous work (`cuEventQuery` on each rank's completion event returns it).
    /// Puts the calling thread's context back.
    pub(crate) fn poll_health(&self) -> Result<()> {
        self.check_oneshot_errors()?;
        let saved = device::save_current()?;
        let polled = self
            .ranks
            .iter()
            .try_for_each(|r| device::event_query(&r.done).map(drop));
        polled.and(saved.restore())
    }

    /// Polls every rank's streams until all are idle (or report an error) or `within` has
    /// passed. Returns the first CUDA error a stream reported (the root cause), else
    /// [`Error::Timeout`] naming the first GPU still busy. Polling, not `cuStreamSynchronize`, so
    /// that a stuck GPU cannot hold the caller forever; a stream that reports an error does not
    /// stop the wait for the others.
    fn wait_idle(&self, within: Duration) -> Result<()> {
        let start = Instant::now();
        let mut busy: Vec<(usize, usize)> = self
            .ranks
            .iter()
            .enumerate()
            .flat_map(|(rank, r)| (0..r.streams.len()).map(move |s| (rank, s)))
            .collect();
        let mut first_error: Option<Error> = None;
        loop {
            busy.retain(
                |&(rank, s)| match device::stream_query(&self.ranks[rank].streams[s]) {
                    Ok(idle) => !idle,
                    Err(err) => {
                        first_error.get_or_insert(err);
                        false
                    }
                },
            );
            let Some(&(rank, s)) = busy.first() else {
                return first_error.map_or(Ok(()), Err);
            };
            let waited = start.elapsed();
            if waited >= within {
                if let Some(err) = first_error {
                    return Err(err);
                }
                return Err(Error::Timeout {
                    rank,
                    waiting_on: format!(
                        "GPU {}'s {:?} stream was still busy (a collective, or work queued before one, did not finish)",
                        self.ranks[rank].device,
                        StreamKind::ALL[s]
                    ),
                    after: within,
                });
            }
            if waited < Duration::from_micros(200) {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Waits (at most the timeout) for the GPUs to finish this communicator's work, reports
    /// what they left, and frees everything — except when any stream is still busy (or in an
    /// error state) after the timeout: then the communicator's streams, events and buffers on
    /// every GPU are leaked on purpose, since freeing memory that a stuck copy or kernel may still
    /// touch would turn a hang into memory corruption.
    pub(crate) fn shutdown(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        for (tx, handle) in self.threads.drain(..) {
            drop(tx);
            let _ = handle.join();
        }
        if self.ranks.is_empty() {
            return Ok(()); // torn down already
        }
        let result = self.synchronize();
        // Free only what no GPU can still touch: every stream idle. A stream still busy, or one
        // in an error state that cannot say, keeps everything (its context may be broken anyway,
        // and freeing would then fail or block).
        let all_idle = self.ranks.iter().all(|r| {
            r.streams
                .iter()
                .all(|s| matches!(device::stream_query(s), Ok(true)))
        });
        if !all_idle {
            std::mem::forget(std::mem::replace(
                &mut self.cache,
                PlanCache::new(CACHED_PLANS),
            ));
            std::mem::forget(self.oneshot.take());
            std::mem::forget(std::mem::take(&mut self.ranks));
            std::mem::forget(std::mem::take(&mut self.contexts));
        }
        self.ranks.clear();
        result
    }

    /// The pool trap, handled: an output from a stream-ordered pool gets its pool opened to the
    /// GPU that pushes into it (once per buffer address). Without this the push would silently
    /// run through the host at a tenth of the link's speed. Staged edges touch only our own
    /// staging memory, and inputs are only read locally.
    pub(crate) fn prepare_buffers(&mut self, outputs: &[u64]) -> Result<()> {
        let n = self.ranks.len();
        for (rank, &addr) in outputs.iter().enumerate() {
            let sender = (rank + n - 1) % n;
            if n == 1 || addr == 0 || self.edges[sender].transport != EdgeTransport::Peer {
                continue;
            }
            self.grant_once(addr, self.ranks[sender].device)?;
        }
        Ok(())
    }

    /// Grants `peer` access to the pool behind `addr` unless that was done already; remembered
    /// only once it succeeded, so a failed grant is tried again on the next call.
    fn grant_once(&mut self, addr: u64, peer: usize) -> Result<()> {
        if !self.pool_granted.contains(&(addr, peer)) {
            device::grant_pointer_pool_access(addr, peer)?;
            self.pool_granted.insert((addr, peer));
        }
        Ok(())
    }

    fn prepare(&mut self, shape: Shape) -> Result<Arc<Prepared>> {
        if let Some(p) = self.cache.get(&shape) {
            return Ok(p);
        }
        let n = self.ranks.len();
        let bytes = shape.count.saturating_mul(shape.elem_bytes);
        let algorithm =
            self.config
                .algorithm
                .choose(bytes, n, shape.in_place, self.oneshot.is_some());
        // 16-byte boundaries keep every chunk and segment vector-aligned for the kernels and
        // copies.
        let align_elems = (16 / shape.elem_bytes).max(1);
        let plan = if algorithm == Algorithm::OneShot {
            let plan = shape.checked_oneshot_plan(n)?;
            oneshot_layout(&plan)?;
            plan
        } else if algorithm == Algorithm::TwoShot {
            shape.checked_twoshot_plan(n, align_elems)?
        } else {
            let chunk_bytes = self.config.chunk_bytes.unwrap_or_else(|| {
                let staged = self
                    .edges
                    .iter()
                    .any(|e| e.transport == EdgeTransport::Staged);
                auto_chunk_bytes(shape.count, n, shape.elem_bytes, staged)
            });
            shape.checked_plan(
                (chunk_bytes / shape.elem_bytes).max(1),
                self.config.slots,
                align_elems,
                self.edge_transports(),
            )?
        };
        let events = plan
            .events
            .iter()
            .map(|decl| Event::new(&self.ranks[decl.rank].ctx))
            .collect::<Result<Vec<_>>>()?;
        let staging = plan
            .buffers
            .iter()
            .map(|decl| {
                let bytes = decl.len * shape.elem_bytes;
                let ctx = &self.ranks[decl.rank].ctx;
                match decl.kind {
                    BufKind::Input | BufKind::Output => Ok(None),
                    BufKind::Slots | BufKind::Exposed => {
                        DeviceBuffer::new(ctx, bytes.max(1)).map(|b| Some(Staging::Device(b)))
                    }
                    BufKind::HostSlots => {
                        PinnedHost::new(ctx, bytes.max(1)).map(|b| Some(Staging::Host(b)))
                    }
                }
            })
            .collect::<Result<Vec<_>>>()?;
        if self.cache.is_full() {
            // The oldest plan's events and buffers may still be in use by enqueued work.
            self.synchronize()?;
        }
        let twoshot = if algorithm == Algorithm::TwoShot {
            twoshot_segments(&plan)?
        } else {
            None
        };
        let prepared = Arc::new(Prepared {
            twoshot,
            waiters: plan.remote_waiters(),
            plan,
            events,
            staging,
        });
        self.cache.insert(shape, prepared.clone());
        Ok(prepared)
    }

    /// Each ring edge's transport, by sending rank. One rank has no edge (`decide_edges` makes
    /// none); its plan still names one, which it never uses.
    fn edge_transports(&self) -> Vec<EdgeTransport> {
        if self.ranks.len() == 1 {
            return vec![EdgeTransport::Peer];
        }
        self.edges.iter().map(|e| e.transport).collect()
    }

    /// Runs one all-reduce over device buffers.
    ///
    /// # Safety
    /// `outputs[r]` (and `inputs[r]`) are device addresses on rank r's GPU, valid for `count`
    /// elements of `T`; outputs overlap nothing else in the call; nothing else touches the outputs
    /// (or writes the inputs) until the call is complete — when this returns if `wait_complete`,
    /// else once each rank's Main stream has passed the call.
    pub(crate) unsafe fn run<T: Element>(
        &mut self,
        inputs: Option<&[u64]>,
        outputs: &[u64],
        count: usize,
        op: ReduceOp,
        wait_complete: bool,
    ) -> Result<()> {
        let shape = Shape::of::<T>(count, inputs.is_none(), op);
        let prepared = self.prepare(shape)?;
        let oneshot = prepared
            .plan
            .ranks
            .iter()
            .flatten()
            .any(|i| matches!(i.op, Op::PeerReduce { .. }));
        if oneshot {
            self.check_oneshot_errors()?;
            self.epoch = self.epoch.wrapping_add(1).max(1);
            // Out of place, every GPU reads every other GPU's input; the two-shot also reads
            // every other GPU's output: open pool memory to them.
            let outputs_read = prepared.twoshot.is_some().then_some(outputs);
            for ranked in inputs.into_iter().chain(outputs_read) {
                for (rank, &addr) in ranked.iter().enumerate() {
                    let own = self.ranks[rank].device;
                    let peers: Vec<usize> = self.ranks.iter().map(|r| r.device).collect();
                    for peer in peers.into_iter().filter(|&p| p != own) {
                        self.grant_once(addr, peer)?;
                    }
                }
            }
        }
        let addrs = prepared
            .plan
            .buffers
            .iter()
            .zip(&prepared.staging)
            .map(|(decl, staging)| match (decl.kind, staging) {
                (BufKind::Input, _) => inputs.map_or(0, |i| i[decl.rank]),
                (BufKind::Output, _) => outputs[decl.rank],
                (_, Some(Staging::Device(b))) => b.ptr(),
                (_, Some(Staging::Host(h))) => h.uva_ptr(),
                (_, None) => 0,
            })
            .collect();
        self.calls += 1;
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let call = Arc::new(CudaCall {
            id: self.calls,
            prepared,
            addrs,
            dtype: T::DTYPE,
            op,
            wait_complete,
            deadline: Instant::now() + self.config.timeout,
            timeout: self.config.timeout,
            abort: AtomicBool::new(false),
            done: done_tx,
            oneshot: self.oneshot.clone().filter(|_| oneshot),
            epoch: self.epoch,
        });
        if call.prepared.plan.events.is_empty() {
            // No event crosses between ranks (the one-shot; one rank; nothing to do): there is no
            // handoff to wait for, so the caller's thread enqueues every rank itself — a channel
            // round trip per rank thread saved, ~10 µs of a ~20 µs small call.
            self.run_inline(&call)?;
            return if oneshot && wait_complete {
                self.check_oneshot_errors()
            } else {
                Ok(())
            };
        }
        for (tx, _) in &self.threads {
            tx.send(call.clone()).map_err(|_| Error::Closed)?;
        }
        let mut first_error: Option<Error> = None;
        let mut pending: Vec<usize> = (0..self.ranks.len()).collect();
        let backstop = call.deadline + Duration::from_millis(250);
        while !pending.is_empty() {
            match done_rx.recv_deadline(backstop) {
                Ok((rank, result)) => {
                    pending.retain(|&r| r != rank);
                    if let Err(err) = result {
                        call.abort.store(true, Ordering::Release);
                        first_error.get_or_insert(err);
                    }
                }
                Err(_) => {
                    call.abort.store(true, Ordering::Release);
                    return Err(
                        first_error.unwrap_or(Error::Timeout {
                            rank: pending[0],
                            waiting_on:
                                "did not finish its part of the collective (its GPU may be hung)"
                                    .into(),
                            after: self.config.timeout,
                        }),
                    );
                }
            }
        }
        if let Some(err) = first_error {
            return Err(err);
        }
        if wait_complete {
            // The caller's thread polls completion itself: the rank threads reported as soon as
            // they had enqueued (while the GPUs work), so no thread wake-up sits between the
            // GPUs finishing and this call returning.
            let saved = device::save_current()?;
            let waited = self
                .ranks
                .iter()
                .enumerate()
                .try_for_each(|(rank, res)| wait_done(res, rank, &call));
            waited.and(saved.restore())?;
            if oneshot {
                return self.check_oneshot_errors();
            }
        }
        Ok(())
    }

    /// Enqueues a plan without events from the calling thread, rank after rank (each rank's
    /// work goes on its own streams, so the order between ranks does not matter: the one-shot's
    /// kernels meet on the GPUs, whenever each is launched), then waits for completion if asked.
    /// A panic is caught and returned as an error, as on the rank threads.
    fn run_inline(&self, call: &CudaCall) -> Result<()> {
        let saved = device::save_current()?;
        let current = std::cell::Cell::new(0usize);
        let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<()> {
            for (rank, res) in self.ranks.iter().enumerate() {
                current.set(rank);
                let enqueued = (|| {
                    device::bind(&res.ctx)?;
                    let mut backend = CudaEnqueue {
                        res,
                        contexts: &self.contexts,
                        call,
                        fuse_exposure: true,
                        held: None,
                    };
                    for (index, instr) in call.prepared.plan.ranks[rank].iter().enumerate() {
                        backend.enqueue(index, instr)?;
                    }
                    backend.flush()?;
                    device::record(&res.done, &res.streams[StreamKind::Main.index()])
                })();
                if let Err(err) = enqueued {
                    // Ranks already launched spin at their barriers until the kernel's timeout
                    // (shorter than the call's deadline); wait for them, so that nothing on a GPU
                    // touches the caller's buffers after this call has returned its error.
                    // (Bounded by the deadline: a stuck stream must not hold the caller.)
                    for earlier in &self.ranks[..=rank] {
                        let main = &earlier.streams[StreamKind::Main.index()];
                        while matches!(device::stream_query(main), Ok(false))
                            && Instant::now() < call.deadline
                        {
                            std::thread::sleep(Duration::from_micros(50));
                        }
                    }
                    return Err(err);
                }
            }
            if call.wait_complete {
                for (rank, res) in self.ranks.iter().enumerate() {
                    current.set(rank);
                    wait_done(res, rank, call)?;
                }
            }
            Ok(())
        }));
        let restored = saved.restore();
        let result = outcome.unwrap_or_else(|payload| {
            Err(Error::RankFailed {
                rank: current.get(),
                during: "enqueue".into(),
                message: panic_message(&*payload),
            })
        });
        result.and(restored)
    }

    /// The first one-shot barrier timeout any rank's kernel reported (its kernel then returned
    /// early, so that call's output is incomplete): an error naming the rank and the barrier.
    /// Checked after every blocking one-shot call, before the next one-shot call, and by
    /// `synchronize`.
    fn check_oneshot_errors(&self) -> Result<()> {
        let Some(shared) = &self.oneshot else {
            return Ok(());
        };
        for (rank, r) in self.ranks.iter().enumerate() {
            let code = shared.error(rank);
            if code != 0 {
                let barrier = match code {
                    1 => Some("start"),
                    2 => Some("end"),
                    4 => Some("middle"),
                    _ => None,
                };
                let waiting_on = match barrier {
                    Some(barrier) => format!(
                        "GPU {}'s one-shot kernel gave up at the {barrier} barrier: a peer's kernel never arrived",
                        r.device,
                    ),
                    _ => {
                        return Err(Error::RankFailed {
                            rank,
                            during: "the one-shot peer reduce".into(),
                            message: format!(
                                "GPU {}'s one-shot kernel found its launch inconsistent (code {code})",
                                r.device
                            ),
                        })
                    }
                };
                return Err(Error::Timeout {
                    rank,
                    waiting_on,
                    after: self.config.timeout,
                });
            }
        }
        Ok(())
    }
}

impl Drop for CudaExecutor {
    fn drop(&mut self) {
        // Queued work may still use the plans' events and buffers: let it finish first (at most
        // the timeout). An error here has nowhere to go (Drop never panics); `Communicator::close`
        // reports it through `shutdown`.
        let _ = self.teardown();
    }
}

/// Decides each edge's transport and enables peer access where it is used.
fn decide_edges(ranks: &[Arc<RankRes>], transport: Transport) -> Result<Vec<EdgeInfo>> {
    let n = ranks.len();
    if n == 1 {
        return Ok(Vec::new());
    }
    (0..n)
        .map(|from_rank| {
            let to_rank = (from_rank + 1) % n;
            let (a, b) = (&ranks[from_rank], &ranks[to_rank]);
            let info = |transport, reason: String| EdgeInfo {
                from_rank,
                to_rank,
                from_device: a.device,
                to_device: b.device,
                transport,
                reason,
                link: None,
                probe: None,
            };
            if transport == Transport::Staged {
                return Ok(info(
                    EdgeTransport::Staged,
                    "staged through pinned host memory: forced by Transport::Staged".into(),
                ));
            }
            if !device::can_access_peer(a.device, b.device)? {
                if transport == Transport::Peer {
                    return Err(Error::NoPeerAccess {
                        from: a.device,
                        to: b.device,
                    });
                }
                return Ok(info(
                    EdgeTransport::Staged,
                    format!(
                        "staged through pinned host memory: cuDeviceCanAccessPeer({}, {}) = 0",
                        a.device, b.device
                    ),
                ));
            }
            device::enable_peer_access(&a.ctx, &b.ctx)?;
            Ok(info(
                EdgeTransport::Peer,
                format!(
                    "peer copies: GPU {} pushes into GPU {} (peer access enabled)",
                    a.device, b.device
                ),
            ))
        })
        .collect()
}

/// Each rank's segment (offset, count) of a two-shot plan, after verifying that the plan has
/// exactly the layout the fused two-shot kernel implements: on every rank, a peer reduce of
/// every rank's sources into its own output segment, then one peer reduce per other rank q — in
/// the order `twoshot::gather_from` gives — copying q's output segment from q alone, and nothing
/// else but a final `Scale`; the segments tile the buffer in rank order. `None` for an empty
/// plan (one rank, or zero elements).
fn twoshot_segments(plan: &Plan) -> Result<Option<Vec<(usize, usize)>>> {
    let n = plan.world;
    let peer_ops = |rank: usize| -> Vec<Op> {
        plan.ranks[rank]
            .iter()
            .map(|i| i.op)
            .filter(|op| matches!(op, Op::PeerReduce { .. }))
            .collect()
    };
    if (0..n).all(|r| peer_ops(r).is_empty()) {
        return Ok(None);
    }
    let bad = |why: String| Err(Error::PlanRejected(format!("not a two-shot plan: {why}")));
    let src_kind = if plan.in_place {
        BufKind::Output
    } else {
        BufKind::Input
    };
    let mut segments = Vec::with_capacity(n);
    for rank in 0..n {
        match peer_ops(rank).first() {
            Some(&Op::PeerReduce {
                dst,
                src,
                offset,
                count,
                ranks: Ranks::ALL,
            }) if dst.offset == offset
                && src == src_kind
                && plan.decl(dst.buf).rank == rank
                && plan.decl(dst.buf).kind == BufKind::Output =>
            {
                segments.push((offset, count))
            }
            _ => {
                return bad(format!(
                    "rank {rank} does not start by reducing its own segment"
                ))
            }
        }
    }
    let mut end = 0;
    for (q, &(offset, count)) in segments.iter().enumerate() {
        if offset != end {
            return bad(format!("segment {q} starts at {offset}, not at {end}"));
        }
        end += count;
    }
    if end != plan.count {
        return bad(format!("the segments end at {end}, not at {}", plan.count));
    }
    for rank in 0..n {
        let ops = peer_ops(rank);
        if ops.len() != n {
            return bad(format!(
                "rank {rank} has {} peer reduces, not {n}",
                ops.len()
            ));
        }
        for (round, op) in ops.iter().enumerate().skip(1) {
            let owner = crate::plan::twoshot::gather_from(rank, round, n);
            let (offset, count) = segments[owner];
            let fits = matches!(*op, Op::PeerReduce { dst, src: BufKind::Output, offset: o, count: c, ranks }
                if ranks == Ranks::only(owner)
                    && (o, c) == (offset, count)
                    && (dst.offset, dst.count) == (offset, count)
                    && plan.decl(dst.buf).rank == rank
                    && plan.decl(dst.buf).kind == BufKind::Output);
            if !fits {
                return bad(format!(
                    "rank {rank}'s gather round {round} does not copy segment {owner} from rank {owner}"
                ));
            }
        }
        let program = &plan.ranks[rank];
        let others_ok = program.iter().enumerate().all(|(i, instr)| {
            instr.stream == StreamKind::Main
                && match instr.op {
                    Op::PeerReduce { .. } => true,
                    Op::Scale { .. } => i + 1 == program.len(),
                    _ => false,
                }
        });
        if !others_ok {
            return bad(format!(
                "rank {rank} has work besides its peer reduces and a final scale on Main"
            ));
        }
    }
    Ok(Some(segments))
}

/// Verifies that a one-shot plan has the layout the one-shot kernel assumes: in every meeting,
/// every rank reads every rank (`Ranks::ALL`) over the same source kind and range, so that all
/// ranks launch the same grid and every source is known. (The checker allows more: ranks of a
/// meeting reading different ranges or a subset of ranks, as the two-shot does.)
fn oneshot_layout(plan: &Plan) -> Result<()> {
    let meetings = |rank: usize| -> Vec<Op> {
        plan.ranks[rank]
            .iter()
            .map(|i| i.op)
            .filter(|op| matches!(op, Op::PeerReduce { .. }))
            .collect()
    };
    let first = meetings(0);
    for rank in 0..plan.world {
        let mine = meetings(rank);
        if mine.len() != first.len() {
            return Err(Error::PlanRejected(format!(
                "not a one-shot plan: rank {rank} has {} peer reduces, rank 0 {}",
                mine.len(),
                first.len()
            )));
        }
        for (k, (op, op0)) in mine.iter().zip(&first).enumerate() {
            let same = match (*op, *op0) {
                (
                    Op::PeerReduce {
                        src,
                        offset,
                        count,
                        ranks,
                        ..
                    },
                    Op::PeerReduce {
                        src: src0,
                        offset: offset0,
                        count: count0,
                        ..
                    },
                ) => ranks == Ranks::ALL && (src, offset, count) == (src0, offset0, count0),
                _ => false,
            };
            if !same {
                return Err(Error::PlanRejected(format!(
                    "not a one-shot plan: rank {rank}'s peer reduce {k} does not read every rank \
                     over rank 0's range"
                )));
            }
        }
    }
    Ok(())
}

/// Makes the one-shot's flags and error words, after enabling peer access between every pair of
/// GPUs (the one-shot reads every rank's input from every rank). `None` where it cannot run:
/// one rank, more than [`ONESHOT_MAX_RANKS`], forced staging, two ranks on one GPU, or a pair
/// without peer access.
fn setup_oneshot(
    ranks: &[Arc<RankRes>],
    transport: Transport,
) -> Result<Option<Arc<OneShotShared>>> {
    let n = ranks.len();
    if !(2..=ONESHOT_MAX_RANKS).contains(&n) || transport == Transport::Staged {
        return Ok(None);
    }
    // Two ranks on one GPU (the test-only shared mode) would need both grids resident on one
    // device at once; a block of one spinning for a block of the other that has no SM is a
    // deadlock until the timeout. The one-shot is for distinct GPUs.
    if (1..n).any(|i| ranks[..i].iter().any(|r| r.device == ranks[i].device)) {
        return Ok(None);
    }
    for a in ranks {
        for b in ranks {
            if a.device != b.device && !device::can_access_peer(a.device, b.device)? {
                return Ok(None);
            }
        }
    }
    for a in ranks {
        for b in ranks {
            // A pair the ring never uses may refuse (e.g. more than 8 peers of one device):
            // then the one-shot cannot run here, and the ring still can.
            if device::enable_peer_access(&a.ctx, &b.ctx).is_err() {
                return Ok(None);
            }
        }
    }
    let flags = ranks
        .iter()
        .map(|r| DeviceBuffer::zeroed(&r.ctx, ONESHOT_FLAG_BYTES))
        .collect::<Result<Vec<_>>>()?;
    let errors = ranks
        .iter()
        .map(|r| {
            let mut word = PinnedHost::new(&r.ctx, 4)?;
            word.as_mut_slice().fill(0);
            Ok(word)
        })
        .collect::<Result<Vec<_>>>()?;
    let sm_counts = device::devices()?;
    let max_blocks = ranks
        .iter()
        .filter_map(|r| sm_counts.get(r.device).map(|d| d.sm_count))
        .min()
        .unwrap_or(1)
        .max(1);
    Ok(Some(Arc::new(OneShotShared {
        flags,
        errors,
        max_blocks,
    })))
}

/// Fills in each edge's link (NVML, when it loads) and probe figure. Edges between two ranks on
/// one GPU are not probed: a copy within a device says nothing about a link.
fn probe_edges(ranks: &[Arc<RankRes>], edges: &mut [EdgeInfo]) -> Result<()> {
    let links = topo::detect().ok().map(|d| d.links);
    for edge in edges.iter_mut() {
        let (a, b) = (&ranks[edge.from_rank], &ranks[edge.to_rank]);
        edge.link = links
            .as_ref()
            .and_then(|l| l.get(a.device)?.get(b.device).copied().flatten());
        if a.device == b.device {
            continue;
        }
        let measured = match edge.transport {
            EdgeTransport::Peer => probe::peer_edge(
                &a.ctx,
                &b.ctx,
                &a.streams[StreamKind::Send.index()],
                edge.link,
            ),
            EdgeTransport::Staged => probe::staged_edge(
                &a.streams[StreamKind::Send.index()],
                &b.streams[StreamKind::Recv.index()],
                edge.link,
            ),
        };
        // The probe is a diagnosis: its failure is reported on the edge, not on the communicator.
        match measured {
            Ok(p) => edge.probe = Some(p),
            Err(err) => edge
                .reason
                .push_str(&format!("; not probed: the probe failed: {err}")),
        }
    }
    Ok(())
}

/// A rank's thread: enqueues each call's program on its GPU's streams.
fn rank_thread(
    mut handoff: Handoff,
    res: Arc<RankRes>,
    contexts: Vec<Arc<CudaContext>>,
    calls: Receiver<Arc<CudaCall>>,
) {
    let rank = handoff.rank;
    while let Some(call) = next_call(&calls) {
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            device::bind(&res.ctx)?;
            let mut backend = CudaEnqueue {
                res: &res,
                contexts: &contexts,
                call: &call,
                fuse_exposure: false,
                held: None,
            };
            enqueue_rank(
                &call.prepared.plan,
                &call.prepared.waiters,
                call.id,
                &mut handoff,
                &mut backend,
                Limits {
                    deadline: call.deadline,
                    timeout: call.timeout,
                    abort: &call.abort,
                },
            )?;
            device::record(&res.done, &res.streams[StreamKind::Main.index()])
        }));
        let result = match outcome {
            Ok(r) => r,
            Err(payload) => Err(Error::RankFailed {
                rank,
                during: "enqueue".into(),
                message: panic_message(&*payload),
            }),
        };
        if result.is_err() {
            call.abort.store(true, Ordering::Release);
        }
        let _ = call.done.send((rank, result));
    }
}

/// How long a rank thread keeps polling for the next call before it blocks: back-to-back
/// collectives (a training step's buckets, a benchmark) arrive within a call's GPU time, and a
/// blocked thread's wake-up (tens of µs, now and then far more) would sit on the GPU's critical
/// path, since nothing is enqueued until the thread runs.
const RANK_THREAD_SPIN: Duration = Duration::from_millis(5);

/// The next call for a rank thread, `None` once the executor is dropped. Polls (yielding the
/// CPU between polls) for [`RANK_THREAD_SPIN`], then blocks.
fn next_call(calls: &Receiver<Arc<CudaCall>>) -> Option<Arc<CudaCall>> {
    let start = Instant::now();
    while start.elapsed() < RANK_THREAD_SPIN {
        match calls.try_recv() {
            Ok(call) => return Some(call),
            Err(crossbeam_channel::TryRecvError::Disconnected) => return None,
            Err(crossbeam_channel::TryRecvError::Empty) => std::thread::yield_now(),
        }
    }
    calls.recv().ok()
}

/// Polls the rank's completion event until it fires, the call is aborted or the deadline passes.
/// Spins for the first 200 µs (small messages finish in tens of µs), then yields the CPU between
/// polls for up to 20 ms (a 1 GiB call takes ~3 ms: a sleep's timer slack, ~50 µs, would land on
/// the call's time), then sleeps between polls.
fn wait_done(res: &RankRes, rank: usize, call: &CudaCall) -> Result<()> {
    let start = Instant::now();
    loop {
        if device::event_query(&res.done)? {
            return Ok(());
        }
        if call.abort.load(Ordering::Acquire) {
            return Err(crate::exec::aborted(rank));
        }
        let now = Instant::now();
        if now >= call.deadline {
            return Err(stalled(call, rank, res.device));
        }
        let waited = now - start;
        if waited < Duration::from_micros(200) {
            std::hint::spin_loop();
        } else if waited < Duration::from_millis(20) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

/// The error for a call that rank `rank` (on GPU `device`) did not finish by its deadline, naming
/// the culprit where the plan's events tell: a rank whose entry event has not completed never
/// started the collective (work queued before it on that rank's Main stream is stuck);
/// otherwise `rank`'s first unfinished wait on another rank. (Every event of the call was
/// recorded before anyone waits for completion, so each query answers for this call.)
fn stalled(call: &CudaCall, rank: usize, device: usize) -> Error {
    let plan = &call.prepared.plan;
    // A query that fails reports an error of the GPU's work: that, not a blame, is the answer.
    let fault = std::cell::RefCell::new(None);
    let completed = |e: usize| match device::event_query(&call.prepared.events[e]) {
        Ok(done) => done,
        Err(err) => {
            fault.borrow_mut().get_or_insert(err);
            true
        }
    };
    let never_started = plan
        .events
        .iter()
        .enumerate()
        .find(|(e, decl)| decl.tag == Tag::ENTRY && !completed(*e));
    if let Some(err) = fault.borrow_mut().take() {
        return err;
    }
    if let Some((_, entry)) = never_started {
        return Error::Timeout {
            rank: entry.rank,
            waiting_on: "never started the collective: work queued on its Main stream before the call did not finish".into(),
            after: call.timeout,
        };
    }
    let first_wait = plan.ranks[rank].iter().find_map(|instr| match instr.op {
        Op::Wait(e) if plan.events[e.0].rank != rank && !completed(e.0) => Some(e),
        _ => None,
    });
    if let Some(err) = fault.into_inner() {
        return err;
    }
    Error::Timeout {
        rank,
        waiting_on: match first_wait {
            Some(e) => format!(
                "did not finish the collective on GPU {device}: its first unfinished wait is for {}",
                plan.events[e.0]
            ),
            None => format!("did not finish the collective on GPU {device}"),
        },
        after: call.timeout,
    }
}

/// A rank thread's view while enqueuing one call.
struct CudaEnqueue<'a> {
    res: &'a RankRes,
    /// Every rank's context, by rank (a peer copy names both ends).
    contexts: &'a [Arc<CudaContext>],
    call: &'a CudaCall,
    /// Fuse the in-place one-shot's exposure copy into its kernel: a Main-stream copy into the
    /// rank's exposed buffer is held back; if the next instruction is the peer reduce that reads
    /// exactly that region and writes exactly the copy's source, the kernel does the copy itself
    /// (`OneShotArgs::expose_from`, before its start barrier); otherwise the copy is enqueued as
    /// it stands. The caller must `flush` at the end of the program.
    fuse_exposure: bool,
    held: Option<Instr>,
}

impl CudaEnqueue<'_> {
    fn addr(&self, region: Region) -> u64 {
        self.call.addrs[region.buf.0] + (region.offset * self.call.dtype.size_bytes()) as u64
    }

    fn is_device(&self, region: Region) -> bool {
        self.call.prepared.plan.decl(region.buf).kind.memory() == crate::plan::Memory::Device
    }
}

impl CudaEnqueue<'_> {
    /// Enqueues a held-back exposure copy, if any.
    fn flush(&mut self) -> Result<()> {
        match self.held.take() {
            Some(copy) => self.enqueue_now(&copy, None),
            None => Ok(()),
        }
    }
}

impl Enqueue for CudaEnqueue<'_> {
    fn enqueue(&mut self, _index: usize, instr: &Instr) -> Result<()> {
        let plan = &self.call.prepared.plan;
        if self.fuse_exposure && instr.stream == StreamKind::Main {
            if let Op::Copy { dst, .. } = instr.op {
                if plan.decl(dst.buf).kind == BufKind::Exposed {
                    self.flush()?;
                    self.held = Some(*instr);
                    return Ok(());
                }
            }
        }
        let Some(held) = self.held.take() else {
            return self.enqueue_now(instr, None);
        };
        let fused = match (held.op, instr.op) {
            (
                Op::Copy { src, dst: exposed },
                Op::PeerReduce {
                    dst,
                    src: BufKind::Exposed,
                    offset,
                    count,
                    ..
                },
            ) if instr.stream == StreamKind::Main
                && dst == src
                && Some(exposed.buf) == plan.buffer(plan.decl(dst.buf).rank, BufKind::Exposed)
                && (exposed.offset, exposed.count) == (offset, count) =>
            {
                Some(self.addr(src))
            }
            _ => None,
        };
        if fused.is_none() {
            self.enqueue_now(&held, None)?;
        }
        self.enqueue_now(instr, fused)
    }
}

impl CudaEnqueue<'_> {
    /// Launches this rank's two-shot kernel: the plan's step 0 and every gather round of this
    /// rank (their layout was verified by `twoshot_segments` when the plan was prepared).
    fn launch_twoshot(&self, rank: usize) -> Result<()> {
        let call = self.call;
        let plan = &call.prepared.plan;
        let segments = call.prepared.twoshot.as_ref().expect("a two-shot plan");
        let shared = call.oneshot.as_ref().ok_or_else(|| {
            Error::InvalidArgument(
                "a two-shot plan on a communicator without one-shot resources".into(),
            )
        })?;
        let src_kind = if plan.in_place {
            BufKind::Output
        } else {
            BufKind::Input
        };
        let base = |r: usize, kind: BufKind| -> Result<u64> {
            let buf = plan.buffer(r, kind).ok_or_else(|| {
                Error::PlanRejected(format!("the two-shot plan has no {kind:?} for rank {r}"))
            })?;
            Ok(call.addrs[buf.0])
        };
        let mut args = TwoShotArgs {
            srcs: [0; ONESHOT_MAX_RANKS],
            outs: [0; ONESHOT_MAX_RANKS],
            flags: [0; ONESHOT_MAX_RANKS],
            seg_off: [0; ONESHOT_MAX_RANKS],
            seg_len: [0; ONESHOT_MAX_RANKS],
            world: plan.world as u32,
            rank: rank as u32,
            count: plan.count as u64,
            epoch: call.epoch,
            // As for the one-shot: its barriers give up before the host's deadline.
            timeout_ns: u64::try_from(call.timeout.as_nanos() / 4 * 3).unwrap_or(u64::MAX),
            error: shared.errors[rank].uva_ptr(),
            max_blocks: shared.max_blocks,
        };
        for (r, &(offset, count)) in segments.iter().enumerate() {
            args.srcs[r] = base(r, src_kind)?;
            args.outs[r] = base(r, BufKind::Output)?;
            args.flags[r] = shared.flags[r].ptr();
            args.seg_off[r] = offset as u64;
            args.seg_len[r] = count as u64;
        }
        // SAFETY: the plan is the checked two-shot plan whose layout `twoshot_segments`
        // verified: every rank's sources and outputs are the caller's validated buffers (or, in
        // place, the outputs themselves), on their ranks' GPUs, reachable from this one (peer
        // access between all pairs at creation, pool access granted per input and output); the
        // outputs are disjoint from each other and from other ranks' sources (validation);
        // every rank launches with the same arguments but its rank, and the same epoch, so the
        // barriers meet; the flags outlive the communicator's streams.
        unsafe {
            self.res.kernels.twoshot(
                call.dtype,
                call.op,
                &args,
                &self.res.streams[StreamKind::Main.index()],
            )
        }
    }

    /// Enqueues one instruction; `expose_from` is the fused exposure copy's source for a peer
    /// reduce (see `fuse_exposure`).
    fn enqueue_now(&mut self, instr: &Instr, expose_from: Option<u64>) -> Result<()> {
        let call = self.call;
        let plan = &call.prepared.plan;
        let stream = &self.res.streams[instr.stream.index()];
        let eb = call.dtype.size_bytes();
        match instr.op {
            Op::Record(e) => device::record(&call.prepared.events[e.0], stream),
            Op::Wait(e) => device::wait(stream, &call.prepared.events[e.0]),
            Op::Copy { src, dst } => {
                let (src_rank, dst_rank) = (plan.decl(src.buf).rank, plan.decl(dst.buf).rank);
                let bytes = src.count * eb;
                if self.is_device(src) && self.is_device(dst) && src_rank != dst_rank {
                    // SAFETY: both regions lie in device buffers of these ranks' contexts (checked
                    // plan, addresses from validated buffers or our own staging), stay allocated
                    // until the call completes, and the race-free plan orders every other access.
                    unsafe {
                        device::memcpy_peer_async(
                            self.addr(dst),
                            &self.contexts[dst_rank],
                            self.addr(src),
                            &self.contexts[src_rank],
                            bytes,
                            stream,
                        )
                    }
                } else {
                    // SAFETY: as above; host regions are our portable pinned staging buffers.
                    unsafe { device::memcpy_async(self.addr(dst), self.addr(src), bytes, stream) }
                }
            }
            Op::Reduce { dst, a, b } => {
                // SAFETY: the regions are device memory of this rank (the plan reduces only into
                // the receiver's output from its own input/output and slots), `dst` is `a` or
                // disjoint (checked plan), and events order every other access.
                unsafe {
                    self.res.kernels.reduce(
                        stream,
                        call.op.combine_op(),
                        call.dtype,
                        self.addr(dst),
                        self.addr(a),
                        self.addr(b),
                        dst.count,
                    )
                }
            }
            Op::Scale { region } => {
                // SAFETY: as for Reduce.
                unsafe {
                    self.res.kernels.scale(
                        stream,
                        call.dtype,
                        self.addr(region),
                        region.count,
                        plan.world,
                    )
                }
            }
            Op::PeerReduce { dst, ranks, .. } if call.prepared.twoshot.is_some() => {
                // The two-shot: step 0 (every rank's sources) launches the rank's whole kernel;
                // the gather rounds are inside it.
                if ranks == Ranks::ALL {
                    self.launch_twoshot(plan.decl(dst.buf).rank)
                } else {
                    Ok(())
                }
            }
            op @ Op::PeerReduce { dst, .. } => {
                let shared = call.oneshot.as_ref().ok_or_else(|| {
                    Error::InvalidArgument(
                        "a one-shot plan on a communicator without one-shot resources".into(),
                    )
                })?;
                let rank = plan.decl(dst.buf).rank;
                let mut args = OneShotArgs {
                    srcs: [0; ONESHOT_MAX_RANKS],
                    flags: [0; ONESHOT_MAX_RANKS],
                    world: plan.world as u32,
                    rank: rank as u32,
                    dst: self.addr(dst),
                    count: dst.count as u64,
                    epoch: call.epoch,
                    // Three quarters of the call's deadline, from the kernel's start: a barrier
                    // that never meets ends the kernel, with its code in the error word, before
                    // the host gives up waiting.
                    timeout_ns: u64::try_from(call.timeout.as_nanos() / 4 * 3).unwrap_or(u64::MAX),
                    error: shared.errors[rank].uva_ptr(),
                    expose_from: expose_from.unwrap_or(0),
                    max_blocks: shared.max_blocks,
                };
                for (r, src) in crate::check::peer_sources(plan, &op)
                    .into_iter()
                    .enumerate()
                {
                    args.srcs[r] = self.addr(src);
                    args.flags[r] = shared.flags[r].ptr();
                }
                // SAFETY: every source lies in a buffer of its rank's GPU (checked plan; the
                // caller's validated inputs or our exposed copies), reachable from this GPU (peer
                // access enabled between all pairs at creation, pool access granted per input);
                // `dst` is this rank's output, disjoint from every source; every rank launches the
                // same grid (`oneshot_blocks` of dtype and count) with the same epoch, so the
                // barriers meet; the flags outlive the communicator's streams.
                unsafe { self.res.kernels.oneshot(call.dtype, call.op, &args, stream) }
            }
        }
    }
}
