//! The step table of a plan: for each rank, for each of its streams, the instructions in program
//! order, one line each — the stream, the instruction's index in the rank's program, what it does
//! (ranges in elements, events, peers) and where in the algorithm it sits ([`ringreduce::plan::Tag`]).
//!
//! Notation: `r1.slots[4..6]` is elements 4 to 6 (exclusive) of rank 1's buffer of that kind
//! ([`BufKind`]); `e7` is event 7 of the plan; `⊕` is the reduction.
//!
//! Invariant: one line per instruction, so the table has exactly [`Plan::len`] instruction lines,
//! and within a stream they appear in the order the stream runs them.

use ringreduce::plan::{BufKind, EventId, Instr, Op, Plan, Ranks, Region, StreamKind};

/// A buffer kind as the table names it.
pub fn kind_name(kind: BufKind) -> &'static str {
    match kind {
        BufKind::Input => "input",
        BufKind::Output => "output",
        BufKind::Slots => "slots",
        BufKind::HostSlots => "host-slots",
        BufKind::Exposed => "exposed",
        BufKind::HostExposed => "host-exposed",
        BufKind::Scratch => "scratch",
        BufKind::SendBuf(_) => "send",
        BufKind::RecvBuf(_) => "recv",
    }
}

/// A stream as the table names it.
pub fn stream_name(stream: StreamKind) -> &'static str {
    match stream {
        StreamKind::Main => "main",
        StreamKind::Send => "send",
        StreamKind::Recv => "recv",
        StreamKind::Reduce => "reduce",
    }
}

/// "r1.slots[4..6]".
pub fn region(plan: &Plan, r: Region) -> String {
    let decl = plan.decl(r.buf);
    format!(
        "r{}.{}[{}..{}]",
        decl.rank,
        kind_name(decl.kind),
        r.offset,
        r.end()
    )
}

/// "all ranks", "rank 2", "ranks 0,2,3": the members of `ranks` in a world of `world`.
fn ranks_text(ranks: Ranks, world: usize) -> String {
    if ranks == Ranks::ALL {
        return "all ranks".to_string();
    }
    let members: Vec<String> = (0..world)
        .filter(|&r| ranks.contains(r))
        .map(|r| r.to_string())
        .collect();
    match members.len() {
        1 => format!("rank {}", members[0]),
        _ => format!("ranks {}", members.join(",")),
    }
}

fn event(plan: &Plan, e: EventId) -> String {
    let decl = &plan.events[e.0];
    format!(
        "e{} ← r{}.{} ({})",
        e.0,
        decl.rank,
        stream_name(decl.stream),
        decl.what
    )
}

/// The instruction's verb ("copy", "expose", "reduce", "scale", "record", "wait",
/// "peer-reduce", "peer-reduce (fused)") and its operands.
pub fn describe(plan: &Plan, instr: &Instr) -> (&'static str, String) {
    match instr.op {
        Op::Copy { src, dst } => (
            "copy",
            format!("{} → {}", region(plan, src), region(plan, dst)),
        ),
        Op::Expose { src, dst } => (
            "expose",
            format!("{} → {}", region(plan, src), region(plan, dst)),
        ),
        Op::Reduce { dst, a, b } => (
            "reduce",
            format!(
                "{} = {} ⊕ {}",
                region(plan, dst),
                region(plan, a),
                region(plan, b)
            ),
        ),
        Op::Scale { region: r } => ("scale", format!("{} /= {}", region(plan, r), plan.world)),
        Op::Record(e) => ("record", format!("e{} ({})", e.0, plan.events[e.0].what)),
        Op::Wait(e) => ("wait", event(plan, e)),
        Op::PeerReduce {
            dst,
            src,
            offset,
            count,
            ranks,
            fused,
            push,
        } => (
            if fused {
                "peer-reduce (fused)"
            } else {
                "peer-reduce"
            },
            format!(
                "{} = ⊕ {}[{}..{}] of {}{}",
                region(plan, dst),
                kind_name(src),
                offset,
                offset + count,
                ranks_text(ranks, plan.world),
                match push {
                    Ranks::NONE => String::new(),
                    _ => format!(", pushed to {} too", ranks_text(push, plan.world)),
                }
            ),
        ),
    }
}

/// The buffers of rank `rank`: `"input[7], output[7], slots[6]"`.
fn buffers(plan: &Plan, rank: usize) -> String {
    let list: Vec<String> = plan
        .buffers
        .iter()
        .filter(|b| b.rank == rank)
        .map(|b| format!("{}[{}]", kind_name(b.kind), b.len))
        .collect();
    if list.is_empty() {
        "none".to_string()
    } else {
        list.join(", ")
    }
}

