//! What a downstream crate hit on GPUs: communicators used from several threads at once, several
//! communicators on the same GPUs at once, and float semantics that differed from the host's. Every test
//! prints `waived: needs ≥ 2 GPUs` and passes where there are fewer. Exact results throughout
//! (`ringreduce::verify`).

use half::{bf16, f16};
use ringreduce::verify::{compare, make_expected, make_input};
use ringreduce::{Algorithm, Communicator, CudaConfig, Element, GpuBuffer, HostConfig, ReduceOp};
use std::time::{Duration, Instant};

fn two_gpus() -> Option<[usize; 2]> {
    let count = ringreduce::driver_available()
        .and_then(|()| ringreduce::device_count())
        .unwrap_or(0);
    if count < 2 {
        println!("waived: needs ≥ 2 GPUs (found {count})");
        return None;
    }
    Some([0, 1])
}

fn comm(gpus: &[usize], algorithm: Algorithm) -> Communicator {
    Communicator::with_config(
        gpus,
        CudaConfig {
            algorithm,
            timeout: Duration::from_secs(20),
            ..CudaConfig::default()
        },
    )
    .expect("GPU communicator")
}

/// Element counts (f32) that Auto sends to each of its algorithms on two GPUs: the one-shot
/// (16 KiB), the two-shot in place (12 MiB) and the ring (40 MiB).
const COUNTS: [usize; 3] = [4 << 10, 3 << 20, 10 << 20];

/// One thread's work: `calls` all-reduces on its own buffers, cycling through sizes, placement
/// and blocking / enqueue-then-blocking, every result checked exactly.
fn worker(comm: &Communicator, gpus: &[usize], thread: usize, calls: usize) {
    let world = gpus.len();
    let op = ReduceOp::Sum;
    for call in 0..calls {
        let count = COUNTS[(call + thread) % COUNTS.len()];
        let in_place = (call / 3 + thread) % 2 == 0;
        let enqueue = (call / 6) % 2 == 1;
        let inputs: Vec<Vec<f32>> = (0..world).map(|r| make_input(op, r, count)).collect();
        let want: Vec<f32> = make_expected(op, world, count);
        let mut outs: Vec<GpuBuffer<f32>> = gpus
            .iter()
            .zip(&inputs)
            .map(|(&g, input)| GpuBuffer::from_host(g, input).unwrap())
            .collect();
        let label = format!(
            "thread {thread} call {call} count {count} in_place {in_place} enqueue {enqueue}"
        );
        if in_place {
            if enqueue {
                // SAFETY: `outs` stays alive and untouched until the blocking call below, which
                // is ordered after this one on each rank's stream and returns when complete.
                unsafe { comm.enqueue_all_reduce_in_place(&mut outs, ReduceOp::Max) }
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
                // Max of the inputs, then a sum over the ranks of that: restore the inputs first.
                comm.synchronize()
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
                for (buf, input) in outs.iter_mut().zip(&inputs) {
                    buf.copy_from_host(input).unwrap();
                }
            }
            comm.all_reduce_in_place(&mut outs, op)
                .unwrap_or_else(|e| panic!("{label}: {e}"));
        } else {
            let ins: Vec<GpuBuffer<f32>> = gpus
                .iter()
                .zip(&inputs)
                .map(|(&g, input)| GpuBuffer::from_host(g, input).unwrap())
                .collect();
            if enqueue {
                // SAFETY: inputs and outputs live until `synchronize` below has returned.
                unsafe { comm.enqueue_all_reduce(&ins, &mut outs, op) }
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
                comm.synchronize()
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
            } else {
                comm.all_reduce(&ins, &mut outs, op)
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
            }
        }
        for (rank, buf) in outs.iter().enumerate() {
            let got = buf.to_host().unwrap();
            let (wrong, first) = compare(rank, &got, &want, 4);
            assert_eq!(wrong, 0, "{label}: first mismatches {first:?}");
        }
    }
}

