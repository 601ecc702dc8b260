//! Which collective `bench` measures, in nccl-tests' words: its name (`all_reduce`,
//! `all_gather`, `reduce_scatter`, `broadcast`, `reduce`, `alltoall`, `sendrecv`), the size a row
//! prints, the busbw factor, the buffers each rank holds, and the exact host reference every row
//! is checked against.
//!
//! # Sizes and bandwidths (nccl-tests' `doc/PERFORMANCE.md` and `src/*.cu`)
//!
//! The size S of a row is nccl-tests' size: bytes per rank for all_reduce, broadcast, reduce and
//! sendrecv; the *total* array for all_gather (n · sendcount elements: each rank sends S/n and
//! receives S) and reduce_scatter (each rank sends S and receives S/n); each rank's whole send
//! (and receive) buffer for alltoall (S/n to every peer). S is rounded down to whole blocks (n
//! elements for the three whose buffers are split in n). algbw = S / time; busbw = algbw ·
//! factor:
//!
//! | collective     | factor   |
//! |----------------|----------|
//! | all_reduce     | 2(n−1)/n |
//! | reduce_scatter | (n−1)/n  |
//! | all_gather     | (n−1)/n  |
//! | broadcast      | 1        |
//! | reduce         | 1        |
//! | alltoall       | (n−1)/n  |
//! | sendrecv       | 1        |
//!
//! Rooted collectives use root 0 (nccl-tests' default); sendrecv is nccl-tests' ring exchange:
//! rank r sends to r+1 and receives from r−1 (mod n).
//!
//! # The reference
//!
//! Inputs are [`ringreduce::verify::make_input`]'s rank- and index-dependent values (the
//! non-reducing collectives use `Sum`'s, the most varied); each rank's expectation is built on
//! the host from those inputs by the collective's definition (reductions through
//! [`ringreduce::verify::make_expected`], a sequential fold), never by the code under test.

use ringreduce::verify::{make_expected, make_input};
use ringreduce::{Collective, Element, ReduceOp, Transfer};
use serde::{Deserialize, Serialize};
use std::rc::Rc;

/// A collective `bench` can measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BenchCollective {
    #[serde(rename = "all_reduce")]
    AllReduce,
    #[serde(rename = "all_gather")]
    AllGather,
    #[serde(rename = "reduce_scatter")]
    ReduceScatter,
    #[serde(rename = "broadcast")]
    Broadcast,
    #[serde(rename = "reduce")]
    Reduce,
    #[serde(rename = "alltoall")]
    AllToAll,
    #[serde(rename = "sendrecv")]
    SendRecv,
}

/// The root of `broadcast` and `reduce` (nccl-tests' default, `-r 0`).
pub const ROOT: usize = 0;

impl BenchCollective {
    /// Every collective, in the order `--all` runs them.
    pub const ALL: [BenchCollective; 7] = [
        BenchCollective::AllReduce,
        BenchCollective::AllGather,
        BenchCollective::ReduceScatter,
        BenchCollective::Broadcast,
        BenchCollective::Reduce,
        BenchCollective::AllToAll,
        BenchCollective::SendRecv,
    ];

