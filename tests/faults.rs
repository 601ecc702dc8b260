//! Faults never hang, never lose data, and say who failed.
//!
//! The host executor injects a fault on one rank at one data operation of its program: the
//! operation fails, panics, or stalls past the deadline. Over 60 deterministic seeds (world 2..=6,
//! count, chunk, slots, peer or staged edges, in or out of place, `Sum` or `Avg`, fault rank,
//! instruction and kind) every call must:
//!
//! - return an `Err` (checked from outside: the call runs on a thread the test abandons if it has
//!   not answered within timeout + 10 s), a failure at once, a stall at the deadline;
//! - name the faulty rank: `RankFailed { rank, during }` with the instruction's own tag for a
//!   failure or panic, `Timeout { rank, .. }` naming the stalled instruction for a stall;
//! - leave the communicator failed (`health()` is that error, a second call is
//!   `CommunicatorFailed` at once, `close()` returns it), inputs unchanged, bytes outside the
//!   buffers unchanged, and every in-place element a sum of inputs that includes its own rank's;
//! - let `abort()` return and a new communicator of the same world compute exact results.
//!
//! The fault's instruction is chosen among the data operations of the plan the executor builds
//! (the same `RingSpec`): records and waits never trigger a fault, which a test below checks.

mod common;
use common::{ringreduce_threads, settle_threads, Rng};
use ringreduce::plan::{Gather, Instr, OneShotSpec, Op, RingSpec};
use ringreduce::verify::{compare, input_value, make_expected, make_input};
use ringreduce::{
    Algorithm, Communicator, Element, Error, Fault, FaultKind, HostConfig, ReduceOp, Transport,
};
use std::sync::{mpsc, Mutex, Once};
use std::time::{Duration, Instant};

/// The deadline of every faulty call.
const TIMEOUT: Duration = Duration::from_millis(300);
/// The deadline of calls whose fault is a failure or a panic: long, so that returning well
/// before it proves the call did not wait for it (a timing margin a loaded machine cannot break).
const FAIL_TIMEOUT: Duration = Duration::from_secs(20);
/// How long past the deadline the test waits before declaring a call hung.
const HANG_MARGIN: Duration = Duration::from_secs(10);
/// Elements of canary on each side of an in-place buffer.
const GUARD: usize = 8;

/// Serializes the tests of this file: they measure time and count threads.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Injected panics are expected; keep them out of the test output, report every other panic.
fn quiet_injected_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let injected = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|m| m.starts_with("injected panic"));
            if !injected {
                default(info);
            }
        }));
    });
}

/// One faulty call, fully determined by its seed.
#[derive(Clone)]
struct Case {
    seed: u64,
    world: usize,
    count: usize,
    config: HostConfig,
    in_place: bool,
    op: ReduceOp,
    fault: Fault,
    /// The instruction the fault hits (its index is `fault.instr` modulo the program length).
    instr: Instr,
}

impl std::fmt::Display for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.config;
        write!(
            f,
            "seed {} ({:?}, world {}, count {}, {}, {}, chunk {}, slots {}, {:?}, delays {:?}, {:?} on rank {} at instruction {}: {:?})",
            self.seed,
            c.algorithm,
            self.world,
            self.count,
            if self.in_place { "in place" } else { "out of place" },
            self.op,
            c.chunk_elems,
            c.slots,
            c.transport,
            c.delay_seed.is_some(),
            self.fault.kind,
            self.fault.rank,
            self.fault.instr,
            self.instr,
        )
    }
}

/// The plan the host executor builds for this call (the same spec as `HostExecutor::prepare`).
fn plan_of(
    world: usize,
    count: usize,
    in_place: bool,
    op: ReduceOp,
    config: &HostConfig,
) -> ringreduce::plan::Plan {
    if config.algorithm == Algorithm::TwoShot {
        return ringreduce::plan::TwoShotSpec {
            world,
            count,
            in_place,
            op,
            align: 1,
            gather: Gather::Push,
        }
        .build()
        .unwrap();
    }
    if config.algorithm == Algorithm::OneShot {
        let spec = OneShotSpec {
            world,
            count,
            in_place,
            op,
        };
        return match config.transport {
            Transport::Staged => spec.build_staged(),
            _ => spec.build(),
        }
        .unwrap();
    }
    RingSpec {
        world,
        count,
        in_place,
        op: if op == ReduceOp::Avg {
            ReduceOp::Avg
        } else {
            ReduceOp::Sum
        },
        chunk_elems: config.chunk_elems,
        slots: config.slots,
        align_elems: 1,
        transports: vec![config.transport.on_host(); world],
    }
    .build()
    .unwrap()
}

