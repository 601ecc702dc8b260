//! Every collective on the host executor against an independent host reference: every element
//! type, every operator where the collective reduces, in and out of place, worlds 1 to 9, counts
//! 0, 1, 7, 13 and 1009 (a prime above the chunk length, so blocks span several chunks that do
//! not divide them). Inputs depend on rank and index ([`ringreduce::verify::input_value`]) and
//! are exact in every type, so the expectations are exact: bits, not tolerances. Then bad
//! inputs, each with its named error.

use ringreduce::plan::{Collective, Transfer};
use ringreduce::verify::{compare, expected_value, input_value};
use ringreduce::{Algorithm, Communicator, Element, Error, HostConfig, ReduceOp, Transport};

/// A host buffer by address, for overlap tests: validation must refuse it before any use.
struct Raw(*mut f32, usize);

// SAFETY: test-only: every Raw points into a live Vec of the test for the whole call, and the
// calls that get them are refused by validation before anything touches the memory.
unsafe impl ringreduce::Buffer<f32> for Raw {
    fn placement(&self) -> ringreduce::Placement {
        ringreduce::Placement::Host
    }
    fn count(&self) -> usize {
        self.1
    }
    fn address(&self) -> u64 {
        self.0 as u64
    }
}

// SAFETY: as above.
unsafe impl ringreduce::BufferMut<f32> for Raw {
    fn address_mut(&mut self) -> u64 {
        self.0 as u64
    }
}

const COUNTS: [usize; 5] = [0, 1, 7, 13, 1009];
const WORLDS: std::ops::RangeInclusive<usize> = 1..=9;

fn comm(world: usize) -> Communicator {
    comm_running(world, Algorithm::Ring)
}

/// A host communicator whose collectives take `algorithm`'s form: the ring's (pushes) or the
/// one-shot's (direct reads between two barriers; send/recv has only the ring's).
fn comm_running(world: usize, algorithm: Algorithm) -> Communicator {
    // Small chunks and two slots: every block of the larger counts is many chunks, and slots are
    // reused within a call.
    Communicator::host_with(
        world,
        HostConfig {
            chunk_elems: 96,
            slots: 2,
            algorithm,
            ..HostConfig::default()
        },
    )
    .unwrap()
}

/// A value no test input takes (inputs are small), for memory a collective must overwrite.
fn sentinel<T: Element>() -> T {
    T::from_i64(77)
}

fn input<T: Element>(op: ReduceOp, rank: usize, len: usize) -> Vec<T> {
    (0..len).map(|i| input_value(op, rank, i)).collect()
}

#[track_caller]
fn same<T: Element>(what: &str, rank: usize, got: &[T], want: &[T]) {
    let (wrong, first) = compare(rank, got, want, 4);
    assert_eq!(wrong, 0, "{what}: {wrong} wrong, first {first:?}");
}

/// The reference fold over every rank of input element `index`: [`expected_value`] folds the
/// inputs rank by rank on the host.
fn reduced<T: Element>(op: ReduceOp, world: usize, index: usize) -> T {
    expected_value(op, world, index)
}

fn reduce_scatter<T: Element>(c: &Communicator, op: ReduceOp, count: usize, in_place: bool) {
    let n = c.world();
    let what = format!(
        "reduce-scatter {:?} {op} n={n} count={count} in_place={in_place}",
        T::DTYPE
    );
    let want = |r: usize| -> Vec<T> { (0..count).map(|k| reduced(op, n, r * count + k)).collect() };
    if in_place {
        let mut bufs: Vec<Vec<T>> = (0..n).map(|r| input(op, r, n * count)).collect();
        c.reduce_scatter_in_place(&mut bufs, op).unwrap();
        for (r, b) in bufs.iter().enumerate() {
            same(&what, r, &b[r * count..(r + 1) * count], &want(r));
        }
    } else {
        let inputs: Vec<Vec<T>> = (0..n).map(|r| input(op, r, n * count)).collect();
        let mut outs = vec![vec![sentinel::<T>(); count]; n];
        c.reduce_scatter(&inputs, &mut outs, op).unwrap();
        for (r, b) in outs.iter().enumerate() {
            same(&what, r, b, &want(r));
        }
        // Inputs are never written.
        for (r, b) in inputs.iter().enumerate() {
            same(&what, r, b, &input(op, r, n * count));
        }
    }
}

