//! The public API as a downstream crate uses it: what must compile, and what must hold, without
//! `unsafe` (host ranks; the GPU forms of the same calls are in tests/gpu.rs).

use ringreduce::{Communicator, Error, FaultKind, HostConfig, ReduceOp};

mod common;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// Separate vectors, borrowed mutably into one slice of buffers: `[&mut a, &mut b]`.
#[test]
fn mutable_borrows_of_vectors_are_buffers() {
    let comm = Communicator::host(2).unwrap();
    let mut a = vec![1i32, 2, 3];
    let mut b = vec![10i32, 20, 30];
    comm.all_reduce_in_place(&mut [&mut a, &mut b], ReduceOp::Sum)
        .unwrap();
    assert_eq!(a, [11, 22, 33]);
    assert_eq!(b, [11, 22, 33]);
    let (x, y) = (vec![1.0f32, 2.0], vec![3.0f32, 4.0]);
    let mut out0 = vec![0.0f32; 2];
    let mut out1 = vec![0.0f32; 2];
    comm.all_reduce(&[&x, &y], &mut [&mut out0, &mut out1], ReduceOp::Max)
        .unwrap();
    assert_eq!((out0, out1), (vec![3.0, 4.0], vec![3.0, 4.0]));
}

/// How long the slow rank of the scope tests holds its first copy: long enough that a scope
/// that did not wait would return (and its caller read the buffers) well before the collective
/// completes.
const SLOW: Duration = Duration::from_millis(600);

/// A host communicator of `world` ranks whose rank 0 starts its first copy of an in-place
/// all-reduce of `count` elements [`SLOW`] late: its calls run on while the caller goes on.
fn slow_host(world: usize, count: usize) -> Communicator {
    let fault = common::fault_at_first_copy(world, count, FaultKind::Slow(SLOW));
    Communicator::host_with(
        world,
        HostConfig {
            algorithm: ringreduce::Algorithm::Ring,
            fault: Some(fault),
            ..HostConfig::default()
        },
    )
    .unwrap()
}

/// Overlap without `unsafe`: the closure runs while the collectives do (it returns before the
/// slow rank has moved), the scope returns only after they completed, with the closure's value,
/// and several collectives may be enqueued in one scope.
#[test]
fn a_scope_overlaps_and_waits() {
    let comm = slow_host(3, 5);
    let mut grads: Vec<Vec<f32>> = (0..3).map(|r| vec![r as f32; 5]).collect();
    let inputs: Vec<Vec<i64>> = (0..3).map(|r| vec![r as i64 + 1; 4]).collect();
    let mut outputs = vec![vec![0i64; 4]; 3];
    let start = Instant::now();
    let mut closure_done = Duration::ZERO;
    let value = comm
        .scope(|s| {
            s.all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
            s.all_reduce(&inputs, &mut outputs, ReduceOp::Prod)?;
            closure_done = start.elapsed();
            Ok::<_, Error>("overlapped")
        })
        .unwrap()
        .unwrap();
    let scope_done = start.elapsed();
    assert_eq!(value, "overlapped");
    assert!(
        closure_done < SLOW,
        "the scope's calls waited for the collective ({closure_done:?})"
    );
    assert!(
        scope_done >= SLOW,
        "the scope returned after {scope_done:?}, before its collective could complete"
    );
    assert!(grads.iter().all(|g| g == &[3.0; 5]), "{grads:?}");
    assert!(outputs.iter().all(|o| o == &[6; 4]), "{outputs:?}");
    // A call's validation error comes back through the closure, and the communicator still works.
    let mut short = vec![vec![1.0f32; 2], vec![1.0f32; 3], vec![1.0; 2]];
    let inner = comm
        .scope(|s| s.all_reduce_in_place(&mut short, ReduceOp::Sum))
        .unwrap();
    assert!(
        matches!(inner, Err(Error::LengthMismatch { rank: 1, .. })),
        "{inner:?}"
    );
    let mut ok = vec![vec![1u8], vec![2], vec![3]];
    comm.all_reduce_in_place(&mut ok, ReduceOp::Sum).unwrap();
    assert_eq!(ok, [[6], [6], [6]]);
}