fn is_data_op(instr: &Instr) -> bool {
    matches!(
        instr.op,
        Op::Copy { .. } | Op::Reduce { .. } | Op::Scale { .. } | Op::PeerReduce { .. }
    )
}

fn case(seed: u64) -> Case {
    let mut rng = Rng(seed);
    let world = rng.range(2, 6);
    // At least one element per rank, so every rank has data operations to fault.
    let count = rng.range(world, world * 50);
    let in_place = rng.next() % 2 == 0;
    // In place, the partial-result check below needs sums; out of place `Avg` adds Scale ops.
    let op = if !in_place && rng.next() % 2 == 0 {
        ReduceOp::Avg
    } else {
        ReduceOp::Sum
    };
    let kind = [FaultKind::Fail, FaultKind::Panic, FaultKind::Stall][seed as usize % 3];
    let mut config = HostConfig {
        chunk_elems: rng.range(1, 16),
        slots: rng.range(1, 3),
        transport: if rng.next() % 2 == 0 {
            Transport::Peer
        } else {
            Transport::Staged
        },
        timeout: if kind == FaultKind::Stall {
            TIMEOUT
        } else {
            FAIL_TIMEOUT
        },
        delay_seed: (rng.next() % 3 == 0).then_some(seed),
        fault: None,
        // A quarter of the cases fault the one-shot, an eighth the two-shot: their barriers
        // must not hang either.
        algorithm: match seed % 8 {
            3 | 7 => Algorithm::OneShot,
            5 => Algorithm::TwoShot,
            _ => Algorithm::Ring,
        },
        deterministic: false,
    };
    // The two-shot reads its peers' buffers: it has no staged form.
    if config.algorithm == Algorithm::TwoShot {
        config.transport = Transport::Peer;
    }
    let plan = plan_of(world, count, in_place, op, &config);
    let rank = rng.range(0, world - 1);
    let program = &plan.ranks[rank];
    let data: Vec<usize> = (0..program.len())
        .filter(|&i| is_data_op(&program[i]))
        .collect();
    assert!(
        !data.is_empty(),
        "seed {seed}: rank {rank} has no data operation"
    );
    let index = data[rng.range(0, data.len() - 1)];
    // Sometimes give the index plus a multiple of the program length: it is taken modulo.
    let instr = index + program.len() * rng.range(0, 2);
    Case {
        seed,
        world,
        count,
        config: HostConfig {
            fault: Some(Fault { rank, instr, kind }),
            ..config
        },
        in_place,
        op,
        fault: Fault { rank, instr, kind },
        instr: program[index],
    }
}

/// Buffers of one call. In place, rank r's buffer is `guarded[r][GUARD..GUARD + count]`; out of
/// place, each output is `count + GUARD` long and only its first `count` elements may change.
struct Buffers<T> {
    inputs: Vec<Vec<T>>,
    outputs: Vec<Vec<T>>,
}

const CANARY: i64 = 99;

fn buffers<T: Element>(case: &Case) -> Buffers<T> {
    let inputs: Vec<Vec<T>> = (0..case.world)
        .map(|r| make_input(case.op, r, case.count))
        .collect();
    let outputs = if case.in_place {
        inputs
            .iter()
            .map(|input| {
                let mut g = vec![T::from_i64(CANARY); case.count + 2 * GUARD];
                g[GUARD..GUARD + case.count].copy_from_slice(input);
                g
            })
            .collect()
    } else {
        vec![vec![T::from_i64(CANARY); case.count + GUARD]; case.world]
    };
    Buffers { inputs, outputs }
}

