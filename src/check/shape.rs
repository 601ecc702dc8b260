//! Check 1, shape: every instruction is well formed on its own, before any ordering is judged.
//!
//! Every region lies inside its buffer, copies have equal lengths, a reduction's destination is
//! its first operand or disjoint from both, nothing writes an input, each event is recorded
//! exactly once, on the rank and stream its declaration names, and a stream waits for another
//! rank's event at most once (the GPU executor's counter waits pair the k-th signal of an event
//! with the k-th wait for it on each stream: a second wait on one stream would wait for a signal
//! that never comes); the k-th `PeerReduce` of every rank
//! forms meeting k and each one is well formed on its own; and what an executor may fuse or drop
//! is safe to fuse or drop (module `fused`: the fused meetings, the exposures). The later checks
//! rely on this: they index buffers and events without looking again.

use super::{accesses, describe, peer_destinations, peer_sources, reject, Check};
use crate::plan::{Op, Plan};

/// Check 1: shape.
pub fn check_shape(plan: &Plan) -> Check {
    if plan.ranks.len() != plan.world {
        return reject(format!(
            "{} rank programs for world {}",
            plan.ranks.len(),
            plan.world
        ));
    }
    let mut recorded = vec![0usize; plan.events.len()];
    // (rank, stream, event) of every wait for another rank's event so far.
    let mut remote_waits = std::collections::HashSet::new();
    for (rank, program) in plan.ranks.iter().enumerate() {
        for (i, instr) in program.iter().enumerate() {
            let (reads, writes) = accesses(plan, &instr.op);
            for region in reads.iter().chain(&writes) {
                let Some(decl) = plan.buffers.get(region.buf.0) else {
                    return reject(format!(
                        "{} uses undeclared buffer {}",
                        describe(plan, rank, i),
                        region.buf.0
                    ));
                };
                if region
                    .offset
                    .checked_add(region.count)
                    .is_none_or(|end| end > decl.len)
                {
                    return reject(format!(
                        "{} reaches past the end of {:?} of rank {} ({} elements)",
                        describe(plan, rank, i),
                        decl.kind,
                        decl.rank,
                        decl.len
                    ));
                }
            }
            // (A zero-element write writes nothing: a one-shot rank that only joins a meeting
            // names zero elements of its own input.)
            for w in writes.iter().filter(|w| w.count > 0) {
                if plan.decl(w.buf).kind.is_read_only() {
                    return reject(format!(
                        "{} writes an input buffer",
                        describe(plan, rank, i)
                    ));
                }
            }
            match instr.op {
                Op::Copy { src, dst } if src.count != dst.count => {
                    return reject(format!(
                        "{} copies between regions of different length",
                        describe(plan, rank, i)
                    ));
                }
                Op::Reduce { dst, a, b } => {
                    if a.count != dst.count || b.count != dst.count {
                        return reject(format!(
                            "{} reduces regions of different length",
                            describe(plan, rank, i)
                        ));
                    }
                    if dst != a && (dst.overlaps(&a) || dst.overlaps(&b)) || dst.overlaps(&b) {
                        return reject(format!(
                            "{} has a destination that partially overlaps an operand",
                            describe(plan, rank, i)
                        ));
                    }
                }
                Op::Record(e) | Op::Wait(e) if e.0 >= plan.events.len() => {
                    return reject(format!(
                        "{} names undeclared event {}",
                        describe(plan, rank, i),
                        e.0
                    ));
                }
                Op::Wait(e)
                    if plan.events[e.0].rank != rank
                        && !remote_waits.insert((rank, instr.stream, e.0)) =>
                {
                    return reject(format!(
                        "{} waits a second time on its {:?} stream for {}: a stream waits for another rank's event at most once per call",
                        describe(plan, rank, i),
                        instr.stream,
                        plan.events[e.0]
                    ));
                }
                Op::Record(e) => {
                    recorded[e.0] += 1;
                    let decl = &plan.events[e.0];
                    if decl.rank != rank || decl.stream != instr.stream {
                        return reject(format!(
                            "{} records event {} declared for rank {} {:?}",
                            describe(plan, rank, i),
                            e.0,
                            decl.rank,
                            decl.stream
                        ));
                    }
                }
                _ => {}
            }
        }
    }
    if let Some(e) = recorded.iter().position(|&n| n != 1) {
        return reject(format!(
            "event {e} ({}) is recorded {} times; each event must be recorded exactly once per call",
            plan.events[e], recorded[e]
        ));
    }
    super::fused::check_exposures(plan)?;
    check_meetings(plan)
}

/// The k-th `PeerReduce` of every rank is one meeting: every rank has as many. Each peer reduce
/// writes its own rank's buffer (and pushes to other ranks' buffers of the same kind, never its
/// own rank), as many elements as it reads from each source, reads at least one rank and only
/// ranks that declare the source's kind, and writes no source — except where a range written
/// is exactly a source (folded block by block, every source read before anything is written). What the ranks
/// of one meeting read may differ (the two-shot's ranks each reduce their own segment); the race
/// and result checks judge the combination.
fn check_meetings(plan: &Plan) -> Check {
    let meetings: Vec<Vec<(usize, Op)>> = plan
        .ranks
        .iter()
        .map(|program| {
            program
                .iter()
                .enumerate()
                .filter(|(_, i)| matches!(i.op, Op::PeerReduce { .. }))
                .map(|(index, i)| (index, i.op))
                .collect()
        })
        .collect();
    let Some(first) = meetings.first() else {
        return Ok(());
    };
    for (rank, mine) in meetings.iter().enumerate() {
        if mine.len() != first.len() {
            return reject(format!(
                "rank {rank} has {} peer reduces and rank 0 has {}: the barriers would never all meet",
                mine.len(),
                first.len()
            ));
        }
        for &(index, op) in mine {
            let Op::PeerReduce {
                dst,
                src,
                count,
                ranks,
                push,
                ..
            } = op
            else {
                unreachable!("filtered above")
            };
            let here = describe(plan, rank, index);
            if dst.count != count {
                return reject(format!("{here} writes {} elements from {count}", dst.count));
            }
            if plan.decl(dst.buf).rank != rank {
                return reject(format!("{here} writes another rank's buffer"));
            }
            let wanted = (0..plan.world).filter(|&r| ranks.contains(r)).count();
            if wanted == 0 {
                return reject(format!("{here} reads no rank"));
            }
            let sources = peer_sources(plan, &op);
            if sources.len() != wanted {
                return reject(format!(
                    "{here} reads {src:?}, which not every rank it reads declares"
                ));
            }
            if push.contains(rank) {
                return reject(format!(
                    "{here} pushes to its own rank, whose destination is `dst`"
                ));
            }
            let destinations = peer_destinations(plan, &op);
            let pushed = (0..plan.world).filter(|&r| push.contains(r)).count();
            if destinations.len() != 1 + pushed {
                return reject(format!(
                    "{here} pushes to a rank without a {:?} buffer",
                    plan.decl(dst.buf).kind
                ));
            }
            // A range written is disjoint from every source or exactly one (its own rank's:
            // the fold reads each block of every source before writing it anywhere).
            if let Some(w) = destinations
                .iter()
                .find(|w| sources.iter().any(|r| r.overlaps(w) && r != *w))
            {
                return reject(format!(
                    "{here} writes rank {}'s destination while peers read it as a source",
                    plan.decl(w.buf).rank
                ));
            }
        }
    }
    super::fused::check_fused(plan, &meetings)
}