    /// nccl-tests' name (its binary is `<name>_perf`).
    pub fn name(self) -> &'static str {
        match self {
            BenchCollective::AllReduce => "all_reduce",
            BenchCollective::AllGather => "all_gather",
            BenchCollective::ReduceScatter => "reduce_scatter",
            BenchCollective::Broadcast => "broadcast",
            BenchCollective::Reduce => "reduce",
            BenchCollective::AllToAll => "alltoall",
            BenchCollective::SendRecv => "sendrecv",
        }
    }

    /// The collective of nccl-tests' `name`.
    pub fn from_name(name: &str) -> Option<BenchCollective> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    /// nccl-tests' busbw factor for `world` ranks (0 for one rank where data moves at all).
    pub fn busbw_factor(self, world: usize) -> f64 {
        if world == 0 {
            return 0.0;
        }
        let n = world as f64;
        match self {
            BenchCollective::AllReduce => 2.0 * (n - 1.0) / n,
            BenchCollective::AllGather
            | BenchCollective::ReduceScatter
            | BenchCollective::AllToAll => (n - 1.0) / n,
            BenchCollective::Broadcast | BenchCollective::Reduce | BenchCollective::SendRecv => 1.0,
        }
    }

    /// The factor as the header prints it.
    pub fn busbw_formula(self) -> &'static str {
        match self {
            BenchCollective::AllReduce => "2(n-1)/n",
            BenchCollective::AllGather
            | BenchCollective::ReduceScatter
            | BenchCollective::AllToAll => "(n-1)/n",
            _ => "1",
        }
    }

    /// Blocks a row's size S is split into: n where a rank's buffer holds one block per rank.
    fn blocks(self, world: usize) -> usize {
        match self {
            BenchCollective::AllGather
            | BenchCollective::ReduceScatter
            | BenchCollective::AllToAll => world.max(1),
            _ => 1,
        }
    }

    /// The library's count (NCCL's `count` / `sendcount` / `recvcount`) for a row of
    /// `size_bytes`: S / elem, over n for the block-split collectives; at least 1.
    pub fn count(self, size_bytes: usize, elem_bytes: usize, world: usize) -> usize {
        (size_bytes / elem_bytes / self.blocks(world)).max(1)
    }

    /// The sizes of the sweep `min..=max`, ×`factor`: each rounded down to whole blocks (at
    /// least one), duplicates after rounding dropped.
    pub fn sizes(
        self,
        min: usize,
        max: usize,
        factor: usize,
        elem_bytes: usize,
        world: usize,
    ) -> Vec<usize> {
        let unit = elem_bytes * self.blocks(world);
        super::stats::sizes(min, max, factor, unit)
    }

    /// The library's collective over `world` ranks of `count` elements.
    pub fn collective(self, world: usize, count: usize) -> Collective {
        match self {
            BenchCollective::AllReduce => Collective::AllReduce,
            BenchCollective::AllGather => Collective::AllGather,
            BenchCollective::ReduceScatter => Collective::ReduceScatter,
            BenchCollective::Broadcast => Collective::Broadcast { root: ROOT },
            BenchCollective::Reduce => Collective::Reduce { root: ROOT },
            BenchCollective::AllToAll => Collective::AllToAll,
            BenchCollective::SendRecv => Collective::SendRecv {
                transfers: (0..world)
                    .map(|r| Transfer {
                        from: r,
                        to: (r + 1) % world,
                        count,
                    })
                    .collect(),
            },
        }
    }

    /// The root of a rooted collective ([`ROOT`]).
    pub fn root(self) -> Option<usize> {
        matches!(self, BenchCollective::Broadcast | BenchCollective::Reduce).then_some(ROOT)
    }

    /// Whether the collective combines values with the operator.
    pub fn reduces(self) -> bool {
        matches!(
            self,
            BenchCollective::AllReduce | BenchCollective::ReduceScatter | BenchCollective::Reduce
        )
    }

    /// Whether the collective has an in-place form (NCCL's, and so ringreduce's).
    pub fn has_in_place(self) -> bool {
        !matches!(self, BenchCollective::AllToAll | BenchCollective::SendRecv)
    }

    /// The operator a row runs: `op` where the collective reduces, else `Sum` (unused).
    pub fn op(self, op: ReduceOp) -> ReduceOp {
        if self.reduces() {
            op
        } else {
            ReduceOp::Sum
        }
    }

    /// The redop column: the operator's name, or "none" (nccl-tests' word) where nothing reduces.
    pub fn redop_name(self, op: ReduceOp) -> &'static str {
        if self.reduces() {
            op.name()
        } else {
            "none"
        }
    }

    /// Elements of every rank's buffers for `count`: (input, output) out of place, and the one
    /// buffer in place. Every rank allocates both, also where it passes none (the broadcast's
    /// non-roots, the reduce's non-root outputs).
    pub fn lengths(self, world: usize, count: usize) -> (usize, usize, usize) {
        let c = self.collective(world, count);
        let input = (0..world)
            .filter_map(|r| c.input_len(r, world, count))
            .max()
            .unwrap_or(count);
        let output = (0..world)
            .filter_map(|r| c.output_len(r, world, count))
            .max()
            .unwrap_or(count);
        (input, output, c.in_place_len(world, count))
    }

    /// Rank `rank`'s initial data: its input out of place, its one buffer in place (all_gather
    /// in place: its input in its own block, zeros elsewhere).
    pub fn initial<T: Element>(
        self,
        op: ReduceOp,
        world: usize,
        count: usize,
        rank: usize,
        in_place: bool,
    ) -> Vec<T> {
        let op = self.op(op);
        let (input, _, one) = self.lengths(world, count);
        match (self, in_place) {
            (BenchCollective::AllGather, true) => {
                let mut buf = vec![T::zeroed(); one];
                buf[rank * count..(rank + 1) * count].copy_from_slice(&make_input(op, rank, count));
                buf
            }
            (_, true) => make_input(op, rank, one),
            (_, false) => make_input(op, rank, input),
        }
    }

    /// What every rank must hold afterwards: per rank, `None` (nothing to check: the reduce's
    /// non-roots) or the element offset in its output (its one buffer in place) and the values
    /// there. Ranks with equal expectations share one vector.
    pub fn expected<T: Element>(
        self,
        op: ReduceOp,
        world: usize,
        count: usize,
        in_place: bool,
    ) -> Vec<Option<(usize, Rc<Vec<T>>)>> {
        let op = self.op(op);
        let same = |v: Vec<T>| {
            let v = Rc::new(v);
            (0..world).map(|_| Some((0, v.clone()))).collect()
        };
        match self {
            BenchCollective::AllReduce => same(make_expected(op, world, count)),
            BenchCollective::ReduceScatter => {
                // Block r of the reduction of every rank's world·count input.
                let all: Vec<T> = make_expected(op, world, world * count);
                (0..world)
                    .map(|r| {
                        let at = if in_place { r * count } else { 0 };
                        Some((at, Rc::new(all[r * count..(r + 1) * count].to_vec())))
                    })
                    .collect()
            }
            BenchCollective::AllGather => {
                same((0..world).flat_map(|j| make_input(op, j, count)).collect())
            }
            BenchCollective::Broadcast => same(make_input(op, ROOT, count)),
            BenchCollective::Reduce => (0..world)
                .map(|r| (r == ROOT).then(|| (0, Rc::new(make_expected(op, world, count)))))
                .collect(),
            BenchCollective::AllToAll => {
                let inputs: Vec<Vec<T>> = (0..world)
                    .map(|j| make_input(op, j, world * count))
                    .collect();
                (0..world)
                    .map(|r| {
                        let out: Vec<T> = inputs
                            .iter()
                            .flat_map(|input| input[r * count..(r + 1) * count].iter().copied())
                            .collect();
                        Some((0, Rc::new(out)))
                    })
                    .collect()
            }
            BenchCollective::SendRecv => (0..world)
                .map(|r| Some((0, Rc::new(make_input(op, (r + world - 1) % world, count)))))
                .collect(),
        }
    }
}

