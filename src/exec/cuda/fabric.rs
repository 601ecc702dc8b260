//! The fabric: what the rank executors of one communicator exchange, whatever their placement.
//!
//! A rank executor (`executor::rank`) owns one rank's GPU resources and enqueues only that
//! rank's program; what it needs of its peers it gets through a [`Fabric`]:
//! - **small records, all-gathered**: each rank contributes a list of words (its buffers'
//!   handles, its GPU's identity) and receives every rank's, by rank — at creation, and when a
//!   new message shape is prepared (a collective step every rank takes in the same order, since
//!   every rank prepares the same shapes in the same order);
//! - **memory, exported and imported**: a rank exports device memory (or pinned host memory)
//!   its peers write or read — staging slots, counters' mailboxes, the peer kernels' flags — as
//!   a handle in its record; each peer imports the handle as an address valid in its own
//!   context;
//! - **a lost peer**: the rank that is gone, once the fabric knows.
//!
//! [`InProcess`] is the fabric of ranks that share one process (today's `Communicator`): its
//! records need no transport (the driver holds every rank's), a handle is the address itself
//! (one address space: identity addresses, reached over peer access), and no peer can be lost
//! without the whole process. A fabric between processes (CUDA IPC handles, a rendezvous over
//! TCP) implements the same trait under the same rank executor.
//!
//! Invariant: `all_gather` returns every rank's record exactly as that rank gave it, in rank
//! order; `import(export(m))` is an address of the same memory in the importing rank's context.

use crate::error::{Error, Result};
use std::ops::Range;

/// A record a rank contributes to an all-gather: a few 64-bit words.
pub(crate) type Record = Vec<u64>;

/// Memory a rank makes reachable to its peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exported {
    /// Device memory of the exporting rank's context, `bytes` long from `addr`.
    Device { addr: u64, bytes: usize },
    /// Pinned host memory the exporting rank allocated (portable, mapped), `bytes` long from
    /// its device address `addr`.
    Host { addr: u64, bytes: usize },
}

/// What ranks exchange (module doc).
pub(crate) trait Fabric: Send + Sync {
    /// The number of ranks.
    fn world(&self) -> usize;

    /// The ranks whose executors live in this process.
    fn local_ranks(&self) -> Range<usize>;

    /// Every rank's record, by rank, given the records of this process's ranks (by local rank,
    /// in `local_ranks` order).
    fn all_gather(&self, local: Vec<Record>) -> Result<Vec<Record>>;

    /// The handle under which local rank `rank`'s `memory` is imported by its peers.
    fn export(&self, rank: usize, memory: Exported) -> Result<Record>;

    /// The address, in local rank `rank`'s context, of the memory rank `from` exported as
    /// `handle`.
    fn import(&self, rank: usize, from: usize, handle: &[u64]) -> Result<u64>;

    /// A rank the fabric knows is gone, if any.
    fn lost_peer(&self) -> Option<usize>;
}

/// The fabric of ranks that share one process (module doc).
#[derive(Clone, Copy, Debug)]
pub(crate) struct InProcess {
    world: usize,
}

impl InProcess {
    pub(crate) fn new(world: usize) -> InProcess {
        InProcess { world }
    }
}

impl Fabric for InProcess {
    fn world(&self) -> usize {
        self.world
    }

    fn local_ranks(&self) -> Range<usize> {
        0..self.world
    }

    fn all_gather(&self, local: Vec<Record>) -> Result<Vec<Record>> {
        if local.len() != self.world {
            return Err(Error::Internal {
                what: format!(
                    "an in-process all-gather with {} records for {} ranks",
                    local.len(),
                    self.world
                ),
            });
        }
        Ok(local)
    }

    fn export(&self, _rank: usize, memory: Exported) -> Result<Record> {
        let (Exported::Device { addr, .. } | Exported::Host { addr, .. }) = memory;
        Ok(vec![addr])
    }

    fn import(&self, _rank: usize, from: usize, handle: &[u64]) -> Result<u64> {
        match handle {
            [addr] => Ok(*addr),
            _ => Err(Error::Internal {
                what: format!(
                    "rank {from}'s in-process handle has {} words, not 1",
                    handle.len()
                ),
            }),
        }
    }

    fn lost_peer(&self) -> Option<usize> {
        None
    }
}

/// Reads a record as fields of known lengths: the cursor every decoder of a record uses, so that
/// a short record is an error naming its sender, never a panic.
pub(crate) struct Fields<'a> {
    from: usize,
    words: &'a [u64],
}

impl<'a> Fields<'a> {
    pub(crate) fn new(from: usize, words: &'a [u64]) -> Fields<'a> {
        Fields { from, words }
    }

    /// The next `n` words.
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u64]> {
        if self.words.len() < n {
            return Err(Error::Internal {
                what: format!(
                    "rank {}'s record ended {} words early",
                    self.from,
                    n - self.words.len()
                ),
            });
        }
        let (head, rest) = self.words.split_at(n);
        self.words = rest;
        Ok(head)
    }

    /// The next word.
    pub(crate) fn word(&mut self) -> Result<u64> {
        self.take(1).map(|w| w[0])
    }

    /// Whether every word was read (a longer record than expected is as wrong as a shorter).
    pub(crate) fn finish(self) -> Result<()> {
        match self.words.len() {
            0 => Ok(()),
            extra => Err(Error::Internal {
                what: format!("rank {}'s record has {extra} words too many", self.from),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_in_process_fabric_hands_every_record_back_and_imports_what_was_exported() {
        let fabric = InProcess::new(3);
        assert_eq!(fabric.local_ranks(), 0..3);
        let records = vec![vec![1, 2], vec![], vec![7]];
        assert_eq!(fabric.all_gather(records.clone()).unwrap(), records);
        assert!(fabric.all_gather(vec![vec![1]]).is_err());
        for memory in [
            Exported::Device {
                addr: 0x7f00_0000_1000,
                bytes: 64,
            },
            Exported::Host {
                addr: 0x2000,
                bytes: 4,
            },
        ] {
            let handle = fabric.export(1, memory).unwrap();
            let (Exported::Device { addr, .. } | Exported::Host { addr, .. }) = memory;
            assert_eq!(fabric.import(2, 1, &handle).unwrap(), addr);
        }
        assert!(fabric.import(0, 1, &[1, 2]).is_err());
        assert_eq!(fabric.lost_peer(), None);
    }

    #[test]
    fn a_record_is_read_field_by_field_and_must_be_read_whole() {
        let words = [5, 6, 7];
        let mut fields = Fields::new(2, &words);
        assert_eq!(fields.word().unwrap(), 5);
        assert_eq!(fields.take(2).unwrap(), &[6, 7]);
        fields.finish().unwrap();
        let mut short = Fields::new(2, &words);
        let err = short.take(4).unwrap_err().to_string();
        assert!(
            err.contains("rank 2") && err.contains("1 words early"),
            "{err}"
        );
        let mut long = Fields::new(1, &words);
        long.word().unwrap();
        assert!(long
            .finish()
            .unwrap_err()
            .to_string()
            .contains("2 words too many"));
    }
}
