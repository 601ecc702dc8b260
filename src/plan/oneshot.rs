//! The one-shot plans: every collective as direct reads of the other ranks' buffers, between
//! one start and one end barrier — the algorithm for small messages, where the copy-engine
//! chain's fixed cost (copies, kernels and cross-GPU events, ~20 µs) outweighs the bytes.
//!
//! Each rank's work is a list of [`Op::PeerReduce`] meetings on its Main stream: a *fold* reads
//! one range from every rank and combines them in rank order; a *copy* reads one range from one
//! rank. Block `j` of a world·count buffer is elements `j·count..(j+1)·count`
//! ([`Collective`]'s table); in place, the caller's buffer is both source and destination.
//!
//! | collective      | rank r's meetings, in order                                     | + |
//! |-----------------|-----------------------------------------------------------------|---|
//! | all-reduce      | out_r = fold over q of src_q                                    | Avg: scale |
//! | reduce-scatter  | out_r = fold over q of block r of src_q                         | Avg: scale |
//! | all-gather      | for k in 0..n: j = (r + k) mod n, block j of out_r = copy src_j  | in place: k ≥ 1 |
//! | broadcast(root) | out_r = copy src_root                                           | in place root: joins only |
//! | reduce(root)    | root: out = fold over q of src_q; others join only               | Avg: scale |
//! | all-to-all      | for k in 0..n: j = (r + k) mod n, block j of out_r = copy block r of src_j | |
//!
//! `src` is the input out of place and the buffer itself in place (an in-place all-gather's
//! input is its own block; an in-place reduce-scatter writes its own block). A rank that
//! "joins only" holds a meeting that moves nothing (zero elements of its own buffer): it still
//! signals at both barriers, so that the others know its buffer is ready, and that nobody reads
//! it any more when its call completes. Starting each rank's list at its own index (`(r + k)
//! mod n`, [`gather_from`]) spreads the ranks' reads over different peers at once.
//!
//! In place, no rank writes what another reads in any meeting: the all-gather writes block j ≠ r
//! of its own buffer and everyone reads only block j of rank j; the reduce-scatter writes block r
//! of its own buffer, which only it reads (element by element, each read before it is written);
//! the broadcast and the reduce write only at ranks nobody reads (non-roots; the root, which
//! reads itself element by element). So every meeting after a rank's first is `fused` to the
//! one before it: all of a rank's meetings run between one start and one end barrier (on GPUs in
//! one kernel, `cuda/peer_kernels.cuh`, `rr_steps`), and the shape check proves that the
//! barriers dropped between them ordered nothing.
//!
//! # The all-reduce
//!
//! One [`Op::PeerReduce`] per rank (module doc of [`crate::plan`]):
//!
//! ```text
//!   out of place, rank r (Main stream)         in place, rank r (Main stream)
//!   PeerReduce out_r = in_0 ⊕ … ⊕ in_n−1       Expose buf_r → exposed_r
//!   [Scale out_r]            (Avg)             PeerReduce buf_r = exposed_0 ⊕ … ⊕ exposed_n−1
//!                                              [Scale buf_r]            (Avg)
//! ```
//!
//! Everything runs on Main, so the caller's work before the call is ordered before it and the
//! call's completion is Main's: no events at all. What orders ranks against each other is the
//! instruction's two barriers: the start barrier guarantees every source is ready (each rank's
//! copy into its exposed buffer, or the caller's writes of its input, came before its barrier
//! arrival on its own stream), the end barrier that no rank still reads another's source when that
//! rank moves on — to the caller's next kernel, or to the next call's copy into the same exposed
//! buffer. The checker ([`crate::check`]) proves both.
//!
//! In place, the copy into the exposed buffer is an [`Op::Expose`]: published for the meeting
//! that follows it and read by nothing else, which lets the GPU executor do the copy inside the
//! read one-shot kernel, before its start barrier. With `CudaConfig::low_latency` on, the GPU
//! executor runs small messages' meetings with its LL kernel instead (`cuda/ll.cuh`), which gives
//! more than these guarantees without the barriers: it reads no other rank's memory at all (each
//! rank pushes its source into its peers' receive buffers, after its own stream has written it),
//! so no source is read early or late, and the exposure has no reader: the LL kernel skips it and
//! sends the in-place buffer itself, as `Op::Expose` allows.

