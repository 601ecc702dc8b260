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
//!    Memory is held as runs of equal values, not element by element: the check costs the
//!    number of instructions times the runs they touch, the same for 1 GiB as for 1 KiB.

use crate::plan::{BufId, BufKind, EventId, Instr, Op, Plan, Region, StreamKind};
use std::collections::{BTreeMap, HashMap};

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
fn accesses(plan: &Plan, op: &Op) -> (Vec<Region>, Vec<Region>) {
    match *op {
        Op::Copy { src, dst } => (vec![src], vec![dst]),
        Op::Reduce { dst, a, b } => (vec![a, b], vec![dst]),
        Op::Scale { region } => (vec![region], vec![region]),
        Op::Record(_) | Op::Wait(_) => (vec![], vec![]),
        Op::PeerReduce { dst, .. } => (peer_sources(plan, op), vec![dst]),
    }
}

/// The regions a [`Op::PeerReduce`] reads, in rank order: what an executor folds (ranks without
/// a buffer of the source's kind are left out here and rejected by the shape check).
pub fn peer_sources(plan: &Plan, op: &Op) -> Vec<Region> {
    let Op::PeerReduce {
        src,
        offset,
        count,
        ranks,
        ..
    } = *op
    else {
        return Vec::new();
    };
    (0..plan.world)
        .filter(|&r| ranks.contains(r))
        .filter_map(|r| plan.buffer(r, src))
        .map(|buf| Region { buf, offset, count })
        .collect()
}

