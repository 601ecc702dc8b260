//! The two-shot all-reduce kernel: one kernel per rank that reduces its own segment from every
//! rank's input, meets the others at a middle barrier, then copies the other segments from their
//! owners, between a start and an end barrier. Its arguments ([`TwoShotArgs`]), the checks made
//! before a launch and the launch ([`KernelModule::twoshot`]), through the pieces every peer
//! kernel shares (`peer_launch.rs`); the protocol is described in `cuda/peer.cuh`, beside the
//! kernels.
//!
//! Invariant: [`TwoShotSegs`] is a byte-for-byte mirror of the kernel parameter
//! `rr_twoshot_segs` (a unit test checks its layout), and nothing is enqueued unless the
//! segments tile `0..count` in rank order and no output overlaps another rank's source or output
//! (`validate_twoshot`).

use std::ffi::c_void;

use super::peer_launch::{
    check_not_null, check_word_aligned, check_world_and_rank, peer_grid, span_bytes, ArgName,
    CallGate, PeerParams, PEER_BLOCK_THREADS,
};
use super::{check_aligned, param, reduce_index, KernelModule, PEER_MAX_RANKS};
use crate::device::{self, Stream};
use crate::element::{DType, ReduceOp};
use crate::error::{Error, Result};

impl KernelModule {
    /// Enqueues this rank's part of a two-shot all-reduce on `stream`: one kernel that waits at
    /// a start barrier for every rank's kernel of this call, writes `outs[rank][s] = srcs[0][s] ⊕
    /// … ⊕ srcs[world − 1][s]` over its own segment `s = seg_off[rank]..+seg_len[rank]` (folded
    /// in rank order; `Avg` sums, the caller scales), meets the others at a middle barrier, then
    /// copies every other rank q's segment from `outs[q]` into `outs[rank]`, and ends at an end
    /// barrier after which no rank reads this rank's input or output any more. The grid is
    /// [`peer_blocks`] of the longest segment. Returns once enqueued; barrier timeouts are
    /// reported in `*args.error` (`PEER_ERR_START`, `_MIDDLE`, `_END`, `_LAUNCH`).
    ///
    /// Checked before anything is enqueued ([`Error::InvalidArgument`]): `stream` belongs to
    /// this context; world and rank as for [`KernelModule::oneshot`]; the segments tile
    /// `0..count` in rank order (`seg_off[0] = 0`, each ends where the next begins, the last at
    /// `count`); every address aligned as in the one-shot and, when `count > 0`, not null; no
    /// output overlaps another rank's source or output, and each source is its own rank's
    /// output (in place) or overlaps no output at all (out of place).
    ///
    /// # Safety
    ///
    /// As for [`KernelModule::oneshot`], with `srcs` the inputs (or, in place, the outputs) and
    /// `outs[r]` rank r's output, valid for `count` elements of `dtype` and readable from this
    /// context; every rank's call has the same `srcs`, `outs`, segments, `count`,
    /// `flags` and dtype. `outs[r]` is written by rank r's kernel only, and read or written by
    /// no other work until every rank's kernel of the call has completed.
    ///
    /// [`peer_blocks`]: super::peer_blocks
    pub unsafe fn twoshot(
        &self,
        dtype: DType,
        op: ReduceOp,
        args: &TwoShotArgs,
        stream: &Stream,
    ) -> Result<()> {
        self.check_stream(stream)?;
        validate_twoshot(dtype, args)?;
        if args.count == 0 {
            return Ok(());
        }
        let world = args.world as usize;
        let mut shared = PeerParams::of(
            args.world,
            args.rank,
            &args.srcs,
            &args.flags,
            args.timeout_ns,
            args.error,
        );
        let mut segs = TwoShotSegs {
            out: [0; PEER_MAX_RANKS],
            off: [0; PEER_MAX_RANKS],
            len: [0; PEER_MAX_RANKS],
        };
        segs.out[..world].copy_from_slice(&args.outs[..world]);
        segs.off[..world].copy_from_slice(&args.seg_off[..world]);
        segs.len[..world].copy_from_slice(&args.seg_len[..world]);
        let mut gate = args.gate;
        let mut params: [*mut c_void; 7] = [
            param(&mut shared.peers),
            param(&mut segs),
            param(&mut shared.world),
            param(&mut shared.rank),
            param(&mut shared.timeout_ns),
            param(&mut shared.error),
            param(&mut gate),
        ];
        let function = &self.twoshot[reduce_index(op, dtype)];
        let longest = args.seg_len[..world].iter().copied().max().unwrap_or(0);
        // SAFETY: the function is rr_twoshot_<op>_<dtype>(rr_peers, rr_twoshot_segs, unsigned,
        // unsigned, unsigned long long, unsigned*, rr_call_gate): `peers` and `segs` are the
        // #[repr(C)] mirrors of those structs (128 and 192 bytes), then u32, u32, u64, u64,
        // and `gate` the mirror of rr_call_gate (48 bytes), in parameter order, all outliving the call (the driver copies them at launch); the
        // memory and the other ranks' calls are the caller's contract.
        // Launch: the function was loaded into `self.ctx`, the stream's context
        // (`check_stream`), and the grid is `peer_grid`'s (at most PEER_MAX_BLOCKS blocks).
        unsafe {
            device::launch_kernel(
                &self.ctx,
                function,
                peer_grid(dtype, longest, args.max_blocks),
                PEER_BLOCK_THREADS,
                stream.raw(),
                &mut params,
            )
        }
    }
}