use super::{
    BufId, BufKind, BufferDecl, Collective, Instr, Op, Phase, Plan, Ranks, Region, StreamKind, Tag,
};
use crate::element::ReduceOp;
use crate::error::{Error, Result};

/// Everything the one-shot plan depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OneShotSpec {
    /// Number of ranks.
    pub world: usize,
    /// Elements per rank.
    pub count: usize,
    /// True when each rank's output buffer is also its input.
    pub in_place: bool,
    /// Only `Avg` matters to the plan (it adds the scaling); the others differ in the kernel.
    pub op: ReduceOp,
}

const TAG: Tag = Tag {
    phase: Phase::OneShot,
    step: 0,
    chunk: 0,
};

impl OneShotSpec {
    /// Compiles the spec into a plan. World 1 is a copy (out of place) or nothing; count 0 is an
    /// empty plan — as for the ring.
    pub fn build(&self) -> Result<Plan> {
        allreduce_plan(
            self.world,
            self.count,
            self.in_place,
            self.op,
            Publish::Device,
        )
    }
}

/// Where the ranks of a one-shot all-reduce publish their sources for each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Publish {
    /// Peers read device memory: out of place the inputs as they are, in place an exposed copy
    /// ([`BufKind::Exposed`]: the rank overwrites its buffer while its peers read).
    Device,
    /// Peers cannot read device memory ([`super::staged`]): every rank's source, in place or
    /// not, into a host copy ([`BufKind::HostExposed`]).
    Host,
}

/// The one-shot all-reduce plan, its sources published as `publish` says (the module doc's
/// table; [`super::staged`] for `Publish::Host`). World 1 is a copy (out of place) or nothing;
/// count 0 is an empty plan — as for the ring.
pub(super) fn allreduce_plan(
    world: usize,
    count: usize,
    in_place: bool,
    op: ReduceOp,
    publish: Publish,
) -> Result<Plan> {
    if world == 0 {
        return Err(Error::InvalidArgument(
            "a one-shot plan needs at least one rank".into(),
        ));
    }
    let n = world;
    let mut plan = peer_plan(n, count, in_place, op);
    let collective = n > 1 && count > 0;
    let exposure = match publish {
        Publish::Device => in_place.then_some(BufKind::Exposed),
        Publish::Host => Some(BufKind::HostExposed),
    };
    if let Some(kind) = exposure.filter(|_| collective) {
        for rank in 0..n {
            declare(&mut plan, rank, kind, count);
        }
    }
    let whole = |buf: BufId| Region {
        buf,
        offset: 0,
        count,
    };
    for rank in 0..n {
        let out = whole(plan.buffer(rank, BufKind::Output).expect("declared"));
        let input = plan.buffer(rank, BufKind::Input).map(whole);
        let exposed = exposure.and_then(|kind| plan.buffer(rank, kind).map(|b| (kind, whole(b))));
        let mut ops = Vec::new();
        if n == 1 {
            if let Some(input) = input.filter(|r| r.count > 0) {
                ops.push(Op::Copy {
                    src: input,
                    dst: out,
                });
            }
        } else if collective {
            let src = match exposed {
                Some((kind, exposed)) => {
                    ops.push(Op::Expose {
                        src: input.unwrap_or(out),
                        dst: exposed,
                    });
                    kind
                }
                None => BufKind::Input,
            };
            ops.push(Op::PeerReduce {
                dst: out,
                src,
                offset: 0,
                count,
                ranks: Ranks::ALL,
                fused: false,
                push: Ranks::NONE,
            });
            if plan.average {
                ops.push(Op::Scale { region: out });
            }
        }
        plan.ranks[rank] = on_main(ops);
    }
    Ok(plan)
}

