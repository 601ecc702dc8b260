//! The communicator API: built once for a set of ranks, then used for many collectives.
//!
//! A [`Communicator`] owns an executor (host threads now; GPUs through [`crate::exec::cuda`]) and
//! a cache of checked plans, one per shape. Every call validates its arguments for real before
//! anything is enqueued — buffer count, lengths compared across all ranks, placement, overlap —
//! and returns a clear [`Error`] naming the rank. A call that fails inside the executor marks the
//! communicator failed: later calls return that error at once ([`Error::CommunicatorFailed`]);
//! make a new communicator to continue.
//!
//! Beside the all-reduce (this file), every other collective — reduce-scatter, all-gather,
//! broadcast, reduce, all-to-all, grouped send/recv — has its methods and its one generic entry,
//! [`Communicator::enqueue_collective`], in `collectives.rs`; the checks of every call are in
//! `validate.rs`.
//!
//! A communicator is `Send + Sync`: calls from several threads are serialised, each holding it
//! for its whole length. Other threads may use `GpuBuffer`s meanwhile (ringreduce's own blocking
//! calls wait for its peer kernels: [`crate::device::gate`]), but must not make CUDA calls outside
//! ringreduce that wait for its GPUs (allocations, frees, pageable copies): docs/ERRORS.md,
//! "Several threads", and [`Error::LaunchBlocked`].
//!
//! ```
//! use ringreduce::{Communicator, ReduceOp};
//!
//! let comm = Communicator::host(3)?;
//! let mut bufs = vec![vec![1.0f32, 2.0], vec![10.0, 20.0], vec![100.0, 200.0]];
//! comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum)?;
//! assert!(bufs.iter().all(|b| b == &[111.0, 222.0]));
//!
//! let inputs = vec![vec![4i32, -1], vec![2, 7], vec![9, 0]];
//! let mut outputs = vec![vec![0i32; 2]; 3];
//! comm.all_reduce(&inputs, &mut outputs, ReduceOp::Max)?;
//! assert_eq!(outputs[1], [9, 7]);
//! # Ok::<(), ringreduce::Error>(())
//! ```

use crate::buffer::{Buffer, BufferMut, Placement, StreamUse};
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::cuda::executor::{CudaConfig, CudaExecutor, EdgeInfo};
use crate::exec::host::{HostConfig, HostExecutor};
use crate::exec::profile::{self, CallProfile, HostPhase};
use crate::exec::{config, Algorithm, Shape};
use crate::plan::Collective;
use cudarc::driver::CudaStream;
use std::sync::{Arc, Mutex, OnceLock, TryLockError};

mod collectives;
mod rank_communicator;
mod scope;
mod validate;

pub use rank_communicator::{AbortHandle, RankCommunicator, Registration};
pub use scope::Scope;

// Boxed: the two executors differ in size by hundreds of bytes.
enum Executor {
    Host(Box<HostExecutor>),
    Cuda(Box<CudaExecutor>),
}

struct State {
    exec: Option<Executor>,
}

/// What a call computes, beside its buffers.
struct Call {
    collective: Collective,
    count: usize,
    in_place: bool,
}

/// How a call completes: blocking or not, on the communicator's streams or the caller's.
struct When<'a> {
    wait_complete: bool,
    caller: Option<&'a [Arc<CudaStream>]>,
}

/// What a communicator is, fixed when it is made: read without waiting for a running call.
struct Facts {
    devices: Vec<usize>,
    edges: Vec<EdgeInfo>,
    algorithm: Algorithm,
    peers_ok: bool,
    /// The all-reduce runs the staged algorithms ([`Algorithm::choose_staged`]): host ranks
    /// with `Transport::Staged`, GPUs that do not all reach each other.
    staged: bool,
    /// Host ranks: the all-reduce follows [`Algorithm::choose_host`] where not staged.
    host: bool,
    deterministic: bool,
}

/// The most call profiles a communicator keeps until [`Communicator::host_profile`] takes
/// them (a few hundred bytes each), so that a profiled communicator nobody asks does not grow.
pub const PROFILED_CALLS_KEPT: usize = 1 << 16;

