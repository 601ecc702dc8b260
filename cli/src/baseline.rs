//! NCCL as the baseline ringreduce is measured against: one driver shared by `ringreduce bench`
//! and the criterion benchmarks (`benches/allreduce.rs`), so both time the same NCCL calls.
//!
//! [`NcclAllReduce`] opens one NCCL communicator per GPU in this process, driven from one thread
//! (`ncclCommInitAll`, as in nccl-tests' `-g n` mode), with one non-blocking stream per GPU of our
//! own ([`device::Stream`]). Every collective is a group: `ncclGroupStart`, one `ncclAllReduce` per
//! GPU, `ncclGroupEnd` (NVIDIA's single-thread, multi-GPU pattern). Buffers are ringreduce's own
//! [`ringreduce::GpuBuffer`]s or [`ringreduce::GpuViewMut`]s (plain `cuMemAlloc`), so NCCL is timed on the
//! same memory as ringreduce.
//!
//! The same calls can be ordered on the caller's streams instead
//! ([`NcclAllReduce::enqueue_all_reduce_on`], as `Communicator::enqueue_all_reduce_on` takes
//! them), which is how `bench --graph` captures NCCL into CUDA graphs; and the buffers can be
//! NCCL's symmetric memory ([`SymmetricBuffers`], `ncclMemAlloc` + `ncclCommWindowRegister`).
//!
//! # Layers
//!
//! NCCL's C API through cudarc (`nccl-02028`, `dynamic-loading`): its `sys` and `result` layers,
//! not its safe `Comm`, which works on `CudaSlice`s (with cudarc's event tracking recording events
//! around every use — time NCCL itself does not spend), keeps its handle private, and panics in
//! `Drop`. cudarc's `NcclError` prints only "NcclError" and is not `std::error::Error`, so every
//! NCCL status becomes a [`BaselineError::Nccl`] with NCCL's own text in one function,
//! `nccl_error`. The baseline's other errors are ringreduce's ([`BaselineError::Ring`]): the
//! library itself never calls NCCL, so its [`Error`] has no NCCL variant.
//!
//! # Finding libnccl
//!
//! cudarc 0.19.10 loads NCCL with `dlopen` on a fixed list of names
//! ([`nccl_library_candidates`]: `libnccl.so`, `libnccl.so.13`, `.12`, `.11`, `.10`, `.9`, `.1`,
//! ...) and takes neither a path nor an environment variable. A host with only NCCL's runtime
//! package has `libnccl.so.2`, which is not on the list: put a link named `libnccl.so` to it in a
//! folder and put that folder on `LD_LIBRARY_PATH` (`ringreduce bench` does this by itself for its
//! NCCL child processes: see [`find_libnccl_so2`]).
//!
//! # Environment
//!
//! NCCL reads its environment (`NCCL_ALGO`, `NCCL_P2P_DISABLE`, `NCCL_NVLS_ENABLE`, ...) once, when
//! the first communicator is made; to compare settings, run each in its own process.
//! `NCCL_NVLS_ENABLE` must stay 0 on the shared test machines (no NVLink multicast), and NCCL's
//! anchor figures were measured so.

use cudarc::driver::CudaStream;
use cudarc::nccl::{result as nccl, sys as nccl_sys};
use ringreduce::device;
use ringreduce::{Buffer, BufferMut, Placement};
use ringreduce::{DType, Element, ReduceOp};
use ringreduce::{Error, Result};
use std::ffi::{c_int, c_void, CStr};
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;

mod collectives;
mod error;
mod symmetric;
pub use error::BaselineError;
pub use symmetric::SymmetricBuffers;

/// The names cudarc tries, in order, when it loads libnccl.
pub fn nccl_library_candidates() -> Vec<String> {
    cudarc::get_lib_name_candidates("nccl")
}

/// Whether cudarc's loader finds libnccl under one of [`nccl_library_candidates`]. Never panics.
pub fn nccl_present() -> bool {
    // SAFETY: is_culib_present only tries `dlopen` on cudarc's candidate names and closes what it
    // opened; it has no precondition and is cudarc's way to ask before its loader would panic.
    panic::catch_unwind(|| unsafe { nccl_sys::is_culib_present() }).unwrap_or(false)
}

