//! Check 4, symbolic result: the plan is executed on symbolic values ([`Sym`]) instead of numbers.
//!
//! Element p holding a value means "the fold over a set of ranks of their input element
//! p + shift"; rank r's input holds `{r}` with shift 0 (an in-place buffer holds it where the
//! collective puts the input: [`initial`]), a copy moves the shift with the data, a reduction
//! takes the union and rejects operands that share a rank (a contribution counted twice) or name
//! different elements; a read of memory nothing wrote is rejected. Every range the collective
//! defines must end holding exactly its value ([`expectations`]: the all-reduce's outputs every
//! rank at shift 0; an all-gather's block j rank j's input; a reduce-scatter's output block r of
//! the sum; ...) and, for `Avg`, scaled exactly once, after the sum was complete. Because the
//! plan is race-free (check 3), the order of execution cannot change this, so one legal order
//! (check 2) decides it.
//!
//! Memory is held as runs of equal values ([`Runs`]), not element by element: the check costs the
//! number of instructions times the runs they touch, the same for 1 GiB as for 1 KiB. Invariant
//! of [`Runs`]: neighbouring runs hold different values and cover the buffer. An error names the
//! first offending element, exactly as an element-by-element execution would (the unit tests hold
//! the two executions to the same answer, message for message).

use super::enqueue_order::check_order;
use super::{describe, peer_destinations, peer_sources, reject, Check, Rejection};
use crate::plan::{BufKind, Collective, Op, Plan, Region};
use std::collections::BTreeMap;

/// The largest world the symbolic check represents (contributions are bits of a `u128`).
pub const MAX_SYMBOLIC_WORLD: usize = 128;

/// A symbolic value. Element `p` of a buffer holding it holds the fold over `ranks` of element
/// `p + shift` of each of those ranks' input (`source` 0; for send/recv, `source` i + 1 is
/// transfer i's send buffer), scaled `scaled` times. The shift is relative to the element's own
/// position, so a copied range keeps one value (a run) however long it is: an all-gather's output
/// is `world` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Sym {
    pub(super) ranks: u128,
    pub(super) scaled: u8,
    pub(super) shift: i64,
    pub(super) source: u32,
}

impl Sym {
    /// Rank `rank`'s own input element `p + shift` at element `p`, from input buffer `source`.
    pub(super) fn input(rank: usize, shift: i64, source: u32) -> Sym {
        Sym {
            ranks: 1u128 << rank,
            scaled: 0,
            shift,
            source,
        }
    }

    /// The same value seen from a range that starts at `to` instead of `from` (a copy from
    /// element `from` to element `to`, or an operand read at `from` for a result at `to`).
    pub(super) fn moved(self, from: usize, to: usize) -> Sym {
        Sym {
            shift: self.shift + from as i64 - to as i64,
            ..self
        }
    }
}

/// The values a plan's buffers hold when a call starts, as runs covering each buffer (see the
/// table in [`crate::plan::Collective`]'s module): an input holds its rank's input; an in-place
/// buffer holds it where the collective puts the input (block `rank` of an all-gather; nothing
/// on a broadcast's non-root ranks); everything else is unwritten.
pub(super) fn initial(plan: &Plan, decl: &crate::plan::BufferDecl) -> Vec<Run> {
    let (rank, len) = (decl.rank, decl.len);
    let whole = |v: Option<Sym>| vec![(len, v)];
    match decl.kind {
        BufKind::Input => whole(Some(Sym::input(rank, 0, 0))),
        BufKind::SendBuf(i) => whole(Some(Sym::input(rank, 0, i as u32 + 1))),
        BufKind::Output if plan.in_place => match plan.collective {
            Collective::AllGather => {
                let at = plan.collective.in_place_input_at(rank, plan.count);
                let count = plan.count.min(len.saturating_sub(at));
                vec![
                    (at.min(len), None),
                    (count, Some(Sym::input(rank, -(at as i64), 0))),
                    (len.saturating_sub(at + count), None),
                ]
            }
            Collective::Broadcast { root } if root != rank => whole(None),
            _ => whole(Some(Sym::input(rank, 0, 0))),
        },
        _ => whole(None),
    }
}

/// One range a correct plan must leave holding one value: `len` elements of `buf` from
/// `offset`, each holding `want`.
pub(super) struct Expect {
    pub(super) buf: crate::plan::BufId,
    pub(super) offset: usize,
    pub(super) len: usize,
    pub(super) want: Sym,
}

/// Every rank's full set.
fn full_set(world: usize) -> u128 {
    if world == 128 {
        u128::MAX
    } else {
        (1u128 << world) - 1
    }
}