/// `--collective NAME`: one of nccl-tests' names.
pub fn parse_collective(text: &str) -> Result<BenchCollective, String> {
    BenchCollective::from_name(text).ok_or_else(|| {
        let names: Vec<&str> = BenchCollective::ALL.iter().map(|c| c.name()).collect();
        format!(
            "unknown collective {text:?}: use one of {}",
            names.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringreduce::verify::input_value;
    use BenchCollective::*;

    #[test]
    fn names_round_trip_and_parse() {
        for c in BenchCollective::ALL {
            assert_eq!(BenchCollective::from_name(c.name()), Some(c));
            assert_eq!(parse_collective(c.name()), Ok(c));
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.name()));
            assert_eq!(serde_json::from_str::<BenchCollective>(&json).unwrap(), c);
        }
        let err = parse_collective("all-reduce").unwrap_err();
        assert!(err.contains("all_reduce, all_gather"), "{err}");
    }

    /// nccl-tests' doc/PERFORMANCE.md ("Summary") and src/sendrecv.cu (factor 1).
    #[test]
    fn busbw_factors_are_nccl_tests() {
        let f = |c: BenchCollective, n| c.busbw_factor(n);
        assert_eq!(f(AllReduce, 2), 1.0);
        assert_eq!(f(AllReduce, 4), 1.5);
        assert_eq!(f(AllReduce, 8), 1.75);
        for c in [AllGather, ReduceScatter, AllToAll] {
            assert_eq!(f(c, 2), 0.5);
            assert_eq!(f(c, 4), 0.75);
            assert_eq!(f(c, 8), 0.875);
        }
        for c in [Broadcast, Reduce, SendRecv] {
            assert_eq!(f(c, 2), 1.0);
            assert_eq!(f(c, 8), 1.0);
        }
        assert_eq!(f(AllReduce, 1), 0.0);
        assert_eq!(f(AllGather, 0), 0.0);
    }

    #[test]
    fn sizes_counts_and_lengths_follow_nccl_tests() {
        // all_gather of S = 1 MiB f32 over 4 ranks: each sends 64Ki elements, receives 256Ki.
        assert_eq!(AllGather.count(1 << 20, 4, 4), 1 << 16);
        assert_eq!(AllGather.lengths(4, 1 << 16), (1 << 16, 1 << 18, 1 << 18));
        // reduce_scatter: sends S, receives S/n.
        assert_eq!(
            ReduceScatter.lengths(4, 1 << 16),
            (1 << 18, 1 << 16, 1 << 18)
        );
        // alltoall: S in, S out, S/n per peer.
        assert_eq!(AllToAll.count(1 << 20, 4, 4), 1 << 16);
        assert_eq!(AllToAll.lengths(4, 1 << 16).0, 1 << 18);
        assert_eq!(AllToAll.lengths(4, 1 << 16).1, 1 << 18);
        // The others: S per rank.
        for c in [AllReduce, Broadcast, Reduce, SendRecv] {
            assert_eq!(c.count(1 << 20, 4, 4), 1 << 18);
            assert_eq!(c.lengths(4, 1 << 18), (1 << 18, 1 << 18, 1 << 18));
        }
        // Sizes are whole blocks: 8 B of f32 over 3 ranks is one element per block (12 B).
        assert_eq!(AllGather.sizes(8, 64, 2, 4, 3), vec![12, 24, 60]);
        assert_eq!(AllReduce.sizes(8, 64, 2, 4, 3), vec![8, 16, 32, 64]);
        assert_eq!(ReduceScatter.sizes(8, 64, 2, 4, 2), vec![8, 16, 32, 64]);
        assert_eq!(AllGather.count(8, 4, 3), 1);
        // The ring exchange of sendrecv.
        let Collective::SendRecv { transfers } = SendRecv.collective(3, 5) else {
            panic!("sendrecv is a send/recv");
        };
        let pairs: Vec<(usize, usize, usize)> =
            transfers.iter().map(|t| (t.from, t.to, t.count)).collect();
        assert_eq!(pairs, [(0, 1, 5), (1, 2, 5), (2, 0, 5)]);
        assert_eq!(
            Broadcast.collective(2, 1),
            Collective::Broadcast { root: 0 }
        );
        assert_eq!(
            (
                Reduce.redop_name(ReduceOp::Max),
                AllGather.redop_name(ReduceOp::Max)
            ),
            ("max", "none")
        );
        assert_eq!(AllGather.op(ReduceOp::Avg), ReduceOp::Sum);
        assert!(!AllToAll.has_in_place() && !SendRecv.has_in_place() && Reduce.has_in_place());
    }

    fn want(
        c: BenchCollective,
        op: ReduceOp,
        world: usize,
        count: usize,
        ip: bool,
    ) -> Vec<Option<(usize, Vec<i32>)>> {
        c.expected::<i32>(op, world, count, ip)
            .into_iter()
            .map(|e| e.map(|(at, v)| (at, v.to_vec())))
            .collect()
    }

    /// Each reference against the collective's definition, element by element, from the inputs.
    #[allow(clippy::needless_range_loop)]
    #[test]
    fn references_match_the_definitions() {
        let (world, count) = (3, 4);
        let input = |op, rank, i| input_value::<i32>(op, rank, i);
        let sum = |i| (0..world).map(|r| input(ReduceOp::Sum, r, i)).sum::<i32>();
        for ip in [false, true] {
            let all_reduce = want(AllReduce, ReduceOp::Sum, world, count, ip);
            let reduce_scatter = want(ReduceScatter, ReduceOp::Sum, world, count, ip);
            let reduce = want(Reduce, ReduceOp::Sum, world, count, ip);
            for r in 0..world {
                let (at, v) = all_reduce[r].clone().unwrap();
                assert_eq!(at, 0);
                assert_eq!(v, (0..count).map(sum).collect::<Vec<_>>());
                // Block r of the sum of world·count inputs; in place it lies in block r.
                let (at, v) = reduce_scatter[r].clone().unwrap();
                assert_eq!(at, if ip { r * count } else { 0 });
                assert_eq!(
                    v,
                    (0..count).map(|i| sum(r * count + i)).collect::<Vec<_>>()
                );
                // Reduce: the root alone.
                assert_eq!(reduce[r].is_some(), r == ROOT);
            }
            // Broadcast and all_gather: every rank the same.
            let bcast = want(Broadcast, ReduceOp::Max, world, count, ip);
            let gather = want(AllGather, ReduceOp::Max, world, count, ip);
            for r in 0..world {
                let v = &bcast[r].as_ref().unwrap().1;
                assert_eq!(
                    *v,
                    (0..count)
                        .map(|i| input(ReduceOp::Sum, ROOT, i))
                        .collect::<Vec<_>>()
                );
                let v = &gather[r].as_ref().unwrap().1;
                for j in 0..world {
                    for i in 0..count {
                        assert_eq!(v[j * count + i], input(ReduceOp::Sum, j, i));
                    }
                }
            }
        }
        // Max reduces with max, over world·count for reduce_scatter.
        let rs = want(ReduceScatter, ReduceOp::Max, world, count, false);
        for (r, e) in rs.iter().enumerate() {
            let v = &e.as_ref().unwrap().1;
            for i in 0..count {
                let max = (0..world)
                    .map(|j| input(ReduceOp::Max, j, r * count + i))
                    .max();
                assert_eq!(Some(v[i]), max);
            }
        }
        // alltoall: rank r's block j is rank j's block r.
        let a2a = want(AllToAll, ReduceOp::Sum, world, count, false);
        for r in 0..world {
            let v = &a2a[r].as_ref().unwrap().1;
            assert_eq!(v.len(), world * count);
            for j in 0..world {
                for i in 0..count {
                    assert_eq!(v[j * count + i], input(ReduceOp::Sum, j, r * count + i));
                }
            }
        }
        // sendrecv: rank r holds rank r−1's input.
        let sr = want(SendRecv, ReduceOp::Sum, world, count, false);
        for r in 0..world {
            let from = (r + world - 1) % world;
            let v = &sr[r].as_ref().unwrap().1;
            assert_eq!(
                *v,
                (0..count)
                    .map(|i| input(ReduceOp::Sum, from, i))
                    .collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn initial_data_puts_inputs_where_the_collective_reads_them() {
        let (world, count) = (3, 2);
        // all_gather in place: own block, zeros elsewhere.
        let buf: Vec<i32> = AllGather.initial(ReduceOp::Sum, world, count, 1, true);
        assert_eq!(buf.len(), world * count);
        assert_eq!(&buf[..2], &[0, 0]);
        assert_eq!(&buf[2..4], &make_input::<i32>(ReduceOp::Sum, 1, 2)[..]);
        assert_eq!(&buf[4..], &[0, 0]);
        // reduce_scatter out of place: world·count inputs.
        let buf: Vec<i32> = ReduceScatter.initial(ReduceOp::Sum, world, count, 2, false);
        assert_eq!(buf, make_input::<i32>(ReduceOp::Sum, 2, world * count));
        // A non-reducing collective ignores the operator's data (Prod's ±1, ±2).
        let buf: Vec<i32> = Broadcast.initial(ReduceOp::Prod, world, count, 0, false);
        assert_eq!(buf, make_input::<i32>(ReduceOp::Sum, 0, count));
    }
}