/// A set of ranks that run collectives together.
///
/// # A failed or timed-out call
///
/// Every call has a deadline (the config's `timeout`), and a blocking call returns by it, with
/// [`Error::Timeout`] naming the rank and what it waited for, even when a GPU is stuck (a hung
/// kernel, or work queued before the call that never finishes). Returning does not stop the GPU:
/// the part of the call already queued on a stuck GPU runs whenever that GPU moves again, and
/// then reads the call's inputs and writes its outputs — after the borrow of the buffers has
/// ended. (Host ranks stop touching the buffers before a call returns.) So after a call on GPUs
/// failed:
///
/// 1. do not free, reuse or read the call's buffers yet;
/// 2. [`Communicator::abort`] the communicator (or drop it): it waits for its GPUs up to the
///    timeout and releases them, leaking rather than freeing what a stuck GPU may still touch;
/// 3. then wait until the GPUs are idle — a device-wide synchronize
///    (`ringreduce::device::context(gpu)?.synchronize()`; [`crate::GpuBuffer`]'s copies do one)
///    — or keep the buffers alive until the process ends.
///
/// docs/ERRORS.md ("What bounds every wait") says what each algorithm does at its deadline.
pub struct Communicator {
    world: usize,
    facts: Facts,
    state: Mutex<State>,
    /// The first error a collective hit. Outside `state`, whose lock a running call holds, so
    /// that `health` never waits for a call.
    failed: OnceLock<Error>,
    /// With [`CudaConfig::profile_host`]: each call's host phases, until
    /// [`Communicator::host_profile`] takes them (module [`crate::exec::profile`]).
    profile: Option<Mutex<Vec<CallProfile>>>,
}

impl Communicator {
    /// A communicator of `world` ranks on host threads (one thread per rank, which runs its Main
    /// stream, and a worker per other stream; blocking calls of the one- and two-shot run on at
    /// most one thread per core instead).
    pub fn host(world: usize) -> Result<Communicator> {
        Communicator::host_with(world, HostConfig::default())
    }

    /// A host communicator with explicit chunking, transport, timeout and test options.
    pub fn host_with(world: usize, config: HostConfig) -> Result<Communicator> {
        check_host_config(world, &config)?;
        let facts = Facts {
            devices: Vec::new(),
            edges: Vec::new(),
            algorithm: config.algorithm,
            peers_ok: true,
            staged: config.transport == crate::Transport::Staged,
            host: true,
            deterministic: config.deterministic,
        };
        Ok(Communicator::from_executor(
            world,
            facts,
            Executor::Host(Box::new(HostExecutor::new(world, config)?)),
        ))
    }

    /// A communicator over GPUs: rank `r` is GPU `devices[r]`, and the ring follows this order.
    /// Enables peer access between ring neighbours where the hardware allows and stages through
    /// pinned host memory elsewhere ([`Communicator::edges`] says which and why).
    pub fn new(devices: &[usize]) -> Result<Communicator> {
        Communicator::with_config(devices, CudaConfig::default())
    }

    /// A GPU communicator over every visible GPU, in the ring order the topology picks: rank `r`
    /// is GPU `order[r]` for the order [`crate::topo::choose_ring`] finds on the links NVML
    /// reports and the peer matrix the driver reports (the slowest edge as fast as possible), or
    /// index order where the links cannot be read (no NVML). [`crate::topo::all_gpus_ring`]
    /// gives that order and says why; [`Communicator::devices`] says which GPU each rank got.
    /// Without a usable GPU, the error of [`crate::device_count`].
    pub fn all_gpus() -> Result<Communicator> {
        let (order, _reason) = crate::topo::all_gpus_ring()?;
        Communicator::new(&order)
    }

