//! CUDA graphs for `bench --graph N`: N back-to-back all-reduces captured once per size and
//! replayed, the way an application that captures its step runs them (nccl-tests' `-G`, with N
//! all-reduces in each graph).
//!
//! Each rank's stream is captured on its own (`cuStreamBeginCapture`, relaxed mode) into its own
//! graph, as one process per GPU would capture its stream; a replay launches every rank's graph on
//! its stream. The streams are the bench's own cudarc streams, one per GPU, handed to the library
//! under test (`enqueue_all_reduce[_in_place]_on`).
//!
//! Invariant: every capture that began is ended, on the error paths too, so no stream is left
//! capturing; a failed capture is an `Err`, never a panic.

use ringreduce::{Error, Result};
use ringreduce_cli::baseline::cuda_error;
use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};

/// Captures `calls` runs of `call` on every stream in `streams` (relaxed capture mode) into one
/// graph per stream, instantiated (not yet uploaded). `Err` names the call that failed (`call`'s
/// error is either library's, shown in the message).
pub(super) fn capture<E: std::fmt::Display>(
    streams: &[Arc<CudaStream>],
    calls: usize,
    mut call: impl FnMut() -> Result<(), E>,
) -> Result<Vec<CudaGraph>> {
    let mut begun = 0;
    let mut result = Ok(());
    for s in streams {
        if let Err(e) = s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED) {
            result = Err(cuda_error("cuStreamBeginCapture")(e));
            break;
        }
        begun += 1;
    }
    if result.is_ok() {
        for i in 0..calls {
            if let Err(e) = call() {
                result = Err(Error::InvalidArgument(format!(
                    "all-reduce {} of {calls} inside the stream capture failed: {e}",
                    i + 1
                )));
                break;
            }
        }
    }
    // End every capture that began, even after a failure, so no stream stays capturing.
    let mut graphs = Vec::with_capacity(begun);
    for s in &streams[..begun] {
        match s.end_capture(CUgraphInstantiate_flags(0)) {
            Ok(Some(g)) => graphs.push(g),
            Ok(None) => {
                if result.is_ok() {
                    result = Err(Error::InvalidArgument(format!(
                        "the capture of GPU {}'s stream produced no graph",
                        s.context().ordinal()
                    )));
                }
            }
            Err(e) => {
                if result.is_ok() {
                    result = Err(cuda_error("cuStreamEndCapture")(e));
                }
            }
        }
    }
    result.map(|()| graphs)
}

/// Uploads every rank's graph to its GPU, so the first replay pays no setup.
pub(super) fn upload(graphs: &[CudaGraph]) -> Result<()> {
    graphs
        .iter()
        .try_for_each(|g| g.upload().map_err(cuda_error("cuGraphUpload")))
}

/// One replay: every rank's graph launched on its stream.
pub(super) fn replay(graphs: &[CudaGraph]) -> Result<()> {
    graphs
        .iter()
        .try_for_each(|g| g.launch().map_err(cuda_error("cuGraphLaunch")))
}

/// Waits for every stream.
pub(super) fn synchronize(streams: &[Arc<CudaStream>]) -> Result<()> {
    streams
        .iter()
        .try_for_each(|s| s.synchronize().map_err(cuda_error("cuStreamSynchronize")))
}

/// One new cudarc stream per GPU (in its primary context), the bench's "caller streams".
pub(super) fn new_streams(devices: &[usize]) -> Result<Vec<Arc<CudaStream>>> {
    devices
        .iter()
        .map(|&d| {
            ringreduce::device::context(d)?
                .new_stream()
                .map_err(cuda_error("cuStreamCreate"))
        })
        .collect()
}
