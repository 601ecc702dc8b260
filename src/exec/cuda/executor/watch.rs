//! Watching for a lost peer — a rank of another process that is gone, or that failed a call:
//! [`PeerWatch`], which a rank waiting for its call asks every few milliseconds
//! (`enqueue::wait_done`, teardown's `wait_idle`), and [`Watcher`], a thread of every
//! communicator with peers in other processes that asks it between the calls too. A kernel whose
//! peer is gone waits at its call gate or barrier until its deadline — under NCCL's API none by
//! default — unless its rank's error word is set: the watcher sets it, so the kernel returns even
//! when nobody calls into the library (a C program that only synchronizes its stream), and the
//! next call, `synchronize` or health check names the lost peer.

use super::error_words::{kernel_failure, KernelFailure};
use super::rank::RankRes;
use crate::error::{Error, Result};
use crate::exec::cuda::fabric::Fabric;
use crate::exec::cuda::kernels::ERR_PEER_LOST;
use crossbeam_channel::{RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often a rank waiting for its call asks the fabric whether a peer is lost.
pub(super) const WATCH_EVERY: Duration = Duration::from_millis(5);

/// How long a rank waiting for its call lets its GPU go on once a peer is lost, before it gives
/// the call up: a peer that failed a call because its calls differ from this rank's (its host
/// or call gate found the mismatch first) has set its abort word by then, and this rank's own
/// call gate names the mismatch (`cuda/gate.cuh` compares before it looks at aborts) within
/// microseconds — rather than the give-up's "peer lost".
const LOST_GRACE: Duration = Duration::from_millis(50);

/// A waiting rank's watch for a lost peer ([`WATCH_EVERY`], [`LOST_GRACE`]).
pub(super) struct PeerWatch {
    next: Instant,
    lost_since: Option<Instant>,
}

impl PeerWatch {
    pub(super) fn new(now: Instant) -> PeerWatch {
        PeerWatch {
            next: now + WATCH_EVERY,
            lost_since: None,
        }
    }

    /// Whether the waiting rank gives its call up now: a peer has been lost (asked every
    /// [`WATCH_EVERY`]) for [`LOST_GRACE`].
    pub(super) fn gives_up(&mut self, fabric: &dyn Fabric, now: Instant) -> bool {
        if now < self.next {
            return false;
        }
        self.next = now + WATCH_EVERY;
        match (self.lost_since, fabric.lost_peer().is_some()) {
            (_, false) => false,
            (None, true) => {
                self.lost_since = Some(now);
                false
            }
            (Some(since), true) => now - since >= LOST_GRACE,
        }
    }
}

/// A communicator's watcher thread (module doc): every [`WATCH_EVERY`] it asks the fabric for a
/// lost peer, and once one has been lost for [`LOST_GRACE`] it gives every rank of this process
/// up (`RankRes::give_up`, [`ERR_PEER_LOST`]) and ends. It also tells the peers, once, of a
/// receive that the point-to-point channel found different from its send
/// (`CH_ERR_MISMATCH_BIT` in a rank's error word: only the receiving rank sees it), so that the
/// sender's kernel, which may wait for that receive to take its chunks, gives up too. Stopped and
/// joined when dropped (within one [`WATCH_EVERY`]); it never panics.
pub(super) struct Watcher {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    /// Starts watching `fabric` for the ranks `ranks` (this process's).
    pub(super) fn start(fabric: Arc<dyn Fabric>, ranks: Vec<Arc<RankRes>>) -> Result<Watcher> {
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        let thread = std::thread::Builder::new()
            .name("ringreduce-watch".into())
            .spawn(move || {
                let mut watch = PeerWatch::new(Instant::now());
                let mut told = false;
                // Nothing is ever sent: the sender's drop (`Disconnected`) is the stop.
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(WATCH_EVERY) {
                    if !told {
                        told = tell_channel_mismatch(&*fabric, &ranks);
                    }
                    if watch.gives_up(&*fabric, Instant::now()) {
                        for res in &ranks {
                            res.give_up(ERR_PEER_LOST);
                        }
                        return;
                    }
                }
            })
            .map_err(|e| Error::Resource {
                what: format!("cannot start the peer watcher thread: {e}"),
            })?;
        Ok(Watcher {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

/// Tells the peers (`Fabric::fail`) of a channel receive that a rank of `ranks` found different
/// from its send; whether there was one.
fn tell_channel_mismatch(fabric: &dyn Fabric, ranks: &[Arc<RankRes>]) -> bool {
    let Some((rank, peer)) = ranks
        .iter()
        .find_map(|r| match kernel_failure(r.error_code()) {
            Some(KernelFailure::ChannelMismatch { peer }) => Some((r.rank, peer)),
            _ => None,
        })
    else {
        return false;
    };
    fabric.fail(&Error::CallMismatch {
        rank: peer,
        theirs: "a send to this rank of another size or type".into(),
        this: rank,
        ours: "the receive the channel matched with it".into(),
    });
    true
}

impl Drop for Watcher {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
