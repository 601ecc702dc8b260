//! Check 2, enqueue: the host threads are simulated, rank by rank, the way the executors' rank
//! threads enqueue (`exec::enqueue_rank`).
//!
//! Each rank walks its program in order and may enqueue a wait only once the event's record has
//! been enqueued — by itself earlier, or by another rank, which then hands the event over. On
//! CUDA a wait enqueued before its record is a silent no-op; here it is a rejected plan. A
//! `PeerReduce` is a meeting: a rank stops there until every rank has arrived. If the ranks get
//! stuck, the plan would deadlock the host threads, and is rejected too.
//!
//! The order the simulation enqueues in is one legal execution order, and the race and result
//! checks read it. Invariant of an order (what [`check_order`] enforces for one a caller made):
//! every entry names an instruction of the plan, and each meeting's peer reduces stand together,
//! ranks 0..world in order.

use super::{describe, reject, Check};
use crate::plan::{Instr, Op, Plan};

/// Check 2: simulates the host threads' enqueue and returns the order they enqueue in, as
/// `(rank, instruction index)`.
pub fn enqueue_order(plan: &Plan) -> Check<Vec<(usize, usize)>> {
    let mut next = vec![0usize; plan.world];
    let mut enqueued = vec![false; plan.events.len()];
    let mut order = Vec::with_capacity(plan.len());
    let at_meeting = |rank: usize, next: &[usize]| {
        plan.ranks[rank]
            .get(next[rank])
            .is_some_and(|i| matches!(i.op, Op::PeerReduce { .. }))
    };
    loop {
        let mut progressed = false;
        #[allow(clippy::needless_range_loop)] // `rank` indexes the plan and `next` alike
        for rank in 0..plan.world {
            while let Some(instr) = plan.ranks[rank].get(next[rank]) {
                match instr.op {
                    Op::Wait(e) if !enqueued[e.0] => {
                        if plan.events[e.0].rank == rank {
                            return reject(format!(
                                "{} waits on its own event {} before recording it: on CUDA this wait is a silent no-op",
                                describe(plan, rank, next[rank]),
                                plan.events[e.0]
                            ));
                        }
                        break;
                    }
                    // A meeting: this rank goes no further until every rank has arrived.
                    Op::PeerReduce { .. } => break,
                    Op::Record(e) => enqueued[e.0] = true,
                    _ => {}
                }
                order.push((rank, next[rank]));
                next[rank] += 1;
                progressed = true;
            }
        }
        // Everyone at a meeting: it takes place, all ranks' instructions together (the race
        // and result checks rely on them being adjacent, rank 0 first).
        if plan.world > 0 && (0..plan.world).all(|r| at_meeting(r, &next)) {
            for (rank, i) in next.iter_mut().enumerate() {
                order.push((rank, *i));
                *i += 1;
            }
            progressed = true;
        }
        if order.len() == plan.len() {
            return Ok(order);
        }
        if !progressed {
            let stuck: Vec<String> = (0..plan.world)
                .map(|r| match plan.ranks[r].get(next[r]).map(|i| i.op) {
                    Some(Op::Wait(e)) => format!(
                        "{} waits for {}",
                        describe(plan, r, next[r]),
                        plan.events[e.0]
                    ),
                    Some(_) => format!(
                        "{} waits at the peer-reduce barrier for every rank",
                        describe(plan, r, next[r])
                    ),
                    None => format!("rank {r} has finished its program"),
                })
                .collect();
            return reject(format!(
                "the ranks would deadlock (or wait on a record that never comes before the wait): {}",
                stuck.join("; ")
            ));
        }
    }
}

/// Checks that a caller's `order` is laid out as the race and result checks read it: every entry
/// names an instruction of the plan, and the k-th `PeerReduce` of every rank — meeting k — stands
/// together, ranks 0..world in order, as [`enqueue_order`] lays it out. Returns the rejection
/// that names the first entry out of place; the checks never guess at a meeting's members.
pub(super) fn check_order(plan: &Plan, order: &[(usize, usize)]) -> Check {
    if plan.ranks.len() != plan.world {
        return reject(format!(
            "{} rank programs for world {}",
            plan.ranks.len(),
            plan.world
        ));
    }
    let is_meeting = |instr: &Instr| matches!(instr.op, Op::PeerReduce { .. });
    // Each rank's peer reduces, in program order: meeting k is entry k of every list.
    let peer_reduces: Vec<Vec<usize>> = plan
        .ranks
        .iter()
        .map(|program| {
            program
                .iter()
                .enumerate()
                .filter(|(_, i)| is_meeting(i))
                .map(|(index, _)| index)
                .collect()
        })
        .collect();
    let layout =
        "each meeting's peer reduces must stand together in the order, ranks 0..world in order";
    let (mut next, mut meeting) = (0, 0);
    while let Some(&(rank, index)) = order.get(next) {
        let Some(instr) = plan.ranks.get(rank).and_then(|program| program.get(index)) else {
            return reject(format!(
                "entry {next} of the order names rank {rank} instruction {index}, which the plan does not have"
            ));
        };
        if !is_meeting(instr) {
            next += 1;
            continue;
        }
        for member in 0..plan.world {
            let want = peer_reduces.get(member).and_then(|list| list.get(meeting));
            let got = order.get(next + member);
            if want.is_some() && got == want.map(|&i| (member, i)).as_ref() {
                continue;
            }
            let want = match want {
                Some(&i) => describe(plan, member, i),
                None => format!("rank {member}'s peer reduce {meeting} (it has none)"),
            };
            let got = match got {
                Some(&(r, i)) if plan.ranks.get(r).is_some_and(|p| i < p.len()) => {
                    describe(plan, r, i)
                }
                Some(&(r, i)) => format!("rank {r} instruction {i}, which the plan does not have"),
                None => "the end of the order".into(),
            };
            return reject(format!(
                "meeting {meeting} (starting at entry {next} of the order, {}) has {got} where it needs {want}: {layout}",
                describe(plan, rank, index)
            ));
        }
        next += plan.world;
        meeting += 1;
    }
    Ok(())
}
