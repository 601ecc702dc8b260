//! The rendezvous between threads standing in for processes, over TCP on 127.0.0.1: every rank
//! gets the same records or the same named error, within its timeout.

use super::*;
use std::collections::HashMap;
use std::thread;

const QUICK: Duration = Duration::from_secs(5);

/// Joins `world` ranks of `id` on threads, rank r with `world_of(r)`, `fingerprint_of(r)`, and
/// (for the ranks that join) all-gathers `[r, 10 r]`; each rank's outcome, by rank.
fn join_all(
    id: UniqueId,
    ranks: &[usize],
    world_of: impl Fn(usize) -> usize,
    fingerprint_of: impl Fn(usize) -> u64,
    timeout: Duration,
) -> Vec<Result<Vec<Vec<u64>>>> {
    let handles: Vec<_> = ranks
        .iter()
        .map(|&r| {
            let (world, fp) = (world_of(r), fingerprint_of(r));
            thread::spawn(move || {
                let mut rv = Rendezvous::join(&id, r, world, fp, timeout)?;
                rv.all_gather(&[r as u64, 10 * r as u64])
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn local_id() -> UniqueId {
    UniqueId::new("127.0.0.1:0").unwrap()
}

#[test]
fn every_rank_gets_every_record_in_rank_order() {
    let outcomes = join_all(local_id(), &[0, 1, 2, 3], |_| 4, |_| 7, QUICK);
    let want: Vec<Vec<u64>> = (0..4u64).map(|r| vec![r, 10 * r]).collect();
    for (r, got) in outcomes.into_iter().enumerate() {
        assert_eq!(got.unwrap(), want, "rank {r}");
    }
}

#[test]
fn records_of_any_length_and_several_rounds_arrive_whole() {
    let id = local_id();
    let handles: Vec<_> = (0..3usize)
        .map(|r| {
            thread::spawn(move || {
                let mut rv = Rendezvous::join(&id, r, 3, 1, QUICK).unwrap();
                let mut rounds = Vec::new();
                for round in 0..3u64 {
                    let record: Vec<u64> = (0..(r as u64 + round) * 1000).collect();
                    rounds.push(rv.all_gather(&record).unwrap());
                    rv.barrier().unwrap();
                }
                rounds
            })
        })
        .collect();
    for h in handles {
        let rounds = h.join().unwrap();
        for (round, records) in rounds.iter().enumerate() {
            for (r, record) in records.iter().enumerate() {
                assert_eq!(record.len(), (r + round) * 1000);
                assert!(record.iter().enumerate().all(|(i, &w)| w == i as u64));
            }
        }
    }
}

#[test]
fn a_world_size_mismatch_is_the_same_named_error_on_every_rank() {
    let outcomes = join_all(
        local_id(),
        &[0, 1, 2],
        |r| if r == 2 { 4 } else { 3 },
        |_| 0,
        QUICK,
    );
    for (r, got) in outcomes.into_iter().enumerate() {
        match got {
            Err(Error::WorldSizeMismatch {
                rank: 2,
                said: 4,
                expected: 3,
            }) => {}
            other => panic!("rank {r}: {other:?}"),
        }
    }
}

#[test]
fn a_configuration_mismatch_names_the_rank() {
    let outcomes = join_all(
        local_id(),
        &[0, 1, 2],
        |_| 3,
        |r| if r == 1 { 99 } else { 5 },
        QUICK,
    );
    for (r, got) in outcomes.into_iter().enumerate() {
        assert!(
            matches!(got, Err(Error::ConfigMismatch { rank: 1 })),
            "rank {r}: {got:?}"
        );
    }
}

#[test]
fn two_processes_claiming_one_rank_are_refused() {
    // Ranks 0, 1, 1: rank 2 never comes, and the duplicate is what every rank hears.
    let outcomes = join_all(local_id(), &[0, 1, 1], |_| 3, |_| 0, Duration::from_secs(2));
    for (i, got) in outcomes.into_iter().enumerate() {
        assert!(
            matches!(got, Err(Error::DuplicateRank { rank: 1 })),
            "joiner {i}: {got:?}"
        );
    }
}

#[test]
fn ranks_that_never_arrive_are_named_within_the_timeout() {
    let timeout = Duration::from_millis(800);
    let start = Instant::now();
    let outcomes = join_all(local_id(), &[0, 2], |_| 4, |_| 0, timeout);
    assert!(start.elapsed() < timeout * 3, "{:?}", start.elapsed());
    for got in outcomes {
        match got {
            Err(Error::RanksMissing { missing, after }) => {
                assert_eq!(missing, [1, 3]);
                assert_eq!(after, timeout);
            }
            other => panic!("{other:?}"),
        }
    }
    // Rank 0 never comes: the others name it.
    let id = local_id();
    listeners().lock().unwrap().remove(&id.nonce); // nobody listens at the id's port now
    let outcomes = join_all(id, &[1], |_| 2, |_| 0, timeout);
    assert!(
        matches!(&outcomes[0], Err(Error::RanksMissing { missing, .. }) if missing == &[0]),
        "{:?}",
        outcomes[0]
    );
}

#[test]
fn a_stranger_on_the_port_is_ignored() {
    let id = local_id();
    // Connects first and sends garbage, then another id's hello: both dropped.
    let mut junk = TcpStream::connect(id.addr).unwrap();
    junk.write_all(&[1, 2, 3, 4, 5, 6, 7, 8, 9]).unwrap();
    let other = UniqueId {
        nonce: id.nonce ^ 1,
        ..id
    };
    let mut stale = TcpStream::connect(id.addr).unwrap();
    write_words(
        &mut stale,
        &[
            MAGIC,
            VERSION,
            other.nonce as u64,
            (other.nonce >> 64) as u64,
            1,
            2,
            0,
        ],
    )
    .unwrap();
    let outcomes = join_all(id, &[0, 1], |_| 2, |_| 0, QUICK);
    for got in outcomes {
        assert_eq!(got.unwrap(), vec![vec![0, 0], vec![1, 10]]);
    }
    drop((junk, stale));
}

#[test]
fn a_peer_that_is_gone_is_named_not_waited_for() {
    let id = local_id();
    let leaver = thread::spawn(move || {
        let rv = Rendezvous::join(&id, 1, 3, 0, QUICK).unwrap();
        drop(rv); // the process "exits" before the all-gather
    });
    let stayer = thread::spawn(move || {
        let mut rv = Rendezvous::join(&id, 2, 3, 0, QUICK).unwrap();
        rv.all_gather(&[2])
    });
    let mut host = Rendezvous::join(&id, 0, 3, 0, QUICK).unwrap();
    leaver.join().unwrap();
    let start = Instant::now();
    let got = host.all_gather(&[0]);
    assert!(start.elapsed() < QUICK, "{:?}", start.elapsed());
    assert!(
        matches!(got, Err(Error::RankFailed { rank: 1, .. })),
        "{got:?}"
    );
    drop(host);
    // Rank 0 told rank 2 which rank it lost before giving up: rank 2 names rank 1 too.
    let got = stayer.join().unwrap();
    assert!(
        matches!(got, Err(Error::RankFailed { rank: 1, .. })),
        "{got:?}"
    );
}

#[test]
fn a_rank_that_gave_up_for_a_lost_peer_gets_the_peer_named_not_itself() {
    // Ranks 0..4: rank 3 dies; rank 1 lost it (elsewhere) and gives up naming it; ranks 0 and
    // 2 then meet and must both name rank 3 — not rank 1, whose connection closed first.
    let id = local_id();
    let dead = thread::spawn(move || drop(Rendezvous::join(&id, 3, 4, 0, QUICK).unwrap()));
    let gave_up = thread::spawn(move || {
        let mut rv = Rendezvous::join(&id, 1, 4, 0, QUICK).unwrap();
        rv.abandon_naming(3);
    });
    let stayer = thread::spawn(move || {
        let mut rv = Rendezvous::join(&id, 2, 4, 0, QUICK).unwrap();
        rv.all_gather(&[2])
    });
    let mut host = Rendezvous::join(&id, 0, 4, 0, QUICK).unwrap();
    dead.join().unwrap();
    gave_up.join().unwrap();
    let got = host.all_gather(&[0]);
    assert!(
        matches!(&got, Err(Error::RankFailed { rank: 3, message, .. }) if message.contains("rank 1")),
        "{got:?}"
    );
    drop(host);
    let got = stayer.join().unwrap();
    assert!(
        matches!(got, Err(Error::RankFailed { rank: 3, .. })),
        "{got:?}"
    );
}

#[test]
fn the_id_survives_bytes_and_text() {
    for id in [
        local_id(),
        UniqueId::new("[::1]:0").unwrap_or_else(|_| local_id()),
    ] {
        let bytes = id.to_bytes();
        assert_eq!(bytes.len(), UNIQUE_ID_BYTES);
        assert_eq!(UniqueId::from_bytes(&bytes).unwrap(), id);
        let text = id.to_string();
        assert!(text.starts_with("rr1-"), "{text}");
        assert_eq!(text.parse::<UniqueId>().unwrap(), id);
    }
    assert!(UniqueId::from_bytes(&[0; UNIQUE_ID_BYTES]).is_err());
    assert!(UniqueId::from_bytes(&[0; 16]).is_err());
    assert!("rr1-zz".parse::<UniqueId>().is_err());
    assert!("hello".parse::<UniqueId>().is_err());
    assert!(Rendezvous::join(&local_id(), 3, 3, 0, QUICK).is_err());
}

fn torchrun_vars(rank: usize, world: usize, port: u16) -> HashMap<String, String> {
    [
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", world.to_string()),
        ("LOCAL_RANK", rank.to_string()),
        ("LOCAL_WORLD_SIZE", world.to_string()),
        ("MASTER_ADDR", "127.0.0.1".to_string()),
        ("MASTER_PORT", port.to_string()),
        ("TORCHELASTIC_RUN_ID", "job-7".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// A free port on 127.0.0.1 whose successor is free too (the rendezvous takes MASTER_PORT + 1).
fn free_port_pair() -> u16 {
    loop {
        let probe = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = probe.local_addr().unwrap().port();
        if port < u16::MAX && TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
}

#[test]
fn torchruns_variables_make_the_same_id_on_every_rank_and_they_meet() {
    let port = free_port_pair();
    let envs: Vec<LaunchEnv> = (0..3)
        .map(|r| {
            let vars = torchrun_vars(r, 3, port);
            LaunchEnv::from_vars(|k| vars.get(k).cloned()).unwrap()
        })
        .collect();
    assert_eq!(envs[1].port, port + 1);
    let ids: Vec<UniqueId> = envs.iter().map(|e| e.unique_id().unwrap()).collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    let handles: Vec<_> = envs
        .into_iter()
        .map(|env| thread::spawn(move || env.join(42, QUICK)?.all_gather(&[env.rank as u64])))
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap().unwrap(), vec![vec![0], vec![1], vec![2]]);
    }
    // Another run id on the same address is another job: another nonce.
    let mut vars = torchrun_vars(0, 3, port);
    vars.insert("TORCHELASTIC_RUN_ID".into(), "job-8".into());
    let other = LaunchEnv::from_vars(|k| vars.get(k).cloned()).unwrap();
    assert_ne!(other.unique_id().unwrap(), ids[0]);
}

#[test]
fn a_missing_or_bad_launcher_variable_is_named() {
    let complete = torchrun_vars(1, 4, 29500);
    for (name, value, needle) in [
        ("RANK", None, "RANK is not set"),
        ("WORLD_SIZE", Some("four"), "WORLD_SIZE=\"four\""),
        ("RANK", Some("4"), "RANK=4 of WORLD_SIZE=4"),
        (
            "MASTER_PORT",
            Some("70000"),
            "MASTER_PORT=70000 is not a TCP port",
        ),
        ("MASTER_ADDR", None, "MASTER_ADDR is not set"),
    ] {
        let mut vars = complete.clone();
        match value {
            Some(v) => vars.insert(name.to_string(), v.to_string()),
            None => vars.remove(name),
        };
        let err = LaunchEnv::from_vars(|k| vars.get(k).cloned()).unwrap_err();
        assert!(err.to_string().contains(needle), "{name}: {err}");
    }
    let mut vars = complete.clone();
    vars.insert("RINGREDUCE_PORT".into(), "31000".into());
    assert_eq!(
        LaunchEnv::from_vars(|k| vars.get(k).cloned()).unwrap().port,
        31000
    );
}

#[test]
fn a_rank_that_came_early_hears_the_missing_rank_not_rank_0() {
    // Rank 1 joins with a short timeout; rank 0 comes later, with a longer one, and waits for
    // rank 2, who never comes. Rank 1 waits as long as rank 0 says it will, and both name rank 2.
    let id = local_id();
    let early = thread::spawn(move || Rendezvous::join(&id, 1, 3, 0, Duration::from_millis(300)));
    thread::sleep(Duration::from_millis(200));
    let late = Rendezvous::join(&id, 0, 3, 0, Duration::from_millis(1500));
    let early = early.join().unwrap();
    for got in [early, late] {
        match got {
            Err(Error::RanksMissing { missing, .. }) => assert_eq!(missing, [2]),
            other => panic!("{other:?}"),
        }
    }
}

/// `stop` from another thread, once `wait` (on its own thread) says it is waiting, ends the
/// wait within a second with `Error::Closed`, though its timeout is a minute.
fn stopped_ends(
    stop: impl FnOnce(),
    wait: impl FnOnce(std::sync::mpsc::Sender<()>) -> Result<()> + Send + 'static,
) {
    let (waiting, started) = std::sync::mpsc::channel();
    let handle = thread::spawn(move || wait(waiting));
    started.recv_timeout(Duration::from_secs(10)).unwrap();
    thread::sleep(Duration::from_millis(200));
    let at = Instant::now();
    stop();
    let ended = handle.join().unwrap();
    assert!(matches!(ended, Err(Error::Closed)), "{ended:?}");
    assert!(at.elapsed() < Duration::from_secs(1), "{:?}", at.elapsed());
}

#[test]
fn giving_an_id_up_ends_every_wait_of_its_joins() {
    const LONG: Duration = Duration::from_secs(60);
    // Rank 0 waiting for a rank that never comes; a rank waiting for a rank 0 that never
    // listens.
    for rank in [0, 1] {
        let id = local_id();
        stopped_ends(
            move || id.give_up(),
            move |waiting| {
                waiting.send(()).unwrap();
                Rendezvous::join(&id, rank, 2, 0, LONG).map(drop)
            },
        );
    }
    // A later join of a given-up id ends at once.
    let id = local_id();
    id.give_up();
    let late = Rendezvous::join(&id, 0, 2, 0, LONG);
    assert!(matches!(late, Err(Error::Closed)), "{late:?}");
}

#[test]
fn a_stopped_rendezvous_ends_its_exchange_and_its_peers_learn_it_at_once() {
    const LONG: Duration = Duration::from_secs(60);
    // An exchange whose peer takes no part, on rank 0 and on another rank.
    for waiter in [0, 1] {
        let id = local_id();
        let peer = thread::spawn(move || Rendezvous::join(&id, 1 - waiter, 2, 0, LONG).unwrap());
        let mut rv = Rendezvous::join(&id, waiter, 2, 0, LONG).unwrap();
        let mut peer = peer.join().unwrap();
        let stop = rv.stopper();
        stopped_ends(
            move || stop.store(true, std::sync::atomic::Ordering::Release),
            move |waiting| {
                waiting.send(()).unwrap();
                rv.all_gather(&[1]).map(drop)
            },
        );
        // The stopped rank closed its connections: its peer's exchange fails at once (rank 0
        // may first finish the one a stopped rank 1 had sent its record to).
        let at = Instant::now();
        let failed = peer.all_gather(&[2]).is_err() || peer.all_gather(&[3]).is_err();
        assert!(failed, "rank {}", 1 - waiter);
        assert!(at.elapsed() < Duration::from_secs(5), "{:?}", at.elapsed());
    }
}
