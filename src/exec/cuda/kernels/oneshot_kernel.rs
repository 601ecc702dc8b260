//! The one-shot all-reduce kernel: one kernel per rank that reads every rank's input directly
//! (peer access) between a start and an end barrier of flags written into peer memory, and folds
//! them in rank order into its output. Its arguments ([`OneShotArgs`]), the checks made before a
//! launch and the launch ([`KernelModule::oneshot`]), through the pieces every peer kernel shares
//! (`peer_launch.rs`); the protocol is described in `cuda/peer.cuh`, beside the kernels.
//!
//! Invariant: nothing is enqueued unless the arguments pass every check the kernel relies on
//! (world and rank, alignment, no null address, no output overlapping an input), made on the
//! host by `validate_oneshot`, which the unit tests drive without a GPU.

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
    /// Enqueues this rank's part of a one-shot all-reduce on `stream`: one kernel that waits
    /// at a start barrier until every rank's kernel of this call has started, then writes
    /// `dst[i] = src[0][i] ⊕ src[1][i] ⊕ … ⊕ src[world − 1][i]` for `i < count` (folded in rank
    /// order on every rank, so float results are bit-identical across ranks; ⊕ is
    /// `op.combine_op()`: `Avg` sums here and the caller then runs [`KernelModule::scale`] on `dst`),
    /// and ends at an end barrier after which no rank reads this rank's input any more. The grid
    /// is [`peer_blocks`]`(dtype, count)` blocks of 512 threads. Returns once enqueued;
    /// errors are those of the checks below and of the launch. Barrier timeouts are reported
    /// by the kernel in `*args.error`, not here.
    ///
    /// Checked before anything is enqueued ([`Error::InvalidArgument`] unless said otherwise):
    /// `stream` belongs to this context; `args.world` in `2..=PEER_MAX_RANKS` and
    /// `args.rank < args.world`; `args.dst` and `args.srcs[..world]` aligned to
    /// `dtype.size_bytes()`, `args.flags[..world]` and `args.error` aligned to 4; then, when
    /// `args.count > 0`: none of those addresses is null, `count × dtype.size_bytes()` fits
    /// ([`Error::SizeOverflow`]), and `dst`'s range overlaps no `srcs[r]` range (addresses are
    /// UVA, unique across devices). `count == 0` enqueues nothing.
    ///
    /// # Safety
    ///
    /// The call is one of `args.world` calls, one per rank `0..world`, each on its own device,
    /// with the same `dtype`, `op.combine_op()`, `count`, `srcs[..world]` and
    /// `flags[..world]`; all of them must be able to run at the same time (no rank's kernel
    /// may be ordered after another rank's kernel of the same call, or the barriers time out).
    /// Until this rank's kernel has completed on `stream` (and, for the inputs and flags, until
    /// every rank's kernel of this call has completed):
    /// - `srcs[r]` for `r < world` is rank `r`'s input, a device address readable from this
    ///   context (`srcs[rank]` this device's; the others a peer's, with peer access enabled from
    ///   this context and, for stream-ordered pool memory, pool access granted), valid for
    ///   `count` elements of `dtype`. Rank `r`'s input is written only by work that completes
    ///   before rank `r`'s kernel starts (e.g. earlier on rank `r`'s stream), and not again until
    ///   rank `r`'s kernel has completed (the end barrier makes that the point after which no
    ///   rank reads it);
    /// - `flags[r]` for `r < world` is rank `r`'s flag array: [`PEER_FLAG_BYTES`] bytes of
    ///   device memory on rank `r`'s device, readable and writable from this context (peer
    ///   access), zeroed before the first call and used by no other group of kernels; every call
    ///   on these flags is made by all `world` ranks, and one rank's calls on them run one after
    ///   another (each block advances its epoch in its own rank's array);
    /// - `dst` is device memory writable from this context, valid for `count` elements, disjoint
    ///   from every `srcs[r]` range, and read or written by no other work meanwhile;
    /// - `error` is a 4-byte word writable from this context (the device pointer of host-mapped
    ///   pinned memory, so the host can read it while kernels wait), zero before the call; the
    ///   kernel only ever stores a nonzero code there ([`PEER_ERR_START`](super::PEER_ERR_START),
    ///   [`PEER_ERR_END`](super::PEER_ERR_END): that barrier timed out;
    ///   [`PEER_ERR_LAUNCH`](super::PEER_ERR_LAUNCH): launch outside the kernel's assumptions;
    ///   the module `error_codes`). Every barrier gives up
    ///   once `timeout_ns` have passed since the block started (so the kernel ends within
    ///   `timeout_ns` of its start; 0: at once unless the peer is already there; `u64::MAX`:
    ///   never). After any nonzero code, on any rank, `dst` is undefined on every
    ///   rank, a peer may still be reading this rank's input, and the flags are out of step: no
    ///   further call may use them until every rank's kernels have completed and all flag arrays
    ///   are zeroed again;
    /// - this device has room for the grid's blocks beside whatever else runs on it: a block
    ///   that cannot start holds up its peers' blocks of the same index until it can (or until
    ///   the timeout).
    ///
    /// [`peer_blocks`]: super::peer_blocks
    /// [`PEER_FLAG_BYTES`]: super::PEER_FLAG_BYTES
    pub unsafe fn oneshot(
        &self,
        dtype: DType,
        op: ReduceOp,
        args: &OneShotArgs,
        stream: &Stream,
    ) -> Result<()> {
        self.check_stream(stream)?;
        validate_oneshot(dtype, args)?;
        if args.count == 0 {
            return Ok(());
        }
        let mut shared = PeerParams::of(
            args.world,
            args.rank,
            &args.srcs,
            &args.flags,
            args.timeout_ns,
            args.error,
        );
        let (mut dst, mut count, mut expose_from) = (args.dst, args.count, args.expose_from);
        let mut gate = args.gate;
        let mut params: [*mut c_void; 9] = [
            param(&mut shared.peers),
            param(&mut shared.world),
            param(&mut shared.rank),
            param(&mut dst),
            param(&mut count),
            param(&mut shared.timeout_ns),
            param(&mut shared.error),
            param(&mut expose_from),
            param(&mut gate),
        ];
        let function = &self.oneshot[reduce_index(op, dtype)];
        // SAFETY: the function is rr_oneshot_<op>_<dtype>(rr_peers, unsigned, unsigned, T*,
        // unsigned long long, unsigned long long, unsigned*, const T*, rr_call_gate): `peers`
        // is the #[repr(C)] mirror of rr_peers (two arrays of 8 pointers, 128 bytes), then
        // u32, u32, u64, u64, u64, u64, u64, and `gate` the mirror of rr_call_gate (48 bytes),
        // in parameter order, all outliving the call (the driver
        // copies them at launch); the memory and the other ranks' calls are the caller's
        // contract.
        // Launch: the function was loaded into `self.ctx`, the stream's context
        // (`check_stream`), and the grid is `peer_grid`'s (at most PEER_MAX_BLOCKS blocks).
        unsafe {
            device::launch_kernel(
                &self.ctx,
                function,
                peer_grid(dtype, args.count, args.max_blocks),
                PEER_BLOCK_THREADS,
                stream.raw(),
                &mut params,
            )
        }
    }
}

