//! The peer kernels: the one-shot and the two-shot all-reduce, one kernel per rank that reads
//! the other ranks' memory directly (peer access) and meets their kernels at flag barriers.
//! Their arguments ([`OneShotArgs`], [`TwoShotArgs`]), the checks made before a launch, the grid
//! ([`peer_blocks`]) and the launch itself; the protocol (flag layout, epochs, memory order,
//! timeouts) is described in `cuda/peer.cuh`, beside the kernels. The steps kernel (`steps.rs`)
//! and the LL one-shot (`ll.rs`) launch through the same pieces: `PeerParams`, `launch_peer`
//! and the address checks at the end of this file.
//!
//! Invariant: the constants here equal the `RR_PEER_*` defines of `cuda/peer.cuh` (a unit test
//! reads them from the source), and [`PeerPointers`] and [`TwoShotSegs`] are byte-for-byte
//! mirrors of the kernel parameters `rr_peers` and `rr_twoshot_segs`.

use std::ffi::c_void;

use cudarc::driver::CudaFunction;

use super::{check_aligned, param, reduce_index, KernelModule};
use crate::device::Stream;
use crate::element::{DType, ReduceOp};
use crate::error::{Error, Result};

/// Most ranks one peer kernel serves (`RR_PEER_MAX_RANKS` in `cuda/peer.cuh`).
pub const PEER_MAX_RANKS: usize = 8;
/// Most blocks of a peer kernel's grid (`RR_PEER_MAX_BLOCKS`): each block has its own flag words.
pub const PEER_MAX_BLOCKS: u32 = 128;
/// Barrier phases of the flag array (`RR_PEER_PHASES`), by a barrier's place in its kernel: the
/// first (both kernels' start), the second (the one-shot's end, the two-shot's middle) and the
/// third (the two-shot's end).
const PEER_PHASES: usize = 3;
/// Where the per-block epochs start in a rank's flag array, in words (`RR_PEER_EPOCH_BASE`):
/// after the barrier words, 3 phases × PEER_MAX_BLOCKS × PEER_MAX_RANKS.
const PEER_EPOCH_BASE: usize = PEER_PHASES * PEER_MAX_BLOCKS as usize * PEER_MAX_RANKS;
/// Bytes of one rank's flag array: the barrier words, then one epoch word per block, which the
/// block advances on the device at the start of every kernel (so nothing call-specific is in a
/// launch, and a captured launch replays correctly).
pub const PEER_FLAG_BYTES: usize = (PEER_EPOCH_BASE + PEER_MAX_BLOCKS as usize) * size_of::<u32>();
/// Threads per block of the peer kernels (`RR_PEER_THREADS`, their `__launch_bounds__`).
const PEER_BLOCK_THREADS: u32 = 512;
/// Bytes of one rank's input per peer-kernel block: a block moves 8 KiB per source per unrolled
/// load (512 threads × 16 B), 32 KiB per loop iteration (`RR_PEER_UNROLL` = 4).
const PEER_BYTES_PER_BLOCK: u64 = 32 << 10;

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
        let mut params: [*mut c_void; 8] = [
            param(&mut shared.peers),
            param(&mut shared.world),
            param(&mut shared.rank),
            param(&mut dst),
            param(&mut count),
            param(&mut shared.timeout_ns),
            param(&mut shared.error),
            param(&mut expose_from),
        ];
        let function = &self.oneshot[reduce_index(op, dtype)];
        // SAFETY: the function is rr_oneshot_<op>_<dtype>(rr_peers, unsigned, unsigned, T*,
        // unsigned long long, unsigned long long, unsigned*, const T*): `peers` is the
        // #[repr(C)] mirror of rr_peers (two arrays of 8 pointers, 128 bytes), then u32, u32,
        // u64, u64, u64, u64, u64 in parameter order, all outliving the call (the driver
        // copies them at launch); the memory and the other ranks' calls are the caller's
        // contract.
        unsafe {
            self.launch_peer(
                stream,
                function,
                dtype,
                args.count,
                args.max_blocks,
                &mut params,
            )
        }
    }

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
        let mut params: [*mut c_void; 6] = [
            param(&mut shared.peers),
            param(&mut segs),
            param(&mut shared.world),
            param(&mut shared.rank),
            param(&mut shared.timeout_ns),
            param(&mut shared.error),
        ];
        let function = &self.twoshot[reduce_index(op, dtype)];
        let longest = args.seg_len[..world].iter().copied().max().unwrap_or(0);
        // SAFETY: the function is rr_twoshot_<op>_<dtype>(rr_peers, rr_twoshot_segs, unsigned,
        // unsigned, unsigned long long, unsigned*): `peers` and `segs` are the
        // #[repr(C)] mirrors of those structs (128 and 192 bytes), then u32, u32, u64, u64
        // in parameter order, all outliving the call (the driver copies them at launch); the
        // memory and the other ranks' calls are the caller's contract.
        unsafe {
            self.launch_peer(
                stream,
                function,
                dtype,
                longest,
                args.max_blocks,
                &mut params,
            )
        }
    }

    /// Launches a peer kernel on `stream` with a grid of [`peer_blocks`]`(dtype, grid_count)`
    /// blocks (at most `max_blocks` when that is nonzero) of [`PEER_BLOCK_THREADS`] threads.
    ///
    /// # Safety
    ///
    /// `params` points at one value per parameter of `function`, of its parameter types, and
    /// the memory and the other ranks' calls satisfy the kernel's contract (see `oneshot` /
    /// `twoshot`). The grid is within the kernels' limits: at most [`PEER_MAX_BLOCKS`] blocks
    /// of [`PEER_BLOCK_THREADS`].
    pub(super) unsafe fn launch_peer(
        &self,
        stream: &Stream,
        function: &CudaFunction,
        dtype: DType,
        grid_count: u64,
        max_blocks: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let blocks = peer_blocks(dtype, usize::try_from(grid_count).unwrap_or(usize::MAX));
        let blocks = match max_blocks {
            0 => blocks,
            cap => blocks.min(cap),
        };
        debug_assert!((1..=PEER_MAX_BLOCKS).contains(&blocks));
        // SAFETY: the caller's contract, passed on; the grid is at most PEER_MAX_BLOCKS blocks
        // of PEER_BLOCK_THREADS, the kernels' limits.
        unsafe { self.launch_grid(stream, function, blocks, PEER_BLOCK_THREADS, params) }
    }
}