    /// A GPU communicator with explicit transport, chunking, slots and timeout.
    pub fn with_config(devices: &[usize], config: CudaConfig) -> Result<Communicator> {
        check_cuda_config(devices.len(), &config)?;
        let (algorithm, deterministic) = (config.algorithm, config.deterministic);
        let profile = config.profile_host;
        let exec = CudaExecutor::new(devices, config)?;
        check_deterministic_if(deterministic, algorithm, devices.len(), exec.peers_ok())?;
        let facts = Facts {
            devices: exec.devices(),
            edges: exec.edges().to_vec(),
            algorithm,
            peers_ok: exec.peers_ok(),
            staged: exec.staged_oneshot(),
            host: false,
            deterministic,
        };
        let mut comm =
            Communicator::from_executor(devices.len(), facts, Executor::Cuda(Box::new(exec)));
        comm.profile = profile.then(|| Mutex::new(Vec::new()));
        Ok(comm)
    }

    /// The GPUs of a GPU communicator, by rank; empty for a host communicator.
    /// Fixed at creation: never waits for a running call.
    pub fn devices(&self) -> Vec<usize> {
        self.facts.devices.clone()
    }

    /// How each ring edge moves data and why (GPU communicators; empty otherwise).
    /// Fixed at creation: never waits for a running call.
    pub fn edges(&self) -> Vec<EdgeInfo> {
        self.facts.edges.clone()
    }

    /// The algorithm a call of `bytes_per_rank` bytes, in place or not, runs on this
    /// communicator: the ring, the one-shot or the two-shot (see [`Algorithm`]; with `Auto` it
    /// depends on the size and, for the one-shot and the two-shot, on `in_place`).
    /// The rule is [`Algorithm::choose`]'s ([`Algorithm::choose_staged`]'s where edges are
    /// staged, [`Algorithm::choose_host`]'s on host ranks); this never waits for a running call.
    pub fn algorithm_for(&self, bytes_per_rank: usize, in_place: bool) -> Algorithm {
        let f = &self.facts;
        if f.staged {
            return f
                .algorithm
                .choose_staged(bytes_per_rank, self.world, f.deterministic);
        }
        if f.host {
            return f.algorithm.choose_host(self.world, f.deterministic);
        }
        f.algorithm.choose(
            bytes_per_rank,
            self.world,
            in_place,
            f.peers_ok,
            f.deterministic,
        )
    }

    /// The algorithm whose form of `collective` a call of `count_bytes` (NCCL's count times the
    /// element size), in place or not, runs on this communicator: `Ring` or `OneShot` for the
    /// collectives other than the all-reduce (see [`Algorithm::choose_for`]); for the
    /// all-reduce, [`Communicator::algorithm_for`]'s answer (its host and staged rules
    /// included). Never waits for a call.
    pub fn algorithm_for_collective(
        &self,
        collective: &crate::plan::Collective,
        count_bytes: usize,
        in_place: bool,
    ) -> Algorithm {
        if *collective == crate::plan::Collective::AllReduce {
            return self.algorithm_for(count_bytes, in_place);
        }
        let f = &self.facts;
        f.algorithm.choose_for(
            collective,
            count_bytes,
            self.world,
            in_place,
            f.peers_ok,
            f.deterministic,
        )
    }

    /// The raw CUDA stream on which rank `rank`'s collectives start and end (GPU communicators):
    /// work the caller enqueues there after a call runs after that call.
    pub fn main_stream(&self, rank: usize) -> Option<cudarc::driver::sys::CUstream> {
        match &self.state.lock().unwrap_or_else(|p| p.into_inner()).exec {
            Some(Executor::Cuda(exec)) => exec.main_stream(rank),
            _ => None,
        }
    }

    /// Blocks until all work enqueued by this communicator has finished.
    ///
    /// # Errors
    /// After a timeout, a stuck GPU may still write the buffers once this has returned: read
    /// [`Communicator`]'s "A failed or timed-out call" before freeing or reusing them.
    pub fn synchronize(&self) -> Result<()> {
        self.begin_profile();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        profile::mark(HostPhase::Lock);
        let result = match state.exec.as_mut() {
            Some(Executor::Cuda(exec)) => exec.synchronize(),
            Some(Executor::Host(exec)) => exec.synchronize(),
            None => return Err(Error::Closed),
        };
        drop(state);
        self.end_profile("synchronize");
        // An error here is the GPU's (a CUDA error, or a one-shot kernel that gave up at a
        // barrier): the enqueued collectives failed, and so has the communicator.
        if let Err(err) = &result {
            let _ = self.failed.set(err.clone());
        }
        result
    }

