//! The plan checker: proves, on the CPU, that a [`Plan`] is a correct all-reduce before any
//! executor runs it.
//!
//! Four checks, in order; the first failure is returned as a message that names the rank, the
//! instruction and the place in the algorithm:
//!
//! 1. **Shape** — every region lies inside its buffer, copies have equal lengths, a reduction's
//!    destination is its first operand or disjoint from both, nothing writes an input, each event
//!    is recorded exactly once, on the rank and stream its declaration names.
//! 2. **Enqueue** — the host threads are simulated: each rank walks its program in order and may
//!    enqueue a wait only once the event's record has been enqueued (by itself earlier, or by
//!    another rank, which then hands the event over). On CUDA a wait enqueued before its record is a
//!    silent no-op; here it is a rejected plan. If the ranks get stuck, the plan would deadlock the
//!    host threads, and is rejected too. The order the simulation enqueues in is one legal
//!    execution order.
//! 3. **No data race** — happens-before is program order within a stream plus record → wait edges
//!    (vector clocks, one component per stream). Any two accesses to overlapping elements of one
//!    buffer, at least one a write, must be ordered. Checking `calls = 2` runs the plan twice back
//!    to back (streams and events persist, the caller's barrier between calls), which proves that
//!    the next call cannot trample a slot the previous call is still reading; [`check_sequence`]
//!    does the same for calls of *different* plans (shapes change from call to call; each plan has
//!    its own events and staging, the caller's buffers may be the same). Each rank's last Main
//!    instruction must also come after every access to its input and output: when Main is done,
//!    the caller's buffers are free.
//! 4. **Symbolic result** — the plan is executed on sets of contributions: rank r's input holds
//!    `{r}`, a reduction takes the union and rejects operands that share a rank (a contribution
//!    counted twice), a read of memory nothing wrote is rejected. Every element of every output
//!    must end holding every rank exactly once (and, for `Avg`, scaled exactly once, after the sum
//!    was complete). Because the plan is race-free, the order of execution cannot change this.

use crate::plan::{BufId, BufKind, EventId, Instr, Op, Plan, Region, StreamKind};
use std::collections::HashMap;

/// Why a plan was rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection(pub String);

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<Rejection> for crate::error::Error {
    fn from(r: Rejection) -> Self {
        crate::error::Error::PlanRejected(r.0)
    }
}

type Check<T = ()> = Result<T, Rejection>;

fn reject<T>(msg: String) -> Check<T> {
    Err(Rejection(msg))
}

/// The largest world the symbolic check represents (contributions are bits of a `u128`).
pub const MAX_SYMBOLIC_WORLD: usize = 128;

/// Runs all four checks on one call of the plan and on two back-to-back calls.
pub fn check(plan: &Plan) -> Check {
    check_shape(plan)?;
    let order = enqueue_order(plan)?;
    check_races(plan, &order, 2)?;
    check_result(plan, &order)
}

fn describe(plan: &Plan, rank: usize, index: usize) -> String {
    let instr = &plan.ranks[rank][index];
    format!(
        "rank {rank} instruction {index} ({:?} on {:?}, {})",
        instr.op, instr.stream, instr.tag
    )
}

/// Regions an instruction reads and writes.
fn accesses(op: &Op) -> (Vec<Region>, Vec<Region>) {
    match *op {
        Op::Copy { src, dst } => (vec![src], vec![dst]),
        Op::Reduce { dst, a, b } => (vec![a, b], vec![dst]),
        Op::Scale { region } => (vec![region], vec![region]),
        Op::Record(_) | Op::Wait(_) => (vec![], vec![]),
    }
}

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
    for (rank, program) in plan.ranks.iter().enumerate() {
        for (i, instr) in program.iter().enumerate() {
            let (reads, writes) = accesses(&instr.op);
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
            for w in &writes {
                if plan.decl(w.buf).kind == BufKind::Input {
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
    Ok(())
}

/// Check 2: simulates the host threads' enqueue and returns the order they enqueue in, as
/// `(rank, instruction index)`.
pub fn enqueue_order(plan: &Plan) -> Check<Vec<(usize, usize)>> {
    let mut next = vec![0usize; plan.world];
    let mut enqueued = vec![false; plan.events.len()];
    let mut order = Vec::with_capacity(plan.len());
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
                    Op::Record(e) => enqueued[e.0] = true,
                    _ => {}
                }
                order.push((rank, next[rank]));
                next[rank] += 1;
                progressed = true;
            }
        }
        if order.len() == plan.len() {
            return Ok(order);
        }
        if !progressed {
            let stuck: Vec<String> = (0..plan.world)
                .filter(|&r| next[r] < plan.ranks[r].len())
                .map(|r| {
                    let Op::Wait(e) = plan.ranks[r][next[r]].op else {
                        unreachable!()
                    };
                    format!(
                        "{} waits for {}",
                        describe(plan, r, next[r]),
                        plan.events[e.0]
                    )
                })
                .collect();
            return reject(format!(
                "the host threads would deadlock (or wait on a record that never comes before the wait): {}",
                stuck.join("; ")
            ));
        }
    }
}

