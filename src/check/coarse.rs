//! The cell lemma: a plan is proven when its coarse form is — the same plan with every buffer cut
//! at its ranges' ends into cells and each cell shrunk to one element. Plans of one family (the
//! ring's, for every count that gives the same chunks per segment and the same short chunks) share
//! one coarse form, so a message size never seen before costs building the plan and comparing its
//! coarse form with the ones proven before, not the four checks. It generalises the scaling lemma
//! (`scaled.rs`, where every cell has the same length) to cells of any lengths, as the ring's
//! segments and chunks have.
//!
//! The cells. In each buffer, the ends of every range any instruction touches (and 0 and the
//! buffer's length) cut it into cells; the caller's count-long buffers (every rank's input and
//! output) share one cut, the union of all their ends, so that an output cell and the input cells
//! it must end holding lie at the same elements. Where an instruction moves one range's elements
//! to another's one to one (a copy, a reduction), an end inside either cuts the other at the same
//! place, until no cut changes: then the cells of paired ranges match in number and length. The
//! coarse form maps each end to its index among the ends: a range becomes the run of cells it
//! covers, a buffer as many elements as it has cells, the count the number of cells of the shared
//! cut.
//!
//! Why it holds, when [`coarsen`] accepts (an all-reduce without meetings, every instruction's
//! ranges covering cells of the same lengths, in order): every instruction acts on whole cells,
//! and element `t` of a cell in one operand meets element `t` of the matching cell in the others.
//! So (1) shape: a range lies in its buffer, two ranges are equal, overlap or are disjoint, and two
//! operands are as long — all as in the coarse form (the last checked here, cell by cell); events
//! and kinds are unchanged; (2) the enqueue simulation never looks at ranges; (3) two ranges
//! overlap iff they share a cell, so the race check finds the same pairs; (4) every element of a
//! cell holds the value its coarse element holds, at the same position of the same source cell —
//! a reduction's operands name the same source element iff their coarse elements do, and an output
//! element holds its own input element iff its coarse element does, since the input and output
//! cells are the same cut. Each check's verdict on the plan is its verdict on the coarse form.
//!
//! Scope: the all-reduce (the other collectives' expectations carry block offsets in elements,
//! which cells would have to preserve too), no `PeerReduce` (a meeting's offset and count apply
//! to every rank's buffer at once; the one-shot has the scaling lemma), and buffers that are each
//! their own memory with elements named by their own index — inputs, outputs, slots, scratch (the
//! race check pools a rank's exposed copies into one memory, and send and receive buffers name
//! their elements by transfer, which per-buffer cuts would not follow). Anything else is `None`,
//! and the caller runs the four checks on the plan itself. A check added later that is not
//! invariant under cell lengths (an alignment rule, say) belongs to the builder, not the checker.

use crate::plan::{BufId, BufKind, BufferDecl, Collective, Instr, Op, Plan, Region};
use std::collections::BTreeSet;

