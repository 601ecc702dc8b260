//! The LL ("low-latency") one-shot kernel: the one-shot all-reduce of small messages, one kernel
//! per rank that WRITES its input into every peer's receive buffer as self-validating 8-byte
//! words (4 bytes of data, 4 bytes of the block's epoch) and waits only on its own buffer — no
//! barrier, one NVLink crossing per call. Its arguments ([`LlArgs`]), the checks made before a
//! launch, the grid ([`ll_blocks`]), the receive buffer's size ([`ll_recv_bytes`]), the size
//! rule ([`LL_MAX_BYTES`], [`ll_fits`]) and the launch; the protocol (word format, buffer layout,
//! why two sets by epoch parity need no barrier, memory order) is described in `cuda/ll.cuh`,
//! beside the kernel. The executor runs it only when [`crate::CudaConfig::low_latency`] is on.
//!
//! Invariant: the constants here equal the `RR_LL_*` defines of `cuda/ll.cuh` (a unit test reads
//! them from the source), and [`LlPeers`] is a byte-for-byte mirror of the kernel parameter
//! `rr_ll_peers`.

use std::ffi::c_void;

use super::peer_launch::{
    check_not_null, check_word_aligned, check_world_and_rank, span_bytes, ArgName, CallGate,
};
use super::{check_aligned, param, reduce_index, KernelModule, PEER_MAX_RANKS};
use crate::device::{self, Stream};
use crate::element::{DType, ReduceOp};
use crate::error::{Error, Result};

/// The largest message, in bytes per rank, that a one-shot call runs through the LL kernel
/// instead of the read one-shot when [`crate::CudaConfig::low_latency`] is on
/// (`RR_LL_MAX_BYTES`): the executor's size rule ([`ll_fits`]) and the size of every receive
/// buffer ([`ll_recv_bytes`]). Its one home; [`crate::exec::algorithm`] links here. The LL
/// kernel moves twice the bytes (every data word carries a flag word) but crosses NVLink once
/// instead of three times in a row, so it should win while latency dominates: small messages,
/// where the read one-shot's ~7 µs (captured, 2×H200) are barriers and round trips, not
/// bandwidth. Not yet measured on two GPUs, which is why it is opt-in.
pub const LL_MAX_BYTES: usize = 64 << 10;
/// Threads per block of the LL kernel (`RR_LL_THREADS`, its `__launch_bounds__`).
const LL_BLOCK_THREADS: u32 = 512;
/// Data bytes one thread carries (`RR_LL_CHUNK_BYTES`): two LL words of 4 data bytes each.
const LL_CHUNK_BYTES: usize = 8;
/// Data bytes per block (`RR_LL_BLOCK_BYTES`): one chunk per thread.
const LL_BLOCK_BYTES: usize = LL_BLOCK_THREADS as usize * LL_CHUNK_BYTES;
/// Most blocks of the grid (`RR_LL_MAX_BLOCKS`): each block has its own region of every receive
/// buffer and its own epoch word (the peer kernels' per-block epochs, so at most
/// [`super::PEER_MAX_BLOCKS`]).
const LL_MAX_BLOCKS: u32 = (LL_MAX_BYTES / LL_BLOCK_BYTES) as u32;
/// Receive sets, chosen by the parity of the block's epoch.
const LL_SETS: usize = 2;
/// Bytes an LL word takes per data byte: 4 data bytes travel with a 4-byte flag.
const LL_FLAG_OVERHEAD: usize = 2;

/// Whether a one-shot message of `count` elements of `dtype` is small enough for the LL kernel:
/// at most [`LL_MAX_BYTES`] per rank. A function of (dtype, count) only, so every rank decides
/// alike.
pub fn ll_fits(dtype: DType, count: usize) -> bool {
    count
        .checked_mul(dtype.size_bytes())
        .is_some_and(|bytes| bytes <= LL_MAX_BYTES)
}

/// Blocks of the LL kernel's grid for a message of `bytes` per rank (at most [`LL_MAX_BYTES`]):
/// one per 4 KiB (512 threads × 8 bytes), at least one — what the kernel checks its grid against.
pub fn ll_blocks(bytes: usize) -> u32 {
    bytes.div_ceil(LL_BLOCK_BYTES).max(1) as u32
}

/// Bytes of one rank's receive buffer for `world` ranks: 2 sets × world senders (its own region
/// unused) × [`LL_MAX_BYTES`] × 2 (a flag with every 4 data bytes).
pub fn ll_recv_bytes(world: usize) -> usize {
    LL_SETS * world * LL_MAX_BYTES * LL_FLAG_OVERHEAD
}

