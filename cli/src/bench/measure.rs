//! Timing one library over the sweep, as nccl-tests does: per size and placement one checked call,
//! `-w` warm-up iterations, `-n` back-to-back iterations timed on the host, then `-n` more with a
//! CUDA event between consecutive iterations on rank 0's stream for the per-iteration (min, median,
//! p99) times; and the formulas the rows are made of (algbw, busbw, the sizes of the sweep).
//!
//! Invariant: every enqueue is followed by the library's `synchronize` before its buffers are read
//! or dropped, on the error paths too; ringreduce and NCCL are driven through the same [`Lib`]
//! calls, so their numbers come from the same procedure.

use super::report::{print_row, print_table_header, Measure, Row};
use super::BenchArgs;
use crate::Failure;
use ringreduce::device;
use ringreduce::verify::{compare, make_expected, make_input};
use ringreduce::{Communicator, DType, Element, GpuBuffer, ReduceOp};
use ringreduce_cli::baseline::NcclAllReduce;
use std::time::Instant;

/// The library under test, driven the same way.
pub(super) enum Lib<'a> {
    Ring(&'a Communicator),
    Nccl(&'a NcclAllReduce),
}

/// One buffer per rank (inputs; in place, the results too) and, out of place, the outputs.
struct Bufs<T: Element> {
    inputs: Vec<GpuBuffer<T>>,
    outputs: Vec<GpuBuffer<T>>,
}

impl Lib<'_> {
    /// # Safety
    /// The buffers stay allocated and untouched until `synchronize` has returned.
    unsafe fn enqueue<T: Element>(
        &self,
        bufs: &mut Bufs<T>,
        in_place: bool,
        op: ReduceOp,
    ) -> ringreduce::Result<()> {
        // SAFETY: the caller's contract is each library's.
        unsafe {
            match (self, in_place) {
                (Lib::Ring(c), true) => c.enqueue_all_reduce_in_place(&mut bufs.inputs, op),
                (Lib::Ring(c), false) => c.enqueue_all_reduce(&bufs.inputs, &mut bufs.outputs, op),
                (Lib::Nccl(n), true) => n.enqueue_all_reduce_in_place(&mut bufs.inputs, op),
                (Lib::Nccl(n), false) => n.enqueue_all_reduce(&bufs.inputs, &mut bufs.outputs, op),
            }
        }
    }

    fn synchronize(&self) -> ringreduce::Result<()> {
        match self {
            Lib::Ring(c) => c.synchronize(),
            Lib::Nccl(n) => n.synchronize(),
        }
    }

    /// Records `event` on rank 0's stream.
    fn record(&self, event: &device::Event) -> ringreduce::Result<()> {
        match self {
            Lib::Ring(c) => {
                let stream = c.main_stream(0).ok_or_else(|| {
                    ringreduce::Error::InvalidArgument("not a GPU communicator".into())
                })?;
                // SAFETY: `stream` is rank 0's main stream, live while `c` is, in the primary
                // context of devices()[0], where `event` was made (see `measure_size`).
                unsafe { device::record_on_raw_stream(event, stream) }
            }
            Lib::Nccl(n) => match n.stream(0) {
                Some(stream) => device::record(event, stream),
                None => Err(ringreduce::Error::NoBuffers),
            },
        }
    }
}

/// Everything the sweep needs that does not change between sizes.
pub(super) struct Sweep<'a> {
    args: &'a BenchArgs,
    devices: Vec<usize>,
    /// `iters + 1` timing events on rank 0's GPU.
    events: Vec<device::Event>,
}