/// Where `libnccl.so.2` lies, when cudarc's loader would not find it under its own names: the
/// folders of `LD_LIBRARY_PATH`, then the usual system folders. `None` when it is in none of them.
pub fn find_libnccl_so2() -> Option<PathBuf> {
    device::library_files("libnccl.so.2").next()
}

/// NCCL's version code as "major.minor.patch" (NCCL ≥ 2.9 encodes 2.28.3 as 22803).
pub fn format_nccl_version(code: c_int) -> String {
    format!("{}.{}.{}", code / 10000, code % 10000 / 100, code % 100)
}

/// NCCL's data type for an element type (every [`DType`] has one).
pub fn nccl_data_type(dtype: DType) -> nccl_sys::ncclDataType_t {
    use nccl_sys::ncclDataType_t::*;
    match dtype {
        DType::F16 => ncclFloat16,
        DType::BF16 => ncclBfloat16,
        DType::F32 => ncclFloat32,
        DType::F64 => ncclFloat64,
        DType::I8 => ncclInt8,
        DType::U8 => ncclUint8,
        DType::I32 => ncclInt32,
        DType::U32 => ncclUint32,
        DType::I64 => ncclInt64,
        DType::U64 => ncclUint64,
        DType::F8E4M3 => ncclFloat8e4m3,
        DType::F8E5M2 => ncclFloat8e5m2,
    }
}

/// NCCL's operator for a [`ReduceOp`] (every one has one; `Avg` is `ncclAvg`, NCCL ≥ 2.10).
pub fn nccl_red_op(op: ReduceOp) -> nccl_sys::ncclRedOp_t {
    use nccl_sys::ncclRedOp_t::*;
    match op {
        ReduceOp::Sum => ncclSum,
        ReduceOp::Prod => ncclProd,
        ReduceOp::Min => ncclMin,
        ReduceOp::Max => ncclMax,
        ReduceOp::Avg => ncclAvg,
    }
}

/// One NCCL communicator per GPU, all made in this process and driven from this thread, with one
/// non-blocking stream per GPU. Rank `r` is GPU `devices[r]`.
///
/// Holds raw NCCL handles, so it is neither `Send` nor `Sync`: one thread issues every group.
pub struct NcclAllReduce {
    devices: Vec<usize>,
    /// Empty only after `release`.
    comms: Vec<nccl_sys::ncclComm_t>,
    streams: Vec<device::Stream>,
    version: String,
}