/// The whole table as text: a header line per rank, then its streams' instructions.
pub fn render(plan: &Plan) -> String {
    let described: Vec<Vec<(&str, String)>> = plan
        .ranks
        .iter()
        .map(|program| program.iter().map(|i| describe(plan, i)).collect())
        .collect();
    let width = described
        .iter()
        .flatten()
        .map(|(_, operands)| operands.chars().count())
        .max()
        .unwrap_or(0);
    let index_width = plan
        .ranks
        .iter()
        .map(Vec::len)
        .max()
        .unwrap_or(0)
        .to_string()
        .len()
        + 1;
    let mut out = String::new();
    for (rank, program) in plan.ranks.iter().enumerate() {
        let streams = plan.streams(rank);
        let names: Vec<&str> = streams.iter().map(|&s| stream_name(s)).collect();
        out += &format!(
            "rank {rank}: {} instruction{} on {}; buffers {}\n",
            program.len(),
            if program.len() == 1 { "" } else { "s" },
            if names.is_empty() {
                "no stream".to_string()
            } else {
                names.join(", ")
            },
            buffers(plan, rank)
        );
        for stream in streams {
            for (index, instr) in program.iter().enumerate() {
                if instr.stream != stream {
                    continue;
                }
                let (verb, operands) = &described[rank][index];
                let pad = width - operands.chars().count();
                out += &format!(
                    "  {:<6} {:>index_width$} {verb:<11} {operands}{}  {}\n",
                    stream_name(stream),
                    format!("#{index}"),
                    " ".repeat(pad),
                    instr.tag
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringreduce::plan::{EdgeTransport, Gather, OneShotSpec, RingSpec, TwoShotSpec};
    use ringreduce::ReduceOp;

    #[test]
    fn one_line_per_instruction_in_stream_order() {
        let plan = RingSpec::new(3, 7, 2, 2, EdgeTransport::Staged)
            .build()
            .unwrap();
        let text = render(&plan);
        let rank_lines = text.lines().filter(|l| l.starts_with("rank ")).count();
        let instr_lines: Vec<&str> = text.lines().filter(|l| l.starts_with("  ")).collect();
        assert_eq!(rank_lines, 3);
        assert_eq!(instr_lines.len(), plan.len());
        // Rank 0's send stream, as listed, is its send instructions in program order.
        let listed: Vec<usize> = text
            .split("rank 1:")
            .next()
            .unwrap()
            .lines()
            .filter(|l| l.trim_start().starts_with("send "))
            .map(|l| {
                let index = l.split('#').nth(1).unwrap();
                index.split_whitespace().next().unwrap().parse().unwrap()
            })
            .collect();
        let want: Vec<usize> = (0..plan.ranks[0].len())
            .filter(|&i| plan.ranks[0][i].stream == StreamKind::Send)
            .collect();
        assert_eq!(listed, want);
        assert!(text.contains("host-slots"), "{text}");
        // The operands column is aligned: every tag starts at the same character column.
        let tag_column =
            |l: &str| l.chars().count() - l.rsplit("  ").next().unwrap().chars().count();
        let first = tag_column(instr_lines[0]);
        assert!(instr_lines.iter().all(|l| tag_column(l) == first));
    }

    #[test]
    fn every_verb_is_named_with_its_operands() {
        let ring = RingSpec {
            op: ReduceOp::Avg,
            ..RingSpec::new(2, 4, 4, 1, EdgeTransport::Peer)
        };
        let text = render(&ring.build().unwrap());
        for needle in [
            "copy ", "reduce ", "scale ", "record ", "wait ", " ⊕ ", " /= 2",
        ] {
            assert!(text.contains(needle), "{needle:?} in\n{text}");
        }
        let oneshot = OneShotSpec {
            world: 3,
            count: 5,
            in_place: true,
            op: ReduceOp::Sum,
        };
        let text = render(&oneshot.build().unwrap());
        assert!(text.contains("peer-reduce"), "{text}");
        assert!(text.contains("= ⊕ exposed[0..5] of all ranks"), "{text}");
        let mut twoshot = TwoShotSpec {
            world: 3,
            count: 6,
            in_place: false,
            op: ReduceOp::Sum,
            align: 1,
            gather: Gather::Pull,
        };
        let text = render(&twoshot.build().unwrap());
        assert!(
            text.contains("of rank "),
            "a gather round reads one rank\n{text}"
        );
        twoshot.gather = Gather::Push;
        let text = render(&twoshot.build().unwrap());
        assert!(
            text.contains("output[0..2] = ⊕ input[0..2] of all ranks, pushed to ranks 1,2 too"),
            "rank 0 pushes its segment to the others\n{text}"
        );
    }
}
