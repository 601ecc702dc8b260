//! Every bad argument is an `Err` before any work is enqueued, one test per case (the table in
//! `docs/ERRORS.md` points here), and the integer semantics of `Avg`, `Prod` and `Sum` end to
//! end through a host communicator.
//!
//! A rejected call must leave every buffer as it was and the communicator healthy: the next valid
//! call on it computes exact results. Buffers that cannot exist (a huge count, device memory on a
//! host communicator, views that overlap) are a test-only `Buffer` over raw pointers; each such
//! call also puts a device buffer on a later rank, which validation reports if it misses the case
//! under test, so a validation bug fails the test instead of letting a collective touch memory.
//!
//! Run with `--nocapture` to see every message (they are quoted in docs/ERRORS.md).

use half::bf16;
use ringreduce::verify::{make_expected, make_input};
use ringreduce::{
    Algorithm, Buffer, BufferMut, Communicator, CudaConfig, DType, Element, Error, FaultKind,
    HostConfig, Placement, ReduceOp,
};
use std::ptr::NonNull;

mod common;
use std::time::{Duration, Instant};

/// `count` elements of `T` at `ptr` in `placement`: a buffer described by hand.
struct Raw<T> {
    ptr: *mut T,
    count: usize,
    placement: Placement,
}

impl<T> Raw<T> {
    /// Elements `start..start + count` of the test's own allocation at `base`, in host memory.
    fn view(base: *mut T, start: usize, count: usize) -> Raw<T> {
        Raw {
            ptr: base.wrapping_add(start),
            count,
            placement: Placement::Host,
        }
    }

    /// A buffer with nothing behind it. The address is dangling (aligned for every element
    /// type), so a collective that got past validation would fault, not pass.
    fn fake(placement: Placement, count: usize) -> Raw<T> {
        Raw {
            ptr: NonNull::<u64>::dangling().as_ptr().cast(),
            count,
            placement,
        }
    }

    /// The safety net: a device buffer, which a host communicator rejects.
    fn device(count: usize) -> Raw<T> {
        Raw::fake(Placement::Device(0), count)
    }
}

// SAFETY: test-only: a Raw either points into a live Vec of the test for the whole call, or
// describes memory that validation must reject before anything touches it (what the tests check).
unsafe impl<T: Element> Buffer<T> for Raw<T> {
    fn placement(&self) -> Placement {
        self.placement
    }
    fn count(&self) -> usize {
        self.count
    }
    fn address(&self) -> u64 {
        self.ptr as u64
    }
}

// SAFETY: as above.
unsafe impl<T: Element> BufferMut<T> for Raw<T> {
    fn address_mut(&mut self) -> u64 {
        self.ptr as u64
    }
}

fn inputs<T: Element>(op: ReduceOp, world: usize, count: usize) -> Vec<Vec<T>> {
    (0..world).map(|r| make_input(op, r, count)).collect()
}

/// After a rejected call: the communicator is healthy and computes exact results.
fn still_works(comm: &Communicator) {
    assert_eq!(
        comm.health(),
        Ok(()),
        "a rejected argument must not fail the communicator"
    );
    let world = comm.world();
    let count = 2 * world + 1;
    let mut bufs = inputs::<i32>(ReduceOp::Sum, world, count);
    comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum).unwrap();
    let want = make_expected::<i32>(ReduceOp::Sum, world, count);
    assert!(
        bufs.iter().all(|b| b == &want),
        "wrong result after a rejected call"
    );
}

/// Prints the message quoted in docs/ERRORS.md.
fn show(case: &str, err: &Error) {
    println!("{case}: {err}");
}

#[test]
fn no_buffers() {
    let comm = Communicator::host(3).unwrap();
    let mut none: Vec<Vec<f32>> = Vec::new();
    let err = comm
        .all_reduce_in_place(&mut none, ReduceOp::Sum)
        .unwrap_err();
    assert_eq!(err, Error::NoBuffers);
    show("no buffers", &err);
    let mut outs = vec![vec![0f32; 4]; 3];
    assert_eq!(
        comm.all_reduce(&none, &mut outs, ReduceOp::Sum),
        Err(Error::NoBuffers)
    );
    assert!(
        outs.iter().all(|o| o == &[0.0; 4]),
        "outputs written by a rejected call"
    );
    let ins = inputs::<f32>(ReduceOp::Sum, 3, 4);
    assert_eq!(
        comm.all_reduce(&ins, &mut none, ReduceOp::Sum),
        Err(Error::NoBuffers)
    );
    assert_eq!(ringreduce::ring_allreduce(&mut none), Err(Error::NoBuffers));
    still_works(&comm);
}

