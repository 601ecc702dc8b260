//! The library under test ([`Lib`]: ringreduce's communicator or NCCL's), driven through the
//! same calls — enqueue a collective, synchronize, record a timing event on rank 0's stream — so
//! that both libraries' numbers come from the same procedure; and the buffer lists a collective
//! call takes, from one buffer per rank ([`arrange`]).

use cudarc::driver::CudaStream;
use ringreduce::device;
use ringreduce::exec::profile::CallProfile;
use ringreduce::Error;
use ringreduce::{Collective, Communicator, Element, GpuViewMut, ReduceOp};
use ringreduce_cli::baseline::NcclAllReduce;
use std::sync::Arc;

/// The library under test, driven the same way.
pub(super) enum Lib<'a> {
    Ring(&'a Communicator),
    Nccl(&'a NcclAllReduce),
}

impl Lib<'_> {
    /// One `collective` of `ins` (in place when `outs` is `None`; the lists as [`arrange`] makes
    /// them) on the library's own streams, or on `streams` when given. The all-reduce goes
    /// through each library's all-reduce calls, every other collective through its
    /// `enqueue_collective`.
    ///
    /// # Safety
    /// The buffers stay allocated and untouched until the streams used have been synchronized.
    pub(super) unsafe fn enqueue<T: Element>(
        &self,
        collective: &Collective,
        ins: &mut [GpuViewMut<'_, T>],
        outs: Option<&mut [GpuViewMut<'_, T>]>,
        op: ReduceOp,
        streams: Option<&[Arc<CudaStream>]>,
    ) -> Result<(), Error> {
        if *collective != Collective::AllReduce {
            let none = None::<&[GpuViewMut<'_, T>]>;
            // SAFETY: the caller's contract is each library's.
            return unsafe {
                match (self, outs) {
                    (Lib::Ring(c), None) => {
                        Ok(c.enqueue_collective(collective, none, ins, op, streams)?)
                    }
                    (Lib::Ring(c), Some(o)) => {
                        Ok(c.enqueue_collective(collective, Some(&*ins), o, op, streams)?)
                    }
                    (Lib::Nccl(n), None) => {
                        n.enqueue_collective(collective, none, ins, op, streams)
                    }
                    (Lib::Nccl(n), Some(o)) => {
                        n.enqueue_collective(collective, Some(&*ins), o, op, streams)
                    }
                }
            };
        }
        // SAFETY: the caller's contract is each library's.
        unsafe {
            match (self, outs, streams) {
                (Lib::Ring(c), None, None) => Ok(c.enqueue_all_reduce_in_place(ins, op)?),
                (Lib::Ring(c), Some(o), None) => Ok(c.enqueue_all_reduce(ins, o, op)?),
                (Lib::Ring(c), None, Some(s)) => Ok(c.enqueue_all_reduce_in_place_on(ins, op, s)?),
                (Lib::Ring(c), Some(o), Some(s)) => Ok(c.enqueue_all_reduce_on(ins, o, op, s)?),
                (Lib::Nccl(n), None, None) => n.enqueue_all_reduce_in_place(ins, op),
                (Lib::Nccl(n), Some(o), None) => n.enqueue_all_reduce(ins, o, op),
                (Lib::Nccl(n), None, Some(s)) => n.enqueue_all_reduce_in_place_on(ins, op, s),
                (Lib::Nccl(n), Some(o), Some(s)) => n.enqueue_all_reduce_on(ins, o, op, s),
            }
        }
    }

    /// ringreduce's call profiles since the last time (`--profile-host`); empty for NCCL.
    pub(super) fn host_profile(&self) -> Vec<CallProfile> {
        match self {
            Lib::Ring(comm) => comm.host_profile(),
            Lib::Nccl(_) => Vec::new(),
        }
    }

    pub(super) fn synchronize(&self) -> ringreduce::Result<()> {
        match self {
            Lib::Ring(c) => c.synchronize(),
            Lib::Nccl(n) => n.synchronize(),
        }
    }

    /// Records `event` on rank 0's own stream.
    pub(super) fn record(&self, event: &device::Event) -> ringreduce::Result<()> {
        match self {
            Lib::Ring(c) => {
                let stream = c.main_stream(0).ok_or_else(|| {
                    ringreduce::Error::InvalidArgument("not a GPU communicator".into())
                })?;
                // SAFETY: `stream` is rank 0's main stream, live while `c` is, in the primary
                // context of devices()[0], where `event` was made (see `Sweep::new`).
                unsafe { device::record_on_raw_stream(event, stream) }
            }
            Lib::Nccl(n) => match n.stream(0) {
                Some(stream) => device::record(event, stream),
                None => Err(ringreduce::Error::NoBuffers),
            },
        }
    }
}

/// The lists a collective call takes, from one buffer per rank: in place, every rank's; out of
/// place, the inputs and outputs of the ranks that pass one, in the order of
/// `Collective::input_ranks` / `output_ranks` (the broadcast's root alone in; the reduce's root alone
/// out; sendrecv's receive buffer of transfer i is rank i+1's).
pub(super) fn arrange<B>(
    collective: &Collective,
    ins: Vec<B>,
    outs: Option<Vec<B>>,
) -> (Vec<B>, Option<Vec<B>>) {
    let Some(outs) = outs else {
        return (ins, None);
    };
    let world = ins.len();
    let pick = |list: Vec<B>, ranks: Vec<usize>| -> Vec<B> {
        let mut slots: Vec<Option<B>> = list.into_iter().map(Some).collect();
        ranks
            .iter()
            .filter_map(|&r| slots.get_mut(r)?.take())
            .collect()
    };
    (
        pick(ins, collective.input_ranks(world)),
        Some(pick(outs, collective.output_ranks(world))),
    )
}
