//! The steps kernel: the one-shot form of every collective but the all-reduce (and send/recv),
//! one kernel per rank that runs the rank's steps — folds over every rank's source, or copies
//! from one rank — between one start and one end barrier. Its arguments ([`StepsArgs`],
//! [`PeerStep`]), the checks made before a launch and the launch; the kernel and why its steps
//! need no barrier between them are in `cuda/peer_kernels.cuh` (`rr_steps_kernel`), the plans in
//! [`crate::plan::oneshot`].
//!
//! Invariant: `StepsParam` is a byte-for-byte mirror of the kernel parameter `rr_steps`, and the
//! step limit equals `RR_STEPS_MAX` (a unit test reads it from the source).

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
    /// Enqueues this rank's part of a one-shot collective other than the all-reduce on
    /// `stream`: one kernel that waits at a start barrier for every rank's kernel of this call,
    /// runs this rank's steps in order — a fold `dst = src[0] ⊕ … ⊕ src[world − 1]` (rank order;
    /// `Avg` sums, the caller scales) or a copy `dst = src[from]`, each of its own count, at
    /// most `args.count` (which sizes the grid) — and
    /// ends at an end barrier after which no rank reads this rank's memory any more. A rank
    /// with no steps only takes part in the barriers, and a kernel of `count` 0 (a send/recv of
    /// empty transfers alone) is its barriers alone, one block. The grid is [`peer_blocks`](super::peer_blocks)`(dtype,
    /// count)` on every rank. Barrier timeouts are reported in `*args.error` (`PEER_ERR_START`,
    /// `_END`, `_LAUNCH`).
    ///
    /// Checked before anything is enqueued ([`Error::InvalidArgument`]): `stream` belongs to
    /// this context; world and rank as for [`KernelModule::oneshot`]; at most
    /// [`PEER_MAX_RANKS`] steps, each copy's `from` below world, each step's count at most
    /// `args.count`; every address aligned (the sources and destinations to the element, flags
    /// and error to 4); flags and error not null, and each step's addresses not null where it
    /// moves something; no step's destination overlaps
    /// another step's destination or any step's source — except a fold's destination that is
    /// exactly its own rank's source of that step.
    ///
    /// # Safety
    ///
    /// As for [`KernelModule::oneshot`] for the flags, error word, timeout, grid and the other
    /// ranks' calls (every rank launches this kernel with the same `dtype`, `op.combine_op()`,
    /// `count` and `flags` for the same call). Every source named by a step is readable from
    /// this context and valid for the step's count of elements, written only before its rank's
    /// kernel starts and not again until every rank's kernel of the call has completed; every
    /// `dst` is this rank's device memory, valid for the step's count and touched by no other work
    /// meanwhile; and across ALL ranks' steps of the call, no step writes memory that another
    /// step (of any rank) reads or writes, except a fold writing exactly its own rank's source
    /// (the steps run with no barrier between them).
    pub unsafe fn steps(
        &self,
        dtype: DType,
        op: ReduceOp,
        args: &StepsArgs,
        stream: &Stream,
    ) -> Result<()> {
        self.check_stream(stream)?;
        validate_steps(dtype, args)?;
        let mut shared = PeerParams::of(
            args.world,
            args.rank,
            &[0; PEER_MAX_RANKS],
            &args.flags,
            args.timeout_ns,
            args.error,
        );
        let mut steps = StepsParam {
            src: [[0; PEER_MAX_RANKS]; PEER_MAX_RANKS],
            dst: [0; PEER_MAX_RANKS],
            count: [0; PEER_MAX_RANKS],
            from: [0; PEER_MAX_RANKS],
            steps: args.steps.len() as u32,
            _pad: 0,
        };
        for (s, step) in args.steps.iter().enumerate() {
            steps.src[s] = step.srcs;
            steps.dst[s] = step.dst;
            steps.count[s] = step.count;
            steps.from[s] = step.from.map_or(STEP_FOLD, |q| q as u32);
        }
        let (mut count, mut gate) = (args.count, args.gate);
        let mut params: [*mut c_void; 8] = [
            param(&mut shared.peers),
            param(&mut steps),
            param(&mut shared.world),
            param(&mut shared.rank),
            param(&mut count),
            param(&mut shared.timeout_ns),
            param(&mut shared.error),
            param(&mut gate),
        ];
        let function = &self.steps[reduce_index(op, dtype)];
        // SAFETY: the function is rr_steps_<op>_<dtype>(rr_peers, rr_steps, unsigned, unsigned,
        // unsigned long long, unsigned long long, unsigned*, rr_call_gate): `peers` and `steps`
        // are the #[repr(C)] mirrors of those structs (128 and 680 bytes), then u32, u32, u64,
        // u64, u64, and `gate` the mirror of rr_call_gate (48 bytes), in parameter order, all outliving the call (the driver copies them at launch); the
        // memory and the other ranks' calls are the caller's contract.
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

/// One step of a rank's one-shot collective ([`KernelModule::steps`]): a fold over every rank
/// (`from: None`) or a copy from rank `from`, `count` elements into `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerStep {
    /// The step's source in each rank's memory, by rank (a copy reads `srcs[from]` only; the
    /// other entries are ignored and may be 0).
    pub srcs: [u64; PEER_MAX_RANKS],
    /// This rank's destination.
    pub dst: u64,
    /// Elements the step moves, at most [`StepsArgs::count`].
    pub count: u64,
    /// `None`: fold every rank's source in rank order; `Some(q)`: copy rank q's.
    pub from: Option<usize>,
}

