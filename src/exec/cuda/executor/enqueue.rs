//! The enqueue of a plan on a rank's GPU streams, shared by every path: [`CudaEnqueue`] turns
//! each instruction into its CUDA work — copies (peer or staged), reduce and scale kernels,
//! event records and waits on the rank's own streams, event counters between ranks (module
//! [`super::counters`]), and the peer kernels' launches (module [`super::peer_enqueue`]). A rank
//! thread ([`gpu_rank_thread`]), a launcher thread or the caller's thread drives it for one rank
//! (`launch::enqueue_rank`), or the caller's thread for every rank at once, interleaved in the
//! checker's order (`launch::enqueue_in_order`, for ranks that share a GPU); then the caller polls each rank's completion event
//! ([`wait_done`]) and, past the deadline, names the rank that stalled ([`stalled`]).
//!
//! One cross-rank wait, whoever enqueues and whether or not the call is captured: a rank waits
//! for another rank's event through a counter in device memory (or, without peer access, in
//! pinned host memory) that the recording rank's stream advances right before its record, never
//! through the other rank's CUDA event. So ranks on different GPUs enqueue in any order, on any
//! thread — in another process too — and no rank waits on the host for a peer: the k-th signal
//! of an event pairs with the k-th wait for it on each waiting stream (`check_shape` proves
//! that a stream waits for a remote event at most once per call). The plan's record → wait
//! edges, which the checker proves race-free, hold unchanged: a counter wait's later work
//! starts after the signal, which starts after everything before the record on the recording
//! stream.
//!
//! A failed enqueue never leaves a GPU waiting forever: a counter wait gives up at three
//! quarters of the call's timeout and leaves a code naming the event in its rank's error word.
//!
//! Invariant: inside a collective a rank's enqueue only enqueues — no allocation, no event
//! creation, no host synchronisation.

