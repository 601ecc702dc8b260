//! Guide chapter 3, peer copies and what they measure (`docs/guide/03-peer-copies.md`).
//!
//! Times the copy paths of the article's bandwidth table with GPU timing events: pinned D2H and
//! H2D (the PCIe ceiling), a local copy (device memory), a peer copy one way and both ways at once
//! (the link), and the latency of a 4-byte peer copy. `ringreduce p2p` is the full version.
//!
//! Run: `cargo run --release --example 03_peer_copies`

use ringreduce::device::{self, DeviceBuffer, Event, PinnedHost, Stream};
use ringreduce::Result;

const BYTES: usize = 256 << 20;
const ITERS: usize = 10;

/// GPU milliseconds per repetition of `enqueue` on `main`; a second stream `other`, if any, is
/// fenced in with events so its work is inside the timed interval.
fn time_ms(main: &Stream, other: Option<&Stream>, enqueue: impl Fn() -> Result<()>) -> Result<f64> {
    let ctx = main.context();
    let (start, end) = (Event::with_timing(ctx)?, Event::with_timing(ctx)?);
    enqueue()?; // warm-up
    device::stream_synchronize(main)?;
    device::record(&start, main)?;
    if let Some(s) = other {
        device::stream_synchronize(s)?;
        device::wait(s, &start)?; // enqueued after its record: it sees it
    }
    for _ in 0..ITERS {
        enqueue()?;
    }
    if let Some(s) = other {
        let join = Event::new(s.context())?;
        device::record(&join, s)?;
        device::wait(main, &join)?;
    }
    device::record(&end, main)?;
    Ok(f64::from(device::event_elapsed_ms(&start, &end)?) / ITERS as f64)
}

/// One row of the table: `counted` bytes moved per repetition, `ms` per repetition.
fn row(path: &str, counted: usize, ms: f64, note: &str) {
    println!("{path:<28}{:8.1} GB/s  {note}", counted as f64 / (ms * 1e6));
}

fn main() -> Result<()> {
    let n = match device::device_count() {
        Ok(n) => n,
        Err(why) => {
            println!("no GPU: {why}");
            println!();
            println!("On a GPU host this example prints GB/s for 256 MiB copies. On the 2×H200");
            println!(
                "test machine `ringreduce p2p` measured (docs/TOUR.md, 2026-11-29): D2H 55.3,"
            );
            println!("H2D 55.4, local copy 4159.1 (read + write), peer one way 394.2, both ways");
            println!("778.0 GB/s, and a 4-byte peer copy in 1.65–2.42 µs.");
            return Ok(());
        }
    };
    let ctx0 = device::context(0)?;
    let (src0, dst0) = (
        DeviceBuffer::zeroed(&ctx0, BYTES)?,
        DeviceBuffer::new(&ctx0, BYTES)?,
    );
    let pinned = PinnedHost::new(&ctx0, BYTES)?;
    let s0 = Stream::new(&ctx0)?;
    // Every copy below: all buffers are live allocations of BYTES bytes, and `time_ms` returns
    // only after its end event completed, i.e. after every copy it queued (the buffers outlive
    // it); each stream's copies run in order, the two streams of "both ways" touch disjoint
    // buffers, and the host does not touch `pinned` meanwhile.
    // SAFETY: see above.
    let ms = time_ms(&s0, None, || unsafe {
        device::memcpy_async(pinned.uva_ptr(), src0.ptr(), BYTES, &s0)
    })?;
    row("D2H GPU0 → pinned host", BYTES, ms, "one PCIe direction");
    // SAFETY: see above.
    let ms = time_ms(&s0, None, || unsafe {
        device::memcpy_async(dst0.ptr(), pinned.uva_ptr(), BYTES, &s0)
    })?;
    row("H2D pinned host → GPU0", BYTES, ms, "the other direction");
    // SAFETY: see above.
    let ms = time_ms(&s0, None, || unsafe {
        device::memcpy_async(dst0.ptr(), src0.ptr(), BYTES, &s0)
    })?;
    row("local copy on GPU0", 2 * BYTES, ms, "read + write counted");
    if n < 2 {
        println!("one GPU: the peer rows need two");
        return Ok(());
    }

    let ctx1 = device::context(1)?;
    let (src1, dst1) = (
        DeviceBuffer::zeroed(&ctx1, BYTES)?,
        DeviceBuffer::new(&ctx1, BYTES)?,
    );
    let s1 = Stream::new(&ctx1)?;
    let peer = device::can_access_peer(0, 1)? && device::can_access_peer(1, 0)?;
    if peer {
        device::enable_peer_access(&ctx0, &ctx1)?;
        device::enable_peer_access(&ctx1, &ctx0)?;
    }
    let note = if peer {
        "peer access on"
    } else {
        "NO peer access: staged by the driver"
    };
    // SAFETY: see above.
    let push = |bytes| unsafe {
        device::memcpy_peer_async(dst1.ptr(), &ctx1, src0.ptr(), &ctx0, bytes, &s0)
    };
    row(
        "peer GPU0 → GPU1 (push)",
        BYTES,
        time_ms(&s0, None, || push(BYTES))?,
        note,
    );
    let ms = time_ms(&s0, Some(&s1), || {
        push(BYTES)?;
        // SAFETY: see above.
        unsafe { device::memcpy_peer_async(dst0.ptr(), &ctx0, src1.ptr(), &ctx1, BYTES, &s1) }
    })?;
    row(
        "peer GPU0 ↔ GPU1 (sum)",
        2 * BYTES,
        ms,
        "both directions at once",
    );
    let ms = time_ms(&s0, None, || (0..100).try_for_each(|_| push(4)))?;
    println!(
        "{:<28}{:8.2} µs per copy, 100 back to back",
        "peer GPU0 → GPU1, 4 bytes",
        ms * 10.0
    );
    Ok(())
}
