//! One rank of a job whose ranks each have their own communicator: [`RankCommunicator`], NCCL's
//! `ncclCommInitRank` model — rank 0 makes a [`UniqueId`], every rank gets it by any channel and
//! joins with its rank, and each call takes this rank's buffers alone. Each rank is a process
//! of its own, as in torchrun's jobs.
//!
//! A host rank runs the host executor's plans with the others over shared memory
//! (`exec::host::process`). A GPU rank runs the GPU executor's, for its one GPU, over the
//! `Joined` fabric: its peers' memory is imported from file descriptors (`cuMemCreate` memory)
//! or legacy CUDA IPC handles, and the caller's
//! buffers are staged through memory the rank exports, so any buffer works — unless every rank
//! registered the allocation its buffers lie in ([`RankCommunicator::register`]): then the call
//! runs on them in place.
//!
//! ```no_run
//! use ringreduce::{HostConfig, RankCommunicator, ReduceOp};
//! // In each of the job's processes, started by torchrun or `ringreduce launch`:
//! let mut comm = RankCommunicator::from_env_host(HostConfig::default())?;
//! let mut grads = vec![comm.rank() as f32; 1024];
//! comm.all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
//! # Ok::<(), ringreduce::Error>(())
//! ```

use crate::buffer::{Buffer, BufferMut, Placement};
use crate::device::CallerStream;
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::cuda::executor::{CudaConfig, CudaExecutor};
use crate::exec::cuda::fabric::Fabric;
use crate::exec::hierarchy::gpu::GpuHierarchy;
use crate::exec::hierarchy::host::HostHierarchy;
use crate::exec::hierarchy::InterHostFactory;
use crate::exec::host::process::ProcessRank;
use crate::exec::host::HostConfig;
use crate::exec::job;
use crate::exec::rendezvous::{LaunchEnv, Rendezvous, UniqueId};
use crate::exec::Shape;
use crate::plan::hierarchy::Hosts;
use crate::plan::{BufKind, Collective, Transfer};
use cudarc::driver::CudaStream;
use std::sync::Arc;

/// One rank of a job whose ranks each have a communicator (module doc). Its calls block until
/// the collective is complete on this rank (the `enqueue_*_on` calls, until enqueued), and
/// every rank must make the same calls in the same order: each call starts by comparing its
/// shape with every peer's, and a rank whose call differs gets [`Error::CallMismatch`], as do
/// its peers. A call refused for its arguments (a length, a placement) changes nothing; one
/// that failed across ranks (a peer's process gone, a timeout, a mismatch) leaves the
/// communicator broken: later calls return [`Error::CommunicatorFailed`] at once; make a new
/// one with a new id.
pub struct RankCommunicator {
    rank: usize,
    world: usize,
    inner: Inner,
    /// The failure that broke this communicator: every later call returns it at once.
    broken: Option<Error>,
}

enum Inner {
    Host(ProcessRank),
    /// A host rank of a job on several hosts.
    Hosts(Box<HostHierarchy>),
    /// A GPU rank of a job on several hosts.
    GpuHosts(Box<GpuHierarchy>),
    Gpu {
        exec: CudaExecutor,
        device: usize,
    },
}

impl std::fmt::Debug for RankCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankCommunicator")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .finish()
    }
}

/// This rank's buffers of one call, by the plan's kind for each, as addresses and lengths.
struct Ends {
    reads: Vec<(BufKind, u64, usize)>,
    writes: Vec<(BufKind, u64, usize)>,
}

/// A host rank's ends as slices, read-only and writable.
///
/// # Safety
/// Each address and length came from a `Buffer` in host memory (checked by `placed`), whose
/// contract makes them valid for the buffer's elements, borrowed by the caller of the call that
/// made `ends` for as long as the slices live; each write is a `BufferMut` borrowed mutably,
/// distinct from every other buffer of the call (the borrow checker keeps a `&mut` unique). The
/// slices live no longer than that call (`'a` is chosen by the caller and bounded by nothing
/// else).
#[allow(clippy::type_complexity)]
unsafe fn host_slices<'a, T: Element>(
    ends: &Ends,
) -> (Vec<(BufKind, &'a [T])>, Vec<(BufKind, &'a mut [T])>) {
    // SAFETY: the contract above.
    let reads = ends
        .reads
        .iter()
        .map(|&(kind, addr, len)| unsafe {
            (kind, std::slice::from_raw_parts(addr as *const T, len))
        })
        .collect();
    // SAFETY: as above.
    let writes = ends
        .writes
        .iter()
        .map(|&(kind, addr, len)| unsafe {
            (kind, std::slice::from_raw_parts_mut(addr as *mut T, len))
        })
        .collect();
    (reads, writes)
}

impl RankCommunicator {
    /// Joins the job of `id` as host rank `rank` of `world`: meets every other rank at `id`'s
    /// address within `config.timeout` (every rank gets the same named error when they
    /// disagree: [`crate::exec::rendezvous`]), then maps their shared memory.
    pub fn host(
        id: &UniqueId,
        rank: usize,
        world: usize,
        config: HostConfig,
    ) -> Result<RankCommunicator> {
        super::check_host_config(world, &config)?;
        let mut rendezvous = ProcessRank::meet(id, rank, world, &config)?;
        let hosts = job::host_layout(&mut rendezvous)?;
        if hosts.hosts > 1 {
            return Err(Error::NoInterHost {
                hosts: hosts.hosts,
                why: "host ranks have no engine between hosts: make them with \
                      RankCommunicator::host_across and an InterHostFactory"
                    .into(),
            });
        }
        Ok(RankCommunicator {
            rank,
            world,
            inner: Inner::Host(ProcessRank::on(rendezvous, id, config)?),
            broken: None,
        })
    }