/// The arguments of one rank's one-shot kernel ([`KernelModule::oneshot`]). Addresses are CUDA
/// device addresses (`CUdeviceptr`, UVA); entries `>= world` of `srcs` and `flags` are ignored.
#[derive(Clone, Copy, Debug)]
pub struct OneShotArgs {
    /// Every rank's input, by rank.
    pub srcs: [u64; PEER_MAX_RANKS],
    /// Every rank's flag array ([`PEER_FLAG_BYTES`] bytes on that rank's device), by rank.
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
    pub max_blocks: u32,
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
    pub max_blocks: u32,
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

/// The kernel parameter `rr_peers` of `cuda/peer.cuh`, byte for byte: two arrays of
/// `RR_PEER_MAX_RANKS` pointers.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(super) struct PeerPointers {
    src: [u64; PEER_MAX_RANKS],
    flags: [u64; PEER_MAX_RANKS],
}

impl PeerPointers {
    /// The first `world` entries of `srcs` and `flags` (validated: `world <= PEER_MAX_RANKS`);
    /// the kernel reads entries < world only, the rest are zeroed rather than passed on.
    fn of(world: u32, srcs: &[u64; PEER_MAX_RANKS], flags: &[u64; PEER_MAX_RANKS]) -> Self {
        let world = world as usize;
        let mut peers = PeerPointers {
            src: [0; PEER_MAX_RANKS],
            flags: [0; PEER_MAX_RANKS],
        };
        peers.src[..world].copy_from_slice(&srcs[..world]);
        peers.flags[..world].copy_from_slice(&flags[..world]);
        peers
    }
}

/// The parameters both peer kernels take, owned so that a launch can point at them: the
/// [`PeerPointers`] and the scalars `world`, `rank`, `timeout_ns` and `error`.
pub(super) struct PeerParams {
    pub(super) peers: PeerPointers,
    pub(super) world: u32,
    pub(super) rank: u32,
    pub(super) timeout_ns: u64,
    pub(super) error: u64,
}

