//! Hierarchical collectives: a job on several hosts, with the ranks of each host working
//! together through ringreduce's plans and the hosts through NCCL.
//!
//! Between hosts there are no peer copies and no peer reads: NVLink and PCIe end at the host's
//! edge, and NCCL's network transports (InfiniBand with GPUDirect RDMA, or sockets) carry the
//! data. A hierarchical collective does as much as it can inside each host, where the links are
//! fast, and sends across hosts only what must cross, once.
//!
//! # Layout
//!
//! A job of `hosts` hosts with `local` ranks each ([`Hosts`]): rank `g` is local rank
//! `l = g mod local` of host `h = g / local` (torchrun's numbering: a host's ranks are
//! consecutive). Two kinds of groups:
//!
//! ```text
//!                 local 0   local 1   local 2   local 3
//!   host 0        rank 0    rank 1    rank 2    rank 3     ← an intra-host group (ringreduce)
//!   host 1        rank 4    rank 5    rank 6    rank 7
//!                   ↑
//!                   an inter-host group: one local index, every host (NCCL)
//! ```
//!
//! # The all-reduce in two dimensions
//!
//! With `s = count / local` and the `t = count − local·s` elements left over:
//!
//! | stage | level | what each rank (h, l) does                                                 |
//! |-------|-------|----------------------------------------------------------------------------|
//! | 1     | intra | reduce-scatter of elements `0..local·s`: block l now holds host h's sum     |
//! | 2     | intra | all-reduce of the tail `local·s..count` (t < local elements)               |
//! | 3     | inter | all-reduce of block l with the other hosts' rank l: the sum of every rank  |
//! | 4     | inter | all-reduce of the tail across the hosts                                     |
//! | 5     | —     | `Avg` only: block l and the tail divided by the world                       |
//! | 6     | intra | all-gather of the blocks: every rank holds every block                     |
//!
//! Time ≈ intra reduce-scatter + inter all-reduce of `count / local` elements + intra
//! all-gather: the network carries `1 / local` of what a flat ring across all ranks would
//! put on it per rank, and every host's links work in parallel with the others'.
//!
//! # The other collectives
//!
//! Each is a short list of stages ([`Stage`]) of the same three kinds: local copies, a
//! collective at one level, and `Avg`'s scaling. Every collective stage runs in place on a span
//! of each rank's buffers, so the hierarchical plan needs at most one work buffer per rank.
//! Blocks whose order differs between the levels are rearranged by local copies (a
//! transposition of the `hosts × local` blocks, `count` elements each):
//!
//! - **reduce-scatter**: transpose the input so that the blocks of local index l (one per host)
//!   lie together; intra reduce-scatter of those groups (rank l gets host h's sums of every
//!   host's block l); inter reduce-scatter among local index l (rank (h, l) gets block g's
//!   full sum); copy it out.
//! - **all-gather**: inter all-gather among local index l (rank (h, l) gets the blocks of every
//!   host's rank l); intra all-gather of those groups; transpose them into rank order.
//! - **broadcast** from root (h₀, l₀): inter broadcast among local index l₀ from host h₀, then
//!   intra broadcast from l₀ on every host.
//! - **reduce** to root (h₀, l₀): intra reduce to l₀ on every host, inter reduce among local
//!   index l₀ to host h₀.
//! - **all-to-all**: inter all-to-all among local index l of the blocks bound for each host,
//!   transpose, intra all-to-all, transpose into rank order.
//!
//! Send/recv is not composed here: it runs whole on an engine over every rank of the job
//! (`exec::hierarchy`), not one per local index.
//!
//! `Avg` runs every stage as `Sum` and divides once by the world, where the full sum first
//! lies ([`Stage::Scale`]): dividing per level would round twice.
//!
//! # Proof
//!
//! [`crate::check::check_hierarchy`] executes the stages on symbolic values over every rank of
//! the job, each collective stage by the semantics of its collective (the same table the plan
//! checker proves each host's plans against), and requires the job's collective to come out.
//! The stages of one level run on plans or engines that keep those semantics: the intra stages
//! on ringreduce's plans, each proven by [`crate::check::check`]; the inter stages on NCCL.

mod composed;

use super::Collective;
use crate::element::ReduceOp;
use crate::error::{Error, Result};
use composed::{all_gather, all_reduce, all_to_all, broadcast, reduce, reduce_scatter, Stages};

