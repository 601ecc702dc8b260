//! A GPU rank of a job on several hosts (the parent module's doc): within the host a
//! [`CudaExecutor`] over the `Joined` fabric among the host's ranks, across hosts an NCCL
//! communicator of its local index ([`nccl::Comm`]), and every stage enqueued in order on one
//! stream of this rank's — the intra stages through the executor's caller-stream path, the
//! inter stages as NCCL calls, the copies as `cuMemcpyAsync`, `Avg`'s division as the scale
//! kernel — with no host synchronisation between them. A caller's stream is joined to it by
//! events at both ends, so the call is ordered on the caller's stream and capturable where every
//! stage is (NCCL's calls are).
//!
//! A blocking call waits for the stream by polling, at most the communicator's timeout, and
//! looks meanwhile at NCCL's asynchronous error and the host's lost peers: a failure gives the
//! rank up on both levels (`ncclCommAbort`, the executor's abort), never a hang.
//!
//! Memory: a work buffer per rank in device memory, grown for a plan that needs more; every
//! buffer it ever had is kept until the rank closes, since a captured graph may use any of them.

use super::{compare_calls, level_error, meet, stage_op, Plans};
use crate::device::{self, CallerStream, DeviceBuffer, Event, Stream};
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::cuda::executor::{CudaConfig, CudaExecutor};
use crate::exec::cuda::kernels::KernelModule;
use crate::exec::nccl;
use crate::exec::rendezvous::Rendezvous;
use crate::exec::Shape;
use crate::plan::hierarchy::{Area, Hosts, Level, Span, Stage};
use std::time::{Duration, Instant};

/// One GPU rank of a job on several hosts (module doc).
pub(crate) struct GpuHierarchy {
    rank: usize,
    hosts: Hosts,
    device: usize,
    /// The job's rendezvous, where every call's shape is compared.
    rendezvous: Rendezvous,
    intra: CudaExecutor,
    inter: nccl::Comm,
    /// Where the stages run, in order.
    stream: Stream,
    /// `Avg`'s division.
    kernels: KernelModule,
    /// The caller's stream's work so far, for this stream to wait on; this stream's, for the
    /// caller's to wait on.
    joins: (Event, Event),
    /// Every work buffer this rank has had; the last is the current.
    works: Vec<DeviceBuffer>,
    plans: Plans,
    timeout: Duration,
}

