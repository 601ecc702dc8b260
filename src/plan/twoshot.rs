//! The two-shot all-reduce plan: a reduce-scatter and an all-gather, each rank reading its peers'
//! memory directly, with no copy of any buffer — in place too.
//!
//! ```text
//!   rank r (Main stream), segments s₀ … sₙ₋₁ of the buffer (ring::segment_range)
//!   step 0       PeerReduce out_r[s_r] = src_0[s_r] ⊕ … ⊕ src_n−1[s_r]    (every rank)
//!   step j ≥ 1   PeerReduce out_r[s_q] = out_q[s_q],  q = (r + j) mod n   (rank q alone)
//!   [Scale out_r]   (Avg)
//! ```
//!
//! `src` is the input out of place and the buffer itself in place. Step 0 is safe in place
//! without an exposed copy because rank r writes only its own segment s_r of its own buffer, which
//! no other rank reads at step 0 (each reads segment s_p of everyone); it reads its own s_r in the
//! same instruction, element by element, before writing it. Step j reads only the owner's
//! segment, final since step 0's end barrier, and writes a segment of rank r's own buffer that no
//! one reads after step 0. Every rank moves `2(n−1)/n·count` elements over its links, as the ring
//! does, against `(n−1)·count` for the one-shot — for two ranks the same, but with half the local
//! reads and no exposure copy in place.
//!
//! # Two ways to gather: pull and push
//!
//! The table above is the pulled gather ([`Gather::Pull`]): every rank reads each segment from
//! its owner, after a barrier. The pushed gather ([`Gather::Push`]) turns it around: the owner
//! writes its reduced segment into every rank's buffer in the same instruction that reduces it,
//! block by block, while the block is still in cache:
//!
//! ```text
//!   rank r (Main stream)
//!   step 0       PeerReduce out_q[s_r] = src_0[s_r] ⊕ … ⊕ src_n−1[s_r]  for every rank q
//!                (dst out_r[s_r], push = every other rank)
//!   [Scale out_r]   (Avg, after the end barrier)
//! ```
//!
//! One meeting, two barriers, and each element is read once and written once per rank:
//! `2·n·count` element moves in all, where the pulled gather reads each segment again from its
//! owner (`(3n − 1)·count`). In place it is safe for the same reason step 0 is: segment s_r of
//! every buffer is touched by rank r alone during the meeting, and each block of it is read from
//! every rank before it is written to any. The host executor runs the push (its ranks are
//! threads sharing memory, and the reduced block is in the writing core's cache); the GPU
//! executor runs the pull (its kernel reads peers over NVLink and keeps its writes local).
//!
//! Each step is a meeting (start barrier, reads, end barrier), and gather rounds 2, 3, … are
//! `fused` to the round before: the gather rounds read segments no round writes and write
//! segments no round reads, so the barriers between them would order nothing (the shape check
//! proves it), and all rounds run between one barrier after step 0 and one end barrier. On GPUs
//! the executor runs the whole plan as one kernel per rank with three barriers — start, between
//! step 0 and the gather (step 0's end and round 1's start, with nothing between them), end
//! (`rr_twoshot_kernel` in cuda/peer_kernels.cuh).

use super::oneshot::peer_plan;
use super::ring::segment_range;
use super::{BufKind, Instr, Op, Phase, Plan, Ranks, Region, StreamKind, Tag};
use crate::element::ReduceOp;
use crate::error::{Error, Result};

/// Everything the two-shot plan depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TwoShotSpec {
    /// Number of ranks.
    pub world: usize,
    /// Elements per rank.
    pub count: usize,
    /// True when each rank's output buffer is also its input.
    pub in_place: bool,
    /// Only `Avg` matters to the plan (it adds the scaling); the others differ in the kernel.
    pub op: ReduceOp,
    /// Segment boundaries are multiples of this many elements (16 bytes on GPUs).
    pub align: usize,
    /// How the reduced segments reach every rank (module doc).
    pub gather: Gather,
}

/// How a two-shot's reduced segments reach every rank (module doc, "Two ways to gather").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Gather {
    /// Every rank reads each segment from its owner, after a barrier (the GPU executor's).
    #[default]
    Pull,
    /// The owner writes its segment into every rank's buffer as it reduces it (the host
    /// executor's).
    Push,
}

/// Every rank of the world but `rank`: whom the pushed gather's owner writes to.
pub fn push_to(rank: usize, world: usize) -> Ranks {
    Ranks(
        (0..world)
            .filter(|&q| q != rank)
            .fold(0, |set, q| set | 1 << q),
    )
}

/// The tag of step `step` (0: reduce, j ≥ 1: gather round j).
pub fn step_tag(step: usize) -> Tag {
    Tag {
        phase: Phase::TwoShot,
        step,
        chunk: 0,
    }
}

/// The segment rank `rank` gathers at round `round` (1 ≤ round < world): its owner's index.
pub fn gather_from(rank: usize, round: usize, world: usize) -> usize {
    (rank + round) % world
}

/// The most ranks a two-shot plan takes.
pub const MAX_RANKS: usize = 64;

