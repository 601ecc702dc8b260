//! A GPU rank of a job on several hosts (the parent module's doc): within the host a
//! [`CudaExecutor`] over the `Joined` fabric among the host's ranks, across hosts an NCCL
//! communicator of its local index ([`nccl::Comm`]), and every stage enqueued in order on one
//! stream of this rank's — the intra stages through the executor's caller-stream path, the
//! inter stages as NCCL calls, the copies as `cuMemcpyAsync`, `Avg`'s division as the scale
//! kernel — with no host synchronisation between them. A caller's stream is joined to it by
//! events at both ends (the end join is made even when enqueueing failed halfway, so the
//! caller's stream never runs ahead of stages already queued), so the call is ordered on the
//! caller's stream and capturable where every stage is (NCCL's calls are; run each shape once
//! before capturing it, as on one host: a work buffer that would have to grow is refused
//! under capture with [`Error::NotCapturable`]).
//!
//! Creation never waits in NCCL for a rank that failed: the ranks tell each other over the
//! job's rendezvous whether they found NCCL and whether they joined their host, before any of
//! them calls NCCL, and NCCL's creation is awaited at most the timeout (a member that dies in
//! between leaves the others' NCCL creation running on a thread of its own, given up on).
//!
//! A blocking call waits for the stream by polling, at most the communicator's timeout, and
//! looks meanwhile at NCCL's asynchronous error and the host's lost peers. A failure gives the
//! rank up on every level — the executor's kernels stopped where they wait, NCCL aborted, the
//! job's rendezvous closed — and waits for the stream to drain before returning; memory a
//! stream that never drains may still touch is leaked on purpose, never freed.
//!
//! Send/recv runs whole on NCCL's communicator of the job (made at the first send/recv, by every
//! rank together), its transfers to the rank itself as copies on the stream.
//!
//! Memory: a work buffer per rank in device memory, grown for a plan that needs more; every
//! buffer it ever had is kept until the rank closes, since a captured graph may use any of them.

mod stages;

use super::{
    compare_calls, job_error, job_group_id, level_error, lost_rank, meet, stage_op, Plans,
};
use crate::device::{self, CallerStream, DeviceBuffer, Event, Stream};
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::cuda::executor::{CudaConfig, CudaExecutor};
use crate::exec::cuda::kernels::KernelModule;
use crate::exec::nccl;
use crate::exec::rendezvous::Rendezvous;
use crate::exec::Shape;
use crate::plan::hierarchy::{Hosts, Level};
use crate::plan::Collective;
use cudarc::driver::sys::CUstreamCaptureStatus;
use stages::Areas;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a GPU rank of a job on several hosts holds on its GPU, dropped in the order `Drop`
/// gives it.
struct Parts {
    intra: CudaExecutor,
    inter: nccl::Comm,
    /// NCCL's communicator of the whole job, for send/recv: made at the first send/recv.
    job: Option<nccl::Comm>,
    /// Where the stages run, in order.
    stream: Stream,
    /// `Avg`'s division.
    kernels: Arc<KernelModule>,
    /// The caller's stream's work so far, for this stream to wait on; this stream's, for the
    /// caller's to wait on.
    joins: (Event, Event),
    /// Every work buffer this rank has had; the last is the current.
    works: Vec<DeviceBuffer>,
}

/// One GPU rank of a job on several hosts (module doc).
pub(crate) struct GpuHierarchy {
    rank: usize,
    hosts: Hosts,
    device: usize,
    /// The job's rendezvous, where every call's shape is compared.
    rendezvous: Rendezvous,
    /// `None` once shut down.
    parts: Option<Parts>,
    plans: Plans,
    timeout: Duration,
    /// The stream did not drain after a failure: its memory is never freed.
    stuck: bool,
}

