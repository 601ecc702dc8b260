//! `ringreduce._native.Communicator`: one rank of a job, the core's
//! [`RankCommunicator`] behind a lock, with the interpreter released while it works.
//!
//! The Python class `ringreduce.Communicator` (ringreduce/_communicator.py) is the API; this one
//! is its engine, with one generic method per path:
//! - [`Communicator::collective`] and [`Communicator::send_recv`]: host ranks, on Python
//!   objects' memory ([`HostBuffer`]), blocking until the call is complete on this rank;
//! - [`Communicator::enqueue`] and [`Communicator::enqueue_send_recv`]: GPU ranks, on device
//!   addresses and a raw CUDA stream, as `ringreduce.torch` passes a tensor's — enqueued on the
//!   stream, returning at once.
//!
//! Every call releases the interpreter while the core works (other Python threads run), and
//! holds this communicator's lock meanwhile, so calls from several threads run one at a time.
//! A panic inside the core is caught: the call raises `ringreduce.InternalError` and the
//! communicator is failed from then on (as the core's own failures leave it).

use crate::arguments::{
    collective_of, common_dtype, device_memory, index, op_of, slice, slice_mut, transfers_of,
    writable,
};
use crate::buffer::HostBuffer;
use crate::dtype;
use crate::errors::{argument, Failure};
use crate::layout::{self, Layout, Span};
use crate::unique_id::UniqueId;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use ringreduce::device::CallerStream;
use ringreduce::with_element;
use ringreduce::{CudaConfig, DeviceMemory, Error, HostConfig, LaunchEnv, RankCommunicator};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// One rank of a job (module doc). Made by `ringreduce.Communicator`.
#[pyclass(module = "ringreduce._native", name = "Communicator")]
pub struct Communicator {
    rank: usize,
    world: usize,
    device: Option<usize>,
    state: Mutex<State>,
}

/// What the lock guards.
enum State {
    /// Boxed: the communicator is large, the other states small.
    Open(Box<RankCommunicator>),
    /// `close()` was called.
    Closed,
    /// A call panicked inside the core (its message): the communicator's state is unknown.
    Panicked(String),
}

/// Where a rank runs, as `device=` says it.
#[derive(FromPyObject)]
enum DeviceArg {
    /// A GPU by index.
    Index(i64),
    /// `"local"`: the GPU the launcher's variables name (`LOCAL_RANK`, or GPU 0 where one is
    /// visible).
    Name(String),
}

/// The settings every rank of a job must share, from the constructor's keywords.
struct Options {
    timeout: Duration,
    deterministic: bool,
    allow_shared_device: bool,
}

impl Options {
    fn new(
        timeout: f64,
        deterministic: bool,
        allow_shared_device: bool,
    ) -> Result<Options, Failure> {
        let timeout = Duration::try_from_secs_f64(timeout)
            .map_err(|_| argument(format!("timeout={timeout} is not a number of seconds ≥ 0")))?;
        Ok(Options {
            timeout,
            deterministic,
            allow_shared_device,
        })
    }

    fn host(&self) -> HostConfig {
        HostConfig {
            timeout: self.timeout,
            deterministic: self.deterministic,
            ..HostConfig::default()
        }
    }

    fn gpu(&self) -> CudaConfig {
        CudaConfig {
            timeout: self.timeout,
            deterministic: self.deterministic,
            allow_shared_device: self.allow_shared_device,
            // The package has no groups of sends and receives: no channel region.
            peer_groups: false,
            ..CudaConfig::default()
        }
    }
}

impl Communicator {
    fn open(rank: RankCommunicator) -> Communicator {
        Communicator {
            rank: rank.rank(),
            world: rank.world(),
            device: rank.device(),
            state: Mutex::new(State::Open(Box::new(rank))),
        }
    }

