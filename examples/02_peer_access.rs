//! Guide chapter 2, peer access and its silent degradation (`docs/guide/02-peer-access.md`).
//!
//! Prints who can reach whose memory (`cuDeviceCanAccessPeer`, asked per direction), the driver's
//! link attributes, and then the point of the chapter: the same `cuMemcpyPeerAsync` from GPU 0 to
//! GPU 1 timed before and after `enable_peer_access`. Both succeed; only the speed tells them
//! apart. Without two GPUs it says what it would show.
//!
//! Run: `cargo run --release --example 02_peer_access`

use ringreduce::device::{self, DeviceBuffer, Event, Stream};

const BYTES: usize = 64 << 20;
const ITERS: usize = 5;

fn main() -> ringreduce::Result<()> {
    let n = device::device_count().unwrap_or(0);
    if n < 2 {
        if let Err(why) = device::driver_available() {
            println!("no GPU: {why}");
        } else {
            println!("one GPU: peer access needs two");
        }
        println!();
        println!("With two or more GPUs this example prints the peer matrix (row reaches column),");
        println!("each pair's P2P attributes, and one 64 MiB copy GPU 0 → GPU 1 timed with peer");
        println!(
            "access off, then on. On the 2×H200 test machine (NV18) `ringreduce p2p` measured"
        );
        println!("37.4 GB/s off and 394.2 GB/s on (docs/TOUR.md): no error either way.");
        return Ok(());
    }

    println!("# peer access (row reaches column's memory)");
    let matrix = device::peer_matrix(n)?;
    for (from, row) in matrix.iter().enumerate() {
        let cells: Vec<&str> = row
            .iter()
            .enumerate()
            .map(|(to, &ok)| {
                if from == to {
                    "X"
                } else if ok {
                    "OK"
                } else {
                    "NS"
                }
            })
            .collect();
        println!("  GPU{from}: {}", cells.join(" "));
    }
    println!("# P2P attributes (directional)");
    for from in 0..n {
        for to in (0..n).filter(|&to| to != from) {
            let a = device::p2p_attributes(from, to)?;
            println!(
                "  {from} → {to}: performance rank {}, access {}, native atomics {}",
                a.performance_rank, a.access_supported, a.native_atomics
            );
        }
    }

    // Peer access belongs to the context and, once enabled, stays on for the process: so the
    // "off" copy is timed first, before anything enables it.
    let (ctx0, ctx1) = (device::context(0)?, device::context(1)?);
    let src = DeviceBuffer::zeroed(&ctx0, BYTES)?;
    let dst = DeviceBuffer::zeroed(&ctx1, BYTES)?;
    let stream = Stream::new(&ctx0)?;
    let copy_gbps = || -> ringreduce::Result<f64> {
        let (start, end) = (Event::with_timing(&ctx0)?, Event::with_timing(&ctx0)?);
        device::record(&start, &stream)?;
        for _ in 0..ITERS {
            // SAFETY: src and dst are live BYTES-long allocations in ctx0 and ctx1 that outlive
            // this closure; only this stream touches them, and event_elapsed_ms below waits for
            // the end event, i.e. for every copy, before they can be dropped.
            unsafe {
                device::memcpy_peer_async(dst.ptr(), &ctx1, src.ptr(), &ctx0, BYTES, &stream)?
            };
        }
        device::record(&end, &stream)?;
        let ms = f64::from(device::event_elapsed_ms(&start, &end)?);
        Ok((BYTES * ITERS) as f64 / (ms * 1e6))
    };
    copy_gbps()?; // warm-up
    let off = copy_gbps()?;
    println!("# 64 MiB cuMemcpyPeerAsync GPU 0 → GPU 1, push on GPU 0's stream");
    println!("  peer access off: {off:8.1} GB/s  (succeeded: the driver staged it)");
    if matrix[0][1] && matrix[1][0] {
        device::enable_peer_access(&ctx0, &ctx1)?; // GPU 0 may map GPU 1's memory
        device::enable_peer_access(&ctx1, &ctx0)?; // and the other direction, separately
        copy_gbps()?;
        let on = copy_gbps()?;
        println!(
            "  peer access on:  {on:8.1} GB/s  ({:.1}× faster)",
            on / off
        );
    } else {
        println!("  the driver reports no peer access 0 ↔ 1: every copy stays on the slow path");
    }
    device::stream_synchronize(&stream)?;
    Ok(())
}