/// The k-th `PeerReduce` of every rank is one meeting: every rank has as many. Each peer reduce
/// writes its own rank's buffer, as many elements as it reads from each source, reads at least
/// one rank and only ranks that declare the source's kind, and writes no source — except its own
/// rank's, when that is exactly the destination (folded element by element). What the ranks
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
            let own = plan.buffer(rank, src);
            if sources
                .iter()
                .any(|r| r.overlaps(&dst) && !(Some(r.buf) == own && *r == dst))
            {
                return reject(format!(
                    "{here} writes its destination while peers read it as a source"
                ));
            }
        }
    }
    Ok(())
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
    check_meetings(plan)
}

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
fn check_order(plan: &Plan, order: &[(usize, usize)]) -> Check {
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
    for (plan, order) in plans {
        check_order(plan, order)?;
    }
    let streams = world * StreamKind::ALL.len();
    let stream_of =
        |rank: usize, instr: &Instr| rank * StreamKind::ALL.len() + instr.stream.index();
    let memory = |k: usize, buf: BufId| {
        let decl = plans[k].0.decl(buf);
        match decl.kind {
            BufKind::Input | BufKind::Output => Memory::User(decl.rank, decl.kind),
            BufKind::Slots | BufKind::HostSlots | BufKind::Exposed => Memory::Staging(k, buf),
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
    // The clock at which each executed instruction is complete: its access clock, except for a
    // meeting, which completes only after its end barrier (every participant's accesses done).
    let mut done_clocks: Vec<Vec<u32>> = Vec::new();
    let mut by_memory: HashMap<Memory, Vec<(Access, usize)>> = HashMap::new();
    for (call, &k) in sequence.iter().enumerate() {
        let (plan, order) = plans[k];
        let mut next = 0;
        while next < order.len() {
            let (rank, index) = order[next];
            let instr = &plan.ranks[rank][index];
            // A meeting (`PeerReduce`): the world's instructions are adjacent in `order`, rank 0
            // first (`check_order` above). Its start barrier joins every participant's clock;
            // each then accesses memory concurrently with the others; the end barrier joins them
            // again.
            let group = if matches!(instr.op, Op::PeerReduce { .. }) {
                &order[next..next + world]
            } else {
                &order[next..next + 1]
            };
            let streams_of: Vec<usize> = group
                .iter()
                .map(|&(r, i)| stream_of(r, &plan.ranks[r][i]))
                .collect();
            if group.len() > 1 {
                let joined = join(streams_of.iter().map(|&s| &stream_clock[s]));
                for &s in &streams_of {
                    stream_clock[s].clone_from(&joined);
                }
            }
            for (&(rank, index), &s) in group.iter().zip(&streams_of) {
                let instr = &plan.ranks[rank][index];
                if let Op::Wait(e) = instr.op {
                    let Some(recorded) = event_clock[k].get(e.0).and_then(Option::as_ref) else {
                        return reject(format!(
                            "{} in call {} waits on event {} before the order records it",
                            describe(plan, rank, index),
                            call + 1,
                            e.0
                        ));
                    };
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
                done_clocks.push(stream_clock[s].clone());
                let (reads, writes) = accesses(plan, &instr.op);
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
            if group.len() > 1 {
                let joined = join(streams_of.iter().map(|&s| &stream_clock[s]));
                for &s in &streams_of {
                    stream_clock[s].clone_from(&joined);
                }
                let first = done_clocks.len() - group.len();
                for done in &mut done_clocks[first..] {
                    done.clone_from(&joined);
                }
            }
            next += group.len();
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
            if let Some((a, _)) = list.iter().find(|(a, _)| {
                let (_, _, _, _, s, seq) = executed[a.at];
                a.at != last && done_clocks[last][s] < seq
            }) {
                return reject(format!(
                    "rank {rank}'s Main stream can finish before {} is done with its {kind:?}: the caller would see the call complete too early",
                    name(a.at),
                ));
            }
        }
    }
    Ok(())
}

/// The elementwise maximum of vector clocks.
fn join<'a>(clocks: impl Iterator<Item = &'a Vec<u32>>) -> Vec<u32> {
    let mut joined: Vec<u32> = Vec::new();
    for c in clocks {
        if joined.is_empty() {
            joined = c.clone();
        } else {
            for (j, x) in joined.iter_mut().zip(c) {
                *j = (*j).max(*x);
            }
        }
    }
    joined
}

/// A symbolic value: which ranks' inputs an element holds, and how often it was scaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sym {
    ranks: u128,
    scaled: u8,
}

/// A run of equal elements: its length in elements and the value each element holds (`None`:
/// nothing has written it).
type Run = (usize, Option<Sym>);

/// One buffer's symbolic contents as runs of equal values: each key of `starts` is the first
/// element of a run that lasts until the next key (or `len`).
///
/// Invariant: key 0 is present when `len > 0`, every key is below `len`, and neighbouring runs
/// hold different values — so a buffer costs one entry per place where its value changes, however
/// many elements it has.
struct Runs {
    len: usize,
    starts: BTreeMap<usize, Option<Sym>>,
}

impl Runs {
    /// A buffer of `len` elements that all hold `value`.
    fn new(len: usize, value: Option<Sym>) -> Runs {
        let mut starts = BTreeMap::new();
        if len > 0 {
            starts.insert(0, value);
        }
        Runs { len, starts }
    }

    /// The value of element `at` (`at < len`).
    fn at(&self, at: usize) -> Option<Sym> {
        debug_assert!(at < self.len);
        *self
            .starts
            .range(..=at)
            .next_back()
            .expect("key 0 starts the first run")
            .1
    }

    /// The runs of elements `offset..offset + count`, cut at both ends, in order.
    fn read(&self, offset: usize, count: usize) -> Vec<Run> {
        let mut runs = Vec::new();
        if count == 0 {
            return runs;
        }
        let end = offset + count;
        debug_assert!(end <= self.len);
        let (mut start, mut value) = (offset, self.at(offset));
        for (&next, &v) in self.starts.range(offset + 1..end) {
            runs.push((next - start, value));
            (start, value) = (next, v);
        }
        runs.push((end - start, value));
        runs
    }

    /// Overwrites the elements from `offset` on with `runs`, one after the other, and merges
    /// neighbouring runs that hold the same value.
    fn write(&mut self, offset: usize, runs: &[Run]) {
        let end = offset + runs.iter().map(|r| r.0).sum::<usize>();
        if end == offset {
            return;
        }
        debug_assert!(end <= self.len);
        let after = (end < self.len).then(|| self.at(end));
        let gone: Vec<usize> = self.starts.range(offset..=end).map(|(&k, _)| k).collect();
        for k in gone {
            self.starts.remove(&k);
        }
        // The value just before `offset` (none at the start of the buffer: the first run always
        // gets its key).
        let mut last = self.starts.range(..offset).next_back().map(|(_, &v)| v);
        let mut at = offset;
        for &(len, value) in runs {
            if len == 0 {
                continue;
            }
            if last != Some(value) {
                self.starts.insert(at, value);
                last = Some(value);
            }
            at += len;
        }
        if let Some(after) = after {
            if last != Some(after) {
                self.starts.insert(end, after);
            }
        }
    }

    /// All runs of the buffer, each with the index of its first element.
    fn all(&self) -> impl Iterator<Item = (usize, Option<Sym>)> + '_ {
        self.starts.iter().map(|(&k, &v)| (k, v))
    }
}

/// Walks several run lists over one range of `count` elements together, cut at every boundary
/// of any of them: calls `f(start, len, values)` once per piece, with `start` relative to the
/// range, `len` the piece's length and `values[i]` the value of list `i` throughout it. With no
/// lists the whole range is one piece. Stops at the first error.
fn for_each_piece(
    count: usize,
    lists: &[Vec<Run>],
    mut f: impl FnMut(usize, usize, &[Option<Sym>]) -> Check,
) -> Check {
    let mut next = vec![0usize; lists.len()];
    let mut left = vec![0usize; lists.len()];
    let mut values = vec![None; lists.len()];
    let mut start = 0;
    while start < count {
        for (i, list) in lists.iter().enumerate() {
            if left[i] == 0 {
                (left[i], values[i]) = list[next[i]];
                next[i] += 1;
            }
        }
        let len = left.iter().copied().min().unwrap_or(count - start);
        f(start, len, &values)?;
        for l in &mut left {
            *l -= len;
        }
        start += len;
    }
    Ok(())
}

/// The first element (relative to the list's range) of the first run in `runs` that nothing has
/// written.
fn first_unwritten(runs: &[Run]) -> Option<usize> {
    let mut start = 0;
    for &(len, value) in runs {
        if value.is_none() {
            return Some(start);
        }
        start += len;
    }
    None
}

/// Check 4: executes the plan on sets of contributions in the given (legal) order.
///
/// Memory is kept as runs of equal values ([`Runs`]) and every instruction works run by run, so
/// the cost is the number of instructions times the runs they touch, whatever the element count:
/// a 1 GiB all-reduce has as few runs as a 1 KiB one with the same chunking. An error names the
/// first offending element, exactly as an element-by-element execution would (a piece of a run
/// fails on its first element if on any).
pub fn check_result(plan: &Plan, order: &[(usize, usize)]) -> Check {
    if plan.world > MAX_SYMBOLIC_WORLD {
        return reject(format!(
            "the symbolic check handles at most {MAX_SYMBOLIC_WORLD} ranks"
        ));
    }
    check_order(plan, order)?;
    let mut memory: Vec<Runs> = plan
        .buffers
        .iter()
        .map(|decl| {
            let own = Some(Sym {
                ranks: 1u128 << decl.rank,
                scaled: 0,
            });
            let holds_input =
                decl.kind == BufKind::Input || (plan.in_place && decl.kind == BufKind::Output);
            Runs::new(decl.len, if holds_input { own } else { None })
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
    // A meeting's writes, held back until every participant has read (its members are adjacent
    // in `order`, rank 0 first: `check_order` above): peers read each other's sources
    // concurrently.
    let mut meeting: Vec<(Region, Vec<Run>)> = Vec::new();
    for &(rank, index) in order {
        let here = || describe(plan, rank, index);
        // The rejection for reading element `k` of `region` (relative), which nothing wrote.
        let unwritten = |region: Region, k: usize| -> Rejection {
            let decl = plan.decl(region.buf);
            Rejection(format!(
                "{} reads element {} of {:?} of rank {}, which nothing has written",
                here(),
                region.offset + k,
                decl.kind,
                decl.rank
            ))
        };
        match plan.ranks[rank][index].op {
            Op::Copy { src, dst } => {
                // Element by element, a copy forward onto its own tail (`src` < `dst` <
                // `src.end()` in one buffer) reads what it has just written: the result repeats
                // the first `dst.offset - src.offset` source elements.
                let period =
                    if src.buf == dst.buf && src.offset < dst.offset && dst.offset < src.end() {
                        dst.offset - src.offset
                    } else {
                        src.count
                    };
                let runs = memory[src.buf.0].read(src.offset, period);
                if let Some(k) = first_unwritten(&runs) {
                    return Err(unwritten(src, k));
                }
                if period == src.count {
                    memory[dst.buf.0].write(dst.offset, &runs);
                } else if let [(_, value)] = runs[..] {
                    memory[dst.buf.0].write(dst.offset, &[(src.count, value)]);
                } else {
                    // No plan the crate builds copies onto itself; a hand-made one that does
                    // costs (runs of the head) × (count / period) here.
                    let mut tiled = Vec::new();
                    let mut left = src.count;
                    while left > 0 {
                        for &(len, value) in &runs {
                            let len = len.min(left);
                            tiled.push((len, value));
                            left -= len;
                            if left == 0 {
                                break;
                            }
                        }
                    }
                    memory[dst.buf.0].write(dst.offset, &tiled);
                }
            }
            Op::Reduce { dst, a, b } => {
                // The shape check allows `dst == a` or `dst` disjoint from both: no piece reads
                // what an earlier piece wrote, so reading both operands up front is exact.
                let operands = [
                    memory[a.buf.0].read(a.offset, a.count),
                    memory[b.buf.0].read(b.offset, b.count),
                ];
                let mut out: Vec<Run> = Vec::new();
                for_each_piece(dst.count, &operands, |k, len, values| {
                    let x = values[0].ok_or_else(|| unwritten(a, k))?;
                    let y = values[1].ok_or_else(|| unwritten(b, k))?;
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
                    out.push((
                        len,
                        Some(Sym {
                            ranks: x.ranks | y.ranks,
                            scaled: 0,
                        }),
                    ));
                    Ok(())
                })?;
                memory[dst.buf.0].write(dst.offset, &out);
            }
            Op::Scale { region } => {
                let mut runs = memory[region.buf.0].read(region.offset, region.count);
                let mut k = 0;
                for (len, value) in &mut runs {
                    let v = value.ok_or_else(|| unwritten(region, k))?;
                    if v.ranks != full {
                        return reject(format!(
                            "{} averages a partial sum (ranks {:?})",
                            here(),
                            ranks_of(v.ranks)
                        ));
                    }
                    *value = Some(Sym {
                        ranks: v.ranks,
                        scaled: v.scaled + 1,
                    });
                    k += *len;
                }
                memory[region.buf.0].write(region.offset, &runs);
            }
            Op::Record(_) | Op::Wait(_) => {}
            op @ Op::PeerReduce { dst, .. } => {
                let sources = peer_sources(plan, &op);
                let lists: Vec<Vec<Run>> = sources
                    .iter()
                    .map(|src| memory[src.buf.0].read(src.offset, src.count))
                    .collect();
                let mut out: Vec<Run> = Vec::new();
                for_each_piece(dst.count, &lists, |k, len, values| {
                    let mut acc = Sym {
                        ranks: 0,
                        scaled: 0,
                    };
                    for (&src, value) in sources.iter().zip(values) {
                        let v = value.ok_or_else(|| unwritten(src, k))?;
                        if acc.ranks & v.ranks != 0 {
                            return reject(format!(
                                "{} counts the contribution of rank(s) {:?} twice at element {}",
                                here(),
                                ranks_of(acc.ranks & v.ranks),
                                dst.offset + k
                            ));
                        }
                        // A copy (one source) may carry an averaged value; a fold may not.
                        if v.scaled > 0 && sources.len() > 1 {
                            return reject(format!("{} reduces an already averaged value", here()));
                        }
                        acc.ranks |= v.ranks;
                        acc.scaled = acc.scaled.max(v.scaled);
                    }
                    out.push((len, Some(acc)));
                    Ok(())
                })?;
                meeting.push((dst, out));
                if rank + 1 == plan.world {
                    for (dst, runs) in meeting.drain(..) {
                        memory[dst.buf.0].write(dst.offset, &runs);
                    }
                }
            }
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
        for (i, v) in memory[b].all() {
            judge_output(plan, decl.rank, i, v, want_scaled)?;
        }
    }
    if plan.buffer(0, BufKind::Output).is_none() && plan.world > 0 {
        return reject("the plan declares no output".into());
    }
    Ok(())
}

/// The verdict on one element (or the first element of a run) of rank `rank`'s output: every
/// rank's contribution exactly once, scaled `want_scaled` times.
fn judge_output(plan: &Plan, rank: usize, i: usize, v: Option<Sym>, want_scaled: u8) -> Check {
    let full: u128 = if plan.world == 128 {
        u128::MAX
    } else {
        (1u128 << plan.world) - 1
    };
    match v {
        Some(v) if v.ranks == full && v.scaled == want_scaled => Ok(()),
        Some(v) if v.ranks == full => reject(format!(
            "rank {rank}'s output element {i} was averaged {} times, want {want_scaled}",
            v.scaled
        )),
        Some(v) => {
            let missing: Vec<usize> = (0..plan.world)
                .filter(|r| (full & !v.ranks) >> r & 1 == 1)
                .collect();
            reject(format!(
                "rank {rank}'s output element {i} lacks the contribution of rank(s) {missing:?}"
            ))
        }
        None => reject(format!("rank {rank}'s output element {i} is never written")),
    }
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
    use crate::plan::{EdgeTransport, Phase, RingSpec, Tag};
    use proptest::prelude::*;

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

    /// Check 4 as it was first written, element by element: the reference that
    /// [`check_result`] (run by run) must agree with exactly, message for message.
    fn check_result_per_element(plan: &Plan, order: &[(usize, usize)]) -> Check {
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
        // A meeting's writes, held back until every participant has read (its members are adjacent
        // in `order`, rank 0 first): peers read each other's sources concurrently.
        let mut meeting: Vec<(Region, Vec<Sym>)> = Vec::new();
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
                op @ Op::PeerReduce { dst, .. } => {
                    let sources = peer_sources(plan, &op);
                    let mut values = Vec::with_capacity(dst.count);
                    for k in 0..dst.count {
                        let mut acc = Sym {
                            ranks: 0,
                            scaled: 0,
                        };
                        for &src in &sources {
                            let v = read(&memory, src, k)?;
                            if acc.ranks & v.ranks != 0 {
                                return reject(format!(
                                    "{} counts the contribution of rank(s) {:?} twice at element {}",
                                    here(),
                                    ranks_of(acc.ranks & v.ranks),
                                    dst.offset + k
                                ));
                            }
                            if v.scaled > 0 && sources.len() > 1 {
                                return reject(format!(
                                    "{} reduces an already averaged value",
                                    here()
                                ));
                            }
                            acc.ranks |= v.ranks;
                            acc.scaled = acc.scaled.max(v.scaled);
                        }
                        values.push(acc);
                    }
                    meeting.push((dst, values));
                    if rank + 1 == plan.world {
                        for (dst, values) in meeting.drain(..) {
                            for (k, v) in values.into_iter().enumerate() {
                                memory[dst.buf.0][dst.offset + k] = Some(v);
                            }
                        }
                    }
                }
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
                judge_output(plan, decl.rank, i, *v, want_scaled)?;
            }
        }
        if plan.buffer(0, BufKind::Output).is_none() && plan.world > 0 {
            return reject("the plan declares no output".into());
        }
        Ok(())
    }

    // ---- the one-shot -------------------------------------------------------------------

    fn oneshot(world: usize, count: usize, in_place: bool) -> Plan {
        crate::plan::OneShotSpec {
            world,
            count,
            in_place,
            op: ReduceOp::Avg,
        }
        .build()
        .unwrap()
    }

    #[test]
    fn oneshot_plans_pass_for_small_shapes() {
        for world in 1..=6 {
            for count in [0, 1, 2, 7, 31] {
                for in_place in [true, false] {
                    let plan = oneshot(world, count, in_place);
                    check(&plan).unwrap_or_else(|e| panic!("{world} {count} {in_place}: {e}"));
                }
            }
        }
    }

    fn peer_reduce_at(plan: &Plan, rank: usize) -> usize {
        plan.ranks[rank]
            .iter()
            .position(|i| matches!(i.op, Op::PeerReduce { .. }))
            .expect("a peer reduce")
    }

    #[test]
    fn oneshot_in_place_reading_the_buffer_it_overwrites_is_caught() {
        // Drop the exposed copy and read the in-place buffers directly: every rank overwrites its
        // buffer while the others still read it.
        let mut broken = oneshot(3, 8, true);
        for rank in 0..3 {
            broken.ranks[rank].remove(0);
            let i = peer_reduce_at(&broken, rank);
            if let Op::PeerReduce { src, .. } = &mut broken.ranks[rank][i].op {
                *src = BufKind::Output;
            }
        }
        // Each rank's own source is its destination (allowed: folded element by element), but
        // the peers read that buffer while its rank writes it.
        rejects(&broken, "data race on Output");
    }

    #[test]
    fn oneshot_source_never_exposed_is_caught() {
        // Rank 1 forgets to copy its buffer into its exposed copy: peers read garbage.
        let mut broken = oneshot(3, 8, true);
        broken.ranks[1].remove(0);
        rejects(&broken, "nothing has written");
    }

    #[test]
    fn oneshot_exposed_copy_after_the_meeting_races_with_the_readers() {
        // Rank 1 exposes its buffer only after the meeting: in the next call that copy overwrites
        // the exposed buffer... and within a call the peers read it before it is written.
        let mut broken = oneshot(2, 8, true);
        let copy = broken.ranks[1].remove(0);
        broken.ranks[1].push(copy);
        assert!(check(&broken).is_err());
    }

    #[test]
    fn oneshot_rank_skipping_the_meeting_is_caught() {
        let mut broken = oneshot(3, 8, false);
        let i = peer_reduce_at(&broken, 2);
        broken.ranks[2].remove(i);
        rejects(&broken, "never all meet");
    }

    #[test]
    fn oneshot_meeting_behind_a_wait_on_the_other_side_deadlocks() {
        // Rank 1 waits, before the meeting, for an event rank 0 records after it: on GPUs rank 0's
        // kernel spins at the start barrier for a kernel that waits for it.
        let mut broken = oneshot(2, 8, false);
        let e = EventId(broken.events.len());
        broken.events.push(crate::plan::EventDecl {
            rank: 0,
            stream: StreamKind::Main,
            tag: Tag::FINISH,
            what: "after the meeting",
        });
        broken.ranks[0].push(Instr {
            stream: StreamKind::Main,
            op: Op::Record(e),
            tag: Tag::FINISH,
        });
        broken.ranks[1].insert(
            0,
            Instr {
                stream: StreamKind::Main,
                op: Op::Wait(e),
                tag: Tag::FINISH,
            },
        );
        rejects(&broken, "deadlock");
    }

    #[test]
    fn oneshot_meeting_on_a_side_stream_without_ordering_races_with_the_caller() {
        // Rank 0 runs the meeting on its Send stream with no event from Main: it can read the
        // caller's input before the caller's earlier work (on Main) wrote it, and Main can finish
        // before the meeting has: the completion rule catches it.
        let mut broken = oneshot(2, 8, false);
        let i = peer_reduce_at(&broken, 0);
        broken.ranks[0][i].stream = StreamKind::Send;
        assert!(check(&broken).is_err());
    }

    #[test]
    fn oneshot_meeting_with_mismatched_ranges_is_caught() {
        let mut broken = oneshot(2, 8, false);
        let i = peer_reduce_at(&broken, 1);
        if let Op::PeerReduce {
            offset, count, dst, ..
        } = &mut broken.ranks[1][i].op
        {
            *offset = 1;
            *count = 7;
            dst.count = 7;
        }
        // Ranks of one meeting may read different ranges (the two-shot does); this one leaves
        // an element of its output unwritten, and the result check says so.
        rejects(&broken, "nothing has written");
    }

    fn twoshot(world: usize, count: usize, in_place: bool) -> Plan {
        crate::plan::TwoShotSpec {
            world,
            count,
            in_place,
            op: ReduceOp::Avg,
            align: 2,
        }
        .build()
        .unwrap()
    }

    #[test]
    fn twoshot_plans_pass_for_small_shapes() {
        for world in 1..=6 {
            for count in [0, 1, 2, 7, 31] {
                for in_place in [true, false] {
                    let plan = twoshot(world, count, in_place);
                    check(&plan).unwrap_or_else(|e| panic!("{world} {count} {in_place}: {e}"));
                }
            }
        }
    }

    #[test]
    fn twoshot_gathering_a_segment_from_a_rank_that_does_not_own_it_is_caught() {
        // Rank 0's first gather round copies segment 1 from rank 2, which only has its own
        // input (or, in place, its own unreduced value) there.
        for in_place in [true, false] {
            let mut broken = twoshot(3, 12, in_place);
            if let Op::PeerReduce { ranks, src, .. } = &mut broken.ranks[0][1].op {
                *ranks = crate::plan::Ranks::only(2);
                *src = if in_place {
                    BufKind::Output
                } else {
                    BufKind::Input
                };
            }
            // Rank 0's segment 1 holds rank 2's value alone: the result check sees it.
            rejects(&broken, "partial sum (ranks [2])");
        }
    }

    #[test]
    fn twoshot_reduce_writing_beyond_its_segment_races_with_the_readers() {
        // In place, rank 1 reduces its segment into a destination that also covers segment 0,
        // which rank 0 reads from rank 1 in the same meeting.
        let mut broken = twoshot(2, 8, true);
        if let Op::PeerReduce {
            dst, offset, count, ..
        } = &mut broken.ranks[1][0].op
        {
            *offset = 0;
            *count = 8;
            *dst = Region {
                offset: 0,
                count: 8,
                ..*dst
            };
        }
        rejects(&broken, "data race on Output of rank");
    }

    #[test]
    fn twoshot_gather_before_the_reduce_is_caught() {
        // Rank 1 gathers before it has reduced: the meetings pair its gather with the others'
        // reduce, and it copies an unreduced segment.
        let mut broken = twoshot(3, 12, false);
        broken.ranks[1].swap(0, 1);
        // Its gather now meets the others' reduces: it copies rank 2's segment while rank 2
        // writes it (and rank 0's gather meets rank 1's reduce likewise; which race the check
        // reports first depends on its map's order).
        rejects(&broken, "data race on Output of rank");
    }

    /// Both checks reject `bad`, an order that splits meeting 0, with `needle` and the rule for
    /// laying out an order in the message.
    fn split_meeting_rejected(plan: &Plan, bad: &[(usize, usize)], needle: &str) {
        for err in [
            check_races(plan, bad, 1).unwrap_err(),
            check_result(plan, bad).unwrap_err(),
        ] {
            assert!(
                err.0.contains("meeting 0")
                    && err.0.contains(needle)
                    && err
                        .0
                        .contains("must stand together in the order, ranks 0..world"),
                "{bad:?}: {err}"
            );
        }
    }

    /// A caller-made order that splits a meeting (rank 1's peer reduce ahead of rank 0's, rank
    /// 0's twice, rank 1's left out or moved behind another instruction) is rejected by the race
    /// and the result check with a message that names what stands where — never a panic (a
    /// slice past the end), never a verdict on a misread meeting.
    #[test]
    fn an_order_that_splits_a_meeting_is_rejected() {
        let plan = crate::plan::OneShotSpec {
            world: 2,
            count: 8,
            in_place: false,
            op: ReduceOp::Sum,
        }
        .build()
        .unwrap();
        let order = enqueue_order(&plan).unwrap();
        let (mine, theirs) = ((0, peer_reduce_at(&plan, 0)), (1, peer_reduce_at(&plan, 1)));
        // Out of place and summed, each rank's program is its peer reduce alone.
        assert_eq!(order, [mine, theirs]);
        check_races(&plan, &order, 2).unwrap();
        check_result(&plan, &order).unwrap();
        let rank1 = describe(&plan, 1, theirs.1);
        split_meeting_rejected(
            &plan,
            &[theirs, mine],
            &format!("has {rank1} where it needs {}", describe(&plan, 0, mine.1)),
        );
        split_meeting_rejected(&plan, &[mine, mine], &format!("where it needs {rank1}"));
        split_meeting_rejected(
            &plan,
            &[mine],
            &format!("has the end of the order where it needs {rank1}"),
        );
        let err = check_races(&plan, &[mine, (1, 7)], 1).unwrap_err();
        assert!(
            err.0
                .contains("rank 1 instruction 7, which the plan does not have"),
            "{err}"
        );

        // In place, rank 1 first copies its buffer to its exposed copy: an order that puts that
        // copy between the meeting's members is rejected, naming the copy.
        let plan = oneshot(2, 8, true);
        let theirs = (1, peer_reduce_at(&plan, 1));
        let copy = (1, 0);
        assert!(matches!(plan.ranks[1][0].op, Op::Copy { .. }));
        let mut moved = enqueue_order(&plan).unwrap();
        moved.retain(|&e| e != copy);
        let at = moved.iter().position(|&e| e == theirs).unwrap();
        moved.insert(at, copy);
        split_meeting_rejected(
            &plan,
            &moved,
            &format!(
                "has {} where it needs {}",
                describe(&plan, 1, 0),
                describe(&plan, 1, theirs.1)
            ),
        );
    }

    // ---- the run-by-run symbolic result against the element-by-element one ----------------

    /// Neighbouring runs must hold different values, and the runs must cover the buffer.
    fn assert_canonical(runs: &Runs) {
        if runs.len == 0 {
            assert!(runs.starts.is_empty());
            return;
        }
        assert_eq!(runs.starts.keys().next(), Some(&0));
        assert!(runs.starts.keys().all(|&k| k < runs.len));
        let values: Vec<_> = runs.starts.values().collect();
        assert!(values.windows(2).all(|w| w[0] != w[1]), "{values:?}");
    }

    fn sym(ranks: u128) -> Option<Sym> {
        Some(Sym { ranks, scaled: 0 })
    }

    #[test]
    fn runs_split_write_and_merge() {
        let mut runs = Runs::new(10, None);
        runs.write(2, &[(3, sym(1))]);
        assert_eq!(runs.read(0, 10), vec![(2, None), (3, sym(1)), (5, None)]);
        runs.write(5, &[(2, sym(1)), (1, sym(2))]);
        assert_eq!(
            runs.read(1, 8),
            vec![(1, None), (5, sym(1)), (1, sym(2)), (1, None)]
        );
        runs.write(0, &[(10, None)]);
        assert_eq!(runs.starts.len(), 1);
        runs.write(9, &[(1, sym(3))]);
        runs.write(0, &[(4, sym(3)), (5, sym(3))]);
        assert_eq!(runs.read(0, 10), vec![(10, sym(3))]);
        assert_canonical(&runs);
        assert_eq!(runs.read(3, 0), vec![]);
    }

    /// Random writes and reads of [`Runs`] against a plain vector of values.
    #[test]
    fn runs_agree_with_a_plain_vector() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        for _ in 0..200 {
            let len = 1 + next(20);
            let mut runs = Runs::new(len, None);
            let mut plain = vec![None; len];
            for _ in 0..30 {
                let offset = next(len);
                let mut pieces = Vec::new();
                let mut at = offset;
                while at < len && next(3) > 0 {
                    let piece = 1 + next(len - at);
                    let value = [None, sym(1), sym(2)][next(3)];
                    pieces.push((piece, value));
                    plain[at..at + piece].fill(value);
                    at += piece;
                }
                runs.write(offset, &pieces);
                assert_canonical(&runs);
                let (lo, hi) = (next(len), next(len + 1));
                let (lo, hi) = (lo.min(hi), lo.max(hi));
                let expanded: Vec<_> = runs
                    .read(lo, hi - lo)
                    .into_iter()
                    .flat_map(|(n, v)| std::iter::repeat_n(v, n))
                    .collect();
                assert_eq!(expanded, plain[lo..hi]);
            }
        }
    }

    /// A fault planted into a plan, for the equivalence tests.
    #[derive(Clone, Copy, Debug)]
    enum Plant {
        Drop,
        /// Move the `region`-th region of the instruction one element up or down.
        Shift {
            region: usize,
            up: bool,
        },
        SwapCopy,
        DuplicateReduce,
    }

    const PLANTS: [Plant; 13] = [
        Plant::Drop,
        Plant::Shift {
            region: 0,
            up: true,
        },
        Plant::Shift {
            region: 0,
            up: false,
        },
        Plant::Shift {
            region: 1,
            up: true,
        },
        Plant::Shift {
            region: 1,
            up: false,
        },
        Plant::Shift {
            region: 2,
            up: true,
        },
        Plant::Shift {
            region: 2,
            up: false,
        },
        Plant::SwapCopy,
        Plant::DuplicateReduce,
        Plant::Drop,
        Plant::Drop,
        Plant::SwapCopy,
        Plant::DuplicateReduce,
    ];

    fn shift(offset: &mut usize, up: bool) -> bool {
        match (up, offset.checked_sub(1)) {
            (true, _) => *offset += 1,
            (false, Some(lower)) => *offset = lower,
            (false, None) => return false,
        }
        true
    }

    /// The plan with `plant` at instruction `index` of `rank`, or `None` where it does not apply.
    fn planted(plan: &Plan, rank: usize, index: usize, plant: Plant) -> Option<Plan> {
        let mut broken = plan.clone();
        let program = &mut broken.ranks[rank];
        let instr = *program.get(index)?;
        match (plant, instr.op) {
            (Plant::Drop, _) => {
                program.remove(index);
            }
            (Plant::SwapCopy, Op::Copy { src, dst }) => {
                program[index].op = Op::Copy { src: dst, dst: src };
            }
            (Plant::DuplicateReduce, Op::Reduce { .. }) => program.insert(index + 1, instr),
            (Plant::Shift { region, up }, mut op) => {
                let moved = match (&mut op, region) {
                    (Op::Copy { src, .. }, 0) => shift(&mut src.offset, up),
                    (Op::Copy { dst, .. }, 1) => shift(&mut dst.offset, up),
                    (Op::Reduce { dst, .. }, 0) => shift(&mut dst.offset, up),
                    (Op::Reduce { a, .. }, 1) => shift(&mut a.offset, up),
                    (Op::Reduce { b, .. }, 2) => shift(&mut b.offset, up),
                    (Op::Scale { region }, 0) => shift(&mut region.offset, up),
                    (Op::PeerReduce { offset, .. }, 0) => shift(offset, up),
                    (Op::PeerReduce { dst, .. }, 1) => shift(&mut dst.offset, up),
                    _ => false,
                };
                if !moved {
                    return None;
                }
                program[index].op = op;
            }
            _ => return None,
        }
        Some(broken)
    }

    /// Where the first two checks pass (so that the symbolic execution is defined), the run-by-run
    /// and element-by-element results must be the same `Result`, message for message. Returns
    /// that result, or `None` where the plan did not get that far.
    fn agree(plan: &Plan) -> Option<Check> {
        check_shape(plan).ok()?;
        let order = enqueue_order(plan).ok()?;
        let fast = check_result(plan, &order);
        let reference = check_result_per_element(plan, &order);
        assert_eq!(fast, reference, "the two symbolic executions disagree");
        Some(fast)
    }

    /// Every plant at every instruction of a few small plans: both executions agree, and the
    /// faults reach each kind of rejection.
    #[test]
    fn runs_agree_with_elements_on_every_planted_fault() {
        let mut plans = Vec::new();
        for (world, count, chunk, slots, align) in [
            (2, 13, 3, 2, 1),
            (3, 20, 2, 1, 2),
            (4, 9, 8, 3, 4),
            (1, 5, 2, 1, 1),
        ] {
            for in_place in [true, false] {
                for op in [ReduceOp::Sum, ReduceOp::Avg] {
                    for transport in [EdgeTransport::Peer, EdgeTransport::Staged] {
                        let mut s = spec(world, count, chunk, slots, transport);
                        s.align_elems = align;
                        s.in_place = in_place;
                        s.op = op;
                        plans.push(s.build().unwrap());
                    }
                }
                plans.push(oneshot(world, count, in_place));
            }
        }
        let mut seen: Vec<String> = Vec::new();
        let (mut accepted, mut rejected) = (0, 0);
        for plan in &plans {
            assert_eq!(agree(plan), Some(Ok(())));
            for rank in 0..plan.world {
                for index in 0..plan.ranks[rank].len() {
                    for plant in PLANTS {
                        let Some(broken) = planted(plan, rank, index, plant) else {
                            continue;
                        };
                        match agree(&broken) {
                            Some(Ok(())) => accepted += 1,
                            Some(Err(e)) => {
                                rejected += 1;
                                seen.push(e.0);
                            }
                            None => {}
                        }
                    }
                }
            }
        }
        assert!(accepted > 0 && rejected > 100, "{accepted} {rejected}");
        for needle in [
            "nothing has written",
            "counts the contribution",
            "twice",
            "lacks the contribution",
            "never written",
            "averages a partial sum",
        ] {
            assert!(
                seen.iter().any(|m| m.contains(needle)),
                "no planted fault was rejected with {needle:?}"
            );
        }
    }

    fn ring_strategy() -> impl Strategy<Value = RingSpec> {
        (1usize..=5)
            .prop_flat_map(|world| {
                (
                    Just(world),
                    0usize..48,
                    1usize..12,
                    1usize..4,
                    prop_oneof![Just(1usize), Just(2), Just(4)],
                    any::<bool>(),
                    any::<bool>(),
                    proptest::collection::vec(any::<bool>(), world),
                )
            })
            .prop_map(
                |(world, count, chunk_elems, slots, align_elems, in_place, avg, staged)| RingSpec {
                    world,
                    count,
                    in_place,
                    op: if avg { ReduceOp::Avg } else { ReduceOp::Sum },
                    chunk_elems,
                    slots,
                    align_elems,
                    transports: staged
                        .into_iter()
                        .map(|s| {
                            if s {
                                EdgeTransport::Staged
                            } else {
                                EdgeTransport::Peer
                            }
                        })
                        .collect(),
                },
            )
    }

    /// Up to three plants, each at a random place (the place is taken modulo the program).
    fn plants_strategy() -> impl Strategy<Value = Vec<(usize, usize, usize)>> {
        proptest::collection::vec((0usize..64, 0usize..1024, 0..PLANTS.len()), 0..4)
    }

    fn plant_all(mut plan: Plan, plants: &[(usize, usize, usize)]) -> Plan {
        for &(rank, index, which) in plants {
            let rank = rank % plan.world;
            let len = plan.ranks[rank].len();
            if len == 0 {
                continue;
            }
            if let Some(broken) = planted(&plan, rank, index % len, PLANTS[which]) {
                plan = broken;
            }
        }
        plan
    }

    /// A random program on a few small buffers, all on Main: copies (forward and backward onto
    /// themselves too), reductions, scalings, and meetings of every rank — most of them wrong,
    /// which is the point: both executions must reject them with the same message.
    fn program_strategy() -> impl Strategy<Value = Plan> {
        (
            1usize..=3,
            1usize..10,
            1usize..14,
            any::<bool>(),
            any::<bool>(),
            0usize..1000,
            proptest::collection::vec(proptest::collection::vec(0usize..1000, 8), 0..24),
        )
            .prop_map(
                |(world, count, slots, in_place, average, prologue, steps)| {
                    let mut plan = Plan {
                        world,
                        count,
                        in_place,
                        average,
                        buffers: Vec::new(),
                        events: Vec::new(),
                        ranks: vec![Vec::new(); world],
                    };
                    for rank in 0..world {
                        for (kind, len) in [
                            (BufKind::Input, count),
                            (BufKind::Output, count),
                            (BufKind::Slots, slots),
                        ] {
                            plan.buffers
                                .push(crate::plan::BufferDecl { rank, kind, len });
                        }
                    }
                    let nbuf = plan.buffers.len();
                    // A region of `count` elements in buffer `pick`, at `at` (both taken modulo).
                    // Buffers are declared rank by rank, Input, Output, Slots: `read` picks any,
                    // `write` an Output or Slots (a write to an input is a shape error, not
                    // interesting here).
                    let read = |pick: usize| pick % nbuf;
                    let write = |pick: usize| pick % world * 3 + 1 + pick / world % 2;
                    let region = |plan: &Plan, buf: usize, at: usize, count: usize| {
                        let buf = BufId(buf);
                        let len = plan.buffers[buf.0].len;
                        let count = count.min(len);
                        Region {
                            buf,
                            offset: at % (len - count + 1),
                            count,
                        }
                    };
                    let main = |op| Instr {
                        stream: StreamKind::Main,
                        op,
                        tag: Tag::ENTRY,
                    };
                    // A prologue fills the first `filled` elements of every output and slot buffer
                    // from the rank's input, so that the random steps get further than their first
                    // read of unwritten memory.
                    let filled = prologue % (count + 1);
                    for rank in 0..world {
                        let input = BufId(rank * 3);
                        for (buf, len) in
                            [(rank * 3 + 1, filled), (rank * 3 + 2, filled.min(slots))]
                        {
                            let at = |buf| Region {
                                buf,
                                offset: 0,
                                count: len,
                            };
                            plan.ranks[rank].push(main(Op::Copy {
                                src: at(input),
                                dst: at(BufId(buf)),
                            }));
                        }
                    }
                    for s in steps {
                        let rank = s[0] % world;
                        let n = 1 + s[1] % count.min(slots);
                        match s[2] % 5 {
                            0 => {
                                let src = region(&plan, read(s[3]), s[4], n);
                                let dst = region(&plan, write(s[5]), s[6], src.count);
                                plan.ranks[rank].push(main(Op::Copy { src, dst }));
                            }
                            1 => {
                                // Within one buffer: overlapping forward, backward, or not at all.
                                let src = region(&plan, write(s[3]), s[4], n);
                                let dst = region(&plan, src.buf.0, s[6], src.count);
                                plan.ranks[rank].push(main(Op::Copy { src, dst }));
                            }
                            2 => {
                                let a = region(&plan, write(s[3]), s[4], n);
                                let b = region(&plan, read(s[5]), s[6], a.count);
                                let dst = if s[7] % 2 == 0 {
                                    a
                                } else {
                                    region(&plan, write(s[7] / 2), s[7] / 3, a.count)
                                };
                                plan.ranks[rank].push(main(Op::Reduce { dst, a, b }));
                            }
                            3 => {
                                let region = region(&plan, write(s[3]), s[4], n);
                                plan.ranks[rank].push(main(Op::Scale { region }));
                            }
                            _ => {
                                let kind =
                                    [BufKind::Input, BufKind::Output, BufKind::Slots][s[3] % 3];
                                let src = plan.buffer(0, kind).unwrap();
                                let Region { offset, count, .. } = region(&plan, src.0, s[4], n);
                                for r in 0..world {
                                    let mine = plan.buffer(
                                        r,
                                        match kind {
                                            BufKind::Output => BufKind::Slots,
                                            BufKind::Slots => BufKind::Output,
                                            _ => [BufKind::Output, BufKind::Slots][s[5] % 2],
                                        },
                                    );
                                    let dst = Region {
                                        buf: mine.unwrap(),
                                        offset: s[6]
                                            % (plan.decl(mine.unwrap()).len.saturating_sub(count)
                                                + 1),
                                        count,
                                    };
                                    plan.ranks[r].push(main(Op::PeerReduce {
                                        dst,
                                        src: kind,
                                        offset,
                                        count,
                                        // Sometimes a copy from one rank (the two-shot's gather).
                                        ranks: if s[5] % 3 == 0 {
                                            crate::plan::Ranks::only(s[6] % world)
                                        } else {
                                            crate::plan::Ranks::ALL
                                        },
                                    }));
                                }
                            }
                        }
                    }
                    plan
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

        #[test]
        fn runs_agree_with_elements_on_random_ring_plans(
            spec in ring_strategy(),
            plants in plants_strategy(),
        ) {
            let plan = spec.build().unwrap();
            prop_assert_eq!(agree(&plan), Some(Ok(())));
            agree(&plant_all(plan, &plants));
        }

        #[test]
        fn runs_agree_with_elements_on_random_oneshot_plans(
            world in 1usize..=6,
            count in 0usize..40,
            in_place in any::<bool>(),
            avg in any::<bool>(),
            plants in plants_strategy(),
        ) {
            let plan = crate::plan::OneShotSpec {
                world,
                count,
                in_place,
                op: if avg { ReduceOp::Avg } else { ReduceOp::Sum },
            }
            .build()
            .unwrap();
            prop_assert_eq!(agree(&plan), Some(Ok(())));
            agree(&plant_all(plan, &plants));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn runs_agree_with_elements_on_random_programs(plan in program_strategy()) {
            agree(&plan);
        }
    }

    /// The random programs above reach every rejection of the symbolic check (and some pass):
    /// the agreement they test is not only on "nothing has written".
    #[test]
    fn random_programs_reach_every_outcome() {
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let mut outcomes: Vec<String> = Vec::new();
        for _ in 0..3000 {
            let plan = program_strategy().new_tree(&mut runner).unwrap().current();
            match agree(&plan) {
                Some(Ok(())) => outcomes.push("accepted".into()),
                Some(Err(e)) => outcomes.push(e.0),
                None => {}
            }
        }
        for needle in [
            "accepted",
            "nothing has written",
            "twice",
            "averages a partial sum",
            "reduces an already averaged value",
            "lacks the contribution",
            "never written",
            "was averaged",
        ] {
            assert!(
                outcomes.iter().any(|m| m.contains(needle)),
                "no random program ended with {needle:?}"
            );
        }
    }

    #[test]
    fn a_copy_onto_its_own_tail_repeats_its_head_as_element_by_element() {
        // Out of place, world 1: copy input[0..2] to output[0..2], then copy within the output.
        let mut plan = crate::plan::OneShotSpec {
            world: 1,
            count: 8,
            in_place: false,
            op: ReduceOp::Sum,
        }
        .build()
        .unwrap();
        let (input, output) = (
            plan.buffer(0, BufKind::Input).unwrap(),
            plan.buffer(0, BufKind::Output).unwrap(),
        );
        let at = |buf, offset, count| Region { buf, offset, count };
        let copy = |src, dst| Instr {
            stream: StreamKind::Main,
            op: Op::Copy { src, dst },
            tag: Tag::ENTRY,
        };
        plan.ranks[0] = vec![
            copy(at(input, 0, 2), at(output, 0, 2)),
            // Element by element this reads 0, 1, then what it wrote to 2, 3, ...: the whole
            // output ends written.
            copy(at(output, 0, 6), at(output, 2, 6)),
        ];
        assert_eq!(agree(&plan), Some(Ok(())));
        // Copied backwards it reads elements never written.
        plan.ranks[0][1] = copy(at(output, 2, 6), at(output, 0, 6));
        let err = agree(&plan).unwrap().unwrap_err();
        assert!(err.0.contains("reads element 2 of Output"), "{err}");
        // A forward overlap whose head (here output[1..4]) is partly unwritten names the first
        // unwritten head element.
        plan.ranks[0][1] = copy(at(output, 1, 4), at(output, 4, 4));
        let err = agree(&plan).unwrap().unwrap_err();
        assert!(err.0.contains("reads element 2 of Output"), "{err}");
    }
}