    fn from_executor(world: usize, facts: Facts, exec: Executor) -> Communicator {
        Communicator {
            world,
            facts,
            state: Mutex::new(State { exec: Some(exec) }),
            failed: OnceLock::new(),
            profile: None,
        }
    }

    /// The host phases of every call since the last time this was asked (oldest first; the
    /// first [`PROFILED_CALLS_KEPT`] of them, later ones are not kept), with
    /// [`CudaConfig::profile_host`] on; empty otherwise. See [`crate::exec::profile`].
    pub fn host_profile(&self) -> Vec<CallProfile> {
        self.profile.as_ref().map_or_else(Vec::new, |log| {
            std::mem::take(&mut *log.lock().unwrap_or_else(|p| p.into_inner()))
        })
    }

    /// Opens the calling thread's phase log for a call, when this communicator profiles.
    fn begin_profile(&self) {
        if self.profile.is_some() {
            profile::begin();
        }
    }

    /// Ends the call's last phase ([`HostPhase::Return`]) and keeps its profile when this
    /// communicator profiles. Closes whatever log is open on this thread either way: one that a
    /// profiled call left open when it returned early (an error) ends here, one call later.
    fn end_profile(&self, call: &'static str) {
        profile::mark(HostPhase::Return);
        if let (Some(log), Some(p)) = (&self.profile, profile::end(call)) {
            let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
            if log.len() < PROFILED_CALLS_KEPT {
                log.push(p);
            }
        }
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The first error a collective hit, if any (like `ncclCommGetAsyncError`); never blocks on
    /// a running collective's work. On GPUs it also asks the GPUs, without waiting, for errors
    /// of work enqueued earlier (a one-shot kernel that gave up at a barrier, a failed copy or
    /// kernel); such an error marks the communicator failed, as a call would have.
    pub fn health(&self) -> Result<()> {
        if let Some(err) = self.failed.get() {
            return Err(err.clone());
        }
        let polled = match self.state.try_lock() {
            Ok(state) => Self::poll(&state),
            Err(TryLockError::Poisoned(p)) => Self::poll(&p.into_inner()),
            // A call (or an abort) holds the lock; nothing has failed so far.
            Err(TryLockError::WouldBlock) => Ok(()),
        };
        if let Err(err) = &polled {
            if !matches!(err, Error::Closed) {
                let _ = self.failed.set(err.clone());
            }
        }
        polled
    }

    /// `health`'s look at the executor, under the state lock.
    fn poll(state: &State) -> Result<()> {
        match &state.exec {
            None => Err(Error::Closed),
            Some(Executor::Cuda(exec)) => exec.poll_health(),
            Some(Executor::Host(exec)) => exec.poll_health(),
        }
    }

    /// All-reduce in place: every `bufs[r]` ends holding the reduction over all ranks.
    ///
    /// On error nothing is enqueued when validation fails; when a rank fails mid-call, the
    /// buffers hold partial results (some elements reduced, some not) and the communicator is
    /// marked failed.
    ///
    /// # Errors
    /// After a timeout, a stuck GPU may still write the buffers once this has returned: read
    /// [`Communicator`]'s "A failed or timed-out call" before freeing or reusing them.
    pub fn all_reduce_in_place<T: Element, B: BufferMut<T>>(
        &self,
        bufs: &mut [B],
        op: ReduceOp,
    ) -> Result<()> {
        // SAFETY: the buffers are borrowed until `submit` returns, which waits for completion.
        unsafe { self.submit(None::<&[B]>, bufs, op, true, None) }
    }

    /// [`Communicator::all_reduce_in_place`] that returns once the work is enqueued, without
    /// waiting for it (on host ranks too: their threads run it meanwhile). On GPUs the
    /// collective is ordered on each rank's [`Communicator::main_stream`]: work enqueued there
    /// afterwards sees the result; [`Communicator::synchronize`] waits for it.
    ///
    /// # Safety
    /// The buffers must stay allocated and untouched (no reads, no writes, on any stream or the
    /// host) until the collective has completed: after `synchronize`, or for work ordered after
    /// it on the rank's Main stream.
    pub unsafe fn enqueue_all_reduce_in_place<T: Element, B: BufferMut<T>>(
        &self,
        bufs: &mut [B],
        op: ReduceOp,
    ) -> Result<()> {
        // SAFETY: the buffers' lifetime until completion is the caller's contract.
        unsafe { self.submit(None::<&[B]>, bufs, op, false, None) }
    }

    /// All-reduce out of place: every `outputs[r]` ends holding the reduction of all `inputs`.
    /// Inputs are never modified, on error too. Outputs may be longer than inputs; only the
    /// first `inputs[r].count()` elements are written.
    ///
    /// # Errors
    /// After a timeout, a stuck GPU may still write the buffers once this has returned: read
    /// [`Communicator`]'s "A failed or timed-out call" before freeing or reusing them.
    pub fn all_reduce<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        inputs: &[I],
        outputs: &mut [O],
        op: ReduceOp,
    ) -> Result<()> {
        // SAFETY: the buffers are borrowed until `submit` returns, which waits for completion.
        unsafe { self.submit(Some(inputs), outputs, op, true, None) }
    }