/// One memory access, for the race check.
struct Access {
    region: Region,
    write: bool,
    /// Index into the executed-instruction list.
    at: usize,
}

/// Memory as the race check identifies it across calls: the caller's buffers are the same memory
/// in every call (the worst case: the caller passes the same buffers again); staging belongs to
/// one prepared plan and is shared only by the calls of that plan.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Memory {
    User(usize, BufKind),
    Staging(usize, BufId),
}

/// Check 3: no data race over `calls` back-to-back calls, and completion on Main covers the
/// caller's buffers.
pub fn check_races(plan: &Plan, order: &[(usize, usize)], calls: usize) -> Check {
    races(&[(plan, order)], &vec![0; calls])
}

/// Check 3 for a sequence of calls of different plans of one world — what an executor does when
/// shapes change from call to call (a size sweep, a training step with tensors of several
/// sizes): streams persist, each plan has its own events and staging, and the caller's buffers
/// may be the same in every call.
pub fn check_sequence(plans: &[&Plan], sequence: &[usize]) -> Check {
    let orders = plans
        .iter()
        .map(|p| enqueue_order(p))
        .collect::<Check<Vec<_>>>()?;
    let with_orders: Vec<(&Plan, &[(usize, usize)])> = plans
        .iter()
        .zip(&orders)
        .map(|(p, o)| (*p, o.as_slice()))
        .collect();
    races(&with_orders, sequence)
}