impl PeerParams {
    pub(super) fn of(
        world: u32,
        rank: u32,
        srcs: &[u64; PEER_MAX_RANKS],
        flags: &[u64; PEER_MAX_RANKS],
        timeout_ns: u64,
        error: u64,
    ) -> Self {
        PeerParams {
            peers: PeerPointers::of(world, srcs, flags),
            world,
            rank,
            timeout_ns,
            error,
        }
    }
}

/// Blocks of a peer kernel's grid for `count` elements of `dtype`: a function of (dtype, count)
/// only, so every rank computes the same grid (the two-shot passes its longest segment); between 1 and [`PEER_MAX_BLOCKS`].
///
/// One block per 32 KiB of one rank's input (one loop iteration of 4 × 16 B per thread per
/// source), so small messages finish in one round of loads per source and large ones (from
/// 4 MiB) use 128 blocks, enough to keep NVLink busy, while the whole grid (one block per SM:
/// up to 128 registers a thread) fits on an H200's 132 SMs, so all blocks of every rank are
/// resident together.
pub fn peer_blocks(dtype: DType, count: usize) -> u32 {
    let bytes = (count as u64).saturating_mul(dtype.size_bytes() as u64);
    bytes
        .div_ceil(PEER_BYTES_PER_BLOCK)
        .clamp(1, u64::from(PEER_MAX_BLOCKS)) as u32
}

