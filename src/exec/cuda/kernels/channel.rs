//! The point-to-point channel kernel: a rank's group of sends and receives, each matched per
//! direction with its peer's (the k-th send from p to q fills the k-th receive at q from p),
//! through regions of device memory that every rank exports to its peers. Its arguments
//! ([`ChannelArgs`], [`ChannelOp`]), the checks made before a launch and the launch; the
//! protocol is in `cuda/channel.cuh`, the regions are made with the peer words
//! (`exec::cuda::executor::peer_words`), and the executor launches it
//! (`exec::cuda::executor::channel`).
//!
//! Invariant: `ChannelParam` and [`ChannelOp`] are byte-for-byte mirrors of the kernel's
//! `rr_channel_args` and `rr_ch_op`, and the constants here equal the source's (a unit test reads
//! them from it).

use std::ffi::c_void;

use super::peer_launch::{check_world_and_rank, CallGate, PEER_BLOCK_THREADS};
use super::{param, KernelModule, PEER_MAX_RANKS};
use crate::device::{self, Stream};
use crate::error::{Error, Result};

/// Lanes of one direction: a message's chunk c travels on lane c mod `CHANNEL_LANES`.
pub const CHANNEL_LANES: usize = 8;
/// Slots of one lane: chunks pushed and not yet taken.
pub const CHANNEL_SLOTS: usize = 4;
/// Bytes of one chunk.
pub const CHANNEL_SLOT_BYTES: usize = 64 << 10;
/// The most sends and receives one launch moves.
pub const CHANNEL_MAX_OPS: usize = 64;
/// Words of a channel region before its inbox.
const CHANNEL_WORDS: usize = 2048;

/// The bytes of one rank's region in a job of `world` ranks: its words, and an inbox of
/// `CHANNEL_LANES × CHANNEL_SLOTS` chunks per rank.
pub fn channel_bytes(world: usize) -> usize {
    CHANNEL_WORDS * 8 + world * CHANNEL_LANES * CHANNEL_SLOTS * CHANNEL_SLOT_BYTES
}

/// One send or receive of a rank's group: the kernel's `rr_ch_op`, byte for byte.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelOp {
    /// This rank's buffer (device memory of its GPU).
    pub addr: u64,
    pub bytes: u64,
    pub peer: u32,
    /// 1: a send to `peer`; 0: a receive from it.
    pub send: u32,
    /// The element type's code ([`crate::element::DType`] as u32), which both ends compare.
    pub dtype: u32,
    pub pad: u32,
}

/// The kernel parameter `rr_channel_args`, byte for byte.
#[repr(C)]
struct ChannelParam {
    region: [u64; PEER_MAX_RANKS],
    ops: [ChannelOp; CHANNEL_MAX_OPS],
    ops_len: u32,
    world: u32,
    rank: u32,
    pad: u32,
}

/// The arguments of one rank's channel kernel ([`KernelModule::channel`]).
#[derive(Clone, Debug)]
pub struct ChannelArgs {
    /// Every rank's region ([`channel_bytes`]`(world)` bytes, zeroed when made), as this GPU
    /// reaches it, by rank; entries `>= world` ignored.
    pub regions: [u64; PEER_MAX_RANKS],
    /// This rank's sends and receives in call order, 1 to [`CHANNEL_MAX_OPS`].
    pub ops: Vec<ChannelOp>,
    pub world: u32,
    pub rank: u32,
    pub timeout_ns: u64,
    /// This rank's error word (host-mapped).
    pub error: u64,
    /// The job's control segments, whose `abort` words end the kernel's waits (the call's number
    /// is unused); [`CallGate::NONE`]: none.
    pub gate: CallGate,
    /// The grid cap that keeps every rank's blocks resident (0: none).
    pub max_blocks: u32,
}