fn all_gather<T: Element>(c: &Communicator, count: usize, in_place: bool) {
    let n = c.world();
    let op = ReduceOp::Sum;
    let what = format!(
        "all-gather {:?} n={n} count={count} in_place={in_place}",
        T::DTYPE
    );
    let want: Vec<T> = (0..n).flat_map(|j| input::<T>(op, j, count)).collect();
    let outs = if in_place {
        let mut bufs: Vec<Vec<T>> = (0..n)
            .map(|r| {
                let mut b = vec![sentinel::<T>(); n * count];
                b[r * count..(r + 1) * count].copy_from_slice(&input(op, r, count));
                b
            })
            .collect();
        c.all_gather_in_place(&mut bufs).unwrap();
        bufs
    } else {
        let inputs: Vec<Vec<T>> = (0..n).map(|r| input(op, r, count)).collect();
        let mut outs = vec![vec![sentinel::<T>(); n * count]; n];
        c.all_gather(&inputs, &mut outs).unwrap();
        outs
    };
    for (r, b) in outs.iter().enumerate() {
        same(&what, r, b, &want);
    }
}

fn broadcast<T: Element>(c: &Communicator, root: usize, count: usize, in_place: bool) {
    let n = c.world();
    let op = ReduceOp::Sum;
    let what = format!(
        "broadcast {:?} root={root} n={n} count={count} in_place={in_place}",
        T::DTYPE
    );
    let want = input::<T>(op, root, count);
    let outs = if in_place {
        let mut bufs: Vec<Vec<T>> = (0..n)
            .map(|r| {
                if r == root {
                    want.clone()
                } else {
                    vec![sentinel::<T>(); count]
                }
            })
            .collect();
        c.broadcast_in_place(&mut bufs, root).unwrap();
        bufs
    } else {
        let mut outs = vec![vec![sentinel::<T>(); count]; n];
        c.broadcast(&want, &mut outs, root).unwrap();
        outs
    };
    for (r, b) in outs.iter().enumerate() {
        same(&what, r, b, &want);
    }
}

fn reduce<T: Element>(c: &Communicator, op: ReduceOp, root: usize, count: usize, in_place: bool) {
    let n = c.world();
    let what = format!(
        "reduce {:?} {op} root={root} n={n} count={count} in_place={in_place}",
        T::DTYPE
    );
    let want: Vec<T> = (0..count).map(|k| reduced(op, n, k)).collect();
    if in_place {
        let mut bufs: Vec<Vec<T>> = (0..n).map(|r| input(op, r, count)).collect();
        c.reduce_in_place(&mut bufs, root, op).unwrap();
        for (r, b) in bufs.iter().enumerate() {
            // The root gets the result; every other rank's buffer is left as it was.
            let want = if r == root {
                want.clone()
            } else {
                input(op, r, count)
            };
            same(&what, r, b, &want);
        }
    } else {
        let inputs: Vec<Vec<T>> = (0..n).map(|r| input(op, r, count)).collect();
        let mut out = vec![sentinel::<T>(); count];
        c.reduce(&inputs, &mut out, root, op).unwrap();
        same(&what, root, &out, &want);
    }
}

fn all_to_all<T: Element>(c: &Communicator, count: usize) {
    let n = c.world();
    let op = ReduceOp::Sum;
    let what = format!("all-to-all {:?} n={n} count={count}", T::DTYPE);
    let inputs: Vec<Vec<T>> = (0..n).map(|r| input(op, r, n * count)).collect();
    let mut outs = vec![vec![sentinel::<T>(); n * count]; n];
    c.all_to_all(&inputs, &mut outs).unwrap();
    for (r, b) in outs.iter().enumerate() {
        // Block j of rank r's output is block r of rank j's input.
        let want: Vec<T> = (0..n)
            .flat_map(|j| (0..count).map(move |k| input_value::<T>(op, j, r * count + k)))
            .collect();
        same(&what, r, b, &want);
    }
}

fn send_recv<T: Element>(c: &Communicator, count: usize) {
    let n = c.world();
    let op = ReduceOp::Sum;
    // A pipeline exchange (r → r + 1 for every r), a send to oneself, and a second send from
    // the last rank to rank 0 of another length.
    let mut pairs: Vec<(usize, usize)> = (0..n).map(|r| (r, (r + 1) % n)).collect();
    pairs.push((0, 0));
    pairs.push((n - 1, 0));
    let len = |i: usize| if i == n + 1 { count + 3 } else { count };
    // Send buffer i's contents depend on the transfer, not just the rank.
    let sends: Vec<Vec<T>> = (0..pairs.len())
        .map(|i| input(op, pairs[i].0 + 11 * i, len(i)))
        .collect();
    let mut recvs: Vec<Vec<T>> = (0..pairs.len())
        .map(|i| vec![sentinel::<T>(); len(i)])
        .collect();
    c.send_recv(&pairs, &sends, &mut recvs).unwrap();
    for (i, b) in recvs.iter().enumerate() {
        same(
            &format!("send/recv {:?} n={n} transfer {i}", T::DTYPE),
            pairs[i].1,
            b,
            &sends[i],
        );
    }
}

