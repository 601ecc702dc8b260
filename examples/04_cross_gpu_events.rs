//! Guide chapter 4, cross-GPU events and the record-before-wait trap
//! (`docs/guide/04-cross-gpu-events.md`).
//!
//! GPU a writes the value i + 1 into slot i and records an event; GPU b waits on the event and
//! copies slot i back to the host. Run twice: with the library's rule (the writer's thread records,
//! then hands i over a channel; the reader's thread enqueues its wait only after receiving it), and
//! with the wait enqueued *before* the record — which the driver accepts and which reads stale
//! data. `ringreduce sync` is the full version.
//!
//! Run: `cargo run --release --example 04_cross_gpu_events`

use ringreduce::device::{self, DeviceBuffer, Event, PinnedHost, Stream};
use ringreduce::Result;

const ITERS: usize = 200;
const DELAY_WORDS: usize = 16 << 20; // a 64 MiB fill before each write keeps GPU a busy
const SENTINEL: u32 = u32::MAX;

struct Pair {
    writer: Stream,    // on GPU a
    reader: Stream,    // on GPU b
    src: DeviceBuffer, // GPU a: slot i written by iteration i
    mid: DeviceBuffer, // GPU b: its copy of the slot
    host: PinnedHost,
    delay: DeviceBuffer,
}

impl Drop for Pair {
    /// Waits for both streams before the buffers are freed, on every exit path.
    fn drop(&mut self) {
        let _ = device::stream_synchronize(&self.writer);
        let _ = device::stream_synchronize(&self.reader);
    }
}

// SAFETY (every block below): slot i (4 bytes at offset 4i) lies inside src, mid and host (4 ×
// ITERS bytes each) and the fill inside `delay`; all stay allocated until `Pair`'s `Drop` has
// synchronized both streams; the host reads `host` only after a round synchronized them. A stale
// read in the pitfall is a copy of device memory racing a fill: wrong bytes, never unsafety.
fn write(p: &Pair, i: usize, written: &Event) -> Result<()> {
    // SAFETY: see above.
    unsafe {
        device::memset_d32_async(p.delay.ptr(), 0, DELAY_WORDS, &p.writer)?;
        device::memset_d32_async(p.src.ptr() + 4 * i as u64, i as u32 + 1, 1, &p.writer)?;
    }
    device::record(written, &p.writer)
}

fn read(p: &Pair, i: usize, written: &Event) -> Result<()> {
    device::wait(&p.reader, written)?; // captures the event's latest record *now*
    let offset = 4 * i as u64;
    // SAFETY: see above.
    unsafe {
        let (dst, src) = (p.mid.ptr() + offset, p.src.ptr() + offset);
        if p.src.device() == p.mid.device() {
            device::memcpy_async(dst, src, 4, &p.reader)?;
        } else {
            device::memcpy_peer_async(dst, p.mid.context(), src, p.src.context(), 4, &p.reader)?;
        }
        device::memcpy_async(
            p.host.uva_ptr() + offset,
            p.mid.ptr() + offset,
            4,
            &p.reader,
        )
    }
}

/// One round; returns how many slots the reader got wrong (read before the writer wrote them).
fn round(p: &Pair, handoff: bool) -> Result<usize> {
    // SAFETY: see above (whole buffers, synchronized right after).
    unsafe {
        device::memset_d32_async(p.src.ptr(), SENTINEL, ITERS, &p.writer)?;
        device::memset_d32_async(p.mid.ptr(), SENTINEL, ITERS, &p.reader)?;
    }
    device::stream_synchronize(&p.writer)?;
    device::stream_synchronize(&p.reader)?;
    let event = Event::new(p.writer.context())?; // never recorded yet: a wait on it is a no-op
    let written = &event;
    if handoff {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| -> Result<()> {
            // `move`: the writer owns `tx`, so the channel closes when it is done.
            let writer = s.spawn(move || -> Result<()> {
                for i in 0..ITERS {
                    write(p, i, written)?;
                    let _ = tx.send(i); // the record is enqueued: hand it over
                }
                Ok(())
            });
            for i in rx.iter() {
                read(p, i, written)?; // the wait is enqueued after record i
            }
            writer.join().expect("writer thread")
        })?;
    } else {
        for i in 0..ITERS {
            read(p, i, written)?; // the trap: the wait sees record i − 1, or none
            write(p, i, written)?;
        }
    }
    device::stream_synchronize(&p.writer)?;
    device::stream_synchronize(&p.reader)?;
    let got = p
        .host
        .as_slice()
        .chunks_exact(4)
        .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]));
    Ok(got.enumerate().filter(|&(i, v)| v != i as u32 + 1).count())
}

fn main() -> Result<()> {
    let n = match device::device_count() {
        Ok(n) => n,
        Err(why) => {
            println!("no GPU: {why}");
            println!();
            println!("On a GPU host this example runs {ITERS} write → record → wait → read");
            println!("iterations twice and counts early reads. On the 2×H200 test machine");
            println!("`ringreduce sync` (1000 iterations, docs/TOUR.md) read 0 stale values");
            println!("with the handoff, 993 of 1000 with the wait enqueued before its record.");
            return Ok(());
        }
    };
    let (a, b) = if n >= 2 { (0, 1) } else { (0, 0) }; // one GPU: two streams play both parts
    let (ctx_a, ctx_b) = (device::context(a)?, device::context(b)?);
    let p = Pair {
        writer: Stream::new(&ctx_a)?,
        reader: Stream::new(&ctx_b)?,
        src: DeviceBuffer::new(&ctx_a, 4 * ITERS)?,
        mid: DeviceBuffer::new(&ctx_b, 4 * ITERS)?,
        host: PinnedHost::new(&ctx_b, 4 * ITERS)?,
        delay: DeviceBuffer::new(&ctx_a, 4 * DELAY_WORDS)?,
    };
    println!("GPU {a} writes, GPU {b} waits and reads; {ITERS} iterations per round");
    let good = round(&p, true)?;
    println!("handoff (record, channel, then wait): {good} read early of {ITERS}");
    let bad = round(&p, false)?;
    println!("pitfall (wait enqueued before record): {bad} read early of {ITERS} (no error; timing-dependent)");
    assert_eq!(good, 0, "the handoff must never read early");
    Ok(())
}