impl TwoShotSpec {
    /// Compiles the spec into a plan. World 1 is a copy (out of place) or nothing; count 0 is an
    /// empty plan — as for the ring and the one-shot.
    pub fn build(&self) -> Result<Plan> {
        if self.world == 0 || self.world > MAX_RANKS || self.align == 0 {
            return Err(Error::InvalidArgument(format!(
                "a two-shot plan needs 1 to {MAX_RANKS} ranks (got {}) and an alignment of at least 1",
                self.world
            )));
        }
        let n = self.world;
        let mut plan = peer_plan(n, self.count, self.in_place, self.op);
        let segment = |seg: usize| segment_range(self.count, n, self.align, seg);
        let src = if self.in_place {
            BufKind::Output
        } else {
            BufKind::Input
        };
        for rank in 0..n {
            let out = plan.buffer(rank, BufKind::Output).expect("declared");
            let mut ops = Vec::new();
            if n == 1 {
                if let Some(input) = plan.buffer(rank, BufKind::Input) {
                    if self.count > 0 {
                        let whole = |buf| Region {
                            buf,
                            offset: 0,
                            count: self.count,
                        };
                        ops.push((
                            Op::Copy {
                                src: whole(input),
                                dst: whole(out),
                            },
                            step_tag(0),
                        ));
                    }
                }
            } else if self.count > 0 {
                let own = segment(rank);
                ops.push((
                    Op::PeerReduce {
                        dst: Region {
                            buf: out,
                            offset: own.start,
                            count: own.len(),
                        },
                        src,
                        offset: own.start,
                        count: own.len(),
                        ranks: Ranks::ALL,
                        fused: false,
                        push: match self.gather {
                            Gather::Pull => Ranks::NONE,
                            Gather::Push => push_to(rank, n),
                        },
                    },
                    step_tag(0),
                ));
                let gather_rounds = match self.gather {
                    Gather::Pull => 1..n,
                    Gather::Push => 1..1,
                };
                for round in gather_rounds {
                    let owner = gather_from(rank, round, n);
                    let theirs = segment(owner);
                    ops.push((
                        Op::PeerReduce {
                            dst: Region {
                                buf: out,
                                offset: theirs.start,
                                count: theirs.len(),
                            },
                            src: BufKind::Output,
                            offset: theirs.start,
                            count: theirs.len(),
                            ranks: Ranks::only(owner),
                            // Rounds 2, 3, … run with round 1, between the middle and the end
                            // barrier (module doc).
                            fused: round > 1,
                            push: Ranks::NONE,
                        },
                        step_tag(round),
                    ));
                }
                if plan.average {
                    ops.push((
                        Op::Scale {
                            region: Region {
                                buf: out,
                                offset: 0,
                                count: self.count,
                            },
                        },
                        Tag::FINISH,
                    ));
                }
            }
            plan.ranks[rank] = ops
                .into_iter()
                .map(|(op, tag)| Instr {
                    stream: StreamKind::Main,
                    op,
                    tag,
                })
                .collect();
        }
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(world: usize, count: usize, in_place: bool) -> TwoShotSpec {
        TwoShotSpec {
            world,
            count,
            in_place,
            op: ReduceOp::Sum,
            align: 1,
            gather: Gather::Pull,
        }
    }

    #[test]
    fn each_rank_reduces_its_segment_then_gathers_the_others_from_their_owners() {
        let plan = spec(3, 9, true).build().unwrap();
        assert!(
            plan.buffer(0, BufKind::Exposed).is_none(),
            "no copy in place"
        );
        assert!(plan.events.is_empty());
        for rank in 0..3 {
            let ops: Vec<Op> = plan.ranks[rank].iter().map(|i| i.op).collect();
            assert_eq!(ops.len(), 3);
            let Op::PeerReduce {
                dst, offset, ranks, ..
            } = ops[0]
            else {
                panic!("step 0 is a peer reduce")
            };
            assert_eq!(
                (dst.offset, offset, ranks),
                (3 * rank, 3 * rank, Ranks::ALL)
            );
            for (round, op) in ops[1..].iter().enumerate().map(|(i, op)| (i + 1, op)) {
                let owner = (rank + round) % 3;
                let Op::PeerReduce {
                    dst,
                    src,
                    offset,
                    ranks,
                    ..
                } = *op
                else {
                    panic!("gather rounds are peer reduces")
                };
                assert_eq!(
                    (dst.offset, src, offset, ranks),
                    (3 * owner, BufKind::Output, 3 * owner, Ranks::only(owner))
                );
            }
        }
    }

    #[test]
    fn gather_rounds_visit_every_other_rank_once() {
        for world in 2..=8 {
            for rank in 0..world {
                let mut seen: Vec<usize> =
                    (1..world).map(|j| gather_from(rank, j, world)).collect();
                seen.sort_unstable();
                let want: Vec<usize> = (0..world).filter(|&q| q != rank).collect();
                assert_eq!(seen, want, "world {world} rank {rank}");
            }
        }
    }
}