fn every_collective<T: Element>() {
    for (n, algorithm) in WORLDS.flat_map(|n| [(n, Algorithm::Ring), (n, Algorithm::OneShot)]) {
        let c = comm_running(n, algorithm);
        for count in COUNTS {
            for in_place in [false, true] {
                for op in ReduceOp::ALL {
                    reduce_scatter::<T>(&c, op, count, in_place);
                    reduce::<T>(&c, op, n - 1, count, in_place);
                }
                reduce::<T>(&c, ReduceOp::Sum, n / 2, count, in_place);
                all_gather::<T>(&c, count, in_place);
                for root in [0, n / 2, n - 1] {
                    broadcast::<T>(&c, root, count, in_place);
                }
            }
            all_to_all::<T>(&c, count);
            send_recv::<T>(&c, count);
        }
        c.close().unwrap();
    }
}

macro_rules! per_type {
    ($($name:ident: $t:ty),*) => {$(
        #[test]
        fn $name() {
            every_collective::<$t>();
        }
    )*};
}

per_type!(
    every_collective_f32: f32,
    every_collective_f64: f64,
    every_collective_f16: half::f16,
    every_collective_bf16: half::bf16,
    every_collective_i8: i8,
    every_collective_u8: u8,
    every_collective_i32: i32,
    every_collective_u32: u32,
    every_collective_i64: i64,
    every_collective_u64: u64,
    every_collective_f8e4m3: ringreduce::F8E4M3,
    every_collective_f8e5m2: ringreduce::F8E5M2
);

/// The reduced matrix run under `config` for 2, 3 and 5 ranks and three delay seeds: every
/// collective's form that `config` selects, in and out of place.
fn shaken(config: HostConfig) {
    for seed in 0..3 {
        for n in [2, 3, 5] {
            let c = Communicator::host_with(
                n,
                HostConfig {
                    delay_seed: Some(seed),
                    ..config.clone()
                },
            )
            .unwrap();
            for in_place in [false, true] {
                reduce_scatter::<i32>(&c, ReduceOp::Sum, 13, in_place);
                all_gather::<f32>(&c, 13, in_place);
                broadcast::<u8>(&c, n - 1, 13, in_place);
                reduce::<f64>(&c, ReduceOp::Avg, 1, 13, in_place);
            }
            all_to_all::<i64>(&c, 13);
            send_recv::<u32>(&c, 13);
            c.close().unwrap();
        }
    }
}

#[test]
fn staged_edges_and_schedule_shaking_give_the_same_results() {
    shaken(HostConfig {
        algorithm: ringreduce::Algorithm::Ring,
        chunk_elems: 5,
        slots: 1,
        transport: Transport::Staged,
        ..HostConfig::default()
    });
}

#[test]
fn one_shot_forms_under_schedule_shaking_give_the_same_results() {
    // (Send/recv has only the ring's form: it runs that one here too.)
    shaken(HostConfig {
        algorithm: Algorithm::OneShot,
        ..HostConfig::default()
    });
}

#[test]
fn the_generic_entry_runs_every_collective() {
    let c = comm(3);
    let inputs: Vec<Vec<i32>> = (0..3i32).map(|r| vec![r + 1; 6]).collect();
    let mut outs = vec![vec![0i32; 2]; 3];
    c.collective(
        &Collective::ReduceScatter,
        Some(&inputs),
        &mut outs,
        ReduceOp::Sum,
    )
    .unwrap();
    assert_eq!(outs, vec![vec![6, 6]; 3]);
    let mut bufs: Vec<Vec<i32>> = (0..3i32).map(|r| vec![r; 4]).collect();
    c.collective(
        &Collective::AllReduce,
        None::<&[Vec<i32>]>,
        &mut bufs,
        ReduceOp::Max,
    )
    .unwrap();
    assert_eq!(bufs, vec![vec![2; 4]; 3]);
    let transfers = vec![Transfer {
        from: 2,
        to: 0,
        count: 2,
    }];
    let mut recv = vec![vec![0i32; 2]];
    c.collective(
        &Collective::SendRecv { transfers },
        Some(&[vec![9, 8]]),
        &mut recv,
        ReduceOp::Sum,
    )
    .unwrap();
    assert_eq!(recv[0], [9, 8]);
    // The root's input lives until the wait: an enqueued call reads it after returning.
    let root_input = [vec![5i32; 4]];
    // SAFETY: `root_input` and `bufs` stay alive, and are not touched, until `synchronize` below
    // has waited for the call.
    unsafe {
        c.enqueue_collective(
            &Collective::Broadcast { root: 2 },
            Some(&root_input),
            &mut bufs,
            ReduceOp::Sum,
            None,
        )
    }
    .unwrap();
    c.synchronize().unwrap();
    assert_eq!(bufs, vec![vec![5; 4]; 3]);
}