use super::counters::wait_code;
use super::launch::enqueue_rank;
use super::peer_words::{PeerKernel, PeerWords};
use super::rank::{RankPlan, RankRes};
use super::watch::PeerWatch;
use super::{CudaCall, Dispatch};
use crate::device;
use crate::error::{Error, Result};
use crate::exec::cuda::kernels::ERR_PEER_LOST;
use crate::plan::{BufId, EventId, Instr, Op, Region, StreamKind, Tag};
use crossbeam_channel::Receiver;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A rank's thread: enqueues its rank's program of each call it is handed (the calls whose
/// ranks cross counters: long programs, enqueued on every rank at once).
pub(super) fn gpu_rank_thread(
    res: Arc<RankRes>,
    peer: Option<Arc<PeerWords>>,
    calls: Receiver<Arc<CudaCall>>,
) {
    let rank = res.rank;
    while let Some(call) = next_call(&calls) {
        let result = enqueue_rank(&res, peer.as_deref(), &call);
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

/// Polls the rank's completion event until it fires, the call is aborted or the deadline passes,
/// resting between polls as [`crate::exec::pace::COMPLETION`] says.
///
/// Every few milliseconds it also asks the fabric for a lost peer (a rank of another process
/// that is gone): then it gives the call up (`RankRes::give_up`), and the rank's kernels stop
/// waiting for that peer at once instead of at their deadline; the call's error names the peer
/// (`CudaExecutor::check_error_words`).
pub(super) fn wait_done(res: &RankRes, call: &CudaCall) -> Result<()> {
    let rank = res.rank;
    let start = Instant::now();
    let mut watch = PeerWatch::new(start);
    loop {
        if device::event_query(&res.done)? {
            return Ok(());
        }
        if call.abort.load(Ordering::Acquire) {
            return Err(crate::exec::aborted(rank));
        }
        let now = Instant::now();
        if watch.gives_up(&*call.fabric, now) {
            res.give_up(ERR_PEER_LOST);
        }
        if now >= call.deadline {
            return Err(stalled(call, rank, res));
        }
        crate::exec::pace::COMPLETION.rest(now - start);
    }
}

/// The error for a call that rank `rank` did not finish by its deadline, from what this rank
/// alone can tell (a code a kernel of any rank left in its error word names more, and callers
/// report that first: `CudaExecutor::check_error_words`): if the rank's entry event has not
/// completed, it never started the collective (work queued before it on its Main stream is
/// stuck); else its GPU is stuck in the call. Only this rank's own events are queried.
fn stalled(call: &CudaCall, rank: usize, res: &RankRes) -> Error {
    let prepared = call.plan_of(rank);
    let mut never_started = false;
    for (decl, event) in prepared.plan.events.iter().zip(&prepared.events) {
        if let (Some(event), Tag::ENTRY) = (event, decl.tag) {
            match device::event_query(event) {
                Ok(done) => never_started |= !done,
                // A query that fails reports an error of the GPU's work: that is the answer.
                Err(err) => return err,
            }
        }
    }
    Error::Timeout {
        rank,
        waiting_on: if never_started {
            "never started the collective: work queued on its Main stream before the call did not finish".into()
        } else {
            format!("did not finish the collective on GPU {}", res.device)
        },
        after: call.timeout,
    }
}

/// Records the rank's completion event on Main after its part of `call`, for a call that waits
/// for its completion (`wait_done` polls it) — not for an enqueue-only call (a driver call per
/// rank saved on the path whose cost is the host's; what waits for enqueued work polls the
/// streams), nor in a capture, where the record would be a node of the caller's graph that the
/// host cannot poll.
pub(super) fn record_done(res: &RankRes, call: &CudaCall) -> Result<()> {
    match (call.captured, call.wait_complete) {
        (false, true) => device::record(&res.done, res.stream(StreamKind::Main)),
        _ => Ok(()),
    }
}

/// A rank's view while enqueuing its program of one call.
pub(super) struct CudaEnqueue<'a> {
    /// The rank whose program this enqueues.
    pub(super) rank: usize,
    pub(super) res: &'a RankRes,
    /// The rank's peer-kernel words, where the peer kernels can run.
    pub(super) peer: Option<&'a PeerWords>,
    /// The rank's resources of the call's plan.
    pub(super) plan: &'a RankPlan,
    pub(super) call: &'a CudaCall,
    /// The source of an [`Op::Expose`] held back for the one-shot meeting right after it (the
    /// checker proved it is next): the read one-shot kernel does the copy before its start
    /// barrier, the LL one-shot sends this source instead (`ll_args`).
    expose_from: Option<u64>,
    /// Whether this rank's kernel of the call is launched: a two-shot's or a steps kernel runs
    /// all of the rank's meetings, and its first meeting launches it.
    kernel_launched: bool,
}

impl<'a> CudaEnqueue<'a> {
    /// Rank `res.rank`'s enqueue of `call`, whose resources on this rank are `plan`.
    pub(super) fn new(
        res: &'a RankRes,
        peer: Option<&'a PeerWords>,
        plan: &'a RankPlan,
        call: &'a CudaCall,
    ) -> CudaEnqueue<'a> {
        CudaEnqueue {
            rank: res.rank,
            res,
            peer,
            plan,
            call,
            expose_from: None,
            kernel_launched: false,
        }
    }
}

impl CudaEnqueue<'_> {
    /// The base address of plan buffer `buf` as this rank reaches it: the plan's own (a rank's
    /// staging or exposed copy, imported from a peer's record where it is the peer's), else the
    /// caller's buffer of this call.
    pub(super) fn base(&self, buf: BufId) -> u64 {
        match self.plan.addrs[buf.0] {
            0 => self.call.callers[buf.0],
            owned => owned,
        }
    }

    pub(super) fn addr(&self, region: Region) -> u64 {
        self.base(region.buf) + (region.offset * self.call.dtype.size_bytes()) as u64
    }

    /// Ends the rank's program: an exposure still held back had no meeting after it, which the
    /// checker rules out.
    pub(super) fn finish(&mut self) -> Result<()> {
        match self.expose_from.take() {
            Some(_) => Err(Error::Internal {
                what: format!("rank {}'s program ends with an exposure", self.rank),
            }),
            None => Ok(()),
        }
    }
}

