//! The timeline of a plan, as SVG: one lane per (rank, stream), each instruction a box, arrows from
//! each record to the waits on it in other lanes, and a dashed line through each peer-reduce
//! meeting.
//!
//! Layout rule (a dependency depth, not a measurement): every instruction takes one unit, and
//! starts as soon as the plan allows — after the previous instruction on its stream (a stream runs
//! in order), after the record of the event it waits on, and, for a peer reduce, when the last rank
//! of its meeting is ready (the start barrier). The instructions are visited in the order the
//! library's enqueue simulation gives ([`ringreduce::check::enqueue_order`]), which already puts
//! every record before its waits; the meetings' barriers are settled by repeating the pass until
//! nothing moves.
//!
//! Invariant: within a lane the boxes never overlap, and every wait's box starts right of its
//! record's box.

use super::table::{describe, stream_name};
use ringreduce::plan::{Op, Plan};
use std::collections::HashMap;

/// The column each instruction starts at: `start[rank][index]`, and the number of columns.
#[derive(Debug, PartialEq, Eq)]
pub struct Schedule {
    pub start: Vec<Vec<usize>>,
    pub columns: usize,
}

/// The instructions in enqueue order: the checker's simulation where it succeeds, otherwise rank
/// by rank in program order (the repeated pass below still settles every dependency).
fn visit_order(plan: &Plan) -> Vec<(usize, usize)> {
    ringreduce::check::enqueue_order(plan).unwrap_or_else(|_| {
        (0..plan.world)
            .flat_map(|rank| (0..plan.ranks[rank].len()).map(move |index| (rank, index)))
            .collect()
    })
}