#[test]
fn wrong_number_of_buffers() {
    let comm = Communicator::host(3).unwrap();
    for n in [1, 2, 4, 9] {
        let mut bufs = inputs::<i64>(ReduceOp::Max, n, 5);
        let err = comm
            .all_reduce_in_place(&mut bufs, ReduceOp::Max)
            .unwrap_err();
        assert_eq!(err, Error::WorldMismatch { world: 3, got: n });
        assert_eq!(
            bufs,
            inputs::<i64>(ReduceOp::Max, n, 5),
            "buffers written by a rejected call"
        );
        if n == 2 {
            show("wrong number of buffers", &err);
        }
    }
    // Out of place, either side can be the wrong size.
    let (ins3, ins2) = (
        inputs::<i64>(ReduceOp::Sum, 3, 5),
        inputs::<i64>(ReduceOp::Sum, 2, 5),
    );
    let mut outs2 = vec![vec![0i64; 5]; 2];
    assert_eq!(
        comm.all_reduce(&ins3, &mut outs2, ReduceOp::Sum),
        Err(Error::WorldMismatch { world: 3, got: 2 })
    );
    let mut outs3 = vec![vec![0i64; 5]; 3];
    assert_eq!(
        comm.all_reduce(&ins2, &mut outs3, ReduceOp::Sum),
        Err(Error::WorldMismatch { world: 3, got: 2 })
    );
    assert!(outs2.iter().chain(&outs3).all(|o| o == &[0; 5]));
    still_works(&comm);
}

#[test]
fn lengths_that_differ_between_ranks() {
    let comm = Communicator::host(4).unwrap();
    // The first rank whose length differs from rank 0's is named, in place and out of place.
    for (rank, got) in [(1, 0), (2, 9), (3, 7)] {
        let mut bufs = inputs::<u32>(ReduceOp::Sum, 4, 8);
        bufs[rank] = make_input(ReduceOp::Sum, rank, got);
        let before = bufs.clone();
        let err = comm
            .all_reduce_in_place(&mut bufs, ReduceOp::Sum)
            .unwrap_err();
        assert_eq!(
            err,
            Error::LengthMismatch {
                rank,
                expected: 8,
                got
            }
        );
        assert_eq!(bufs, before);
        if rank == 2 {
            show("lengths differ", &err);
        }
        let mut outs = vec![vec![0u32; 16]; 4];
        let err = comm
            .all_reduce(&before, &mut outs, ReduceOp::Sum)
            .unwrap_err();
        assert_eq!(
            err,
            Error::LengthMismatch {
                rank,
                expected: 8,
                got
            }
        );
        assert!(outs.iter().all(|o| o == &[0; 16]));
    }
    still_works(&comm);
}

#[test]
fn output_shorter_than_its_input() {
    let comm = Communicator::host(3).unwrap();
    let ins = inputs::<f64>(ReduceOp::Sum, 3, 10);
    let mut outs = vec![vec![-1f64; 10], vec![-1f64; 9], vec![-1f64; 10]];
    let err = comm.all_reduce(&ins, &mut outs, ReduceOp::Sum).unwrap_err();
    assert_eq!(
        err,
        Error::OutputTooShort {
            rank: 1,
            input: 10,
            output: 9
        }
    );
    show("output too short", &err);
    assert!(outs.iter().all(|o| o.iter().all(|&v| v == -1.0)));
    // A longer output is fine: the first `count` elements are written, the tail is left alone.
    let mut outs = vec![vec![-1f64; 13]; 3];
    comm.all_reduce(&ins, &mut outs, ReduceOp::Sum).unwrap();
    let want = make_expected::<f64>(ReduceOp::Sum, 3, 10);
    for out in &outs {
        assert_eq!((&out[..10], &out[10..]), (&want[..], &[-1.0; 3][..]));
    }
    still_works(&comm);
}

/// World 4, 8 elements per rank, all in one allocation: rank r's input is elements 8r..8r+8,
/// then 48 spare elements for outputs.
const WORLD: usize = 4;
const COUNT: usize = 8;
const SPARE: usize = WORLD * COUNT;

fn memory() -> Vec<f32> {
    let mut memory: Vec<f32> = (0..WORLD)
        .flat_map(|r| make_input::<f32>(ReduceOp::Sum, r, COUNT))
        .collect();
    memory.resize(memory.len() + 6 * COUNT, -1.0);
    memory
}