/// Threads sharing one communicator, each mixing blocking and enqueued calls across every
/// algorithm Auto switches between: every call correct, none waits on another's barrier.
#[test]
fn threads_sharing_one_communicator() {
    let Some(gpus) = two_gpus() else { return };
    let comm = comm(&gpus, Algorithm::Auto);
    let start = Instant::now();
    std::thread::scope(|s| {
        for thread in 0..3 {
            let comm = &comm;
            s.spawn(move || worker(comm, &gpus, thread, 36));
        }
    });
    comm.health().unwrap();
    println!(
        "3 threads × 36 calls on one communicator: {:?}",
        start.elapsed()
    );
}

/// Two communicators on the same GPUs, used at once from two threads, for each pair of
/// algorithms (peer kernels spin at barriers; a ring waits on events): both make progress.
#[test]
fn two_communicators_on_the_same_gpus_at_once() {
    let Some(gpus) = two_gpus() else { return };
    let algorithms = [Algorithm::OneShot, Algorithm::TwoShot, Algorithm::Ring];
    for a in algorithms {
        for b in algorithms {
            let (ca, cb) = (comm(&gpus, a), comm(&gpus, b));
            let start = Instant::now();
            std::thread::scope(|s| {
                s.spawn(|| worker(&ca, &gpus, 0, 12));
                s.spawn(|| worker(&cb, &gpus, 1, 12));
            });
            println!("{a:?} beside {b:?}: {:?}", start.elapsed());
            ca.close().unwrap();
            cb.close().unwrap();
        }
    }
}

/// Min and max over −0 and +0 (and NaN beside numbers) give the host's bits on every algorithm,
/// placement and float type: IEEE minimumNumber / maximumNumber, −0 < +0.
#[test]
fn signed_zeros_give_the_hosts_bits_on_every_algorithm() {
    let Some(gpus) = two_gpus() else { return };
    fn case<T: Element>(gpus: &[usize], algorithm: Algorithm, from: fn(f32) -> T) {
        let count = 4096 + 3;
        // Rank r: −0 or +0 by bit r of the index, a NaN every 7th index on rank 0.
        let inputs: Vec<Vec<T>> = (0..gpus.len())
            .map(|r| {
                (0..count)
                    .map(|i| match (r, i % 7, (i >> r) & 1) {
                        (0, 0, _) => from(f32::NAN),
                        (_, _, 1) => from(-0.0),
                        _ => from(0.0),
                    })
                    .collect()
            })
            .collect();
        let host = Communicator::host_with(
            gpus.len(),
            HostConfig {
                algorithm,
                ..HostConfig::default()
            },
        )
        .unwrap();
        let gpu = comm(gpus, algorithm);
        for op in [ReduceOp::Min, ReduceOp::Max] {
            let mut want = inputs.clone();
            host.all_reduce_in_place(&mut want, op).unwrap();
            for in_place in [true, false] {
                let mut outs: Vec<GpuBuffer<T>> = gpus
                    .iter()
                    .zip(&inputs)
                    .map(|(&g, x)| GpuBuffer::from_host(g, x).unwrap())
                    .collect();
                if in_place {
                    gpu.all_reduce_in_place(&mut outs, op).unwrap();
                } else {
                    let ins: Vec<GpuBuffer<T>> = gpus
                        .iter()
                        .zip(&inputs)
                        .map(|(&g, x)| GpuBuffer::from_host(g, x).unwrap())
                        .collect();
                    gpu.all_reduce(&ins, &mut outs, op).unwrap();
                }
                for (rank, buf) in outs.iter().enumerate() {
                    let (wrong, first) = compare(rank, &buf.to_host().unwrap(), &want[rank], 4);
                    assert_eq!(
                        wrong,
                        0,
                        "{algorithm:?} {op} {} in_place {in_place}: {first:?}",
                        T::DTYPE
                    );
                }
            }
        }
    }
    for algorithm in [Algorithm::Ring, Algorithm::OneShot, Algorithm::TwoShot] {
        case::<f32>(&gpus, algorithm, |x| x);
        case::<f64>(&gpus, algorithm, |x| x as f64);
        case::<f16>(&gpus, algorithm, f16::from_f32);
        case::<bf16>(&gpus, algorithm, bf16::from_f32);
    }
}