impl GpuHierarchy {
    /// Joins this rank's host (its executor over the host's ranks, on GPU `device`) and its
    /// group across hosts (NCCL), after the job's `rendezvous` found `hosts`. Every rank first
    /// tells the others whether it found NCCL, so that a rank without it is named on all
    /// (before any rank waits in NCCL's creation for it).
    pub(crate) fn join(
        mut rendezvous: Rendezvous,
        hosts: Hosts,
        device: usize,
        config: CudaConfig,
        fingerprint: u64,
    ) -> Result<GpuHierarchy> {
        let rank = rendezvous.rank();
        let (h, l) = (hosts.host_of(rank), hosts.local_of(rank));
        let found = nccl::Library::require("GPU ranks on several hosts");
        let told = rendezvous.all_gather(&[u64::from(found.is_err())])?;
        if let Err(e) = found {
            return Err(Error::NoInterHost {
                hosts: hosts.hosts,
                why: e.to_string(),
            });
        }
        if let Some(q) = told.iter().position(|r| r.first() != Some(&0)) {
            return Err(Error::NoInterHost {
                hosts: hosts.hosts,
                why: format!("rank {q} found no NCCL (libnccl.so.2) to carry them between hosts"),
            });
        }
        let ids = meet(&mut rendezvous, hosts, || nccl::unique_id(device))?;
        let timeout = config.timeout;
        let local = Rendezvous::join(&ids.local, l, hosts.local, fingerprint, timeout)
            .map_err(|e| level_error(Level::Intra, hosts, rank, e))?;
        let intra = CudaExecutor::for_rank(local, &ids.local, device, config)
            .map_err(|e| level_error(Level::Intra, hosts, rank, e))?;
        let inter = nccl::Comm::join(&ids.group, h, hosts.hosts, device)
            .map_err(|e| level_error(Level::Inter, hosts, rank, e))?;
        let ctx = device::context(device)?;
        Ok(GpuHierarchy {
            rank,
            hosts,
            device,
            rendezvous,
            intra,
            inter,
            stream: Stream::new(&ctx)?,
            kernels: KernelModule::new(&ctx)?,
            joins: (Event::new(&ctx)?, Event::new(&ctx)?),
            works: Vec::new(),
            plans: Plans::new(hosts),
            timeout,
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

    /// Runs one collective on this rank's `input` and `output` (device addresses of this
    /// rank's GPU; in place, `output` alone), ordered on `caller`'s stream if given (else on
    /// this rank's own), and with `wait_complete` returns once it is complete. A failure gives
    /// the rank up on both levels.
    ///
    /// # Safety
    /// `input` and `output` are valid for the collective's lengths on this rank and untouched
    /// by anything not ordered after the call on its stream until the call completes there;
    /// `caller` is a live stream of this GPU's primary context.
    pub(crate) unsafe fn run<T: Element>(
        &mut self,
        shape: Shape,
        input: Option<u64>,
        output: Option<u64>,
        op: ReduceOp,
        wait_complete: bool,
        caller: Option<CallerStream>,
    ) -> Result<()> {
        // SAFETY: our caller's contract, passed on.
        let result = unsafe { self.stages::<T>(shape, input, output, op, caller) }.and_then(|()| {
            match wait_complete {
                true => self.wait(),
                false => Ok(()),
            }
        });
        if result.is_err() {
            self.give_up();
        }
        result
    }

    /// Gives this rank up on both levels and the job's rendezvous.
    fn give_up(&mut self) {
        self.intra.abort_handle().abort();
        self.inter.abort();
        self.rendezvous.abandon();
    }

    /// # Safety
    /// As for [`GpuHierarchy::run`].
    unsafe fn stages<T: Element>(
        &mut self,
        shape: Shape,
        input: Option<u64>,
        output: Option<u64>,
        op: ReduceOp,
        caller: Option<CallerStream>,
    ) -> Result<()> {
        let (rank, hosts) = (self.rank, self.hosts);
        compare_calls(&mut self.rendezvous, &shape, T::DTYPE, op)?;
        let plan = self.plans.get(&shape, op)?;
        let op = stage_op(&plan, op);
        let eb = std::mem::size_of::<T>();
        let work = self.work(plan.work * eb)?;
        let at = |span: &Span| -> Result<u64> {
            let base = match span.area {
                Area::Input => input,
                Area::Output => output,
                Area::Work => Some(work),
            };
            let base = base.ok_or_else(|| Error::Internal {
                what: format!(
                    "a hierarchical stage names the rank's {:?}, which it lacks",
                    span.area
                ),
            })?;
            Ok(base + (span.offset(hosts, rank) * eb) as u64)
        };
        if let Some(c) = caller {
            // SAFETY: `c` is live (our caller's contract) and of this GPU's context.
            unsafe { device::record_on_raw_stream(&self.joins.0, c.raw())? };
            device::wait(&self.stream, &self.joins.0)?;
        }
        let on_stream = CallerStream::of(self.stream.cudarc());
        for stage in &plan.stages {
            match stage {
                Stage::Copy { who, src, dst } if who.includes(hosts, rank) => {
                    // SAFETY: both ranges lie in this rank's buffers (the plan was proven
                    // against their lengths) and are disjoint; ordered on the stream.
                    unsafe {
                        device::memcpy_async(at(dst)?, at(src)?, src.count * eb, &self.stream)?
                    };
                }
                Stage::Scale { who, span } if who.includes(hosts, rank) => {
                    // SAFETY: as above; the kernel runs on the stream, after what wrote it.
                    unsafe {
                        self.kernels.scale(
                            &self.stream,
                            T::DTYPE,
                            at(span)?,
                            span.count,
                            hosts.world(),
                        )?
                    };
                }
                Stage::Collective {
                    level,
                    who,
                    collective,
                    count,
                    src,
                    span,
                } if who.includes(hosts, rank) => {
                    let dst = at(span)?;
                    let from = src.as_ref().map(&at).transpose()?;
                    let ran = match level {
                        Level::Intra => {
                            let local = hosts.local;
                            let l = hosts.local_of(rank);
                            let shape = Shape::collective::<T>(
                                collective.clone(),
                                *count,
                                from.is_none(),
                                op,
                            );
                            let (mut ins, mut outs) = (vec![0u64; local], vec![0u64; local]);
                            outs[l] = dst;
                            if let Some(f) = from {
                                ins[l] = f;
                            }
                            // SAFETY: this rank's ranges, ordered on the stream (the executor
                            // waits on it before and makes it wait after).
                            unsafe {
                                self.intra.run::<T>(
                                    shape,
                                    &ins,
                                    &outs,
                                    op,
                                    false,
                                    Some(&[on_stream]),
                                )
                            }
                        }
                        // SAFETY: as above, on this GPU's stream.
                        Level::Inter => unsafe {
                            self.inter.collective(
                                collective,
                                *count,
                                T::DTYPE,
                                op,
                                from,
                                dst,
                                self.stream.raw().cast(),
                            )
                        },
                    };
                    ran.map_err(|e| level_error(*level, hosts, rank, e))?;
                }
                _ => {}
            }
        }
        if let Some(c) = caller {
            device::record(&self.joins.1, &self.stream)?;
            // SAFETY: `c` is live and of this GPU's context; the event is ours.
            unsafe { device::wait_on_raw_stream(self.stream.context(), c.raw(), &self.joins.1)? };
        }
        Ok(())
    }

    /// The current work buffer's address, grown to `bytes` first where it is smaller.
    fn work(&mut self, bytes: usize) -> Result<u64> {
        if self.works.last().is_none_or(|w| w.len_bytes() < bytes) {
            let ctx = device::context(self.device)?;
            self.works.push(DeviceBuffer::new(&ctx, bytes.max(256))?);
        }
        Ok(self.works.last().map_or(0, DeviceBuffer::ptr))
    }

    /// Waits for the stream, at most the timeout, looking at both levels' failures meanwhile.
    pub(crate) fn wait(&mut self) -> Result<()> {
        let (rank, hosts) = (self.rank, self.hosts);
        let deadline = Instant::now() + self.timeout;
        loop {
            if device::stream_query(&self.stream)? {
                return self
                    .intra
                    .poll_health()
                    .map_err(|e| level_error(Level::Intra, hosts, rank, e));
            }
            self.health()?;
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    rank,
                    waiting_on: "its hierarchical collective's stages on its GPU".into(),
                    after: self.timeout,
                });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// A failure either level has met without a call returning it (NCCL's asynchronous error,
    /// a lost peer within the host, an error of the executor's streams). Never waits.
    pub(crate) fn health(&self) -> Result<()> {
        let (rank, hosts) = (self.rank, self.hosts);
        self.inter
            .async_error()
            .map_err(|e| level_error(Level::Inter, hosts, rank, e))?;
        if let Some(lost) = self.intra.lost_peer() {
            return Err(level_error(Level::Intra, hosts, rank, lost));
        }
        self.intra
            .poll_health()
            .map_err(|e| level_error(Level::Intra, hosts, rank, e))
    }

    /// Every rank's `words`, by rank, over the job's rendezvous (a collective step).
    pub(crate) fn exchange(&mut self, words: &[u64]) -> Result<Vec<Vec<u64>>> {
        self.rendezvous.all_gather(words)
    }

    /// A handle that gives the rank's host level up from any thread (the executor's).
    pub(crate) fn abort_handle(&self) -> crate::comm::AbortHandle {
        self.intra.abort_handle()
    }

    /// Waits for what the rank enqueued, then releases NCCL's communicator and the executor.
    pub(crate) fn shutdown(mut self) -> Result<()> {
        let waited = self.wait();
        let GpuHierarchy {
            intra,
            inter,
            stream,
            works,
            ..
        } = self;
        let inter = match &waited {
            Ok(()) => inter.close(),
            Err(_) => {
                drop(inter);
                Ok(())
            }
        };
        let intra = intra.shutdown();
        // Memory goes only once the stream is idle: a stage still running may touch it.
        if waited.is_ok() {
            drop(works);
            drop(stream);
        } else {
            std::mem::forget(works);
            std::mem::forget(stream);
        }
        waited.and(inter).and(intra)
    }
}