    /// Runs `call` on the open communicator, with the interpreter released and the lock held
    /// (module doc).
    fn with_comm<R: Send>(
        &self,
        py: Python<'_>,
        call: impl FnOnce(&mut RankCommunicator) -> ringreduce::Result<R> + Send,
    ) -> Result<R, Failure> {
        py.detach(|| {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let comm = match &mut *state {
                State::Open(comm) => comm,
                State::Closed => return Err(Failure(Error::Closed)),
                State::Panicked(what) => {
                    return Err(Failure(Error::CommunicatorFailed(Box::new(
                        Error::Internal { what: what.clone() },
                    ))))
                }
            };
            match catch_unwind(AssertUnwindSafe(|| call(comm))) {
                Ok(result) => result.map_err(Failure),
                Err(payload) => {
                    let what = match (
                        payload.downcast_ref::<&str>(),
                        payload.downcast_ref::<String>(),
                    ) {
                        (Some(s), _) => format!("a panic: {s}"),
                        (_, Some(s)) => format!("a panic: {s}"),
                        _ => "a panic".to_string(),
                    };
                    *state = State::Panicked(what.clone());
                    Err(Failure(Error::Internal { what }))
                }
            }
        })
    }

    /// This rank's GPU, or `ArgumentError` for a host rank.
    fn gpu(&self) -> Result<usize, Failure> {
        self.device.ok_or_else(|| {
            argument(
                "this is a host rank: GPU tensors and streams need a GPU rank \
                 (Communicator(..., device=N)); host ranks take host buffers",
            )
        })
    }
}

// The methods' parameters are their Python signatures' (keywords included), one each.
#[allow(clippy::too_many_arguments)]
#[pymethods]
impl Communicator {
    /// Joins the job of `unique_id` as rank `rank` of `world`: a host rank where `device` is
    /// `None`, else a rank on GPU `device`. Waits (interpreter released) for every rank, at most
    /// `timeout` seconds.
    #[new]
    #[pyo3(signature = (unique_id, rank, world, device = None, *, timeout = 60.0, deterministic = false, allow_shared_device = false))]
    fn new(
        py: Python<'_>,
        unique_id: &UniqueId,
        rank: i64,
        world: i64,
        device: Option<i64>,
        timeout: f64,
        deterministic: bool,
        allow_shared_device: bool,
    ) -> Result<Communicator, Failure> {
        let options = Options::new(timeout, deterministic, allow_shared_device)?;
        let (rank, world) = (index("rank", rank)?, index("world", world)?);
        let device = device.map(|d| index("device", d)).transpose()?;
        let id = unique_id.id;
        let joined = py.detach(|| match device {
            None => RankCommunicator::host(&id, rank, world, options.host()),
            Some(device) => RankCommunicator::gpu(&id, rank, world, device, options.gpu()),
        })?;
        Ok(Communicator::open(joined))
    }

    /// Joins with the rank, world and meeting place from the launcher's variables (torchrun's:
    /// `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`;
    /// ringreduce meets at `MASTER_PORT + 1`, or `RINGREDUCE_PORT`). `device`: `None` for a host
    /// rank, a GPU index, or `"local"` for the GPU `LOCAL_RANK` names (GPU 0 where the process
    /// sees one).
    #[staticmethod]
    #[pyo3(signature = (device = None, *, timeout = 60.0, deterministic = false, allow_shared_device = false))]
    fn from_env(
        py: Python<'_>,
        device: Option<DeviceArg>,
        timeout: f64,
        deterministic: bool,
        allow_shared_device: bool,
    ) -> Result<Communicator, Failure> {
        let options = Options::new(timeout, deterministic, allow_shared_device)?;
        let device = match device {
            None => None,
            Some(DeviceArg::Index(d)) => Some(Some(index("device", d)?)),
            Some(DeviceArg::Name(name)) if name == "local" => Some(None),
            Some(DeviceArg::Name(name)) => {
                return Err(argument(format!(
                    "device={name:?}: pass None (host ranks), a GPU index or \"local\""
                )))
            }
        };
        let joined = py.detach(|| match device {
            None => RankCommunicator::from_env_host(options.host()),
            Some(None) => RankCommunicator::from_env_gpu(options.gpu()),
            Some(Some(device)) => {
                let env = LaunchEnv::from_env()?;
                RankCommunicator::gpu(
                    &env.unique_id()?,
                    env.rank,
                    env.world,
                    device,
                    options.gpu(),
                )
            }
        })?;
        Ok(Communicator::open(joined))
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    #[getter]
    fn world(&self) -> usize {
        self.world
    }

    /// This rank's GPU; `None` for a host rank.
    #[getter]
    fn device(&self) -> Option<usize> {
        self.device
    }

    /// What this rank's latest call ran (the core's `RankCommunicator::last_ran`), as a dict:
    /// `algorithm`, `form` and `reach` by name; `in_place`, `copied`, `registered`, `captured`
    /// as bools. `None` before the first call.
    fn last_ran<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(ran) = self.with_comm(py, |comm| Ok(comm.last_ran()))? else {
            return Ok(None);
        };
        let dict = PyDict::new(py);
        dict.set_item("algorithm", format!("{:?}", ran.algorithm))?;
        dict.set_item("form", format!("{:?}", ran.form))?;
        dict.set_item("reach", format!("{:?}", ran.reach))?;
        dict.set_item("in_place", ran.in_place)?;
        dict.set_item("copied", ran.copied)?;
        dict.set_item("registered", ran.registered)?;
        dict.set_item("captured", ran.captured)?;
        Ok(Some(dict))
    }