/// The arguments of one rank's two-shot kernel ([`KernelModule::twoshot`]). Addresses are CUDA
/// device addresses (UVA); entries `>= world` are ignored.
#[derive(Clone, Copy, Debug)]
pub struct TwoShotArgs {
    /// Every rank's source (its input out of place, its output in place), by rank.
    pub srcs: [u64; PEER_MAX_RANKS],
    /// Every rank's output, by rank.
    pub outs: [u64; PEER_MAX_RANKS],
    /// Every rank's flag array ([`PEER_FLAG_BYTES`] bytes on that rank's device), by rank.
    ///
    /// [`PEER_FLAG_BYTES`]: super::PEER_FLAG_BYTES
    pub flags: [u64; PEER_MAX_RANKS],
    /// Segment q is elements `seg_off[q]..seg_off[q] + seg_len[q]`; rank q reduces it.
    pub seg_off: [u64; PEER_MAX_RANKS],
    /// Segment q's length in elements, by rank (see `seg_off`).
    pub seg_len: [u64; PEER_MAX_RANKS],
    /// Ranks taking part, 2..=[`PEER_MAX_RANKS`].
    pub world: u32,
    /// This call's rank, `< world`.
    pub rank: u32,
    /// Elements per rank (the segments tile `0..count`).
    pub count: u64,
    /// How long after its start the kernel gives up waiting at a barrier, in nanoseconds.
    pub timeout_ns: u64,
    /// Where the kernel stores a nonzero code on failure (`PEER_ERR_START`, `_MIDDLE`, `_END`,
    /// `_LAUNCH`).
    pub error: u64,
    /// At most this many blocks (0: no cap beyond [`PEER_MAX_BLOCKS`]), as for the one-shot.
    ///
    /// [`PEER_MAX_BLOCKS`]: super::PEER_MAX_BLOCKS
    pub max_blocks: u32,
    /// The call gate the kernel passes before its start barrier ([`CallGate::NONE`]: none).
    pub gate: CallGate,
}

/// The kernel parameter `rr_twoshot_segs` of `cuda/peer_kernels.cuh`, byte for byte: every rank's
/// output, then the segments' offsets and lengths in elements.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct TwoShotSegs {
    out: [u64; PEER_MAX_RANKS],
    off: [u64; PEER_MAX_RANKS],
    len: [u64; PEER_MAX_RANKS],
}