/// Runs the call on the communicator; returns the result and how long it took.
fn call<T: Element>(
    comm: &Communicator,
    case: &Case,
    bufs: &mut Buffers<T>,
) -> (Result<(), Error>, Duration) {
    let start = Instant::now();
    let result = if case.in_place {
        let mut views: Vec<&mut [T]> = bufs
            .outputs
            .iter_mut()
            .map(|g| &mut g[GUARD..GUARD + case.count])
            .collect();
        comm.all_reduce_in_place(&mut views, case.op)
    } else {
        let mut views: Vec<&mut [T]> = bufs
            .outputs
            .iter_mut()
            .map(|o| &mut o[..case.count])
            .collect();
        comm.all_reduce(&bufs.inputs, &mut views, case.op)
    };
    (result, start.elapsed())
}

/// The error the fault must produce: the faulty rank, and the instruction it hit.
fn check_names_the_fault(case: &Case, err: &Error, elapsed: Duration) {
    let Fault { rank, kind, .. } = case.fault;
    let tag = case.instr.tag.to_string();
    match (kind, err) {
        (
            FaultKind::Fail | FaultKind::Panic,
            Error::RankFailed {
                rank: r,
                during,
                message,
            },
        ) => {
            assert_eq!((*r, during.as_str()), (rank, tag.as_str()), "{case}: {err}");
            let what = if kind == FaultKind::Panic {
                "panic: injected panic"
            } else {
                "injected failure"
            };
            assert!(message.contains(what), "{case}: {err}");
            // A failure aborts the call at once; it does not wait for the deadline.
            assert!(
                elapsed < FAIL_TIMEOUT / 4,
                "{case}: a failure took {elapsed:?}"
            );
        }
        (
            FaultKind::Stall,
            Error::Timeout {
                rank: r,
                waiting_on,
                after,
            },
        ) => {
            assert_eq!((*r, *after), (rank, case.config.timeout), "{case}: {err}");
            let stream = format!("{:?} stream", case.instr.stream);
            assert!(
                waiting_on.contains(&stream) && waiting_on.contains(&tag),
                "{case}: {err}"
            );
            // A stall is detected at the deadline, not before.
            assert!(
                elapsed >= TIMEOUT,
                "{case}: timed out after only {elapsed:?}"
            );
        }
        _ => panic!("{case}: wrong error for {kind:?}: {err}"),
    }
}

/// Every sum over a set of ranks that includes `rank`, at `index` (what a partly reduced
/// in-place element may hold: its own input plus some contributions, or the full sum).
fn partial_sums<T: Element>(world: usize, rank: usize, index: usize) -> Vec<T> {
    (0u32..1 << world)
        .filter(|set| set & (1 << rank) != 0)
        .map(|set| {
            let mut acc = input_value::<T>(ReduceOp::Sum, rank, index);
            for r in (0..world).filter(|&r| r != rank && set & (1 << r) != 0) {
                acc = T::combine(
                    ReduceOp::Sum,
                    acc,
                    input_value::<T>(ReduceOp::Sum, r, index),
                );
            }
            acc
        })
        .collect()
}

/// What a failed call may leave: inputs untouched, nothing written outside the buffers, in-place
/// elements only ever sums of inputs that include their own rank's.
fn check_nothing_lost<T: Element>(case: &Case, bufs: &Buffers<T>) {
    let canary = T::from_i64(CANARY);
    for (rank, input) in bufs.inputs.iter().enumerate() {
        assert_eq!(
            input,
            &make_input::<T>(case.op, rank, case.count),
            "{case}: rank {rank}'s input changed"
        );
    }
    for (rank, out) in bufs.outputs.iter().enumerate() {
        let (head, body, tail) = if case.in_place {
            (
                &out[..GUARD],
                &out[GUARD..GUARD + case.count],
                &out[GUARD + case.count..],
            )
        } else {
            (&out[..0], &out[..case.count], &out[case.count..])
        };
        assert!(
            head.iter().chain(tail).all(|v| *v == canary),
            "{case}: rank {rank}: a write outside its buffer"
        );
        if case.in_place {
            for (index, got) in body.iter().enumerate() {
                let sums = partial_sums::<T>(case.world, rank, index);
                assert!(sums.contains(got), "{case}: rank {rank} index {index} holds {got:?}, not a sum including its input");
            }
        }
    }
}

