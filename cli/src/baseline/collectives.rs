//! Every collective of [`ringreduce::Collective`] on NCCL, with the buffer lists of
//! `Communicator::enqueue_collective` (the table in `ringreduce::comm::collectives`), so that
//! `bench` drives both libraries through the same call.
//!
//! Per collective, one NCCL call per rank inside one group (`ncclGroupStart` … `ncclGroupEnd`,
//! the single-thread, multi-GPU pattern of [`NcclAllReduce`]):
//!
//! | collective      | NCCL per rank r                                                           |
//! |-----------------|---------------------------------------------------------------------------|
//! | all-reduce      | `ncclAllReduce(in_r, out_r, count)`                                       |
//! | reduce-scatter  | `ncclReduceScatter(in_r, out_r, recvcount = count)`; in place out = block r |
//! | all-gather      | `ncclAllGather(in_r, out_r, sendcount = count)`; in place in = block r    |
//! | broadcast(root) | `ncclBroadcast(in_root or null, out_r, count, root)`                      |
//! | reduce(root)    | `ncclReduce(in_r, out_root or null, count, root)`                         |
//! | all-to-all      | for every peer p: `ncclSend(in_r + p·count, p)`, `ncclRecv(out_r + p·count, p)` (as nccl-tests' `alltoall_perf`) |
//! | send/recv       | per transfer: `ncclSend` on the sender's communicator, `ncclRecv` on the receiver's |
//!
//! NCCL reads the root's send buffer alone in a broadcast and writes the root's receive buffer
//! alone in a reduce; the other ranks pass null there.
//!
//! Invariant: every buffer is checked (count, device, exact length from
//! [`Collective::input_len`] / [`Collective::output_len`] / [`Collective::in_place_len`]) before
//! the group starts; a group that started is always ended.

use super::NcclAllReduce;
use cudarc::driver::CudaStream;
use ringreduce::exec::nccl::abi::{nccl_op, nccl_type};
use ringreduce::{Buffer, BufferMut, Collective, Element, Error, Placement, ReduceOp, Result};
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// Blocks per rank's buffer in the list that sets the count: the count is that buffer's length
/// over this.
fn blocks(collective: &Collective, world: usize, in_place: bool) -> usize {
    match (collective, in_place) {
        (Collective::ReduceScatter | Collective::AllGather, true) => world,
        (Collective::ReduceScatter | Collective::AllToAll, false) => world,
        _ => 1,
    }
}

