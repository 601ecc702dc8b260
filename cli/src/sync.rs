//! `ringreduce sync`: the cross-GPU event handoff, shown working and shown failing.
//!
//! Streams on different GPUs are ordered only by events: GPU a's stream *records* an event after it
//! writes, GPU b's stream *waits* on it before it reads. `cuStreamWaitEvent` captures the event's
//! latest record **at the moment the wait is enqueued**; a wait enqueued before its record waits
//! for the previous record (or, for an event never recorded, for nothing) and GPU b reads stale
//! data — no error, only wrong bytes, sometimes.
//!
//! Each round runs `--iters` iterations. Iteration i: GPU a first fills a `--delay-bytes` buffer
//! (a few tens of µs of work, so that a is slow to produce), then writes the value `i + 1` into slot
//! i of a buffer on a (`cuMemsetD32Async`; no kernel needed) and records `written`. GPU b waits,
//! copies slot i into its own memory (a peer copy), and copies that into slot i of pinned host
//! memory. After the round, every slot is checked: the right value; the sentinel the slots held
//! before (a **stale read**: b copied before a wrote); or anything else (wrong).
//!
//! - **Handoff** (what the library does, `src/exec/mod.rs`: `Handoff`, `enqueue_rank`): a writer
//!   thread enqueues the write and the record, then sends `i` over a channel; the reader thread
//!   receives `i` and only then enqueues its wait. The wait therefore sees record i (or a later one, which implies it), and
//!   b never reads early. Must be 0 stale: otherwise the command fails.
//! - **Pitfall**: one thread enqueues b's wait and copies for iteration i *before* a's write and
//!   record. The wait sees record i − 1 at best, so b reads slot i while a is still busy with the
//!   delay. Stale reads are expected but depend on the hardware and timing: reported, not asserted.
//!
//! The two GPUs are 0 and 1 (`--writer`, `--reader`); with one GPU, two streams on it play the two
//! parts (the rule is the same between streams of one GPU).

use crate::Failure;
use ringreduce::device::{
    context, enable_peer_access, memcpy_async, memcpy_peer_async, memset_d32_async, record,
    stream_synchronize, wait, DeviceBuffer, Event, PinnedHost, Stream,
};
use ringreduce::Result;

#[derive(clap::Args, Clone, Debug)]
pub struct SyncArgs {
    /// Iterations per round (each checks one value).
    #[arg(long, default_value_t = 1000, value_parser = iterations)]
    pub iters: usize,
    /// Bytes GPU a fills before each write, to make it slow (suffixes K, M, G).
    #[arg(long, default_value = "64M", value_parser = crate::parse_bytes)]
    pub delay_bytes: usize,
    /// The GPU that writes.
    #[arg(long, default_value_t = 0)]
    pub writer: usize,
    /// The GPU that waits and reads.
    #[arg(long, default_value_t = 1)]
    pub reader: usize,
}

impl Default for SyncArgs {
    fn default() -> Self {
        SyncArgs {
            iters: 1000,
            delay_bytes: 64 << 20,
            writer: 0,
            reader: 1,
        }
    }
}

/// Most iterations per round: values stay far from the sentinel, buffers small.
const MAX_ITERS: usize = 1 << 24;

fn iterations(text: &str) -> std::result::Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if (1..=MAX_ITERS).contains(&n) => Ok(n),
        _ => Err(format!(
            "expected a whole number from 1 to {MAX_ITERS}, got {text:?}"
        )),
    }
}

/// What slots held before a round: a value no iteration writes.
const SENTINEL: u32 = 0xFFFF_FFFF;

/// The value iteration `i` writes.
fn value(i: usize) -> u32 {
    // i < MAX_ITERS < u32::MAX - 1, so the value is never the sentinel.
    u32::try_from(i + 1).unwrap_or(SENTINEL - 1)
}

/// The result of one round.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Slots that still held the sentinel: b read before a wrote.
    pub stale: usize,
    /// Slots with anything else but the right value.
    pub wrong: usize,
    /// The first few (iteration, got, want) of either kind.
    pub first: Vec<(usize, u32, u32)>,
}

impl Outcome {
    /// Checks `got[i] == value(i)` for every slot.
    fn check(got: &[u32]) -> Outcome {
        let mut o = Outcome::default();
        for (i, &g) in got.iter().enumerate() {
            let want = value(i);
            if g == want {
                continue;
            }
            if g == SENTINEL {
                o.stale += 1;
            } else {
                o.wrong += 1;
            }
            if o.first.len() < 5 {
                o.first.push((i, g, want));
            }
        }
        o
    }
}

#[derive(Clone, Debug)]
pub struct SyncReport {
    pub writer: usize,
    pub reader: usize,
    pub iters: usize,
    pub delay_bytes: usize,
    pub handoff: Outcome,
    pub pitfall: Outcome,
}