impl Sweep<'_> {
    pub(super) fn new(args: &BenchArgs, devices: Vec<usize>) -> ringreduce::Result<Sweep<'_>> {
        let ctx = device::context(devices[0])?;
        let events = (0..=args.iters.max(1))
            .map(|_| device::Event::with_timing(&ctx))
            .collect::<ringreduce::Result<_>>()?;
        Ok(Sweep {
            args,
            devices,
            events,
        })
    }

    /// Every size for `lib`, printed as it goes.
    pub(super) fn run(&self, lib: &Lib, label: &str, print: bool) -> Result<Vec<Row>, Failure> {
        macro_rules! typed {
            ($($d:ident => $t:ty),*) => {
                match self.args.dtype {
                    $(DType::$d => self.run_typed::<$t>(lib, label, print),)*
                }
            };
        }
        typed!(F16 => half::f16, BF16 => half::bf16, F32 => f32, F64 => f64, I8 => i8,
               U8 => u8, I32 => i32, U32 => u32, I64 => i64, U64 => u64)
    }

    fn run_typed<T: Element>(
        &self,
        lib: &Lib,
        label: &str,
        print: bool,
    ) -> Result<Vec<Row>, Failure> {
        let args = self.args;
        let world = self.devices.len();
        let elem = std::mem::size_of::<T>();
        let mut rows = Vec::new();
        if print {
            out!("#");
            out!("# {label}");
            print_table_header();
        }
        for bytes in sizes(args.min_bytes, args.max_bytes, args.factor, elem) {
            let count = bytes / elem;
            let inputs: Vec<Vec<T>> = (0..world).map(|r| make_input(args.op, r, count)).collect();
            let want: Vec<T> = make_expected(args.op, world, count);
            let oop = self.measure::<T>(lib, &inputs, &want, false)?;
            let ip = self.measure::<T>(lib, &inputs, &want, true)?;
            let row = Row {
                library: label.to_string(),
                size_bytes: bytes as u64,
                count: count as u64,
                dtype: args.dtype.name().into(),
                redop: args.op.name().into(),
                algorithm: match lib {
                    Lib::Ring(comm) => {
                        let name = |in_place| {
                            format!("{:?}", comm.algorithm_for(bytes, in_place)).to_lowercase()
                        };
                        let (oop, ip) = (name(false), name(true));
                        Some(if oop == ip {
                            oop
                        } else {
                            format!("{oop}/{ip}")
                        })
                    }
                    _ => None,
                },
                out_of_place: oop,
                in_place: ip,
            };
            if print {
                print_row(&row);
            }
            rows.push(row);
        }
        Ok(rows)
    }

    /// One placement of one size: checked call, warm-up, back-to-back timing, event timing.
    fn measure<T: Element>(
        &self,
        lib: &Lib,
        inputs: &[Vec<T>],
        want: &[T],
        in_place: bool,
    ) -> ringreduce::Result<Measure> {
        let args = self.args;
        let count = want.len();
        let mut bufs = Bufs {
            inputs: self
                .devices
                .iter()
                .zip(inputs)
                .map(|(&d, x)| GpuBuffer::from_host(d, x))
                .collect::<ringreduce::Result<_>>()?,
            outputs: if in_place {
                Vec::new()
            } else {
                self.devices
                    .iter()
                    .map(|&d| GpuBuffer::zeroed(d, count))
                    .collect::<ringreduce::Result<_>>()?
            },
        };
        // Every enqueue below is followed by `lib.synchronize()` before `bufs` is read or dropped,
        // on the error paths too (`queue` waits before returning an error).
        let queue = |bufs: &mut Bufs<T>,
                     n: usize,
                     mut between: Option<&mut dyn FnMut(usize) -> ringreduce::Result<()>>|
         -> ringreduce::Result<()> {
            for i in 0..n {
                if let Some(f) = between.as_mut() {
                    if let Err(e) = f(i) {
                        let _ = lib.synchronize();
                        return Err(e);
                    }
                }
                // SAFETY: `bufs` is neither read nor dropped before the `synchronize` below (or
                // the one on this error path).
                if let Err(e) = unsafe { lib.enqueue(bufs, in_place, args.op) } {
                    let _ = lib.synchronize();
                    return Err(e);
                }
            }
            if let Some(f) = between.as_mut() {
                if let Err(e) = f(n) {
                    let _ = lib.synchronize();
                    return Err(e);
                }
            }
            lib.synchronize()
        };
        // Checked call.
        queue(&mut bufs, 1, None)?;
        let results = if in_place {
            &bufs.inputs
        } else {
            &bufs.outputs
        };
        let mut wrong = 0u64;
        for (rank, b) in results.iter().enumerate() {
            let (w, first) = compare(rank, &b.to_host()?, want, 3);
            wrong += w as u64;
            for m in first {
                eprintln!("ringreduce bench: wrong element {m} ({count} elements)");
            }
        }
        // Warm-up, then back-to-back iterations timed on the host.
        queue(&mut bufs, args.warmup, None)?;
        let n = args.iters.max(1);
        let start = Instant::now();
        queue(&mut bufs, n, None)?;
        let seconds = start.elapsed().as_secs_f64() / n as f64;
        // Per-iteration times: an event between consecutive iterations on rank 0's stream.
        let mut record = |i: usize| lib.record(&self.events[i]);
        queue(&mut bufs, n, Some(&mut record))?;
        let mut per_iter = (0..n)
            .map(|i| {
                device::event_elapsed_ms(&self.events[i], &self.events[i + 1])
                    .map(|ms| f64::from(ms) * 1e3)
            })
            .collect::<ringreduce::Result<Vec<f64>>>()?;
        let (min, median, p99) = percentiles(&mut per_iter);
        let bytes = std::mem::size_of_val(want);
        let algbw = algbw_gbps(bytes, seconds);
        Ok(Measure {
            time_us: seconds * 1e6,
            algbw_gbps: algbw,
            busbw_gbps: busbw_gbps(algbw, self.devices.len()),
            wrong,
            iter_min_us: min,
            iter_median_us: median,
            iter_p99_us: p99,
        })
    }
}