/// Exact results from a fresh communicator of the same shape and no fault.
fn check_recovery<T: Element>(case: &Case) {
    let comm = Communicator::host_with(
        case.world,
        HostConfig {
            fault: None,
            timeout: FAIL_TIMEOUT,
            ..case.config.clone()
        },
    )
    .unwrap();
    let mut bufs = buffers::<T>(case);
    let (result, _) = call(&comm, case, &mut bufs);
    result.unwrap_or_else(|e| panic!("{case}: the new communicator failed: {e}"));
    let want = make_expected::<T>(case.op, case.world, case.count);
    for (rank, out) in bufs.outputs.iter().enumerate() {
        let body = if case.in_place {
            &out[GUARD..GUARD + case.count]
        } else {
            &out[..case.count]
        };
        let (wrong, first) = compare(rank, body, &want, 4);
        assert_eq!(
            wrong, 0,
            "{case}: new communicator, {wrong} wrong, first {first:?}"
        );
    }
    comm.close().unwrap();
}

/// One seed, on a thread of its own so that a hang fails the test instead of blocking it.
fn run_seed<T: Element>(case: Case) {
    let (tx, rx) = mpsc::channel();
    let worker = {
        let case = case.clone();
        std::thread::spawn(move || {
            let comm = Communicator::host_with(case.world, case.config.clone()).unwrap();
            let mut bufs = buffers::<T>(&case);
            let (result, elapsed) = call(&comm, &case, &mut bufs);
            let _ = tx.send((comm, bufs, result, elapsed));
        })
    };
    let limit = case.config.timeout + HANG_MARGIN;
    let (comm, mut bufs, result, elapsed) = match rx.recv_timeout(limit) {
        Ok(answer) => answer,
        Err(_) => panic!("{case}: the call did not return within {limit:?}"),
    };
    worker.join().unwrap();
    let err = match result {
        Ok(()) => panic!("{case}: the faulty call succeeded"),
        Err(err) => err,
    };
    check_names_the_fault(&case, &err, elapsed);
    if case.seed < 3 {
        println!("{:?}: {err}", case.fault.kind); // quoted in docs/ERRORS.md
    }
    check_nothing_lost(&case, &bufs);

    // The communicator is failed: health says so, without a call.
    assert_eq!(comm.health(), Err(err.clone()), "{case}");
    // A second call fails at once, with the first error inside, and touches nothing.
    let (again, elapsed) = call(&comm, &case, &mut bufs);
    assert_eq!(
        again,
        Err(Error::CommunicatorFailed(Box::new(err.clone()))),
        "{case}"
    );
    assert!(
        elapsed < Duration::from_secs(1),
        "{case}: the second call took {elapsed:?}"
    );
    check_nothing_lost(&case, &bufs);
    comm.abort();
    assert_eq!(
        comm.health(),
        Err(err.clone()),
        "{case}: abort forgot the failure"
    );
    assert_eq!(
        comm.close(),
        Err(err),
        "{case}: close must return the first error"
    );

    check_recovery::<T>(&case);
}

#[test]
fn sixty_seeds_fail_fast_name_the_rank_and_recover() {
    let _serial = serial();
    quiet_injected_panics();
    assert_eq!(
        ringreduce_threads(),
        0,
        "threads of an earlier test are still running"
    );
    let start = Instant::now();
    let mut kinds = [0usize; 3];
    for seed in 0..60 {
        let case = case(seed);
        kinds[seed as usize % 3] += 1;
        match seed % 4 {
            0 => run_seed::<f32>(case),
            1 => run_seed::<i32>(case),
            2 => run_seed::<f64>(case),
            _ => run_seed::<u64>(case),
        }
    }
    assert_eq!(kinds, [20, 20, 20]);
    let left = settle_threads();
    println!(
        "60 faulty calls in {:?}; {left} ringreduce threads left",
        start.elapsed()
    );
    assert_eq!(left, 0, "failed communicators left threads behind");
}