/// The arguments of one rank's one-shot kernel ([`KernelModule::oneshot`]). Addresses are CUDA
/// device addresses (`CUdeviceptr`, UVA); entries `>= world` of `srcs` and `flags` are ignored.
#[derive(Clone, Copy, Debug)]
pub struct OneShotArgs {
    /// Every rank's input, by rank.
    pub srcs: [u64; PEER_MAX_RANKS],
    /// Every rank's flag array ([`PEER_FLAG_BYTES`] bytes on that rank's device), by rank.
    ///
    /// [`PEER_FLAG_BYTES`]: super::PEER_FLAG_BYTES
    pub flags: [u64; PEER_MAX_RANKS],
    /// Ranks taking part, 2..=[`PEER_MAX_RANKS`].
    pub world: u32,
    /// This call's rank, `< world`.
    pub rank: u32,
    /// This rank's output: `count` elements, disjoint from every input.
    pub dst: u64,
    /// Elements per rank.
    pub count: u64,
    /// How long after its start the kernel gives up waiting at a barrier, in nanoseconds.
    pub timeout_ns: u64,
    /// Where the kernel stores a nonzero code on failure (`PEER_ERR_START`, `PEER_ERR_END`: that
    /// barrier timed out; `PEER_ERR_LAUNCH`: a launch it cannot accept).
    pub error: u64,
    /// In place: the rank's in-place buffer (== `dst`), which each block copies, its own
    /// indices, into `srcs[rank]` (the exposed buffer) before the start barrier. 0 otherwise.
    /// Anything else is refused: blocks would copy from addresses other blocks write.
    pub expose_from: u64,
    /// At most this many blocks (0: no cap beyond [`PEER_MAX_BLOCKS`]). Every block of every
    /// rank must be resident at once (a block spins for its partners), so the caller passes the
    /// smallest SM count of the ranks' GPUs (one block fits per SM), the same on every rank.
    ///
    /// [`PEER_MAX_BLOCKS`]: super::PEER_MAX_BLOCKS
    pub max_blocks: u32,
    /// The call gate the kernel passes before its start barrier ([`CallGate::NONE`]: none).
    pub gate: CallGate,
}