impl KernelModule {
    /// Enqueues this rank's part of an LL one-shot all-reduce on `stream`: one kernel that
    /// advances each block's epoch, pushes the rank's input into every peer's receive buffer,
    /// waits until every peer's words of this call are in its own, and writes
    /// `dst[i] = src_0[i] ⊕ … ⊕ src_{world−1}[i]` for `i < count` (`src_r` rank r's `src`, folded
    /// in rank order on every rank — the read one-shot's fold, bit for bit; ⊕ is
    /// `op.combine_op()`: `Avg` sums here and the caller then runs [`KernelModule::scale`]). The
    /// grid is [`ll_blocks`] of the message's bytes, 512 threads a block. Returns once enqueued;
    /// a peer that never arrives is reported by the kernel in `*args.error`
    /// ([`LL_ERR_WAIT`](super::LL_ERR_WAIT); [`PEER_ERR_LAUNCH`](super::PEER_ERR_LAUNCH) for a
    /// launch it cannot accept), not here.
    ///
    /// Checked before anything is enqueued ([`Error::InvalidArgument`] unless said otherwise):
    /// `stream` belongs to this context; `args.world` in `2..=PEER_MAX_RANKS` and `args.rank <
    /// args.world`; `src` and `dst` aligned to `dtype.size_bytes()`, `recvs[..world]` to 16,
    /// `flags` and `error` to 4; then, when `count > 0`: none of them null, `count ×
    /// dtype.size_bytes()` fits ([`Error::SizeOverflow`]) and is at most [`LL_MAX_BYTES`], and
    /// `dst` is `src` (in place) or disjoint from it. `count == 0` enqueues nothing.
    ///
    /// # Safety
    ///
    /// The call is one of `args.world` calls, one per rank `0..world`, each on its own device,
    /// with the same `dtype`, `op.combine_op()`, `count` and `recvs[..world]`, and each rank's
    /// `flags` its own array of the same group; all of them must be able to run at the same time
    /// (a thread waits for its partners' words until the timeout). Until this rank's kernel has
    /// completed on `stream`:
    /// - `recvs[r]` for `r < world` is rank r's receive buffer: [`ll_recv_bytes`]`(world)`
    ///   bytes of device memory on rank r's device, writable from this context (peer access),
    ///   zeroed before the first call and written by no other group of kernels;
    /// - `flags` is this rank's flag array of the peer kernels ([`super::PEER_FLAG_BYTES`] bytes
    ///   on this device, zeroed before the first call): the LL kernel advances its per-block
    ///   epochs, which it shares with this group's other peer kernels; every call
    ///   on these flags and buffers is made by all `world` ranks, and one rank's calls run one
    ///   after another (one stream);
    /// - `src` is this device's memory valid for `count` elements of `dtype`, written only by
    ///   work that completes before the kernel starts; `dst` this device's memory valid for
    ///   `count` elements, read or written by no other work meanwhile;
    /// - `error` is a 4-byte word writable from this context (host-mapped pinned), zero before
    ///   the call; threads give up once `timeout_ns` have passed since their block started, and
    ///   withdraw the words they pushed, so that a peer's kernel of this call starting later
    ///   gives up too rather than complete.
    ///   After any nonzero code, on any rank, `dst` is undefined on every rank and the receive
    ///   buffers and epochs are out of step: no further call may use them until every rank's
    ///   kernels have completed and the flag arrays and receive buffers are zeroed again.
    pub unsafe fn ll(
        &self,
        dtype: DType,
        op: ReduceOp,
        args: &LlArgs,
        stream: &Stream,
    ) -> Result<()> {
        self.check_stream(stream)?;
        validate_ll(dtype, args)?;
        if args.count == 0 {
            return Ok(());
        }
        let world = args.world as usize;
        let mut peers = LlPeers {
            recv: [0; PEER_MAX_RANKS],
        };
        peers.recv[..world].copy_from_slice(&args.recvs[..world]);
        let (mut flags, mut world_param, mut rank) = (args.flags, args.world, args.rank);
        let (mut src, mut dst, mut count) = (args.src, args.dst, args.count);
        let (mut timeout_ns, mut error, mut gate) = (args.timeout_ns, args.error, args.gate);
        let mut params: [*mut c_void; 10] = [
            param(&mut peers),
            param(&mut flags),
            param(&mut world_param),
            param(&mut rank),
            param(&mut src),
            param(&mut dst),
            param(&mut count),
            param(&mut timeout_ns),
            param(&mut error),
            param(&mut gate),
        ];
        // Validated: count × size ≤ LL_MAX_BYTES, so this fits and is at most LL_MAX_BLOCKS.
        let blocks = ll_blocks(args.count as usize * dtype.size_bytes());
        debug_assert!((1..=LL_MAX_BLOCKS).contains(&blocks));
        let function = &self.ll[reduce_index(op, dtype)];
        // SAFETY: the function is rr_ll_<op>_<dtype>(rr_ll_peers, unsigned*, unsigned, unsigned,
        // const T*, T*, unsigned long long, unsigned long long, unsigned*, rr_call_gate):
        // `peers` is the #[repr(C)] mirror of rr_ll_peers (8 pointers, 64 bytes), then u64,
        // u32, u32, u64, u64, u64, u64, u64, and `gate` the mirror of rr_call_gate (48 bytes),
        // in parameter order, all outliving the call (the driver copies them at
        // launch); the grid is the one the kernel checks (ll_blocks of the bytes, 512 threads);
        // the memory and the other ranks' calls are the caller's contract.
        // Launch: the function was loaded into `self.ctx`, the stream's context (`check_stream`).
        unsafe {
            device::launch_kernel(
                &self.ctx,
                function,
                blocks,
                LL_BLOCK_THREADS,
                stream.raw(),
                &mut params,
            )
        }
    }
}

