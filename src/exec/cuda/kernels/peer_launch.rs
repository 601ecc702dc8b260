//! What every peer kernel's launch shares: the limits and the flag layout ([`PEER_MAX_RANKS`],
//! [`PEER_MAX_BLOCKS`], [`PEER_FLAG_BYTES`]), the grid ([`peer_blocks`]), the parameters every
//! peer kernel takes (`PeerPointers`, `PeerParams`), the grid (`peer_grid`) and the
//! address checks made before one. The one-shot (`oneshot_kernel.rs`), the two-shot
//! (`twoshot_kernel.rs`), the steps kernel (`steps.rs`) and the LL one-shot (`ll.rs`) launch
//! through these pieces; the protocol (flag layout, epochs, memory order, timeouts) is described
//! in `cuda/peer.cuh`, beside the kernels.
//!
//! Invariant: the constants here equal the `RR_PEER_*` defines of `cuda/peer.cuh` (a unit test
//! reads them from the source), and [`PeerPointers`] is a byte-for-byte mirror of the kernel
//! parameter `rr_peers`.

use crate::element::DType;
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
pub(super) const PEER_BLOCK_THREADS: u32 = 512;
/// Bytes of one rank's input per peer-kernel block: a block moves 8 KiB per source per unrolled
/// load (512 threads × 16 B), 32 KiB per loop iteration (`RR_PEER_UNROLL` = 4).
const PEER_BYTES_PER_BLOCK: u64 = 32 << 10;

/// The grid of a peer kernel over `grid_count` elements of `dtype`: [`peer_blocks`] blocks, at
/// most `max_blocks` when that is nonzero — within the kernels' limit of [`PEER_MAX_BLOCKS`]
/// blocks of [`PEER_BLOCK_THREADS`] threads.
pub(super) fn peer_grid(dtype: DType, grid_count: u64, max_blocks: u32) -> u32 {
    let blocks = peer_blocks(dtype, usize::try_from(grid_count).unwrap_or(usize::MAX));
    let blocks = match max_blocks {
        0 => blocks,
        cap => blocks.min(cap),
    };
    debug_assert!((1..=PEER_MAX_BLOCKS).contains(&blocks));
    blocks
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

/// The call gate a peer kernel passes before it touches a peer's memory: the kernel parameter
/// `rr_call_gate` of `cuda/gate.cuh`, byte for byte. Its blocks wait until every peer's host has
/// published call `seq` alike in its control segment (module `exec::job::calls`), or fail the
/// call with a code (`GATE_ERR_MISMATCH`, `GATE_ERR_WAIT`). [`CallGate::NONE`] checks nothing:
/// every rank in one process, or a call checked on the host.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallGate {
    /// Device memory holding every rank's control segment's address as this GPU reaches it, by
    /// rank; 0: no gate.
    pub(crate) controls: u64,
    /// The call's number.
    pub(crate) seq: u64,
    pub(crate) layout: crate::exec::job::GateLayout,
}

impl CallGate {
    /// No gate.
    pub const NONE: CallGate = CallGate {
        controls: 0,
        seq: 0,
        layout: crate::exec::job::GateLayout::ZERO,
    };
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

/// A launch argument's name — `dst`, `srcs[1]`, `steps[0].srcs[1]` — written out only when an
/// error names it (a launch checks its arguments on every call: no allocation then).
#[derive(Clone, Copy, Debug)]
pub(super) struct ArgName {
    /// The step the argument belongs to (the steps kernel's `steps[s]`).
    pub(super) step: Option<usize>,
    pub(super) name: &'static str,
    pub(super) index: Option<usize>,
}

impl ArgName {
    pub(super) fn plain(name: &'static str) -> ArgName {
        ArgName {
            step: None,
            name,
            index: None,
        }
    }

    pub(super) fn at(name: &'static str, index: usize) -> ArgName {
        ArgName {
            step: None,
            name,
            index: Some(index),
        }
    }
}

impl std::fmt::Display for ArgName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(s) = self.step {
            write!(f, "steps[{s}].")?;
        }
        f.write_str(self.name)?;
        match self.index {
            Some(i) => write!(f, "[{i}]"),
            None => Ok(()),
        }
    }
}

/// Refuses the first null address among the `(name, address)` pairs of a launch of `count`
/// elements (made only when there is something to do).
pub(super) fn check_not_null(
    kernel: &str,
    count: u64,
    mut named: impl Iterator<Item = (ArgName, u64)>,
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

pub(super) fn check_word_aligned(name: impl std::fmt::Display, address: u64) -> Result<()> {
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

    /// The fields of the source's struct `name`, in order: each line's last word before `;`.
    fn struct_fields(name: &str) -> Vec<String> {
        let source = super::super::SOURCE;
        let start = source
            .find(&format!("struct {name} {{"))
            .unwrap_or_else(|| panic!("struct {name} in the source"));
        let body = &source[start..start + source[start..].find("};").unwrap()];
        body.lines()
            .skip(1)
            .filter_map(|l| l.split(';').next().filter(|_| l.contains(';')))
            .map(|decl| decl.split_whitespace().last().unwrap().to_string())
            .collect()
    }

    #[test]
    fn the_call_gate_mirrors_the_source_field_for_field() {
        assert_eq!(struct_fields("rr_call_gate"), ["controls", "seq", "layout"]);
        assert_eq!(
            struct_fields("rr_gate_layout"),
            [
                "published",
                "abort",
                "gated",
                "fault",
                "slots",
                "slot_words",
                "call_slots",
                "compared"
            ]
        );
        // A pointer, a u64, then eight u32: 48 bytes, 8-aligned, as the kernel lays it out.
        assert_eq!(size_of::<crate::exec::job::GateLayout>(), 8 * 4);
        assert_eq!(size_of::<CallGate>(), 48);
        assert_eq!(std::mem::align_of::<CallGate>(), 8);
    }

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
}