    /// [`Communicator::all_reduce`] that returns once the work is enqueued (see
    /// [`Communicator::enqueue_all_reduce_in_place`]).
    ///
    /// # Safety
    /// Inputs and outputs must stay allocated, inputs unwritten and outputs untouched, until the
    /// collective has completed.
    pub unsafe fn enqueue_all_reduce<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        inputs: &[I],
        outputs: &mut [O],
        op: ReduceOp,
    ) -> Result<()> {
        // SAFETY: the buffers' lifetime until completion is the caller's contract.
        unsafe { self.submit(Some(inputs), outputs, op, false, None) }
    }

    /// [`Communicator::enqueue_all_reduce_in_place`] ordered on the caller's streams, one per
    /// rank (cudarc streams of each rank's GPU, in its primary context): the collective starts
    /// after the work already queued on `streams[r]`, and work queued there afterwards runs after
    /// it — a kernel that writes the gradients, the all-reduce, and the kernel that reads them
    /// need no host synchronisation between them. Nothing is waited for on the host.
    ///
    /// ```no_run
    /// # use ringreduce::{Communicator, GpuBuffer, ReduceOp};
    /// # fn main() -> ringreduce::Result<()> {
    /// let comm = Communicator::new(&[0, 1])?;
    /// // The job's own streams (cudarc), one per GPU.
    /// let streams = vec![
    ///     ringreduce::device::context(0)?.new_stream().expect("a stream"),
    ///     ringreduce::device::context(1)?.new_stream().expect("a stream"),
    /// ];
    /// let mut grads = vec![GpuBuffer::<f32>::zeroed(0, 1024)?, GpuBuffer::zeroed(1, 1024)?];
    /// // ... a kernel writing `grads[r]` queued on `streams[r]` ...
    /// // SAFETY: `grads` stays alive and untouched until the streams have passed the call.
    /// unsafe { comm.enqueue_all_reduce_in_place_on(&mut grads, ReduceOp::Sum, &streams)? };
    /// // ... a kernel reading `grads[r]` queued on `streams[r]` runs after the all-reduce ...
    /// streams[0].synchronize().expect("sync"); // only where the host needs the result
    /// # Ok(()) }
    /// ```
    ///
    /// **In CUDA graphs.** When the streams are being captured (every rank's, each into its own
    /// graph or all into one; relaxed capture mode is safest), the collective becomes part of the
    /// graph(s) and replays correctly any number of times, with whatever the buffers hold then.
    /// Rules: the shape (count, element size, placement, `Avg` or not) must have run on this
    /// communicator before the capture; every rank's graph must be replayed as many times as the
    /// others (a rank whose peers never arrive gives up after ¾ of the timeout, and
    /// [`Communicator::health`] then reports the [`Error::Timeout`]); the communicator must stay
    /// open while its graphs can run. Refused with [`Error::NotCapturable`] (nothing enqueued):
    /// an unprepared shape, a capture of some ranks' streams but not others', a ring staged
    /// through host memory.
    ///
    /// # Safety
    /// The buffers must stay allocated and untouched (no reads, no writes, on any stream or the
    /// host) until each rank's stream has passed the collective, except by work queued on those
    /// streams after this call. Captured: the buffers must stay allocated, and the communicator
    /// open, while any graph holding the call may be replayed.
    pub unsafe fn enqueue_all_reduce_in_place_on<T: Element, B: BufferMut<T>>(
        &self,
        bufs: &mut [B],
        op: ReduceOp,
        streams: &[Arc<cudarc::driver::CudaStream>],
    ) -> Result<()> {
        // SAFETY: the buffers' lifetime until the streams pass the call is the caller's contract.
        unsafe { self.submit(None::<&[B]>, bufs, op, false, Some(streams)) }
    }

    /// [`Communicator::enqueue_all_reduce`] ordered on the caller's streams (see
    /// [`Communicator::enqueue_all_reduce_in_place_on`]).
    ///
    /// # Safety
    /// Inputs and outputs must stay allocated, inputs unwritten and outputs untouched, until each
    /// rank's stream has passed the collective, except by work queued on those streams after it.
    pub unsafe fn enqueue_all_reduce_on<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        inputs: &[I],
        outputs: &mut [O],
        op: ReduceOp,
        streams: &[Arc<cudarc::driver::CudaStream>],
    ) -> Result<()> {
        // SAFETY: as above.
        unsafe { self.submit(Some(inputs), outputs, op, false, Some(streams)) }
    }

    /// Validates, then runs one collective (in place when `inputs` is `None`).
    ///
    /// # Safety
    /// When `!wait_complete`, the buffers must stay valid and untouched until the collective has
    /// completed on the GPUs (see [`Communicator::enqueue_all_reduce_in_place`]).
    unsafe fn submit<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        inputs: Option<&[I]>,
        outputs: &mut [O],
        op: ReduceOp,
        wait_complete: bool,
        caller: Option<&[Arc<cudarc::driver::CudaStream>]>,
    ) -> Result<()> {
        self.begin_profile();
        let count = self.validate::<T, O>(outputs, inputs)?;
        let ins: Option<Vec<u64>> = inputs.map(|i| i.iter().map(|b| b.address()).collect());
        let outs: Vec<u64> = outputs.iter_mut().map(|b| b.address_mut()).collect();
        profile::mark(HostPhase::Validate);
        // Buffers that track their own uses (cudarc's) learn of this one on each rank's stream.
        let mut track = |streams: &[&CudaStream], when: StreamUse| {
            for (b, s) in inputs.into_iter().flatten().zip(streams) {
                b.on_stream(s, when);
            }
            for (b, s) in outputs.iter_mut().zip(streams) {
                b.on_stream_mut(s, when);
            }
        };
        let call = Call {
            collective: Collective::AllReduce,
            count,
            in_place: ins.is_none(),
        };
        // SAFETY: validated buffers; completion is awaited or is the caller's contract.
        unsafe {
            self.run::<T>(
                call,
                ins.as_deref().unwrap_or(&[]),
                &outs,
                op,
                When {
                    wait_complete,
                    caller,
                },
                &mut track,
            )
        }
    }

    /// Runs one validated call; `inputs` and `outputs` are the buffers' addresses as
    /// [`crate::exec::caller_address`] lays them out (`inputs` empty in place).
    ///
    /// # Safety
    /// The buffers passed validation; they stay valid and untouched by others until the call is
    /// complete (until this returns when `wait_complete`).
    unsafe fn run<T: Element>(
        &self,
        call: Call,
        inputs: &[u64],
        outputs: &[u64],
        op: ReduceOp,
        when: When<'_>,
        track: &mut dyn FnMut(&[&CudaStream], StreamUse),
    ) -> Result<()> {
        let Call {
            collective,
            count,
            in_place,
        } = call;
        let When {
            wait_complete,
            caller,
        } = when;
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        profile::mark(HostPhase::Lock);
        if let Some(err) = self.failed.get() {
            return Err(Error::CommunicatorFailed(Box::new(err.clone())));
        }
        let result = match state.exec.as_mut() {
            None => return Err(Error::Closed),
            Some(Executor::Host(_)) if caller.is_some() => return Err(Error::InvalidArgument(
                "a host communicator has no streams: the caller's streams need a GPU communicator"
                    .into(),
            )),
            Some(Executor::Host(exec)) => {
                let shape = Shape::collective::<T>(collective, count, in_place, op);
                // SAFETY: validation checked every buffer is host memory of the length the
                // collective needs and that no written buffer overlaps another buffer; each
                // written buffer is a distinct `&mut` borrow held by our caller until this
                // returns, and with `wait_complete` `run` returns only once every thread is done
                // with the buffers; without, their lifetime until completion is our caller's
                // contract.
                unsafe { exec.run::<T>(shape, inputs, outputs, op, wait_complete) }
            }
            Some(Executor::Cuda(exec)) => {
                let callers: Option<Vec<crate::device::CallerStream>> = caller.map(|streams| {
                    streams
                        .iter()
                        .map(|s| crate::device::CallerStream::of(s))
                        .collect()
                });
                // Bad streams are the caller's mistake: refused without failing the communicator.
                if let Some(streams) = &callers {
                    exec.check_caller_streams(streams)?;
                }
                if collective == Collective::AllReduce {
                    exec.prepare_buffers(outputs)?;
                }
                let shape = Shape::collective::<T>(collective, count, in_place, op);
                // The stream each rank's work starts and ends on: the caller's, or Main.
                let on =
                    |exec: &CudaExecutor,
                     when: StreamUse,
                     track: &mut dyn FnMut(&[&CudaStream], StreamUse)| {
                        let streams: Vec<&CudaStream> = match caller {
                            Some(streams) => streams.iter().map(|s| &**s).collect(),
                            None => exec.main_streams(),
                        };
                        track(&streams, when);
                    };
                on(exec, StreamUse::Before, track);
                // SAFETY: validation checked every buffer is on its rank's GPU with the length the
                // collective needs and that no written buffer overlaps another; lifetimes are our
                // caller's contract.
                let result = unsafe {
                    exec.run::<T>(
                        shape,
                        inputs,
                        outputs,
                        op,
                        wait_complete,
                        callers.as_deref(),
                    )
                };
                on(exec, StreamUse::After, track);
                result
            }
        };
        if let Err(err) = &result {
            // Refusals that enqueued nothing leave the communicator usable.
            if !matches!(err, Error::PlanRejected(_) | Error::NotCapturable { .. }) {
                let _ = self.failed.set(err.clone());
            }
        }
        drop(state);
        self.end_profile("collective");
        result
    }

    /// Releases the communicator's threads and memory, whatever state it is in; later calls return
    /// [`Error::Closed`]. A collective running on another thread is not interrupted: `abort` waits
    /// for it to end, which its deadline bounds. On GPUs, work already enqueued is waited for
    /// before the memory it uses is freed — at most the communicator's timeout: a GPU still busy
    /// then (a stuck kernel or stream) keeps its streams, events and buffers, which are leaked
    /// rather than freed under work that may still touch them.
    pub fn abort(&self) {
        let exec = self
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .exec
            .take();
        drop(exec);
    }

    /// Shuts down cleanly and returns the first error the communicator met, if any, including
    /// errors of work that was still enqueued (waited for at most the timeout, as in `abort`).
    pub fn close(self) -> Result<()> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // Work still enqueued may fail only now; its error is the first one if none came before.
        let shutdown = match state.exec.take() {
            Some(Executor::Cuda(exec)) => exec.shutdown(),
            Some(Executor::Host(mut exec)) => exec.synchronize(),
            None => Ok(()),
        };
        if let Err(err) = shutdown {
            let _ = self.failed.set(err);
        }
        match self.failed.get() {
            Some(err) => Err(err.clone()),
            None => Ok(()),
        }
    }
}

