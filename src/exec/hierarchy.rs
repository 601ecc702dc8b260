//! A rank of a job on several hosts: the stages of a hierarchical plan
//! ([`crate::plan::hierarchy`]) run on two engines — within the host, a host rank of ringreduce
//! over shared memory among the host's ranks; across hosts, an [`InterHost`] engine among the
//! ranks of this rank's local index.
//!
//! ringreduce writes no network transport: between hosts the collectives run on an engine made
//! for networks. For GPU ranks that engine is NCCL; host ranks take one their creator passes
//! ([`InterHostFactory`]) — the tests pass a stand-in of NCCL's semantics over TCP.
//!
//! Creation: every rank meets the job's rendezvous, which tells the hosts apart
//! (`exec::job::host_layout`). Each host's first rank makes the id of its host's rendezvous, each
//! local index's rank on the first host the id of its inter-host group (the factory's), and one
//! all-gather of the job hands them out; then each rank joins its host's ranks, then its group.
//!
//! A call: first the call's shape compared among every rank (an all-reduce of its hash across
//! hosts, then within the host: ranks that make different calls all get
//! [`Error::CallMismatchInJob`] before anything runs), then the stages,
//! each on the level it names. A stage that fails gives the rank up on both levels, so every
//! rank waiting for it in either fails too, and returns [`Error::Level`] naming the level, with
//! the job's rank numbers.
//!
//! Invariant: every rank runs the same stages in the same order (the plan depends on the shape
//! alone, and the shapes were compared), so each level's calls pair up across its group.

use crate::element::{DType, Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::host::process::ProcessRank;
use crate::exec::host::HostConfig;
use crate::exec::job::CallShape;
use crate::exec::rendezvous::{Rendezvous, UniqueId, UNIQUE_ID_BYTES};
use crate::exec::Shape;
use crate::plan::hierarchy::{self, Area, HierarchyPlan, Hosts, Level, Span, Stage};
use crate::plan::{BufKind, Collective};
use std::collections::HashMap;
use std::sync::Arc;

/// The collectives of one inter-host group (the ranks of one local index, one per host), for
/// host ranks: what NCCL's communicator of that group is to GPU ranks.
pub trait InterHost: Send {
    /// Runs `collective` (roots are host indices) of `count` elements of `dtype` among the
    /// group, in place on this rank's `buf`, laid out as the collective's in-place table says
    /// for a world of the group's size ([`Collective`]); for all-to-all, which has no in-place
    /// form, from `input` into `buf`. Returns once this rank's part is complete, or with an
    /// error — within the engine's timeout, never hanging on a lost peer.
    fn collective(
        &mut self,
        collective: &Collective,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        input: Option<&[u8]>,
        buf: &mut [u8],
    ) -> Result<()>;

    /// Gives this rank up (NCCL's `ncclCommAbort`): the group's waits for it fail. Never waits.
    fn abort(&mut self);
}

/// Makes the [`InterHost`] engine of each inter-host group.
pub trait InterHostFactory {
    /// A new group's id, made by its first member (any bytes, up to 1 KiB; NCCL's unique id).
    fn new_id(&self) -> Result<Vec<u8>>;

    /// Joins the group of `id` as member `index` (its host) of `size` (the hosts).
    fn join(&self, id: &[u8], index: usize, size: usize) -> Result<Box<dyn InterHost>>;
}

/// The largest id an [`InterHostFactory`] may make.
const MAX_ID_BYTES: usize = 1024;

/// Hierarchical plans kept per rank.
const CACHED_PLANS: usize = 64;

/// One host rank of a job on several hosts (module doc).
pub(crate) struct HostHierarchy {
    rank: usize,
    hosts: Hosts,
    intra: ProcessRank,
    inter: Box<dyn InterHost>,
    plans: HashMap<(Collective, usize, bool, bool), Arc<HierarchyPlan>>,
    /// The work buffer, as words (aligned for every element type).
    work: Vec<u64>,
}

/// A record's bytes as words: its length, then the bytes.
fn push_bytes(record: &mut Vec<u64>, bytes: &[u8]) {
    record.push(bytes.len() as u64);
    record.extend(bytes.chunks(8).map(|c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(w)
    }));
}

