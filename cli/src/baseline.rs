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
//! NCCL's C API as the library calls it ([`ringreduce::exec::nccl::Api`], on the library's
//! loader): the signatures NCCL documents, each looked up by name once (a function an older
//! libnccl lacks is an [`Error::Nccl`] of code −1 naming it when called, never a panic), and every
//! NCCL status turned into an [`Error::Nccl`] with NCCL's own text in one function
//! (`Api::check`). NCCL's C types and the element-type and operator codes are the library's
//! (`exec::nccl::abi`). Every error is ringreduce's [`Error`].
//!
//! # Finding libnccl
//!
//! Exactly as the library finds it ([`ringreduce::exec::nccl`]'s module doc has the order):
//! `RINGREDUCE_NCCL_PATH` (the file), else a `libnccl.so.2` the process has already loaded, else
//! the first `libnccl.so.2` on `LD_LIBRARY_PATH` or in the usual system folders. One process loads
//! one NCCL, shared with the library's own NCCL use. [`nccl_present`] says whether there is one;
//! [`nccl_missing`] says how to name it when there is not.
//!
//! # Environment
//!
//! NCCL reads its environment (`NCCL_ALGO`, `NCCL_P2P_DISABLE`, `NCCL_NVLS_ENABLE`, ...) once, when
//! the first communicator is made; to compare settings, run each in its own process.
//! `NCCL_NVLS_ENABLE` must stay 0 on the shared test machines (no NVLink multicast), and NCCL's
//! anchor figures were measured so.

use cudarc::driver::CudaStream;
use ringreduce::device;
use ringreduce::exec::nccl::abi::{nccl_op, nccl_type};
use ringreduce::exec::nccl::{cudaStream_t, ncclComm_t, Api, Library};
use ringreduce::{Buffer, BufferMut, Placement};
use ringreduce::{DType, Element, ReduceOp};
use ringreduce::{Error, Result};
use std::ffi::{c_int, c_void};
use std::sync::Arc;

mod collectives;
mod symmetric;
pub use symmetric::SymmetricBuffers;

/// Whether this process finds NCCL, as the library does (the module doc). Never panics.
pub fn nccl_present() -> bool {
    Library::get().is_some()
}

/// Why this process finds no NCCL and how to name one, in the library's words
/// ([`Library::require`]); `None` when it finds one.
pub fn nccl_missing() -> Option<String> {
    match Library::require("the NCCL baseline") {
        Ok(_) => None,
        Err(Error::Resource { what }) => Some(what),
        Err(other) => Some(other.to_string()),
    }
}

/// NCCL's functions ([`Api`]), or [`Error::NoGpu`] saying how to name NCCL ([`nccl_missing`]).
fn api() -> Result<&'static Api> {
    Api::get().ok_or_else(|| Error::NoGpu {
        reason: nccl_missing().unwrap_or_default(),
    })
}

/// NCCL's version code as "major.minor.patch" (NCCL ≥ 2.9 encodes 2.28.3 as 22803).
pub fn format_nccl_version(code: c_int) -> String {
    format!("{}.{}.{}", code / 10000, code % 10000 / 100, code % 100)
}

/// One NCCL communicator per GPU, all made in this process and driven from this thread, with one
/// non-blocking stream per GPU. Rank `r` is GPU `devices[r]`.
///
/// Holds raw NCCL handles, so it is neither `Send` nor `Sync`: one thread issues every group.
pub struct NcclAllReduce {
    api: &'static Api,
    devices: Vec<usize>,
    /// Empty only after `release`.
    comms: Vec<ncclComm_t>,
    streams: Vec<device::Stream>,
    version: String,
}

