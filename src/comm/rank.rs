//! One rank of a job that runs one process per rank: [`RankCommunicator`], NCCL's
//! `ncclCommInitRank` model — rank 0 makes a [`UniqueId`], every process gets it by any channel
//! and joins with its rank, and each call takes this rank's buffers alone.
//!
//! Today its ranks are host ranks (the host executor's plans across processes, shared memory
//! between them: `exec::host::process`); a rank on a GPU joins the same way once the GPU
//! executor has its fabric between processes.
//!
//! ```no_run
//! use ringreduce::{HostConfig, RankCommunicator, ReduceOp};
//! // In each of the job's processes, started by torchrun or `ringreduce launch`:
//! let mut comm = RankCommunicator::from_env_host(HostConfig::default())?;
//! let mut grads = vec![comm.rank() as f32; 1024];
//! comm.all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
//! # Ok::<(), ringreduce::Error>(())
//! ```

use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::host::process::ProcessRank;
use crate::exec::host::HostConfig;
use crate::exec::rendezvous::{LaunchEnv, UniqueId};
use crate::exec::{config, Shape};
use crate::plan::{BufKind, Collective, Transfer};

/// One rank of a job with one process per rank (module doc). Its calls block until the
/// collective is complete on this rank, and every rank must make the same calls in the same
/// order: a rank whose call differs gets [`Error::CallMismatch`], as do its peers. A failed call
/// (a peer's process gone, a timeout, a mismatch) leaves it broken: later calls return
/// [`Error::CommunicatorFailed`] at once; make a new one with a new id.
pub struct RankCommunicator {
    inner: ProcessRank,
}

impl std::fmt::Debug for RankCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankCommunicator")
            .field("rank", &self.rank())
            .field("world", &self.world())
            .finish()
    }
}

impl RankCommunicator {
    /// Joins the job of `id` as host rank `rank` of `world`: meets every other rank at `id`'s
    /// address within `config.timeout` (every rank gets the same named error when they
    /// disagree: [`crate::exec::rendezvous`]), then maps their shared memory.
    pub fn host(
        id: &UniqueId,
        rank: usize,
        world: usize,
        config: HostConfig,
    ) -> Result<RankCommunicator> {
        config::check_world(world)?;
        config::check_slots(config.slots)?;
        config::check_chunk(
            "chunk_elems",
            config.chunk_elems,
            std::mem::size_of::<u64>(),
        )?;
        config::check_timeout(config.timeout)?;
        Ok(RankCommunicator {
            inner: ProcessRank::join(id, rank, world, config)?,
        })
    }

    /// [`RankCommunicator::host`] with the rank, world and id from the launcher's variables
    /// ([`LaunchEnv::from_env`]: torchrun's, or `ringreduce launch`'s).
    pub fn from_env_host(config: HostConfig) -> Result<RankCommunicator> {
        let env = LaunchEnv::from_env()?;
        RankCommunicator::host(&env.unique_id()?, env.rank, env.world, config)
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.inner.rank()
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.inner.world()
    }

    /// All-reduce in place: every rank's `buf` ends holding the reduction of every rank's.
    pub fn all_reduce_in_place<T: Element>(&mut self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.collective_in_place(&Collective::AllReduce, buf, op)
    }