/// How a job's ranks lie on its hosts (module doc): `hosts` hosts of `local` ranks each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Hosts {
    /// The number of hosts.
    pub hosts: usize,
    /// The ranks on each host.
    pub local: usize,
}

impl Hosts {
    /// The number of ranks.
    pub fn world(self) -> usize {
        self.hosts * self.local
    }

    /// The host of rank `rank`.
    pub fn host_of(self, rank: usize) -> usize {
        rank / self.local
    }

    /// The local index of rank `rank` on its host.
    pub fn local_of(self, rank: usize) -> usize {
        rank % self.local
    }

    /// The rank of local index `local` on host `host`.
    pub fn rank(self, host: usize, local: usize) -> usize {
        host * self.local + local
    }

    /// The ranks that run a stage of `level` together with rank `rank`, in the group's order
    /// (the group's index of each is its local index, or its host).
    pub fn group(self, level: Level, rank: usize) -> Vec<usize> {
        let (h, l) = (self.host_of(rank), self.local_of(rank));
        match level {
            Level::Intra => (0..self.local).map(|q| self.rank(h, q)).collect(),
            Level::Inter => (0..self.hosts).map(|q| self.rank(q, l)).collect(),
        }
    }

    /// Rank `rank`'s index in its group of `level`.
    pub fn index_in(self, level: Level, rank: usize) -> usize {
        match level {
            Level::Intra => self.local_of(rank),
            Level::Inter => self.host_of(rank),
        }
    }
}

/// Which of a rank's buffers a span lies in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Area {
    /// The caller's input (out of place).
    Input,
    /// The caller's output, or its one buffer in place.
    Output,
    /// The rank's work buffer, [`HierarchyPlan::work`] elements.
    Work,
}

/// A range of every rank's buffers: on rank (h, l), `count` elements of `area` from
/// `base + h·per_host + l·per_local`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Span {
    /// The buffer.
    pub area: Area,
    /// The first element on rank (0, 0).
    pub base: usize,
    /// How far the range moves per host.
    pub per_host: usize,
    /// How far the range moves per local index.
    pub per_local: usize,
    /// Elements in the range.
    pub count: usize,
}

impl Span {
    /// The same range on every rank.
    pub fn fixed(area: Area, base: usize, count: usize) -> Span {
        Span {
            area,
            base,
            per_host: 0,
            per_local: 0,
            count,
        }
    }

    /// The first element on rank `rank`.
    pub fn offset(&self, hosts: Hosts, rank: usize) -> usize {
        self.base + hosts.host_of(rank) * self.per_host + hosts.local_of(rank) * self.per_local
    }
}

/// Which ranks take part in a stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Who {
    /// Every rank.
    All,
    /// The ranks of one local index, one per host (one inter-host group).
    Local(usize),
    /// One rank.
    Rank(usize),
}

impl Who {
    /// True when rank `rank` takes part.
    pub fn includes(self, hosts: Hosts, rank: usize) -> bool {
        match self {
            Who::All => true,
            Who::Local(l) => hosts.local_of(rank) == l,
            Who::Rank(r) => rank == r,
        }
    }
}

/// The two levels of a job on several hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    /// Among one host's ranks, on ringreduce's plans.
    Intra,
    /// Among the ranks of one local index, one per host, on NCCL.
    Inter,
}

impl Level {
    /// The level's name, as messages print it.
    pub fn name(self) -> &'static str {
        match self {
            Level::Intra => "within a host",
            Level::Inter => "across hosts",
        }
    }
}

/// One step of a hierarchical plan, run by each rank it includes, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stage {
    /// A local copy, `dst = src`.
    Copy {
        /// The ranks that copy.
        who: Who,
        /// The range read.
        src: Span,
        /// The range written.
        dst: Span,
    },
    /// A collective of one level among each group of that level, in place on `span` (laid out
    /// as the collective's in-place table says, for the group's size), or from `src` into
    /// `span` for all-to-all, which has no in-place form. Roots are group indices: a local
    /// index within a host, a host across hosts. Reducing collectives combine with the call's
    /// operator (`Sum` for `Avg`).
    Collective {
        /// Which groups run it.
        level: Level,
        /// The ranks that take part: all, or one inter-host group.
        who: Who,
        /// The collective, with its root as an index in the group.
        collective: Collective,
        /// Its count, as NCCL counts it, for the group.
        count: usize,
        /// The range it reads (all-to-all only).
        src: Option<Span>,
        /// The range it works on in place (or writes, for all-to-all).
        span: Span,
    },
    /// `Avg`'s finish: the range divided by the world, once the full sum lies there.
    Scale {
        /// The ranks that divide.
        who: Who,
        /// The range divided in place.
        span: Span,
    },
}

