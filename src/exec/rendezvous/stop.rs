//! What ends a rendezvous's waits before their deadline: a join's id given up by this process
//! ([`UniqueId::give_up`], for the join of a communicator still being made), or a rendezvous's
//! own stop flag ([`super::Rendezvous::stopper`], set by an abort of the communicator built on
//! it). Every wait loop of the rendezvous looks at one of them at least every 100 ms.

use super::UniqueId;
use crate::error::{Error, Result};

/// The nonces of the ids whose joins this process gave up ([`UniqueId::give_up`]).
static GIVEN_UP: std::sync::Mutex<Vec<u128>> = std::sync::Mutex::new(Vec::new());

/// What ends a wait of the rendezvous: the join's id given up, or (after the join) the
/// rendezvous's own stop.
#[derive(Clone, Copy)]
pub(super) enum Stop<'a> {
    Join(u128),
    Exchange(&'a std::sync::atomic::AtomicBool),
}

impl Stop<'_> {
    /// [`Error::Closed`] once the wait is to end.
    pub(super) fn check(self) -> Result<()> {
        let stopped = match self {
            Stop::Join(nonce) => GIVEN_UP
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&nonce),
            Stop::Exchange(stop) => stop.load(std::sync::atomic::Ordering::Acquire),
        };
        match stopped {
            true => Err(Error::Closed),
            false => Ok(()),
        }
    }
}

impl UniqueId {
    /// Gives up every join of this id in this process, from any thread: each wait ends within
    /// 100 ms with [`Error::Closed`], and a later join at once (NCCL's `ncclCommAbort`, which
    /// must release every wait, of a communicator still being made). For good, so only for an
    /// id that this process will not join again: one from [`UniqueId::new`] is never made
    /// twice; one from the launcher's variables ([`LaunchEnv::unique_id`]) is.
    pub fn give_up(&self) {
        let mut all = GIVEN_UP.lock().unwrap_or_else(|p| p.into_inner());
        if !all.contains(&self.nonce) {
            all.push(self.nonce);
        }
    }
}