    /// True once `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        matches!(
            *self.state.lock().unwrap_or_else(PoisonError::into_inner),
            State::Closed
        )
    }

    /// A collective on host buffers (`ringreduce.Communicator`'s methods say which): `x` and
    /// `out` as src/layout.rs's rule takes them, `op` by name, `dtype` by name or from the
    /// buffers' format. Returns when the call is complete on this rank.
    #[pyo3(signature = (collective, root, x, out, op, dtype = None))]
    fn collective(
        &self,
        py: Python<'_>,
        collective: &str,
        root: i64,
        x: Option<&Bound<'_, PyAny>>,
        out: Option<&Bound<'_, PyAny>>,
        op: &str,
        dtype: Option<&str>,
    ) -> Result<(), Failure> {
        let collective = collective_of(collective, root)?;
        let op = op_of(&collective, op)?;
        if x.is_none() && out.is_none() {
            return Err(argument(format!(
                "{}: pass a buffer `x`",
                collective.name()
            )));
        }
        let named = dtype.map(dtype::from_name).transpose().map_err(argument)?;
        let x = x.map(|x| HostBuffer::of(x, "x", named)).transpose()?;
        let out = out.map(|o| HostBuffer::of(o, "out", named)).transpose()?;
        let buffers: Vec<(&str, &HostBuffer)> = [("x", &x), ("out", &out)]
            .into_iter()
            .filter_map(|(role, b)| b.as_ref().map(|b| (role, b)))
            .collect();
        let dtype = common_dtype(named, &buffers)?;
        let layout = layout::layout(
            &collective,
            self.rank,
            self.world,
            dtype.size_bytes(),
            x.as_ref().map(HostBuffer::span),
            out.as_ref().map(HostBuffer::span),
        )?;
        match layout {
            Layout::InPlace(span) => writable(span, &buffers)?,
            Layout::OutOfPlace { output, .. } => {
                if let Some(span) = output {
                    writable(span, &buffers)?;
                }
            }
        }
        // The exports (`x`, `out`) outlive the call below, which borrows their memory.
        self.with_comm(py, move |comm| {
            with_element!(dtype, T => match layout {
                Layout::InPlace(span) => {
                    // SAFETY: `span` is an export alive until this method returns (`x` or
                    // `out`), aligned for `T` and `count` elements of it (`HostBuffer::of`),
                    // writable (`writable`), and the call's only buffer. Other Python threads
                    // may run meanwhile: a caller must not touch a buffer while a call uses it
                    // (the Python API's docs say so).
                    let mut buf: &mut [T] = unsafe { slice_mut(span) };
                    comm.collective_in_place(&collective, &mut buf, op)
                }
                Layout::OutOfPlace { input, output } => {
                    // SAFETY: as above; the output is writable and overlaps no input
                    // (`layout::layout`), so the shared and the mutable borrow are disjoint.
                    let input: Option<&[T]> = input.map(|s| unsafe { slice(s) });
                    // SAFETY: as above.
                    let mut output: Option<&mut [T]> = output.map(|s| unsafe { slice_mut(s) });
                    comm.collective(&collective, input.as_ref(), output.as_mut(), op)
                }
            })
        })
    }

    /// Grouped send/recv on host buffers: every rank names the same `transfers`
    /// (`(from, to, count)` triples) and passes its own ends — `sends`, one buffer per transfer
    /// it sends, and `recvs`, one per transfer it receives, in the transfers' order.
    #[pyo3(signature = (transfers, sends, recvs, dtype = None))]
    fn send_recv(
        &self,
        py: Python<'_>,
        transfers: Vec<(i64, i64, i64)>,
        sends: Vec<Bound<'_, PyAny>>,
        recvs: Vec<Bound<'_, PyAny>>,
        dtype: Option<&str>,
    ) -> Result<(), Failure> {
        let transfers = transfers_of(&transfers)?;
        let named = dtype.map(dtype::from_name).transpose().map_err(argument)?;
        let roles = |what: &str, n: usize| -> Vec<String> {
            (0..n).map(|i| format!("{what}[{i}]")).collect()
        };
        let (send_roles, recv_roles) = (roles("sends", sends.len()), roles("recvs", recvs.len()));
        let exported = |objs: &[Bound<'_, PyAny>], roles: &[String]| {
            objs.iter()
                .zip(roles)
                .map(|(obj, role)| HostBuffer::of(obj, role, named))
                .collect::<Result<Vec<HostBuffer>, Failure>>()
        };
        let (send_bufs, recv_bufs) = (
            exported(&sends, &send_roles)?,
            exported(&recvs, &recv_roles)?,
        );
        let buffers: Vec<(&str, &HostBuffer)> = send_roles
            .iter()
            .zip(&send_bufs)
            .chain(recv_roles.iter().zip(&recv_bufs))
            .map(|(role, b)| (role.as_str(), b))
            .collect();
        let dtype = common_dtype(named, &buffers)?;
        let send_spans: Vec<Span> = send_bufs.iter().map(HostBuffer::span).collect();
        let recv_spans: Vec<Span> = recv_bufs.iter().map(HostBuffer::span).collect();
        for span in &recv_spans {
            writable(*span, &buffers)?;
        }
        layout::check_send_recv(&send_spans, &recv_spans, dtype.size_bytes())?;
        self.with_comm(py, move |comm| {
            with_element!(dtype, T => {
                // SAFETY: every span is an export alive until this method returns, aligned
                // for `T` and `count` elements of it (`HostBuffer::of`); the receives are
                // writable (`writable`) and overlap nothing else of the call
                // (`check_send_recv`). Other threads: as for `collective`.
                let sends: Vec<&[T]> = send_spans.iter().map(|&s| unsafe { slice(s) }).collect();
                // SAFETY: as above.
                let mut recvs: Vec<&mut [T]> =
                    recv_spans.iter().map(|&s| unsafe { slice_mut(s) }).collect();
                let send_refs: Vec<&&[T]> = sends.iter().collect();
                let mut recv_refs: Vec<&mut &mut [T]> = recvs.iter_mut().collect();
                comm.send_recv(&transfers, &send_refs, &mut recv_refs)
            })
        })
    }

    /// A collective on this GPU rank's memory, enqueued on the raw CUDA `stream` (a
    /// `cudaStream_t` as an integer; 0 is the legacy default stream): `x` and `out` are
    /// `(address, count)` pairs of device memory, laid out as src/layout.rs's rule takes them.
    /// Returns once enqueued.
    ///
    /// For `ringreduce.torch` alone, which passes live CUDA tensors of this rank's GPU and keeps
    /// them allocated until the stream has passed the call (the core's contract for
    /// `enqueue_collective`): nothing here can check an address.
    #[pyo3(signature = (collective, root, x, out, op, dtype, stream))]
    fn enqueue(
        &self,
        py: Python<'_>,
        collective: &str,
        root: i64,
        x: Option<(u64, usize)>,
        out: Option<(u64, usize)>,
        op: &str,
        dtype: &str,
        stream: u64,
    ) -> Result<(), Failure> {
        let device = self.gpu()?;
        let collective = collective_of(collective, root)?;
        let op = op_of(&collective, op)?;
        let dtype = dtype::from_name(dtype).map_err(argument)?;
        let span = |(address, count): (u64, usize)| Span { address, count };
        let layout = layout::layout(
            &collective,
            self.rank,
            self.world,
            dtype.size_bytes(),
            x.map(span),
            out.map(span),
        )?;
        self.with_comm(py, move |comm| {
            // SAFETY: `stream` is a live stream of this rank's GPU (or 0): the contract of
            // this method's one caller, ringreduce.torch, which passes the current stream's
            // handle while the stream object is alive.
            let stream = unsafe { CallerStream::from_raw((stream as usize as *mut std::ffi::c_void).cast()) }?;
            with_element!(dtype, T => match layout {
                Layout::InPlace(span) => {
                    // SAFETY: the span is a live CUDA tensor of GPU `device`, kept allocated
                    // until `stream` has passed the call (ringreduce.torch's contract, above),
                    // which is also the core's for the enqueue.
                    unsafe {
                        let mut buf = device_memory::<T>(span, device);
                        comm.enqueue_collective_in_place(&collective, &mut buf, op, stream)
                    }
                }
                Layout::OutOfPlace { input, output } => {
                    // SAFETY: as above, for each span; the output overlaps no input
                    // (`layout::layout`).
                    unsafe {
                        let input = input.map(|s| device_memory::<T>(s, device));
                        let mut output = output.map(|s| device_memory::<T>(s, device));
                        comm.enqueue_collective(&collective, input.as_ref(), output.as_mut(), op, stream)
                    }
                }
            })
        })
    }

    /// Grouped send/recv on this GPU rank's memory, enqueued on the raw CUDA `stream`: as
    /// `send_recv`, with `(address, count)` pairs of device memory; for `ringreduce.torch`
    /// alone (see `enqueue`).
    #[pyo3(signature = (transfers, sends, recvs, dtype, stream))]
    fn enqueue_send_recv(
        &self,
        py: Python<'_>,
        transfers: Vec<(i64, i64, i64)>,
        sends: Vec<(u64, usize)>,
        recvs: Vec<(u64, usize)>,
        dtype: &str,
        stream: u64,
    ) -> Result<(), Failure> {
        let device = self.gpu()?;
        let transfers = transfers_of(&transfers)?;
        let dtype = dtype::from_name(dtype).map_err(argument)?;
        let span = |&(address, count): &(u64, usize)| Span { address, count };
        let (send_spans, recv_spans): (Vec<Span>, Vec<Span>) = (
            sends.iter().map(span).collect(),
            recvs.iter().map(span).collect(),
        );
        layout::check_send_recv(&send_spans, &recv_spans, dtype.size_bytes())?;
        self.with_comm(py, move |comm| {
            // SAFETY: as for `enqueue`.
            let stream = unsafe {
                CallerStream::from_raw((stream as usize as *mut std::ffi::c_void).cast())
            }?;
            with_element!(dtype, T => {
                // SAFETY: as for `enqueue`, for every span; the receives overlap nothing else
                // of the call (`check_send_recv`).
                unsafe {
                    let sends: Vec<DeviceMemory<T>> =
                        send_spans.iter().map(|&s| device_memory(s, device)).collect();
                    let mut recvs: Vec<DeviceMemory<T>> =
                        recv_spans.iter().map(|&s| device_memory(s, device)).collect();
                    let send_refs: Vec<&DeviceMemory<T>> = sends.iter().collect();
                    let mut recv_refs: Vec<&mut DeviceMemory<T>> = recvs.iter_mut().collect();
                    comm.enqueue_send_recv(&transfers, &send_refs, &mut recv_refs, stream)
                }
            })
        })
    }

    /// Waits for every call this rank has enqueued (a host rank's have completed already).
    fn synchronize(&self, py: Python<'_>) -> Result<(), Failure> {
        self.with_comm(py, RankCommunicator::synchronize)
    }

    /// Leaves the job; later calls raise `ringreduce.Closed`. Idempotent.
    fn close(&self, py: Python<'_>) {
        py.detach(|| {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            // A GPU rank's teardown waits for its peers' (bounded by the timeout): dropped
            // here, with the interpreter released.
            drop(std::mem::replace(&mut *state, State::Closed));
        });
    }

    fn __repr__(&self) -> String {
        let device = self
            .device
            .map_or_else(|| "None".to_string(), |d| d.to_string());
        format!(
            "Communicator(rank={}, world={}, device={device})",
            self.rank, self.world
        )
    }
}