#[test]
fn a_fault_on_a_record_or_wait_does_not_fire() {
    let _serial = serial();
    // The executor documents that only copies, reductions and scalings are faulted.
    let (world, count) = (3, 30);
    let base = HostConfig {
        algorithm: ringreduce::Algorithm::Ring,
        chunk_elems: 4,
        slots: 2,
        timeout: FAIL_TIMEOUT,
        ..HostConfig::default()
    };
    let plan = plan_of(world, count, true, ReduceOp::Sum, &base);
    let (rank, index) = (
        1,
        plan.ranks[1]
            .iter()
            .position(|i| matches!(i.op, Op::Wait(_)))
            .unwrap(),
    );
    for kind in [FaultKind::Fail, FaultKind::Panic, FaultKind::Stall] {
        let config = HostConfig {
            fault: Some(Fault {
                rank,
                instr: index,
                kind,
            }),
            ..base.clone()
        };
        let comm = Communicator::host_with(world, config).unwrap();
        let mut bufs: Vec<Vec<i32>> = (0..world)
            .map(|r| make_input(ReduceOp::Sum, r, count))
            .collect();
        comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum).unwrap();
        assert!(bufs
            .iter()
            .all(|b| b == &make_expected::<i32>(ReduceOp::Sum, world, count)));
        comm.health().unwrap();
    }
}

#[test]
fn a_fault_on_a_rank_outside_the_world_does_not_fire() {
    let _serial = serial();
    let config = HostConfig {
        fault: Some(Fault {
            rank: 7,
            instr: 0,
            kind: FaultKind::Fail,
        }),
        ..HostConfig::default()
    };
    let comm = Communicator::host_with(2, config).unwrap();
    let mut bufs = vec![vec![1u8, 2], vec![3, 4]];
    comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum).unwrap();
    assert_eq!(bufs, [[4, 6], [4, 6]]);
}

#[test]
fn health_does_not_wait_for_a_running_call() {
    let _serial = serial();
    // A stalled call holds the communicator for its whole deadline; health must answer at once.
    let timeout = Duration::from_secs(2);
    let (world, count) = (3, 30);
    let config = HostConfig {
        algorithm: ringreduce::Algorithm::Ring,
        chunk_elems: 4,
        timeout,
        ..HostConfig::default()
    };
    let plan = plan_of(world, count, true, ReduceOp::Sum, &config);
    let index = plan.ranks[2].iter().position(is_data_op).unwrap();
    let fault = Fault {
        rank: 2,
        instr: index,
        kind: FaultKind::Stall,
    };
    let comm = Communicator::host_with(
        world,
        HostConfig {
            fault: Some(fault),
            ..config
        },
    )
    .unwrap();
    let started = Instant::now();
    std::thread::scope(|s| {
        let running = s.spawn(|| {
            let mut bufs: Vec<Vec<u32>> = (0..world)
                .map(|r| make_input(ReduceOp::Sum, r, count))
                .collect();
            comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum)
        });
        std::thread::sleep(Duration::from_millis(100));
        let asked = Instant::now();
        let health = comm.health();
        let answered = asked.elapsed();
        assert!(
            answered < Duration::from_secs(1),
            "health() blocked for {answered:?}"
        );
        assert!(!running.is_finished(), "the stalled call ended early");
        assert_eq!(health, Ok(()), "no call has failed yet");
        let err = running.join().unwrap().unwrap_err();
        assert!(matches!(err, Error::Timeout { rank: 2, .. }), "{err}");
        assert!(started.elapsed() >= timeout);
        // The first error stays, whatever comes after.
        assert_eq!(comm.health(), Err(err.clone()));
        let mut more = vec![vec![0u32; 4]; world];
        assert!(matches!(
            comm.all_reduce_in_place(&mut more, ReduceOp::Max),
            Err(Error::CommunicatorFailed(_))
        ));
        assert_eq!(comm.health(), Err(err));
    });
}
