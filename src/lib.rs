//! # ringreduce
//!
//! Collective communication across the GPUs of one host, written to be read: an all-reduce that
//! beats NCCL on large messages over NVLink, and a teaching reference for multi-GPU CUDA that
//! walks the road from devices and peer access to ring collectives (the guide in `docs/guide/`
//! follows it chapter by chapter, with numbered examples in `examples/`).
//!
//! ## Quick start: host ranks (no GPU needed)
//!
//! A communicator of host ranks runs the same plans as the GPUs, on threads; it is the reference
//! every GPU result is checked against, and a CPU all-reduce in its own right.
//!
//! ```
//! use ringreduce::{Communicator, ReduceOp};
//!
//! let comm = Communicator::host(3)?;
//! let mut grads = vec![vec![1.0f32, 2.0], vec![10.0, 20.0], vec![100.0, 200.0]];
//! comm.all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
//! assert!(grads.iter().all(|g| g == &[111.0, 222.0]));
//! comm.close()?;
//! # Ok::<(), ringreduce::Error>(())
//! ```
//!
//! ## Quick start: GPUs
//!
//! One rank per GPU, one buffer per rank. Where GPUs reach each other the data moves over
//! peer copies and peer reads (NVLink or PCIe); elsewhere it is staged through pinned host memory.
//!
//! ```no_run
//! use ringreduce::{Communicator, GpuBuffer, ReduceOp};
//!
//! let comm = Communicator::new(&[0, 1])?;
//! let mut grads: Vec<GpuBuffer<f32>> = (0..2)
//!     .map(|gpu| GpuBuffer::from_host(gpu, &vec![gpu as f32; 1 << 20]))
//!     .collect::<ringreduce::Result<_>>()?;
//! comm.all_reduce_in_place(&mut grads, ReduceOp::Avg)?; // returns when complete
//! for e in comm.edges() {
//!     println!("{e:?}"); // each ring edge: transport, link, probed bandwidth
//! }
//! comm.close()?;
//! # Ok::<(), ringreduce::Error>(())
//! ```
//!
//! ## Every collective
//!
//! Beside the all-reduce, a communicator runs NCCL's other collectives, with NCCL's counts,
//! roots and in-place layouts (`examples/11_collectives.rs`; the lengths per collective are
//! tabled in [`plan::Collective`]'s module, the buffer lists in `comm/collectives.rs`). Each has
//! two forms, both proved by the checker like the all-reduce: the ring's (copy-engine pushes into
//! the receiver's memory, pairwise reduces, events; the modules below) and, for all but send/recv,
//! the one-shot's (every rank reads what it needs straight from the others' buffers between two
//! barriers, one SM kernel per GPU; [`plan::oneshot`]). [`Algorithm::Auto`] takes the one-shot
//! for small messages and the ring above; the all-reduce has its own algorithms — one
//! selection, [`exec::algorithm::select`], decides for every collective, by size, placement,
//! world and how the ranks reach each other ([`exec::algorithm::Reach`]); host and GPU
//! communicators run both forms.
//!
//! - **Reduce-scatter** ([`Communicator::reduce_scatter`], `_in_place`): rank r gets block r of
//!   the reduction of every rank's world·count input. The ring's first half, on blocks
//!   ([`plan::reducescatter`]); in place, the result is block r of the rank's buffer.
//! - **All-gather** ([`Communicator::all_gather`], `_in_place`): every rank gets every rank's
//!   count elements, rank j's in block j. The ring's second half ([`plan::allgather`]); in place,
//!   rank r's input is block r of its buffer.
//! - **Broadcast** ([`Communicator::broadcast`], `_in_place`): every rank gets the root's
//!   buffer, chunk by chunk down a chain ([`plan::broadcast`]).
//! - **Reduce** ([`Communicator::reduce`], `_in_place`): the root gets the reduction, folded
//!   down a chain that ends at the root ([`plan::reduce`]); other ranks' buffers are untouched.
//! - **All-to-all** ([`Communicator::all_to_all`]): rank r's output block j is rank j's input
//!   block r, pushed directly ([`plan::alltoall`]).
//! - **Grouped send/recv** ([`Communicator::send_recv`]): a list of (from, to) transfers in one
//!   call, so a pipeline's exchange cannot deadlock ([`plan::sendrecv`]).
//!
//! One generic entry, [`Communicator::enqueue_collective`], takes any [`Collective`], the
//! buffers and optionally the caller's streams; the named methods above are its blocking forms.
//!
//! ```
//! use ringreduce::{Communicator, ReduceOp};
//!
//! let comm = Communicator::host(2)?;
//! let inputs = vec![vec![1i32, 2, 3, 4], vec![10, 20, 30, 40]];
//! let mut outputs = vec![vec![0i32; 2]; 2];
//! comm.reduce_scatter(&inputs, &mut outputs, ReduceOp::Sum)?;
//! assert_eq!(outputs, [[11, 22], [33, 44]]);
//! let mut gathered = vec![vec![0i32; 4]; 2];
//! comm.all_gather(&outputs, &mut gathered)?;
//! assert_eq!(gathered[1], [11, 22, 33, 44]);
//! # Ok::<(), ringreduce::Error>(())
//! ```
//!
//! ## In a job: the caller's streams and cudarc's buffers
//!
//! A training step's gradients come from a kernel on the job's own stream. cudarc's
//! `CudaSlice`, `CudaView` and `CudaViewMut` are buffers (their read/write events respected), and
//! [`Communicator::enqueue_all_reduce_in_place_on`] orders the collective on the job's streams
//! (one `Arc<CudaStream>` per rank): after the kernel that wrote the gradients, before the next
//! one, with no host synchronisation (`examples/10_cudarc_streams.rs`). To overlap on the
//! communicator's own streams without `unsafe`, use [`Communicator::scope`].
//!
//! The same call on streams being captured into CUDA graphs becomes part of the graphs (one
//! graph per GPU, or one for all): every algorithm replays correctly any number of times, since
//! barrier epochs and event counters live in device memory and advance there. Run each shape
//! once before capturing it (preparing a shape allocates), replay every rank's graph as often as
//! the others, and keep the communicator open while its graphs may run; what cannot be captured
//! (a ring staged through host memory) is refused with [`Error::NotCapturable`].
//!
//! ## Beyond one host
//!
//! A job on several hosts runs each collective in two levels ([`plan::hierarchy`]): within each
//! host on ringreduce's plans, across hosts on an engine made for networks, one group per local
//! index — NCCL, loaded at run time, for GPU ranks ([`RankCommunicator::gpu`] finds the hosts
//! itself); one the caller passes for host ranks ([`RankCommunicator::host_across`] with an
//! [`InterHostFactory`]). The
//! stages are proven like plans ([`check::check_hierarchy`]); `docs/guide/10-beyond-one-host.md`
//! teaches the 2D all-reduce and its cost.
//!
//! ## How it is built: plan → check → execute → communicator
//!
//! A collective is first compiled into data, a [`plan::Plan`]: per rank, a list of operations on
//! named streams (copy, reduce, record an event, wait on an event, the peer reduce between
//! barriers, and the exposure of a buffer for a peer reduce). The checker proves the plan on the
//! CPU before anything runs; an executor then runs exactly those operations, on host threads or
//! on GPU streams — fusing several into one kernel only where the plan says it may (a `fused`
//! peer reduce, an exposure) and the checker proved that safe.
//!
//! | layer | module | what lives there |
//! |---|---|---|
//! | types | [`element`], [`buffer`], [`error`] | element types and operators, buffers and where they live, the one error type |
//! | plan | [`plan`] | every collective compiled into data: the all-reduce's ring, one-shot and two-shot, and the other collectives' planners, each with its diagram and step table; a job on several hosts as stages of two levels ([`plan::hierarchy`]) |
//! | check | [`check`] | proves a plan: shape (and what executors may fuse), enqueue order (no deadlock), no data race over calls, the exact symbolic result of its collective; the scaling and cell lemmas prove a new message size by comparison |
//! | device | [`device`] | the CUDA driver layer: contexts, peer access, memory and pools, streams and events, and the gate that keeps this crate's blocking calls off spinning kernels |
//! | topology | [`topo`] | link classes (NVLink, PCIe, host), detection through NVML, the ring order |
//! | execute | [`exec`] | [`exec::host`] (host threads, or one host rank per process over shared memory) and [`exec::cuda`] (GPUs: one executor per rank over a fabric, one enqueue for every path, event counters between ranks, copy-engine ring, the peer kernels — one-shot, two-shot, LL, the other collectives' steps — their launches and layout checks, edge probe); [`exec::algorithm`] picks the algorithm for every collective; [`exec::profile`] times the host phases of a call (`CudaConfig::profile_host`) |
//! | API | [`comm`] | [`Communicator`] and [`ring_allreduce`] |
//! | tests | [`verify`] | exact rank- and index-dependent test data, shared by tests, CLI and benches |
//!
//! ### One all-reduce, from the API to the kernel
//!
//! A GPU one-shot all-reduce passes eight functions, each in its layer: `Communicator::
//! all_reduce_in_place` → `submit_collective` (`comm/dispatch.rs`: validated once, the
//! executor's lock) → `CudaExecutor::run` (`exec/cuda/executor/callers.rs`: published and
//! checked, the caller's streams fenced, the plan prepared or cached, the buffers laid out) →
//! `run_inline` (`launch.rs`: every rank from the caller's thread, or its launchers) →
//! `enqueue_rank` (one rank's program) → `CudaEnqueue::enqueue` (`enqueue.rs`: one
//! instruction; the kernel's arguments from the plan, `oneshot_args` in `peer_enqueue.rs`) →
//! `KernelModule::oneshot` (`kernels/oneshot_kernel.rs`: the arguments checked) →
//! `device::launch_kernel` (the crate's one `cuLaunchKernel`). Under the NCCL API
//! (ringreduce-nccl), `ncclAllReduce` → `submit` (the call checked by `RankCommunicator::
//! checked_collective`, which returns) → `RankCommunicator::enqueue` reach the same
//! `CudaExecutor::run`, nine functions in all; 8 bytes take `KernelModule::ll` (its arguments
//! from `ll_args`) instead of `KernelModule::oneshot`.
//!
//! ## What the API is
//!
//! The root's re-exports below are the API a job needs: [`Communicator`] (and [`Scope`],
//! [`ring_allreduce`]) for every rank in one process, [`RankCommunicator`] for one rank per
//! process (with [`UniqueId`] and [`LaunchEnv`], how the processes meet; [`InterHost`] and
//! [`InterHostFactory`] between hosts), the buffers ([`GpuBuffer`], [`GpuView`], [`GpuViewMut`], host `Vec`s and
//! slices, cudarc's slices), the element types and operators, [`Error`], the configurations
//! ([`CudaConfig`], [`HostConfig`], [`Algorithm`], [`Transport`]) and what a call ran ([`Ran`],
//! [`Form`]). The host executor's fault injection (`Fault`, `FaultKind`, `HostConfig`'s `fault`
//! and `delay_seed`) is a test knob, public for the crate's tests and hidden from these docs.
//! The layer modules are public on purpose too, for readers
//! and tools: [`plan`] and [`check`] (build a plan, prove it — the CLI's `plan` command does),
//! [`topo`] (link classes and the ring order), [`device`] (the driver layer, for programs that
//! teach it), [`verify`] (exact test data for a job's own checks), [`exec::algorithm`] (the rules
//! and their thresholds), [`exec::profile`] (a call's host phases) and [`exec::config`] (the limits
//! a configuration is checked against). The raw kernel launchers are not API: the crate's own
//! GPU tests reach them through a hidden `internal` module, and nothing else should.
//!
//! Imports run from higher layers to lower ones only. The `ringreduce` command (`cli/`: run,
//! info, bench, plan, topo, p2p, sync, tour, launch) and the criterion benches (`benches/`) are users of
//! this API, not part of it; the NCCL baseline they measure against lives there too.
//!
//! ## Where to read next
//!
//! - [`plan`]: the ring all-reduce as a diagram and a step table, the one-shot beside it.
//! - [`exec`]: the event handoff — why a wait must be enqueued after its record — and how the
//!   GPU executor's counters carry a wait between ranks instead.
//! - [`device`]: peer access, asked per direction, and how it silently degrades.
//! - `docs/guide/`: the article's road, chapter by chapter; `docs/PERFORMANCE.md`: what was
//!   measured against NCCL and how; `docs/ERRORS.md`: every bad input and fault, and its error.
#![warn(missing_docs)]