/// The checks of [`KernelModule::oneshot`] that need no GPU (see there).
fn validate_oneshot(dtype: DType, args: &OneShotArgs) -> Result<()> {
    const KERNEL: &str = "one-shot";
    let world = args.world as usize;
    check_world_and_rank(KERNEL, args.world, args.rank)?;
    check_aligned(dtype, "dst", args.dst)?;
    for r in 0..world {
        check_aligned(dtype, &format!("srcs[{r}]"), args.srcs[r])?;
        check_word_aligned(&format!("flags[{r}]"), args.flags[r])?;
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
            .map(|(name, address)| (name.to_string(), address))
            .chain((0..world).map(|r| (format!("srcs[{r}]"), args.srcs[r])))
            .chain((0..world).map(|r| (format!("flags[{r}]"), args.flags[r]))),
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
        check_aligned(dtype, &format!("srcs[{r}]"), args.srcs[r])?;
        check_aligned(dtype, &format!("outs[{r}]"), args.outs[r])?;
        check_word_aligned(&format!("flags[{r}]"), args.flags[r])?;
    }
    check_word_aligned("error", args.error)?;
    if args.count == 0 {
        return Ok(());
    }
    check_not_null(
        KERNEL,
        args.count,
        std::iter::once(("error".to_string(), args.error))
            .chain((0..world).map(|r| (format!("srcs[{r}]"), args.srcs[r])))
            .chain((0..world).map(|r| (format!("outs[{r}]"), args.outs[r])))
            .chain((0..world).map(|r| (format!("flags[{r}]"), args.flags[r]))),
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

/// The first check of every peer kernel: `world` in 2..=[`PEER_MAX_RANKS`], `rank` below it.
pub(super) fn check_world_and_rank(kernel: &str, world: u32, rank: u32) -> Result<()> {
    if !(2..=PEER_MAX_RANKS).contains(&(world as usize)) {
        return Err(Error::InvalidArgument(format!(
            "{kernel} world = {world}: the kernel serves 2 to {PEER_MAX_RANKS} ranks"
        )));
    }
    if rank >= world {
        return Err(Error::InvalidArgument(format!(
            "{kernel} rank = {rank} is not below world = {world}"
        )));
    }
    Ok(())
}

/// Refuses the first null address among the `(name, address)` pairs of a launch of `count`
/// elements (made only when there is something to do).
pub(super) fn check_not_null(
    kernel: &str,
    count: u64,
    mut named: impl Iterator<Item = (String, u64)>,
) -> Result<()> {
    match named.find(|&(_, address)| address == 0) {
        Some((name, _)) => Err(Error::InvalidArgument(format!(
            "{kernel} {name} is null for {count} elements"
        ))),
        None => Ok(()),
    }
}

/// Bytes of `count` elements of `dtype`, or [`Error::SizeOverflow`] when that does not fit a
/// `usize`.
pub(super) fn span_bytes(dtype: DType, count: u64) -> Result<u64> {
    count
        .checked_mul(dtype.size_bytes() as u64)
        .filter(|&b| usize::try_from(b).is_ok())
        .ok_or(Error::SizeOverflow {
            count: usize::try_from(count).unwrap_or(usize::MAX),
            dtype,
        })
}

pub(super) fn check_word_aligned(name: &str, address: u64) -> Result<()> {
    if address % 4 == 0 {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{name} = {address:#x} is not aligned to 4 bytes, the size of a flag word"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::super::VECTOR_BYTES;
    use super::*;

    use super::super::source_define as define;

    #[test]
    fn peer_constants_match_the_source() {
        assert_eq!(define("RR_PEER_MAX_RANKS"), PEER_MAX_RANKS as u64);
        assert_eq!(define("RR_PEER_MAX_BLOCKS"), u64::from(PEER_MAX_BLOCKS));
        assert_eq!(define("RR_PEER_THREADS"), u64::from(PEER_BLOCK_THREADS));
        // One block iteration: threads × 16 B × unroll.
        assert_eq!(
            u64::from(PEER_BLOCK_THREADS) * VECTOR_BYTES as u64 * define("RR_PEER_UNROLL"),
            PEER_BYTES_PER_BLOCK
        );
        assert_eq!(define("RR_PEER_PHASES"), PEER_PHASES as u64);
        assert_eq!(define("RR_PEER_EPOCH_BASE"), PEER_EPOCH_BASE as u64);
        assert_eq!(define("RR_PEER_FLAG_WORDS") * 4, PEER_FLAG_BYTES as u64);
        // The last barrier word, (3 * MAX_BLOCKS - 1) * MAX_RANKS + MAX_RANKS - 1, is just below
        // the epochs, and the last block's epoch is the array's last word.
        let last_word = (PEER_MAX_BLOCKS as usize * 3 - 1) * PEER_MAX_RANKS + PEER_MAX_RANKS - 1;
        assert_eq!(last_word + 1, PEER_EPOCH_BASE);
        assert_eq!(
            (PEER_EPOCH_BASE + PEER_MAX_BLOCKS as usize) * 4,
            PEER_FLAG_BYTES
        );
    }

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

    #[test]
    fn peer_pointers_is_the_kernel_parameter() {
        // struct rr_peers { const void* src[8]; unsigned* flags[8]; } on a 64-bit device.
        assert_eq!(size_of::<PeerPointers>(), 128);
        assert_eq!(std::mem::align_of::<PeerPointers>(), 8);
        assert_eq!(std::mem::offset_of!(PeerPointers, src), 0);
        assert_eq!(std::mem::offset_of!(PeerPointers, flags), 64);
    }

    #[test]
    fn peer_grid_is_bounded_and_monotonic() {
        // 32 KiB of one rank's input per block.
        assert_eq!(peer_blocks(DType::F32, 0), 1);
        assert_eq!(peer_blocks(DType::F32, 1), 1);
        assert_eq!(peer_blocks(DType::F32, 8 << 10), 1);
        assert_eq!(peer_blocks(DType::F32, (8 << 10) + 1), 2);
        assert_eq!(peer_blocks(DType::U8, 1 << 20), 32);
        assert_eq!(peer_blocks(DType::F64, 1 << 20), 128);
        assert_eq!(peer_blocks(DType::F16, usize::MAX), PEER_MAX_BLOCKS);
        for dtype in DType::ALL {
            let mut previous = 1;
            for shift in 0..40 {
                for count in [(1usize << shift) - 1, 1 << shift, (1 << shift) + 1] {
                    let blocks = peer_blocks(dtype, count);
                    assert!((1..=PEER_MAX_BLOCKS).contains(&blocks), "{dtype} {count}");
                    assert!(blocks >= previous, "{dtype} {count}: {blocks} < {previous}");
                    previous = blocks;
                }
            }
            assert_eq!(previous, PEER_MAX_BLOCKS);
        }
    }

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
