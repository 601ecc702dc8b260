//! Collectives captured into CUDA graphs (GPU): each rank's stream captured into its own graph
//! (as one process per GPU would), several all-reduces per graph, replayed many times with new
//! inputs before every replay and every result checked exactly, for every algorithm; a graph
//! whose peer is never replayed gives up with a named error instead of hanging. On a one-GPU
//! machine every test runs with two ranks sharing GPU 0, each rank's stream still captured into
//! its own graph; a machine without a GPU waives them.
//!
//! `RINGREDUCE_GRAPH_REPLAYS` lowers the replay count (for runs under compute-sanitizer, which
//! slows every kernel by orders of magnitude).

use cudarc::driver::{result, sys, CudaGraph, CudaStream};
use ringreduce::{Algorithm, Buffer, Communicator, CudaConfig, Error, GpuBuffer, ReduceOp};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{new_streams, two_gpus_or_shared};

mod common;

/// All-reduces captured per graph.
const CALLS_PER_GRAPH: usize = 10;

fn replays() -> usize {
    std::env::var("RINGREDUCE_GRAPH_REPLAYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

/// `algorithm` at every size on `gpus`, which may repeat a GPU (two ranks sharing it).
fn forced(gpus: &[usize], algorithm: Algorithm, timeout: Duration) -> Communicator {
    let config = CudaConfig {
        allow_shared_device: gpus[0] == gpus[1],
        algorithm,
        timeout,
        ..CudaConfig::default()
    };
    Communicator::with_config(gpus, config).unwrap()
}

/// The one-shot at every size with `low_latency` (the LL one-shot up to 64 KiB per rank), on
/// `gpus` — which may repeat a GPU (two ranks sharing it).
fn forced_ll(gpus: &[usize], timeout: Duration) -> Communicator {
    let config = CudaConfig {
        algorithm: Algorithm::OneShot,
        low_latency: true,
        allow_shared_device: gpus[0] == gpus[1],
        timeout,
        ..CudaConfig::default()
    };
    Communicator::with_config(gpus, config).unwrap()
}

/// Rank `rank`'s input element `i` for call `call` of replay `replay`: depends on all four, so
/// a result from the wrong replay, call, rank or index is caught.
fn input(replay: usize, call: usize, rank: usize, i: usize) -> u32 {
    let mut x = (replay as u64) << 48 ^ (call as u64) << 40 ^ (rank as u64) << 32 ^ i as u64;
    x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (x >> 29) as u32
}

/// Copies `bytes` from `src` to `dst` on `stream`.
fn copy(stream: &Arc<CudaStream>, dst: u64, src: u64, bytes: usize) {
    stream.context().bind_to_thread().unwrap();
    // SAFETY: both are live device allocations of at least `bytes` on the stream's device.
    unsafe { result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream()) }.unwrap();
}

/// Uploads `data` into `dst` on `stream` (the host vector outlives the stream's sync below).
fn upload(stream: &Arc<CudaStream>, dst: u64, data: &[u32]) {
    stream.context().bind_to_thread().unwrap();
    // SAFETY: `dst` holds at least `data.len()` u32; `data` stays alive and unchanged until the
    // caller synchronises the stream.
    unsafe { result::memcpy_htod_async(dst, data, stream.cu_stream()) }.unwrap();
}

fn begin(streams: &[Arc<CudaStream>]) {
    for s in streams {
        s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .unwrap();
    }
}

fn end(streams: &[Arc<CudaStream>]) -> Vec<CudaGraph> {
    streams
        .iter()
        .map(|s| {
            s.end_capture(sys::CUgraphInstantiate_flags(0))
                .unwrap()
                .expect("a graph")
        })
        .collect()
}

/// Per rank and call: the source the graph copies the input from, the collective's buffers,
/// and where the graph copies the result.
struct Buffers {
    sources: Vec<Vec<GpuBuffer<u32>>>,
    bufs: Vec<GpuBuffer<u32>>,
    outs: Vec<GpuBuffer<u32>>,
    results: Vec<Vec<GpuBuffer<u32>>>,
}

impl Buffers {
    fn new(gpus: &[usize], count: usize) -> Buffers {
        let per_call = || -> Vec<Vec<GpuBuffer<u32>>> {
            (0..CALLS_PER_GRAPH)
                .map(|_| {
                    gpus.iter()
                        .map(|&g| GpuBuffer::zeroed(g, count).unwrap())
                        .collect()
                })
                .collect()
        };
        let per_rank = || -> Vec<GpuBuffer<u32>> {
            gpus.iter()
                .map(|&g| GpuBuffer::zeroed(g, count).unwrap())
                .collect()
        };
        Buffers {
            sources: per_call(),
            bufs: per_rank(),
            outs: per_rank(),
            results: per_call(),
        }
    }
}

/// Captures `CALLS_PER_GRAPH` all-reduces into one graph per rank: for each call, copy the
/// call's source into the buffer, all-reduce, copy the result out.
fn capture(
    comm: &Communicator,
    streams: &[Arc<CudaStream>],
    b: &mut Buffers,
    count: usize,
    in_place: bool,
) -> Result<Vec<CudaGraph>, Error> {
    begin(streams);
    let mut outcome = Ok(());
    for call in 0..CALLS_PER_GRAPH {
        for (rank, s) in streams.iter().enumerate() {
            copy(
                s,
                b.bufs[rank].address(),
                b.sources[call][rank].address(),
                count * 4,
            );
        }
        // SAFETY: the buffers outlive the graphs, and only the graphs' own nodes touch them.
        let r = unsafe {
            if in_place {
                comm.enqueue_all_reduce_in_place_on(&mut b.bufs, ReduceOp::Sum, streams)
            } else {
                comm.enqueue_all_reduce_on(&b.bufs, &mut b.outs, ReduceOp::Sum, streams)
            }
        };
        if let Err(e) = r {
            outcome = Err(e);
            break;
        }
        let result = if in_place { &b.bufs } else { &b.outs };
        for (rank, s) in streams.iter().enumerate() {
            copy(
                s,
                b.results[call][rank].address(),
                result[rank].address(),
                count * 4,
            );
        }
    }
    let graphs = end(streams);
    outcome.map(|()| graphs)
}

/// Replays `graphs` (one per rank, each holding `CALLS_PER_GRAPH` captured all-reduces of
/// `count` u32 per rank, [`capture`]) `replays` times, with new inputs uploaded before every
/// replay, and checks every result of every call exactly against the wrapping sum.
fn replay_exactly(
    graphs: &[CudaGraph],
    streams: &[Arc<CudaStream>],
    b: &Buffers,
    count: usize,
    replays: usize,
    label: &str,
) {
    for replay in 0..replays {
        let hosts: Vec<Vec<Vec<u32>>> = (0..CALLS_PER_GRAPH)
            .map(|call| {
                (0..2)
                    .map(|rank| (0..count).map(|i| input(replay, call, rank, i)).collect())
                    .collect()
            })
            .collect();
        for (call, per_rank) in hosts.iter().enumerate() {
            for (rank, s) in streams.iter().enumerate() {
                upload(s, b.sources[call][rank].address(), &per_rank[rank]);
            }
        }
        for g in graphs {
            g.launch().unwrap();
        }
        for s in streams {
            s.synchronize().unwrap();
        }
        for (call, per_rank) in hosts.iter().enumerate() {
            for rank in 0..2 {
                let got = b.results[call][rank].to_host().unwrap();
                let wrong: Vec<usize> = (0..count)
                    .filter(|&i| got[i] != per_rank[0][i].wrapping_add(per_rank[1][i]))
                    .take(3)
                    .collect();
                assert!(
                    wrong.is_empty(),
                    "{label}: replay {replay} call {call} rank {rank}: wrong at {wrong:?} \
                     (got {}, want {})",
                    got[wrong[0]],
                    per_rank[0][wrong[0]].wrapping_add(per_rank[1][wrong[0]])
                );
            }
        }
    }
}

/// 10 all-reduces per graph (one graph per GPU), 100 replays, inputs changed before every
/// replay, every result of every replay checked exactly: each algorithm Auto picks between,
/// in place and out of place, at a size where each is chosen and at an odd one.
#[test]
fn captured_all_reduces_replay_exactly() {
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    let streams = new_streams(&gpus);
    let replays = replays();
    for (algorithm, count) in [
        (Algorithm::OneShot, 4099),
        (Algorithm::OneShot, 1 << 16),
        (Algorithm::TwoShot, 1 << 16),
        (Algorithm::TwoShot, 12_345),
        (Algorithm::Ring, 1 << 18),
        (Algorithm::Ring, 100_003),
        (Algorithm::Auto, 1 << 20),
    ] {
        let comm = forced(&gpus, algorithm, Duration::from_secs(20));
        for in_place in [true, false] {
            let label = format!("{algorithm:?} count {count} in_place {in_place}");
            capture_and_replay(&comm, &gpus, &streams, count, in_place, replays, &label);
        }
    }
}

/// With `low_latency`: the LL one-shot captured, 10 all-reduces per graph, replayed with new
/// inputs before every replay and every result checked exactly — in place (the exposure copy
/// dropped) and out of place, at 1, 4099 and 16384 u32 per rank (exactly 64 KiB, the LL limit;
/// its receive sets alternate by epoch parity across the calls and the replays), and at 16385
/// (the read one-shot on the same communicator, sharing the per-block epochs).
#[test]
fn captured_ll_all_reduces_replay_exactly() {
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    let streams = new_streams(&gpus);
    let replays = replays();
    let comm = forced_ll(&gpus, Duration::from_secs(20));
    for count in [1, 4099, 16384, 16385] {
        for in_place in [true, false] {
            let label = format!("LL one-shot count {count} in_place {in_place}");
            capture_and_replay(&comm, &gpus, &streams, count, in_place, replays, &label);
        }
    }
    comm.close().unwrap();
}

/// Rank 0's graph replayed, rank 1's never: rank 0's stream finishes within the kernels'
/// deadline (no hang), and the communicator names the timeout; for the peer kernels (the read
/// one-shot and, with `low_latency`, the LL one-shot) and the captured ring's counter waits.
#[test]
fn a_graph_whose_peer_is_never_replayed_times_out_by_name() {
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    let streams = new_streams(&gpus);
    let timeout = Duration::from_secs(2);
    for (algorithm, low_latency, count) in [
        (Algorithm::OneShot, false, 1 << 12),
        (Algorithm::OneShot, true, 1 << 12),
        (Algorithm::Ring, false, 1 << 18),
    ] {
        let comm = if low_latency {
            forced_ll(&gpus, timeout)
        } else {
            forced(&gpus, algorithm, timeout)
        };
        let mut b = Buffers::new(&gpus, count);
        comm.all_reduce_in_place(&mut b.bufs, ReduceOp::Sum)
            .unwrap();
        begin(&streams);
        // SAFETY: the buffers outlive the graphs.
        unsafe { comm.enqueue_all_reduce_in_place_on(&mut b.bufs, ReduceOp::Sum, &streams) }
            .unwrap();
        let graphs = end(&streams);
        let start = Instant::now();
        graphs[0].launch().unwrap();
        streams[0].synchronize().unwrap();
        let waited = start.elapsed();
        let err = comm.health().unwrap_err();
        println!("{algorithm:?}: rank 0 alone finished after {waited:?}: {err}");
        assert!(
            waited < timeout * 2,
            "{algorithm:?}: rank 0 took {waited:?}"
        );
        assert!(
            matches!(err, Error::Timeout { rank: 0, .. }),
            "{algorithm:?}: {err}"
        );
        // A failed communicator refuses further calls with the cause.
        let again = comm
            .all_reduce_in_place(&mut b.bufs, ReduceOp::Sum)
            .unwrap_err();
        assert!(
            matches!(again, Error::CommunicatorFailed(_)),
            "{algorithm:?}: {again}"
        );
        drop(graphs);
    }
}

/// A capture of one rank's stream but not the other's is refused before anything is enqueued,
/// and so are a shape that never ran and a ring staged through host memory; the communicator
/// stays usable.
#[test]
fn what_cannot_be_captured_is_refused_by_name() {
    let Some(gpus) = two_gpus_or_shared() else {
        return;
    };
    let streams = new_streams(&gpus);
    let comm = forced(&gpus, Algorithm::Auto, Duration::from_secs(20));
    let mut bufs: Vec<GpuBuffer<f32>> = gpus
        .iter()
        .map(|&g| GpuBuffer::zeroed(g, 1024).unwrap())
        .collect();
    comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum).unwrap();
    begin(&streams[..1]);
    // SAFETY: refused before anything is enqueued.
    let err = unsafe { comm.enqueue_all_reduce_in_place_on(&mut bufs, ReduceOp::Sum, &streams) }
        .unwrap_err();
    assert!(matches!(err, Error::NotCapturable { .. }), "{err}");
    drop(end(&streams[..1]));
    comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum).unwrap();

    // A shape that never ran: refused, with the remedy in the message.
    let mut fresh: Vec<GpuBuffer<f32>> = gpus
        .iter()
        .map(|&g| GpuBuffer::zeroed(g, 777).unwrap())
        .collect();
    begin(&streams);
    // SAFETY: refused before anything is enqueued.
    let err = unsafe { comm.enqueue_all_reduce_in_place_on(&mut fresh, ReduceOp::Sum, &streams) }
        .unwrap_err();
    println!("unprepared: {err}");
    assert!(matches!(err, Error::NotCapturable { .. }), "{err}");
    drop(end(&streams));
    comm.all_reduce_in_place(&mut fresh, ReduceOp::Sum).unwrap();

    let staged = Communicator::with_config(
        &gpus,
        CudaConfig {
            allow_shared_device: gpus[0] == gpus[1],
            transport: ringreduce::Transport::Staged,
            ..CudaConfig::default()
        },
    )
    .unwrap();
    staged
        .all_reduce_in_place(&mut bufs, ReduceOp::Sum)
        .unwrap();
    begin(&streams);
    // SAFETY: refused before anything is enqueued.
    let err = unsafe { staged.enqueue_all_reduce_in_place_on(&mut bufs, ReduceOp::Sum, &streams) }
        .unwrap_err();
    println!("staged: {err}");
    assert!(matches!(err, Error::NotCapturable { .. }), "{err}");
    // The captures are still valid and empty.
    for g in end(&streams) {
        drop(g);
    }
    staged
        .all_reduce_in_place(&mut bufs, ReduceOp::Sum)
        .unwrap();
}

