//! Soak and concurrency: many thousands of random collectives, every result checked exactly, and
//! no thread or memory left behind.
//!
//! - `ten_thousand_random_collectives`: a communicator for every world 1..=8, transport (peer and
//!   staged edges) and algorithm (ring, one-shot, two-shot — peer edges only — and Auto), with
//!   chunks of 16 to 1000 elements, some shaking the schedule with random delays, is created up
//!   front, then 10 000 calls pick one
//!   at random with a random length (mostly tiny, some up to ~5000), element type, operator, and
//!   in or out of place. The Auto communicators fall on staged edges, where these lengths lie
//!   below the staged one-shot's limit
//!   (`ringreduce::exec::algorithm::STAGED_ONESHOT_AUTO_MAX_BYTES`), so Auto runs the staged
//!   one-shot here; `auto_picks_by_edges_and_size` and
//!   `auto_over_staged_edges_takes_the_staged_oneshot_for_small_messages` in tests/host.rs cover
//!   Auto's choices and the switch to the ring. The test asserts what ran (`last_ran`): every
//!   algorithm over every reach it can run on, at every world from 2.
//! - several communicators driven from several threads at once, and one communicator shared by
//!   several threads (`Communicator` is `Sync`; its calls serialize);
//! - creating and dropping a communicator 1000 times leaves the process's resident memory and its
//!   threads where they started.
//!
//! Inputs depend on rank and index and reduce exactly (`ringreduce::verify`), so each check is
//! bitwise; a failure names the call (its number, communicator, shape) and the first mismatches.

mod common;
use common::{settle_threads, Rng};
use half::{bf16, f16};
use ringreduce::verify::{compare, make_expected, make_input};
use ringreduce::{Algorithm, Communicator, EdgeTransport, Element, HostConfig, ReduceOp};
use std::sync::Mutex;
use std::time::Instant;

/// Serializes the tests of this file: the leak test counts threads and memory of the process.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Mostly tiny lengths (where per-call overheads and empty segments live), some medium, a few
/// up to ~5000 elements.
fn random_count(rng: &mut Rng, max: usize) -> usize {
    let count = match rng.range(0, 99) {
        0..=69 => rng.range(0, 40),
        70..=94 => rng.range(41, 700),
        _ => rng.range(701, 5000),
    };
    count.min(max)
}

/// Runs one all-reduce on `comm` and checks every output element (and, out of place, that the
/// inputs are unchanged). `what` names the call in a failure.
fn checked_call<T: Element>(
    comm: &Communicator,
    count: usize,
    op: ReduceOp,
    in_place: bool,
    what: &dyn Fn() -> String,
) {
    let world = comm.world();
    let inputs: Vec<Vec<T>> = (0..world).map(|r| make_input(op, r, count)).collect();
    let outputs = if in_place {
        let mut bufs = inputs.clone();
        comm.all_reduce_in_place(&mut bufs, op)
            .unwrap_or_else(|e| panic!("{}: {e}", what()));
        bufs
    } else {
        let mut outs = vec![vec![T::from_i64(77); count]; world];
        comm.all_reduce(&inputs, &mut outs, op)
            .unwrap_or_else(|e| panic!("{}: {e}", what()));
        for (rank, input) in inputs.iter().enumerate() {
            assert!(
                input == &make_input::<T>(op, rank, count),
                "{}: rank {rank}'s input changed",
                what()
            );
        }
        outs
    };
    let want = make_expected::<T>(op, world, count);
    for (rank, out) in outputs.iter().enumerate() {
        let (wrong, first) = compare(rank, out, &want, 4);
        if wrong > 0 {
            let first: Vec<String> = first.iter().map(|m| m.to_string()).collect();
            panic!("{}: {wrong} wrong, first {}", what(), first.join(" "));
        }
    }
}

/// One random call of a random element type.
fn random_call(
    comm: &Communicator,
    rng: &mut Rng,
    max_count: usize,
    what: &dyn Fn() -> String,
) -> usize {
    let count = random_count(rng, max_count);
    let op = rng.pick(&ReduceOp::ALL);
    let in_place = rng.next() % 2 == 0;
    let dtype = rng.range(0, 9);
    let what = || {
        format!(
            "{}, type #{dtype} {op} count {count} in_place {in_place}",
            what()
        )
    };
    match dtype {
        // The five the soak must cover get two slots each out of 10.
        0 | 1 => checked_call::<f32>(comm, count, op, in_place, &what),
        2 => checked_call::<i32>(comm, count, op, in_place, &what),
        3 => checked_call::<u8>(comm, count, op, in_place, &what),
        4 => checked_call::<f64>(comm, count, op, in_place, &what),
        5 => checked_call::<bf16>(comm, count, op, in_place, &what),
        6 => checked_call::<f16>(comm, count, op, in_place, &what),
        7 => checked_call::<i8>(comm, count, op, in_place, &what),
        8 => checked_call::<u64>(comm, count, op, in_place, &what),
        _ => checked_call::<u32>(comm, count, op, in_place, &what),
    }
    count
}