/// The rank whose block rank `rank` reads at position `k` of its all-gather or all-to-all list.
pub fn gather_from(rank: usize, k: usize, world: usize) -> usize {
    (rank + k) % world
}

impl OneShotSpec {
    /// Compiles the one-shot form of `collective` (the table in the module doc; `count` is the
    /// collective's count). World 1 is a copy out of place and nothing in place; count 0 is an
    /// empty plan. Send/recv has one for every list that is not empty (module
    /// [`super::sendrecv`], "The one-shot form"; `count` is not used).
    pub fn build_collective(&self, collective: &Collective) -> Result<Plan> {
        if *collective == Collective::AllReduce {
            return self.build();
        }
        let (n, count, in_place) = (self.world, self.count, self.in_place);
        if n == 0 || n > 64 {
            return Err(Error::InvalidArgument(format!(
                "a one-shot plan needs 1 to 64 ranks (got {n})"
            )));
        }
        collective.validate(n)?;
        if let (Collective::SendRecv { transfers }, false) = (collective, in_place) {
            return super::sendrecv::build_oneshot(n, transfers);
        }
        if matches!(collective, Collective::SendRecv { .. })
            || in_place && !collective.has_in_place()
        {
            return Err(Error::InvalidArgument(format!(
                "{} has no one-shot form{}",
                collective.name(),
                if in_place { " in place" } else { "" }
            )));
        }
        let average = self.op == ReduceOp::Avg && collective.reduces() && n > 1;
        let mut plan = Plan {
            collective: collective.clone(),
            world: n,
            count,
            in_place,
            average,
            buffers: Vec::new(),
            events: Vec::new(),
            ranks: vec![Vec::new(); n],
        };
        for rank in 0..n {
            plan.declare_callers(rank);
        }
        let src = if in_place {
            BufKind::Output
        } else {
            BufKind::Input
        };
        for rank in 0..n {
            let ops = if count == 0 {
                Vec::new()
            } else if n == 1 {
                local_copy(&plan, rank)
            } else {
                self.meetings(&plan, collective, rank, src)
            };
            plan.ranks[rank] = on_main(ops);
        }
        Ok(plan)
    }

    /// Rank `rank`'s meetings (and `Avg` scaling) for `collective` over two or more ranks.
    fn meetings(&self, plan: &Plan, collective: &Collective, rank: usize, src: BufKind) -> Vec<Op> {
        let (n, count) = (self.world, self.count);
        let own = |kind: BufKind| plan.buffer(rank, kind).expect("declared");
        let region = |buf: BufId, offset: usize| Region { buf, offset, count };
        let read = |dst: Region, offset: usize, ranks: Ranks| Op::PeerReduce {
            dst,
            src,
            offset,
            count,
            ranks,
            fused: false,
            push: Ranks::NONE,
        };
        // A meeting that moves nothing: zero elements of the rank's own source.
        let join = || Op::PeerReduce {
            dst: Region {
                buf: own(src),
                offset: 0,
                count: 0,
            },
            src,
            offset: 0,
            count: 0,
            ranks: Ranks::only(rank),
            fused: false,
            push: Ranks::NONE,
        };
        let mut ops = Vec::new();
        match *collective {
            Collective::ReduceScatter => {
                let at = if self.in_place { rank * count } else { 0 };
                let dst = region(own(BufKind::Output), at);
                ops.push(read(dst, rank * count, Ranks::ALL));
            }
            Collective::AllGather => {
                for k in 0..n {
                    let j = gather_from(rank, k, n);
                    if !(self.in_place && j == rank) {
                        let from = if self.in_place { j * count } else { 0 };
                        ops.push(read(
                            region(own(BufKind::Output), j * count),
                            from,
                            Ranks::only(j),
                        ));
                    }
                }
            }
            Collective::Broadcast { root } => {
                if self.in_place && rank == root {
                    ops.push(join());
                } else {
                    ops.push(read(region(own(BufKind::Output), 0), 0, Ranks::only(root)));
                }
            }
            Collective::Reduce { root } => {
                if rank == root {
                    ops.push(read(region(own(BufKind::Output), 0), 0, Ranks::ALL));
                } else {
                    ops.push(join());
                }
            }
            Collective::AllToAll => {
                for k in 0..n {
                    let j = gather_from(rank, k, n);
                    ops.push(read(
                        region(own(BufKind::Output), j * count),
                        rank * count,
                        Ranks::only(j),
                    ));
                }
            }
            Collective::AllReduce | Collective::SendRecv { .. } => {
                unreachable!("handled by build_collective")
            }
        }
        // Every meeting after the first runs in the first one's kernel, between its start
        // barrier and the last one's end barrier (the module doc says why that is safe; the
        // shape check proves it).
        for op in ops.iter_mut().skip(1) {
            if let Op::PeerReduce { fused, .. } = op {
                *fused = true;
            }
        }
        let written = match ops.first() {
            Some(&Op::PeerReduce { dst, .. }) if plan.average && dst.count > 0 => Some(dst),
            _ => None,
        };
        if let Some(region) = written {
            ops.push(Op::Scale { region });
        }
        ops
    }
}