/// Every rank's word of `ok`, over the job's rendezvous: this rank's `failure` first, then the
/// first rank that reported one, as `named` says.
fn all_ok<T>(
    rendezvous: &mut Rendezvous,
    mine: Result<T>,
    named: impl Fn(usize) -> Error,
) -> Result<T> {
    let told = rendezvous.all_gather(&[u64::from(mine.is_err())])?;
    let mine = mine?;
    match told.iter().position(|r| r.first() != Some(&0)) {
        Some(q) => Err(named(q)),
        None => Ok(mine),
    }
}

impl GpuHierarchy {
    /// Joins this rank's host (its executor over the host's ranks, on GPU `device`) and its
    /// group across hosts (NCCL), after the job's `rendezvous` found `hosts` (module doc).
    pub(crate) fn join(
        mut rendezvous: Rendezvous,
        hosts: Hosts,
        device: usize,
        config: CudaConfig,
        fingerprint: u64,
    ) -> Result<GpuHierarchy> {
        let rank = rendezvous.rank();
        let (h, l) = (hosts.host_of(rank), hosts.local_of(rank));
        let found =
            nccl::Library::require("GPU ranks on several hosts").map_err(|e| Error::NoInterHost {
                hosts: hosts.hosts,
                why: e.to_string(),
            });
        all_ok(&mut rendezvous, found, |q| Error::NoInterHost {
            hosts: hosts.hosts,
            why: format!("rank {q} found no NCCL (libnccl.so.2) to carry them between hosts"),
        })?;
        let ids = meet(&mut rendezvous, hosts, || nccl::unique_id(device))?;
        let timeout = config.timeout;
        let intra = Rendezvous::join(&ids.local, l, hosts.local, fingerprint, timeout)
            // No point-to-point channel: a job across hosts runs its groups as one exchange.
            .and_then(|local| {
                let config = CudaConfig {
                    peer_groups: false,
                    ..config
                };
                CudaExecutor::for_rank(local, &ids.local, device, config)
            })
            .map_err(|e| level_error(Level::Intra, hosts, rank, e));
        let intra = all_ok(&mut rendezvous, intra, |q| Error::RankFailed {
            rank: q,
            during: "joining the ranks of its host".into(),
            message: "its own error says why".into(),
        })?;
        let inter = nccl::Comm::join_within(&ids.group, h, hosts.hosts, device, timeout)
            .map_err(|e| level_error(Level::Inter, hosts, rank, e))?;
        let ctx = device::context(device)?;
        let parts = Parts {
            intra,
            inter,
            job: None,
            stream: Stream::new(&ctx)?,
            kernels: KernelModule::shared(&ctx)?,
            joins: (Event::new(&ctx)?, Event::new(&ctx)?),
            works: Vec::new(),
        };
        Ok(GpuHierarchy {
            rank,
            hosts,
            device,
            rendezvous,
            parts: Some(parts),
            plans: Plans::new(hosts),
            timeout,
            stuck: false,
        })
    }

    /// How the ranks lie on the hosts.
    pub(crate) fn hosts(&self) -> Hosts {
        self.hosts
    }

    /// The GPU this rank runs on.
    pub(crate) fn device(&self) -> usize {
        self.device
    }

    fn parts(&mut self) -> Result<&mut Parts> {
        self.parts.as_mut().ok_or(Error::Closed)
    }

    /// Runs one collective on this rank's buffers — `inputs` and `outputs` as the executor takes
    /// them (this rank's at its index; a send/recv's transfer i's ends at index i; device
    /// addresses of this rank's GPU, 0 where it passes none) — ordered on `caller`'s stream if
    /// given (else on this rank's own), and with `wait_complete` returns once it is complete.
    /// What this rank can judge alone (a stream of another GPU; under capture, a work buffer to
    /// grow or the job's communicator to make) is refused before the peers hear of the call;
    /// any later failure gives the rank up on every level.
    ///
    /// # Safety
    /// The buffers at `inputs` and `outputs` are valid for the collective's lengths on this
    /// rank and untouched by anything not ordered after the call on its stream until the call
    /// completes there; `caller` is a live stream of this GPU's primary context.
    pub(crate) unsafe fn run<T: Element>(
        &mut self,
        shape: Shape,
        inputs: &[u64],
        outputs: &[u64],
        op: ReduceOp,
        wait_complete: bool,
        caller: Option<CallerStream>,
    ) -> Result<()> {
        // The calls below make this GPU's context current (NCCL works on the current one): the
        // caller's is put back at the end.
        let saved = device::save_current()?;
        self.refuse_locally::<T>(&shape, op, caller)?;
        // SAFETY: our caller's contract, passed on.
        let result =
            unsafe { self.stages::<T>(shape, inputs, outputs, op, caller) }.and_then(|()| {
                match wait_complete {
                    true => self.wait(),
                    false => Ok(()),
                }
            });
        let result = result.map_err(|err| {
            let err = self.name_the_lost(err);
            self.give_up_naming(lost_rank(&err));
            err
        });
        result.and(saved.restore())
    }