/// A communicator of the soak, with the most elements a call on it may have (communicators
/// that shake the schedule get short calls, so that their delays stay affordable).
struct Soaked {
    comm: Communicator,
    config: HostConfig,
    max_count: usize,
}

/// Every algorithm × transport × world 1..=8 (but the two-shot over staged edges, which reads its
/// peers' buffers and is refused there): 56 communicators.
fn soaked_communicators() -> Vec<Soaked> {
    let mut rng = Rng(0x50a6);
    let mut all = Vec::new();
    for world in 1..=8 {
        for transport in [EdgeTransport::Peer, EdgeTransport::Staged] {
            for algorithm in [
                Algorithm::Ring,
                Algorithm::OneShot,
                Algorithm::TwoShot,
                Algorithm::Auto,
            ] {
                if algorithm == Algorithm::TwoShot && transport == EdgeTransport::Staged {
                    continue;
                }
                let delays = (world + all.len()) % 4 == 0;
                let config = HostConfig {
                    chunk_elems: rng.pick(&[16, 33, 128, 1000]),
                    slots: rng.range(1, 4),
                    transport: transport.into(),
                    delay_seed: delays.then_some(world as u64),
                    algorithm,
                    ..HostConfig::default()
                };
                let comm = Communicator::host_with(world, config.clone()).unwrap();
                let max_count = if delays { 200 } else { usize::MAX };
                all.push(Soaked {
                    comm,
                    config,
                    max_count,
                });
            }
        }
    }
    all
}

#[test]
fn ten_thousand_random_collectives() {
    let _serial = serial();
    let comms = soaked_communicators();
    let mut rng = Rng(2024);
    let start = Instant::now();
    let (mut calls, mut elements) = (0usize, 0usize);
    let mut per_world = [0usize; 9];
    let mut per_comm = vec![0usize; comms.len()];
    // What ran, as each call says: (world, algorithm, reach).
    let mut ran = std::collections::BTreeSet::new();
    for call in 0..10_000 {
        let index = rng.range(0, comms.len() - 1);
        let Soaked {
            comm,
            config,
            max_count,
        } = &comms[index];
        let what = || {
            format!(
                "call {call} on communicator {index} (world {}, {config:?})",
                comm.world()
            )
        };
        elements += random_call(comm, &mut rng, *max_count, &what);
        let last = comm
            .last_ran()
            .unwrap_or_else(|| panic!("{}: nothing ran", what()));
        let (algorithm, reach) = (format!("{:?}", last.algorithm), format!("{:?}", last.reach));
        ran.insert((comm.world(), algorithm, reach));
        calls += 1;
        per_world[comm.world()] += 1;
        per_comm[index] += 1;
    }
    // Every algorithm × transport × world the file names was soaked, not just created.
    assert_eq!(comms.len(), 8 * 7);
    assert!(
        per_comm.iter().all(|&n| n >= 50),
        "every communicator is soaked: {per_comm:?}"
    );
    // And each algorithm ran over each reach it can (the two-shot reads its peers' buffers: not
    // over staged edges) at every world from 2, as the executors say — not only was asked for.
    for world in 2..=8 {
        for (algorithm, reach) in [
            ("Ring", "Host"),
            ("Ring", "HostStaged"),
            ("OneShot", "Host"),
            ("OneShot", "HostStaged"),
            ("TwoShot", "Host"),
        ] {
            let key = (world, algorithm.to_string(), reach.to_string());
            assert!(
                ran.contains(&key),
                "world {world}: the {algorithm} never ran over {reach}: {ran:?}"
            );
        }
    }
    for Soaked { comm, .. } in comms {
        comm.close().unwrap();
    }
    println!("{calls} collectives ({elements} elements per rank in all) in {:?}; calls per world 1..=8: {:?}", start.elapsed(), &per_world[1..]);
    assert_eq!(calls, 10_000);
    assert!(
        per_world[1..].iter().all(|&n| n > 500),
        "every world is soaked"
    );
}