/// What the plan's collective must leave in the caller's buffers (NCCL's semantics, see
/// [`crate::plan::Collective`]), after checking that every caller's buffer the collective needs
/// is declared with its length.
pub(super) fn expectations(plan: &Plan) -> Check<Vec<Expect>> {
    let (n, count, c) = (plan.world, plan.count, &plan.collective);
    let full = full_set(n);
    let reduced = |shift: i64| Sym {
        ranks: full,
        scaled: u8::from(plan.average),
        shift,
        source: 0,
    };
    let mut out = Vec::new();
    let declared = |rank: usize, kind: BufKind, len: usize, what: &str| {
        let Some(buf) = plan.buffer(rank, kind) else {
            return reject(format!("the plan declares no {what} for rank {rank}"));
        };
        let got = plan.decl(buf).len;
        if got != len {
            return reject(format!(
                "rank {rank}'s {what} has {got} elements, not {len}"
            ));
        }
        Ok(buf)
    };
    if let Collective::SendRecv { transfers } = c {
        for (i, t) in transfers.iter().enumerate() {
            declared(t.from, BufKind::SendBuf(i), t.count, "send buffer")?;
            let buf = declared(t.to, BufKind::RecvBuf(i), t.count, "receive buffer")?;
            let want = Sym::input(t.from, 0, i as u32 + 1);
            out.push(Expect {
                buf,
                offset: 0,
                len: t.count,
                want,
            });
        }
        return Ok(out);
    }
    for rank in 0..n {
        let in_len = c.input_len(rank, n, count);
        let out_len = if plan.in_place {
            Some(c.in_place_len(n, count))
        } else {
            c.output_len(rank, n, count)
        };
        if let (false, Some(len)) = (plan.in_place, in_len) {
            declared(rank, BufKind::Input, len, "input")?;
        }
        let Some(len) = out_len else { continue };
        let buf = declared(rank, BufKind::Output, len, "output")?;
        let mut expect = |offset: usize, len: usize, want: Sym| {
            out.push(Expect {
                buf,
                offset,
                len,
                want,
            });
        };
        let block = |j: usize| (j * count) as i64;
        match *c {
            Collective::AllReduce => expect(0, count, reduced(0)),
            Collective::ReduceScatter if plan.in_place => {
                expect(c.in_place_output_at(rank, count), count, reduced(0))
            }
            Collective::ReduceScatter => expect(0, count, reduced(block(rank))),
            Collective::AllGather => {
                for j in 0..n {
                    expect(j * count, count, Sym::input(j, -block(j), 0));
                }
            }
            Collective::Broadcast { root } => expect(0, count, Sym::input(root, 0, 0)),
            Collective::Reduce { root } if rank == root => expect(0, count, reduced(0)),
            // In place, a non-root rank's buffer is its input, and stays so.
            Collective::Reduce { .. } => expect(0, count, Sym::input(rank, 0, 0)),
            Collective::AllToAll => {
                for j in 0..n {
                    expect(j * count, count, Sym::input(j, block(rank) - block(j), 0));
                }
            }
            Collective::SendRecv { .. } => unreachable!("handled above"),
        }
    }
    Ok(out)
}

/// A reduction's two values at one element, both seen from the result's position: the union of
/// their ranks, or why they cannot be combined (`at` names the result element).
/// `here` names the instruction, asked only when it is rejected (the happy path formats
/// nothing: it runs for every element of every reduction).
pub(super) fn combine(
    here: impl Fn() -> String,
    x: Sym,
    y: Sym,
    at: usize,
    world: usize,
) -> Check<Sym> {
    if x.ranks & y.ranks != 0 {
        return reject(format!(
            "{} counts the contribution of rank(s) {:?} twice at element {at}",
            here(),
            ranks_in(x.ranks & y.ranks, world)
        ));
    }
    if x.scaled + y.scaled > 0 {
        return reject(format!("{} reduces an already averaged value", here()));
    }
    if (x.shift, x.source) != (y.shift, y.source) {
        return reject(format!(
            "{} reduces different elements at element {at}: element {} of {} with element {} of {}",
            here(),
            at as i64 + x.shift,
            source_name(x.source),
            at as i64 + y.shift,
            source_name(y.source)
        ));
    }
    Ok(Sym {
        ranks: x.ranks | y.ranks,
        scaled: 0,
        ..x
    })
}

fn source_name(source: u32) -> String {
    match source {
        0 => "the inputs".into(),
        i => format!("send buffer {}", i - 1),
    }
}