/// The coarse form of `plan` (module doc), or `None` where the lemma does not apply: then only
/// [`crate::check::check`] on the plan itself proves it. When `coarsen(p)` is `Some(c)` and `c`
/// passes the checks, so does `p`.
pub fn coarsen(plan: &Plan) -> Option<Plan> {
    if plan.collective != Collective::AllReduce {
        return None;
    }
    // The kinds whose buffers are each their own memory: the race check pools every exposed copy
    // of a rank (`Allocation::Exposure`), and send and receive buffers carry their own element
    // names, so cuts made per buffer would not describe them.
    let own_memory = |kind: BufKind| {
        matches!(
            kind,
            BufKind::Input
                | BufKind::Output
                | BufKind::Slots
                | BufKind::HostSlots
                | BufKind::Scratch
        )
    };
    if !plan.buffers.iter().all(|d| own_memory(d.kind)) {
        return None;
    }
    let callers = |decl: &BufferDecl| matches!(decl.kind, BufKind::Input | BufKind::Output);
    // Every caller's buffer is count long (the shape check would reject the plan otherwise; the
    // lemma simply declines it).
    if plan
        .buffers
        .iter()
        .any(|d| callers(d) && d.len != plan.count)
    {
        return None;
    }
    // The ends of every range, per buffer; the caller's buffers pooled into one cut (index
    // `plan.buffers.len()`).
    let shared = plan.buffers.len();
    let cut_of = |buf: BufId| match plan.buffers.get(buf.0) {
        Some(d) if callers(d) => Some(shared),
        Some(_) => Some(buf.0),
        None => None,
    };
    let mut cuts: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); shared + 1];
    for (b, decl) in plan.buffers.iter().enumerate() {
        let cut = if callers(decl) { shared } else { b };
        cuts[cut].extend([0, decl.len]);
    }
    // Ranges that move elements one to one (a copy's, a reduction's), as pairs.
    let mut pairs: Vec<(Region, Region)> = Vec::new();
    for instr in plan.ranks.iter().flatten() {
        for r in regions(&instr.op)? {
            let cut = cut_of(r.buf)?;
            cuts[cut].extend([r.offset, r.offset.checked_add(r.count)?]);
        }
        // (Empty ranges move nothing and have no inside.)
        match instr.op {
            Op::Copy { src, dst } if src.count == dst.count && dst.count > 0 => {
                pairs.push((src, dst))
            }
            Op::Reduce { dst, a, b }
                if a.count == dst.count && b.count == dst.count && dst.count > 0 =>
            {
                pairs.extend([(dst, a), (dst, b)])
            }
            _ => {}
        }
    }
    // An end inside one range of a pair cuts the other at the same place, until nothing changes:
    // then the cells of paired ranges match one to one (a short chunk that shares a slot with
    // full ones cuts the full ones' cells too). Ends only ever grow, bounded by the elements.
    // In rounds: each round carries only the ends that are new since the last one (at first,
    // every end) through every pair, so an end crosses each pair once and a round costs the
    // pairs' lookups plus the ends it adds — linear in the plan times the rounds, which are as
    // many as the longest chain of pairs an end travels (not the number of ends).
    let mut fresh = cuts.clone();
    while fresh.iter().any(|f| !f.is_empty()) {
        let mut next: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); shared + 1];
        for &(x, y) in &pairs {
            for (from, to) in [(x, y), (y, x)] {
                let (cf, ct) = (cut_of(from.buf)?, cut_of(to.buf)?);
                for &e in fresh[cf].range(from.offset + 1..from.offset + from.count) {
                    let moved = to.offset + (e - from.offset);
                    if cuts[ct].insert(moved) {
                        next[ct].insert(moved);
                    }
                }
            }
        }
        fresh = next;
    }
    let ends: Vec<Vec<usize>> = cuts.into_iter().map(|c| c.into_iter().collect()).collect();
    // A range's cells: the indices of its ends in its buffer's cut.
    let cells = |r: Region| -> Option<(usize, usize)> {
        let e = &ends[cut_of(r.buf)?];
        let from = e.binary_search(&r.offset).ok()?;
        let to = e.binary_search(&(r.offset + r.count)).ok()?;
        Some((from, to))
    };
    // Whether two ranges' cells match one to one, in number and length: the same ends, relative
    // to each range's start.
    let matching = |x: Region, y: Region| -> Option<bool> {
        let ((xf, xt), (yf, yt)) = (cells(x)?, cells(y)?);
        let (ex, ey) = (
            &ends[cut_of(x.buf)?][xf..=xt],
            &ends[cut_of(y.buf)?][yf..=yt],
        );
        Some(ex.len() == ey.len() && ex.iter().zip(ey).all(|(a, b)| a - x.offset == b - y.offset))
    };
    let coarse = |r: Region| -> Option<Region> {
        let (from, to) = cells(r)?;
        Some(Region {
            buf: r.buf,
            offset: from,
            count: to - from,
        })
    };
    let mut ranks = Vec::with_capacity(plan.ranks.len());
    for program in &plan.ranks {
        let mut out = Vec::with_capacity(program.len());
        for instr in program {
            let op = match instr.op {
                Op::Copy { src, dst } => {
                    if !matching(src, dst)? {
                        return None;
                    }
                    Op::Copy {
                        src: coarse(src)?,
                        dst: coarse(dst)?,
                    }
                }
                Op::Reduce { dst, a, b } => {
                    if !matching(dst, a)? || !matching(dst, b)? {
                        return None;
                    }
                    Op::Reduce {
                        dst: coarse(dst)?,
                        a: coarse(a)?,
                        b: coarse(b)?,
                    }
                }
                Op::Scale { region } => Op::Scale {
                    region: coarse(region)?,
                },
                Op::Record(e) => Op::Record(e),
                Op::Wait(e) => Op::Wait(e),
                Op::PeerReduce { .. } | Op::Expose { .. } => return None,
            };
            out.push(Instr { op, ..*instr });
        }
        ranks.push(out);
    }
    // A length in cells: the index of its end in the cut. (A range reaching past its buffer's end
    // then reaches past the coarse buffer's end too, and the shape check rejects the coarse form.)
    let cells_to = |cut: usize, len: usize| ends[cut].binary_search(&len).ok();
    Some(Plan {
        count: cells_to(shared, plan.count)?,
        buffers: plan
            .buffers
            .iter()
            .enumerate()
            .map(|(b, d)| {
                let cut = if callers(d) { shared } else { b };
                Some(BufferDecl {
                    len: cells_to(cut, d.len)?,
                    ..d.clone()
                })
            })
            .collect::<Option<_>>()?,
        ranks,
        ..plan.clone()
    })
}