    /// [`RankCommunicator::host`] for a job that may span several hosts: each rank reports its
    /// host (its host name, or `RINGREDUCE_HOST_ID`), and where there are several, every call
    /// runs as a hierarchical collective ([`crate::plan::hierarchy`]): within each host on
    /// ringreduce's plans, across hosts on the engines `factory` makes, one per local index.
    /// Each host's ranks must be consecutive and every host must run as many
    /// ([`Error::HostLayout`]); the limits of `config` apply to one host's ranks. On one host
    /// this is [`RankCommunicator::host`] and `factory` is not used.
    pub fn host_across(
        id: &UniqueId,
        rank: usize,
        world: usize,
        config: HostConfig,
        factory: &dyn InterHostFactory,
    ) -> Result<RankCommunicator> {
        super::check_host_config(1, &config)?;
        let mut rendezvous = ProcessRank::meet(id, rank, world, &config)?;
        let hosts = job::host_layout(&mut rendezvous)?;
        super::check_host_config(hosts.local, &config)?;
        let inner = match hosts.hosts {
            1 => Inner::Host(ProcessRank::on(rendezvous, id, config)?),
            _ => Inner::Hosts(Box::new(HostHierarchy::join(
                rendezvous, hosts, config, factory,
            )?)),
        };
        Ok(RankCommunicator {
            rank,
            world,
            inner,
            broken: None,
        })
    }

    /// [`RankCommunicator::host`] with the rank, world and id from the launcher's variables
    /// ([`LaunchEnv::from_env`]: torchrun's, or `ringreduce launch`'s).
    pub fn from_env_host(config: HostConfig) -> Result<RankCommunicator> {
        let env = LaunchEnv::from_env()?;
        RankCommunicator::host(&env.unique_id()?, env.rank, env.world, config)
    }

    /// Joins the job of `id` as rank `rank` of `world` on this process's GPU `device`. The ranks
    /// may share GPUs only with `config.allow_shared_device`. GPUs without peer access between
    /// them (or `Transport::Staged`) move data through pinned host memory shared between the
    /// processes. Ranks on several hosts (each reports its host name, or `RINGREDUCE_HOST_ID`)
    /// run every call as a hierarchical collective ([`crate::plan::hierarchy`]): within each
    /// host on this executor, across hosts on NCCL, loaded at run time ([`crate::exec::nccl`];
    /// [`Error::NoInterHost`] on every rank where a rank finds none); the limits of `config`
    /// apply to one host's ranks.
    pub fn gpu(
        id: &UniqueId,
        rank: usize,
        world: usize,
        device: usize,
        config: CudaConfig,
    ) -> Result<RankCommunicator> {
        super::check_cuda_config(1, &config)?;
        let (algorithm, deterministic) = (config.algorithm, config.deterministic);
        let mut rendezvous =
            Rendezvous::join(id, rank, world, gpu_fingerprint(&config), config.timeout)?;
        let hosts = job::host_layout(&mut rendezvous)?;
        if hosts.hosts > 1 {
            super::check_cuda_config(hosts.local, &config)?;
            let fingerprint = gpu_fingerprint(&config);
            let inner = GpuHierarchy::join(rendezvous, hosts, device, config, fingerprint)?;
            return Ok(RankCommunicator {
                rank,
                world,
                inner: Inner::GpuHosts(Box::new(inner)),
                broken: None,
            });
        }
        super::check_cuda_config(world, &config)?;
        let exec = CudaExecutor::for_rank(rendezvous, id, device, config)?;
        super::check_deterministic_if(deterministic, algorithm, world, exec.peers_ok())?;
        Ok(RankCommunicator {
            rank,
            world,
            inner: Inner::Gpu { exec, device },
            broken: None,
        })
    }