/// One shape of `comm` on `gpus`: an eager call first (a capture cannot prepare a new shape, as
/// a job's warm-up step would do it), then `CALLS_PER_GRAPH` calls captured per GPU and replayed
/// `replays` times with new inputs, every result exact; the communicator healthy and eager
/// calls still working afterwards.
fn capture_and_replay(
    comm: &Communicator,
    gpus: &[usize],
    streams: &[Arc<CudaStream>],
    count: usize,
    in_place: bool,
    replays: usize,
    label: &str,
) {
    let mut b = Buffers::new(gpus, count);
    if in_place {
        comm.all_reduce_in_place(&mut b.bufs, ReduceOp::Sum)
    } else {
        comm.all_reduce(&b.bufs, &mut b.outs, ReduceOp::Sum)
    }
    .unwrap();
    let graphs = capture(comm, streams, &mut b, count, in_place)
        .unwrap_or_else(|e| panic!("{label}: capture: {e}"));
    let start = Instant::now();
    replay_exactly(&graphs, streams, &b, count, replays, label);
    comm.health()
        .unwrap_or_else(|e| panic!("{label}: health after the replays: {e}"));
    comm.all_reduce_in_place(&mut b.bufs, ReduceOp::Sum)
        .unwrap();
    println!(
        "{label}: {replays} replays x {CALLS_PER_GRAPH} all-reduces exact ({:?})",
        start.elapsed()
    );
    drop(graphs);
}