impl CudaEnqueue<'_> {
    /// Enqueues the rank's next instruction; an exposure before a one-shot meeting is held
    /// back for that meeting's kernel ([`Op::Expose`] says what an executor may do with it),
    /// whose launch fuses it (`expose_from`).
    pub(super) fn enqueue(&mut self, instr: &Instr) -> Result<()> {
        if let (Op::Expose { src, .. }, Dispatch::OneShot { .. }) = (instr.op, &*self.plan.dispatch)
        {
            self.expose_from = Some(self.addr(src));
            return Ok(());
        }
        let expose_from = self.expose_from.take();
        if expose_from.is_some() && !matches!(instr.op, Op::PeerReduce { .. }) {
            return Err(Error::Internal {
                what: format!(
                    "rank {}'s exposure is not followed by its meeting",
                    self.rank
                ),
            });
        }
        let call = self.call;
        let plan = &*self.plan.plan;
        let stream = self.res.stream(instr.stream);
        let eb = call.dtype.size_bytes();
        match instr.op {
            Op::Record(e) => {
                // The other ranks' signals first, then the record, so that in a capture the
                // record stays the stream's last work that Main joins (a capture must end with
                // every stream joined) and still follows everything the event marks.
                self.signal_waiters(e, stream)?;
                device::record(self.own_event(e)?, stream)
            }
            Op::Wait(e) if plan.events[e.0].rank != self.rank => {
                self.wait_for_signal(e, instr.stream, stream)
            }
            Op::Wait(e) => device::wait(stream, self.own_event(e)?),
            Op::Copy { src, dst } | Op::Expose { src, dst } => {
                // One kind of copy, by address (unified addressing), whichever ranks' memory the
                // ends are in: a peer's, over peer access (or, without it, through the host, as
                // the driver does it); pinned host memory; or this rank's.
                // SAFETY: both regions lie in buffers of the plan — the caller's validated
                // buffers, or staging and exposed copies the ranks own, addresses imported
                // through the fabric — which stay allocated until the call completes, and the
                // race-free plan orders every other access.
                unsafe {
                    device::memcpy_async(self.addr(dst), self.addr(src), src.count * eb, stream)
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
                // SAFETY: as for Reduce; the error word is this rank's, host-mapped. (A code
                // there — the call's gate or peer kernel failed — leaves the region unscaled:
                // a mismatched Avg touches no caller's buffer.)
                unsafe {
                    self.res.kernels.scale(
                        stream,
                        call.dtype,
                        self.addr(region),
                        region.count,
                        plan.world,
                        self.res.error_word(),
                    )
                }
            }
            op @ Op::PeerReduce { dst, .. } => match &*self.plan.dispatch {
                // The two-shot and a one-shot collective: the rank's first meeting launches its
                // kernel, which runs all of the rank's meetings with the plan's barriers
                // (`layout` verified them against the kernel's); the others are inside it.
                _ if self.kernel_launched => Ok(()),
                Dispatch::TwoShot { segments } => {
                    self.kernel_launched = true;
                    self.launch_twoshot(plan.decl(dst.buf).rank, segments)
                }
                Dispatch::Steps { steps } => {
                    self.kernel_launched = true;
                    self.launch_steps(self.rank, &steps[self.rank])
                }
                Dispatch::OneShot {
                    kernel: PeerKernel::OneShotLl,
                } => {
                    let args = self.ll_args(op, dst, expose_from)?;
                    // SAFETY: `args.src` is this rank's input (the caller's validated input, its
                    // in-place buffer, or our exposed copy of it, filled earlier on this stream)
                    // and `args.dst` its output, both on this GPU, equal (in place) or disjoint
                    // (validated buffers); the receive buffers are ours (ll_recv_bytes(world),
                    // zeroed at creation, reached over the peer access enabled between all pairs,
                    // or on this GPU when ranks share it) and the flags this rank's, both used
                    // only by this communicator's peer kernels, all on Main; every rank launches
                    // with the same dtype, op and count (`oneshot_kernel` decides alike on every
                    // rank), so the grids and epochs match, and the grid fits the cap that keeps
                    // every rank's blocks resident; all outlive the communicator's streams.
                    unsafe { self.res.kernels.ll(call.dtype, call.op, &args, stream) }
                }
                Dispatch::OneShot { kernel } => {
                    let args = self.oneshot_args(*kernel, op, dst, expose_from)?;
                    // SAFETY: every source lies in a buffer of its rank (checked plan; the
                    // caller's validated inputs or our exposed copies), reachable from this GPU —
                    // on its rank's GPU over the peer access enabled between all pairs at
                    // creation (pool access granted per input), or, staged, in pinned host
                    // memory every GPU maps (`check_staged` proved the plan reads nothing else of
                    // another rank, and the flags are host memory too); `dst` is this rank's
                    // output, disjoint from every source; every rank launches the same grid
                    // (`peer_blocks` of dtype and count), so the barriers meet; the flags outlive
                    // the communicator's streams.
                    unsafe { self.res.kernels.oneshot(call.dtype, call.op, &args, stream) }
                }
                Dispatch::CopyEngines => Err(Error::Internal {
                    what: "a peer reduce in a plan prepared for the copy engines".into(),
                }),
            },
        }
    }
}