    /// `err` naming the rank whose loss caused it, where NCCL's error named none: NCCL reports a
    /// peer that died as a failed connection, not as a rank. The job's ranks then meet once more
    /// over the rendezvous (at most the timeout): a dead rank's connection is closed, and a rank
    /// that gave up because it lost one said which ([`Rendezvous::abandon_naming`]), so the
    /// meeting fails naming it on every rank. Where everyone answers, `err` stands as it was.
    fn name_the_lost(&mut self, err: Error) -> Error {
        let from_nccl = |e: &Error| match e {
            Error::Level { source, .. } => matches!(**source, Error::Nccl { .. }),
            _ => matches!(e, Error::Nccl { .. }),
        };
        if !from_nccl(&err) {
            return err;
        }
        match self.rendezvous.barrier() {
            Err(lost) if lost_rank(&lost).is_some_and(|q| q != self.rank) => Error::Level {
                level: Level::Inter.name(),
                rank: self.rank,
                source: Box::new(Error::RankFailed {
                    rank: lost_rank(&lost).unwrap_or(self.rank),
                    during: "a collective across hosts".into(),
                    message: format!("{lost}; NCCL said: {err}"),
                }),
            },
            _ => err,
        }
    }

    /// [`GpuHierarchy::give_up`], telling the job's other ranks which rank this one lost
    /// (`lost`, where it is another rank) so that they name it, not this one.
    fn give_up_naming(&mut self, lost: Option<usize>) {
        if let Some(q) = lost.filter(|&q| q != self.rank) {
            self.rendezvous.abandon_naming(q);
        }
        self.give_up();
    }

    /// What this rank refuses on its own, before any peer hears of the call.
    fn refuse_locally<T: Element>(
        &mut self,
        shape: &Shape,
        op: ReduceOp,
        caller: Option<CallerStream>,
    ) -> Result<()> {
        let Some(c) = caller else {
            return Ok(());
        };
        if c.device() != self.device {
            return Err(Error::InvalidArgument(format!(
                "rank {}'s stream is on GPU {}, and the rank runs on GPU {}",
                self.rank,
                c.device(),
                self.device
            )));
        }
        let capturing = c.capture_status()? != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        if let Collective::SendRecv { .. } = shape.collective {
            if capturing && self.parts()?.job.is_none() {
                return Err(Error::NotCapturable {
                    reason: "the job's NCCL communicator for send/recv is made at the first \
                             send/recv: run one before capturing"
                        .into(),
                });
            }
            return Ok(());
        }
        let plan = self.plans.get(shape, op)?;
        let bytes = plan.work * std::mem::size_of::<T>();
        let have = self
            .parts()?
            .works
            .last()
            .map_or(0, DeviceBuffer::len_bytes);
        if capturing && bytes > have {
            return Err(Error::NotCapturable {
                reason: format!(
                    "this shape needs a work buffer of {bytes} bytes on rank {} and it has {have}: \
                     run the shape once before capturing it",
                    self.rank
                ),
            });
        }
        Ok(())
    }