    /// [`RankCommunicator::gpu`] with the rank, world and id from the launcher's variables, on
    /// GPU `LOCAL_RANK` — or GPU 0 where the process sees one GPU (a launcher that sets
    /// `CUDA_VISIBLE_DEVICES` per rank).
    pub fn from_env_gpu(config: CudaConfig) -> Result<RankCommunicator> {
        let env = LaunchEnv::from_env()?;
        let device = match crate::device::device_count()? {
            1 => 0,
            _ => env.local_rank,
        };
        RankCommunicator::gpu(&env.unique_id()?, env.rank, env.world, device, config)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// How the ranks lie on hosts (one host of every rank, but for a job on several hosts made
    /// by [`RankCommunicator::host_across`]).
    pub fn hosts(&self) -> Hosts {
        match &self.inner {
            Inner::Hosts(inner) => inner.hosts(),
            Inner::GpuHosts(inner) => inner.hosts(),
            _ => Hosts {
                hosts: 1,
                local: self.world,
            },
        }
    }

    /// All-reduce in place: every rank's `buf` ends holding the reduction of every rank's.
    pub fn all_reduce_in_place<T: Element, B: BufferMut<T> + ?Sized>(
        &mut self,
        buf: &mut B,
        op: ReduceOp,
    ) -> Result<()> {
        self.collective_in_place(&Collective::AllReduce, buf, op)
    }

    /// All-reduce: `output` ends holding the reduction of every rank's `input` (equal lengths).
    pub fn all_reduce<T: Element, I: Buffer<T> + ?Sized, O: BufferMut<T> + ?Sized>(
        &mut self,
        input: &I,
        output: &mut O,
        op: ReduceOp,
    ) -> Result<()> {
        self.collective(&Collective::AllReduce, Some(input), Some(output), op)
    }

    /// Any collective but send/recv ([`RankCommunicator::send_recv`]), out of place, on this
    /// rank's buffers: `input` is `None` where this rank passes none (a broadcast's non-root),
    /// `output` where it passes none (a reduce's non-root). The lengths are [`Collective`]'s
    /// table's for this rank; the count comes from them, and every rank must pass the same.
    pub fn collective<T: Element, I: Buffer<T> + ?Sized, O: BufferMut<T> + ?Sized>(
        &mut self,
        collective: &Collective,
        input: Option<&I>,
        output: Option<&mut O>,
        op: ReduceOp,
    ) -> Result<()> {
        let (shape, ends) = self.out_of_place(collective, input, output, op)?;
        self.run::<T>(shape, ends, op)
    }

    /// [`RankCommunicator::collective`] on a GPU rank, ordered on the caller's `stream`: see
    /// [`RankCommunicator::enqueue_collective_in_place_on`].
    ///
    /// # Safety
    /// `input` and `output` must stay allocated until `stream` has passed the collective, `input`
    /// unwritten and `output` untouched (on any stream or the host) meanwhile, except by work
    /// queued on `stream` after this call; captured, they must stay allocated, and this
    /// communicator open, while the graph may be replayed.
    pub unsafe fn enqueue_collective_on<
        T: Element,
        I: Buffer<T> + ?Sized,
        O: BufferMut<T> + ?Sized,
    >(
        &mut self,
        collective: &Collective,
        input: Option<&I>,
        output: Option<&mut O>,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        // SAFETY: our caller's contract, passed on (a cudarc stream is live while borrowed).
        unsafe {
            self.enqueue_collective_on_raw(collective, input, output, op, CallerStream::of(stream))
        }
    }

    /// [`RankCommunicator::all_reduce`] ordered on the caller's `stream`: see
    /// [`RankCommunicator::enqueue_collective_in_place_on`].
    ///
    /// # Safety
    /// As for [`RankCommunicator::enqueue_collective_on`].
    pub unsafe fn enqueue_all_reduce_on<
        T: Element,
        I: Buffer<T> + ?Sized,
        O: BufferMut<T> + ?Sized,
    >(
        &mut self,
        input: &I,
        output: &mut O,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        // SAFETY: our caller's contract, passed on.
        unsafe {
            self.enqueue_collective_on(
                &Collective::AllReduce,
                Some(input),
                Some(output),
                op,
                stream,
            )
        }
    }

    /// [`RankCommunicator::enqueue_collective_on`] on a stream named by its raw handle, as C
    /// callers pass it (`cudaStream_t`; [`CallerStream::from_raw`]).
    ///
    /// # Safety
    /// As for [`RankCommunicator::enqueue_collective_on`], and `stream` stays live until the
    /// call has returned.
    pub unsafe fn enqueue_collective_on_raw<
        T: Element,
        I: Buffer<T> + ?Sized,
        O: BufferMut<T> + ?Sized,
    >(
        &mut self,
        collective: &Collective,
        input: Option<&I>,
        output: Option<&mut O>,
        op: ReduceOp,
        stream: CallerStream,
    ) -> Result<()> {
        let (shape, ends) = self.out_of_place(collective, input, output, op)?;
        // SAFETY: our caller's contract, passed on.
        unsafe { self.enqueue_on::<T>(shape, ends, op, stream) }
    }

    /// [`RankCommunicator::enqueue_collective_in_place_on`] on a stream named by its raw handle
    /// (see [`RankCommunicator::enqueue_collective_on_raw`]).
    ///
    /// # Safety
    /// As for [`RankCommunicator::enqueue_collective_in_place_on`], and `stream` stays live until
    /// the call has returned.
    pub unsafe fn enqueue_collective_in_place_on_raw<T: Element, B: BufferMut<T> + ?Sized>(
        &mut self,
        collective: &Collective,
        buf: &mut B,
        op: ReduceOp,
        stream: CallerStream,
    ) -> Result<()> {
        let shape = self.in_place_shape::<T, B>(collective, buf, op)?;
        let ends = Ends {
            reads: Vec::new(),
            writes: vec![(BufKind::Output, buf.address_mut(), buf.count())],
        };
        // SAFETY: our caller's contract, passed on.
        unsafe { self.enqueue_on::<T>(shape, ends, op, stream) }
    }

    /// The shape and this rank's ends of `collective` out of place, after checking the
    /// collective, the buffers' lengths and their placement.
    fn out_of_place<T: Element, I: Buffer<T> + ?Sized, O: BufferMut<T> + ?Sized>(
        &self,
        collective: &Collective,
        input: Option<&I>,
        output: Option<&mut O>,
        op: ReduceOp,
    ) -> Result<(Shape, Ends)> {
        self.check(collective)?;
        let count = self.count_of(
            collective,
            input.map(|i| i.count()),
            output.as_ref().map(|o| o.count()),
            false,
        )?;
        let mut ends = Ends {
            reads: Vec::new(),
            writes: Vec::new(),
        };
        if let Some(i) = input {
            self.placed(i)?;
            ends.reads.push((BufKind::Input, i.address(), i.count()));
        }
        if let Some(o) = output {
            self.placed(&*o)?;
            ends.writes
                .push((BufKind::Output, o.address_mut(), o.count()));
        }
        Ok((
            Shape::collective::<T>(collective.clone(), count, false, op),
            ends,
        ))
    }

    /// Any collective that has an in-place form ([`Collective::has_in_place`]), in place on this
    /// rank's one buffer, laid out as the collective's table says (an all-gather's holds this
    /// rank's block at its place; a reduce-scatter's leaves this rank's block holding its
    /// result, the others undefined).
    pub fn collective_in_place<T: Element, B: BufferMut<T> + ?Sized>(
        &mut self,
        collective: &Collective,
        buf: &mut B,
        op: ReduceOp,
    ) -> Result<()> {
        let shape = self.in_place_shape::<T, B>(collective, buf, op)?;
        let ends = Ends {
            reads: Vec::new(),
            writes: vec![(BufKind::Output, buf.address_mut(), buf.count())],
        };
        self.run::<T>(shape, ends, op)
    }

    /// [`RankCommunicator::collective_in_place`] on a GPU rank, ordered on the caller's `stream`
    /// (of this rank's GPU, in its primary context): it starts after the work already queued
    /// there and the work queued there later waits for it, with no host synchronisation; it
    /// returns once enqueued. When `stream` is being captured into a CUDA graph, the collective
    /// becomes part of the graph (every rank must capture and replay its own alike).
    ///
    /// # Safety
    /// `buf` must stay allocated and untouched (no reads, no writes, on any stream or the host)
    /// until `stream` has passed the collective, except by work queued on `stream` after this
    /// call; captured, it must stay allocated, and this communicator open, while the graph may
    /// be replayed.
    pub unsafe fn enqueue_collective_in_place_on<T: Element, B: BufferMut<T> + ?Sized>(
        &mut self,
        collective: &Collective,
        buf: &mut B,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        // SAFETY: our caller's contract, passed on (a cudarc stream is live while borrowed).
        unsafe {
            self.enqueue_collective_in_place_on_raw(collective, buf, op, CallerStream::of(stream))
        }
    }

    /// Enqueues the call of `shape` on this GPU rank's `ends`, ordered on `stream`.
    ///
    /// # Safety
    /// The ends are this rank's checked buffers (`placed`, `count_of`), which stay allocated
    /// and untouched as [`RankCommunicator::enqueue_collective_on`] says.
    unsafe fn enqueue_on<T: Element>(
        &mut self,
        shape: Shape,
        ends: Ends,
        op: ReduceOp,
        stream: CallerStream,
    ) -> Result<()> {
        broken(&self.broken)?;
        let (inputs, outputs) = self.addresses(&shape, &ends);
        match &mut self.inner {
            Inner::Gpu { exec, .. } => guarded(&mut self.broken, || {
                // SAFETY: every address is this rank's buffer on its GPU, valid for the length
                // the plan declares; its lifetime until `stream` passes the call is our caller's
                // contract.
                unsafe { exec.run::<T>(shape, &inputs, &outputs, op, false, Some(&[stream])) }
            }),
            // SAFETY: as above.
            Inner::GpuHosts(inner) => guarded(&mut self.broken, || unsafe {
                inner.run::<T>(shape, &inputs, &outputs, op, false, Some(stream))
            }),
            Inner::Host(_) | Inner::Hosts(_) => Err(Error::InvalidArgument(
                "a host rank has no streams: the caller's stream needs a GPU rank".into(),
            )),
        }
    }

    /// The plan's caller buffers by address, as the GPU executor takes them: rank r's input and
    /// output at index r, transfer i's ends at index i (`exec::caller_address`); this rank's
    /// alone.
    fn addresses(&self, shape: &Shape, ends: &Ends) -> (Vec<u64>, Vec<u64>) {
        let slots = match &shape.collective {
            Collective::SendRecv { transfers } => transfers.len(),
            _ => self.world,
        };
        let (mut inputs, mut outputs) = (vec![0u64; slots], vec![0u64; slots]);
        for &(kind, addr, _) in ends.reads.iter().chain(&ends.writes) {
            match kind {
                BufKind::Input => inputs[self.rank] = addr,
                BufKind::Output => outputs[self.rank] = addr,
                BufKind::SendBuf(i) => inputs[i] = addr,
                BufKind::RecvBuf(i) => outputs[i] = addr,
                _ => {}
            }
        }
        (inputs, outputs)
    }

    /// [`RankCommunicator::all_reduce_in_place`] ordered on the caller's `stream`: see
    /// [`RankCommunicator::enqueue_collective_in_place_on`].
    ///
    /// # Safety
    /// As for [`RankCommunicator::enqueue_collective_in_place_on`].
    pub unsafe fn enqueue_all_reduce_in_place_on<T: Element, B: BufferMut<T> + ?Sized>(
        &mut self,
        buf: &mut B,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        // SAFETY: our caller's contract, passed on.
        unsafe { self.enqueue_collective_in_place_on(&Collective::AllReduce, buf, op, stream) }
    }

    /// Waits for every collective this rank has enqueued (on a host rank, every call has
    /// completed already), with the first error they met — a peer lost meanwhile among them.
    pub fn synchronize(&mut self) -> Result<()> {
        broken(&self.broken)?;
        match &mut self.inner {
            Inner::Host(_) | Inner::Hosts(_) => Ok(()),
            Inner::Gpu { exec, .. } => guarded(&mut self.broken, || exec.synchronize()),
            Inner::GpuHosts(inner) => guarded(&mut self.broken, || inner.wait()),
        }
    }

    /// An error this communicator has met without a call returning it (NCCL's
    /// `ncclCommGetAsyncError`): the failure that broke it, a GPU rank's kernel that gave up or
    /// a CUDA error on its streams, a peer of another process that is gone or failed. `None`
    /// while healthy. Never waits.
    pub fn async_error(&mut self) -> Option<Error> {
        if let Some(err) = &self.broken {
            return Some(err.clone());
        }
        let found = match &self.inner {
            Inner::Gpu { exec, .. } => exec.poll_health().err().or_else(|| exec.lost_peer()),
            Inner::GpuHosts(inner) => inner.health().err(),
            Inner::Host(_) | Inner::Hosts(_) => None,
        };
        if let Some(err) = &found {
            self.broken = Some(err.clone());
        }
        found
    }

    /// A handle that gives this rank up from any thread, while a call of this communicator
    /// may be waiting (NCCL's `ncclCommAbort` from a watchdog thread): [`AbortHandle::abort`].
    /// A host rank's handle does nothing.
    pub fn abort_handle(&self) -> AbortHandle {
        match &self.inner {
            Inner::Gpu { exec, .. } => exec.abort_handle(),
            Inner::GpuHosts(inner) => inner.abort_handle(),
            Inner::Host(_) | Inner::Hosts(_) => AbortHandle::none(),
        }
    }

    /// Shuts this rank down cleanly (NCCL's `ncclCommFinalize` then `ncclCommDestroy`): waits for
    /// what it enqueued, parts from its peers and frees its memory, and returns the first error
    /// the communicator met — the failure that broke it, or one of the shutdown (dropping it
    /// does the same and drops the error).
    pub fn close(self) -> Result<()> {
        let shutdown = match self.inner {
            Inner::Gpu { exec, .. } => exec.shutdown(),
            Inner::GpuHosts(inner) => inner.shutdown(),
            Inner::Host(rank) => {
                drop(rank);
                Ok(())
            }
            Inner::Hosts(rank) => {
                drop(rank);
                Ok(())
            }
        };
        match self.broken {
            Some(err) => Err(err),
            None => shutdown,
        }
    }

    /// Gives up on the job (NCCL's `ncclCommAbort`): the peers' waits in this job end with an
    /// error naming this rank, and the communicator is closed without waiting for them.
    pub fn abort(self) {
        self.abort_handle().abort();
        drop(self);
    }

    /// The GPU this rank runs on; `None` for a host rank.
    pub fn device(&self) -> Option<usize> {
        match &self.inner {
            Inner::Gpu { device, .. } => Some(*device),
            Inner::GpuHosts(inner) => Some(inner.device()),
            Inner::Host(_) | Inner::Hosts(_) => None,
        }
    }

    /// Registers the GPU allocation `buf` lies in, so that later calls on buffers inside it run
    /// on them directly: peers in other processes read and write it in place, with no copies
    /// into and out of the memory this rank exports for its calls (NCCL's window registration,
    /// `ncclCommWindowRegister`; vLLM's registered custom all-reduce buffers). Collective: every
    /// rank registers one buffer of its own in the same turn, and all wait for each other (the
    /// timeout bounds it). Each exports its allocation (a legacy IPC handle for `cuMemAlloc`
    /// memory such as [`GpuBuffer`](crate::GpuBuffer)'s) and maps every peer's, once, until
    /// [`RankCommunicator::deregister`] or the communicator closes.
    ///
    /// A call runs without copies when every rank's buffers of it lie in memory it registered
    /// (each rank publishes where, beside the call's shape) and no rank's input and output of an
    /// out-of-place call overlap (the plan might write the output before it has read the
    /// input: NCCL's in-place forms, which ringreduce-nccl passes as out-of-place calls);
    /// otherwise it copies, as an unregistered call does — so registration never changes a
    /// result, only the copies.
    /// Memory freed and allocated again at the same address is not taken for registered (the
    /// driver's allocation id is checked at each call). Refused by name, on every rank alike:
    /// stream-ordered pool memory (`cuMemAllocAsync`, cudarc's default allocation on a stream)
    /// and `cuMemCreate` memory of another allocator, which CUDA cannot share by a handle this
    /// library can pass; a buffer on another GPU or in host memory; host ranks and jobs on
    /// several hosts, which have nothing to register. A refused turn registers nothing and
    /// leaves the communicator working. [`RankCommunicator::registered_calls`] counts the calls
    /// that ran without copies.
    ///
    /// # Safety
    /// The allocation `buf` lies in is not freed until this registration is deregistered on
    /// every rank ([`RankCommunicator::deregister`] returned) or the communicator is closed or
    /// dropped: CUDA leaves it undefined to free memory that another process still maps. And no
    /// CUDA graph that captured a call on registered buffers is replayed after that.
    ///
    /// Hence `unsafe`: safe code cannot register.
    ///
    /// ```compile_fail
    /// # fn f(comm: &mut ringreduce::RankCommunicator, buf: &ringreduce::GpuBuffer<f32>) {
    /// let registration = comm.register(buf); // error: call to unsafe function
    /// # }
    /// ```
    pub unsafe fn register<T: Element, B: Buffer<T> + ?Sized>(
        &mut self,
        buf: &B,
    ) -> Result<Registration> {
        broken(&self.broken)?;
        // A bad buffer is refused in the turn, on every rank alike (not before it, which would
        // leave the peers waiting).
        let own = self.placed(buf).map(|()| buf.address());
        match &mut self.inner {
            Inner::Gpu { exec, .. } => {
                // A refused turn leaves the communicator working; a failed job breaks it.
                let index = guarded(&mut self.broken, || exec.register(own))??;
                Ok(Registration { index })
            }
            Inner::GpuHosts(_) => Err(Error::InvalidArgument(
                "registration serves the ranks of one host: a job on several hosts copies its \
                 buffers"
                    .into(),
            )),
            Inner::Host(_) | Inner::Hosts(_) => Err(Error::InvalidArgument(
                "host ranks have no GPU memory to register".into(),
            )),
        }
    }

    /// Undoes `registration` with every rank in the same turn (collective, as registering):
    /// each waits for its queued work, unmaps its peers' allocations of that turn, and meets the
    /// others — when this returns, no rank maps this rank's allocation any more, and it may be
    /// freed. Ranks that deregister different registrations get `InvalidArgument` and nothing
    /// changes.
    pub fn deregister(&mut self, registration: Registration) -> Result<()> {
        broken(&self.broken)?;
        match &mut self.inner {
            Inner::Gpu { exec, .. } => {
                guarded(&mut self.broken, || exec.deregister(registration.index))?
            }
            _ => Err(Error::InvalidArgument(
                "this communicator registers nothing".into(),
            )),
        }
    }

    /// How many of this rank's calls ran on registered buffers, without copies
    /// ([`RankCommunicator::register`]); 0 for a host rank.
    pub fn registered_calls(&self) -> u64 {
        match &self.inner {
            Inner::Gpu { exec, .. } => exec.registered_calls(),
            _ => 0,
        }
    }

    /// Grouped send/recv: every rank names the same `transfers` (transfer i moves `count`
    /// elements from rank `from` to rank `to`), and passes its own ends of them — `sends`, one
    /// buffer per transfer it sends, and `recvs`, one per transfer it receives, each in the
    /// order of `transfers` and of the transfer's count. All in one call, so an exchange where
    /// every rank both sends and receives cannot deadlock.
    pub fn send_recv<T: Element, I: Buffer<T> + ?Sized, O: BufferMut<T> + ?Sized>(
        &mut self,
        transfers: &[Transfer],
        sends: &[&I],
        recvs: &mut [&mut O],
    ) -> Result<()> {
        let (shape, ends) = self.send_recv_ends(transfers, sends, recvs)?;
        self.run::<T>(shape, ends, ReduceOp::Sum)
    }

    /// [`RankCommunicator::send_recv`] on a GPU rank, ordered on a stream named by its raw
    /// handle (see [`RankCommunicator::enqueue_collective_on_raw`]).
    ///
    /// # Safety
    /// Every buffer stays allocated until the stream has passed the call, the sends unwritten
    /// and the receives untouched meanwhile except by work queued on the stream after this
    /// call; `stream` stays live until the call has returned.
    pub unsafe fn enqueue_send_recv_on_raw<
        T: Element,
        I: Buffer<T> + ?Sized,
        O: BufferMut<T> + ?Sized,
    >(
        &mut self,
        transfers: &[Transfer],
        sends: &[&I],
        recvs: &mut [&mut O],
        stream: CallerStream,
    ) -> Result<()> {
        let (shape, ends) = self.send_recv_ends(transfers, sends, recvs)?;
        // SAFETY: our caller's contract, passed on.
        unsafe { self.enqueue_on::<T>(shape, ends, ReduceOp::Sum, stream) }
    }

    /// Every rank's `words`, by rank, exchanged with the job's other ranks (a collective step:
    /// every rank calls it in the same order). For callers that must agree on a call's shape
    /// before making it — NCCL's send/recv, where each rank names only its own peers. GPU
    /// ranks only.
    #[doc(hidden)]
    pub fn exchange(&mut self, words: &[u64]) -> Result<Vec<Vec<u64>>> {
        broken(&self.broken)?;
        match &mut self.inner {
            Inner::Gpu { exec, .. } => guarded(&mut self.broken, || exec.exchange(words)),
            Inner::GpuHosts(inner) => guarded(&mut self.broken, || inner.exchange(words)),
            Inner::Host(_) | Inner::Hosts(_) => {
                Err(Error::InvalidArgument("exchange is for GPU ranks".into()))
            }
        }
    }

    /// The shape and this rank's ends of a send/recv, after checking the transfers, the
    /// buffers' number, lengths and placement.
    fn send_recv_ends<T: Element, I: Buffer<T> + ?Sized, O: BufferMut<T> + ?Sized>(
        &self,
        transfers: &[Transfer],
        sends: &[&I],
        recvs: &mut [&mut O],
    ) -> Result<(Shape, Ends)> {
        let rank = self.rank;
        let collective = Collective::SendRecv {
            transfers: transfers.to_vec(),
        };
        collective.validate(self.world)?;
        let mine = |to_me: bool| -> Vec<(usize, usize)> {
            transfers
                .iter()
                .enumerate()
                .filter(|(_, t)| if to_me { t.to == rank } else { t.from == rank })
                .map(|(i, t)| (i, t.count))
                .collect()
        };
        let (sending, receiving) = (mine(false), mine(true));
        let send_lens: Vec<usize> = sends.iter().map(|b| b.count()).collect();
        let recv_lens: Vec<usize> = recvs.iter().map(|b| b.count()).collect();
        for (what, ends, lens) in [
            (
                "send buffers (one per transfer this rank sends)",
                &sending,
                &send_lens,
            ),
            (
                "receive buffers (one per transfer this rank receives)",
                &receiving,
                &recv_lens,
            ),
        ] {
            if lens.len() != ends.len() {
                return Err(Error::BufferCount {
                    collective: "send/recv",
                    what,
                    expected: ends.len(),
                    got: lens.len(),
                });
            }
            if let Some((&(i, count), &got)) = ends
                .iter()
                .zip(lens)
                .find(|((_, count), got)| count != *got)
            {
                return Err(Error::BufferLength {
                    collective: "send/recv",
                    rank,
                    buffer: format!("buffer of transfer {i}"),
                    expected: count,
                    got,
                });
            }
        }
        let mut ends = Ends {
            reads: Vec::new(),
            writes: Vec::new(),
        };
        for (&(i, count), b) in sending.iter().zip(sends) {
            self.placed(*b)?;
            ends.reads.push((BufKind::SendBuf(i), b.address(), count));
        }
        for (&(i, count), b) in receiving.iter().zip(recvs.iter_mut()) {
            self.placed(&**b)?;
            ends.writes
                .push((BufKind::RecvBuf(i), b.address_mut(), count));
        }
        Ok((
            Shape::collective::<T>(collective, 0, false, ReduceOp::Sum),
            ends,
        ))
    }

    /// The shape of `collective` in place on this rank's `buf`, after checking that it has an
    /// in-place form, `buf`'s length and its placement.
    fn in_place_shape<T: Element, B: BufferMut<T> + ?Sized>(
        &self,
        collective: &Collective,
        buf: &B,
        op: ReduceOp,
    ) -> Result<Shape> {
        self.check(collective)?;
        if !collective.has_in_place() {
            return Err(Error::InvalidArgument(format!(
                "{} has no in-place form",
                collective.name()
            )));
        }
        let count = self.count_of(collective, None, Some(buf.count()), true)?;
        self.placed(buf)?;
        Ok(Shape::collective::<T>(collective.clone(), count, true, op))
    }

    /// What every call but send/recv checks first: a collective of its world (send/recv has
    /// its own call, [`RankCommunicator::send_recv`]).
    fn check(&self, collective: &Collective) -> Result<()> {
        if matches!(collective, Collective::SendRecv { .. }) {
            return Err(Error::InvalidArgument(
                "send/recv passes a buffer per transfer: call RankCommunicator::send_recv".into(),
            ));
        }
        collective.validate(self.world)
    }

    /// A buffer is where this rank's calls take it: host memory for a host rank, its GPU for a
    /// GPU rank.
    pub(super) fn placed<T: Element, B: Buffer<T> + ?Sized>(&self, buf: &B) -> Result<()> {
        match (&self.inner, buf.placement(), self.device()) {
            (Inner::Host(_) | Inner::Hosts(_), Placement::Host, _) => Ok(()),
            (_, Placement::Device(d), Some(device)) if d == device => Ok(()),
            (_, Placement::Device(d), Some(device)) => Err(Error::WrongDevice {
                rank: self.rank,
                device: d,
                expected: device,
            }),
            (_, Placement::Device(_), None) => Err(Error::InvalidArgument(format!(
                "rank {}'s buffer is on a GPU, and this is a host rank",
                self.rank
            ))),
            (_, Placement::Host, _) => Err(Error::InvalidArgument(format!(
                "rank {}'s buffer is in host memory, and this rank is on a GPU",
                self.rank
            ))),
        }
    }

    /// Runs the call of `shape` on this rank's `ends`.
    fn run<T: Element>(&mut self, shape: Shape, ends: Ends, op: ReduceOp) -> Result<()> {
        broken(&self.broken)?;
        let addresses = self.addresses(&shape, &ends);
        match &mut self.inner {
            Inner::Host(inner) => {
                // SAFETY: the ends came from this call's checked host buffers (`host_slices`).
                let (reads, mut writes) = unsafe { host_slices::<T>(&ends) };
                guarded(&mut self.broken, || {
                    inner.run(shape, &reads, &mut writes, op)
                })
            }
            Inner::Hosts(inner) => {
                // SAFETY: as above.
                let (reads, mut writes) = unsafe { host_slices::<T>(&ends) };
                guarded(&mut self.broken, || {
                    inner.run(shape, &reads, &mut writes, op)
                })
            }
            Inner::Gpu { exec, .. } => {
                let (inputs, outputs) = addresses;
                guarded(&mut self.broken, || {
                    // SAFETY: every address is this rank's buffer on its GPU (`placed`), valid
                    // for the length the plan declares (`count_of`, `send_recv`), borrowed by
                    // our caller for this whole call, which waits for completion.
                    unsafe { exec.run::<T>(shape, &inputs, &outputs, op, true, None) }
                })
            }
            Inner::GpuHosts(inner) => {
                let (inputs, outputs) = addresses;
                // SAFETY: as above.
                guarded(&mut self.broken, || unsafe {
                    inner.run::<T>(shape, &inputs, &outputs, op, true, None)
                })
            }
        }
    }

    /// The collective's count from this rank's buffers' lengths, each checked against the
    /// table.
    fn count_of(
        &self,
        collective: &Collective,
        input: Option<usize>,
        output: Option<usize>,
        in_place: bool,
    ) -> Result<usize> {
        let (rank, world) = (self.rank, self.world);
        let per = |len: usize, blocks: usize| -> Result<usize> {
            match len % blocks {
                0 => Ok(len / blocks),
                _ => Err(Error::InvalidArgument(format!(
                    "rank {rank}'s buffer of {len} elements is not {blocks} blocks of one count"
                ))),
            }
        };
        if in_place {
            let len = output.ok_or_else(|| {
                Error::InvalidArgument(format!("rank {rank} passes no buffer in place"))
            })?;
            return per(len, collective.in_place_len(world, 1));
        }
        let input_blocks = collective.input_len(rank, world, 1);
        let output_blocks = collective.output_len(rank, world, 1);
        let count = match (input_blocks, input, output_blocks, output) {
            (Some(b), Some(len), _, _) => per(len, b)?,
            (_, _, Some(b), Some(len)) => per(len, b)?,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "rank {rank} passes no buffer the {} needs",
                    collective.name()
                )))
            }
        };
        for (what, blocks, len) in [
            ("input", input_blocks, input),
            ("output", output_blocks, output),
        ] {
            match (blocks, len) {
                (Some(b), Some(len)) if len == b * count => {}
                (None, None) => {}
                (Some(b), got) => {
                    return Err(Error::BufferLength {
                        collective: collective.name(),
                        rank,
                        buffer: what.into(),
                        expected: b * count,
                        got: got.unwrap_or(0),
                    })
                }
                (None, Some(_)) => {
                    return Err(Error::InvalidArgument(format!(
                        "rank {rank} passes an {what} the {} does not take from it",
                        collective.name()
                    )))
                }
            }
        }
        Ok(count)
    }
}