/// The arguments of one rank's steps kernel ([`KernelModule::steps`]). Addresses are CUDA
/// device addresses (UVA); entries `>= world` of `flags` are ignored.
#[derive(Clone, Debug)]
pub struct StepsArgs {
    /// This rank's steps, at most [`PEER_MAX_RANKS`], run in order.
    pub steps: Vec<PeerStep>,
    /// Every rank's flag array ([`PEER_FLAG_BYTES`](super::PEER_FLAG_BYTES) bytes on that rank's device), by rank.
    pub flags: [u64; PEER_MAX_RANKS],
    /// Ranks taking part, 2..=[`PEER_MAX_RANKS`].
    pub world: u32,
    /// This call's rank, `< world`.
    pub rank: u32,
    /// The most elements a step of any rank moves: the collective's count (a send/recv's
    /// longest transfer), the same on every rank (it sizes the grid).
    pub count: u64,
    /// How long after its start the kernel gives up waiting at a barrier, in nanoseconds.
    pub timeout_ns: u64,
    /// Where the kernel stores a nonzero code on failure (`PEER_ERR_START`, `_END`, `_LAUNCH`).
    pub error: u64,
    /// At most this many blocks (0: no cap beyond [`PEER_MAX_BLOCKS`](super::PEER_MAX_BLOCKS)), as for the one-shot.
    pub max_blocks: u32,
    /// The call gate the kernel passes before its start barrier ([`CallGate::NONE`]: none).
    pub gate: CallGate,
}

/// `from` of a fold step in the kernel parameter (`RR_STEP_FOLD`).
const STEP_FOLD: u32 = u32::MAX;

/// The kernel parameter `rr_steps` of `cuda/peer_kernels.cuh`, byte for byte: the sources by
/// step and rank, the destinations, each step's count and `from`, and the number of steps.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct StepsParam {
    src: [[u64; PEER_MAX_RANKS]; PEER_MAX_RANKS],
    dst: [u64; PEER_MAX_RANKS],
    count: [u64; PEER_MAX_RANKS],
    from: [u32; PEER_MAX_RANKS],
    steps: u32,
    /// The struct's tail padding (its alignment is 8), zeroed.
    _pad: u32,
}

