//! Groups of sends and receives on the point-to-point channel (`kernels::channel`,
//! `cuda/channel.cuh`): on a job of one process per GPU whose GPUs reach each other, a rank's
//! group is one kernel on its Main stream, fenced around the caller's stream like every call, and
//! returns once enqueued. Its sends and receives meet their peers' per direction and in call
//! order, on the GPUs — whatever each peer groups, and whenever its host gets there — so nothing
//! is published and no host waits; a receive whose send differs fails both calls' communicator
//! with [`Error::CallMismatch`] before it writes anything.

use super::callers::CallerStreams;
use super::CudaExecutor;
use crate::device;
use crate::element::DType;
use crate::error::{Error, Result};
use crate::exec::algorithm::{Form, Ran};
use crate::exec::cuda::kernels::{
    CallGate, ChannelArgs, ChannelOp, CHANNEL_MAX_OPS, PEER_MAX_RANKS,
};
use crate::exec::Algorithm;
use crate::plan::StreamKind;

/// One send or receive of a group on the channel, as the executor takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ChannelEnd {
    /// The peer rank.
    pub(crate) peer: usize,
    /// A send to `peer` (else a receive from it).
    pub(crate) send: bool,
    /// This rank's buffer: a device address on its GPU.
    pub(crate) address: u64,
    pub(crate) count: usize,
    pub(crate) dtype: DType,
}

impl CudaExecutor {
    /// Whether groups of sends and receives run on the channel: this process's one rank, and
    /// every rank made a channel region (one process per GPU, the GPUs reaching each other).
    pub(crate) fn has_channel(&self) -> bool {
        match &self.ranks[..] {
            [rank] => rank
                .peer
                .as_ref()
                .is_some_and(|words| words.channel_of.is_some()),
            _ => false,
        }
    }

    /// Enqueues this rank's group `ops` (call order; made by [`CudaExecutor::channel_ops`]) on
    /// the channel, ordered on the caller's `stream` (module doc).
    ///
    /// # Safety
    /// Every op's buffer is device memory of this rank's GPU, valid for its bytes until `stream`
    /// has passed the call; a send's unwritten and a receive's untouched meanwhile except by
    /// work queued on `stream` after this call.
    pub(crate) unsafe fn run_channel(
        &mut self,
        ops: Vec<ChannelOp>,
        stream: CallerStreams<'_>,
    ) -> Result<()> {
        let result = self.launch_channel(ops, stream);
        if let Err(err) = &result {
            self.fabric.fail(err);
        }
        result
    }

    /// [`CudaExecutor::run_channel`] but for telling the peers of a failure.
    fn launch_channel(&mut self, ops: Vec<ChannelOp>, stream: CallerStreams<'_>) -> Result<()> {
        let rank = &self.ranks[0];
        let words = rank.peer.as_ref().expect("has_channel");
        let channel_of = words.channel_of.as_ref().expect("has_channel");
        let mut regions = [0u64; PEER_MAX_RANKS];
        regions[..self.world].copy_from_slice(channel_of);
        let args = ChannelArgs {
            regions,
            ops,
            world: self.world as u32,
            rank: rank.rank() as u32,
            timeout_ns: u64::try_from(self.config.timeout.as_nanos()).unwrap_or(u64::MAX),
            error: rank.res.error_word(),
            gate: self.fabric.gate().unwrap_or(CallGate::NONE),
            max_blocks: words.max_blocks,
        };
        // A failure an earlier call's kernels left is that call's, reported before this one.
        self.check_error_words()?;
        let captured = stream.capturing()?;
        self.last_ran = Some(Ran {
            algorithm: Algorithm::OneShot,
            form: Form::Channel,
            reach: self.reach(),
            in_place: false,
            copied: true,
            registered: false,
            captured,
            pieces: 1,
        });
        let launching =
            device::gate::launching(self.config.timeout).ok_or_else(|| Error::Timeout {
                rank: args.rank as usize,
                waiting_on: "another thread's blocking call of ringreduce (an allocation, copy \
                             or free of a GpuBuffer) to finish, before launching"
                    .into(),
                after: self.config.timeout,
            })?;
        let saved = device::save_current()?;
        let streams = stream.streams();
        let rank = &self.ranks[0];
        // (Not `PeerWords::launched_at`: the gate's blocking calls need not wait for this kernel,
        // whose partners are all in other processes.)
        let launched = self.fence_in(streams).and_then(|()| {
            // SAFETY: the regions are every rank's, made zeroed with the communicator and
            // touched only by its channel kernels, each rank's on its Main stream (this one);
            // the buffers are our caller's contract, ordered on Main by the fences.
            unsafe {
                rank.res
                    .kernels
                    .channel(&args, rank.res.stream(StreamKind::Main))
            }
        });
        if launched.is_ok() {
            self.fabric.channel_launched();
        }
        // Also after a failure: the caller's stream must not run ahead of what was enqueued.
        let fenced = self.fence_out(streams);
        drop(launching);
        launched.and(fenced).and(saved.restore())
    }

    /// The kernel's ops of `ends`, checked: refused ([`Error::InvalidArgument`]) without a
    /// channel, with no ends or more than [`CHANNEL_MAX_OPS`], or with an end to this rank or
    /// beyond the world.
    pub(crate) fn channel_ops(&self, ends: &[ChannelEnd]) -> Result<Vec<ChannelOp>> {
        if !self.has_channel() {
            return Err(Error::InvalidArgument(
                "this communicator has no point-to-point channel: one process per GPU, GPUs \
                 that reach each other"
                    .into(),
            ));
        }
        if ends.is_empty() || ends.len() > CHANNEL_MAX_OPS {
            return Err(Error::InvalidArgument(format!(
                "a group of {} sends and receives: the channel runs 1 to {CHANNEL_MAX_OPS}",
                ends.len()
            )));
        }
        let me = self.ranks[0].rank();
        ends.iter()
            .map(|end| {
                if end.peer >= self.world || end.peer == me {
                    return Err(Error::InvalidArgument(format!(
                        "rank {me} sends to or receives from rank {} of {}: the channel joins \
                         two different ranks",
                        end.peer, self.world
                    )));
                }
                if end.count > 0 && end.address == 0 {
                    return Err(Error::InvalidArgument(format!(
                        "rank {me}'s buffer of {} elements to or from rank {} is null",
                        end.count, end.peer
                    )));
                }
                let bytes = end
                    .count
                    .checked_mul(end.dtype.size_bytes())
                    .ok_or_else(|| {
                        Error::InvalidArgument(format!("{} elements overflow", end.count))
                    })?;
                Ok(ChannelOp {
                    addr: end.address,
                    bytes: bytes as u64,
                    peer: end.peer as u32,
                    send: u32::from(end.send),
                    dtype: end.dtype as u32,
                    pad: 0,
                })
            })
            .collect()
    }
}