impl SyncReport {
    /// The handoff round read every value right.
    pub fn handoff_ok(&self) -> bool {
        self.handoff.stale == 0 && self.handoff.wrong == 0
    }
}

pub fn run(args: &SyncArgs) -> Result<(), Failure> {
    let report = measure(args)?;
    print(&report);
    if report.handoff_ok() {
        Ok(())
    } else {
        Err(Failure::Failed(format!(
            "the event handoff read {} stale and {} wrong values out of {}",
            report.handoff.stale, report.handoff.wrong, report.iters
        )))
    }
}

/// GPU resources of both rounds; freed (after [`Resources::settle`]) when dropped.
struct Resources {
    writer: Stream,
    reader: Stream,
    /// Slot i (4 bytes) is written by iteration i, on the writer's GPU.
    src: DeviceBuffer,
    /// The reader's copy of `src`, on its GPU.
    mid: DeviceBuffer,
    /// The reader's copy of `mid`, in pinned host memory, checked after each round.
    host: PinnedHost,
    /// The delay fill's target, on the writer's GPU.
    delay: DeviceBuffer,
}

impl Resources {
    fn settle(&self) {
        let _ = stream_synchronize(&self.writer);
        let _ = stream_synchronize(&self.reader);
    }
}

impl Drop for Resources {
    /// Synchronizes both streams before the fields (buffers) are freed, so no queued copy outlives
    /// its memory, on any exit path.
    fn drop(&mut self) {
        self.settle();
    }
}

