//! The limits every communicator option is checked against, in one place, before any work:
//! a value outside them is refused with [`Error::InvalidConfig`] (or [`Error::NoRanks`],
//! [`Error::TooManyRanks`]) naming the option, so no option can panic, abort the process or
//! allocate without bound later. Both [`crate::HostConfig`] and [`crate::CudaConfig`] go through
//! these checks when a [`crate::Communicator`] is made.

use crate::check::MAX_SYMBOLIC_WORLD;
use crate::error::{Error, Result};
use crate::plan::EdgeTransport;
use std::time::Duration;

/// How a communicator's ring edges move data: the one transport option of both
/// [`crate::CudaConfig`] and [`crate::HostConfig`]. A plan names each edge's choice as an
/// [`EdgeTransport`]; this is what the caller asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Transport {
    /// Peer copies where the ranks can reach each other, pinned-host staging elsewhere. Host
    /// ranks always reach each other, so on the host this is `Peer`.
    #[default]
    Auto,
    /// Peer copies on every edge; an edge without peer access is an error (GPUs).
    Peer,
    /// Staging through pinned host memory on every edge (on the host executor: the staged
    /// plan's shape, run on the CPU — for tests, benchmarks and teaching).
    Staged,
}

impl Transport {
    /// The edge transport a host rank's edges get: `Staged` when asked for, else peer.
    pub fn on_host(self) -> EdgeTransport {
        match self {
            Transport::Staged => EdgeTransport::Staged,
            Transport::Auto | Transport::Peer => EdgeTransport::Peer,
        }
    }
}

impl From<EdgeTransport> for Transport {
    fn from(edge: EdgeTransport) -> Transport {
        match edge {
            EdgeTransport::Peer => Transport::Peer,
            EdgeTransport::Staged => Transport::Staged,
        }
    }
}

/// The most ranks a communicator may have: the checker proves plans symbolically for at most
/// this many ranks ([`crate::check::MAX_SYMBOLIC_WORLD`]), and no plan runs unproven.
pub const MAX_WORLD: usize = MAX_SYMBOLIC_WORLD;

/// The most staging slots per receiver. Each slot holds one chunk; more than a handful never
/// helped in the chunk × slots sweeps (2, 3 or 4 slots within 1%, docs/PERFORMANCE.md).
pub const MAX_SLOTS: usize = 64;

/// The longest timeout a collective may be given: one week. Deadlines are instants and kernel
/// deadlines nanosecond counts; within a week both are far from overflowing.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// The largest chunk, in bytes: more than any GPU's memory, small enough that a chunk's byte
/// count times the slots never overflows.
pub const MAX_CHUNK_BYTES: usize = 1 << 40;

fn invalid(field: &'static str, value: impl std::fmt::Debug, why: String) -> Error {
    Error::InvalidConfig {
        field,
        value: format!("{value:?}"),
        why,
    }
}

/// A world of `world` ranks can be made.
pub(crate) fn check_world(world: usize) -> Result<()> {
    if world == 0 {
        return Err(Error::NoRanks);
    }
    if world > MAX_WORLD {
        return Err(Error::TooManyRanks {
            world,
            max: MAX_WORLD,
        });
    }
    Ok(())
}

/// Staging slots per receiver: from 1 to [`MAX_SLOTS`].
pub(crate) fn check_slots(slots: usize) -> Result<()> {
    if !(1..=MAX_SLOTS).contains(&slots) {
        return Err(invalid(
            "slots",
            slots,
            format!("must be from 1 to {MAX_SLOTS}"),
        ));
    }
    Ok(())
}

/// A collective's timeout: more than zero, at most [`MAX_TIMEOUT`].
pub(crate) fn check_timeout(timeout: Duration) -> Result<()> {
    if timeout.is_zero() || timeout > MAX_TIMEOUT {
        return Err(invalid(
            "timeout",
            timeout,
            format!("must be more than zero and at most {MAX_TIMEOUT:?} (one week)"),
        ));
    }
    Ok(())
}

/// A chunk of `bytes` bytes (`field` names the option: chunk bytes or chunk elements).
pub(crate) fn check_chunk(field: &'static str, chunk: usize, elem_bytes: usize) -> Result<()> {
    if chunk == 0 || chunk.saturating_mul(elem_bytes.max(1)) > MAX_CHUNK_BYTES {
        return Err(invalid(
            field,
            chunk,
            format!("must be at least 1 and at most {MAX_CHUNK_BYTES} bytes"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_refuse_the_edges_and_accept_the_range() {
        assert_eq!(check_world(0), Err(Error::NoRanks));
        assert!(check_world(1).is_ok() && check_world(MAX_WORLD).is_ok());
        assert!(matches!(
            check_world(MAX_WORLD + 1),
            Err(Error::TooManyRanks { world, max }) if world == MAX_WORLD + 1 && max == MAX_WORLD
        ));
        for bad in [0, MAX_SLOTS + 1, 1 << 40, usize::MAX] {
            assert!(matches!(
                check_slots(bad),
                Err(Error::InvalidConfig { field: "slots", .. })
            ));
        }
        assert!(check_slots(1).is_ok() && check_slots(MAX_SLOTS).is_ok());
        for bad in [
            Duration::ZERO,
            Duration::MAX,
            Duration::from_secs(u64::MAX),
            MAX_TIMEOUT + Duration::from_nanos(1),
        ] {
            assert!(matches!(
                check_timeout(bad),
                Err(Error::InvalidConfig {
                    field: "timeout",
                    ..
                })
            ));
        }
        assert!(
            check_timeout(Duration::from_nanos(1)).is_ok() && check_timeout(MAX_TIMEOUT).is_ok()
        );
        assert!(check_chunk("chunk_elems", 0, 4).is_err());
        assert!(check_chunk("chunk_elems", usize::MAX, 4).is_err());
        assert!(check_chunk("chunk_elems", MAX_CHUNK_BYTES / 8, 8).is_ok());
    }
}