#[test]
fn output_overlapping_an_input() {
    let comm = Communicator::host(WORLD).unwrap();
    let mut memory = memory();
    let before = memory.clone();
    let base = memory.as_mut_ptr();
    let ins: Vec<Raw<f32>> = (0..WORLD)
        .map(|r| Raw::view(base, r * COUNT, COUNT))
        .collect();
    // (rank whose output overlaps, where it starts). Earlier ranks get disjoint outputs in the
    // spare area; later ranks the device safety net.
    let cases = [
        (0, 0),             // rank 0's output is its own input
        (0, 4),             // half of rank 0's input, half of rank 1's
        (1, 0),             // rank 1's output is rank 0's input
        (1, SPARE - 1),     // one element: rank 3's last input element
        (2, SPARE - COUNT), // exactly rank 3's input
    ];
    for (rank, start) in cases {
        let mut outs: Vec<Raw<f32>> = (0..WORLD)
            .map(|r| match r.cmp(&rank) {
                std::cmp::Ordering::Less => Raw::view(base, SPARE + (2 + r) * COUNT, COUNT),
                std::cmp::Ordering::Equal => Raw::view(base, start, COUNT),
                std::cmp::Ordering::Greater => Raw::device(COUNT),
            })
            .collect();
        let err = comm.all_reduce(&ins, &mut outs, ReduceOp::Sum).unwrap_err();
        assert_eq!(
            err,
            Error::Overlap { rank },
            "output of rank {rank} at element {start}"
        );
        if (rank, start) == (0, 4) {
            show("output overlaps an input", &err);
        }
    }
    // No `&mut` to `memory` was live during the calls; compare through the vector now.
    assert_eq!(memory, before, "a rejected call wrote memory");
    still_works(&comm);
}

#[test]
fn outputs_that_touch_inputs_without_overlap_run() {
    // The boundary of the overlap check: outputs adjacent to the last input and to each other.
    let comm = Communicator::host(WORLD).unwrap();
    let mut memory = memory();
    let base = memory.as_mut_ptr();
    let ins: Vec<Raw<f32>> = (0..WORLD)
        .map(|r| Raw::view(base, r * COUNT, COUNT))
        .collect();
    let mut outs: Vec<Raw<f32>> = (0..WORLD)
        .map(|r| Raw::view(base, SPARE + r * COUNT, COUNT))
        .collect();
    comm.all_reduce(&ins, &mut outs, ReduceOp::Sum).unwrap();
    let want = make_expected::<f32>(ReduceOp::Sum, WORLD, COUNT);
    for r in 0..WORLD {
        assert_eq!(
            &memory[r * COUNT..(r + 1) * COUNT],
            &make_input::<f32>(ReduceOp::Sum, r, COUNT)[..],
            "input {r}"
        );
        assert_eq!(
            &memory[SPARE + r * COUNT..SPARE + (r + 1) * COUNT],
            &want[..],
            "output {r}"
        );
    }
    assert!(memory[SPARE + WORLD * COUNT..].iter().all(|&v| v == -1.0));
}

#[test]
fn outputs_overlapping_each_other() {
    // Two ranks writing the same memory would race: rejected in place and out of place.
    let comm = Communicator::host(WORLD).unwrap();
    let mut memory = memory();
    let before = memory.clone();
    let base = memory.as_mut_ptr();
    // In place: rank 1's buffer starts inside rank 0's.
    let mut bufs = vec![
        Raw::view(base, 0, COUNT),
        Raw::view(base, COUNT / 2, COUNT),
        Raw::device(COUNT),
        Raw::device(COUNT),
    ];
    let err = comm
        .all_reduce_in_place(&mut bufs, ReduceOp::Sum)
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::OutputsOverlap {
                first: 0,
                second: 1
            }
        ),
        "{err}"
    );
    show("buffers of two ranks overlap", &err);
    // In place, the very same buffer twice.
    let mut bufs = vec![
        Raw::view(base, COUNT, COUNT),
        Raw::view(base, 2 * COUNT, COUNT),
        Raw::view(base, COUNT, COUNT),
        Raw::device(COUNT),
    ];
    let err = comm
        .all_reduce_in_place(&mut bufs, ReduceOp::Sum)
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::OutputsOverlap {
                first: 0,
                second: 2
            }
        ),
        "{err}"
    );
    // Out of place: outputs of ranks 1 and 2 share their last and first element.
    let ins: Vec<Raw<f32>> = (0..WORLD)
        .map(|r| Raw::view(base, r * COUNT, COUNT))
        .collect();
    let mut outs = vec![
        Raw::view(base, SPARE, COUNT),
        Raw::view(base, SPARE + COUNT, COUNT),
        Raw::view(base, SPARE + 2 * COUNT - 1, COUNT),
        Raw::device(COUNT),
    ];
    let err = comm.all_reduce(&ins, &mut outs, ReduceOp::Sum).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::OutputsOverlap {
                first: 1,
                second: 2
            }
        ),
        "{err}"
    );
    assert_eq!(memory, before, "a rejected call wrote memory");
    still_works(&comm);
}