fn races(plans: &[(&Plan, &[(usize, usize)])], sequence: &[usize]) -> Check {
    let Some(&(first, _)) = plans.first() else {
        return Ok(());
    };
    let world = first.world;
    if plans.iter().any(|(p, _)| p.world != world) {
        return reject("a sequence of calls must keep one world".into());
    }
    if let Some(&bad) = sequence.iter().find(|&&k| k >= plans.len()) {
        return reject(format!("the sequence names plan {bad} of {}", plans.len()));
    }
    let streams = world * StreamKind::ALL.len();
    let stream_of =
        |rank: usize, instr: &Instr| rank * StreamKind::ALL.len() + instr.stream.index();
    let memory = |k: usize, buf: BufId| {
        let decl = plans[k].0.decl(buf);
        match decl.kind {
            BufKind::Input | BufKind::Output => Memory::User(decl.rank, decl.kind),
            BufKind::Slots | BufKind::HostSlots => Memory::Staging(k, buf),
        }
    };
    // Vector clock of each stream and of each event's latest record, per plan.
    let mut stream_clock = vec![vec![0u32; streams]; streams];
    let mut event_clock: Vec<Vec<Option<Vec<u32>>>> = plans
        .iter()
        .map(|(p, _)| vec![None; p.events.len()])
        .collect();
    // Per executed instruction: (plan, rank, index, call, stream, own sequence number).
    let mut executed: Vec<(usize, usize, usize, usize, usize, u32)> = Vec::new();
    let mut clocks: Vec<Vec<u32>> = Vec::new();
    let mut by_memory: HashMap<Memory, Vec<(Access, usize)>> = HashMap::new();
    for (call, &k) in sequence.iter().enumerate() {
        let (plan, order) = plans[k];
        for &(rank, index) in order {
            let instr = &plan.ranks[rank][index];
            let s = stream_of(rank, instr);
            if let Op::Wait(e) = instr.op {
                let recorded = event_clock[k][e.0]
                    .as_ref()
                    .expect("enqueue order puts records before waits");
                for (mine, theirs) in stream_clock[s].iter_mut().zip(recorded) {
                    *mine = (*mine).max(*theirs);
                }
            }
            stream_clock[s][s] += 1;
            if let Op::Record(e) = instr.op {
                event_clock[k][e.0] = Some(stream_clock[s].clone());
            }
            let at = executed.len();
            executed.push((k, rank, index, call, s, stream_clock[s][s]));
            clocks.push(stream_clock[s].clone());
            let (reads, writes) = accesses(&instr.op);
            for (region, write) in reads
                .into_iter()
                .map(|r| (r, false))
                .chain(writes.into_iter().map(|w| (w, true)))
            {
                if region.count > 0 {
                    by_memory
                        .entry(memory(k, region.buf))
                        .or_default()
                        .push((Access { region, write, at }, k));
                }
            }
        }
    }
    let before = |a: usize, b: usize| {
        let (_, _, _, _, s, seq) = executed[a];
        clocks[b][s] >= seq
    };
    let name = |at: usize| {
        let (k, rank, index, call, _, _) = executed[at];
        format!("{} in call {}", describe(plans[k].0, rank, index), call + 1)
    };
    let what = |k: usize, buf: BufId| {
        let decl = plans[k].0.decl(buf);
        format!("{:?} of rank {}", decl.kind, decl.rank)
    };
    for list in by_memory.values_mut() {
        list.sort_by_key(|(a, _)| (a.region.offset, a.at));
        for i in 0..list.len() {
            for j in i + 1..list.len() {
                let ((x, kx), (y, _)) = (&list[i], &list[j]);
                if y.region.offset >= x.region.end() {
                    break;
                }
                if !(x.write || y.write) || x.at == y.at {
                    continue;
                }
                let (first, second) = if x.at < y.at {
                    (x.at, y.at)
                } else {
                    (y.at, x.at)
                };
                if !before(first, second) {
                    return reject(format!(
                        "data race on {} (elements {}..{} and {}..{}): {} and {} are not ordered by any event",
                        what(*kx, x.region.buf),
                        x.region.offset,
                        x.region.end(),
                        y.region.offset,
                        y.region.end(),
                        name(first),
                        name(second)
                    ));
                }
            }
        }
    }
    // Completion: rank r's last Main instruction (of the last call) follows every access to its
    // input and output.
    for rank in 0..world {
        let Some(last) = (0..executed.len()).rev().find(|&at| {
            let (k, r, index, ..) = executed[at];
            r == rank && plans[k].0.ranks[r][index].stream == StreamKind::Main
        }) else {
            continue;
        };
        for (mem, list) in &by_memory {
            let Memory::User(owner, kind) = *mem else {
                continue;
            };
            if owner != rank {
                continue;
            }
            if let Some((a, _)) = list
                .iter()
                .find(|(a, _)| a.at != last && !before(a.at, last))
            {
                return reject(format!(
                    "rank {rank}'s Main stream can finish before {} is done with its {kind:?}: the caller would see the call complete too early",
                    name(a.at),
                ));
            }
        }
    }
    Ok(())
}

/// A symbolic value: which ranks' inputs an element holds, and how often it was scaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sym {
    ranks: u128,
    scaled: u8,
}