/// The units of a group: each (peer, direction) of `ops` × each lane.
pub fn channel_units(ops: &[ChannelOp]) -> usize {
    let mut dirs: Vec<(u32, u32)> = ops.iter().map(|op| (op.peer, op.send)).collect();
    dirs.sort_unstable();
    dirs.dedup();
    dirs.len() * CHANNEL_LANES
}

impl KernelModule {
    /// Enqueues this rank's group of sends and receives on `stream`: one kernel that moves each
    /// send into its peer's inbox and each receive out of its own, per direction in call order,
    /// all of the group's directions progressing together (`cuda/channel.cuh`). A receive whose
    /// send differs in size or type leaves `CH_ERR_MISMATCH_BIT | peer` in `*args.error` before
    /// it writes anything; a wait that gives up leaves `CH_ERR_WAIT`.
    ///
    /// Checked before anything is enqueued ([`Error::InvalidArgument`]): `stream` belongs to
    /// this context; world and rank; 1 to [`CHANNEL_MAX_OPS`] ops, each peer a rank other than
    /// this one, each buffer non-null unless empty; every region of the world and the error
    /// word non-null.
    ///
    /// # Safety
    /// Every region is [`channel_bytes`]`(world)` bytes that this GPU reaches, zeroed when made
    /// and touched since only by channel kernels of this communicator's ranks, each rank's
    /// launched on one stream after another; every op's buffer is device memory valid for its
    /// bytes, a send's unwritten and a receive's untouched by other work until the kernel
    /// completes; the error word is host-mapped memory of at least 4 bytes.
    pub unsafe fn channel(&self, args: &ChannelArgs, stream: &Stream) -> Result<()> {
        self.check_stream(stream)?;
        validate_channel(args)?;
        let mut kernel_args = ChannelParam {
            region: [0; PEER_MAX_RANKS],
            ops: [ChannelOp::default(); CHANNEL_MAX_OPS],
            ops_len: args.ops.len() as u32,
            world: args.world,
            rank: args.rank,
            pad: 0,
        };
        let world = args.world as usize;
        kernel_args.region[..world].copy_from_slice(&args.regions[..world]);
        kernel_args.ops[..args.ops.len()].copy_from_slice(&args.ops);
        let (mut timeout_ns, mut error, mut gate) = (args.timeout_ns, args.error, args.gate);
        let mut params: [*mut c_void; 4] = [
            param(&mut kernel_args),
            param(&mut timeout_ns),
            param(&mut error),
            param(&mut gate),
        ];
        let units = channel_units(&args.ops) as u32;
        let grid = match args.max_blocks {
            0 => units,
            cap => units.min(cap),
        }
        .max(1);
        // SAFETY: the function is rr_channel(rr_channel_args, unsigned long long, unsigned*,
        // rr_call_gate): `param` is the #[repr(C)] mirror of rr_channel_args (a unit test holds
        // its size and offsets), then u64, u64 and the mirror of rr_call_gate, in parameter
        // order, all outliving the call (the driver copies them at launch); the memory is the
        // caller's contract. Loaded into `self.ctx`, the stream's context (`check_stream`).
        unsafe {
            device::launch_kernel(
                &self.ctx,
                &self.channel,
                grid,
                PEER_BLOCK_THREADS,
                stream.raw(),
                &mut params,
            )
        }
    }
}