/// Diagnostics for the shared-communicator hang: narrowed variants, run by hand with
/// `--ignored --exact`. `sizes` are element counts; `prealloc` makes every buffer once up front.
fn narrowed(sizes: &[usize], enqueue: bool, prealloc: bool, threads: usize) {
    let Some(gpus) = two_gpus() else { return };
    let comm = Communicator::with_config(
        &gpus,
        CudaConfig {
            timeout: Duration::from_secs(8),
            ..CudaConfig::default()
        },
    )
    .unwrap();
    let start = Instant::now();
    let failed = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for thread in 0..threads {
            let (comm, failed) = (&comm, &failed);
            s.spawn(move || {
                let op = ReduceOp::Sum;
                let mut made: Vec<(Vec<Vec<f32>>, Vec<GpuBuffer<f32>>)> = sizes
                    .iter()
                    .map(|&count| {
                        let inputs: Vec<Vec<f32>> =
                            (0..2).map(|r| make_input(op, r, count)).collect();
                        let bufs = gpus
                            .iter()
                            .zip(&inputs)
                            .map(|(&g, x)| GpuBuffer::from_host(g, x).unwrap())
                            .collect();
                        (inputs, bufs)
                    })
                    .collect();
                for call in 0..60 {
                    if failed.load(std::sync::atomic::Ordering::Relaxed) {
                        return;
                    }
                    let which = call % sizes.len();
                    let (inputs, bufs) = &mut made[which];
                    if prealloc {
                        for (b, x) in bufs.iter_mut().zip(inputs.iter()) {
                            b.copy_from_host(x).unwrap();
                        }
                    } else {
                        *bufs = gpus
                            .iter()
                            .zip(inputs.iter())
                            .map(|(&g, x)| GpuBuffer::from_host(g, x).unwrap())
                            .collect();
                    }
                    let t = Instant::now();
                    let r = if enqueue && call % 2 == 1 {
                        // SAFETY: the buffers live until synchronize below returns.
                        unsafe { comm.enqueue_all_reduce_in_place(bufs, op) }
                            .and_then(|()| comm.synchronize())
                    } else {
                        comm.all_reduce_in_place(bufs, op)
                    };
                    if let Err(e) = r {
                        failed.store(true, std::sync::atomic::Ordering::Relaxed);
                        println!(
                            "thread {thread} call {call} size {} after {:?}: {e}",
                            sizes[which],
                            t.elapsed()
                        );
                        return;
                    }
                    let want: Vec<f32> = make_expected(op, 2, sizes[which]);
                    for (rank, b) in bufs.iter().enumerate() {
                        assert_eq!(compare(rank, &b.to_host().unwrap(), &want, 2).0, 0);
                    }
                }
            });
        }
    });
    println!(
        "elapsed {:?}, health now {:?}",
        start.elapsed(),
        comm.health()
    );
    std::thread::sleep(Duration::from_secs(9));
    println!("health after the kernels' deadline {:?}", comm.health());
    assert!(
        !failed.load(std::sync::atomic::Ordering::Relaxed),
        "a call failed"
    );
}

#[test]
#[ignore]
fn diag_oneshot_blocking_alloc_per_call() {
    narrowed(&[4096], false, false, 2);
}
#[test]
#[ignore]
fn diag_oneshot_blocking_prealloc() {
    narrowed(&[4096], false, true, 2);
}
#[test]
#[ignore]
fn diag_oneshot_enqueue_prealloc() {
    narrowed(&[4096], true, true, 2);
}
#[test]
#[ignore]
fn diag_mixed_sizes_blocking_prealloc() {
    narrowed(&COUNTS, false, true, 2);
}
#[test]
#[ignore]
fn diag_mixed_sizes_enqueue_prealloc() {
    narrowed(&COUNTS, true, true, 3);
}
