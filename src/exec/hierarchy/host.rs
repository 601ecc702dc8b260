//! A host rank of a job on several hosts (the parent module's doc): within the host a
//! [`ProcessRank`] over shared memory among the host's ranks, across hosts the [`InterHost`]
//! engine of its local index, and the stages run on this rank's buffers and a work buffer in
//! host memory, one after the other. Send/recv runs whole on a third engine, over every rank of
//! the job (made at creation, as the others).

use super::{
    compare_calls, job_error, job_group_id, level_error, lost_rank, meet, stage_op, InterHost,
    InterHostFactory, Plans,
};
use crate::element::Element;
use crate::element::ReduceOp;
use crate::error::{Error, Result};
use crate::exec::host::process::ProcessRank;
use crate::exec::host::HostConfig;
use crate::exec::rendezvous::Rendezvous;
use crate::exec::Shape;
use crate::plan::hierarchy::{Area, Hosts, Level, Span, Stage};
use crate::plan::{BufKind, Collective};

/// One host rank of a job on several hosts (module doc).
pub(crate) struct HostHierarchy {
    rank: usize,
    hosts: Hosts,
    /// The job's rendezvous, where every call's shape is compared.
    rendezvous: Rendezvous,
    intra: ProcessRank,
    inter: Box<dyn InterHost>,
    /// The engine over every rank of the job, for send/recv across hosts.
    job: Box<dyn InterHost>,
    plans: Plans,
    /// The work buffer, as words (aligned for every element type).
    work: Vec<u64>,
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
        let ids = meet(&mut rendezvous, hosts, || factory.new_id())?;
        let intra = ProcessRank::join(&ids.local, l, hosts.local, config)
            .map_err(|e| level_error(Level::Intra, hosts, rank, e))?;
        let inter = factory
            .join(&ids.group, h, hosts.hosts)
            .map_err(|e| level_error(Level::Inter, hosts, rank, e))?;
        let job_id = job_group_id(&mut rendezvous, || factory.new_id())?;
        let job = factory
            .join(&job_id, rank, hosts.world())
            .map_err(|e| job_error(rank, e))?;
        Ok(HostHierarchy {
            rank,
            hosts,
            rendezvous,
            intra,
            inter,
            job,
            plans: Plans::new(hosts),
            work: Vec::new(),
        })
    }

    /// How the ranks lie on the hosts.
    pub(crate) fn hosts(&self) -> Hosts {
        self.hosts
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
        if let Err(err) = &result {
            self.intra.abort();
            self.inter.abort();
            self.job.abort();
            // The others name the rank this one lost, not this one (it is alive).
            match lost_rank(err).filter(|&q| q != self.rank) {
                Some(q) => self.rendezvous.abandon_naming(q),
                None => self.rendezvous.abandon(),
            }
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
        compare_calls(&mut self.rendezvous, &shape, T::DTYPE, op)?;
        if let Collective::SendRecv { transfers } = &shape.collective {
            // Across hosts, send/recv is the job's engine's, whole (module doc).
            let sends: Vec<&[u8]> = reads.iter().map(|(_, s)| bytemuck::cast_slice(s)).collect();
            let mut recvs: Vec<&mut [u8]> = writes
                .iter_mut()
                .map(|(_, s)| bytemuck::cast_slice_mut(s))
                .collect();
            return self
                .job
                .send_recv(transfers, T::DTYPE, &sends, &mut recvs)
                .map_err(|e| job_error(rank, e));
        }
        let plan = self.plans.get(&shape, op)?;
        let stage_op = stage_op(&plan, op);
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