/// A host configuration for `world` ranks within `exec::config`'s limits (and deterministic
/// mode where host ranks can give it), before anything is made.
pub(crate) fn check_host_config(world: usize, config: &HostConfig) -> Result<()> {
    config::check_world(world)?;
    config::check_slots(config.slots)?;
    config::check_chunk(
        "chunk_elems",
        config.chunk_elems,
        std::mem::size_of::<u64>(),
    )?;
    config::check_timeout(config.timeout)?;
    if config.transport == crate::Transport::Staged && config.algorithm == Algorithm::TwoShot {
        return Err(Error::InvalidArgument(
            "the two-shot reads its peers' buffers, which staged edges cannot: use the ring, the \
             one-shot (staged, through host copies) or Auto"
                .into(),
        ));
    }
    check_deterministic_if(config.deterministic, config.algorithm, world, true)
}

/// A GPU configuration for `world` ranks within `exec::config`'s limits, before anything is
/// made (deterministic mode is checked once the executor says whether peer kernels can run).
pub(crate) fn check_cuda_config(world: usize, config: &CudaConfig) -> Result<()> {
    config::check_world(world)?;
    config::check_slots(config.slots)?;
    if let Some(chunk_bytes) = config.chunk_bytes {
        config::check_chunk("chunk_bytes", chunk_bytes, 1)?;
    }
    config::check_timeout(config.timeout)
}