/// The checks of [`KernelModule::steps`] that need no GPU (see there).
fn validate_steps(dtype: DType, args: &StepsArgs) -> Result<()> {
    const KERNEL: &str = "steps";
    let world = args.world as usize;
    let bad = |why: String| Err(Error::InvalidArgument(format!("{KERNEL} {why}")));
    check_world_and_rank(KERNEL, args.world, args.rank)?;
    if args.steps.len() > PEER_MAX_RANKS {
        return bad(format!(
            "kernel got {} steps; it runs at most {PEER_MAX_RANKS}",
            args.steps.len()
        ));
    }
    let read = |step: &PeerStep| -> Vec<(usize, u64)> {
        match step.from {
            Some(q) => vec![(q, step.srcs[q])],
            None => (0..world).map(|r| (r, step.srcs[r])).collect(),
        }
    };
    for (s, step) in args.steps.iter().enumerate() {
        if step.from.is_some_and(|q| q >= world) {
            return bad(format!(
                "step {s} copies from rank {:?} of {world}",
                step.from
            ));
        }
        if step.count > args.count {
            return bad(format!(
                "step {s} moves {} elements, more than the kernel's {}",
                step.count, args.count
            ));
        }
        check_aligned(dtype, step_arg(s, "dst", None), step.dst)?;
        for (r, src) in read(step) {
            check_aligned(dtype, step_arg(s, "srcs", Some(r)), src)?;
        }
    }
    for r in 0..world {
        check_word_aligned(ArgName::at("flags", r), args.flags[r])?;
    }
    check_word_aligned("error", args.error)?;
    check_not_null(
        KERNEL,
        args.count,
        std::iter::once((ArgName::plain("error"), args.error))
            .chain((0..world).map(|r| (ArgName::at("flags", r), args.flags[r]))),
    )?;
    for (s, step) in args
        .steps
        .iter()
        .enumerate()
        .filter(|(_, step)| step.count > 0)
    {
        check_not_null(
            KERNEL,
            step.count,
            std::iter::once((step_arg(s, "dst", None), step.dst)).chain(
                read(step)
                    .into_iter()
                    .map(move |(r, a)| (step_arg(s, "srcs", Some(r)), a)),
            ),
        )?;
    }
    // [a, a + a_bytes) and [b, b + b_bytes) share a byte.
    let overlaps = |a: u64, a_bytes: u64, b: u64, b_bytes: u64| {
        a_bytes > 0 && b_bytes > 0 && a < b.saturating_add(b_bytes) && b < a.saturating_add(a_bytes)
    };
    for (s, step) in args.steps.iter().enumerate() {
        let bytes = span_bytes(dtype, step.count)?;
        for (t, other) in args.steps.iter().enumerate() {
            let other_bytes = span_bytes(dtype, other.count)?;
            if t != s && overlaps(step.dst, bytes, other.dst, other_bytes) {
                return bad(format!("steps {s} and {t} write overlapping destinations"));
            }
            for (r, src) in read(other) {
                let own = t == s && step.from.is_none() && r == args.rank as usize;
                if overlaps(step.dst, bytes, src, other_bytes) && !(own && src == step.dst) {
                    return bad(format!(
                        "step {s}'s dst = {:#x} overlaps step {t}'s source in rank {r} = {src:#x}",
                        step.dst
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Step `s`'s argument `name` (`index`: which rank's).
fn step_arg(s: usize, name: &'static str, index: Option<usize>) -> ArgName {
    ArgName {
        step: Some(s),
        name,
        index,
    }
}

#[cfg(test)]
mod tests {
    use super::super::source_define as define;
    use super::*;

    #[test]
    fn steps_param_is_the_kernel_parameter() {
        // struct rr_steps { const void* src[8][8]; void* dst[8]; unsigned long long count[8];
        // unsigned from[8]; unsigned steps; } (680 bytes with its tail padding to 8).
        assert_eq!(size_of::<StepsParam>(), 680);
        assert_eq!(std::mem::offset_of!(StepsParam, dst), 512);
        assert_eq!(std::mem::offset_of!(StepsParam, count), 576);
        assert_eq!(std::mem::offset_of!(StepsParam, from), 640);
        assert_eq!(std::mem::offset_of!(StepsParam, steps), 672);
        assert_eq!(define("RR_STEPS_MAX"), 8);
        assert_eq!(u64::from(STEP_FOLD), 0xffff_ffff);
    }

    fn steps_args(steps: Vec<PeerStep>) -> StepsArgs {
        StepsArgs {
            steps,
            flags: [0x1000, 0x2000, 0, 0, 0, 0, 0, 0],
            world: 2,
            rank: 1,
            count: 16,
            timeout_ns: 1,
            error: 0x3000,
            max_blocks: 0,
            gate: CallGate::NONE,
        }
    }

    fn step(srcs: [u64; 2], dst: u64, from: Option<usize>) -> PeerStep {
        let mut all = [0; PEER_MAX_RANKS];
        all[..2].copy_from_slice(&srcs);
        PeerStep {
            srcs: all,
            dst,
            count: 16,
            from,
        }
    }

    #[test]
    fn steps_that_write_what_others_read_are_refused() {
        // An in-place reduce-scatter of rank 1: its fold writes exactly its own source.
        let own = step([0x10_000, 0x20_040], 0x20_040, None);
        validate_steps(DType::F32, &steps_args(vec![own])).unwrap();
        // ... but not a peer's source, nor a source shifted by one element.
        let onto_peer = step([0x10_000, 0x20_040], 0x10_000, None);
        assert!(validate_steps(DType::F32, &steps_args(vec![onto_peer])).is_err());
        let shifted = step([0x10_000, 0x20_040], 0x20_044, None);
        assert!(validate_steps(DType::F32, &steps_args(vec![shifted])).is_err());
        // An all-gather: two copies into two blocks — fine; into overlapping blocks — refused.
        let a = step([0x10_000, 0], 0x30_000, Some(0));
        let b = step([0, 0x20_000], 0x30_040, Some(1));
        validate_steps(DType::F32, &steps_args(vec![a, b])).unwrap();
        let b_over = step([0, 0x20_000], 0x30_020, Some(1));
        assert!(validate_steps(DType::F32, &steps_args(vec![a, b_over])).is_err());
        // A later step reading what an earlier one wrote would need a barrier between them.
        let reads_a = step([0x30_000, 0], 0x40_000, Some(0));
        assert!(validate_steps(DType::F32, &steps_args(vec![a, reads_a])).is_err());
        // Copies from a rank outside the world, and too many steps.
        let far = step([0, 0], 0x30_000, Some(2));
        assert!(validate_steps(DType::F32, &steps_args(vec![far])).is_err());
        let many: Vec<PeerStep> = (0..9)
            .map(|k| step([0x10_000, 0], 0x50_000 + 0x100 * k, Some(0)))
            .collect();
        assert!(validate_steps(DType::F32, &steps_args(many)).is_err());
        // A rank with no steps (it only joins the barriers).
        validate_steps(DType::F32, &steps_args(Vec::new())).unwrap();
    }

    #[test]
    fn each_step_is_checked_at_its_own_count() {
        // Send/recv: copies of 8 and 16 elements into adjacent blocks — 8 f32 end where the
        // next begins; at 9 they overlap, and no step may move more than the kernel's count.
        let short = PeerStep {
            count: 8,
            ..step([0x10_000, 0], 0x30_000, Some(0))
        };
        let next = step([0, 0x20_000], 0x30_020, Some(1));
        validate_steps(DType::F32, &steps_args(vec![short, next])).unwrap();
        let longer = PeerStep { count: 9, ..short };
        assert!(validate_steps(DType::F32, &steps_args(vec![longer, next])).is_err());
        let too_long = PeerStep { count: 17, ..short };
        assert!(validate_steps(DType::F32, &steps_args(vec![too_long])).is_err());
        // A step moving nothing may name null addresses; one moving something may not.
        let empty = PeerStep {
            count: 0,
            ..step([0, 0], 0, Some(0))
        };
        validate_steps(DType::F32, &steps_args(vec![empty])).unwrap();
        let null = PeerStep { count: 1, ..empty };
        assert!(validate_steps(DType::F32, &steps_args(vec![null])).is_err());
        // A kernel of no elements still meets at its barriers: its flags and error word must
        // be there.
        let barriers_only = StepsArgs {
            count: 0,
            ..steps_args(vec![empty])
        };
        validate_steps(DType::F32, &barriers_only).unwrap();
        let no_flags = StepsArgs {
            flags: [0; PEER_MAX_RANKS],
            ..barriers_only.clone()
        };
        assert!(validate_steps(DType::F32, &no_flags).is_err());
        let no_error = StepsArgs {
            error: 0,
            ..barriers_only
        };
        assert!(validate_steps(DType::F32, &no_error).is_err());
    }
}