impl CudaEnqueue<'_> {
    /// This rank's CUDA event `e` (the plan's events of this rank, made when it was prepared).
    fn own_event(&self, e: EventId) -> Result<&device::Event> {
        self.plan.events[e.0]
            .as_ref()
            .ok_or_else(|| Error::Internal {
                what: format!(
                    "rank {} records or waits for {} on its own streams",
                    self.rank, self.plan.plan.events[e.0]
                ),
            })
    }

    /// For a record in a captured call: one counter signal per other rank that waits for event
    /// `e`, on the recording stream, just before the record.
    fn signal_waiters(&self, e: EventId, stream: &device::Stream) -> Result<()> {
        let Some(words) = &self.plan.counters else {
            return Ok(()); // no event of this plan crosses ranks
        };
        for &waiter in &words.waiters[e.0] {
            // SAFETY: the words are this plan's event counters (zeroed memory of each rank that
            // the plan owns, so they live until its enqueued work is done); `sent` is this
            // rank's and only this stream (the one recording `e`) signals it; `mailbox` is the
            // waiter's — its device memory over peer access, or its pinned host memory — and
            // only this signal writes it.
            unsafe {
                self.res.kernels.counter_signal(
                    stream,
                    words.sent(e, waiter),
                    words.mailbox(waiter, e),
                )
            }?;
        }
        Ok(())
    }

    /// A wait for another rank's event `e`: a counter wait on `stream` (this rank's `kind`
    /// stream), which gives up at the kernels' deadline.
    fn wait_for_signal(&self, e: EventId, kind: StreamKind, stream: &device::Stream) -> Result<()> {
        let call = self.call;
        let Some(words) = &self.plan.counters else {
            return Err(Error::Internal {
                what: "a wait between ranks in a plan prepared without event counters".into(),
            });
        };
        // SAFETY: `mailbox` and `seen` are this rank's words of the plan's counters (owned by
        // the plan, which lives until its enqueued work is done), and only this stream waits on
        // this `seen`; the error word is this rank's pinned host word, mapped for the device,
        // alive as long as the communicator.
        unsafe {
            self.res.kernels.counter_wait(
                stream,
                words.mailbox(self.rank, e),
                words.seen(e, kind),
                call.kernel_timeout_ns(),
                self.res.error_word(),
                wait_code(call.serial, e),
            )
        }
    }
}