/// A call whose count × element size exceeds `isize::MAX` bytes (the largest object Rust or the
/// allocator can have): `SizeOverflow`, and no memory touched.
fn size_overflow<T: Element>(count: usize) {
    let comm = Communicator::host(2).unwrap();
    let mut bufs = vec![Raw::<T>::fake(Placement::Host, count), Raw::device(count)];
    let err = comm
        .all_reduce_in_place(&mut bufs, ReduceOp::Sum)
        .unwrap_err();
    assert_eq!(
        err,
        Error::SizeOverflow {
            count,
            dtype: T::DTYPE
        },
        "{} × {count}",
        T::DTYPE
    );
    let ins = vec![Raw::<T>::fake(Placement::Host, count), Raw::device(count)];
    let mut outs = vec![Raw::<T>::fake(Placement::Host, count), Raw::device(count)];
    let err = comm.all_reduce(&ins, &mut outs, ReduceOp::Max).unwrap_err();
    assert_eq!(
        err,
        Error::SizeOverflow {
            count,
            dtype: T::DTYPE
        },
        "{} × {count}",
        T::DTYPE
    );
    if T::DTYPE == DType::F32 {
        show("count × element size overflows", &err);
    }
    still_works(&comm);
}

#[test]
fn count_times_element_size_overflowing() {
    size_overflow::<f32>(usize::MAX / 2); // overflows usize
    size_overflow::<bf16>(usize::MAX / 2); // fits usize, exceeds isize::MAX
    size_overflow::<u8>(isize::MAX as usize + 1);
    size_overflow::<f64>(isize::MAX as usize / 8 + 1);
    size_overflow::<u64>(usize::MAX);
}

#[test]
fn device_buffer_on_a_host_communicator() {
    let comm = Communicator::host(3).unwrap();
    let mut host = inputs::<f32>(ReduceOp::Sum, 3, 6);
    let before = host.clone();
    let expected = "host memory (this is a host communicator)";
    // In place: rank 1's buffer is on GPU 0.
    let mut bufs: Vec<Raw<f32>> = host
        .iter_mut()
        .map(|b| Raw::view(b.as_mut_ptr(), 0, 6))
        .collect();
    bufs[1] = Raw::fake(Placement::Device(0), 6);
    let err = comm
        .all_reduce_in_place(&mut bufs, ReduceOp::Sum)
        .unwrap_err();
    assert_eq!(
        err,
        Error::WrongPlacement {
            rank: 1,
            got: Placement::Device(0),
            expected
        }
    );
    show("device buffer on a host communicator", &err);
    // Out of place: rank 2's input, then rank 0's output.
    let mut outs = vec![vec![0f32; 6]; 3];
    let mut ins: Vec<Raw<f32>> = host
        .iter_mut()
        .map(|b| Raw::view(b.as_mut_ptr(), 0, 6))
        .collect();
    ins[2] = Raw::fake(Placement::Device(2), 6);
    let err = comm.all_reduce(&ins, &mut outs, ReduceOp::Sum).unwrap_err();
    assert_eq!(
        err,
        Error::WrongPlacement {
            rank: 2,
            got: Placement::Device(2),
            expected
        }
    );
    let ins = inputs::<f32>(ReduceOp::Sum, 3, 6);
    // (The other outputs of the right length: lengths are checked before placements.)
    let mut outs: Vec<Raw<f32>> = vec![
        Raw::fake(Placement::Device(1), 6),
        Raw::fake(Placement::Host, 6),
        Raw::fake(Placement::Host, 6),
    ];
    let err = comm.all_reduce(&ins, &mut outs, ReduceOp::Sum).unwrap_err();
    assert_eq!(
        err,
        Error::WrongPlacement {
            rank: 0,
            got: Placement::Device(1),
            expected
        }
    );
    assert_eq!(host, before);
    still_works(&comm);
}

#[test]
fn a_rank_communicator_places_buffers_by_the_same_rule() {
    // One placement rule for both communicators: a host rank's device buffer is the same
    // `WrongPlacement` a host `Communicator` gives.
    let id = ringreduce::UniqueId::new("127.0.0.1:0").unwrap();
    let mut comm = ringreduce::RankCommunicator::host(&id, 0, 1, HostConfig::default()).unwrap();
    let mut host = vec![1.0f32; 6];
    let mut device = Raw::<f32>::fake(Placement::Device(0), 6);
    let err = comm
        .all_reduce_in_place(&mut device, ReduceOp::Sum)
        .unwrap_err();
    let expected = "host memory (this is a host communicator)";
    let want = Error::WrongPlacement {
        rank: 0,
        got: Placement::Device(0),
        expected,
    };
    assert_eq!(err, want);
    let input = Raw::<f32>::fake(Placement::Device(0), 6);
    let err = comm
        .all_reduce(&input, &mut host, ReduceOp::Sum)
        .unwrap_err();
    assert_eq!(err, want);
    comm.all_reduce_in_place(&mut host, ReduceOp::Sum).unwrap();
    assert_eq!(host, vec![1.0f32; 6]);
}