/// The arguments of one rank's LL one-shot kernel ([`KernelModule::ll`]). Addresses are CUDA
/// device addresses (UVA); entries `>= world` of `recvs` are ignored.
#[derive(Clone, Copy, Debug)]
pub struct LlArgs {
    /// Every rank's receive buffer ([`ll_recv_bytes`]`(world)` bytes on that rank's device), by
    /// rank.
    pub recvs: [u64; PEER_MAX_RANKS],
    /// This rank's flag array of the peer kernels (its per-block epoch words).
    pub flags: u64,
    /// Ranks taking part, 2..=[`PEER_MAX_RANKS`].
    pub world: u32,
    /// This call's rank, `< world`.
    pub rank: u32,
    /// This rank's input: `count` elements on this device.
    pub src: u64,
    /// This rank's output: `count` elements on this device, `src` itself (in place) or disjoint.
    pub dst: u64,
    /// Elements per rank, at most [`LL_MAX_BYTES`] of them in bytes.
    pub count: u64,
    /// How long after its block's start a thread gives up waiting, in nanoseconds.
    pub timeout_ns: u64,
    /// Where the kernel stores a nonzero code on failure ([`LL_ERR_WAIT`](super::LL_ERR_WAIT),
    /// or [`PEER_ERR_LAUNCH`](super::PEER_ERR_LAUNCH): a launch it cannot accept).
    pub error: u64,
    /// The call gate the kernel passes before it pushes anything ([`CallGate::NONE`]: none).
    pub gate: CallGate,
}

/// The kernel parameter `rr_ll_peers` of `cuda/ll.cuh`, byte for byte: `RR_PEER_MAX_RANKS`
/// receive buffer pointers.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct LlPeers {
    recv: [u64; PEER_MAX_RANKS],
}

