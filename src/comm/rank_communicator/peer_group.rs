//! Point-to-point as NCCL defines it, on a GPU rank of a job of one process per GPU: a group of
//! [`PeerOp`]s — sends to ranks and receives from ranks, any number towards any peers, of any
//! element types — enqueued on the caller's stream in one call
//! ([`RankCommunicator::enqueue_peer_group`]). A send meets its receive per direction: the k-th
//! send from rank p to rank q fills the k-th receive at q from p, whatever either rank groups
//! with it, calls before it towards other ranks, or is doing on its host; ranks not party to a
//! transfer take no part. A group's sends and receives progress together, so a rank may send
//! and receive in one group whatever its peer's grouping (the pipeline's exchanges, a ring's);
//! as under NCCL, a send alone may wait on the GPU for its receive.
//!
//! A receive whose send differs in size or type fails the communicator with
//! [`Error::CallMismatch`](crate::Error::CallMismatch) before it writes anything (reported by
//! the next call, `synchronize` or `async_error`).
//!
//! [`RankCommunicator::send_recv`] (a job-wide list of transfers every rank passes alike) is
//! the other model; this one is what NCCL's `ncclSend`/`ncclRecv` and their groups run on.

use super::{broken, guarded, Inner, RankCommunicator};
use crate::buffer::{Buffer, BufferMut};
use crate::device::CallerStream;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::exec::cuda::executor::ChannelEnd;
use std::marker::PhantomData;

/// One send or receive of a group ([`RankCommunicator::enqueue_peer_group`]), borrowing its
/// buffer for `'a` (shared for a send, exclusive for a receive) so that no op list outlives, or
/// aliases mutably, what it moves.
#[derive(Debug)]
pub struct PeerOp<'a> {
    end: ChannelEnd,
    placement: crate::buffer::Placement,
    _buffer: PhantomData<&'a mut ()>,
}

impl<'a> PeerOp<'a> {
    /// A send of `buf`'s elements to rank `to`.
    pub fn send<T: Element, B: Buffer<T> + ?Sized>(to: usize, buf: &'a B) -> PeerOp<'a> {
        PeerOp::of(
            to,
            true,
            buf.address(),
            buf.count(),
            T::DTYPE,
            buf.placement(),
        )
    }

    /// A receive of `buf`'s elements from rank `from`.
    pub fn recv<T: Element, B: BufferMut<T> + ?Sized>(from: usize, buf: &'a mut B) -> PeerOp<'a> {
        let (count, placement) = (buf.count(), buf.placement());
        PeerOp::of(from, false, buf.address_mut(), count, T::DTYPE, placement)
    }

    /// A send to (`send`) or receive from rank `peer` of `count` elements of `dtype` at
    /// `address`, device memory of GPU `device`: for callers that hold raw addresses of several
    /// types (NCCL's API).
    ///
    /// # Safety
    /// As for [`DeviceMemory::new`](crate::DeviceMemory::new), for as long as `'a` and until the
    /// stream of the group that takes the op has passed it; a receive's memory is borrowed by
    /// no other op of that group.
    pub unsafe fn from_raw(
        peer: usize,
        send: bool,
        address: u64,
        count: usize,
        dtype: crate::element::DType,
        device: usize,
    ) -> PeerOp<'a> {
        let placement = crate::buffer::Placement::Device(device);
        PeerOp::of(peer, send, address, count, dtype, placement)
    }

    fn of(
        peer: usize,
        send: bool,
        address: u64,
        count: usize,
        dtype: crate::element::DType,
        placement: crate::buffer::Placement,
    ) -> PeerOp<'a> {
        PeerOp {
            end: ChannelEnd {
                peer,
                send,
                address,
                count,
                dtype,
            },
            placement,
            _buffer: PhantomData,
        }
    }
}

impl RankCommunicator {
    /// Enqueues this rank's group `ops` (call order) on the caller's `stream` and returns (module
    /// doc): each send's peer must make the matching receive, and each receive's peer the
    /// matching send, in some call of theirs. Refused, changing nothing
    /// ([`Error::InvalidArgument`]): a buffer not on this rank's GPU, a peer that is this rank or
    /// beyond the world, no ops or more than 64, and a communicator without the channel — made
    /// without [`CudaConfig::peer_groups`](crate::CudaConfig::peer_groups), host ranks, ranks on
    /// several hosts, several ranks a process, more than 8 ranks, GPUs that do not reach each
    /// other, ungated calls (`RINGREDUCE_CALL_GATE=off`), or a region that could not be allocated
    /// ([`RankCommunicator::has_peer_groups`]). Run so far with ranks sharing one GPU only.
    ///
    /// # Safety
    /// Every buffer stays allocated until `stream` has passed the call, the sends unwritten and
    /// the receives untouched meanwhile except by work queued on `stream` after this call;
    /// `stream` stays live until the call has returned.
    pub unsafe fn enqueue_peer_group(
        &mut self,
        ops: &[PeerOp<'_>],
        stream: impl Into<CallerStream>,
    ) -> Result<()> {
        broken(&self.broken)?;
        for op in ops {
            crate::comm::validate::placed(self.device(), op.placement, self.rank)?;
        }
        let ends: Vec<ChannelEnd> = ops.iter().map(|op| op.end).collect();
        match &mut self.inner {
            Inner::Gpu { exec, .. } if exec.has_channel() => {
                // Bad arguments are the caller's mistake: refused without breaking the
                // communicator.
                let ops = exec.channel_ops(&ends)?;
                let streams = [stream.into()];
                let streams = exec.check_caller_streams(&streams)?;
                // SAFETY: every address is this rank's buffer on its GPU (placement checked
                // above), valid for its count; its lifetime until `stream` passes the call is
                // our caller's contract.
                guarded(&mut self.broken, || unsafe {
                    exec.run_channel(ops, streams)
                })
            }
            _ => Err(Error::InvalidArgument(
                "groups of sends and receives run on GPU ranks made with CudaConfig::peer_groups, \
                 of one host, one process per GPU, whose GPUs reach each other \
                 (RankCommunicator::has_peer_groups)"
                    .into(),
            )),
        }
    }

    /// Whether [`RankCommunicator::enqueue_peer_group`] runs here: a GPU rank made with
    /// [`CudaConfig::peer_groups`](crate::CudaConfig::peer_groups), of a job on one host, one
    /// process per GPU, whose GPUs reach each other and whose ranks all made their channel region
    /// at creation.
    pub fn has_peer_groups(&self) -> bool {
        match &self.inner {
            Inner::Gpu { exec, .. } => exec.has_channel(),
            _ => false,
        }
    }
}
