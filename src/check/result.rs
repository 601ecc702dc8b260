//! Check 4, symbolic result: the plan is executed on sets of contributions instead of numbers.
//!
//! Rank r's input holds `{r}`; a reduction takes the union and rejects operands that share a rank
//! (a contribution counted twice); a read of memory nothing wrote is rejected. Every element of
//! every output must end holding every rank exactly once (and, for `Avg`, scaled exactly once,
//! after the sum was complete). Because the plan is race-free (check 3), the order of execution
//! cannot change this, so one legal order (check 2) decides it.
//!
//! Memory is held as runs of equal values ([`Runs`]), not element by element: the check costs the
//! number of instructions times the runs they touch, the same for 1 GiB as for 1 KiB. Invariant
//! of [`Runs`]: neighbouring runs hold different values and cover the buffer. An error names the
//! first offending element, exactly as an element-by-element execution would (the unit tests hold
//! the two executions to the same answer, message for message).

use super::enqueue::check_order;
use super::{describe, peer_sources, reject, Check, Rejection};
use crate::plan::{BufKind, Op, Plan, Region};
use std::collections::BTreeMap;

/// The largest world the symbolic check represents (contributions are bits of a `u128`).
pub const MAX_SYMBOLIC_WORLD: usize = 128;

/// A symbolic value: which ranks' inputs an element holds, and how often it was scaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Sym {
    pub(super) ranks: u128,
    pub(super) scaled: u8,
}

/// A run of equal elements: its length in elements and the value each element holds (`None`:
/// nothing has written it).
pub(super) type Run = (usize, Option<Sym>);

/// One buffer's symbolic contents as runs of equal values: each key of `starts` is the first
/// element of a run that lasts until the next key (or `len`).
///
/// Invariant: key 0 is present when `len > 0`, every key is below `len`, and neighbouring runs
/// hold different values — so a buffer costs one entry per place where its value changes, however
/// many elements it has.
pub(super) struct Runs {
    pub(super) len: usize,
    pub(super) starts: BTreeMap<usize, Option<Sym>>,
}

impl Runs {
    /// A buffer of `len` elements that all hold `value`.
    pub(super) fn new(len: usize, value: Option<Sym>) -> Runs {
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
    pub(super) fn read(&self, offset: usize, count: usize) -> Vec<Run> {
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
    pub(super) fn write(&mut self, offset: usize, runs: &[Run]) {
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
/// Memory is kept as runs of equal values (`Runs`) and every instruction works run by run, so
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
pub(super) fn judge_output(
    plan: &Plan,
    rank: usize,
    i: usize,
    v: Option<Sym>,
    want_scaled: u8,
) -> Check {
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