#[test]
fn zero_length_is_a_no_op() {
    for world in 1..=8 {
        let comm = Communicator::host(world).unwrap();
        for op in ReduceOp::ALL {
            let mut empty: Vec<Vec<u8>> = vec![Vec::new(); world];
            comm.all_reduce_in_place(&mut empty, op).unwrap();
            // Out of place with longer outputs: nothing is written.
            let mut outs = vec![vec![7f32; 3]; world];
            comm.all_reduce(&vec![Vec::<f32>::new(); world], &mut outs, op)
                .unwrap();
            assert!(
                outs.iter().all(|o| o == &[7.0; 3]),
                "world {world} {op}: a zero-length call wrote"
            );
        }
        still_works(&comm);
        comm.close().unwrap();
    }
    let mut empty = vec![Vec::<i64>::new(); 3];
    ringreduce::ring_allreduce(&mut empty).unwrap();
}

/// Runs `op` over `inputs` in place and out of place; both must give `want` on every rank.
fn end_to_end<T: Element>(op: ReduceOp, inputs: &[Vec<T>], want: &[T]) {
    let world = inputs.len();
    let comm = Communicator::host_with(
        world,
        HostConfig {
            algorithm: ringreduce::Algorithm::Ring,
            chunk_elems: 2,
            ..HostConfig::default()
        },
    )
    .unwrap();
    let mut bufs = inputs.to_vec();
    comm.all_reduce_in_place(&mut bufs, op).unwrap();
    let mut outs = vec![vec![T::from_i64(0); want.len()]; world];
    comm.all_reduce(inputs, &mut outs, op).unwrap();
    for rank in 0..world {
        assert_eq!(bufs[rank], want, "{} {op} in place, rank {rank}", T::DTYPE);
        assert_eq!(
            outs[rank],
            want,
            "{} {op} out of place, rank {rank}",
            T::DTYPE
        );
    }
}

#[test]
fn integer_avg_is_the_wrapped_sum_divided_and_truncated() {
    // Truncation toward zero: -7 / 2 = -3 (not -4); the sum wraps before the division.
    end_to_end::<i32>(
        ReduceOp::Avg,
        &[vec![-7, 7, 3, i32::MAX, -5], vec![0, 0, 0, 1, 0]],
        &[-3, 3, 1, i32::MIN / 2, -2],
    );
    // 200 + 100 wraps to 44 in u8; 255 × 3 = 765 wraps to 253.
    end_to_end::<u8>(
        ReduceOp::Avg,
        &[
            vec![200, 1, 255, 2],
            vec![100, 1, 255, 2],
            vec![0, 0, 255, 2],
        ],
        &[14, 0, 84, 2],
    );
    // 100 + 100 wraps to -56 in i8, -200 to 56.
    end_to_end::<i8>(
        ReduceOp::Avg,
        &[vec![100, -100, -7], vec![100, -100, 0]],
        &[-28, 28, -3],
    );
    end_to_end::<u64>(
        ReduceOp::Avg,
        &[vec![u64::MAX, u64::MAX], vec![1, 0]],
        &[0, u64::MAX / 2],
    );
    end_to_end::<i64>(
        ReduceOp::Avg,
        &[vec![-9, 9], vec![0, 0], vec![0, 1], vec![0, 0]],
        &[-2, 2],
    );
}

#[test]
fn integer_prod_and_sum_wrap() {
    // 2^16 × 2^16 = 2^32 wraps to 0; 3 × 10^9 wraps to 3 000 000 000 − 2^32.
    end_to_end::<i32>(
        ReduceOp::Prod,
        &[
            vec![65536, 3, -1],
            vec![65536, 1_000_000_000, i32::MIN],
            vec![1, 1, 1],
        ],
        &[0, -1_294_967_296, i32::MIN],
    );
    // 16 × 16 = 256 → 0, 3 × 100 = 300 → 44, 255 × 255 = 65 025 → 1 (mod 256).
    end_to_end::<u8>(
        ReduceOp::Prod,
        &[vec![16, 3, 255], vec![16, 100, 255]],
        &[0, 44, 1],
    );
    // -128 × -1 = 128 wraps to -128.
    end_to_end::<i8>(ReduceOp::Prod, &[vec![-128, 127], vec![-1, 2]], &[-128, -2]);
    end_to_end::<u32>(
        ReduceOp::Sum,
        &[vec![u32::MAX, 7], vec![2, u32::MAX - 6]],
        &[1, 0],
    );
    end_to_end::<i64>(
        ReduceOp::Sum,
        &[vec![i64::MAX], vec![1], vec![i64::MAX]],
        &[-1],
    ); // MIN + MAX
}

