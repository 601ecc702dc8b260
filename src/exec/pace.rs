//! How a host thread waits for something another thread, process or GPU will do: the one
//! helper every polling loop rests with ([`Pace::rest`]), and each loop's pace by name. A loop
//! spins first (the core stays busy, and notices within nanoseconds: what it waits for is
//! usually microseconds away), then yields its core (so that a thread it waits for can run on
//! it), then sleeps — a thread put to sleep takes tens of microseconds to wake on a virtual
//! machine's cores, so sleeping comes last, for waits that are long already.
//!
//! Invariant: a pace's tiers are in order (`spin <= yield_until`, `sleep_min <= sleep_max`).

use std::time::Duration;

/// When a polling loop spins, yields and sleeps, by how long it has waited so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pace {
    /// Spin while the wait is shorter than this.
    pub(crate) spin: Duration,
    /// Then yield the core while the wait is shorter than this.
    pub(crate) yield_until: Duration,
    /// Then sleep a 64th of the wait so far, within these bounds.
    pub(crate) sleep_min: Duration,
    pub(crate) sleep_max: Duration,
}

impl Pace {
    /// Rests once, as this pace says for a wait of `waited` so far.
    pub(crate) fn rest(&self, waited: Duration) {
        if waited < self.spin {
            std::hint::spin_loop();
        } else if waited < self.yield_until {
            std::thread::yield_now();
        } else {
            std::thread::sleep((waited / 64).clamp(self.sleep_min, self.sleep_max));
        }
    }
}

/// Waiting for the ranks of a job across processes (a peer's published call, its meeting, its
/// host executor's records): 50 µs of spinning, yields up to 2 ms, then sleeps from 200 µs up
/// to a millisecond.
pub(crate) const PEERS: Pace = Pace {
    spin: Duration::from_micros(50),
    yield_until: Duration::from_millis(2),
    sleep_min: Duration::from_micros(200),
    sleep_max: Duration::from_millis(1),
};

/// Waiting for a GPU call's completion event (`wait_done`): small messages finish in tens of
/// µs (200 µs of spinning), a 1 GiB call in ~3 ms (yields up to 20 ms: a sleep's timer slack,
/// ~50 µs, would land on the call's time), then 20 µs sleeps.
pub(crate) const COMPLETION: Pace = Pace {
    spin: Duration::from_micros(200),
    yield_until: Duration::from_millis(20),
    sleep_min: Duration::from_micros(20),
    sleep_max: Duration::from_micros(20),
};

/// Waiting for streams to drain after a failure or at teardown: 200 µs of spinning, then 50 µs
/// sleeps (nothing to hurry: the call has failed, or the communicator is going).
pub(crate) const DRAIN: Pace = Pace {
    spin: Duration::from_micros(200),
    yield_until: Duration::from_micros(200),
    sleep_min: Duration::from_micros(50),
    sleep_max: Duration::from_micros(50),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pace_has_its_tiers_in_order() {
        for pace in [PEERS, COMPLETION, DRAIN] {
            assert!(pace.spin <= pace.yield_until, "{pace:?}");
            assert!(pace.sleep_min <= pace.sleep_max, "{pace:?}");
        }
    }
}