/// Check 4: executes the plan on sets of contributions in the given (legal) order.
pub fn check_result(plan: &Plan, order: &[(usize, usize)]) -> Check {
    if plan.world > MAX_SYMBOLIC_WORLD {
        return reject(format!(
            "the symbolic check handles at most {MAX_SYMBOLIC_WORLD} ranks"
        ));
    }
    let mut memory: Vec<Vec<Option<Sym>>> = plan
        .buffers
        .iter()
        .map(|decl| {
            let own = Some(Sym {
                ranks: 1u128 << decl.rank,
                scaled: 0,
            });
            let holds_input =
                decl.kind == BufKind::Input || (plan.in_place && decl.kind == BufKind::Output);
            vec![if holds_input { own } else { None }; decl.len]
        })
        .collect();
    let full: u128 = if plan.world == 128 {
        u128::MAX
    } else {
        (1u128 << plan.world) - 1
    };
    let ranks_of = |set: u128| {
        (0..plan.world)
            .filter(|r| set >> r & 1 == 1)
            .collect::<Vec<_>>()
    };
    for &(rank, index) in order {
        let here = || describe(plan, rank, index);
        let read = |memory: &Vec<Vec<Option<Sym>>>, region: Region, k: usize| -> Check<Sym> {
            memory[region.buf.0][region.offset + k].ok_or_else(|| {
                let decl = plan.decl(region.buf);
                Rejection(format!(
                    "{} reads element {} of {:?} of rank {}, which nothing has written",
                    here(),
                    region.offset + k,
                    decl.kind,
                    decl.rank
                ))
            })
        };
        match plan.ranks[rank][index].op {
            Op::Copy { src, dst } => {
                for k in 0..src.count {
                    let v = read(&memory, src, k)?;
                    memory[dst.buf.0][dst.offset + k] = Some(v);
                }
            }
            Op::Reduce { dst, a, b } => {
                for k in 0..dst.count {
                    let (x, y) = (read(&memory, a, k)?, read(&memory, b, k)?);
                    if x.ranks & y.ranks != 0 {
                        return reject(format!(
                            "{} counts the contribution of rank(s) {:?} twice at element {}",
                            here(),
                            ranks_of(x.ranks & y.ranks),
                            dst.offset + k
                        ));
                    }
                    if x.scaled + y.scaled > 0 {
                        return reject(format!("{} reduces an already averaged value", here()));
                    }
                    memory[dst.buf.0][dst.offset + k] = Some(Sym {
                        ranks: x.ranks | y.ranks,
                        scaled: 0,
                    });
                }
            }
            Op::Scale { region } => {
                for k in 0..region.count {
                    let v = read(&memory, region, k)?;
                    if v.ranks != full {
                        return reject(format!(
                            "{} averages a partial sum (ranks {:?})",
                            here(),
                            ranks_of(v.ranks)
                        ));
                    }
                    memory[region.buf.0][region.offset + k] = Some(Sym {
                        ranks: v.ranks,
                        scaled: v.scaled + 1,
                    });
                }
            }
            Op::Record(_) | Op::Wait(_) => {}
        }
    }
    let want_scaled = u8::from(plan.average);
    for (b, decl) in plan.buffers.iter().enumerate() {
        if decl.kind != BufKind::Output {
            continue;
        }
        if decl.len != plan.count {
            return reject(format!(
                "rank {}'s output has {} elements, not {}",
                decl.rank, decl.len, plan.count
            ));
        }
        for (i, v) in memory[b].iter().enumerate() {
            match v {
                Some(v) if v.ranks == full && v.scaled == want_scaled => {}
                Some(v) if v.ranks == full => {
                    return reject(format!(
                        "rank {}'s output element {i} was averaged {} times, want {want_scaled}",
                        decl.rank, v.scaled
                    ));
                }
                Some(v) => {
                    let missing = ranks_of(full & !v.ranks);
                    return reject(format!(
                        "rank {}'s output element {i} lacks the contribution of rank(s) {missing:?}",
                        decl.rank
                    ));
                }
                None => {
                    return reject(format!(
                        "rank {}'s output element {i} is never written",
                        decl.rank
                    ))
                }
            }
        }
    }
    if plan.buffer(0, BufKind::Output).is_none() && plan.world > 0 {
        return reject("the plan declares no output".into());
    }
    Ok(())
}

/// Finds the first instruction (in rank order) matching `pred`: a helper for tests that plant
/// faults in plans.
pub fn find_instr(plan: &Plan, pred: impl Fn(usize, &Instr) -> bool) -> Option<(usize, usize)> {
    plan.ranks.iter().enumerate().find_map(|(rank, program)| {
        program
            .iter()
            .position(|i| pred(rank, i))
            .map(|i| (rank, i))
    })
}