#[test]
fn a_failed_communicator_refuses_calls_at_once() {
    let (world, count) = (2, 4);
    let fault = common::fault_at_first_copy(world, count, FaultKind::Fail);
    let comm = Communicator::host_with(
        world,
        HostConfig {
            algorithm: Algorithm::Ring,
            fault: Some(fault),
            ..HostConfig::default()
        },
    )
    .unwrap();
    let mut bufs = inputs::<i32>(ReduceOp::Sum, world, count);
    let first = comm
        .all_reduce_in_place(&mut bufs, ReduceOp::Sum)
        .unwrap_err();
    assert!(
        matches!(first, Error::RankFailed { rank: 0, .. }),
        "{first}"
    );
    let start = Instant::now();
    let err = comm
        .all_reduce_in_place(&mut bufs, ReduceOp::Sum)
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "the refusal took {:?}",
        start.elapsed()
    );
    assert_eq!(err, Error::CommunicatorFailed(Box::new(first.clone())));
    show("communicator already failed", &err);
    let mut outs = vec![vec![0i32; count]; world];
    let err = comm
        .all_reduce(
            &inputs::<i32>(ReduceOp::Sum, world, count),
            &mut outs,
            ReduceOp::Max,
        )
        .unwrap_err();
    assert_eq!(err, Error::CommunicatorFailed(Box::new(first.clone())));
    assert!(outs.iter().all(|o| o == &[0; 4]));
    // Argument errors come first: they do not depend on the communicator's state.
    let mut three = inputs::<i32>(ReduceOp::Sum, 3, count);
    assert_eq!(
        comm.all_reduce_in_place(&mut three, ReduceOp::Sum),
        Err(Error::WorldMismatch { world, got: 3 })
    );
    assert_eq!(comm.health(), Err(first.clone()));
    assert_eq!(comm.close(), Err(first));
}

#[test]
fn a_closed_communicator_says_closed() {
    let comm = Communicator::host(2).unwrap();
    comm.abort();
    assert_eq!(comm.health(), Err(Error::Closed));
    let mut bufs = inputs::<f32>(ReduceOp::Sum, 2, 3);
    let err = comm
        .all_reduce_in_place(&mut bufs, ReduceOp::Sum)
        .unwrap_err();
    assert_eq!(err, Error::Closed);
    show("communicator closed", &err);
    assert_eq!(bufs, inputs::<f32>(ReduceOp::Sum, 2, 3));
    comm.abort(); // a second abort is harmless
    assert_eq!(
        comm.close(),
        Ok(()),
        "closing an aborted, never-failed communicator"
    );
}

#[test]
fn bad_communicator_configurations() {
    // No ranks: the same error for host and GPU communicators (checked before any GPU is asked).
    let err = Communicator::host(0).err().unwrap();
    assert_eq!(err, Error::NoRanks);
    show("world 0", &err);
    assert_eq!(Communicator::new(&[]).err(), Some(Error::NoRanks));
    for config in [
        HostConfig {
            chunk_elems: 0,
            ..HostConfig::default()
        },
        HostConfig {
            slots: 0,
            ..HostConfig::default()
        },
    ] {
        let err = Communicator::host_with(2, config).err().unwrap();
        assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
        show("chunk_elems or slots 0", &err);
    }
}