    /// Gives this rank up on every level (module doc), then waits for its stream to drain (at
    /// most the timeout); a stream that does not drain marks the rank stuck.
    fn give_up(&mut self) {
        self.rendezvous.abandon();
        let Some(parts) = self.parts.as_mut() else {
            return;
        };
        parts.intra.stop_kernels();
        parts.intra.abort_handle().abort();
        parts.inter.abort();
        if let Some(job) = parts.job.as_mut() {
            job.abort();
        }
        let deadline = Instant::now() + self.timeout;
        loop {
            match device::stream_query(&parts.stream) {
                Ok(true) => return,
                // A stream in an error state never drains: nothing it holds is freed.
                Err(_) => break,
                Ok(false) if Instant::now() >= deadline => break,
                Ok(false) => std::thread::sleep(Duration::from_micros(200)),
            }
        }
        self.stuck = true;
    }

    /// # Safety
    /// As for [`GpuHierarchy::run`].
    unsafe fn stages<T: Element>(
        &mut self,
        shape: Shape,
        inputs: &[u64],
        outputs: &[u64],
        op: ReduceOp,
        caller: Option<CallerStream>,
    ) -> Result<()> {
        compare_calls(&mut self.rendezvous, &shape, T::DTYPE, op)?;
        let (rank, hosts, device) = (self.rank, self.hosts, self.device);
        let eb = std::mem::size_of::<T>();
        let plan = match &shape.collective {
            Collective::SendRecv { .. } => {
                self.job_comm()?;
                None
            }
            _ => Some(self.plans.get(&shape, op)?),
        };
        let parts = self.parts.as_mut().ok_or(Error::Closed)?;
        let work = parts.work(device, plan.as_ref().map_or(0, |p| p.work) * eb)?;
        if let Some(c) = caller {
            // SAFETY: `c` is live (our caller's contract) and of this GPU's context (checked).
            unsafe { device::record_on_raw_stream(&parts.joins.0, c.raw())? };
            device::wait(&parts.stream, &parts.joins.0)?;
        }
        let own = |addresses: &[u64]| addresses.get(rank).copied().filter(|&a| a != 0);
        let areas = Areas {
            input: own(inputs),
            output: own(outputs),
            work,
            hosts,
            rank,
            eb,
        };
        // SAFETY: our caller's contract, passed on.
        let enqueued = unsafe {
            match (&shape.collective, &plan) {
                (Collective::SendRecv { transfers }, _) => {
                    parts.send_recv::<T>(transfers, inputs, outputs, rank)
                }
                (_, Some(plan)) => parts.enqueue::<T>(&plan.stages, &areas, stage_op(plan, op)),
                (_, None) => Ok(()),
            }
        };
        // The caller's stream waits for whatever was enqueued, even after a failure halfway.
        let joined = match caller {
            Some(c) => device::record(&parts.joins.1, &parts.stream).and_then(|()| {
                // SAFETY: `c` is live and of this GPU's context; the event is ours.
                unsafe {
                    device::wait_on_raw_stream(parts.stream.context(), c.raw(), &parts.joins.1)
                }
            }),
            None => Ok(()),
        };
        enqueued.and(joined)
    }

    /// The job's NCCL communicator for send/recv, made now if this is the first send/recv (every
    /// rank makes the same calls, so every rank comes here together).
    fn job_comm(&mut self) -> Result<()> {
        if self.parts()?.job.is_some() {
            return Ok(());
        }
        let (rank, device, world, timeout) =
            (self.rank, self.device, self.hosts.world(), self.timeout);
        let id = job_group_id(&mut self.rendezvous, || nccl::unique_id(device))?;
        let job = nccl::Comm::join_within(&id, rank, world, device, timeout)
            .map_err(|e| job_error(rank, e))?;
        self.parts()?.job = Some(job);
        Ok(())
    }

    /// Waits for the stream, at most the timeout, looking at both levels' failures meanwhile.
    pub(crate) fn wait(&mut self) -> Result<()> {
        self.wait_stream().map_err(|e| self.name_the_lost(e))
    }