/// The bytes [`push_bytes`] put at `words[at..]`, and where the next field starts.
fn bytes_at(words: &[u64], at: usize) -> Option<(Vec<u8>, usize)> {
    let len = *words.get(at)? as usize;
    let n = len.div_ceil(8);
    let body = words.get(at + 1..at + 1 + n)?;
    let bytes = body
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .take(len)
        .collect();
    Some((bytes, at + 1 + n))
}

impl HostHierarchy {
    /// Joins this rank's host and its inter-host group (module doc), after the job's
    /// `rendezvous` found `hosts`.
    pub(crate) fn join(
        mut rendezvous: Rendezvous,
        hosts: Hosts,
        config: HostConfig,
        factory: &dyn InterHostFactory,
    ) -> Result<HostHierarchy> {
        let rank = rendezvous.rank();
        let (h, l) = (hosts.host_of(rank), hosts.local_of(rank));
        // A failure to make an id is every rank's error: the record says so.
        let local_id = match l {
            0 => Some(UniqueId::new("127.0.0.1:0")),
            _ => None,
        };
        let group_id = match h {
            0 => Some(
                factory
                    .new_id()
                    .and_then(|id| match id.len() <= MAX_ID_BYTES {
                        true => Ok(id),
                        false => Err(Error::InvalidArgument(format!(
                            "an inter-host engine's id of {} bytes: at most {MAX_ID_BYTES}",
                            id.len()
                        ))),
                    }),
            ),
            _ => None,
        };
        let mut record = vec![u64::from(
            local_id.as_ref().is_some_and(|r| r.is_err())
                || group_id.as_ref().is_some_and(|r| r.is_err()),
        )];
        let local_bytes = match &local_id {
            Some(Ok(id)) => id.to_bytes().to_vec(),
            _ => Vec::new(),
        };
        push_bytes(&mut record, &local_bytes);
        push_bytes(
            &mut record,
            group_id
                .as_ref()
                .and_then(|r| r.as_ref().ok())
                .map_or(&[][..], |v| v),
        );
        let records = rendezvous.all_gather(&record)?;
        if let Some(Err(e)) = local_id {
            return Err(e);
        }
        if let Some(Err(e)) = group_id {
            return Err(e);
        }
        if let Some(q) = records.iter().position(|r| r.first() != Some(&0)) {
            return Err(Error::RankFailed {
                rank: q,
                during: "making the ids of its host and its group across hosts".into(),
                message: "its own error says why".into(),
            });
        }
        let field = |q: usize, which: usize| -> Result<Vec<u8>> {
            let mut at = 1;
            let mut out = Vec::new();
            for _ in 0..=which {
                let (bytes, next) = bytes_at(&records[q], at).ok_or_else(|| Error::Internal {
                    what: format!("rank {q}'s record of ids is cut short"),
                })?;
                (out, at) = (bytes, next);
            }
            Ok(out)
        };
        let local_bytes = field(hosts.rank(h, 0), 0)?;
        if local_bytes.len() != UNIQUE_ID_BYTES {
            return Err(Error::Internal {
                what: "the host's rendezvous id did not arrive".into(),
            });
        }
        let local_id = UniqueId::from_bytes(&local_bytes)?;
        let group_id = field(hosts.rank(0, l), 1)?;
        drop(rendezvous);
        let intra = ProcessRank::join(&local_id, l, hosts.local, config)
            .map_err(|e| level_error(Level::Intra, hosts, rank, e))?;
        let inter = factory
            .join(&group_id, h, hosts.hosts)
            .map_err(|e| level_error(Level::Inter, hosts, rank, e))?;
        Ok(HostHierarchy {
            rank,
            hosts,
            intra,
            inter,
            plans: HashMap::new(),
            work: Vec::new(),
        })
    }

    /// How the ranks lie on the hosts.
    pub(crate) fn hosts(&self) -> Hosts {
        self.hosts
    }

    /// The proven hierarchical plan of `shape`.
    fn plan(&mut self, shape: &Shape, op: ReduceOp) -> Result<Arc<HierarchyPlan>> {
        let key = (
            shape.collective.clone(),
            shape.count,
            shape.in_place,
            shape.average,
        );
        if let Some(p) = self.plans.get(&key) {
            return Ok(p.clone());
        }
        let plan = hierarchy::build(
            self.hosts,
            &shape.collective,
            shape.count,
            shape.in_place,
            op,
        )?;
        crate::check::check_hierarchy(&plan)?;
        if self.plans.len() >= CACHED_PLANS {
            self.plans.clear();
        }
        let plan = Arc::new(plan);
        self.plans.insert(key, plan.clone());
        Ok(plan)
    }