impl NcclAllReduce {
    /// Any collective on NCCL, with `Communicator::enqueue_collective`'s buffer lists (`inputs`
    /// `None`: in place; all-to-all and send/recv have no in-place form); on the caller's
    /// `streams` (one per rank) or NCCL's own. Returns once enqueued. Rooted collectives use
    /// their root; `op` applies where the collective reduces.
    ///
    /// # Safety
    /// Every buffer must stay allocated, inputs unwritten and outputs neither read nor written (on
    /// any stream or the host), until the streams used have passed the call
    /// ([`NcclAllReduce::synchronize`], or a synchronize of the caller's streams).
    pub unsafe fn enqueue_collective<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        collective: &Collective,
        inputs: Option<&[I]>,
        outputs: &mut [O],
        op: ReduceOp,
        streams: Option<&[Arc<CudaStream>]>,
    ) -> Result<(), Error> {
        let world = self.devices.len();
        collective.validate(world)?;
        let raw_streams = match streams {
            Some(s) => self.check_streams(s)?,
            None => self.own_streams(),
        };
        let name = collective.name();
        let in_place = inputs.is_none();
        if in_place && !collective.has_in_place() {
            return Err(Error::InvalidArgument(format!(
                "{name} has no in-place form"
            )));
        }
        let in_ranks = if in_place {
            Vec::new()
        } else {
            collective.input_ranks(world)
        };
        let out_ranks = if in_place {
            (0..world).collect()
        } else {
            collective.output_ranks(world)
        };
        let list = |what, expected: usize, got: usize| {
            if expected == got {
                Ok(())
            } else {
                Err(Error::BufferCount {
                    collective: name,
                    what,
                    expected,
                    got,
                })
            }
        };
        let ins: &[I] = inputs.unwrap_or(&[]);
        list("input buffers", in_ranks.len(), ins.len())?;
        list("output buffers", out_ranks.len(), outputs.len())?;
        // The count, from the first buffer of the list that sets it.
        let first = match inputs.and_then(|i| i.first()) {
            Some(b) => b.count(),
            None => outputs.first().map(|b| b.count()).ok_or(Error::NoBuffers)?,
        };
        let count = first / blocks(collective, world, in_place);
        let elem = std::mem::size_of::<T>() as u64;
        // Expected length of each list's buffer i.
        let want = |output: bool, i: usize, rank: usize| -> Option<usize> {
            if let Collective::SendRecv { transfers } = collective {
                return Some(transfers[i].count);
            }
            match (in_place, output) {
                (true, _) => Some(collective.in_place_len(world, count)),
                (false, false) => collective.input_len(rank, world, count),
                (false, true) => collective.output_len(rank, world, count),
            }
        };
        let mut sends: Vec<Option<u64>> = vec![None; world];
        let mut recvs: Vec<Option<u64>> = vec![None; world];
        let mut send_at = Vec::with_capacity(ins.len());
        for (i, (b, &rank)) in ins.iter().zip(&in_ranks).enumerate() {
            self.check_one(rank, b.placement(), want(false, i, rank), b.count())?;
            sends[rank] = Some(b.address());
            send_at.push(b.address());
        }
        let mut recv_at = Vec::with_capacity(outputs.len());
        for (i, (b, &rank)) in outputs.iter_mut().zip(&out_ranks).enumerate() {
            self.check_one(rank, b.placement(), want(true, i, rank), b.count())?;
            recvs[rank] = Some(b.address_mut());
            recv_at.push(b.address_mut());
        }
        if in_place {
            sends.clone_from(&recvs);
            // The input or the result is one block of the in-place buffer.
            for (rank, (s, r)) in sends.iter_mut().zip(&mut recvs).enumerate() {
                let input_at = collective.in_place_input_at(rank, count) as u64 * elem;
                let output_at = collective.in_place_output_at(rank, count) as u64 * elem;
                *s = s.map(|a| a + input_at);
                *r = r.map(|a| a + output_at);
            }
        }
        let dtype = nccl_type(T::DTYPE);
        let red = nccl_op(op);
        let block_bytes = count as u64 * elem;
        let peer = |p: usize| c_int::try_from(p).unwrap_or(c_int::MAX);
        let root = peer(collective.root().unwrap_or(0));
        let ptr = |a: Option<u64>| a.unwrap_or(0) as *mut c_void;
        let api = self.api;
        api.group_start()?;
        let mut queued = Ok(());
        // Each call's status is checked by the call itself (`Api::check`); the first error stays.
        let mut call = |f: &mut dyn FnMut() -> Result<(), Error>| {
            if queued.is_ok() {
                queued = f();
            }
        };
        // Why every call below is sound: the addresses were checked above to be buffers of the
        // lengths NCCL reads and writes for this collective and count, on the rank's GPU (null
        // only where NCCL documents the pointer as unused on that rank), kept alive and
        // untouched by our caller until the streams pass the group; `self.comms[rank]` is a live
        // communicator of GPU devices[rank] and `raw_streams[rank]` a live stream in that GPU's
        // primary context. Inside a group each call only queues work.
        match collective {
            Collective::SendRecv { transfers } => {
                for (i, t) in transfers.iter().enumerate() {
                    // SAFETY: as stated above the `match` ("why every call below is sound").
                    call(&mut || unsafe {
                        api.send(
                            send_at[i] as *const c_void,
                            t.count,
                            dtype,
                            peer(t.to),
                            self.comms[t.from],
                            raw_streams[t.from],
                        )
                    });
                    // SAFETY: as stated above the `match` ("why every call below is sound").
                    call(&mut || unsafe {
                        api.recv(
                            recv_at[i] as *mut c_void,
                            t.count,
                            dtype,
                            peer(t.from),
                            self.comms[t.to],
                            raw_streams[t.to],
                        )
                    });
                }
            }
            _ => {
                for (rank, &comm) in self.comms.iter().enumerate() {
                    let (s, r, stream) = (ptr(sends[rank]), ptr(recvs[rank]), raw_streams[rank]);
                    match collective {
                        // SAFETY: as stated above the `match` ("why every call below is sound").
                        Collective::AllReduce => call(&mut || unsafe {
                            api.all_reduce(s, r, count, dtype, red, comm, stream)
                        }),
                        // SAFETY: as stated above the `match` ("why every call below is sound").
                        Collective::ReduceScatter => call(&mut || unsafe {
                            api.reduce_scatter(s, r, count, dtype, red, comm, stream)
                        }),
                        // SAFETY: as stated above the `match` ("why every call below is sound").
                        Collective::AllGather => call(&mut || unsafe {
                            api.all_gather(s, r, count, dtype, comm, stream)
                        }),
                        // SAFETY: as stated above the `match` ("why every call below is sound").
                        Collective::Broadcast { .. } => call(&mut || unsafe {
                            api.broadcast(s, r, count, dtype, root, comm, stream)
                        }),
                        // SAFETY: as stated above the `match` ("why every call below is sound").
                        Collective::Reduce { .. } => call(&mut || unsafe {
                            api.reduce(s, r, count, dtype, red, root, comm, stream)
                        }),
                        Collective::AllToAll => {
                            for p in 0..world {
                                let at = p as u64 * block_bytes;
                                let (s, r) = (sends[rank].map(|a| a + at), recvs[rank]);
                                // SAFETY: as stated above the `match` ("why every call below is sound").
                                call(&mut || unsafe {
                                    api.send(ptr(s), count, dtype, peer(p), comm, stream)
                                });
                                // SAFETY: as stated above the `match` ("why every call below is sound").
                                call(&mut || unsafe {
                                    api.recv(
                                        ptr(r.map(|a| a + at)),
                                        count,
                                        dtype,
                                        peer(p),
                                        comm,
                                        stream,
                                    )
                                });
                            }
                        }
                        Collective::SendRecv { .. } => {}
                    }
                }
            }
        }
        // Always close the group, even after a failed call, so the thread is not left inside it.
        let ended = api.group_end();
        queued.and(ended)
    }

    /// One buffer of a collective: on rank `rank`'s GPU, of exactly `want` elements (`None`: the
    /// rank passes no buffer in that list).
    fn check_one(
        &self,
        rank: usize,
        placement: Placement,
        want: Option<usize>,
        got: usize,
    ) -> Result<()> {
        super::on_gpu(rank, placement, self.devices[rank])?;
        match want {
            Some(expected) if expected == got => Ok(()),
            Some(expected) => Err(Error::LengthMismatch {
                rank,
                expected,
                got,
            }),
            None => Err(Error::InvalidArgument(format!(
                "rank {rank} passes no buffer in this list"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringreduce::Transfer;

    #[test]
    fn lists_name_their_ranks() {
        let ring = Collective::SendRecv {
            transfers: (0..3)
                .map(|r| Transfer {
                    from: r,
                    to: (r + 1) % 3,
                    count: 4,
                })
                .collect(),
        };
        assert_eq!(ring.input_ranks(3), [0, 1, 2]);
        assert_eq!(ring.output_ranks(3), [1, 2, 0]);
        assert_eq!(Collective::Broadcast { root: 2 }.input_ranks(3), [2]);
        assert_eq!(Collective::Broadcast { root: 2 }.output_ranks(3), [0, 1, 2]);
        assert_eq!(Collective::Reduce { root: 1 }.output_ranks(3), [1]);
        assert_eq!(Collective::Reduce { root: 1 }.input_ranks(3), [0, 1, 2]);
        // The count: reduce-scatter's input and all-to-all's buffers hold world blocks; in place,
        // reduce-scatter's and all-gather's one buffer does.
        assert_eq!(blocks(&Collective::ReduceScatter, 4, false), 4);
        assert_eq!(blocks(&Collective::AllGather, 4, false), 1);
        assert_eq!(blocks(&Collective::AllGather, 4, true), 4);
        assert_eq!(blocks(&Collective::AllToAll, 4, false), 4);
        assert_eq!(blocks(&Collective::Broadcast { root: 0 }, 4, true), 1);
    }
}