    fn wait_stream(&mut self) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let idle = device::stream_query(&self.parts()?.stream)?;
            self.health()?;
            if idle {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    rank: self.rank,
                    waiting_on: "its hierarchical collective's stages on its GPU".into(),
                    after: self.timeout,
                });
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// A failure either level has met without a call returning it (NCCL's asynchronous error,
    /// a lost peer within the host, an error of the executor's streams). Never waits.
    pub(crate) fn health(&self) -> Result<()> {
        let (rank, hosts) = (self.rank, self.hosts);
        let parts = self.parts.as_ref().ok_or(Error::Closed)?;
        parts
            .inter
            .async_error()
            .map_err(|e| level_error(Level::Inter, hosts, rank, e))?;
        if let Some(job) = &parts.job {
            job.async_error().map_err(|e| job_error(rank, e))?;
        }
        if let Some(lost) = parts.intra.lost_peer() {
            parts.intra.stop_kernels();
            return Err(level_error(Level::Intra, hosts, rank, lost));
        }
        parts
            .intra
            .poll_health()
            .map_err(|e| level_error(Level::Intra, hosts, rank, e))
    }

    /// Every rank's `words`, by rank, over the job's rendezvous (a collective step).
    pub(crate) fn exchange(&mut self, words: &[u64]) -> Result<Vec<Vec<u64>>> {
        self.rendezvous.all_gather(words)
    }

    /// A handle that gives the rank's host level up from any thread (the executor's).
    pub(crate) fn abort_handle(&self) -> crate::comm::AbortHandle {
        match &self.parts {
            Some(parts) => parts.intra.abort_handle(),
            None => crate::comm::AbortHandle::none(),
        }
    }

    /// Waits for what the rank enqueued, then releases NCCL's communicator and the executor;
    /// after a failure, gives up first and frees only what no stream may still touch.
    pub(crate) fn shutdown(mut self) -> Result<()> {
        let waited = self.wait();
        if let Err(err) = &waited {
            self.give_up_naming(lost_rank(err));
        }
        let released = self.teardown(waited.is_ok(), true);
        waited.and(released)
    }

    /// Releases what the rank holds on its GPU, NCCL's communicators before the executor:
    /// NCCL's closed (each release awaited at most the timeout) where `close_nccl` (the stream
    /// drained) else aborted, the executor shut down (waiting for its streams, bounded) where
    /// `shut_executor` else dropped, and the stream, kernels, events and work buffers freed — or
    /// leaked where the stream never drained.
    fn teardown(&mut self, close_nccl: bool, shut_executor: bool) -> Result<()> {
        let Some(parts) = self.parts.take() else {
            return Ok(());
        };
        let Parts {
            intra,
            inter,
            job,
            stream,
            kernels,
            joins,
            works,
        } = parts;
        let nccl = match close_nccl {
            true => {
                let (rank, timeout) = (self.rank, self.timeout);
                let close = |comm: nccl::Comm| comm.close_within(rank, timeout);
                close(inter).and(job.map_or(Ok(()), close))
            }
            false => {
                drop((inter, job));
                Ok(())
            }
        };
        let intra = match shut_executor {
            true => intra.shutdown(),
            false => {
                drop(intra);
                Ok(())
            }
        };
        release(self.stuck, (stream, kernels, joins, works));
        nccl.and(intra)
    }
}

impl Drop for GpuHierarchy {
    /// Dropped without [`GpuHierarchy::shutdown`]: anything still queued is given up on (never
    /// waited for past the timeout), NCCL is aborted before the executor goes, and memory a
    /// stream may still touch is leaked, never freed.
    fn drop(&mut self) {
        let busy = self
            .parts
            .as_ref()
            .is_some_and(|p| !device::stream_query(&p.stream).unwrap_or(false));
        if busy {
            self.give_up();
        }
        let _ = self.teardown(false, false);
    }
}

/// Frees the stream, kernels, events and work buffers — or, where the stream never drained
/// (`stuck`), leaks them: a stage still queued may touch them.
fn release(stuck: bool, held: (Stream, Arc<KernelModule>, (Event, Event), Vec<DeviceBuffer>)) {
    match stuck {
        true => std::mem::forget(held),
        false => drop(held),
    }
}