/// The checks of [`KernelModule::ll`] that need no GPU (see there).
fn validate_ll(dtype: DType, args: &LlArgs) -> Result<()> {
    const KERNEL: &str = "LL one-shot";
    let world = args.world as usize;
    check_world_and_rank(KERNEL, args.world, args.rank)?;
    check_aligned(dtype, "src", args.src)?;
    check_aligned(dtype, "dst", args.dst)?;
    for r in 0..world {
        if args.recvs[r] % 16 != 0 {
            return Err(Error::InvalidArgument(format!(
                "{KERNEL} recvs[{r}] = {:#x} is not aligned to 16 bytes (two LL words)",
                args.recvs[r]
            )));
        }
    }
    check_word_aligned("flags", args.flags)?;
    check_word_aligned("error", args.error)?;
    if args.count == 0 {
        return Ok(());
    }
    let named = [
        ("src", args.src),
        ("dst", args.dst),
        ("flags", args.flags),
        ("error", args.error),
    ];
    check_not_null(
        KERNEL,
        args.count,
        named
            .into_iter()
            .map(|(name, address)| (ArgName::plain(name), address))
            .chain((0..world).map(|r| (ArgName::at("recvs", r), args.recvs[r]))),
    )?;
    let bytes = span_bytes(dtype, args.count)?;
    if bytes > LL_MAX_BYTES as u64 {
        return Err(Error::InvalidArgument(format!(
            "{KERNEL} count = {} of {dtype} is {bytes} bytes, above its {LL_MAX_BYTES}-byte limit \
             (LL_MAX_BYTES)",
            args.count
        )));
    }
    let overlaps =
        args.dst < args.src.saturating_add(bytes) && args.src < args.dst.saturating_add(bytes);
    if overlaps && args.dst != args.src {
        return Err(Error::InvalidArgument(format!(
            "{KERNEL} dst = {:#x} overlaps src = {:#x} ({bytes} bytes each) without being it: \
             in place or disjoint only",
            args.dst, args.src
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{LL_ERR_WAIT, PEER_MAX_BLOCKS};
    use super::*;

    use super::super::source_define as define;

    #[test]
    fn ll_constants_match_the_source() {
        assert_eq!(define("RR_LL_THREADS"), u64::from(LL_BLOCK_THREADS));
        assert_eq!(define("RR_LL_CHUNK_BYTES"), LL_CHUNK_BYTES as u64);
        assert_eq!(define("RR_LL_BLOCK_BYTES"), LL_BLOCK_BYTES as u64);
        assert_eq!(define("RR_LL_MAX_BYTES"), LL_MAX_BYTES as u64);
        assert_eq!(define("RR_LL_MAX_BLOCKS"), u64::from(LL_MAX_BLOCKS));
        assert_eq!(define("RR_LL_ERR_WAIT"), u64::from(LL_ERR_WAIT));
        // The message splits into whole blocks, each block has an epoch word, and the wait code
        // is none of the other peer kernels' codes.
        assert_eq!(LL_MAX_BYTES % LL_BLOCK_BYTES, 0);
        const { assert!(LL_MAX_BLOCKS <= PEER_MAX_BLOCKS) };
        for name in [
            "RR_PEER_ERR_START",
            "RR_PEER_ERR_END",
            "RR_PEER_ERR_LAUNCH",
            "RR_PEER_ERR_MIDDLE",
        ] {
            assert_ne!(define(name), u64::from(LL_ERR_WAIT), "{name}");
        }
    }

    #[test]
    fn ll_peers_is_the_kernel_parameter() {
        // struct rr_ll_peers { rr_ull* recv[8]; } on a 64-bit device.
        assert_eq!(size_of::<LlPeers>(), 64);
        assert_eq!(std::mem::align_of::<LlPeers>(), 8);
    }

    /// The kernel's word index of thread `thread` of block `block`, half `half`, in region
    /// (`set`, `from`) of a receive buffer for `world` ranks — `cuda/ll.cuh`'s layout, written
    /// out independently of the kernel.
    fn word(
        set: usize,
        world: usize,
        from: usize,
        block: usize,
        thread: usize,
        half: usize,
    ) -> usize {
        ((set * world + from) * LL_MAX_BLOCKS as usize + block) * 2 * LL_BLOCK_THREADS as usize
            + 2 * thread
            + half
    }

    #[test]
    fn receive_buffer_holds_every_word_once() {
        for world in 2..=PEER_MAX_RANKS {
            let last = word(
                LL_SETS - 1,
                world,
                world - 1,
                LL_MAX_BLOCKS as usize - 1,
                LL_BLOCK_THREADS as usize - 1,
                1,
            );
            assert_eq!((last + 1) * 8, ll_recv_bytes(world), "world {world}");
            // The layout is a bijection onto 0..=last: consecutive in (half, thread, block, from,
            // set), no gaps, no overlaps.
            let mut seen = vec![false; last + 1];
            for set in 0..LL_SETS {
                for from in 0..world {
                    for block in 0..LL_MAX_BLOCKS as usize {
                        for thread in 0..LL_BLOCK_THREADS as usize {
                            for half in 0..2 {
                                let w = word(set, world, from, block, thread, half);
                                assert!(!seen[w], "word {w} twice");
                                seen[w] = true;
                            }
                        }
                    }
                }
            }
            assert!(seen.iter().all(|&s| s));
        }
        // Two ranks: 512 KiB per rank; eight: 2 MiB.
        assert_eq!(ll_recv_bytes(2), 512 << 10);
        assert_eq!(ll_recv_bytes(8), 2 << 20);
        // A thread's two words are one 16-byte store: even word, so 16-byte aligned.
        assert_eq!(word(1, 3, 2, 5, 7, 0) % 2, 0);
    }

    #[test]
    fn ll_grid_covers_the_message_within_the_limit() {
        assert_eq!(ll_blocks(0), 1);
        assert_eq!(ll_blocks(1), 1);
        assert_eq!(ll_blocks(4096), 1);
        assert_eq!(ll_blocks(4097), 2);
        assert_eq!(ll_blocks(LL_MAX_BYTES), LL_MAX_BLOCKS);
        for bytes in (0..=LL_MAX_BYTES).step_by(8) {
            let blocks = ll_blocks(bytes) as usize;
            // Every chunk has a thread, and the last block has at least one chunk.
            assert!(blocks * LL_BLOCK_BYTES >= bytes);
            assert!(bytes == 0 || (blocks - 1) * LL_BLOCK_BYTES < bytes);
        }
    }

    #[test]
    fn ll_fits_up_to_the_limit_exactly() {
        for dtype in DType::ALL {
            let most = LL_MAX_BYTES / dtype.size_bytes();
            assert!(ll_fits(dtype, 0));
            assert!(ll_fits(dtype, most), "{dtype}");
            assert!(!ll_fits(dtype, most + 1), "{dtype}");
        }
        assert!(!ll_fits(DType::F64, usize::MAX));
    }

    fn ll_args() -> LlArgs {
        let base = 0x7f00_0000_0000_u64;
        LlArgs {
            recvs: std::array::from_fn(|r| base + ((r as u64) << 24)),
            flags: base + (1 << 32),
            world: 2,
            rank: 1,
            src: base + (1 << 33),
            dst: base + (1 << 34),
            count: 1000,
            timeout_ns: 1_000_000_000,
            error: base + (1 << 35),
            gate: CallGate::NONE,
        }
    }

    fn invalid(dtype: DType, args: &LlArgs) -> String {
        match validate_ll(dtype, args) {
            Err(Error::InvalidArgument(why)) => why,
            other => panic!("expected InvalidArgument for {args:?}, got {other:?}"),
        }
    }

    #[test]
    fn ll_arguments_are_validated() {
        let ok = ll_args();
        validate_ll(DType::F32, &ok).unwrap();
        // In place is fine; a partial overlap is not.
        validate_ll(DType::F32, &LlArgs { dst: ok.src, ..ok }).unwrap();
        let why = invalid(
            DType::F32,
            &LlArgs {
                dst: ok.src + 4,
                ..ok
            },
        );
        assert!(why.contains("overlaps src"), "{why}");
        // Touching ends are disjoint.
        validate_ll(
            DType::F32,
            &LlArgs {
                dst: ok.src + ok.count * 4,
                ..ok
            },
        )
        .unwrap();
        for world in [0, 1, 9] {
            let why = invalid(DType::F32, &LlArgs { world, ..ok });
            assert!(why.contains(&format!("world = {world}")), "{why}");
        }
        let why = invalid(DType::F32, &LlArgs { rank: 2, ..ok });
        assert!(why.contains("rank = 2"), "{why}");
        // Alignment: elements for src and dst, 16 for the receive buffers, 4 for the words.
        assert!(invalid(
            DType::F32,
            &LlArgs {
                src: ok.src + 2,
                ..ok
            }
        )
        .contains("src"));
        validate_ll(
            DType::F16,
            &LlArgs {
                src: ok.src + 2,
                ..ok
            },
        )
        .unwrap();
        let mut args = ok;
        args.recvs[1] += 8;
        assert!(invalid(DType::U8, &args).contains("recvs[1]"));
        // Entries at or above world are not looked at.
        let mut above = ok;
        above.recvs[5] = 0x3;
        validate_ll(DType::U8, &above).unwrap();
        assert!(invalid(
            DType::F32,
            &LlArgs {
                flags: ok.flags + 2,
                ..ok
            }
        )
        .contains("flags"));
        assert!(invalid(
            DType::F32,
            &LlArgs {
                error: ok.error + 1,
                ..ok
            }
        )
        .contains("error"));
        // Nulls only matter when there is something to do.
        let mut null = ok;
        null.recvs[0] = 0;
        assert!(invalid(DType::F32, &null).contains("recvs[0] is null"));
        null.count = 0;
        validate_ll(DType::F32, &null).unwrap();
        // The size limit, to the byte, per type.
        for dtype in DType::ALL {
            let most = (LL_MAX_BYTES / dtype.size_bytes()) as u64;
            validate_ll(dtype, &LlArgs { count: most, ..ok }).unwrap();
            let why = invalid(
                dtype,
                &LlArgs {
                    count: most + 1,
                    ..ok
                },
            );
            assert!(why.contains("LL_MAX_BYTES"), "{why}");
        }
        assert!(matches!(
            validate_ll(
                DType::F64,
                &LlArgs {
                    count: u64::MAX / 2,
                    ..ok
                }
            ),
            Err(Error::SizeOverflow { .. })
        ));
    }
}