/// Places every instruction by the layout rule of the module doc.
pub fn schedule(plan: &Plan) -> Schedule {
    let mut recorded_at = HashMap::new();
    // The instruction before each one on its own stream.
    let mut previous: Vec<Vec<Option<usize>>> = Vec::with_capacity(plan.world);
    // The k-th peer reduce of every rank is one meeting.
    let mut meeting_of: HashMap<(usize, usize), usize> = HashMap::new();
    let mut meetings: Vec<Vec<(usize, usize)>> = Vec::new();
    for (rank, program) in plan.ranks.iter().enumerate() {
        let mut last = [None; 4];
        let mut peer = 0;
        previous.push(
            program
                .iter()
                .enumerate()
                .map(|(index, instr)| {
                    match instr.op {
                        Op::Record(e) => {
                            recorded_at.insert(e, (rank, index));
                        }
                        Op::PeerReduce { .. } => {
                            if meetings.len() <= peer {
                                meetings.push(Vec::new());
                            }
                            meetings[peer].push((rank, index));
                            meeting_of.insert((rank, index), peer);
                            peer += 1;
                        }
                        _ => {}
                    }
                    last[instr.stream.index()].replace(index)
                })
                .collect(),
        );
    }
    let mut start: Vec<Vec<usize>> = plan.ranks.iter().map(|p| vec![0; p.len()]).collect();
    // When (rank, index) could start if it waited for nobody at a barrier.
    let ready = |start: &[Vec<usize>], rank: usize, index: usize| {
        let mut t = previous[rank][index].map_or(0, |p| start[rank][p] + 1);
        if let Op::Wait(e) = plan.ranks[rank][index].op {
            if let Some(&(r, i)) = recorded_at.get(&e) {
                t = t.max(start[r][i] + 1);
            }
        }
        t
    };
    let order = visit_order(plan);
    // Each pass only moves boxes right; a plan that the checker accepts settles in a few passes.
    // The bound keeps a cyclic (rejected) plan from looping.
    for _ in 0..=plan.len() {
        let mut moved = false;
        for &(rank, index) in &order {
            let t = match meeting_of.get(&(rank, index)) {
                Some(&k) => meetings[k]
                    .iter()
                    .map(|&(r, i)| ready(&start, r, i))
                    .max()
                    .unwrap_or(0),
                None => ready(&start, rank, index),
            };
            if t > start[rank][index] {
                start[rank][index] = t;
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    let columns = start.iter().flatten().map(|&t| t + 1).max().unwrap_or(0);
    Schedule { start, columns }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const LEFT: usize = 110;
const TOP: usize = 64;
const COLUMN: usize = 62;
const BOX: usize = 56;
const LANE: usize = 28;
const BOX_HEIGHT: usize = 20;
/// The notes under the title and the legend need about this much.
const MIN_WIDTH: usize = 960;

/// Fill colour and short label of a box.
fn style(op: &Op) -> (&'static str, String) {
    match *op {
        Op::Copy { .. } => ("#a6cee3", "copy".into()),
        Op::Expose { .. } => ("#a6cee3", "expose".into()),
        Op::Reduce { .. } => ("#fdbf6f", "reduce".into()),
        Op::Scale { .. } => ("#b2df8a", "scale".into()),
        Op::Record(e) => ("#ccebc5", format!("rec e{}", e.0)),
        Op::Wait(e) => ("#fbb4ae", format!("wait e{}", e.0)),
        Op::PeerReduce { .. } => ("#decbe4", "peer".into()),
    }
}

/// The timeline of `plan` as an SVG document, titled `title`.
pub fn render_svg(plan: &Plan, title: &str) -> String {
    let sched = schedule(plan);
    let mut lane_of = HashMap::new();
    let mut lanes = Vec::new();
    for rank in 0..plan.world {
        for stream in plan.streams(rank) {
            lane_of.insert((rank, stream), lanes.len());
            lanes.push(format!("rank {rank} {}", stream_name(stream)));
        }
    }
    // Wide enough for the lanes, and for the title and the notes on a short plan.
    let text_width = (10 + title.chars().count() * 8).max(MIN_WIDTH);
    let width = (LEFT + sched.columns.max(1) * COLUMN + 20).max(text_width);
    let legend_y = TOP + lanes.len() * LANE + 16;
    let height = legend_y + 56;
    let x_of = |rank: usize, index: usize| LEFT + sched.start[rank][index] * COLUMN;
    let y_of = |rank: usize, index: usize| {
        TOP + lane_of[&(rank, plan.ranks[rank][index].stream)] * LANE + (LANE - BOX_HEIGHT) / 2
    };
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"10\">\n\
         <defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" \
         markerWidth=\"6\" markerHeight=\"6\" orient=\"auto-start-reverse\">\
         <path d=\"M 0 0 L 10 5 L 0 10 z\" fill=\"#7f0000\"/></marker></defs>\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"20\" font-size=\"14\">{}</text>\n\
         <text x=\"10\" y=\"38\" fill=\"#555\">x: dependency depth (each instruction one unit; a \
         stream runs in order, a wait after its record, a peer-reduce meeting when its last rank \
         is ready) — not measured time</text>\n",
        escape(title)
    );
    for (lane, name) in lanes.iter().enumerate() {
        let y = TOP + lane * LANE;
        let shade = if lane % 2 == 0 { "#f6f6f6" } else { "#ffffff" };
        svg += &format!(
            "<rect x=\"0\" y=\"{y}\" width=\"{width}\" height=\"{LANE}\" fill=\"{shade}\"/>\n\
             <text x=\"8\" y=\"{}\">{name}</text>\n",
            y + LANE / 2 + 4
        );
    }
    for (rank, program) in plan.ranks.iter().enumerate() {
        for (index, instr) in program.iter().enumerate() {
            let (x, y) = (x_of(rank, index), y_of(rank, index));
            let (fill, label) = style(&instr.op);
            let (verb, operands) = describe(plan, instr);
            svg += &format!(
                "<g class=\"instr\"><title>rank {rank} {} #{index}: {verb} {} ({})</title>\
                 <rect x=\"{x}\" y=\"{y}\" width=\"{BOX}\" height=\"{BOX_HEIGHT}\" rx=\"3\" \
                 fill=\"{fill}\" stroke=\"#333\" stroke-width=\"0.6\"/>\
                 <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{label}</text></g>\n",
                stream_name(instr.stream),
                escape(&operands),
                escape(&instr.tag.to_string()),
                x + BOX / 2,
                y + BOX_HEIGHT / 2 + 4
            );
        }
    }
    // Record → wait across lanes.
    let mut recorded_at = HashMap::new();
    for (rank, program) in plan.ranks.iter().enumerate() {
        for (index, instr) in program.iter().enumerate() {
            if let Op::Record(e) = instr.op {
                recorded_at.insert(e, (rank, index));
            }
        }
    }
    for (rank, program) in plan.ranks.iter().enumerate() {
        for (index, instr) in program.iter().enumerate() {
            let Op::Wait(e) = instr.op else { continue };
            let Some(&(r, i)) = recorded_at.get(&e) else {
                continue;
            };
            if plan.ranks[r][i].stream == instr.stream && r == rank {
                continue;
            }
            let color = if r == rank { "#999999" } else { "#7f0000" };
            svg += &format!(
                "<line class=\"event\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{color}\" \
                 stroke-width=\"0.8\" marker-end=\"url(#arrow)\"/>\n",
                x_of(r, i) + BOX,
                y_of(r, i) + BOX_HEIGHT / 2,
                x_of(rank, index),
                y_of(rank, index) + BOX_HEIGHT / 2
            );
        }
    }
    // Peer-reduce meetings: the k-th peer reduce of every rank.
    let mut meetings: Vec<Vec<(usize, usize)>> = Vec::new();
    for (rank, program) in plan.ranks.iter().enumerate() {
        let peers = program
            .iter()
            .enumerate()
            .filter(|(_, i)| matches!(i.op, Op::PeerReduce { .. }));
        for (k, (index, _)) in peers.enumerate() {
            if meetings.len() <= k {
                meetings.push(Vec::new());
            }
            meetings[k].push((rank, index));
        }
    }
    for meeting in meetings.iter().filter(|m| m.len() > 1) {
        let points: Vec<String> = meeting
            .iter()
            .map(|&(r, i)| format!("{},{}", x_of(r, i) - 2, y_of(r, i) + BOX_HEIGHT / 2))
            .collect();
        svg += &format!(
            "<polyline class=\"meeting\" points=\"{}\" fill=\"none\" stroke=\"#6a3d9a\" \
             stroke-dasharray=\"3,2\"/>\n",
            points.join(" ")
        );
    }
    // Legend.
    let entries = [
        ("#a6cee3", "copy"),
        ("#fdbf6f", "reduce"),
        ("#b2df8a", "scale (avg)"),
        ("#ccebc5", "record event"),
        ("#fbb4ae", "wait on event"),
        ("#decbe4", "peer reduce"),
    ];
    for (n, (fill, name)) in entries.iter().enumerate() {
        let x = 10 + n * 120;
        svg += &format!(
            "<rect x=\"{x}\" y=\"{legend_y}\" width=\"14\" height=\"12\" fill=\"{fill}\" \
             stroke=\"#333\" stroke-width=\"0.6\"/><text x=\"{}\" y=\"{}\">{name}</text>\n",
            x + 18,
            legend_y + 10
        );
    }
    svg += &format!(
        "<text x=\"10\" y=\"{}\" fill=\"#555\">arrows: a record and a wait on it in another lane \
         (dark red: across ranks); dashed: one peer-reduce meeting (start and end barrier of all \
         its ranks); hover a box for the instruction</text>\n</svg>\n",
        legend_y + 34
    );
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringreduce::plan::{EdgeTransport, OneShotSpec, RingSpec, TwoShotSpec};
    use ringreduce::ReduceOp;

    fn plans() -> Vec<Plan> {
        vec![
            RingSpec::new(3, 7, 2, 2, EdgeTransport::Peer)
                .build()
                .unwrap(),
            RingSpec::new(4, 16, 1, 1, EdgeTransport::Staged)
                .build()
                .unwrap(),
            OneShotSpec {
                world: 3,
                count: 5,
                in_place: true,
                op: ReduceOp::Avg,
            }
            .build()
            .unwrap(),
            TwoShotSpec {
                world: 4,
                count: 10,
                in_place: false,
                op: ReduceOp::Sum,
                align: 1,
                gather: ringreduce::plan::Gather::Pull,
            }
            .build()
            .unwrap(),
        ]
    }

    #[test]
    fn the_schedule_keeps_every_dependency() {
        for plan in plans() {
            let s = schedule(&plan);
            let mut recorded = HashMap::new();
            for (rank, program) in plan.ranks.iter().enumerate() {
                let mut last = [None::<usize>; 4];
                for (index, instr) in program.iter().enumerate() {
                    let t = s.start[rank][index];
                    assert!(t < s.columns);
                    if let Some(p) = last[instr.stream.index()] {
                        assert!(t > p, "rank {rank} #{index} overlaps its stream's previous");
                    }
                    last[instr.stream.index()] = Some(t);
                    if let Op::Record(e) = instr.op {
                        recorded.insert(e, t);
                    }
                }
            }
            let mut meetings: HashMap<usize, Vec<usize>> = HashMap::new();
            for (rank, program) in plan.ranks.iter().enumerate() {
                let mut k = 0;
                for (index, instr) in program.iter().enumerate() {
                    let t = s.start[rank][index];
                    match instr.op {
                        Op::Wait(e) => assert!(t > recorded[&e], "wait before its record"),
                        Op::PeerReduce { .. } => {
                            meetings.entry(k).or_default().push(t);
                            k += 1;
                        }
                        _ => {}
                    }
                }
            }
            for starts in meetings.values() {
                assert!(
                    starts.iter().all(|&t| t == starts[0]),
                    "a meeting starts together"
                );
            }
        }
    }

    #[test]
    fn the_svg_has_a_box_per_instruction_and_an_arrow_per_remote_wait() {
        for plan in plans() {
            let svg = render_svg(&plan, "a <test> & title");
            assert!(svg.starts_with("<svg"));
            assert!(svg.trim_end().ends_with("</svg>"));
            assert!(svg.contains("a &lt;test&gt; &amp; title"));
            assert_eq!(svg.matches("<g class=\"instr\">").count(), plan.len());
            let remote: usize = plan.remote_waiters().iter().map(Vec::len).sum();
            assert!(svg.matches("class=\"event\"").count() >= remote);
            let lanes: usize = (0..plan.world).map(|r| plan.streams(r).len()).sum();
            assert!(svg.contains(&format!("rank {} ", plan.world - 1)));
            assert!(lanes > 0);
        }
    }
}