/// Every option either works or is refused with a clear error before any work; none panics or
/// aborts the process (values a downstream user tried: huge slots, an endless timeout).
#[test]
fn extreme_configuration_values_are_refused_not_fatal() {
    let host_cases: Vec<(&str, HostConfig)> = vec![
        (
            "slots",
            HostConfig {
                slots: usize::MAX,
                ..HostConfig::default()
            },
        ),
        (
            "slots",
            HostConfig {
                slots: 1 << 40,
                ..HostConfig::default()
            },
        ),
        (
            "chunk_elems",
            HostConfig {
                chunk_elems: usize::MAX,
                ..HostConfig::default()
            },
        ),
        (
            "timeout",
            HostConfig {
                timeout: Duration::MAX,
                ..HostConfig::default()
            },
        ),
        (
            "timeout",
            HostConfig {
                timeout: Duration::from_secs(u64::MAX),
                ..HostConfig::default()
            },
        ),
        (
            "timeout",
            HostConfig {
                timeout: Duration::ZERO,
                ..HostConfig::default()
            },
        ),
    ];
    for (field, config) in host_cases {
        let err = Communicator::host_with(2, config).err().unwrap();
        assert!(
            matches!(&err, Error::InvalidConfig { field: f, .. } if *f == field),
            "{field}: {err}"
        );
        show(field, &err);
    }
    let gpu_cases: Vec<(&str, CudaConfig)> = vec![
        (
            "slots",
            CudaConfig {
                slots: usize::MAX,
                ..CudaConfig::default()
            },
        ),
        (
            "slots",
            CudaConfig {
                slots: 1 << 40,
                ..CudaConfig::default()
            },
        ),
        (
            "chunk_bytes",
            CudaConfig {
                chunk_bytes: Some(0),
                ..CudaConfig::default()
            },
        ),
        (
            "chunk_bytes",
            CudaConfig {
                chunk_bytes: Some(usize::MAX),
                ..CudaConfig::default()
            },
        ),
        (
            "timeout",
            CudaConfig {
                timeout: Duration::MAX,
                ..CudaConfig::default()
            },
        ),
        (
            "timeout",
            CudaConfig {
                timeout: Duration::ZERO,
                ..CudaConfig::default()
            },
        ),
    ];
    for (field, config) in gpu_cases {
        // Refused before any GPU is touched, so the same on machines with and without GPUs.
        let err = Communicator::with_config(&[0, 1], config).err().unwrap();
        assert!(
            matches!(&err, Error::InvalidConfig { field: f, .. } if *f == field),
            "{field}: {err}"
        );
    }
    // The largest values inside the limits still work.
    let comm = Communicator::host_with(
        2,
        HostConfig {
            slots: ringreduce::exec::config::MAX_SLOTS,
            timeout: ringreduce::exec::config::MAX_TIMEOUT,
            ..HostConfig::default()
        },
    )
    .unwrap();
    let mut bufs = vec![vec![1.0f32], vec![2.0]];
    comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum).unwrap();
    assert_eq!(bufs, [[3.0], [3.0]]);
}

/// More ranks than plans can be proven for: refused when the communicator is made, with the limit
/// in the error, never a "planner bug" at the first call.
#[test]
fn too_many_ranks_are_refused_at_creation() {
    let max = ringreduce::exec::config::MAX_WORLD;
    let err = Communicator::host(max + 1).err().unwrap();
    assert_eq!(
        err,
        Error::TooManyRanks {
            world: max + 1,
            max
        }
    );
    assert!(err.to_string().contains(&max.to_string()), "{err}");
    show("too many ranks", &err);
}

/// Integer avg divides the wrapped sum by the world size in full width: worlds wider than the
/// type (128 ranks of i8) give the documented quotient, not a division by a wrapped divisor.
#[test]
fn integer_avg_on_worlds_wider_than_the_type() {
    let world = ringreduce::exec::config::MAX_WORLD; // 128: as i8 it would wrap to −128
    let comm = Communicator::host(world).unwrap();
    // Column 0: rank 0 has 100, the rest 0 → 100 / 128 = 0. Column 1: all ones → the sum 128
    // wraps to −128 → −1. Column 2: all −1 → −128 / 128 = −1. Column 3: 127 on rank 0, 1 on
    // rank 1 → 128 wraps to −128 → −1.
    let mut bufs: Vec<Vec<i8>> = (0..world)
        .map(|r| {
            vec![
                if r == 0 { 100 } else { 0 },
                1,
                -1,
                match r {
                    0 => 127,
                    1 => 1,
                    _ => 0,
                },
            ]
        })
        .collect();
    comm.all_reduce_in_place(&mut bufs, ReduceOp::Avg).unwrap();
    for (rank, b) in bufs.iter().enumerate() {
        assert_eq!(b, &[0, -1, -1, -1], "rank {rank}");
    }
    let mut ubufs: Vec<Vec<u8>> = (0..world)
        .map(|r| vec![if r < 2 { 255 } else { 1 }])
        .collect();
    // 2 × 255 + 126 = 636 wraps to 124 in u8 → 124 / 128 = 0.
    comm.all_reduce_in_place(&mut ubufs, ReduceOp::Avg).unwrap();
    assert!(ubufs.iter().all(|b| b == &[0]));
}