impl NcclAllReduce {
    /// The communicators over `devices` (rank r is GPU `devices[r]`). [`Error::NoGpu`] when there
    /// is no usable GPU or no NCCL is found (the reason says how to name one, [`nccl_missing`]),
    /// [`Error::InvalidArgument`] for an empty or repeated device list, [`Error::Nccl`] when
    /// NCCL fails.
    pub fn new(devices: &[usize]) -> Result<NcclAllReduce, Error> {
        if devices.is_empty() {
            return Err(Error::InvalidArgument(
                "NCCL needs at least one device".into(),
            ));
        }
        for (second, d) in devices.iter().enumerate() {
            if let Some(first) = devices[..second].iter().position(|e| e == d) {
                return Err(Error::DuplicateDevice {
                    device: *d,
                    first,
                    second,
                });
            }
        }
        device::driver_available()?;
        let api = api()?;
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
        // call; NCCL writes one communicator per device into `comms`.
        unsafe { api.comm_init_all(comms.as_mut_ptr(), ndev, ordinals.as_ptr()) }?;
        Ok(NcclAllReduce {
            api,
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
    ) -> Result<(), Error> {
        let count = self.check_buffers(inputs)?;
        self.check_buffers(outputs)?;
        if let Some(rank) = outputs.iter().position(|b| b.count() < count) {
            return Err(Error::OutputTooShort {
                rank,
                input: count,
                output: outputs[rank].count(),
            });
        }
        let bytes = count * std::mem::size_of::<T>();
        let sends: Vec<u64> = inputs.iter().map(Buffer::address).collect();
        let recvs: Vec<u64> = outputs.iter_mut().map(BufferMut::address_mut).collect();
        for (rank, &r) in recvs.iter().enumerate() {
            if sends
                .iter()
                .any(|&s| count > 0 && r < s + bytes as u64 && s < r + bytes as u64)
            {
                return Err(Error::Overlap { rank });
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
    ) -> Result<(), Error> {
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
    ) -> Result<(), Error> {
        let raw = self.check_streams(streams)?;
        let count = self.check_buffers(inputs)?;
        self.check_buffers(outputs)?;
        if let Some(rank) = outputs.iter().position(|b| b.count() < count) {
            return Err(Error::OutputTooShort {
                rank,
                input: count,
                output: outputs[rank].count(),
            });
        }
        let bytes = (count * std::mem::size_of::<T>()) as u64;
        let sends: Vec<u64> = inputs.iter().map(Buffer::address).collect();
        let recvs: Vec<u64> = outputs.iter_mut().map(BufferMut::address_mut).collect();
        for (rank, &r) in recvs.iter().enumerate() {
            if sends
                .iter()
                .any(|&s| count > 0 && r < s + bytes && s < r + bytes)
            {
                return Err(Error::Overlap { rank });
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
    ) -> Result<(), Error> {
        let raw = self.check_streams(streams)?;
        let count = self.check_buffers(bufs)?;
        let addresses: Vec<u64> = bufs.iter_mut().map(BufferMut::address_mut).collect();
        // SAFETY: as in `enqueue_all_reduce_in_place`; the streams as in `enqueue_all_reduce_on`.
        unsafe { self.enqueue(&addresses, &addresses, count, T::DTYPE, op, &raw) }
    }

    /// Our own streams, as NCCL takes them.
    fn own_streams(&self) -> Vec<cudaStream_t> {
        self.streams
            .iter()
            .map(|s| s.raw() as cudaStream_t)
            .collect()
    }

    /// One caller stream per rank, each on the rank's GPU; their handles, as NCCL takes them.
    fn check_streams(&self, streams: &[Arc<CudaStream>]) -> Result<Vec<cudaStream_t>> {
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
            .map(|s| s.cu_stream() as cudaStream_t)
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
        streams: &[cudaStream_t],
    ) -> Result<(), Error> {
        debug_assert!(sends.len() == self.comms.len() && recvs.len() == self.comms.len());
        debug_assert!(streams.len() == self.comms.len());
        self.api.group_start()?;
        let mut queued = Ok(());
        for (rank, comm) in self.comms.iter().enumerate() {
            // SAFETY: the addresses, their lifetime and the streams are our caller's contract;
            // `comm` is a live communicator of GPU devices[rank] (from ncclCommInitAll, destroyed
            // only in `release`), and `streams[rank]` is a live stream in that GPU's primary
            // context, the context NCCL works in. Inside a group the call only queues work.
            let call = unsafe {
                self.api.all_reduce(
                    sends[rank] as *const c_void,
                    recvs[rank] as *mut c_void,
                    count,
                    nccl_type(dtype),
                    nccl_op(op),
                    *comm,
                    streams[rank],
                )
            };
            if let Err(err) = call {
                queued = Err(err);
                break;
            }
        }
        // Always close the group, even after a failed call, so the thread is not left inside it.
        let ended = self.api.group_end();
        queued.and(ended)
    }

    /// Waits for all work queued on the streams.
    pub fn synchronize(&self) -> Result<()> {
        self.streams.iter().try_for_each(device::stream_synchronize)
    }

    /// Waits for queued work, then finalizes and destroys the communicators; returns the first
    /// error (`Drop` does the same and drops it).
    pub fn close(mut self) -> Result<(), Error> {
        self.release()
    }

    fn release(&mut self) -> Result<(), Error> {
        let comms = std::mem::take(&mut self.comms);
        if comms.is_empty() {
            return Ok(());
        }
        let mut first_error = self.synchronize().err();
        // Finalizing is collective over the clique: one thread finalizes all in one group, then
        // each is destroyed on its own.
        if let Err(err) = self.api.group_start() {
            first_error.get_or_insert(err);
        }
        for &comm in &comms {
            // SAFETY: `comm` is a live communicator from ncclCommInitAll, finalized once here.
            if let Err(err) = unsafe { self.api.comm_finalize(comm) } {
                first_error.get_or_insert(err);
            }
        }
        if let Err(err) = self.api.group_end() {
            first_error.get_or_insert(err);
        }
        for comm in comms {
            // SAFETY: `comm` is live and destroyed exactly once: `self.comms` was emptied above.
            if let Err(err) = unsafe { self.api.comm_destroy(comm) } {
                first_error.get_or_insert(err);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for NcclAllReduce {
    fn drop(&mut self) {
        // `close` returns these errors; `Drop` drops them.
        let _ = self.release();
    }
}

/// NCCL's version ("2.28.3"), or why it cannot be asked ([`Error::NoGpu`] without NCCL, the
/// reason [`nccl_missing`]'s). Loads libnccl; never panics.
pub fn nccl_version() -> Result<String, Error> {
    let mut code = 0;
    // SAFETY: `code` is a live int for NCCL to write.
    unsafe { api()?.get_version(&mut code) }?;
    Ok(format_nccl_version(code))
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
    fn versions() {
        assert_eq!(format_nccl_version(22803), "2.28.3");
        assert_eq!(format_nccl_version(21903), "2.19.3");
    }

    /// Which case of `finds_nccl_as_the_library_does` a child process runs.
    const CHILD: &str = "RINGREDUCE_CLI_BASELINE_TEST_CHILD";

    /// The file of the C library this process runs on: a shared library without NCCL's functions.
    fn libc_file() -> std::path::PathBuf {
        // SAFETY: an all-zero Dl_info is a valid value to be overwritten.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: `malloc`'s address is in the C library; `info` is writable.
        let found = unsafe { libc::dladdr(libc::malloc as *const c_void, &mut info) };
        assert!(found != 0 && !info.dli_fname.is_null(), "dladdr(malloc)");
        // SAFETY: dladdr set a NUL-terminated file name.
        let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
        std::path::PathBuf::from(name.to_str().expect("a UTF-8 path"))
    }

    /// The baseline finds NCCL where the library does: `RINGREDUCE_NCCL_PATH` names the file —
    /// here the C library, which is no NCCL, so every call is an error naming the function it
    /// lacks, not a panic — and a name that does not open is no NCCL, the reason saying how to
    /// name one. Each case runs in a child process of this test binary (the loader looks once per
    /// process).
    #[test]
    fn finds_nccl_as_the_library_does() {
        let named = std::env::var_os("RINGREDUCE_NCCL_PATH").map(std::path::PathBuf::from);
        match std::env::var(CHILD).as_deref() {
            Ok("not-nccl") => {
                let named = named.expect("the parent names the file");
                assert!(nccl_present());
                assert_eq!(Library::get().map(|l| &l.path), Some(&named));
                assert_eq!(nccl_missing(), None);
                let reason = |err| match err {
                    Err(Error::Nccl {
                        code: -1, message, ..
                    }) => message,
                    other => panic!("not a missing function's error: {other:?}"),
                };
                let version = reason(nccl_version().map(|_| ()));
                assert_eq!(
                    version,
                    format!(
                        "{} has no ncclGetVersion (too old an NCCL?)",
                        named.display()
                    )
                );
                let api = Api::get().expect("loaded");
                assert!(reason(api.group_start()).contains("has no ncclGroupStart"));
                return;
            }
            Ok("absent") => {
                assert!(!nccl_present());
                let why = nccl_missing().expect("no NCCL, so a reason");
                assert!(why.contains("RINGREDUCE_NCCL_PATH"), "{why}");
                assert_eq!(nccl_version(), Err(Error::NoGpu { reason: why }));
                return;
            }
            _ => {}
        }
        let name = "baseline::tests::finds_nccl_as_the_library_does";
        for (case, file) in [
            ("not-nccl", libc_file()),
            ("absent", "/nonexistent/libnccl.so.2".into()),
        ] {
            let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
                .args(["--exact", name, "--test-threads=1", "--nocapture"])
                .env(CHILD, case)
                .env("RINGREDUCE_NCCL_PATH", &file)
                .output()
                .expect("the child runs");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(out.status.success(), "{case}: {text}");
            assert!(
                text.contains("1 passed"),
                "{case}: the child ran no test: {text}"
            );
        }
    }

    /// Without a GPU (or NCCL), `new` fails cleanly; argument errors come first.
    #[test]
    fn new_fails_cleanly() {
        assert!(matches!(
            NcclAllReduce::new(&[]),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            NcclAllReduce::new(&[0, 0]),
            Err(Error::DuplicateDevice { .. })
        ));
        if device::driver_available().is_err() {
            assert!(matches!(NcclAllReduce::new(&[0]), Err(Error::NoGpu { .. })));
        }
    }
}
