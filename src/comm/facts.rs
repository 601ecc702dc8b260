//! What a [`Communicator`] is, fixed when it is made and read without waiting for a running
//! call: its world, its GPUs and edges, the algorithm a call of a given size runs, and each
//! rank's Main stream.

use super::{Communicator, Executor};
use crate::exec::algorithm::{select, Ask, Selection};
use crate::exec::cuda::executor::EdgeInfo;
use crate::exec::Algorithm;

impl Communicator {
    /// The GPUs of a GPU communicator, by rank; empty for a host communicator.
    /// Fixed at creation: never waits for a running call.
    pub fn devices(&self) -> Vec<usize> {
        self.facts.devices.clone()
    }

    /// How each ring edge moves data and why (GPU communicators; empty otherwise).
    /// Fixed at creation: never waits for a running call.
    pub fn edges(&self) -> Vec<EdgeInfo> {
        self.facts.edges.clone()
    }

    /// The algorithm a call of `bytes_per_rank` bytes, in place or not, runs on this
    /// communicator: the ring, the one-shot or the two-shot (see [`Algorithm`]; with `Auto` it
    /// depends on the size and, for the one-shot and the two-shot, on `in_place`). The
    /// selection's answer ([`select`]); this never waits for a running call.
    pub fn algorithm_for(&self, bytes_per_rank: usize, in_place: bool) -> Algorithm {
        let all_reduce = crate::plan::Collective::AllReduce;
        self.algorithm_for_collective(&all_reduce, bytes_per_rank, in_place)
    }

    /// The algorithm whose form of `collective` a call of `count_bytes` (NCCL's count times the
    /// element size), in place or not, runs on this communicator: `Ring` or `OneShot` for the
    /// collectives other than the all-reduce, the all-reduce's algorithm for it — the
    /// selection's answer ([`select`]). Never waits for a call.
    pub fn algorithm_for_collective(
        &self,
        collective: &crate::plan::Collective,
        count_bytes: usize,
        in_place: bool,
    ) -> Algorithm {
        self.selection_for(collective, count_bytes, in_place)
            .algorithm
    }

    /// What a call of `collective` of `count_bytes` (NCCL's count times the element size), in
    /// place or not, runs on this communicator: its algorithm and form, the selection's answer
    /// ([`select`]) — what [`Communicator::last_ran`] then says it ran. Never waits for a call.
    pub fn selection_for(
        &self,
        collective: &crate::plan::Collective,
        count_bytes: usize,
        in_place: bool,
    ) -> Selection {
        let f = &self.facts;
        select(&Ask {
            chosen: f.algorithm,
            collective,
            count_bytes,
            world: self.world,
            in_place,
            reach: f.reach,
            deterministic: f.deterministic,
            ll_grid: f.ll_grid,
            gated: false,
        })
    }

    /// The raw CUDA stream on which rank `rank`'s collectives start and end (GPU communicators):
    /// work the caller enqueues there after a call runs after that call.
    pub fn main_stream(&self, rank: usize) -> Option<cudarc::driver::sys::CUstream> {
        match &self.state.lock().unwrap_or_else(|p| p.into_inner()).exec {
            Some(Executor::Cuda(exec)) => exec.main_stream(rank),
            _ => None,
        }
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }
}