#[test]
fn bad_inputs_get_named_errors() {
    let c = comm(3);
    let ins = vec![vec![0f32; 6]; 3];
    let mut outs = vec![vec![0f32; 2]; 3];
    // A reduce-scatter output of the wrong length names the rank, the buffer and both lengths.
    outs[1] = vec![0.0; 3];
    let err = c
        .reduce_scatter(&ins, &mut outs, ReduceOp::Sum)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "reduce-scatter: rank 1's output has 3 elements, expected 2"
    );
    match c.reduce_scatter(&ins, &mut outs, ReduceOp::Sum) {
        Err(Error::BufferLength {
            rank: 1,
            expected: 2,
            got: 3,
            ref buffer,
            ..
        }) => {
            assert_eq!(buffer, "output")
        }
        other => panic!("{other:?}"),
    }
    // An in-place all-gather buffer that is not world × count.
    let mut bufs = vec![vec![0f32; 6], vec![0f32; 6], vec![0f32; 5]];
    assert!(matches!(
        c.all_gather_in_place(&mut bufs),
        Err(Error::BufferLength {
            rank: 2,
            expected: 6,
            got: 5,
            ..
        })
    ));
    // Roots out of range.
    let mut outs = vec![vec![0f32; 6]; 3];
    let err = c.broadcast(&vec![0f32; 6], &mut outs, 3).unwrap_err();
    assert_eq!(err, Error::RootOutOfRange { root: 3, world: 3 });
    assert_eq!(
        err.to_string(),
        "root 3 is out of range: the communicator has 3 ranks"
    );
    assert_eq!(
        c.reduce_in_place(&mut outs, 7, ReduceOp::Sum),
        Err(Error::RootOutOfRange { root: 7, world: 3 })
    );
    // The wrong world.
    let mut two = vec![vec![0f32; 6]; 2];
    assert_eq!(
        c.all_to_all(&ins, &mut two),
        Err(Error::WorldMismatch { world: 3, got: 2 })
    );
    // A broadcast's input list holds the root's buffer alone.
    assert!(matches!(
        c.collective(
            &Collective::Broadcast { root: 0 },
            Some(&ins),
            &mut outs,
            ReduceOp::Sum
        ),
        Err(Error::BufferCount {
            expected: 1,
            got: 3,
            ..
        })
    ));
    // All-to-all and send/recv have no in-place form.
    assert_eq!(
        c.collective(
            &Collective::AllToAll,
            None::<&[Vec<f32>]>,
            &mut outs,
            ReduceOp::Sum
        ),
        Err(Error::NoInPlace {
            collective: "all-to-all"
        })
    );
    // Transfers between ranks outside the world, and receive buffers of the wrong length.
    let mut recv = vec![vec![0f32; 6]];
    assert!(matches!(
        c.send_recv(&[(0, 3)], &[vec![0f32; 6]], &mut recv),
        Err(Error::TransferOutOfRange {
            index: 0,
            from: 0,
            to: 3,
            world: 3
        })
    ));
    let mut short = vec![vec![0f32; 5]];
    match c.send_recv(&[(0, 1)], &[vec![0f32; 6]], &mut short) {
        Err(Error::BufferLength {
            rank: 1,
            expected: 6,
            got: 5,
            ref buffer,
            ..
        }) => {
            assert_eq!(buffer, "receive buffer of transfer 0")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        c.send_recv(&[(0, 1), (1, 2)], &[vec![0f32; 6]], &mut recv),
        Err(Error::BufferCount {
            expected: 2,
            got: 1,
            ..
        })
    ));
    // Two receive buffers that overlap, and an output overlapping an input.
    let mut mem = vec![0f32; 16];
    let base = mem.as_mut_ptr();
    let mut overlapping = vec![Raw(base, 4), Raw(base.wrapping_add(2), 4)];
    let sends = vec![Raw(base.wrapping_add(8), 4), Raw(base.wrapping_add(12), 4)];
    assert_eq!(
        c.send_recv(&[(0, 1), (1, 2)], &sends, &mut overlapping),
        Err(Error::OutputsOverlap {
            first: 1,
            second: 2
        })
    );
    let ins: Vec<Raw> = (0..3).map(|r| Raw(base.wrapping_add(4 * r), 1)).collect();
    let mut outs = vec![
        Raw(base.wrapping_add(12), 3),
        Raw(base.wrapping_add(2), 3),
        Raw(base.wrapping_add(12), 0),
    ];
    outs.truncate(2);
    outs.push(Raw(base.wrapping_add(15), 0));
    assert_eq!(
        c.collective(&Collective::AllGather, Some(&ins), &mut outs, ReduceOp::Sum),
        Err(Error::BufferLength {
            collective: "all-gather",
            rank: 2,
            buffer: "output".into(),
            expected: 3,
            got: 0
        })
    );
    outs[2] = Raw(base.wrapping_add(13), 3);
    assert_eq!(
        c.collective(&Collective::AllGather, Some(&ins), &mut outs, ReduceOp::Sum),
        Err(Error::Overlap { rank: 1 })
    );
    drop(mem);
    // Nothing above failed the communicator.
    c.health().unwrap();
    c.close().unwrap();
}

