//! Sub-communicators of a GPU rank's job: [`RankCommunicator::split`], NCCL's `ncclCommSplit` —
//! every rank of a communicator names a color (or none) and a key; the ranks of one color become
//! a new communicator, ordered by key (ties by their rank here). What PyTorch's `new_group`,
//! `new_subgroups` and `DeviceMesh` are built on.
//!
//! The ranks all-gather their (color, key) over this communicator; in each color the first rank
//! of the new order makes a [`UniqueId`] (binding its rendezvous port, in its own process) and a
//! second all-gather hands it to the others; then each new communicator's ranks join it as any
//! job's ranks do ([`RankCommunicator::gpu`]). Invariant: every rank takes part in both
//! all-gathers, a rank without a color too, so the parent's calls stay matched on every rank.

use super::RankCommunicator;
use crate::error::{Error, Result};
use crate::exec::cuda::CudaConfig;
use crate::exec::rendezvous::{UniqueId, UNIQUE_ID_BYTES};

/// The word a rank without a color publishes.
const NO_COLOR: u64 = u64::MAX;

impl RankCommunicator {
    /// Splits this GPU rank's communicator (module doc): a collective call of every rank, each
    /// with its `color` (`None`: this rank joins no new communicator and gets `None`) and
    /// `key`. The new communicator runs with `config` (one host's ranks; a job on several
    /// hosts is refused by name).
    pub fn split(
        &mut self,
        color: Option<u32>,
        key: i32,
        config: CudaConfig,
    ) -> Result<Option<RankCommunicator>> {
        let device = self.device().ok_or_else(|| {
            Error::InvalidArgument("split is for GPU ranks: this is a host rank".into())
        })?;
        if self.hosts().hosts > 1 {
            return Err(Error::InvalidArgument(
                "split of a communicator across hosts is not run yet".into(),
            ));
        }
        let mine = [color.map_or(NO_COLOR, u64::from), key as i64 as u64];
        let all = self.exchange(&mine)?;
        let wanted: Vec<(u64, i64)> = all
            .iter()
            .map(|w| (w[0], w.get(1).map_or(0, |&k| k as i64)))
            .collect();
        let members = members(&wanted, self.rank());
        // The first member of each new communicator makes its id and hands it out.
        let leader = members.as_ref().and_then(|m| m.first().copied());
        let words = match leader == Some(self.rank()) {
            true => id_words(&UniqueId::new("127.0.0.1:0")?),
            false => vec![0u64; UNIQUE_ID_BYTES / 8],
        };
        let ids = self.exchange(&words)?;
        let (Some(members), Some(leader)) = (members, leader) else {
            return Ok(None);
        };
        let id = UniqueId::from_bytes(&words_bytes(&ids[leader]))?;
        let rank = members
            .iter()
            .position(|&r| r == self.rank())
            .expect("a rank with a color is among its color's members");
        // An abort of this communicator from another thread, while the join waits, ends it
        // (NCCL's `ncclCommAbort` releases every wait); a later one leaves the new communicator
        // alone.
        let handle = self.abort_handle();
        let _watch = handle.watch_join(&id);
        RankCommunicator::gpu(&id, rank, members.len(), device, config).map(Some)
    }
}

/// The members of `rank`'s new communicator in their new order, from every rank's (color,
/// key): the ranks of its color by key, ties by rank. `None` for a rank without a color.
fn members(wanted: &[(u64, i64)], rank: usize) -> Option<Vec<usize>> {
    let color = wanted[rank].0;
    if color == NO_COLOR {
        return None;
    }
    let mut members: Vec<usize> = (0..wanted.len())
        .filter(|&r| wanted[r].0 == color)
        .collect();
    members.sort_by_key(|&r| (wanted[r].1, r));
    Some(members)
}

/// An id as the words an all-gather carries.
fn id_words(id: &UniqueId) -> Vec<u64> {
    id.to_bytes()
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunks")))
        .collect()
}

/// The bytes of [`id_words`]' words.
fn words_bytes(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_of_a_color_follow_their_keys_then_their_ranks() {
        // Ranks 0..5: colors 1, 0, 1, none, 1; keys 5, 0, 5, 0, -1.
        let wanted = [(1, 5), (0, 0), (1, 5), (NO_COLOR, 0), (1, -1)];
        assert_eq!(members(&wanted, 0), Some(vec![4, 0, 2]));
        assert_eq!(members(&wanted, 2), Some(vec![4, 0, 2]));
        assert_eq!(members(&wanted, 1), Some(vec![1]));
        assert_eq!(members(&wanted, 3), None);
    }

    #[test]
    fn an_id_survives_its_words() {
        let id = UniqueId::new("127.0.0.1:0").unwrap();
        let back = UniqueId::from_bytes(&words_bytes(&id_words(&id))).unwrap();
        assert_eq!(back.to_bytes(), id.to_bytes());
    }
}
