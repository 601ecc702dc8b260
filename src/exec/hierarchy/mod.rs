//! A rank of a job on several hosts: the stages of a hierarchical plan
//! ([`crate::plan::hierarchy`]) run on two engines — within the host, ringreduce's own executor
//! among the host's ranks; across hosts, an engine made for networks among the ranks of this
//! rank's local index: NCCL for GPU ranks ([`crate::exec::nccl`], module `gpu`), an
//! [`InterHost`] engine its creator passes for host ranks (module `host`).
//!
//! Creation (`meet`): every rank meets the job's rendezvous, which tells the hosts apart
//! (`exec::job::host_layout`). Each host's first rank makes the id of its host's rendezvous,
//! each local index's rank on the first host the id of its group across hosts (NCCL's unique
//! id, or the factory's), and one all-gather of the job hands them out; then each rank joins its
//! host's ranks, then its group. The job's rendezvous stays open.
//!
//! Send/recv is not composed of the two levels: it runs whole on an engine over every rank of the
//! job (for GPU ranks an NCCL communicator of the whole job, made at the first send/recv), the
//! flat fallback through NCCL that point-to-point traffic between hosts needs anyway.
//!
//! A call: first its shape compared among every rank over the job's rendezvous (an all-gather of
//! the shape's words: ranks that make different calls all get [`Error::CallMismatch`], naming a
//! rank whose call differs, before anything runs), then the stages, each on the level it names.
//! A stage that fails gives the rank up on both levels, so every rank waiting for it in either
//! fails too, and returns [`Error::Level`] naming the level, with the job's rank numbers.
//!
//! Invariant: every rank runs the same stages in the same order (the plan depends on the shape
//! alone, and the shapes were compared), so each level's calls pair up across its group.

pub(crate) mod gpu;
pub(crate) mod host;

use crate::element::{DType, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::job::CallShape;
use crate::exec::rendezvous::{Rendezvous, UniqueId, UNIQUE_ID_BYTES};
use crate::exec::Shape;
use crate::plan::hierarchy::{self, HierarchyPlan, Hosts, Level};
use crate::plan::{Collective, Transfer};
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

    /// Grouped point-to-point transfers among the group (NCCL's `ncclSend` and `ncclRecv` in
    /// one group): `transfers` name members by their index in the group and count elements of
    /// `dtype`; `sends` are this member's send buffers, one per transfer it sends, in the order
    /// of `transfers`, and `recvs` its receive buffers likewise (a transfer from a member to
    /// itself is a copy). Returns once this member's part is complete, or with an error within
    /// the engine's timeout.
    fn send_recv(
        &mut self,
        transfers: &[Transfer],
        dtype: DType,
        sends: &[&[u8]],
        recvs: &mut [&mut [u8]],
    ) -> Result<()>;

    /// Gives this rank up (NCCL's `ncclCommAbort`): the group's waits for it fail. Never waits.
    fn abort(&mut self);
}

/// Makes the [`InterHost`] engines of a job on several hosts: one per inter-host group (the ranks
/// of one local index), and one over every rank of the job for send/recv across hosts.
pub trait InterHostFactory {
    /// A new group's id, made by its first member (any bytes, up to 1 KiB; NCCL's unique id).
    fn new_id(&self) -> Result<Vec<u8>>;

    /// Joins the group of `id` as member `index` of `size`: for an inter-host group, its host
    /// among the hosts; for the job's group, its rank among all.
    fn join(&self, id: &[u8], index: usize, size: usize) -> Result<Box<dyn InterHost>>;
}

/// The largest group id a rank hands out.
const MAX_ID_BYTES: usize = 1024;

/// Hierarchical plans kept per rank.
const CACHED_PLANS: usize = 64;

/// What [`meet`] hands each rank: the id of its host's rendezvous and of its group across hosts.
pub(crate) struct Ids {
    /// The host's rendezvous.
    pub(crate) local: UniqueId,
    /// The group's id, as its first member made it.
    pub(crate) group: Vec<u8>,
}

/// Hands out the ids of every host's rendezvous and every group across hosts (module doc):
/// `new_group_id` runs on the groups' first members. A failure to make an id is every rank's
/// error, naming the rank that failed.
pub(crate) fn meet(
    rendezvous: &mut Rendezvous,
    hosts: Hosts,
    new_group_id: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<Ids> {
    let rank = rendezvous.rank();
    let (h, l) = (hosts.host_of(rank), hosts.local_of(rank));
    let local = (l == 0).then(|| UniqueId::new("127.0.0.1:0"));
    let group = (h == 0).then(|| new_group_id().and_then(checked_id));
    let failed =
        local.as_ref().is_some_and(|r| r.is_err()) || group.as_ref().is_some_and(|r| r.is_err());
    let mut record = vec![u64::from(failed)];
    match &local {
        Some(Ok(id)) => push_bytes(&mut record, &id.to_bytes()),
        _ => push_bytes(&mut record, &[]),
    }
    match &group {
        Some(Ok(id)) => push_bytes(&mut record, id),
        _ => push_bytes(&mut record, &[]),
    }
    let records = rendezvous.all_gather(&record)?;
    if let Some(Err(e)) = local {
        return Err(e);
    }
    if let Some(Err(e)) = group {
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
            (out, at) = bytes_at(&records[q], at).ok_or_else(|| Error::Internal {
                what: format!("rank {q}'s record of ids is cut short"),
            })?;
        }
        Ok(out)
    };
    let local = field(hosts.rank(h, 0), 0)?;
    if local.len() != UNIQUE_ID_BYTES {
        return Err(Error::Internal {
            what: "the host's rendezvous id did not arrive".into(),
        });
    }
    Ok(Ids {
        local: UniqueId::from_bytes(&local)?,
        group: field(hosts.rank(0, l), 1)?,
    })
}