/// `Auto` picks each collective's form by the bytes that cross a rank's links (the one rule,
/// `exec::algorithm::select`): the one-shot up to the limit, the ring above; send/recv is always
/// the ring's; deterministic mode keeps the reducing collectives on the one-shot with more than
/// two ranks; a forced algorithm is obeyed (the two-shot, an all-reduce only, means the one-shot).
#[test]
fn auto_picks_each_collectives_form_by_size() {
    use ringreduce::exec::algorithm::COLLECTIVE_ONESHOT_AUTO_MAX_BYTES as LIMIT;
    let auto = |world: usize, deterministic: bool| {
        Communicator::host_with(
            world,
            HostConfig {
                algorithm: Algorithm::Auto,
                deterministic,
                ..HostConfig::default()
            },
        )
        .unwrap()
    };
    let c = auto(3, false);
    let per_rank = LIMIT / 2; // crosses (3 − 1) × per_rank = LIMIT
    for coll in [
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast { root: 1 },
        Collective::Reduce { root: 2 },
        Collective::AllToAll,
    ] {
        assert_eq!(
            c.algorithm_for_collective(&coll, per_rank, false),
            Algorithm::OneShot
        );
        assert_eq!(
            c.algorithm_for_collective(&coll, per_rank + 1, false),
            Algorithm::Ring
        );
    }
    let pipeline = Collective::SendRecv {
        transfers: vec![Transfer {
            from: 0,
            to: 1,
            count: 4,
        }],
    };
    assert_eq!(
        c.algorithm_for_collective(&pipeline, 16, false),
        Algorithm::Ring
    );
    // What ran, as the executor says: each collective's one-shot form at the limit, the ring's
    // one element above; send/recv the ring's.
    let ran = |c: &Communicator| c.last_ran().map(|r| (r.algorithm, r.form));
    let host = ringreduce::Form::HostThreads;
    let at_limit = per_rank / 4;
    for (count, want) in [
        (at_limit, Algorithm::OneShot),
        (at_limit + 1, Algorithm::Ring),
    ] {
        reduce_scatter::<f32>(&c, ReduceOp::Sum, count, false);
        assert_eq!(ran(&c), Some((want, host)), "reduce-scatter of {count}");
        all_gather::<f32>(&c, count, true);
        assert_eq!(ran(&c), Some((want, host)), "all-gather of {count}");
        broadcast::<f32>(&c, 1, count, false);
        assert_eq!(ran(&c), Some((want, host)), "broadcast of {count}");
        reduce::<f32>(&c, ReduceOp::Max, 2, count, false);
        assert_eq!(ran(&c), Some((want, host)), "reduce of {count}");
        all_to_all::<f32>(&c, count);
        assert_eq!(ran(&c), Some((want, host)), "all-to-all of {count}");
    }
    send_recv::<f32>(&c, 4);
    assert_eq!(ran(&c), Some((Algorithm::Ring, host)));
    let d = auto(3, true);
    assert_eq!(
        d.algorithm_for_collective(&Collective::ReduceScatter, 1 << 30, true),
        Algorithm::OneShot
    );
    assert_eq!(
        d.algorithm_for_collective(&Collective::AllGather, 1 << 30, true),
        Algorithm::Ring
    );
    let forced = comm_running(2, Algorithm::TwoShot);
    assert_eq!(
        forced.algorithm_for_collective(&Collective::AllToAll, 1 << 30, false),
        Algorithm::OneShot
    );
    assert_eq!(
        forced.algorithm_for_collective(&Collective::AllReduce, 1 << 30, false),
        Algorithm::TwoShot
    );
}