/// The checks of [`KernelModule::oneshot`] that need no GPU (see there).
fn validate_oneshot(dtype: DType, args: &OneShotArgs) -> Result<()> {
    const KERNEL: &str = "one-shot";
    let world = args.world as usize;
    check_world_and_rank(KERNEL, args.world, args.rank)?;
    check_aligned(dtype, "dst", args.dst)?;
    for r in 0..world {
        check_aligned(dtype, ArgName::at("srcs", r), args.srcs[r])?;
        check_word_aligned(ArgName::at("flags", r), args.flags[r])?;
    }
    check_word_aligned("error", args.error)?;
    if args.count == 0 {
        return Ok(());
    }

    let named = [("dst", args.dst), ("error", args.error)];
    check_not_null(
        KERNEL,
        args.count,
        named
            .into_iter()
            .map(|(name, address)| (ArgName::plain(name), address))
            .chain((0..world).map(|r| (ArgName::at("srcs", r), args.srcs[r])))
            .chain((0..world).map(|r| (ArgName::at("flags", r), args.flags[r]))),
    )?;
    let bytes = span_bytes(dtype, args.count)?;
    let overlaps = |a: u64, b: u64| a < b.saturating_add(bytes) && b < a.saturating_add(bytes);
    if let Some(r) = (0..world).find(|&r| overlaps(args.dst, args.srcs[r])) {
        return Err(Error::InvalidArgument(format!(
            "one-shot dst = {:#x} overlaps srcs[{r}] = {:#x} ({bytes} bytes each): the one-shot \
             is out of place only",
            args.dst, args.srcs[r]
        )));
    }
    // In place the exposure's source is dst itself; staged out of place it is the input,
    // which the kernel copies before any block writes dst, so it must lie apart from dst.
    if args.expose_from != 0 && args.expose_from != args.dst && overlaps(args.expose_from, args.dst)
    {
        return Err(Error::InvalidArgument(format!(
            "one-shot expose_from = {:#x} must be dst = {:#x} (the in-place buffer) or lie \
             apart from it (the staged one-shot's input)",
            args.expose_from, args.dst
        )));
    }
    if args.expose_from != 0 {
        check_aligned(dtype, "expose_from", args.expose_from)?;
        if let Some(r) = (0..world).find(|&r| overlaps(args.expose_from, args.srcs[r])) {
            return Err(Error::InvalidArgument(format!(
                "one-shot expose_from = {:#x} overlaps srcs[{r}] = {:#x}: it is copied into \
                 srcs[rank], which must be a separate buffer",
                args.expose_from, args.srcs[r]
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Arguments for rank 0 of 2 that pass validation: f32 inputs 64 MiB apart.
    fn oneshot_args() -> OneShotArgs {
        let base = 0x7f00_0000_0000_u64;
        OneShotArgs {
            srcs: std::array::from_fn(|r| base + ((r as u64) << 26)),
            flags: std::array::from_fn(|r| base + (1 << 32) + ((r as u64) << 16)),
            world: 2,
            rank: 0,
            dst: base + (1 << 33),
            count: 1 << 20,
            timeout_ns: 1_000_000_000,
            error: base + (1 << 34),
            expose_from: 0,
            max_blocks: 0,
            gate: CallGate::NONE,
        }
    }

    fn invalid(dtype: DType, args: &OneShotArgs) -> String {
        match validate_oneshot(dtype, args) {
            Err(Error::InvalidArgument(why)) => why,
            other => panic!("expected InvalidArgument for {args:?}, got {other:?}"),
        }
    }

    #[test]
    fn oneshot_arguments_are_validated() {
        let ok = oneshot_args();
        assert_eq!(validate_oneshot(DType::F32, &ok), Ok(()));
        for world in 2..=PEER_MAX_RANKS as u32 {
            for rank in 0..world {
                let args = OneShotArgs { world, rank, ..ok };
                assert_eq!(
                    validate_oneshot(DType::F32, &args),
                    Ok(()),
                    "{world} {rank}"
                );
            }
        }

        for world in [0, 1, 9, u32::MAX] {
            let why = invalid(DType::F32, &OneShotArgs { world, ..ok });
            assert!(why.contains(&format!("world = {world}")), "{why}");
        }
        for (world, rank) in [(2, 2), (2, 7), (8, 8)] {
            let why = invalid(DType::F32, &OneShotArgs { world, rank, ..ok });
            assert!(why.contains(&format!("rank = {rank}")), "{why}");
        }

        let mut args = ok;
        args.srcs[1] += 2;
        assert!(invalid(DType::F32, &args).contains("srcs[1]"));
        assert_eq!(validate_oneshot(DType::F16, &args), Ok(()));
        // Entries at or above world are not looked at.
        let mut args = ok;
        args.srcs[2] = 0x3;
        args.flags[5] = 0;
        assert_eq!(validate_oneshot(DType::F64, &args), Ok(()));
        let mut args = ok;
        args.flags[1] += 2;
        assert!(invalid(DType::U8, &args).contains("flags[1]"));
        assert!(invalid(
            DType::F32,
            &OneShotArgs {
                error: ok.error + 1,
                ..ok
            }
        )
        .contains("error"));
        // The in-place exposure: its source may be dst, never an exposed buffer, and aligned.
        validate_oneshot(
            DType::F32,
            &OneShotArgs {
                expose_from: ok.dst,
                ..ok
            },
        )
        .unwrap();
        // Staged out of place: the input, apart from dst and every source.
        let input = ok.dst + (1 << 30);
        validate_oneshot(
            DType::F32,
            &OneShotArgs {
                expose_from: input,
                ..ok
            },
        )
        .unwrap();
        for (bad, why) in [
            (ok.srcs[1] + 64, "overlaps srcs[1]"),
            (ok.dst + 2, "must be dst"),
            (ok.dst + 4, "must be dst"),
            (input + 2, "expose_from"),
        ] {
            let got = invalid(
                DType::F32,
                &OneShotArgs {
                    expose_from: bad,
                    ..ok
                },
            );
            assert!(got.contains(why), "{bad:#x}: {got}");
        }

        // Null pointers are refused only when there is something to do.
        let mut args = ok;
        args.flags[0] = 0;
        assert!(invalid(DType::F32, &args).contains("flags[0] is null"));
        args.count = 0;
        assert_eq!(validate_oneshot(DType::F32, &args), Ok(()));

        // Out of place only: dst may touch an input's end but not overlap it.
        let bytes = ok.count * 4;
        let args = OneShotArgs {
            dst: ok.srcs[1] + bytes,
            ..ok
        };
        assert_eq!(validate_oneshot(DType::F32, &args), Ok(()));
        let args = OneShotArgs {
            dst: ok.srcs[1] + bytes - 4,
            ..ok
        };
        assert!(invalid(DType::F32, &args).contains("overlaps srcs[1]"));
        let args = OneShotArgs {
            dst: ok.srcs[0] - bytes + 4,
            ..ok
        };
        assert!(invalid(DType::F32, &args).contains("overlaps srcs[0]"));

        let args = OneShotArgs {
            count: u64::MAX / 2,
            ..ok
        };
        assert!(matches!(
            validate_oneshot(DType::F32, &args),
            Err(Error::SizeOverflow {
                dtype: DType::F32,
                ..
            })
        ));
    }
}