/// The ranges an operation names; `None` for a meeting or an exposure (out of the lemma's
/// scope).
fn regions(op: &Op) -> Option<Vec<Region>> {
    Some(match *op {
        Op::Copy { src, dst } => vec![src, dst],
        Op::Reduce { dst, a, b } => vec![dst, a, b],
        Op::Scale { region } => vec![region],
        Op::Record(_) | Op::Wait(_) => vec![],
        Op::PeerReduce { .. } | Op::Expose { .. } => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::check;
    use crate::plan::{EventDecl, EventId, StreamKind, Tag};

    fn instr(stream: StreamKind, op: Op) -> Instr {
        Instr {
            stream,
            op,
            tag: Tag::ENTRY,
        }
    }

    fn region(buf: usize, offset: usize, count: usize) -> Region {
        Region {
            buf: BufId(buf),
            offset,
            count,
        }
    }

    /// Two exposed copies of one rank are one memory to the race check: per-buffer cuts (here
    /// bent by an empty `Scale`) would map two racing writes to disjoint cells, so the lemma
    /// declines such plans, and the full check finds the race.
    #[test]
    fn buffers_the_race_check_pools_are_declined() {
        let decl = |kind, len| BufferDecl { rank: 0, kind, len };
        let event = |stream| EventDecl {
            rank: 0,
            stream,
            tag: Tag::ENTRY,
            what: "test",
        };
        let (main, send) = (StreamKind::Main, StreamKind::Send);
        let plan = Plan {
            collective: Collective::AllReduce,
            world: 1,
            count: 1,
            in_place: true,
            average: false,
            buffers: vec![
                decl(BufKind::Output, 1),
                decl(BufKind::Exposed, 3),
                decl(BufKind::Exposed, 3),
            ],
            events: vec![event(main), event(send)],
            ranks: vec![vec![
                instr(main, Op::Record(EventId(0))),
                instr(send, Op::Wait(EventId(0))),
                instr(
                    main,
                    Op::Scale {
                        region: region(2, 1, 0),
                    },
                ),
                instr(
                    main,
                    Op::Copy {
                        src: region(0, 0, 1),
                        dst: region(1, 2, 1),
                    },
                ),
                instr(
                    send,
                    Op::Copy {
                        src: region(0, 0, 1),
                        dst: region(2, 2, 1),
                    },
                ),
                instr(send, Op::Record(EventId(1))),
                instr(main, Op::Wait(EventId(1))),
            ]],
        };
        assert!(check(&plan).is_err(), "the two copies race");
        assert_eq!(coarsen(&plan), None);
    }

    /// An empty copy has no inside to mirror (and must not panic the cut).
    #[test]
    fn empty_copies_are_cut_nowhere() {
        let mut plan = crate::plan::RingSpec::new(2, 10, 3, 2, crate::plan::EdgeTransport::Peer)
            .build()
            .unwrap();
        let slots = plan
            .buffers
            .iter()
            .position(|d| d.kind == BufKind::Slots)
            .unwrap();
        let empty = instr(
            StreamKind::Main,
            Op::Copy {
                src: region(slots, 2, 0),
                dst: region(slots, 1, 0),
            },
        );
        plan.ranks[0].insert(0, empty);
        let coarse = coarsen(&plan).expect("a ring plan with an empty copy");
        check(&coarse).unwrap();
        check(&plan).unwrap();
    }
}