#[test]
fn four_threads_each_with_its_own_communicator() {
    let _serial = serial();
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..4usize {
            s.spawn(move || {
                let transport = if t % 2 == 0 {
                    EdgeTransport::Peer
                } else {
                    EdgeTransport::Staged
                };
                let config = HostConfig {
                    algorithm: ringreduce::Algorithm::Ring,
                    chunk_elems: 16 << t,
                    transport: transport.into(),
                    ..HostConfig::default()
                };
                let comm = Communicator::host_with(2 + t, config).unwrap();
                let mut rng = Rng(100 + t as u64);
                for call in 0..500 {
                    random_call(&comm, &mut rng, 1000, &|| format!("thread {t} call {call}"));
                }
                comm.close().unwrap();
            });
        }
    });
    println!(
        "4 threads × 500 calls on their own communicators in {:?}",
        start.elapsed()
    );
}

#[test]
fn one_communicator_shared_by_four_threads() {
    let _serial = serial();
    // Calls from several threads serialize on the communicator. Two calls of one shape share the
    // prepared plan, its events and its staging slots, so calls that overlapped would corrupt
    // each other's results; every thread uses the same few shapes to make that likely.
    let config = HostConfig {
        algorithm: ringreduce::Algorithm::Ring,
        chunk_elems: 5,
        slots: 2,
        transport: EdgeTransport::Staged.into(),
        delay_seed: Some(9),
        ..HostConfig::default()
    };
    let comm = Communicator::host_with(4, config).unwrap();
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..4usize {
            let comm = &comm;
            s.spawn(move || {
                let mut rng = Rng(200 + t as u64);
                for call in 0..150 {
                    let count = rng.pick(&[0, 3, 37, 120]);
                    let op = rng.pick(&ReduceOp::ALL);
                    let in_place = rng.next() % 2 == 0;
                    let what = || {
                        format!("thread {t} call {call}: {op} count {count} in_place {in_place}")
                    };
                    if rng.next() % 2 == 0 {
                        checked_call::<f32>(comm, count, op, in_place, &what);
                    } else {
                        checked_call::<i32>(comm, count, op, in_place, &what);
                    }
                }
            });
        }
    });
    println!(
        "4 threads × 150 calls on one communicator in {:?}",
        start.elapsed()
    );
    comm.close().unwrap();
}

/// Resident memory of this process in KiB (`VmRSS`, the resident field of /proc/self/statm in
/// KiB rather than pages) and its number of threads.
fn rss_kib_and_threads() -> (usize, usize) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| -> usize {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        line[name.len()..]
            .trim()
            .trim_end_matches(" kB")
            .trim()
            .parse()
            .unwrap()
    };
    (field("VmRSS:"), field("Threads:"))
}

#[test]
fn a_thousand_communicators_leak_nothing() {
    let _serial = serial();
    // 4 ranks × 4 staging slots of 256 f32, all of them written by a call of 4 Ki elements:
    // 16 KiB of staging and 20 threads per communicator.
    let cycle = |i: usize| {
        let comm = Communicator::host_with(
            4,
            HostConfig {
                algorithm: ringreduce::Algorithm::Ring,
                chunk_elems: 256,
                slots: 4,
                ..HostConfig::default()
            },
        )
        .unwrap();
        let what = || format!("communicator {i}");
        checked_call::<f32>(&comm, (4 << 10) + i % 7, ReduceOp::Sum, i % 2 == 0, &what);
        drop(comm);
    };
    for i in 0..20 {
        cycle(i);
    }
    assert_eq!(
        settle_threads(),
        0,
        "threads left by the warm-up or an earlier test"
    );
    let (rss_before, threads_before) = rss_kib_and_threads();
    let start = Instant::now();
    for i in 0..1000 {
        cycle(i);
    }
    let elapsed = start.elapsed();
    let left = settle_threads();
    let (rss_after, threads_after) = rss_kib_and_threads();
    println!(
        "1000 communicators created, used and dropped in {elapsed:?}: RSS {rss_before} KiB before, {rss_after} KiB after; \
         threads {threads_before} before, {threads_after} after ({left} ringreduce threads left)"
    );
    assert_eq!(left, 0, "dropped communicators left threads running");
    // Other tests of this binary wait on `SERIAL`, so only the harness's threads may come and go.
    assert!(
        threads_after <= threads_before + 2,
        "threads grew from {threads_before} to {threads_after}"
    );
    // A communicator's staging alone, leaked 1000 times, is 16 MiB; its thread stacks more. Allow
    // a few MiB of allocator noise.
    assert!(
        rss_after <= rss_before + 4 * 1024,
        "resident memory grew from {rss_before} KiB to {rss_after} KiB"
    );
}