/// A registration of [`RankCommunicator::register`]: what [`RankCommunicator::deregister`]
/// undoes. Dropping it undoes nothing (the communicator's close does).
#[derive(Debug)]
#[must_use = "a registration is undone by RankCommunicator::deregister, or when the communicator closes"]
pub struct Registration {
    index: usize,
}

/// Gives a rank up from any thread ([`RankCommunicator::abort_handle`]): a call of its waiting
/// for peers returns at once, its kernels give up at their next poll, its peers' calls fail
/// naming it, and its communicator closes without the farewell barrier.
#[derive(Clone)]
pub struct AbortHandle {
    fabric: Option<Arc<dyn Fabric>>,
}

impl std::fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AbortHandle").finish_non_exhaustive()
    }
}

impl AbortHandle {
    pub(crate) fn new(fabric: Arc<dyn Fabric>) -> AbortHandle {
        AbortHandle {
            fabric: Some(fabric),
        }
    }

    pub(crate) fn none() -> AbortHandle {
        AbortHandle { fabric: None }
    }

    /// Gives the rank up (see the type's doc). Idempotent.
    pub fn abort(&self) {
        if let Some(fabric) = &self.fabric {
            fabric.abort();
        }
    }
}

/// [`Error::CommunicatorFailed`] when a call broke the communicator (`broken`).
fn broken(broken: &Option<Error>) -> Result<()> {
    match broken {
        Some(err) => Err(Error::CommunicatorFailed(Box::new(err.clone()))),
        None => Ok(()),
    }
}

/// Runs `call` (one that crosses ranks: its arguments were checked), keeping its failure in
/// `broken`.
fn guarded<R>(broken: &mut Option<Error>, call: impl FnOnce() -> Result<R>) -> Result<R> {
    let result = call();
    if let Err(err) = &result {
        broken.get_or_insert_with(|| err.clone());
    }
    result
}

/// What every GPU rank's configuration must share, as one number.
fn gpu_fingerprint(config: &CudaConfig) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    format!(
        "{:?} {} {:?} {:?} {} {} {}",
        config.transport,
        config.slots,
        config.chunk_bytes,
        config.algorithm,
        config.deterministic,
        config.low_latency,
        config.allow_shared_device
    )
    .hash(&mut h);
    h.finish()
}