/// [`KernelModule::channel`]'s checks of its arguments.
fn validate_channel(args: &ChannelArgs) -> Result<()> {
    check_world_and_rank("the channel kernel's", args.world, args.rank)?;
    let bad = |what: String| Err(Error::InvalidArgument(format!("channel kernel: {what}")));
    if args.ops.is_empty() || args.ops.len() > CHANNEL_MAX_OPS {
        return bad(format!(
            "{} sends and receives: a launch moves 1 to {CHANNEL_MAX_OPS}",
            args.ops.len()
        ));
    }
    if let Some(op) = args
        .ops
        .iter()
        .find(|op| op.peer >= args.world || op.peer == args.rank || op.send > 1)
    {
        return bad(format!(
            "an op with peer {} (send {}) on rank {} of {}",
            op.peer, op.send, args.rank, args.world
        ));
    }
    if args.ops.iter().any(|op| op.bytes > 0 && op.addr == 0) {
        return bad("a null buffer".into());
    }
    if args.regions[..args.world as usize].contains(&0) || args.error == 0 {
        return bad("a null region or error word".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::source_define as define;
    use super::*;

    #[test]
    fn the_mirrors_are_the_kernel_parameter_and_constants() {
        assert_eq!(size_of::<ChannelOp>(), 32);
        assert_eq!(std::mem::offset_of!(ChannelOp, peer), 16);
        assert_eq!(std::mem::offset_of!(ChannelOp, dtype), 24);
        assert_eq!(std::mem::offset_of!(ChannelParam, ops), 64);
        assert_eq!(std::mem::offset_of!(ChannelParam, ops_len), 64 + 32 * 64);
        assert_eq!(size_of::<ChannelParam>(), 64 + 32 * 64 + 16);
        assert_eq!(define("RR_CH_LANES"), CHANNEL_LANES as u64);
        assert_eq!(define("RR_CH_SLOTS"), CHANNEL_SLOTS as u64);
        assert_eq!(define("RR_CH_SLOT_BYTES"), CHANNEL_SLOT_BYTES as u64);
        assert_eq!(define("RR_CH_MAX_OPS"), CHANNEL_MAX_OPS as u64);
        assert_eq!(define("RR_CH_WORDS"), CHANNEL_WORDS as u64);
        // The word arrays (6 of 8 × 8 words) and the headers (8 × 8 × 4 slots × 4 words) fit
        // before the inbox.
        assert_eq!(define("RR_CH_HEADERS"), 6 * 64);
        assert!(define("RR_CH_HEADERS") + 8 * 8 * 4 * 4 <= define("RR_CH_WORDS"));
    }

    fn op(peer: u32, send: u32) -> ChannelOp {
        ChannelOp {
            addr: 0x1000,
            bytes: 4,
            peer,
            send,
            dtype: 2,
            pad: 0,
        }
    }

    fn args(ops: Vec<ChannelOp>) -> ChannelArgs {
        ChannelArgs {
            regions: [0x1000, 0x2000, 0x3000, 0, 0, 0, 0, 0],
            ops,
            world: 3,
            rank: 1,
            timeout_ns: 1,
            error: 0x4000,
            gate: CallGate::NONE,
            max_blocks: 0,
        }
    }

    #[test]
    fn units_are_directions_times_lanes() {
        assert_eq!(channel_units(&[op(0, 1)]), CHANNEL_LANES);
        // Two sends to one peer share a direction; a receive from it is another.
        assert_eq!(
            channel_units(&[op(0, 1), op(0, 1), op(0, 0)]),
            2 * CHANNEL_LANES
        );
        assert_eq!(
            channel_units(&[op(0, 1), op(2, 1), op(2, 0)]),
            3 * CHANNEL_LANES
        );
    }

    #[test]
    fn a_launch_that_breaks_the_kernels_assumptions_is_refused() {
        assert!(validate_channel(&args(vec![op(0, 1), op(2, 0)])).is_ok());
        assert!(validate_channel(&args(vec![])).is_err());
        assert!(validate_channel(&args(vec![op(0, 1); CHANNEL_MAX_OPS + 1])).is_err());
        // To itself, or beyond the world.
        assert!(validate_channel(&args(vec![op(1, 1)])).is_err());
        assert!(validate_channel(&args(vec![op(3, 0)])).is_err());
        let mut null = args(vec![op(0, 1)]);
        null.ops[0].addr = 0;
        assert!(validate_channel(&null).is_err());
        // An empty message needs no buffer.
        null.ops[0].bytes = 0;
        assert!(validate_channel(&null).is_ok());
        let mut lost = args(vec![op(0, 1)]);
        lost.regions[2] = 0;
        assert!(validate_channel(&lost).is_err());
    }
}