/// The checks of [`KernelModule::twoshot`] that need no GPU (see there).
fn validate_twoshot(dtype: DType, args: &TwoShotArgs) -> Result<()> {
    const KERNEL: &str = "two-shot";
    let world = args.world as usize;
    let bad = |why: String| Err(Error::InvalidArgument(format!("{KERNEL} {why}")));
    check_world_and_rank(KERNEL, args.world, args.rank)?;
    let mut end = 0u64;
    for q in 0..world {
        if args.seg_off[q] != end {
            return bad(format!(
                "segment {q} starts at {} where segment {} ended ({end})",
                args.seg_off[q],
                q.saturating_sub(1)
            ));
        }
        end = end.saturating_add(args.seg_len[q]);
    }
    if end != args.count {
        return bad(format!(
            "segments end at {end}, not at count = {}",
            args.count
        ));
    }
    for r in 0..world {
        check_aligned(dtype, ArgName::at("srcs", r), args.srcs[r])?;
        check_aligned(dtype, ArgName::at("outs", r), args.outs[r])?;
        check_word_aligned(ArgName::at("flags", r), args.flags[r])?;
    }
    check_word_aligned("error", args.error)?;
    if args.count == 0 {
        return Ok(());
    }
    check_not_null(
        KERNEL,
        args.count,
        std::iter::once((ArgName::plain("error"), args.error))
            .chain((0..world).map(|r| (ArgName::at("srcs", r), args.srcs[r])))
            .chain((0..world).map(|r| (ArgName::at("outs", r), args.outs[r])))
            .chain((0..world).map(|r| (ArgName::at("flags", r), args.flags[r]))),
    )?;
    let bytes = span_bytes(dtype, args.count)?;
    let overlaps = |a: u64, b: u64| a < b.saturating_add(bytes) && b < a.saturating_add(bytes);
    for r in 0..world {
        for q in 0..world {
            if q != r && overlaps(args.outs[r], args.outs[q]) {
                return bad(format!("outs[{r}] overlaps outs[{q}]"));
            }
            let in_place = args.srcs[q] == args.outs[q];
            if overlaps(args.outs[r], args.srcs[q]) && !(in_place && q == r) {
                return bad(format!(
                    "outs[{r}] = {:#x} overlaps srcs[{q}] = {:#x}: a source is either its own \
                     rank's output (in place) or disjoint from every output",
                    args.outs[r], args.srcs[q]
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twoshot_segs_is_the_kernel_parameter() {
        // struct rr_twoshot_segs { void* out[8]; rr_ull off[8]; rr_ull len[8]; }.
        assert_eq!(size_of::<TwoShotSegs>(), 192);
        assert_eq!(std::mem::offset_of!(TwoShotSegs, off), 64);
        assert_eq!(std::mem::offset_of!(TwoShotSegs, len), 128);
    }

    fn twoshot_args(in_place: bool) -> TwoShotArgs {
        let mut args = TwoShotArgs {
            srcs: [0; 8],
            outs: [0; 8],
            flags: [0; 8],
            seg_off: [0; 8],
            seg_len: [0; 8],
            world: 2,
            rank: 1,
            count: 100,
            timeout_ns: 1_000_000,
            error: 0x9000,
            max_blocks: 0,
            gate: CallGate::NONE,
        };
        args.outs[..2].copy_from_slice(&[0x10_0000, 0x20_0000]);
        let srcs = if in_place {
            [0x10_0000, 0x20_0000]
        } else {
            [0x30_0000, 0x40_0000]
        };
        args.srcs[..2].copy_from_slice(&srcs);
        args.flags[..2].copy_from_slice(&[0x5000, 0x6000]);
        args.seg_off[..2].copy_from_slice(&[0, 52]);
        args.seg_len[..2].copy_from_slice(&[52, 48]);
        args
    }

    #[test]
    fn twoshot_arguments_are_validated() {
        let why = |args: &TwoShotArgs| match validate_twoshot(DType::F32, args) {
            Err(Error::InvalidArgument(why)) => why,
            other => panic!("not refused: {other:?}"),
        };
        validate_twoshot(DType::F32, &twoshot_args(true)).unwrap();
        validate_twoshot(DType::F32, &twoshot_args(false)).unwrap();
        let mut gap = twoshot_args(true);
        gap.seg_off[1] = 53;
        assert!(
            why(&gap).contains("segment 1 starts at 53"),
            "{}",
            why(&gap)
        );
        let mut short = twoshot_args(true);
        short.seg_len[1] = 47;
        assert!(why(&short).contains("not at count"), "{}", why(&short));
        let mut crossed = twoshot_args(false);
        crossed.srcs[0] = crossed.outs[1];
        assert!(
            why(&crossed).contains("overlaps srcs[0]"),
            "{}",
            why(&crossed)
        );
        let mut shared = twoshot_args(true);
        shared.outs[1] = shared.outs[0] + 8;
        assert!(why(&shared).contains("overlaps outs"), "{}", why(&shared));
        let mut lonely = twoshot_args(true);
        lonely.world = 1;
        lonely.rank = 0;
        assert!(why(&lonely).contains("world = 1"), "{}", why(&lonely));
        let mut null = twoshot_args(true);
        null.flags[1] = 0;
        assert!(why(&null).contains("flags[1] is null"), "{}", why(&null));
    }
}