/// A collective on a job of several hosts, as stages (module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HierarchyPlan {
    /// How the ranks lie on the hosts.
    pub hosts: Hosts,
    /// The job's collective (roots are ranks of the job).
    pub collective: Collective,
    /// Its count, as NCCL counts it.
    pub count: usize,
    /// True when each rank passes one buffer.
    pub in_place: bool,
    /// True when the stages reduce with `Sum` and a [`Stage::Scale`] finishes `Avg`.
    pub average: bool,
    /// Elements of each rank's work buffer.
    pub work: usize,
    /// The stages, in order.
    pub stages: Vec<Stage>,
}

/// The hierarchical plan of `collective` on `count` elements over `hosts` (module doc).
pub fn build(
    hosts: Hosts,
    collective: &Collective,
    count: usize,
    in_place: bool,
    op: ReduceOp,
) -> Result<HierarchyPlan> {
    let world = hosts.world();
    if world == 0 {
        return Err(Error::InvalidArgument(
            "a job of no hosts or no ranks per host".into(),
        ));
    }
    collective.validate(world)?;
    if in_place && !collective.has_in_place() {
        return Err(Error::InvalidArgument(format!(
            "{} has no in-place form",
            collective.name()
        )));
    }
    let average = op == ReduceOp::Avg;
    if average && !collective.reduces() {
        return Err(Error::InvalidArgument(format!(
            "{} does not reduce: Avg does not apply",
            collective.name()
        )));
    }
    let mut plan = HierarchyPlan {
        hosts,
        collective: collective.clone(),
        count,
        in_place,
        average,
        work: 0,
        stages: Vec::new(),
    };
    let mut stages = Stages {
        hosts,
        list: Vec::new(),
    };
    match *collective {
        Collective::AllReduce => all_reduce(&mut stages, count, in_place, average),
        Collective::ReduceScatter => {
            plan.work = world * count;
            reduce_scatter(&mut stages, count, in_place, average);
        }
        Collective::AllGather => {
            plan.work = world * count;
            all_gather(&mut stages, count, in_place);
        }
        Collective::Broadcast { root } => broadcast(&mut stages, root, count, in_place),
        Collective::Reduce { root } => {
            plan.work = count;
            reduce(&mut stages, root, count, in_place, average);
        }
        Collective::AllToAll => {
            plan.work = 2 * world * count;
            all_to_all(&mut stages, count);
        }
        Collective::SendRecv { .. } => {
            return Err(Error::InvalidArgument(
                "send/recv across hosts is not composed of host-level stages".into(),
            ))
        }
    }
    plan.stages = stages.list;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_follow_torchruns_numbering() {
        let hosts = Hosts { hosts: 3, local: 4 };
        assert_eq!(hosts.group(Level::Intra, 6), vec![4, 5, 6, 7]);
        assert_eq!(hosts.group(Level::Inter, 6), vec![2, 6, 10]);
        assert_eq!(
            (
                hosts.index_in(Level::Intra, 6),
                hosts.index_in(Level::Inter, 6)
            ),
            (2, 1)
        );
        let span = Span {
            per_host: 100,
            per_local: 10,
            ..Span::fixed(Area::Work, 1, 5)
        };
        assert_eq!(span.offset(hosts, 6), 1 + 100 + 20);
    }

    #[test]
    fn the_all_reduce_crosses_hosts_with_one_block_per_rank() {
        let hosts = Hosts { hosts: 2, local: 4 };
        let plan = build(hosts, &Collective::AllReduce, 10, true, ReduceOp::Sum).unwrap();
        let inter: Vec<usize> = plan
            .stages
            .iter()
            .filter_map(|s| match s {
                Stage::Collective {
                    level: Level::Inter,
                    count,
                    ..
                } => Some(*count),
                _ => None,
            })
            .collect();
        // 10 = 4 blocks of 2 and a tail of 2: each rank sends its block and the tail across.
        assert_eq!(inter, vec![2, 2]);
    }
}
