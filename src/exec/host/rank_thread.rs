//! The host executor's rank threads: for each call, a rank's thread enqueues its program onto
//! its streams — the Send, Recv and Reduce workers (module `host_streams`), and its own list for the
//! Main stream — then runs the Main stream itself; [`command`] is what each instruction becomes
//! for a stream worker, with CUDA's event semantics.
//!
//! Invariant: a rank thread enqueues all of a call before it runs that call's Main stream, so
//! running Main on the rank thread cannot deadlock (`host_rank_thread` says why).

use super::host_streams::{stream_worker, Stream};
use super::{Cmd, HostCall, HostEvent};
use crate::error::{Error, Result};
use crate::exec::{enqueue_rank, panic_message, spin_recv, Enqueue, Handoff, Limits};
use crate::plan::{Instr, Op, StreamKind};
use crossbeam_channel::{Receiver, Sender};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

/// A rank's thread: for each call, enqueue the rank's program onto its streams — the Send, Recv
/// and Reduce workers, and its own list for the Main stream — then run the Main stream itself.
///
/// Why running Main here cannot deadlock: a rank's enqueue of a call waits only for other
/// ranks' enqueues of the same call (the handoffs; the checker proves they never cycle), and
/// every rank enqueues all of a call before it runs that call's Main stream, whose commands
/// wait only for work of that call or earlier ones, all enqueued by then.
pub(super) fn host_rank_thread(mut handoff: Handoff, calls: Receiver<Arc<HostCall>>) {
    let rank = handoff.rank;
    let workers = stream_workers(rank, false).expect("spawning a stream worker thread");
    let mut main = Stream::new(rank, StreamKind::Main);
    while let Some(call) = spin_recv(&calls) {
        // Only the streams the rank's program uses take part in the call (a thread woken for
        // nothing is what makes small calls slow on few cores).
        let used = call.prepared.plan.streams(rank);
        let taking_part = || {
            workers
                .iter()
                .zip(StreamKind::ALL)
                .filter(|(_, s)| used.contains(s))
                .filter_map(|(worker, _)| worker.as_ref().map(|(tx, _)| tx))
        };
        for tx in taking_part() {
            let _ = tx.send(Cmd::Begin(call.clone()));
        }
        let mut backend = HostEnqueue {
            call: &call,
            workers: &workers,
            main: Vec::new(),
        };
        let result = catch_unwind(AssertUnwindSafe(|| {
            enqueue_rank(
                &call.prepared.plan,
                &call.prepared.waiters,
                call.id,
                &mut handoff,
                &mut backend,
                Limits {
                    deadline: call.deadline,
                    timeout: call.timeout,
                    abort: &call.abort,
                },
            )
        }));
        match result {
            Ok(Ok(())) => {}
            Ok(Err(err)) => call.fail(err),
            Err(payload) => call.fail(Error::RankFailed {
                rank,
                during: "enqueue".into(),
                message: panic_message(&*payload),
            }),
        }
        for tx in taking_part() {
            let _ = tx.send(Cmd::End);
        }
        call.done.report((rank, None));
        if used.contains(&StreamKind::Main) {
            main.run(Cmd::Begin(call.clone()));
            for cmd in backend.main {
                main.run(cmd);
            }
            main.run(Cmd::End);
        }
    }
    for (tx, handle) in workers.into_iter().flatten() {
        drop(tx);
        let _ = handle.join();
    }
}

/// A worker thread for each stream of rank `rank`, by [`StreamKind::index`], with the channel
/// that feeds it — but `None` for Main unless `main_worker` (a rank thread runs its Main stream
/// itself; a rank of its own process, whose calls return before they run, does not).
pub(super) fn stream_workers(rank: usize, main_worker: bool) -> Result<Vec<Option<Worker>>> {
    StreamKind::ALL
        .iter()
        .map(|&stream| {
            if stream == StreamKind::Main && !main_worker {
                return Ok(None);
            }
            let (tx, rx) = crossbeam_channel::unbounded();
            let handle = std::thread::Builder::new()
                .name(format!("ringreduce-rank-{rank}-{stream:?}"))
                .spawn(move || stream_worker(rank, stream, rx))
                .map_err(|e| Error::Resource {
                    what: format!("cannot start a stream worker: {e}"),
                })?;
            Ok(Some((tx, handle)))
        })
        .collect()
}

/// A stream worker thread and the channel that feeds it.
pub(super) type Worker = (Sender<Cmd>, JoinHandle<()>);

/// The rank thread's view of its streams while enqueuing one call: the workers, and the Main
/// stream's commands, which the rank thread runs once the call is enqueued.
struct HostEnqueue<'a> {
    call: &'a HostCall,
    workers: &'a [Option<Worker>],
    main: Vec<Cmd>,
}

impl Enqueue for HostEnqueue<'_> {
    fn enqueue(&mut self, index: usize, instr: &Instr) -> Result<()> {
        let Some(cmd) = command(&self.call.prepared.events, index, instr) else {
            return Ok(());
        };
        match &self.workers[instr.stream.index()] {
            Some((tx, _)) => tx.send(cmd).map_err(|_| Error::Closed),
            None => {
                self.main.push(cmd);
                Ok(())
            }
        }
    }
}

/// What a stream worker is told to do for instruction `index`, with CUDA's event semantics:
/// a record takes the event's next generation; a wait captures the latest one enqueued, and a
/// wait on an event never recorded does nothing (`None`).
pub(super) fn command(events: &[HostEvent], index: usize, instr: &Instr) -> Option<Cmd> {
    Some(match instr.op {
        Op::Record(e) => Cmd::Record {
            event: e.0,
            generation: events[e.0].enqueued.fetch_add(1, Ordering::AcqRel) + 1,
        },
        Op::Wait(e) => match events[e.0].enqueued.load(Ordering::Acquire) {
            0 => return None,
            target => Cmd::Wait {
                event: e.0,
                target,
                index,
            },
        },
        _ => Cmd::Run { index },
    })
}