pub mod buffer;
pub mod check;
pub mod comm;
pub mod device;
pub mod element;
pub mod error;
pub mod exec;
pub mod plan;
pub mod topo;
pub mod verify;

#[doc(hidden)]
pub mod internal;

pub use buffer::{Buffer, BufferMut, DeviceMemory, Placement, StreamUse};
pub use comm::{
    ring_allreduce, AbortHandle, Communicator, PeerOp, RankCall, RankCommunicator, Registration,
    Scope,
};
pub use device::{device_count, driver_available};
pub use element::{DType, Element, ReduceOp, F8E4M3, F8E5M2};
pub use error::{Error, Result};
pub use exec::algorithm::{Form, Ran};
pub use exec::cuda::kernels::PreMul;
pub use exec::cuda::{CudaConfig, EdgeInfo, GpuBuffer, GpuView, GpuViewMut, Transport};
pub use exec::hierarchy::{InterHost, InterHostFactory};
pub use exec::host::HostConfig;
// Test knobs (`HostConfig::fault`), kept out of the API's docs.
#[doc(hidden)]
pub use exec::host::{Fault, FaultKind};
pub use exec::rendezvous::{LaunchEnv, UniqueId};
pub use exec::Algorithm;
/// The crate of the 16-bit float types, for [`with_element!`]'s expansion.
#[doc(hidden)]
pub use half;
pub use plan::{Collective, EdgeTransport, Transfer};
