//! Timing one library over the sweep, as nccl-tests does, plus the latency a caller sees.
//!
//! Per size and placement, eagerly: one checked call, `-w` warm-up iterations, `-n` back-to-back
//! iterations timed on the host (time = wall clock / n), `-n` more with a CUDA event between
//! consecutive iterations on rank 0's stream (per-iteration min, median, mean, p99), and `-n`
//! blocking calls, each timed on the host from the call to its completion (call median, mean,
//! p99). With `--graph N` ([`Mode::Graph`]): one eager call of the same shape on the bench's own
//! streams (checked), N calls captured into one CUDA graph per rank ([`super::graph`]), the graph's
//! result checked (out of place), and the same three passes over `-w`/`-n` replays, each time
//! divided by N. The random-size workload is module [`super::measure_random`]'s.
//!
//! Invariant: every enqueue is followed by a synchronize of the streams it used before its
//! buffers are read or dropped, on the error paths too; ringreduce and NCCL are driven through the
//! same [`Lib`] calls, so their numbers come from the same procedure.

use super::args::BenchArgs;
use super::collective::BenchCollective;
use super::graph;
use super::library::{arrange, Lib};
use super::memory::{Expected, Memory, RankMemory};
use super::report::{print_row, print_table_header, HostProfile, Measure, Row};
use super::stats::{algbw_gbps, Stats};
use crate::Failure;
use cudarc::driver::{CudaGraph, CudaStream};
use ringreduce::device;
use ringreduce::exec::profile::CallProfile;
use ringreduce::Error;
use ringreduce::{Collective, Element, GpuViewMut, ReduceOp};
use std::sync::Arc;
use std::time::Instant;

/// How the calls are issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One library call per all-reduce, on the library's own streams.
    Eager,
    /// N all-reduces captured into a CUDA graph on the bench's streams, replayed.
    Graph(usize),
}

/// Everything the sweep needs that does not change between sizes.
pub(super) struct Sweep<'a> {
    pub(super) args: &'a BenchArgs,
    pub(super) devices: Vec<usize>,
    /// `iters + 1` timing events on rank 0's GPU.
    events: Vec<device::Event>,
    /// The bench's own streams, one per GPU (the caller's streams of `Mode::Graph`).
    streams: Vec<Arc<CudaStream>>,
}