/// algbw in GB/s (10⁹ B/s): one rank's buffer over the time of one all-reduce.
pub fn algbw_gbps(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

/// busbw = algbw · 2(n−1)/n: in a ring all-reduce each rank sends (and receives) 2(n−1)/n of the
/// buffer, so this is the bandwidth every link carried; comparable with the link's speed and
/// across world sizes. For n = 1 nothing moves: 0.
pub fn busbw_gbps(algbw: f64, world: usize) -> f64 {
    if world == 0 {
        return 0.0;
    }
    algbw * 2.0 * (world as f64 - 1.0) / world as f64
}

/// Sizes in bytes: `min` up to `max`, ×`factor` per row (at least ×2), each rounded down to whole
/// elements of `elem_bytes` and at least one element; duplicates after rounding dropped.
pub fn sizes(min: usize, max: usize, factor: usize, elem_bytes: usize) -> Vec<usize> {
    let factor = factor.max(2);
    let mut out: Vec<usize> = std::iter::successors(Some(min.max(1)), |s| s.checked_mul(factor))
        .take_while(|&s| s <= max)
        .map(|s| (s / elem_bytes).max(1) * elem_bytes)
        .collect();
    out.dedup();
    out
}

/// (min, median, p99) of `samples` (sorted in place); zeros when empty.
pub fn percentiles(samples: &mut [f64]) -> (f64, f64, f64) {
    if samples.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    let median = if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    };
    let p99 = samples[((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1];
    (samples[0], median, p99)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_bytes;

    #[test]
    fn sizes_parse_and_sweep() {
        assert_eq!(parse_bytes("8").unwrap(), 8);
        assert_eq!(parse_bytes("64K").unwrap(), 65536);
        assert_eq!(parse_bytes("256M").unwrap(), 256 << 20);
        assert_eq!(parse_bytes("1G").unwrap(), 1 << 30);
        assert!(parse_bytes("1X").is_err());
        let s = sizes(8, 1 << 30, 2, 4);
        assert_eq!(s.first(), Some(&8));
        assert_eq!(s.last(), Some(&(1 << 30)));
        assert_eq!(s.len(), 28);
        // Rounded to whole elements, at least one, no duplicates.
        assert_eq!(sizes(1, 64, 2, 8), vec![8, 16, 32, 64]);
        assert_eq!(sizes(6, 100, 4, 4), vec![4, 24, 96]);
    }

    #[test]
    fn busbw_formula() {
        assert_eq!(algbw_gbps(1_000_000_000, 1.0), 1.0);
        assert_eq!(busbw_gbps(100.0, 2), 100.0);
        assert_eq!(busbw_gbps(100.0, 4), 150.0);
        assert_eq!(busbw_gbps(100.0, 8), 175.0);
        assert_eq!(busbw_gbps(100.0, 1), 0.0);
    }

    #[test]
    fn percentiles_of_samples() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentiles(&mut v), (1.0, 50.5, 99.0));
        assert_eq!(percentiles(&mut [3.0]), (3.0, 3.0, 3.0));
        assert_eq!(percentiles(&mut [2.0, 1.0, 3.0]), (1.0, 2.0, 3.0));
        assert_eq!(percentiles(&mut []), (0.0, 0.0, 0.0));
    }
}