/// Min and max of −0 and +0 are defined (−0 < +0) and identical on every algorithm and rank.
#[test]
fn min_max_of_signed_zeros_are_defined() {
    for algorithm in [Algorithm::Ring, Algorithm::OneShot, Algorithm::TwoShot] {
        for world in [2, 3, 5] {
            let comm = Communicator::host_with(
                world,
                HostConfig {
                    algorithm,
                    ..HostConfig::default()
                },
            )
            .unwrap();
            // Element i: rank r holds −0 or +0 by bit (r + i) of a pattern, so every mix occurs.
            let count = 64;
            let bufs: Vec<Vec<f32>> = (0..world)
                .map(|r| {
                    (0..count)
                        .map(|i| if (i >> (r % 6)) & 1 == 1 { -0.0 } else { 0.0 })
                        .collect()
                })
                .collect();
            for op in [ReduceOp::Min, ReduceOp::Max] {
                let mut out = bufs.clone();
                comm.all_reduce_in_place(&mut out, op).unwrap();
                for i in 0..count {
                    let any_neg = bufs.iter().any(|b| b[i].is_sign_negative());
                    let all_neg = bufs.iter().all(|b| b[i].is_sign_negative());
                    let want_neg = if op == ReduceOp::Min {
                        any_neg
                    } else {
                        all_neg
                    };
                    for (rank, o) in out.iter().enumerate() {
                        assert_eq!(
                            o[i].is_sign_negative(),
                            want_neg,
                            "{algorithm:?} world {world} {op} rank {rank} index {i}"
                        );
                    }
                }
            }
        }
    }
}

fn run_sum(comm: &Communicator, world: usize, count: usize) -> Vec<Vec<f32>> {
    let mut bufs: Vec<Vec<f32>> = (0..world)
        .map(|r| {
            (0..count)
                .map(|i| ringreduce::verify::order_sensitive_input(r, i))
                .collect()
        })
        .collect();
    comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum).unwrap();
    bufs
}

/// Two ranks: every algorithm gives the same bits already (a two-operand fold is symmetric).
#[test]
fn two_ranks_give_the_same_bits_on_every_algorithm() {
    let count = 10_007;
    let results: Vec<Vec<Vec<f32>>> = [Algorithm::Ring, Algorithm::OneShot, Algorithm::TwoShot]
        .into_iter()
        .map(|algorithm| {
            let comm = Communicator::host_with(
                2,
                HostConfig {
                    algorithm,
                    ..HostConfig::default()
                },
            )
            .unwrap();
            run_sum(&comm, 2, count)
        })
        .collect();
    for r in &results[1..] {
        assert!(r
            .iter()
            .flatten()
            .zip(results[0].iter().flatten())
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}

/// Deterministic mode: with three or more ranks every element is the rank-order fold, bit for
/// bit, whichever algorithm runs and at every size (the one-shot and the two-shot forced, and
/// `Auto`, the two-shot on host ranks, beyond the two-shot's rank limit the one-shot); without
/// it the ring's order differs (which is what the mode is for — this part checks the test can
/// tell).
#[test]
fn deterministic_mode_folds_in_rank_order_at_every_size() {
    let world = 3;
    let limit = ringreduce::exec::algorithm::ONESHOT_AUTO_MAX_BYTES * 2 / world;
    let small = 4099;
    let large = limit / 4 + 1000;
    let reference = |i: usize| {
        (1..world).fold(ringreduce::verify::order_sensitive_input(0, i), |acc, r| {
            acc + ringreduce::verify::order_sensitive_input(r, i)
        })
    };
    let deterministic = |world: usize, algorithm: Algorithm| {
        Communicator::host_with(
            world,
            HostConfig {
                algorithm,
                deterministic: true,
                ..HostConfig::default()
            },
        )
        .unwrap()
    };
    for algorithm in [Algorithm::Auto, Algorithm::OneShot, Algorithm::TwoShot] {
        let comm = deterministic(world, algorithm);
        for count in [small, large] {
            for (rank, b) in run_sum(&comm, world, count).iter().enumerate() {
                let wrong = (0..count)
                    .filter(|&i| b[i].to_bits() != reference(i).to_bits())
                    .count();
                assert_eq!(wrong, 0, "{algorithm:?}: count {count} rank {rank}");
            }
        }
    }
    let wide = ringreduce::plan::twoshot::MAX_RANKS + 1;
    assert_eq!(
        deterministic(wide, Algorithm::Auto).algorithm_for(4, true),
        Algorithm::OneShot
    );
    let ring = Communicator::host_with(
        world,
        HostConfig {
            algorithm: Algorithm::Ring,
            ..HostConfig::default()
        },
    )
    .unwrap();
    let ring = run_sum(&ring, world, large);
    let differ = (0..large)
        .filter(|&i| ring[0][i].to_bits() != reference(i).to_bits())
        .count();
    assert!(
        differ > 0,
        "the ring folded every element in rank order: the data is not order-sensitive"
    );
    println!("ring vs rank order at {world} ranks: {differ} of {large} elements differ");
    // What deterministic mode refuses: the ring forced with more than two ranks.
    let err = Communicator::host_with(
        world,
        HostConfig {
            algorithm: Algorithm::Ring,
            deterministic: true,
            ..HostConfig::default()
        },
    )
    .err()
    .unwrap();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
}
