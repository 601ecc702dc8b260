//! The random-size workload ([`super::random`]) run by a [`Sweep`]: all-reduces whose size
//! changes from call to call, each timed from the call to its completion, on buffers of the
//! largest size, after warm-up calls at the smallest, and the results checked once the workload
//! is done.

use super::library::Lib;
use super::measure::Sweep;
use super::memory::{Memory, RankMemory};
use super::random::{random_sizes, RandomRun};
use ringreduce::verify::{make_expected, make_input};
use ringreduce::Error;
use ringreduce::{Collective, Element};
use std::time::Instant;

impl Sweep<'_> {
    /// The random-size workload for `lib` (eager, out of place or in place): `calls` sizes from
    /// [`random_sizes`], `-w` warm-up calls at the smallest of them, then every call timed from
    /// the call to its completion. An error stops the workload and is recorded in the run.
    pub(super) fn run_random(
        &self,
        lib: &Lib,
        label: &str,
        memory: Memory,
        calls: usize,
        seed: u64,
        in_place: bool,
    ) -> RandomRun {
        ringreduce::with_element!(self.args.dtype, T => {
            self.random_typed::<T>(lib, label, memory, calls, seed, in_place)
        })
    }

    fn random_typed<T: Element>(
        &self,
        lib: &Lib,
        label: &str,
        memory: Memory,
        calls: usize,
        seed: u64,
        in_place: bool,
    ) -> RandomRun {
        let args = self.args;
        let elem = std::mem::size_of::<T>();
        let sequence = random_sizes(args.min_bytes, args.max_bytes, calls, elem, seed);
        let mut run = RandomRun {
            library: label.to_string(),
            seed,
            min_bytes: args.min_bytes as u64,
            max_bytes: args.max_bytes as u64,
            in_place,
            calls: Vec::with_capacity(calls),
            wrong: 0,
            error: None,
        };
        if let Err(e) = self.random_calls::<T>(lib, memory, &sequence, in_place, &mut run) {
            run.error = Some(e.to_string());
        }
        run
    }

    /// Out of place, the outputs are zeroed first and checked after the last call (each element
    /// last written by the largest call covering it, which reduces the same inputs). In place,
    /// every call reduces the previous one's results, so the check restores the inputs after the
    /// workload and checks one more call, of the largest size.
    fn random_calls<T: Element>(
        &self,
        lib: &Lib,
        memory: Memory,
        sequence: &[usize],
        in_place: bool,
        run: &mut RandomRun,
    ) -> Result<(), Error> {
        let (args, world, elem) = (self.args, self.devices.len(), std::mem::size_of::<T>());
        let largest = sequence.iter().max().map_or(0, |b| b / elem);
        let smallest = sequence.iter().min().map_or(0, |b| b / elem);
        let mut ins = RankMemory::zeroed(lib, memory, &self.devices, largest)?;
        let inputs: Vec<Vec<T>> = (0..world)
            .map(|r| make_input(args.op, r, largest))
            .collect();
        ins.write_all(&inputs)?;
        let mut outs = match in_place {
            true => None,
            false => Some(RankMemory::zeroed(lib, memory, &self.devices, largest)?),
        };
        let mut one = |ins: &mut RankMemory<'_, T>, count: usize| -> Result<f64, Error> {
            let mut i = ins.views_mut(count)?;
            let mut o = outs.as_mut().map(|o| o.views_mut(count)).transpose()?;
            let t = Instant::now();
            let all_reduce = &Collective::AllReduce;
            // SAFETY: `ins`/`outs` hold the memory until after the synchronize, on every path.
            let call = unsafe { lib.enqueue(all_reduce, &mut i, o.as_deref_mut(), args.op, None) };
            let synced = lib.synchronize();
            call.and(synced)?;
            Ok(t.elapsed().as_secs_f64() * 1e6)
        };
        for _ in 0..args.warmup {
            one(&mut ins, smallest)?;
        }
        for &bytes in sequence {
            let us = one(&mut ins, bytes / elem)?;
            run.calls.push((bytes as u64, us));
        }
        if in_place {
            ins.write_all(&inputs)?;
            one(&mut ins, largest)?;
        }
        let checked = outs.as_ref().unwrap_or(&ins);
        run.wrong = checked.count_wrong(&make_expected(args.op, world, largest))?;
        Ok(())
    }
}