/// The ranks of a set, in order.
pub(super) fn ranks_in(set: u128, world: usize) -> Vec<usize> {
    (0..world).filter(|r| set >> r & 1 == 1).collect()
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
    let expected = expectations(plan)?;
    let mut memory: Vec<Runs> = plan
        .buffers
        .iter()
        .map(|decl| {
            let mut runs = Runs::new(decl.len, None);
            runs.write(0, &initial(plan, decl));
            runs
        })
        .collect();
    let full = full_set(plan.world);
    let ranks_of = |set: u128| ranks_in(set, plan.world);
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
            Op::Copy { src, dst } | Op::Expose { src, dst } => {
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
                // Tile t of the copy (elements t·period… of `dst`) repeats the head, each value
                // seen from its new place; an ordinary copy is the one tile.
                let mut tiled = Vec::new();
                let mut done = 0;
                while done < src.count {
                    let mut within = 0;
                    for &(len, value) in &runs {
                        let len = len.min(src.count - done - within);
                        if len == 0 {
                            break;
                        }
                        let moved = value.map(|v| v.moved(src.offset, dst.offset + done));
                        tiled.push((len, moved));
                        within += len;
                    }
                    done += within;
                }
                memory[dst.buf.0].write(dst.offset, &tiled);
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
                    let (x, y) = (x.moved(a.offset, dst.offset), y.moved(b.offset, dst.offset));
                    let sum = combine(here, x, y, dst.offset + k, plan.world)?;
                    out.push((len, Some(sum)));
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
                        scaled: v.scaled + 1,
                        ..v
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
                    let mut acc: Option<Sym> = None;
                    for (&src, value) in sources.iter().zip(values) {
                        let v = value
                            .ok_or_else(|| unwritten(src, k))?
                            .moved(src.offset, dst.offset);
                        acc = Some(match acc {
                            // A copy (one source) may carry an averaged value; a fold may not.
                            None if v.scaled > 0 && sources.len() > 1 => {
                                return reject(format!(
                                    "{} reduces an already averaged value",
                                    here()
                                ))
                            }
                            None => v,
                            Some(acc) => combine(here, acc, v, dst.offset + k, plan.world)?,
                        });
                    }
                    out.push((len, acc));
                    Ok(())
                })?;
                // The same values land in every range the meeting writes (`dst` and its pushes).
                for to in peer_destinations(plan, &op) {
                    meeting.push((to, out.clone()));
                }
                if rank + 1 == plan.world {
                    for (dst, runs) in meeting.drain(..) {
                        memory[dst.buf.0].write(dst.offset, &runs);
                    }
                }
            }
        }
    }
    for e in &expected {
        let mut k = 0;
        for (len, v) in memory[e.buf.0].read(e.offset, e.len) {
            judge(plan, e.buf, e.offset + k, v, e.want)?;
            k += len;
        }
    }
    Ok(())
}

/// The verdict on one element (or the first element of a run) of a caller's buffer: it must hold
/// `want` (its ranks exactly once, the element it names, scaled as often).
pub(super) fn judge(
    plan: &Plan,
    buf: crate::plan::BufId,
    i: usize,
    got: Option<Sym>,
    want: Sym,
) -> Check {
    let decl = plan.decl(buf);
    let rank = decl.rank;
    let name = match decl.kind {
        BufKind::Output => "output".to_string(),
        kind => format!("{kind:?}"),
    };
    let ranks_of = |set: u128| ranks_in(set, plan.world);
    let Some(v) = got else {
        return reject(format!("rank {rank}'s {name} element {i} is never written"));
    };
    if v.ranks & !want.ranks != 0 {
        return reject(format!(
            "rank {rank}'s {name} element {i} holds the contribution of rank(s) {:?}, which does not belong there",
            ranks_of(v.ranks & !want.ranks)
        ));
    }
    if v.ranks != want.ranks {
        return reject(format!(
            "rank {rank}'s {name} element {i} lacks the contribution of rank(s) {:?}",
            ranks_of(want.ranks & !v.ranks)
        ));
    }
    if (v.shift, v.source) != (want.shift, want.source) {
        return reject(format!(
            "rank {rank}'s {name} element {i} holds element {} of {}, want element {} of {}",
            i as i64 + v.shift,
            source_name(v.source),
            i as i64 + want.shift,
            source_name(want.source)
        ));
    }
    if v.scaled != want.scaled {
        return reject(format!(
            "rank {rank}'s {name} element {i} was averaged {} times, want {}",
            v.scaled, want.scaled
        ));
    }
    Ok(())
}