    /// Runs one collective on this rank's buffers (as [`ProcessRank::run`] takes them) and
    /// returns when it is complete here. A failure gives the rank up on both levels.
    pub(crate) fn run<T: Element>(
        &mut self,
        shape: Shape,
        reads: &[(BufKind, &[T])],
        writes: &mut [(BufKind, &mut [T])],
        op: ReduceOp,
    ) -> Result<()> {
        let result = self.stages(shape, reads, writes, op);
        if result.is_err() {
            self.intra.abort();
            self.inter.abort();
        }
        result
    }

    fn stages<T: Element>(
        &mut self,
        shape: Shape,
        reads: &[(BufKind, &[T])],
        writes: &mut [(BufKind, &mut [T])],
        op: ReduceOp,
    ) -> Result<()> {
        let (rank, hosts) = (self.rank, self.hosts);
        self.same_call_everywhere(&shape, T::DTYPE, op)?;
        let plan = self.plan(&shape, op)?;
        let stage_op = match plan.average {
            true => ReduceOp::Sum,
            false => op,
        };
        let words = (plan.work * std::mem::size_of::<T>()).div_ceil(8);
        if self.work.len() < words {
            self.work.resize(words, 0);
        }
        let mut areas = Areas {
            input: reads
                .iter()
                .find(|(k, _)| *k == BufKind::Input)
                .map(|(_, s)| *s),
            output: writes
                .iter_mut()
                .find(|(k, _)| *k == BufKind::Output)
                .map(|(_, s)| &mut **s),
            work: &mut bytemuck::cast_slice_mut::<u64, T>(&mut self.work[..words])[..plan.work],
        };
        for stage in &plan.stages {
            match stage {
                Stage::Copy { who, src, dst } if who.includes(hosts, rank) => {
                    let (s, d) = areas.pair(hosts, rank, src, dst)?;
                    d.copy_from_slice(s);
                }
                Stage::Scale { who, span } if who.includes(hosts, rank) => {
                    let world = hosts.world();
                    for x in areas.span_mut(hosts, rank, span)? {
                        *x = T::average(*x, world);
                    }
                }
                Stage::Collective {
                    level,
                    who,
                    collective,
                    count,
                    src,
                    span,
                } if who.includes(hosts, rank) => {
                    let (input, buf): (Option<&[T]>, &mut [T]) = match src {
                        Some(src) => {
                            let (s, d) = areas.pair(hosts, rank, src, span)?;
                            (Some(s), d)
                        }
                        None => (None, areas.span_mut(hosts, rank, span)?),
                    };
                    let ran = match level {
                        Level::Intra => {
                            let in_place = input.is_none();
                            let shape = Shape::collective::<T>(
                                collective.clone(),
                                *count,
                                in_place,
                                stage_op,
                            );
                            let reads: Vec<(BufKind, &[T])> =
                                input.map(|i| (BufKind::Input, i)).into_iter().collect();
                            self.intra
                                .run(shape, &reads, &mut [(BufKind::Output, buf)], stage_op)
                        }
                        Level::Inter => self.inter.collective(
                            collective,
                            *count,
                            T::DTYPE,
                            stage_op,
                            input.map(bytemuck::cast_slice),
                            bytemuck::cast_slice_mut(buf),
                        ),
                    };
                    ran.map_err(|e| level_error(*level, hosts, rank, e))?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The call's shape, compared among every rank of the job: the shape's hash and its
    /// complement, all-reduced by `Max` across hosts and then within the host, come back
    /// unchanged only where every rank hashed alike.
    fn same_call_everywhere(&mut self, shape: &Shape, dtype: DType, op: ReduceOp) -> Result<()> {
        let call = CallShape::of(shape, dtype, op);
        let hash = call.hash();
        let mut words = [hash, !hash];
        let (rank, hosts) = (self.rank, self.hosts);
        self.inter
            .collective(
                &Collective::AllReduce,
                2,
                DType::U64,
                ReduceOp::Max,
                None,
                bytemuck::cast_slice_mut(&mut words),
            )
            .map_err(|e| level_error(Level::Inter, hosts, rank, e))?;
        let max = Shape::collective::<u64>(Collective::AllReduce, 2, true, ReduceOp::Max);
        self.intra
            .run::<u64>(
                max,
                &[],
                &mut [(BufKind::Output, &mut words)],
                ReduceOp::Max,
            )
            .map_err(|e| level_error(Level::Intra, hosts, rank, e))?;
        match words == [hash, !hash] {
            true => Ok(()),
            false => Err(Error::CallMismatchInJob {
                rank,
                ours: call.describe(),
            }),
        }
    }
}

/// A rank's three buffers during one call.
struct Areas<'a, T> {
    input: Option<&'a [T]>,
    output: Option<&'a mut [T]>,
    work: &'a mut [T],
}

impl<T> Areas<'_, T> {
    fn range(hosts: Hosts, rank: usize, span: &Span) -> std::ops::Range<usize> {
        let at = span.offset(hosts, rank);
        at..at + span.count
    }

    fn missing(area: Area) -> Error {
        Error::Internal {
            what: format!("a hierarchical stage names the rank's {area:?}, which it lacks"),
        }
    }

    fn span_mut(&mut self, hosts: Hosts, rank: usize, span: &Span) -> Result<&mut [T]> {
        let r = Self::range(hosts, rank, span);
        let buf: &mut [T] = match span.area {
            Area::Output => self
                .output
                .as_deref_mut()
                .ok_or(Self::missing(Area::Output))?,
            Area::Work => self.work,
            Area::Input => return Err(Self::missing(Area::Input)),
        };
        buf.get_mut(r).ok_or(Self::missing(span.area))
    }

    /// `src` to read and `dst` to write, in one area (disjoint ranges) or two.
    fn pair(
        &mut self,
        hosts: Hosts,
        rank: usize,
        src: &Span,
        dst: &Span,
    ) -> Result<(&[T], &mut [T])> {
        let (rs, rd) = (Self::range(hosts, rank, src), Self::range(hosts, rank, dst));
        let bad = || Self::missing(dst.area);
        if src.area == dst.area {
            let buf: &mut [T] = match dst.area {
                Area::Output => self.output.as_deref_mut().ok_or_else(bad)?,
                Area::Work => self.work,
                Area::Input => return Err(bad()),
            };
            if buf.len() < rs.end.max(rd.end) || (rs.start < rd.end && rd.start < rs.end) {
                return Err(bad());
            }
            return Ok(match rs.start < rd.start {
                true => {
                    let (a, b) = buf.split_at_mut(rd.start);
                    (&a[rs], &mut b[..rd.len()])
                }
                false => {
                    let (a, b) = buf.split_at_mut(rs.start);
                    (&b[..rs.len()], &mut a[rd])
                }
            });
        }
        let missing = Self::missing;
        let (s, d): (&[T], &mut [T]) = match (src.area, dst.area) {
            (Area::Input, Area::Output) => (
                self.input.ok_or(missing(Area::Input))?,
                self.output.as_deref_mut().ok_or(missing(Area::Output))?,
            ),
            (Area::Input, Area::Work) => (self.input.ok_or(missing(Area::Input))?, self.work),
            (Area::Output, Area::Work) => (
                self.output.as_deref().ok_or(missing(Area::Output))?,
                self.work,
            ),
            (Area::Work, Area::Output) => (
                self.work,
                self.output.as_deref_mut().ok_or(missing(Area::Output))?,
            ),
            _ => return Err(bad()),
        };
        Ok((s.get(rs).ok_or_else(bad)?, d.get_mut(rd).ok_or_else(bad)?))
    }
}

/// `err`, met at `level` by `rank`, as [`Error::Level`] with the job's rank numbers in place of
/// the group's (a local index within the host, a host across hosts).
fn level_error(level: Level, hosts: Hosts, rank: usize, err: Error) -> Error {
    let group = hosts.group(level, rank);
    let job = |q: usize| group.get(q).copied().unwrap_or(q);
    let source = match err {
        Error::RankFailed {
            rank: q,
            during,
            message,
        } => Error::RankFailed {
            rank: job(q),
            during,
            message,
        },
        Error::Timeout {
            rank: q,
            waiting_on,
            after,
        } => Error::Timeout {
            rank: job(q),
            waiting_on,
            after,
        },
        Error::CallMismatch {
            rank: q,
            theirs,
            this,
            ours,
        } => Error::CallMismatch {
            rank: job(q),
            theirs,
            this: job(this),
            ours,
        },
        Error::Level { .. } => return err,
        other => other,
    };
    Error::Level {
        level: level.name(),
        rank,
        source: Box::new(source),
    }
}