impl Sweep<'_> {
    pub(super) fn new(args: &BenchArgs, devices: Vec<usize>) -> ringreduce::Result<Sweep<'_>> {
        let ctx = device::context(devices[0])?;
        let events = (0..=args.iters.max(1))
            .map(|_| device::Event::with_timing(&ctx))
            .collect::<ringreduce::Result<_>>()?;
        let streams = graph::new_streams(&devices)?;
        Ok(Sweep {
            args,
            devices,
            events,
            streams,
        })
    }

    /// Every size for `lib`, printed as it goes. In [`Mode::Graph`] a size whose capture or
    /// replay fails becomes a row with its error, and the sweep goes on.
    pub(super) fn run(
        &self,
        lib: &Lib,
        label: &str,
        print: bool,
        mode: Mode,
        memory: Memory,
    ) -> Result<Vec<Row>, Failure> {
        ringreduce::with_element!(self.args.dtype, T => self.run_typed::<T>(lib, label, print, mode, memory))
    }

    fn run_typed<T: Element>(
        &self,
        lib: &Lib,
        label: &str,
        print: bool,
        mode: Mode,
        memory: Memory,
    ) -> Result<Vec<Row>, Failure> {
        let args = self.args;
        let world = self.devices.len();
        let elem = std::mem::size_of::<T>();
        let mut rows = Vec::new();
        for which in args.collectives() {
            if print {
                out!("#");
                out!(
                    "# {label}: {}, busbw = algbw * {}",
                    which.name(),
                    which.busbw_formula()
                );
                print_table_header();
            }
            for bytes in which.sizes(args.min_bytes, args.max_bytes, args.factor, elem, world) {
                let row = self.row::<T>(lib, label, which, bytes, mode, memory)?;
                if print {
                    print_row(&row);
                }
                rows.push(row);
            }
        }
        Ok(rows)
    }

    /// One size of one collective, out of place and (where it has one) in place. An error is
    /// the row's (and the sweep goes on), except for the eager all-reduce, where it ends the
    /// sweep.
    fn row<T: Element>(
        &self,
        lib: &Lib,
        label: &str,
        which: BenchCollective,
        bytes: usize,
        mode: Mode,
        memory: Memory,
    ) -> Result<Row, Failure> {
        let args = self.args;
        let elem = std::mem::size_of::<T>();
        // What the measured calls ran, as the library says (ringreduce's: `last_ran`).
        let ran = || match lib {
            Lib::Ring(comm) => comm
                .last_ran()
                .map(|r| format!("{:?}", r.algorithm).to_lowercase()),
            _ => None,
        };
        let both = self
            .measure::<T>(lib, which, bytes, false, mode, memory)
            .and_then(|oop| {
                let oop_ran = ran();
                let (ip, ip_ran) = if which.has_in_place() {
                    let ip = self.measure::<T>(lib, which, bytes, true, mode, memory)?;
                    (ip, ran())
                } else {
                    (Measure::default(), None)
                };
                Ok((oop, ip, [oop_ran, ip_ran]))
            });
        let (out_of_place, in_place, error, ran) = match both {
            Ok((oop, ip, ran)) => (oop, ip, None, ran),
            Err(e) if mode == Mode::Eager && which == BenchCollective::AllReduce => {
                return Err(e.into())
            }
            Err(e) => (
                Measure::default(),
                Measure::default(),
                Some(e.to_string()),
                [None, None],
            ),
        };
        Ok(Row {
            library: label.to_string(),
            collective: which,
            size_bytes: bytes as u64,
            count: (bytes / elem) as u64,
            dtype: args.dtype.name().into(),
            redop: which.redop_name(args.op).into(),
            // "oneshot", or "oneshot/twoshot" where the placements ran different algorithms.
            algorithm: match ran {
                [Some(oop), Some(ip)] if oop != ip => Some(format!("{oop}/{ip}")),
                [Some(oop), _] => Some(oop),
                [None, ip] => ip,
            },
            out_of_place,
            in_place,
            error,
        })
    }

    /// One placement of one size of `which`, in `mode`, on `memory`: the buffers made and
    /// filled with [`BenchCollective::initial`], checked against [`BenchCollective::expected`].
    fn measure<T: Element>(
        &self,
        lib: &Lib,
        which: BenchCollective,
        bytes: usize,
        in_place: bool,
        mode: Mode,
        memory: Memory,
    ) -> Result<Measure, Error> {
        let (args, world) = (self.args, self.devices.len());
        let count = which.count(bytes, std::mem::size_of::<T>(), world);
        let (input, output, one) = which.lengths(world, count);
        let shape = Shape {
            which,
            collective: which.collective(world, count),
            op: which.op(args.op),
            bytes,
            in_len: if in_place { one } else { input },
            out_len: output,
        };
        let mut ins = RankMemory::zeroed(lib, memory, &self.devices, shape.in_len)?;
        let data: Vec<Vec<T>> = (0..world)
            .map(|r| which.initial(args.op, world, count, r, in_place))
            .collect();
        ins.write_all(&data)?;
        drop(data);
        let mut outs = if in_place {
            None
        } else {
            Some(RankMemory::zeroed(lib, memory, &self.devices, output)?)
        };
        let expect = which.expected::<T>(args.op, world, count, in_place);
        match mode {
            Mode::Eager => self.measure_eager(lib, &shape, &mut ins, outs.as_mut(), &expect),
            Mode::Graph(calls) => {
                self.measure_graph(lib, &shape, &mut ins, outs.as_mut(), &expect, calls)
            }
        }
    }

    fn measure_eager<T: Element>(
        &self,
        lib: &Lib,
        shape: &Shape,
        ins: &mut RankMemory<'_, T>,
        mut outs: Option<&mut RankMemory<'_, T>>,
        expect: &[Expected<T>],
    ) -> Result<Measure, Error> {
        let args = self.args;
        let (c, op) = (&shape.collective, shape.op);
        // Checked call.
        {
            let (mut i, mut o) = shape.views_mut(ins, outs.as_deref_mut())?;
            // SAFETY: the views' memory lives (in `ins`/`outs`) until after the synchronize.
            let call = unsafe { lib.enqueue(c, &mut i, o.as_deref_mut(), op, None) };
            let synced = lib.synchronize();
            call.and(synced)?;
        }
        let wrong = outs.as_deref().unwrap_or(ins).count_wrong_each(expect)?;
        let (mut i, mut o) = shape.views_mut(ins, outs)?;
        // `n` calls back to back, `between(k)` before call k and after the last; then one wait
        // (also when a call fails, before the buffers can be dropped).
        let mut queue = |n: usize,
                         between: &mut dyn FnMut(usize) -> ringreduce::Result<()>|
         -> Result<(), Error> {
            let mut result = Ok(());
            for k in 0..=n {
                result = between(k);
                if result.is_ok() && k < n {
                    // SAFETY: the memory outlives the synchronize below, on every path.
                    result = unsafe { lib.enqueue(c, &mut i, o.as_deref_mut(), op, None) };
                }
                if result.is_err() {
                    break;
                }
            }
            let synced = lib.synchronize();
            result.and(synced)
        };
        let n = args.iters.max(1);
        queue(args.warmup, &mut |_| Ok(()))?;
        let start = Instant::now();
        queue(n, &mut |_| Ok(()))?;
        let seconds = start.elapsed().as_secs_f64() / n as f64;
        queue(n, &mut |k| lib.record(&self.events[k]))?;
        let mut per_iter = self.event_times_us(n, 1)?;
        let mut per_call = Vec::with_capacity(n);
        lib.host_profile();
        for _ in 0..n {
            let t = Instant::now();
            queue(1, &mut |_| Ok(()))?;
            per_call.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let profiled = lib.host_profile();
        let mut measure = self.measure_from(shape, seconds, wrong, &mut per_iter, &mut per_call);
        if let (true, Lib::Ring(comm)) = (args.profile_host, lib) {
            // As many blocking calls, for their phases.
            for _ in 0..n {
                match o.as_deref_mut() {
                    Some(o) => comm.collective(c, Some(&i[..]), o, op)?,
                    None => comm.collective(c, None::<&[GpuViewMut<'_, T>]>, &mut i, op)?,
                }
            }
            let of = |calls: &[CallProfile], name: &str| -> Vec<CallProfile> {
                calls.iter().filter(|p| p.call == name).cloned().collect()
            };
            let blocking = comm.host_profile();
            measure.host_profile = Some(HostProfile {
                enqueue: HostProfile::medians(&of(&profiled, "collective")),
                synchronize: HostProfile::medians(&of(&profiled, "synchronize")),
                blocking: HostProfile::medians(&of(&blocking, "collective")),
            });
        }
        Ok(measure)
    }

    fn measure_graph<T: Element>(
        &self,
        lib: &Lib,
        shape: &Shape,
        ins: &mut RankMemory<'_, T>,
        mut outs: Option<&mut RankMemory<'_, T>>,
        expect: &[Expected<T>],
        calls: usize,
    ) -> Result<Measure, Error> {
        let (args, streams) = (self.args, &self.streams[..]);
        let (c, op) = (&shape.collective, shape.op);
        // One eager call of the same shape on the same streams (plans and staging are made outside
        // the capture), checked; then the capture.
        let graphs: Vec<CudaGraph> = {
            let (mut i, mut o) = shape.views_mut(ins, outs.as_deref_mut())?;
            // SAFETY: the views' memory lives (in `ins`/`outs`) until after the synchronize.
            let call = unsafe { lib.enqueue(c, &mut i, o.as_deref_mut(), op, Some(streams)) };
            let synced = graph::synchronize(streams);
            call.and(synced)?;
            // SAFETY: captured work runs only in replays, each followed by a synchronize of
            // `streams` while `ins`/`outs` still hold the memory (the graphs are dropped first).
            let captured = graph::capture(streams, calls, || unsafe {
                lib.enqueue(c, &mut i, o.as_deref_mut(), op, Some(streams))
            });
            let synced = graph::synchronize(streams);
            let graphs = captured?;
            synced?;
            graphs
        };
        let mut wrong = outs.as_deref().unwrap_or(ins).count_wrong_each(expect)?;
        graph::upload(&graphs)?;
        let queue = |n: usize,
                     between: &mut dyn FnMut(usize) -> ringreduce::Result<()>|
         -> ringreduce::Result<()> {
            let mut result = Ok(());
            for k in 0..=n {
                result = between(k);
                if result.is_ok() && k < n {
                    result = graph::replay(&graphs);
                }
                if result.is_err() {
                    break;
                }
            }
            let synced = graph::synchronize(streams);
            result.and(synced)
        };
        // The graph's own result: out of place, outputs zeroed, one replay, compared.
        if let Some(o) = outs.as_mut() {
            let zeros = vec![vec![T::zeroed(); shape.out_len]; self.devices.len()];
            o.write_all(&zeros)?;
            queue(1, &mut |_| Ok(()))?;
            wrong += o.count_wrong_each(expect)?;
        }
        let n = args.iters.max(1);
        queue(args.warmup.max(1), &mut |_| Ok(()))?;
        let start = Instant::now();
        queue(n, &mut |_| Ok(()))?;
        let seconds = start.elapsed().as_secs_f64() / (n * calls) as f64;
        let rank0 = streams[0].cu_stream();
        queue(n, &mut |k| {
            // SAFETY: `rank0` is the bench's live stream of devices[0], in the primary context
            // where the events were made (`Sweep::new`).
            unsafe { device::record_on_raw_stream(&self.events[k], rank0) }
        })?;
        let mut per_iter = self.event_times_us(n, calls)?;
        let mut per_call = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            queue(1, &mut |_| Ok(()))?;
            per_call.push(t.elapsed().as_secs_f64() * 1e6 / calls as f64);
        }
        drop(graphs);
        Ok(self.measure_from(shape, seconds, wrong, &mut per_iter, &mut per_call))
    }

    /// The times between consecutive events 0..=n, µs, each divided by `per`.
    fn event_times_us(&self, n: usize, per: usize) -> ringreduce::Result<Vec<f64>> {
        (0..n)
            .map(|k| {
                device::event_elapsed_ms(&self.events[k], &self.events[k + 1])
                    .map(|ms| f64::from(ms) * 1e3 / per as f64)
            })
            .collect()
    }

    fn measure_from(
        &self,
        shape: &Shape,
        seconds: f64,
        wrong: u64,
        per_iter: &mut [f64],
        per_call: &mut [f64],
    ) -> Measure {
        let it = Stats::of(per_iter);
        let call = Stats::of(per_call);
        let algbw = algbw_gbps(shape.bytes, seconds);
        Measure {
            time_us: seconds * 1e6,
            algbw_gbps: algbw,
            busbw_gbps: algbw * shape.which.busbw_factor(self.devices.len()),
            wrong,
            iter_min_us: it.min,
            iter_median_us: it.median,
            iter_p99_us: it.p99,
            iter_mean_us: Some(it.mean),
            call_median_us: Some(call.median),
            call_p99_us: Some(call.p99),
            call_mean_us: Some(call.mean),
            host_profile: None,
        }
    }
}

/// One measurement's collective and buffers.
struct Shape {
    which: BenchCollective,
    /// The library's collective for this count.
    collective: Collective,
    /// The operator passed (`Sum` where nothing reduces).
    op: ReduceOp,
    /// The row's size, nccl-tests' S.
    bytes: usize,
    /// Elements of every rank's input (its one buffer in place) and output buffer.
    in_len: usize,
    out_len: usize,
}

impl Shape {
    /// The buffer lists of one call, as [`arrange`] orders them.
    #[allow(clippy::type_complexity)]
    fn views_mut<'b, T: Element>(
        &self,
        ins: &'b mut RankMemory<'_, T>,
        outs: Option<&'b mut RankMemory<'_, T>>,
    ) -> ringreduce::Result<(Vec<GpuViewMut<'b, T>>, Option<Vec<GpuViewMut<'b, T>>>)> {
        let i = ins.views_mut(self.in_len)?;
        let o = outs.map(|o| o.views_mut(self.out_len)).transpose()?;
        Ok(arrange(&self.collective, i, o))
    }
}