/// Runs the handoff round, then the pitfall round.
pub fn measure(args: &SyncArgs) -> Result<SyncReport, Failure> {
    let n = crate::require_gpus(1)?;
    let (a, b) = if n >= 2 {
        for d in [args.writer, args.reader] {
            if d >= n {
                return Err(Failure::Failed(format!(
                    "GPU {d} does not exist: this host has {n} GPUs (0..{n})"
                )));
            }
        }
        if args.writer == args.reader {
            return Err(Failure::Failed("--writer and --reader must differ".into()));
        }
        (args.writer, args.reader)
    } else {
        (0, 0)
    };
    let iters = args.iters.clamp(1, MAX_ITERS);
    let delay_words = (args.delay_bytes / 4).max(1);
    let (ctx_a, ctx_b) = (context(a)?, context(b)?);
    if a != b && ringreduce::device::can_access_peer(b, a)? {
        // As the library does for ring neighbours; correctness does not depend on it.
        enable_peer_access(&ctx_b, &ctx_a)?;
    }
    let r = Resources {
        writer: Stream::new(&ctx_a)?,
        reader: Stream::new(&ctx_b)?,
        src: DeviceBuffer::new(&ctx_a, 4 * iters)?,
        mid: DeviceBuffer::new(&ctx_b, 4 * iters)?,
        host: PinnedHost::new(&ctx_b, 4 * iters)?,
        delay: DeviceBuffer::new(&ctx_a, 4 * delay_words)?,
    };
    let handoff = round(&r, iters, delay_words, Mode::Handoff)?;
    let pitfall = round(&r, iters, delay_words, Mode::Pitfall)?;
    Ok(SyncReport {
        writer: a,
        reader: b,
        iters,
        delay_bytes: 4 * delay_words,
        handoff,
        pitfall,
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Handoff,
    Pitfall,
}

/// Writer's part of iteration i: delay, write slot i, record `written`.
fn write(r: &Resources, i: usize, delay_words: usize, written: &Event) -> Result<()> {
    // SAFETY: `delay` holds delay_words words and slot i lies inside `src` (i < iters, src holds
    // iters words; offsets are multiples of 4 into cuMemAlloc memory, so aligned); both live as
    // long as `r`, whose Drop synchronizes the streams first. Only the writer stream writes them;
    // the reader reads slot i only after this write in the handoff round (the race in the pitfall
    // round is a read of device memory by a copy — wrong data, never memory unsafety).
    unsafe {
        memset_d32_async(r.delay.ptr(), value(i), delay_words, &r.writer)?;
        memset_d32_async(r.src.ptr() + 4 * i as u64, value(i), 1, &r.writer)?;
    }
    record(written, &r.writer)
}

/// Reader's part of iteration i: wait on `written`, copy slot i to the reader's GPU, then to host.
fn read(r: &Resources, i: usize, written: &Event) -> Result<()> {
    wait(&r.reader, written)?;
    let offset = 4 * i as u64;
    // SAFETY: slot i (4 bytes) lies inside `src`, `mid` and `host` (each 4 × iters bytes), all
    // alive until `r`'s Drop has synchronized both streams; the host does not touch `host` until
    // the round's synchronize. Both copies are on the reader stream, so in order.
    unsafe {
        if r.src.device() == r.mid.device() {
            memcpy_async(r.mid.ptr() + offset, r.src.ptr() + offset, 4, &r.reader)?;
        } else {
            memcpy_peer_async(
                r.mid.ptr() + offset,
                r.mid.context(),
                r.src.ptr() + offset,
                r.src.context(),
                4,
                &r.reader,
            )?;
        }
        memcpy_async(
            r.host.uva_ptr() + offset,
            r.mid.ptr() + offset,
            4,
            &r.reader,
        )
    }
}

fn round(r: &Resources, iters: usize, delay_words: usize, mode: Mode) -> Result<Outcome> {
    // Reset: every slot holds the sentinel, on both GPUs and in host memory.
    // SAFETY: full ranges of live buffers, on their own streams, synchronized right after.
    unsafe {
        memset_d32_async(r.src.ptr(), SENTINEL, iters, &r.writer)?;
        memset_d32_async(r.mid.ptr(), SENTINEL, iters, &r.reader)?;
    }
    // The host slots need no reset: every iteration's D2H overwrites its slot before the check.
    stream_synchronize(&r.writer)?;
    stream_synchronize(&r.reader)?;
    // A fresh event per round: never recorded, so the pitfall's first wait is a no-op.
    let written = Event::new(r.writer.context())?;
    match mode {
        Mode::Handoff => handoff_round(r, iters, delay_words, &written)?,
        Mode::Pitfall => {
            for i in 0..iters {
                read(r, i, &written)?; // the wait is enqueued before its record: the bug
                write(r, i, delay_words, &written)?;
            }
        }
    }
    stream_synchronize(&r.writer)?;
    stream_synchronize(&r.reader)?;
    let got: Vec<u32> = r
        .host
        .as_slice()
        .chunks_exact(4)
        .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    Ok(Outcome::check(&got))
}

/// The library's rule: the writer thread enqueues the record, then hands `i` over a channel; the
/// reader thread enqueues its wait only after receiving it.
fn handoff_round(r: &Resources, iters: usize, delay_words: usize, written: &Event) -> Result<()> {
    let (tx, rx) = std::sync::mpsc::channel::<usize>();
    std::thread::scope(|scope| {
        let writer = scope.spawn(move || -> Result<()> {
            for i in 0..iters {
                write(r, i, delay_words, written)?;
                // The reader may be gone (it failed); its error is the one reported.
                if tx.send(i).is_err() {
                    break;
                }
            }
            Ok(())
        });
        let mut result = Ok(());
        for i in rx.iter() {
            if let Err(e) = read(r, i, written) {
                result = Err(e);
                break;
            }
        }
        drop(rx);
        let written_ok = writer.join().unwrap_or_else(|_| {
            Err(ringreduce::Error::InvalidArgument(
                "the writer thread panicked".to_string(),
            ))
        });
        written_ok.and(result)
    })
}

fn describe(o: &Outcome, iters: usize) -> String {
    let mut s = format!("{} stale, {} wrong of {iters}", o.stale, o.wrong);
    if !o.first.is_empty() {
        let first: Vec<String> = o
            .first
            .iter()
            .map(|(i, got, want)| format!("(iteration {i}: got {got:#x}, want {want:#x})"))
            .collect();
        s += &format!("; first: {}", first.join(" "));
    }
    s
}

pub fn print(r: &SyncReport) {
    let pair = if r.writer == r.reader {
        format!("two streams on GPU{} (one GPU)", r.writer)
    } else {
        format!("GPU{} writes, GPU{} waits and reads", r.writer, r.reader)
    };
    out!(
        "# cross-GPU event handoff: {pair}; {} iterations; {} MiB delay fill before each write",
        r.iters,
        r.delay_bytes >> 20
    );
    out!(
        "handoff (record, then channel, then wait — the library's rule): {}",
        describe(&r.handoff, r.iters)
    );
    out!(
        "pitfall (wait enqueued before its record):                      {}",
        describe(&r.pitfall, r.iters)
    );
    out!(
        "# a wait captures the event's latest record when it is enqueued; enqueued first, it waits"
    );
    out!("# for an older record (or none) and the reader copies before the write: stale data, no error.");
    out!("# The library's threads hand each recorded event over a channel before the waiter enqueues");
    out!("# its wait (src/exec/mod.rs, enqueue_rank), so the wait always sees the right record.");
    if r.pitfall.stale == 0 && r.pitfall.wrong == 0 {
        out!("# the pitfall round happened to read no stale value on this run: timing-dependent, not safe");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_counts_stale_and_wrong_slots() {
        let got = [value(0), SENTINEL, 7, value(3)];
        let o = Outcome::check(&got);
        assert_eq!((o.stale, o.wrong), (1, 1));
        assert_eq!(o.first, vec![(1, SENTINEL, value(1)), (2, 7, value(2))]);
        assert_eq!(Outcome::check(&[value(0), value(1)]), Outcome::default());
    }

    #[test]
    fn values_never_meet_the_sentinel() {
        assert_ne!(value(0), SENTINEL);
        assert_ne!(value(MAX_ITERS - 1), SENTINEL);
    }
}