/// One rank's whole work at world 1, out of place: its input copied into its output (the
/// lengths agree at world 1); nothing in place.
fn local_copy(plan: &Plan, rank: usize) -> Vec<Op> {
    let whole = |buf: BufId| Region {
        buf,
        offset: 0,
        count: plan.decl(buf).len,
    };
    match (
        plan.buffer(rank, BufKind::Input),
        plan.buffer(rank, BufKind::Output),
    ) {
        (Some(input), Some(output)) => vec![Op::Copy {
            src: whole(input),
            dst: whole(output),
        }],
        _ => Vec::new(),
    }
}

/// A rank's program: `ops` in order on its Main stream.
pub(super) fn on_main(ops: Vec<Op>) -> Vec<Instr> {
    ops.into_iter()
        .map(|op| Instr {
            stream: StreamKind::Main,
            op,
            tag: TAG,
        })
        .collect()
}

pub(super) fn declare(plan: &mut Plan, rank: usize, kind: BufKind, len: usize) {
    plan.buffers.push(BufferDecl { rank, kind, len });
}

/// An empty plan of `world` ranks with every rank's input (out of place) and output declared,
/// `count` elements each: the start of the one-shot's and the two-shot's plans.
pub(super) fn peer_plan(world: usize, count: usize, in_place: bool, op: ReduceOp) -> Plan {
    let mut plan = Plan {
        collective: super::Collective::AllReduce,
        world,
        count,
        in_place,
        average: op == ReduceOp::Avg && world > 1,
        buffers: Vec::new(),
        events: Vec::new(),
        ranks: vec![Vec::new(); world],
    };
    for rank in 0..world {
        plan.declare_callers(rank);
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_place_exposes_a_copy_out_of_place_reads_inputs() {
        let oop = OneShotSpec {
            world: 3,
            count: 10,
            in_place: false,
            op: ReduceOp::Sum,
        }
        .build()
        .unwrap();
        assert!(oop.buffer(0, BufKind::Exposed).is_none());
        assert_eq!(oop.ranks[1].len(), 1);
        assert!(matches!(
            oop.ranks[1][0].op,
            Op::PeerReduce {
                src: BufKind::Input,
                ..
            }
        ));
        let ip = OneShotSpec {
            world: 3,
            count: 10,
            in_place: true,
            op: ReduceOp::Avg,
        }
        .build()
        .unwrap();
        assert!(ip.buffer(2, BufKind::Exposed).is_some());
        let ops: Vec<_> = ip.ranks[2].iter().map(|i| i.op).collect();
        assert!(matches!(ops[0], Op::Expose { .. }));
        assert!(matches!(
            ops[1],
            Op::PeerReduce {
                src: BufKind::Exposed,
                ..
            }
        ));
        assert!(matches!(ops[2], Op::Scale { .. }));
        assert!(ip.events.is_empty());
    }
}