/// A panic inside the scope still waits for what was enqueued, then unwinds to the caller.
#[test]
fn a_panicking_scope_still_waits() {
    let comm = slow_host(2, 3);
    let mut bufs = vec![vec![1u32; 3], vec![2u32; 3]];
    let start = Instant::now();
    let caught = catch_unwind(AssertUnwindSafe(|| {
        comm.scope(|s| {
            s.all_reduce_in_place(&mut bufs, ReduceOp::Sum).unwrap();
            panic!("the caller's own panic");
        })
    }));
    let unwound = start.elapsed();
    assert!(caught.is_err());
    assert!(
        unwound >= SLOW,
        "the panic left the scope after {unwound:?}, before its collective could complete"
    );
    assert_eq!(bufs, [[3; 3], [3; 3]]);
    assert!(comm.health().is_ok());
}

/// Enqueued calls on host ranks run on after they return, as on GPUs: `synchronize` waits for
/// them, `health` reports nothing while they run, and the results are there after the wait.
#[test]
fn host_enqueued_calls_complete_at_synchronize() {
    let comm = slow_host(2, 4);
    let mut bufs = vec![vec![1i32; 4], vec![2i32; 4]];
    let start = Instant::now();
    // SAFETY: `bufs` is not touched until `synchronize` has waited for the call.
    unsafe { comm.enqueue_all_reduce_in_place(&mut bufs, ReduceOp::Sum) }.unwrap();
    let enqueued = start.elapsed();
    assert!(enqueued < SLOW, "the enqueue waited ({enqueued:?})");
    assert!(comm.health().is_ok());
    comm.synchronize().unwrap();
    assert!(start.elapsed() >= SLOW);
    assert_eq!(bufs, [[3; 4], [3; 4]]);
}

/// GPU detection has a top-level home and answers (an error, not a panic) without a driver;
/// with one, at least one GPU (none is the error) and a driver that says it is available.
#[test]
fn gpu_detection_is_top_level() {
    match ringreduce::device_count() {
        Ok(n) => {
            assert!(n >= 1, "device_count is Ok(0): no GPU must be Err(NoGpu)");
            ringreduce::driver_available().expect("device_count found GPUs");
            println!("{n} GPU(s)");
        }
        Err(e) => {
            assert!(ringreduce::driver_available().is_err());
            println!("no GPU: {e}");
        }
    }
}

/// `devices()`, `edges()` and `algorithm_for()` are facts fixed at creation: they answer while
/// another thread's call is running (here one stalled by an injected fault until its timeout).
#[test]
fn facts_answer_during_a_running_call() {
    use ringreduce::Algorithm;
    use std::sync::atomic::{AtomicBool, Ordering};
    let config = HostConfig {
        algorithm: Algorithm::Ring,
        timeout: Duration::from_secs(3),
        ..HostConfig::default()
    };
    let fault = common::fault_at_first_copy(2, 64, FaultKind::Stall);
    let comm = Communicator::host_with(
        2,
        HostConfig {
            fault: Some(fault),
            ..config
        },
    )
    .unwrap();
    let running = AtomicBool::new(true);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut bufs = vec![vec![1.0f32; 64], vec![2.0f32; 64]];
            let result = comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum);
            running.store(false, Ordering::SeqCst);
            assert!(
                result.is_err(),
                "the stalled call should time out: {result:?}"
            );
        });
        // Let the call start and take the communicator.
        std::thread::sleep(Duration::from_millis(200));
        assert!(running.load(Ordering::SeqCst));
        assert_eq!(comm.algorithm_for(256, true), Algorithm::Ring);
        assert!(comm.devices().is_empty() && comm.edges().is_empty());
        assert_eq!(comm.world(), 2);
        assert!(
            running.load(Ordering::SeqCst),
            "a fact waited for the running call to end"
        );
    });
}

/// What may cross threads: a communicator is shared by threads (its calls serialised), buffers
/// and views are sent to them, and a scope's calls may come from threads the closure spawns.
#[test]
fn communicators_buffers_and_scopes_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Communicator>();
    send_sync::<ringreduce::GpuBuffer<f32>>();
    send_sync::<ringreduce::GpuView<'static, f32>>();
    send_sync::<ringreduce::GpuViewMut<'static, f32>>();
    send_sync::<ringreduce::Scope<'static, 'static>>();
    let comm = Communicator::host(2).unwrap();
    let mut bufs = vec![vec![1u32; 3], vec![2u32; 3]];
    let borrowed = &mut bufs;
    comm.scope(|s| {
        std::thread::scope(|t| {
            t.spawn(move || s.all_reduce_in_place(borrowed, ReduceOp::Sum))
                .join()
                .unwrap()
        })
    })
    .unwrap()
    .unwrap();
    assert_eq!(bufs, [[3; 3], [3; 3]]);
}