    /// All-reduce: `output` ends holding the reduction of every rank's `input` (equal lengths).
    pub fn all_reduce<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        self.collective(&Collective::AllReduce, Some(input), Some(output), op)
    }

    /// Any collective but send/recv ([`RankCommunicator::send_recv`]), out of place, on this
    /// rank's buffers: `input` is `None`
    /// where this rank passes none (a broadcast's non-root), `output` where it passes none (a
    /// reduce's non-root). The lengths are [`Collective`]'s table's for this rank; the count
    /// comes from them, and every rank must pass the same.
    pub fn collective<T: Element>(
        &mut self,
        collective: &Collective,
        input: Option<&[T]>,
        output: Option<&mut [T]>,
        op: ReduceOp,
    ) -> Result<()> {
        self.check(collective)?;
        let count = self.count_of(collective, input, output.as_deref(), false)?;
        let shape = Shape::collective::<T>(collective.clone(), count, false, op);
        let reads: Vec<(BufKind, &[T])> = input.map(|i| (BufKind::Input, i)).into_iter().collect();
        let mut writes: Vec<(BufKind, &mut [T])> =
            output.map(|o| (BufKind::Output, o)).into_iter().collect();
        self.inner.run(shape, &reads, &mut writes, op)
    }

    /// Any collective that has an in-place form ([`Collective::has_in_place`]), in place on this
    /// rank's one buffer, laid out as the collective's table says (an all-gather's holds this
    /// rank's block at its place; a reduce-scatter's leaves this rank's block holding its
    /// result, the others undefined).
    pub fn collective_in_place<T: Element>(
        &mut self,
        collective: &Collective,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        self.check(collective)?;
        if !collective.has_in_place() {
            return Err(Error::InvalidArgument(format!(
                "{} has no in-place form",
                collective.name()
            )));
        }
        let count = self.count_of(collective, None, Some(buf), true)?;
        let shape = Shape::collective::<T>(collective.clone(), count, true, op);
        self.inner
            .run(shape, &[], &mut [(BufKind::Output, buf)], op)
    }

    /// Grouped send/recv: every rank names the same `transfers` (transfer i moves `count`
    /// elements from rank `from` to rank `to`), and passes its own ends of them — `sends`, one
    /// buffer per transfer it sends, and `recvs`, one per transfer it receives, each in the
    /// order of `transfers` and of the transfer's count. All in one call, so an exchange where
    /// every rank both sends and receives cannot deadlock.
    pub fn send_recv<T: Element>(
        &mut self,
        transfers: &[Transfer],
        sends: &[&[T]],
        recvs: &mut [&mut [T]],
    ) -> Result<()> {
        let (rank, world) = (self.rank(), self.world());
        let collective = Collective::SendRecv {
            transfers: transfers.to_vec(),
        };
        collective.validate(world)?;
        let mine = |to_me: bool| -> Vec<(usize, usize)> {
            transfers
                .iter()
                .enumerate()
                .filter(|(_, t)| if to_me { t.to == rank } else { t.from == rank })
                .map(|(i, t)| (i, t.count))
                .collect()
        };
        let (sending, receiving) = (mine(false), mine(true));
        for (what, ends, lens) in [
            (
                "send buffers (one per transfer this rank sends)",
                &sending,
                sends.iter().map(|b| b.len()).collect::<Vec<_>>(),
            ),
            (
                "receive buffers (one per transfer this rank receives)",
                &receiving,
                recvs.iter().map(|b| b.len()).collect(),
            ),
        ] {
            if lens.len() != ends.len() {
                return Err(Error::BufferCount {
                    collective: "send/recv",
                    what,
                    expected: ends.len(),
                    got: lens.len(),
                });
            }
            if let Some((&(i, count), &got)) = ends
                .iter()
                .zip(&lens)
                .find(|((_, count), got)| count != *got)
            {
                return Err(Error::BufferLength {
                    collective: "send/recv",
                    rank,
                    buffer: format!("buffer of transfer {i}"),
                    expected: count,
                    got,
                });
            }
        }
        let reads: Vec<(BufKind, &[T])> = sending
            .iter()
            .zip(sends)
            .map(|(&(i, _), b)| (BufKind::SendBuf(i), *b))
            .collect();
        let mut writes: Vec<(BufKind, &mut [T])> = receiving
            .iter()
            .zip(recvs.iter_mut())
            .map(|(&(i, _), b)| (BufKind::RecvBuf(i), &mut **b))
            .collect();
        let shape = Shape::collective::<T>(collective, 0, false, ReduceOp::Sum);
        self.inner.run(shape, &reads, &mut writes, ReduceOp::Sum)
    }

    /// What every call but send/recv checks first: a collective of its world (send/recv has
    /// its own call, [`RankCommunicator::send_recv`]).
    fn check(&self, collective: &Collective) -> Result<()> {
        if matches!(collective, Collective::SendRecv { .. }) {
            return Err(Error::InvalidArgument(
                "send/recv passes a buffer per transfer: call RankCommunicator::send_recv".into(),
            ));
        }
        collective.validate(self.world())
    }

    /// The collective's count from this rank's buffers, each length checked against the table.
    fn count_of<T>(
        &self,
        collective: &Collective,
        input: Option<&[T]>,
        output: Option<&[T]>,
        in_place: bool,
    ) -> Result<usize> {
        let (rank, world) = (self.rank(), self.world());
        let per = |len: usize, blocks: usize| -> Result<usize> {
            match len % blocks {
                0 => Ok(len / blocks),
                _ => Err(Error::InvalidArgument(format!(
                    "rank {rank}'s buffer of {len} elements is not {blocks} blocks of one count"
                ))),
            }
        };
        let count = if in_place {
            let buf = output.ok_or_else(|| {
                Error::InvalidArgument(format!("rank {rank} passes no buffer in place"))
            })?;
            per(buf.len(), collective.in_place_len(world, 1))?
        } else {
            let input_blocks = collective.input_len(rank, world, 1);
            let output_blocks = collective.output_len(rank, world, 1);
            let from = match (input_blocks, input, output_blocks, output) {
                (Some(b), Some(i), _, _) => per(i.len(), b)?,
                (_, _, Some(b), Some(o)) => per(o.len(), b)?,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "rank {rank} passes no buffer the {} needs",
                        collective.name()
                    )))
                }
            };
            for (what, blocks, buf) in [
                ("input", input_blocks, input.map(<[T]>::len)),
                ("output", output_blocks, output.map(<[T]>::len)),
            ] {
                match (blocks, buf) {
                    (Some(b), Some(len)) if len == b * from => {}
                    (None, None) => {}
                    (Some(b), got) => {
                        return Err(Error::BufferLength {
                            collective: collective.name(),
                            rank,
                            buffer: what.into(),
                            expected: b * from,
                            got: got.unwrap_or(0),
                        })
                    }
                    (None, Some(_)) => {
                        return Err(Error::InvalidArgument(format!(
                            "rank {rank} passes an {what} the {} does not take from it",
                            collective.name()
                        )))
                    }
                }
            }
            from
        };
        Ok(count)
    }
}