pub(crate) fn check_deterministic_if(
    deterministic: bool,
    algorithm: Algorithm,
    world: usize,
    peers_ok: bool,
) -> Result<()> {
    if deterministic {
        crate::exec::algorithm::check_deterministic(algorithm, world, peers_ok)?;
    }
    Ok(())
}

/// All-reduce (sum) in place over one buffer per rank: the common case in one call, with a
/// communicator built for it and closed after it.
///
/// Which algorithm runs: host buffers run the ring (reduce-scatter then all-gather) on host
/// threads, one rank per buffer. GPU buffers ([`crate::GpuBuffer`]) run on their GPUs, one rank
/// per buffer in the order given, with [`crate::Algorithm::Auto`]: despite the function's name
/// (the design card's), small and medium messages run the one-shot or two-shot peer kernels and
/// large ones the copy-engine ring, by the rule in [`crate::exec::algorithm`]. For a fixed
/// algorithm, or for many calls, build a [`Communicator`] with a [`crate::CudaConfig`].
///
/// ```
/// let mut bufs = vec![vec![1u64, 2, 3], vec![10, 20, 30]];
/// ringreduce::ring_allreduce(&mut bufs)?;
/// assert_eq!(bufs[0], [11, 22, 33]);
/// assert_eq!(bufs[1], [11, 22, 33]);
/// # Ok::<(), ringreduce::Error>(())
/// ```
///
/// # Errors
/// After a timeout, a stuck GPU may still write the buffers once this has returned: read
/// [`Communicator`]'s "A failed or timed-out call" before freeing or reusing them.
pub fn ring_allreduce<T: Element, B: BufferMut<T>>(bufs: &mut [B]) -> Result<()> {
    if bufs.is_empty() {
        return Err(Error::NoBuffers);
    }
    let devices: Vec<usize> = bufs
        .iter()
        .filter_map(|b| match b.placement() {
            Placement::Device(d) => Some(d),
            Placement::Host => None,
        })
        .collect();
    let comm = if devices.is_empty() {
        let ring = HostConfig {
            algorithm: crate::Algorithm::Ring,
            ..HostConfig::default()
        };
        Communicator::host_with(bufs.len(), ring)?
    } else {
        Communicator::new(&devices)?
    };
    comm.all_reduce_in_place(bufs, ReduceOp::Sum)?;
    comm.close()
}