/// The id of a group over every rank of the job, made by rank 0 with `new_id` and handed out over
/// the job's rendezvous (a failure there is every rank's error).
pub(crate) fn job_group_id(
    rendezvous: &mut Rendezvous,
    new_id: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<Vec<u8>> {
    let made = (rendezvous.rank() == 0).then(|| new_id().and_then(checked_id));
    let mut record = vec![u64::from(made.as_ref().is_some_and(|r| r.is_err()))];
    match &made {
        Some(Ok(id)) => push_bytes(&mut record, id),
        _ => push_bytes(&mut record, &[]),
    }
    let records = rendezvous.all_gather(&record)?;
    if let Some(Err(e)) = made {
        return Err(e);
    }
    if records[0].first() != Some(&0) {
        return Err(Error::RankFailed {
            rank: 0,
            during: "making the id of the job's group for send/recv across hosts".into(),
            message: "its own error says why".into(),
        });
    }
    let (id, _) = bytes_at(&records[0], 1).ok_or_else(|| Error::Internal {
        what: "rank 0's record of the job's group id is cut short".into(),
    })?;
    Ok(id)
}

/// A group id made by an engine, refused where it is longer than a rank hands out.
fn checked_id(id: Vec<u8>) -> Result<Vec<u8>> {
    match id.len() <= MAX_ID_BYTES {
        true => Ok(id),
        false => Err(Error::InvalidArgument(format!(
            "a group id of {} bytes: at most {MAX_ID_BYTES}",
            id.len()
        ))),
    }
}

/// A record's bytes as words: their length, then the bytes.
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

/// Compares this rank's call with every rank's over the job's rendezvous (module doc).
pub(crate) fn compare_calls(
    rendezvous: &mut Rendezvous,
    shape: &Shape,
    dtype: DType,
    op: ReduceOp,
) -> Result<()> {
    let call = CallShape::of(shape, dtype, op);
    let records = rendezvous.all_gather(call.words())?;
    call.compare(&records, rendezvous.rank())
}

/// The proven hierarchical plans of one rank, by shape.
pub(crate) struct Plans {
    hosts: Hosts,
    map: HashMap<(Collective, usize, bool, bool), Arc<HierarchyPlan>>,
}

impl Plans {
    pub(crate) fn new(hosts: Hosts) -> Plans {
        Plans {
            hosts,
            map: HashMap::new(),
        }
    }

    /// The plan of `shape` (reduced by `op`), built and proven on first use.
    pub(crate) fn get(&mut self, shape: &Shape, op: ReduceOp) -> Result<Arc<HierarchyPlan>> {
        let key = (
            shape.collective.clone(),
            shape.count,
            shape.in_place,
            shape.average,
        );
        if let Some(p) = self.map.get(&key) {
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
        if self.map.len() >= CACHED_PLANS {
            self.map.clear();
        }
        let plan = Arc::new(plan);
        self.map.insert(key, plan.clone());
        Ok(plan)
    }
}

/// The operator every stage reduces with: `Sum` where the plan finishes `Avg` itself.
pub(crate) fn stage_op(plan: &HierarchyPlan, op: ReduceOp) -> ReduceOp {
    match plan.average {
        true => ReduceOp::Sum,
        false => op,
    }
}

/// `err`, met by `rank` in a send/recv across hosts (on the job's engine, whose members are the
/// job's ranks: nothing to renumber).
/// The rank `err` reports lost or late, where it names one (another rank's failure it met, or
/// this rank's own timeout).
pub(crate) fn lost_rank(err: &Error) -> Option<usize> {
    match err {
        Error::RankFailed { rank, .. } | Error::Timeout { rank, .. } => Some(*rank),
        Error::Level { source, .. } => lost_rank(source),
        _ => None,
    }
}

pub(crate) fn job_error(rank: usize, err: Error) -> Error {
    match err {
        Error::Level { .. } => err,
        source => Error::Level {
            level: "across hosts (send/recv)",
            rank,
            source: Box::new(source),
        },
    }
}

/// `err`, met at `level` by `rank`, as [`Error::Level`] with the job's rank numbers in place of
/// the group's (a local index within the host, a host across hosts).
///
/// Ranks named inside a message's text keep the group's numbers; the message says how they map.
pub(crate) fn level_error(level: Level, hosts: Hosts, rank: usize, err: Error) -> Error {
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
            message: format!("{message} (numbered in the group of job ranks {group:?})"),
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