/// The event that an instruction waits on, if it is a wait.
pub fn waited(instr: &Instr) -> Option<EventId> {
    match instr.op {
        Op::Wait(e) => Some(e),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element::ReduceOp;
    use crate::plan::{EdgeTransport, Phase, RingSpec};

    fn spec(
        world: usize,
        count: usize,
        chunk: usize,
        slots: usize,
        transport: EdgeTransport,
    ) -> RingSpec {
        RingSpec::new(world, count, chunk, slots, transport)
    }

    #[test]
    fn ring_plans_pass_for_small_shapes() {
        for world in 1..=5 {
            for count in [0, 1, 2, 3, 5, 7, 13, 31] {
                for chunk in [1, 2, 3, 8] {
                    for slots in [1, 2, 3] {
                        for transport in [EdgeTransport::Peer, EdgeTransport::Staged] {
                            for in_place in [true, false] {
                                for op in [ReduceOp::Sum, ReduceOp::Avg] {
                                    let mut s = spec(world, count, chunk, slots, transport);
                                    s.in_place = in_place;
                                    s.op = op;
                                    let plan = s.build().unwrap();
                                    check(&plan).unwrap_or_else(|e| panic!("{s:?}: {e}"));
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    fn rejects(plan: &Plan, needle: &str) {
        let err = check(plan).expect_err("a broken plan must be rejected");
        assert!(
            err.0.contains(needle),
            "expected a rejection mentioning {needle:?}, got: {err}"
        );
    }

    #[test]
    fn dropped_wait_is_a_race() {
        let plan = spec(3, 20, 3, 2, EdgeTransport::Peer).build().unwrap();
        // The receiver's reduce waits for the sender's push: drop the first such wait.
        let (rank, i) = find_instr(&plan, |_, ins| {
            ins.stream == StreamKind::Reduce
                && waited(ins).is_some()
                && ins.tag.phase == Phase::ReduceScatter
        })
        .unwrap();
        let mut broken = plan.clone();
        broken.ranks[rank].remove(i);
        rejects(&broken, "data race");
    }

    #[test]
    fn slot_reused_before_its_credit_is_a_race() {
        // One slot: every push after the first must wait for the previous reduce to free it.
        let plan = spec(2, 16, 2, 1, EdgeTransport::Peer).build().unwrap();
        let (rank, i) = find_instr(&plan, |r, ins| {
            ins.stream == StreamKind::Send
                && waited(ins).is_some_and(|e| {
                    plan.events[e.0].rank != r && plan.events[e.0].what == "reduced"
                })
        })
        .unwrap();
        let mut broken = plan.clone();
        broken.ranks[rank].remove(i);
        rejects(&broken, "data race on Slots");
    }

    #[test]
    fn chunk_sent_to_the_wrong_rank_is_caught() {
        let plan = spec(3, 12, 4, 2, EdgeTransport::Peer).build().unwrap();
        let (rank, i) = find_instr(&plan, |_, ins| {
            matches!(ins.op, Op::Copy { .. }) && ins.tag.phase == Phase::AllGather
        })
        .unwrap();
        let mut broken = plan.clone();
        let Op::Copy { src, mut dst } = broken.ranks[rank][i].op else {
            unreachable!()
        };
        // Deliver to the rank after the intended receiver instead.
        let intended = plan.decl(dst.buf).rank;
        dst.buf = plan.buffer((intended + 1) % 3, BufKind::Output).unwrap();
        broken.ranks[rank][i].op = Op::Copy { src, dst };
        assert!(check(&broken).is_err());
    }

    #[test]
    fn wait_before_record_is_rejected() {
        let plan = spec(2, 8, 4, 2, EdgeTransport::Peer).build().unwrap();
        // Move rank 0's first local wait (its side stream waiting on its own Entry) to the front.
        let (rank, i) = find_instr(&plan, |r, ins| {
            waited(ins).is_some_and(|e| plan.events[e.0].rank == r)
        })
        .unwrap();
        let mut broken = plan.clone();
        let w = broken.ranks[rank].remove(i);
        broken.ranks[rank].insert(0, w);
        rejects(&broken, "silent no-op");
    }

    #[test]
    fn cross_rank_wait_cycle_is_a_deadlock() {
        let plan = spec(2, 8, 4, 2, EdgeTransport::Peer).build().unwrap();
        // Rank 0 waits, first thing, for rank 1's last record; rank 1 needs rank 0 to progress.
        let last = plan.events.iter().rposition(|e| e.rank == 1).unwrap();
        let mut broken = plan.clone();
        broken.ranks[0].insert(
            0,
            Instr {
                stream: StreamKind::Main,
                op: Op::Wait(EventId(last)),
                tag: crate::plan::Tag::ENTRY,
            },
        );
        rejects(&broken, "deadlock");
    }

    #[test]
    fn counting_a_contribution_twice_is_caught() {
        let plan = spec(2, 4, 4, 1, EdgeTransport::Peer).build().unwrap();
        let (rank, i) = find_instr(&plan, |_, ins| matches!(ins.op, Op::Reduce { .. })).unwrap();
        let mut broken = plan.clone();
        let dup = broken.ranks[rank][i];
        broken.ranks[rank].insert(i + 1, dup);
        assert!(check(&broken).is_err());
    }

    #[test]
    fn missing_finish_wait_is_caught() {
        let plan = spec(2, 8, 4, 2, EdgeTransport::Peer).build().unwrap();
        let mut broken = plan.clone();
        // Drop rank 1's Main wait on rank 0's send stream: Main would complete before the
        // all-gather push into rank 1's output lands.
        let i = broken.ranks[1]
            .iter()
            .rposition(|ins| {
                ins.stream == StreamKind::Main
                    && waited(ins).is_some_and(|e| plan.events[e.0].rank == 0)
            })
            .unwrap();
        broken.ranks[1].remove(i);
        let order = enqueue_order(&broken).unwrap();
        let err = check_races(&broken, &order, 1).expect_err("Main must not finish early");
        assert!(err.0.contains("finish before"), "{err}");
    }

    #[test]
    fn dropped_entry_wait_races_with_the_previous_call() {
        let plan = spec(2, 8, 2, 1, EdgeTransport::Peer).build().unwrap();
        // Rank 0's send stream waits for its own Entry; without it, call 2's first push into rank
        // 1's slot is ordered after nothing that follows rank 1's last reduce of call 1.
        let (rank, i) = find_instr(&plan, |r, ins| {
            ins.stream == StreamKind::Send
                && waited(ins)
                    .is_some_and(|e| plan.events[e.0].rank == r && plan.events[e.0].what == "entry")
        })
        .unwrap();
        let mut broken = plan.clone();
        broken.ranks[rank].remove(i);
        rejects(&broken, "call 2");
        // One call alone is still fine: the fault only shows back to back.
        let order = enqueue_order(&broken).unwrap();
        check_races(&broken, &order, 1).unwrap();
    }

    #[test]
    fn a_different_next_plan_without_its_entry_wait_races_on_the_callers_buffer() {
        let a = spec(2, 8, 2, 1, EdgeTransport::Peer).build().unwrap();
        let b = spec(2, 12, 3, 2, EdgeTransport::Peer).build().unwrap();
        check_sequence(&[&a, &b], &[0, 1, 0, 1]).unwrap();
        // Plan B's rank 0 send stream skips its wait on Entry: its first read of rank 0's buffer
        // is then unordered with plan A's all-gather push into that buffer.
        let (rank, i) = find_instr(&b, |r, ins| {
            r == 0
                && ins.stream == StreamKind::Send
                && waited(ins).is_some_and(|e| b.events[e.0].what == "entry")
        })
        .unwrap();
        let mut broken = b.clone();
        broken.ranks[rank].remove(i);
        let err = check_sequence(&[&a, &broken], &[0, 1]).expect_err("the race must be found");
        assert!(err.0.contains("data race on Output of rank 0"), "{err}");
    }

    #[test]
    fn staged_plan_without_host_slot_credit_is_a_race() {
        let plan = spec(2, 16, 2, 1, EdgeTransport::Staged).build().unwrap();
        let (rank, i) = find_instr(&plan, |r, ins| {
            ins.stream == StreamKind::Send
                && waited(ins).is_some_and(|e| {
                    plan.events[e.0].rank != r && plan.events[e.0].what == "copied from host"
                })
        })
        .unwrap();
        let mut broken = plan.clone();
        broken.ranks[rank].remove(i);
        rejects(&broken, "HostSlots");
    }

    #[test]
    fn staged_sender_without_the_receivers_entry_races_across_calls() {
        let plan = spec(2, 2, 1, 1, EdgeTransport::Staged).build().unwrap();
        let (rank, i) = find_instr(&plan, |r, ins| {
            ins.stream == StreamKind::Send
                && waited(ins)
                    .is_some_and(|e| plan.events[e.0].rank != r && plan.events[e.0].what == "entry")
        })
        .unwrap();
        let mut broken = plan.clone();
        broken.ranks[rank].remove(i);
        rejects(&broken, "call 2");
    }
}