impl NcclAllReduce {
    /// The communicators over `devices` (rank r is GPU `devices[r]`). [`Error::NoGpu`] when there
    /// is no usable GPU or libnccl cannot be loaded (the reason says what cudarc looked for),
    /// [`Error::InvalidArgument`] for an empty or repeated device list (each inside
    /// [`BaselineError::Ring`]), [`BaselineError::Nccl`] when NCCL fails.
    pub fn new(devices: &[usize]) -> Result<NcclAllReduce, BaselineError> {
        if devices.is_empty() {
            return Err(Error::InvalidArgument("NCCL needs at least one device".into()).into());
        }
        for (second, d) in devices.iter().enumerate() {
            if let Some(first) = devices[..second].iter().position(|e| e == d) {
                return Err(Error::DuplicateDevice {
                    device: *d,
                    first,
                    second,
                }
                .into());
            }
        }
        device::driver_available()?;
        if !nccl_present() {
            let hint = match find_libnccl_so2() {
                Some(path) => format!(
                    "; {} exists: link it as libnccl.so in a folder on LD_LIBRARY_PATH",
                    path.display()
                ),
                None => String::new(),
            };
            return Err(Error::NoGpu {
                reason: format!(
                    "libnccl not found: cudarc looks for {:?} on the loader path{hint}",
                    nccl_library_candidates()
                ),
            }
            .into());
        }
        let version = nccl_version()?;
        let streams = devices
            .iter()
            .map(|&d| device::context(d).and_then(|ctx| device::Stream::new(&ctx)))
            .collect::<Result<Vec<_>>>()?;
        let ordinals = devices
            .iter()
            .map(|&d| c_int::try_from(d))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| Error::InvalidArgument(format!("{devices:?} are not CUDA ordinals")))?;
        let ndev = c_int::try_from(devices.len())
            .map_err(|_| Error::InvalidArgument("too many devices".into()))?;
        let mut comms = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: `comms` has room for `ndev` handles and `ordinals` holds `ndev` distinct device
        // ordinals (checked above against the driver by `device::context`), both live for the
        // call; NCCL writes one communicator per device into `comms`. A cudarc loader panic
        // (a symbol missing from an old libnccl) is caught.
        let init = panic::catch_unwind(AssertUnwindSafe(|| unsafe {
            nccl::comm_init_all(comms.as_mut_ptr(), ndev, ordinals.as_ptr())
        }))
        .map_err(|_| Error::NoGpu {
            reason: "libnccl loaded but ncclCommInitAll could not be called".into(),
        })?;
        init.map_err(nccl_error("ncclCommInitAll"))?;
        Ok(NcclAllReduce {
            devices: devices.to_vec(),
            comms,
            streams,
            version,
        })
    }

    /// NCCL's version, "2.28.3".
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The GPUs, by rank.
    pub fn devices(&self) -> &[usize] {
        &self.devices
    }

    /// Rank `rank`'s stream, on which its collectives run (for timing events).
    pub fn stream(&self, rank: usize) -> Option<&device::Stream> {
        self.streams.get(rank)
    }

    /// Out of place: every `outputs[r]` gets the reduction of all `inputs` over their first
    /// `inputs[0].count()` elements; returns once the work is enqueued on the streams.
    ///
    /// # Safety
    /// Inputs and outputs must stay allocated, inputs unwritten and outputs neither read nor
    /// written (on any stream or the host), until [`NcclAllReduce::synchronize`] has returned.
    pub unsafe fn enqueue_all_reduce<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        inputs: &[I],
        outputs: &mut [O],
        op: ReduceOp,
    ) -> Result<(), BaselineError> {
        let count = self.check_buffers(inputs)?;
        self.check_buffers(outputs)?;
        if let Some(rank) = outputs.iter().position(|b| b.count() < count) {
            return Err(Error::OutputTooShort {
                rank,
                input: count,
                output: outputs[rank].count(),
            }
            .into());
        }
        let bytes = count * std::mem::size_of::<T>();
        let sends: Vec<u64> = inputs.iter().map(Buffer::address).collect();
        let recvs: Vec<u64> = outputs.iter_mut().map(BufferMut::address_mut).collect();
        for (rank, &r) in recvs.iter().enumerate() {
            if sends
                .iter()
                .any(|&s| count > 0 && r < s + bytes as u64 && s < r + bytes as u64)
            {
                return Err(Error::Overlap { rank }.into());
            }
        }
        // SAFETY: checked above: one buffer per rank on that rank's GPU, each of at least `count`
        // elements of T; no output overlaps an input. Lifetimes are our caller's contract.
        unsafe { self.enqueue(&sends, &recvs, count, T::DTYPE, op, &self.own_streams()) }
    }

    /// In place: every `bufs[r]` ends with the reduction of all; returns once enqueued.
    ///
    /// # Safety
    /// The buffers must stay allocated and untouched (no reads, no writes, on any stream or the
    /// host) until [`NcclAllReduce::synchronize`] has returned.
    pub unsafe fn enqueue_all_reduce_in_place<T: Element, B: BufferMut<T>>(
        &self,
        bufs: &mut [B],
        op: ReduceOp,
    ) -> Result<(), BaselineError> {
        let count = self.check_buffers(bufs)?;
        let addresses: Vec<u64> = bufs.iter_mut().map(BufferMut::address_mut).collect();
        // SAFETY: checked above; send and receive are the same range, which NCCL documents as in
        // place. Lifetimes are our caller's contract.
        unsafe {
            self.enqueue(
                &addresses,
                &addresses,
                count,
                T::DTYPE,
                op,
                &self.own_streams(),
            )
        }
    }

    /// [`NcclAllReduce::enqueue_all_reduce`] on the caller's streams, one per rank (cudarc streams
    /// of each rank's GPU, in its primary context), as `Communicator::enqueue_all_reduce_on` takes
    /// them: the group runs after the work already queued there. Inside a stream capture the
    /// calls are captured, not run.
    ///
    /// # Safety
    /// As [`NcclAllReduce::enqueue_all_reduce`], until each rank's stream has passed the call
    /// (`synchronize` on the caller's streams, not [`NcclAllReduce::synchronize`]).
    pub unsafe fn enqueue_all_reduce_on<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        inputs: &[I],
        outputs: &mut [O],
        op: ReduceOp,
        streams: &[Arc<CudaStream>],
    ) -> Result<(), BaselineError> {
        let raw = self.check_streams(streams)?;
        let count = self.check_buffers(inputs)?;
        self.check_buffers(outputs)?;
        if let Some(rank) = outputs.iter().position(|b| b.count() < count) {
            return Err(Error::OutputTooShort {
                rank,
                input: count,
                output: outputs[rank].count(),
            }
            .into());
        }
        let bytes = (count * std::mem::size_of::<T>()) as u64;
        let sends: Vec<u64> = inputs.iter().map(Buffer::address).collect();
        let recvs: Vec<u64> = outputs.iter_mut().map(BufferMut::address_mut).collect();
        for (rank, &r) in recvs.iter().enumerate() {
            if sends
                .iter()
                .any(|&s| count > 0 && r < s + bytes && s < r + bytes)
            {
                return Err(Error::Overlap { rank }.into());
            }
        }
        // SAFETY: as in `enqueue_all_reduce`; `raw[r]` is a live stream of GPU devices[r]
        // (checked by `check_streams`), kept alive by the caller's `Arc`s for the call.
        unsafe { self.enqueue(&sends, &recvs, count, T::DTYPE, op, &raw) }
    }

    /// [`NcclAllReduce::enqueue_all_reduce_in_place`] on the caller's streams (see
    /// [`NcclAllReduce::enqueue_all_reduce_on`]).
    ///
    /// # Safety
    /// As [`NcclAllReduce::enqueue_all_reduce_in_place`], until each rank's stream has passed the
    /// call.
    pub unsafe fn enqueue_all_reduce_in_place_on<T: Element, B: BufferMut<T>>(
        &self,
        bufs: &mut [B],
        op: ReduceOp,
        streams: &[Arc<CudaStream>],
    ) -> Result<(), BaselineError> {
        let raw = self.check_streams(streams)?;
        let count = self.check_buffers(bufs)?;
        let addresses: Vec<u64> = bufs.iter_mut().map(BufferMut::address_mut).collect();
        // SAFETY: as in `enqueue_all_reduce_in_place`; the streams as in `enqueue_all_reduce_on`.
        unsafe { self.enqueue(&addresses, &addresses, count, T::DTYPE, op, &raw) }
    }

    /// Our own streams, as NCCL takes them.
    fn own_streams(&self) -> Vec<nccl_sys::cudaStream_t> {
        self.streams
            .iter()
            .map(|s| s.raw() as nccl_sys::cudaStream_t)
            .collect()
    }

    /// One caller stream per rank, each on the rank's GPU; their handles, as NCCL takes them.
    fn check_streams(&self, streams: &[Arc<CudaStream>]) -> Result<Vec<nccl_sys::cudaStream_t>> {
        if streams.len() != self.devices.len() {
            return Err(Error::InvalidArgument(format!(
                "{} streams for {} ranks: one stream per rank",
                streams.len(),
                self.devices.len()
            )));
        }
        for (rank, (stream, &device)) in streams.iter().zip(&self.devices).enumerate() {
            let on = stream.context().ordinal();
            if on != device {
                return Err(Error::InvalidArgument(format!(
                    "rank {rank}'s stream is on GPU {on}, the rank is GPU {device}"
                )));
            }
        }
        Ok(streams
            .iter()
            .map(|s| s.cu_stream() as nccl_sys::cudaStream_t)
            .collect())
    }

    /// One buffer per rank, on the rank's GPU, all of rank 0's length; returns that length.
    fn check_buffers<T: Element, B: Buffer<T>>(&self, bufs: &[B]) -> Result<usize> {
        if bufs.is_empty() {
            return Err(Error::NoBuffers);
        }
        if bufs.len() != self.devices.len() {
            return Err(Error::WorldMismatch {
                world: self.devices.len(),
                got: bufs.len(),
            });
        }
        let count = bufs[0].count();
        for (rank, (buf, &expected)) in bufs.iter().zip(&self.devices).enumerate() {
            on_gpu(rank, buf.placement(), expected)?;
            if buf.count() != count {
                return Err(Error::LengthMismatch {
                    rank,
                    expected: count,
                    got: buf.count(),
                });
            }
        }
        count
            .checked_mul(std::mem::size_of::<T>())
            .ok_or(Error::SizeOverflow {
                count,
                dtype: T::DTYPE,
            })?;
        Ok(count)
    }

    /// # Safety
    /// `sends[r]` and `recvs[r]` are device addresses on GPU `devices[r]`, valid for `count`
    /// elements of `dtype`, each receive range either equal to its send range or overlapping no
    /// send range, and they stay valid and untouched by others until `streams` have passed the
    /// call; `streams[r]` is a live stream in GPU `devices[r]`'s primary context.
    unsafe fn enqueue(
        &self,
        sends: &[u64],
        recvs: &[u64],
        count: usize,
        dtype: DType,
        op: ReduceOp,
        streams: &[nccl_sys::cudaStream_t],
    ) -> Result<(), BaselineError> {
        debug_assert!(sends.len() == self.comms.len() && recvs.len() == self.comms.len());
        debug_assert!(streams.len() == self.comms.len());
        nccl::group_start().map_err(nccl_error("ncclGroupStart"))?;
        let mut queued = Ok(());
        for (rank, comm) in self.comms.iter().enumerate() {
            // SAFETY: the addresses, their lifetime and the streams are our caller's contract;
            // `comm` is a live communicator of GPU devices[rank] (from ncclCommInitAll, destroyed
            // only in `release`), and `streams[rank]` is a live stream in that GPU's primary
            // context, the context NCCL works in. Inside a group the call only queues work.
            let call = unsafe {
                nccl::all_reduce(
                    sends[rank] as *const c_void,
                    recvs[rank] as *mut c_void,
                    count,
                    nccl_data_type(dtype),
                    nccl_red_op(op),
                    *comm,
                    streams[rank],
                )
            };
            if let Err(err) = call {
                queued = Err(nccl_error("ncclAllReduce")(err));
                break;
            }
        }
        // Always close the group, even after a failed call, so the thread is not left inside it.
        let ended = nccl::group_end().map_err(nccl_error("ncclGroupEnd"));
        queued.and(ended.map(|_| ()))
    }

    /// Waits for all work queued on the streams.
    pub fn synchronize(&self) -> Result<()> {
        self.streams.iter().try_for_each(device::stream_synchronize)
    }

    /// Waits for queued work, then finalizes and destroys the communicators; returns the first
    /// error (`Drop` does the same and drops it).
    pub fn close(mut self) -> Result<(), BaselineError> {
        self.release()
    }

    fn release(&mut self) -> Result<(), BaselineError> {
        let comms = std::mem::take(&mut self.comms);
        if comms.is_empty() {
            return Ok(());
        }
        let mut first_error = self.synchronize().err().map(BaselineError::from);
        // Finalizing is collective over the clique: one thread finalizes all in one group, then
        // each is destroyed on its own.
        if let Err(err) = nccl::group_start() {
            first_error.get_or_insert(nccl_error("ncclGroupStart")(err));
        }
        for &comm in &comms {
            // SAFETY: `comm` is a live communicator from ncclCommInitAll, finalized once here.
            if let Err(err) = unsafe { nccl::comm_finalize(comm) } {
                first_error.get_or_insert(nccl_error("ncclCommFinalize")(err));
            }
        }
        if let Err(err) = nccl::group_end() {
            first_error.get_or_insert(nccl_error("ncclGroupEnd")(err));
        }
        for comm in comms {
            // SAFETY: `comm` is live and destroyed exactly once: `self.comms` was emptied above.
            if let Err(err) = unsafe { nccl::comm_destroy(comm) } {
                first_error.get_or_insert(nccl_error("ncclCommDestroy")(err));
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for NcclAllReduce {
    fn drop(&mut self) {
        // `close` returns these errors; `Drop` drops them, and never panics (cudarc's loader can).
        let _ = panic::catch_unwind(AssertUnwindSafe(|| self.release()));
    }
}

/// NCCL's version ("2.28.3"), or why it cannot be asked. Loads libnccl; never panics.
pub fn nccl_version() -> Result<String, BaselineError> {
    if !nccl_present() {
        return Err(Error::NoGpu {
            reason: format!(
                "libnccl not found under cudarc's names {:?}",
                nccl_library_candidates()
            ),
        }
        .into());
    }
    panic::catch_unwind(nccl::get_nccl_version)
        .map_err(|_| Error::NoGpu {
            reason: "libnccl loaded but ncclGetVersion could not be called".into(),
        })?
        .map_err(nccl_error("ncclGetVersion"))
        .map(format_nccl_version)
}

/// Converts a cudarc `NcclError` from `call` into [`BaselineError::Nccl`] with NCCL's own words:
/// the code's name and description, and NCCL's last error message. The one place an NCCL status
/// becomes an error.
fn nccl_error(call: &'static str) -> impl FnOnce(nccl::NcclError) -> BaselineError {
    move |err| {
        let code = err.0;
        // SAFETY: ncclGetErrorString takes any result code and returns a static NUL-terminated
        // string (or null, checked); the library is loaded, since it produced `code`.
        let text = c_text(unsafe { nccl_sys::ncclGetErrorString(code) });
        // SAFETY: ncclGetLastError ignores its argument and returns NCCL's last error message,
        // NUL-terminated (or null, checked); it is copied before any other NCCL call.
        let last = c_text(unsafe { nccl_sys::ncclGetLastError(std::ptr::null_mut()) });
        BaselineError::Nccl {
            call,
            code: format!("{code:?}"),
            message: format!("{text}; NCCL's last error: {last}"),
        }
    }
}

/// Converts a cudarc `DriverError` from `call` (the calls this crate makes through cudarc's driver
/// API: stream capture, copies into NCCL's memory) into [`Error::Cuda`] with the driver's text.
/// The one place in this crate a CUDA status becomes an [`Error`].
pub fn cuda_error(call: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
    move |err| Error::Cuda {
        call,
        code: format!("{:?}", err.0),
        message: err
            .error_string()
            .map(|m| m.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "(the driver has no message for this code)".into()),
    }
}

/// The text of a C string from NCCL, or "(none)" for null.
fn c_text(ptr: *const std::ffi::c_char) -> String {
    if ptr.is_null() {
        return "(none)".to_string();
    }
    // SAFETY: non-null, and our callers pass pointers NCCL documents as NUL-terminated strings
    // that stay valid until the next NCCL call on this thread.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

/// Rank `rank`'s buffer must be device memory of GPU `expected` (NCCL works on GPU buffers): the
/// named error otherwise.
fn on_gpu(rank: usize, placement: Placement, expected: usize) -> Result<()> {
    match placement {
        Placement::Device(device) if device == expected => Ok(()),
        Placement::Device(device) => Err(Error::WrongDevice {
            rank,
            device,
            expected,
        }),
        got @ Placement::Host => Err(Error::WrongPlacement {
            rank,
            got,
            expected: "device memory (NCCL works on GPU buffers)",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_type_maps() {
        assert_eq!(format_nccl_version(22803), "2.28.3");
        assert_eq!(format_nccl_version(21903), "2.19.3");
        let types: std::collections::HashSet<u32> = DType::ALL
            .iter()
            .map(|&d| nccl_data_type(d) as u32)
            .collect();
        assert_eq!(types.len(), DType::ALL.len(), "one NCCL type per DType");
        let ops: std::collections::HashSet<u32> = ReduceOp::ALL
            .iter()
            .map(|&o| nccl_red_op(o) as u32)
            .collect();
        assert_eq!(ops.len(), ReduceOp::ALL.len());
        assert!(nccl_library_candidates().contains(&"libnccl.so".to_string()));
    }

    /// Without a GPU (or NCCL), `new` fails cleanly; argument errors come first.
    #[test]
    fn new_fails_cleanly() {
        assert!(matches!(
            NcclAllReduce::new(&[]),
            Err(BaselineError::Ring(Error::InvalidArgument(_)))
        ));
        assert!(matches!(
            NcclAllReduce::new(&[0, 0]),
            Err(BaselineError::Ring(Error::DuplicateDevice { .. }))
        ));
        if device::driver_available().is_err() {
            assert!(matches!(
                NcclAllReduce::new(&[0]),
                Err(BaselineError::Ring(Error::NoGpu { .. }))
            ));
        }
    }
}
