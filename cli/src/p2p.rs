//! `ringreduce p2p`: how fast bytes move between GPUs, and by which path — the bandwidth table of the
//! multi-GPU article, plus an n×n matrix in the style of CUDA's `p2pBandwidthLatencyTest`.
//!
//! # The paths, for one pair of GPUs a → b (`--from`, `--to`)
//!
//! | row | what is queued | why it is there |
//! |---|---|---|
//! | peer, access off | `cuMemcpyPeerAsync` before peer access is enabled | the **silent fallback**: the driver stages through host memory, no error |
//! | peer one way | `cuMemcpyPeerAsync` on a's stream (push) with peer access on | the direct link |
//! | peer both ways | a → b on a's stream and b → a on b's, at once | links are full duplex |
//! | staged, serial | D2H into pinned host, then H2D, one after the other | what a program without peer access does |
//! | staged, pipelined | chunks, two pinned slots; D2H on a's stream, H2D on b's, overlapped | both PCIe directions busy at once |
//! | D2H, H2D | one pinned-host copy each | the PCIe ceiling of each direction |
//! | local copy | device to device on a | the memory's own speed (read + write counted) |
//!
//! **Why "off" is measured first.** Peer access is a property of the context: once
//! `cuCtxEnablePeerAccess` ran in this process, every later copy between those contexts takes the
//! link. So the "off" rows are timed before anything enables it (the buffers are plain `cuMemAlloc`,
//! outside every memory pool). The other way to meet the fallback — pool memory whose pool grants
//! the peer no access, 37.6 GB/s on the 2×H200 machine with peer access *on* — is the pool trap the
//! device layer documents; the library grants pool access, so this command measures the first form.
//!
//! **Timing.** Each figure is GPU time between two timing events ([`device::Event::with_timing`])
//! around `--iters` repetitions, after one untimed warm-up repetition and a synchronize. Work on a
//! second stream is fenced in: it waits on the start event and the timed stream waits on its end.
//! GB/s are 10⁹ bytes per second; latency is µs per tiny copy averaged over `--latency-iters`.
//!
//! **SLOW flags.** A peer edge measured below half its link's estimate ([`ringreduce::topo::Link`]:
//! NV18 → 478.8 GB/s) or below the staged path is flagged `SLOW: check peer access / pool access /
//! ACS` — that is how silent degradation shows up (PCIe ACS redirects peer traffic through the root
//! complex, and breaks or slows it).
//!
//! Every buffer, stream and event is freed before the measurement returns; a [`Settle`] guard
//! synchronizes the streams first, on success and on error alike, so no queued copy outlives its
//! memory.

use crate::Failure;
use ringreduce::device::{
    self, context, enable_peer_access, memcpy_async, memcpy_peer_async, record, stream_synchronize,
    wait, DeviceBuffer, Event, PinnedHost, Stream,
};
use ringreduce::exec::cuda::probe::slow_reason;
use ringreduce::topo::{self, Detected};
use ringreduce::Result;
use std::sync::Arc;

#[derive(clap::Args, Clone, Debug)]
pub struct P2pArgs {
    /// Bytes per bandwidth copy (suffixes K, M, G: powers of 1024).
    #[arg(long, default_value = "256M", value_parser = crate::parse_bytes)]
    pub bytes: usize,
    /// Timed repetitions per bandwidth figure (after one warm-up).
    #[arg(long, default_value_t = 10, value_parser = crate::parse_positive)]
    pub iters: usize,
    /// Tiny (4-byte) copies averaged per latency figure.
    #[arg(long, default_value_t = 100, value_parser = crate::parse_positive)]
    pub latency_iters: usize,
    /// Chunk of the pipelined staged copy (two pinned slots of this size).
    #[arg(long, default_value = "4M", value_parser = crate::parse_bytes)]
    pub chunk: usize,
    /// The sending GPU of the path table.
    #[arg(long, default_value_t = 0)]
    pub from: usize,
    /// The receiving GPU of the path table.
    #[arg(long, default_value_t = 1)]
    pub to: usize,
    /// Skip the n×n bandwidth and latency matrix.
    #[arg(long)]
    pub no_matrix: bool,
}

impl Default for P2pArgs {
    fn default() -> Self {
        P2pArgs {
            bytes: 256 << 20,
            iters: 10,
            latency_iters: 100,
            chunk: 4 << 20,
            from: 0,
            to: 1,
            no_matrix: false,
        }
    }
}

/// One row of the path table.
#[derive(Clone, Debug)]
pub struct PathRow {
    pub path: String,
    pub gbps: f64,
    pub note: String,
    /// `Some("SLOW: …")` when the figure is far below what the link promises.
    pub slow: Option<String>,
}

/// The n×n matrix: `bw_gbps[i][j]` for a copy from GPU i to GPU j (diagonal: local copy, bytes
/// copied per second), `latency_us[i][j]` per 4-byte copy.
#[derive(Clone, Debug)]
pub struct Matrix {
    pub bw_gbps: Vec<Vec<f64>>,
    pub latency_us: Vec<Vec<f64>>,
    /// One line per slow edge.
    pub slow: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct P2pReport {
    pub bytes: usize,
    /// The pair of the path table; `None` with one GPU.
    pub pair: Option<(usize, usize)>,
    pub rows: Vec<PathRow>,
    pub matrix: Option<Matrix>,
    pub notes: Vec<String>,
}

impl P2pReport {
    /// How many figures are flagged SLOW (path table and matrix).
    pub fn slow_count(&self) -> usize {
        self.rows.iter().filter(|r| r.slow.is_some()).count()
            + self.matrix.as_ref().map_or(0, |m| m.slow.len())
    }

    /// The figure of the row whose path starts with `prefix`.
    pub fn gbps(&self, prefix: &str) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.path.starts_with(prefix))
            .map(|r| r.gbps)
    }
}

pub fn run(args: &P2pArgs) -> Result<(), Failure> {
    let report = measure(args)?;
    print(&report);
    Ok(())
}

/// Runs every measurement; see the module doc for what and in which order.
pub fn measure(args: &P2pArgs) -> Result<P2pReport, Failure> {
    let n = crate::require_gpus(1)?;
    if args.bytes < 4 {
        return Err(Failure::Failed(format!(
            "--bytes must be at least 4, got {}",
            args.bytes
        )));
    }
    if args.chunk == 0 || args.chunk > args.bytes {
        return Err(Failure::Failed(format!(
            "--chunk must be between 1 byte and --bytes ({}), got {}",
            args.bytes, args.chunk
        )));
    }
    let detected = topo::detect()?;
    let mut notes = Vec::new();
    let pair = if n >= 2 {
        for d in [args.from, args.to] {
            if d >= n {
                return Err(Failure::Failed(format!(
                    "GPU {d} does not exist: this host has {n} GPUs (0..{n})"
                )));
            }
        }
        if args.from == args.to {
            return Err(Failure::Failed("--from and --to must differ".to_string()));
        }
        Some((args.from, args.to))
    } else {
        notes.push("one GPU: peer and staged paths need two; only host and local copies".into());
        None
    };
    let rows = path_table(args, pair, &detected, &mut notes)?;
    let staged = rows
        .iter()
        .find(|r| r.path.starts_with("staged, serial"))
        .map(|r| r.gbps);
    let matrix = if args.no_matrix {
        None
    } else {
        Some(matrix(args, n, &detected, staged)?)
    };
    Ok(P2pReport {
        bytes: args.bytes,
        pair,
        rows,
        matrix,
        notes,
    })
}

/// Synchronizes its streams when dropped — declared after the buffers a measurement uses, it drops
/// first, so no queued copy outlives its memory on any exit path (errors included). Errors are
/// dropped: the measurement's own error is the one to report.
struct Settle<'a>(Vec<&'a Stream>);

impl Drop for Settle<'_> {
    fn drop(&mut self) {
        for s in &self.0 {
            let _ = stream_synchronize(s);
        }
    }
}

/// GPU milliseconds per repetition of `enqueue`, timed on `main` over `iters` repetitions after one
/// warm-up; work `enqueue` puts on `others` is fenced in (module doc, Timing).
fn time_ms(
    main: &Stream,
    others: &[&Stream],
    iters: usize,
    mut enqueue: impl FnMut() -> Result<()>,
) -> Result<f64> {
    let ctx = main.context();
    let (start, end) = (Event::with_timing(ctx)?, Event::with_timing(ctx)?);
    enqueue()?;
    stream_synchronize(main)?;
    for s in others {
        stream_synchronize(s)?;
    }
    record(&start, main)?;
    for s in others {
        wait(s, &start)?;
    }
    for _ in 0..iters {
        enqueue()?;
    }
    let mut joins = Vec::with_capacity(others.len());
    for s in others {
        let join = Event::new(s.context())?;
        record(&join, s)?;
        wait(main, &join)?;
        joins.push(join);
    }
    record(&end, main)?;
    let ms = f64::from(device::event_elapsed_ms(&start, &end)?);
    Ok(ms / iters as f64)
}

fn gbps(bytes: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        bytes as f64 / (ms * 1e6)
    } else {
        f64::INFINITY
    }
}

fn path_table(
    args: &P2pArgs,
    pair: Option<(usize, usize)>,
    detected: &Detected,
    notes: &mut Vec<String>,
) -> Result<Vec<PathRow>> {
    let bytes = args.bytes;
    let iters = args.iters;
    let a = pair.map_or(0, |(a, _)| a);
    let ctx_a = context(a)?;
    let src_a = DeviceBuffer::zeroed(&ctx_a, bytes)?;
    let dst_a = DeviceBuffer::new(&ctx_a, bytes)?;
    let pinned = PinnedHost::new(&ctx_a, bytes)?;
    let s_a = Stream::new(&ctx_a)?;
    let mut rows = Vec::new();
    let row = |path: &str, g: f64, note: &str| PathRow {
        path: path.to_string(),
        gbps: g,
        note: note.to_string(),
        slow: None,
    };
    {
        let _settle = Settle(vec![&s_a]);
        // The three copies below: src_a, dst_a and pinned are `bytes`-long allocations of this
        // function, alive until `_settle` synchronizes s_a; only s_a touches them meanwhile, in
        // order, and no host reference to `pinned` is used while copies run.
        // SAFETY: see above.
        let ms = time_ms(&s_a, &[], iters, || unsafe {
            memcpy_async(pinned.uva_ptr(), src_a.ptr(), bytes, &s_a)
        })?;
        rows.push(row(
            &format!("D2H GPU{a} → pinned"),
            gbps(bytes, ms),
            "one PCIe direction",
        ));
        // SAFETY: see above.
        let ms = time_ms(&s_a, &[], iters, || unsafe {
            memcpy_async(dst_a.ptr(), pinned.uva_ptr(), bytes, &s_a)
        })?;
        rows.push(row(
            &format!("H2D pinned → GPU{a}"),
            gbps(bytes, ms),
            "the other direction",
        ));
        // SAFETY: see above.
        let ms = time_ms(&s_a, &[], iters, || unsafe {
            memcpy_async(dst_a.ptr(), src_a.ptr(), bytes, &s_a)
        })?;
        rows.push(row(
            &format!("local copy GPU{a}"),
            gbps(2 * bytes, ms),
            "device memory, read + write counted",
        ));
    }
    let Some((a, b)) = pair else {
        return Ok(rows);
    };
    let ctx_b = context(b)?;
    let src_b = DeviceBuffer::zeroed(&ctx_b, bytes)?;
    let dst_b = DeviceBuffer::new(&ctx_b, bytes)?;
    let slots = [
        PinnedHost::new(&ctx_a, args.chunk)?,
        PinnedHost::new(&ctx_a, args.chunk)?,
    ];
    let s_b = Stream::new(&ctx_b)?;
    let (d2h_done, h2d_done) = (
        [Event::new(&ctx_a)?, Event::new(&ctx_a)?],
        [Event::new(&ctx_b)?, Event::new(&ctx_b)?],
    );
    let (sent, landed) = (Event::new(&ctx_a)?, Event::new(&ctx_b)?);
    let _settle = Settle(vec![&s_a, &s_b]);
    let link = detected.links[a][b];
    let est = link.map(|l| l.peer_estimate().gb_per_s());
    let can = detected.peer[a][b] && detected.peer[b][a];

    // Staged, serial: a → pinned, then pinned → b, each waiting for the other.
    // SAFETY: src_a/dst_b/pinned are live `bytes`-long allocations kept until `_settle`; the two
    // copies of one repetition are ordered by `sent`, and the next repetition's D2H (which
    // overwrites `pinned`) by `landed`.
    let ms = time_ms(&s_a, &[&s_b], iters, || unsafe {
        memcpy_async(pinned.uva_ptr(), src_a.ptr(), bytes, &s_a)?;
        record(&sent, &s_a)?;
        wait(&s_b, &sent)?;
        memcpy_async(dst_b.ptr(), pinned.uva_ptr(), bytes, &s_b)?;
        record(&landed, &s_b)?;
        wait(&s_a, &landed)
    })?;
    let staged_serial = gbps(bytes, ms);
    rows.push(row(
        &format!("staged, serial GPU{a} → host → GPU{b}"),
        staged_serial,
        "D2H then H2D: each byte crosses PCIe twice",
    ));

    // Staged, pipelined: chunk k goes through slot k % 2; D2H on a's stream, H2D on b's.
    let chunk = args.chunk;
    // SAFETY: every range is inside its allocation (offset + len ≤ bytes, len ≤ chunk); a slot is
    // overwritten by D2H only after the H2D that read it (h2d_done[slot], recorded on the previous
    // use; a never-recorded event is complete) and read by H2D only after its D2H (d2h_done[slot]).
    // The waits are enqueued after the records they must see (same host thread, in order).
    let ms = time_ms(&s_a, &[&s_b], iters, || {
        let mut offset = 0;
        let mut k = 0;
        while offset < bytes {
            let len = chunk.min(bytes - offset);
            let slot = k % 2;
            // SAFETY: see above.
            unsafe {
                wait(&s_a, &h2d_done[slot])?;
                memcpy_async(
                    slots[slot].uva_ptr(),
                    src_a.ptr() + offset as u64,
                    len,
                    &s_a,
                )?;
                record(&d2h_done[slot], &s_a)?;
                wait(&s_b, &d2h_done[slot])?;
                memcpy_async(
                    dst_b.ptr() + offset as u64,
                    slots[slot].uva_ptr(),
                    len,
                    &s_b,
                )?;
                record(&h2d_done[slot], &s_b)?;
            }
            offset += len;
            k += 1;
        }
        Ok(())
    })?;
    rows.push(row(
        &format!("staged, pipelined GPU{a} → host → GPU{b}"),
        gbps(bytes, ms),
        &format!(
            "{} KiB chunks, 2 pinned slots, D2H and H2D on separate streams",
            chunk >> 10
        ),
    ));

    // Peer copies with peer access still off (nothing in this process has enabled it yet).
    let one_way = |s: &Stream| -> Result<f64> {
        // SAFETY: src_a and dst_b are live `bytes`-long allocations kept until `_settle`; only this
        // stream touches them, in order.
        let ms = time_ms(s, &[], iters, || unsafe {
            memcpy_peer_async(dst_b.ptr(), &ctx_b, src_a.ptr(), &ctx_a, bytes, s)
        })?;
        Ok(gbps(bytes, ms))
    };
    let both_ways = || -> Result<f64> {
        // SAFETY: four distinct live allocations kept until `_settle`; a → b reads src_a and
        // writes dst_b on s_a, b → a reads src_b and writes dst_a on s_b; nothing else touches them.
        let ms = time_ms(&s_a, &[&s_b], iters, || unsafe {
            memcpy_peer_async(dst_b.ptr(), &ctx_b, src_a.ptr(), &ctx_a, bytes, &s_a)?;
            memcpy_peer_async(dst_a.ptr(), &ctx_a, src_b.ptr(), &ctx_b, bytes, &s_b)
        })?;
        Ok(gbps(2 * bytes, ms))
    };
    let off = one_way(&s_a)?;
    rows.push(PathRow {
        slow: None,
        ..row(
            &format!("peer, access off GPU{a} → GPU{b}"),
            off,
            "silent fallback: the driver stages through host memory, no error",
        )
    });
    let off_both = both_ways()?;
    rows.push(row(
        &format!("peer, access off GPU{a} ↔ GPU{b}"),
        off_both,
        "both directions at once, sum",
    ));

    if can {
        enable_peer_access(&ctx_a, &ctx_b)?;
        enable_peer_access(&ctx_b, &ctx_a)?;
    } else {
        notes.push(format!(
            "GPU{a} and GPU{b} have no peer access both ways (cuDeviceCanAccessPeer): the \
             \"access on\" rows below are the same staged fallback"
        ));
    }
    let on = one_way(&s_a)?;
    let label = link.map_or_else(|| "link unknown".to_string(), |l| format!("over {l}"));
    rows.push(PathRow {
        slow: slow_reason(on, est, Some(staged_serial)),
        ..row(
            &format!("peer one way GPU{a} → GPU{b}"),
            on,
            &format!("push, peer access on, {label}"),
        )
    });
    let on_both = both_ways()?;
    rows.push(PathRow {
        slow: slow_reason(on_both / 2.0, est, Some(staged_serial)),
        ..row(
            &format!("peer both ways GPU{a} ↔ GPU{b}"),
            on_both,
            "both directions at once, sum",
        )
    });
    Ok(rows)
}

/// The n×n bandwidth (`--bytes` copies) and latency (4-byte copies) matrix, peer access enabled
/// wherever the driver allows it.
fn matrix(args: &P2pArgs, n: usize, detected: &Detected, staged: Option<f64>) -> Result<Matrix> {
    let bytes = args.bytes;
    let ctxs: Vec<Arc<_>> = (0..n).map(context).collect::<Result<_>>()?;
    // A device can have at most 8 peers enabled (CUDA_ERROR_TOO_MANY_PEERS beyond): a pair that
    // cannot be enabled is measured anyway — on the fallback — and said so.
    let mut slow = Vec::new();
    let mut enabled = vec![vec![false; n]; n];
    for i in 0..n {
        for j in (0..n).filter(|&j| j != i && detected.peer[i][j]) {
            match enable_peer_access(&ctxs[i], &ctxs[j]) {
                Ok(()) => enabled[i][j] = true,
                Err(e) => slow.push(format!(
                    "GPU{i} → GPU{j}: peer access could not be enabled ({e}): measured on the fallback"
                )),
            }
        }
    }
    let srcs: Vec<DeviceBuffer> = ctxs
        .iter()
        .map(|c| DeviceBuffer::zeroed(c, bytes))
        .collect::<Result<_>>()?;
    let dsts: Vec<DeviceBuffer> = ctxs
        .iter()
        .map(|c| DeviceBuffer::new(c, bytes))
        .collect::<Result<_>>()?;
    let streams: Vec<Stream> = ctxs.iter().map(Stream::new).collect::<Result<_>>()?;
    let _settle = Settle(streams.iter().collect());
    let copy = |i: usize, j: usize, len: usize| -> Result<()> {
        // SAFETY: srcs[i] and dsts[j] are live allocations of `bytes` ≥ len bytes kept until
        // `_settle`; each measurement uses one stream (streams[i]) and runs alone.
        unsafe {
            if i == j {
                memcpy_async(dsts[j].ptr(), srcs[i].ptr(), len, &streams[i])
            } else {
                memcpy_peer_async(
                    dsts[j].ptr(),
                    &ctxs[j],
                    srcs[i].ptr(),
                    &ctxs[i],
                    len,
                    &streams[i],
                )
            }
        }
    };
    let mut bw = vec![vec![0.0; n]; n];
    let mut lat = vec![vec![0.0; n]; n];
    for i in 0..n {
        for j in 0..n {
            let ms = time_ms(&streams[i], &[], args.iters, || copy(i, j, bytes))?;
            bw[i][j] = gbps(bytes, ms);
            let ms = time_ms(&streams[i], &[], args.latency_iters, || copy(i, j, 4))?;
            lat[i][j] = ms * 1e3;
            if i != j {
                let est = detected.links[i][j]
                    .filter(|_| enabled[i][j])
                    .map(|l| l.peer_estimate().gb_per_s());
                if let Some(flag) = slow_reason(bw[i][j], est, staged) {
                    slow.push(format!("GPU{i} → GPU{j}: {:.1} GB/s {flag}", bw[i][j]));
                }
            }
        }
    }
    Ok(Matrix {
        bw_gbps: bw,
        latency_us: lat,
        slow,
    })
}

fn print_matrix(title: &str, m: &[Vec<f64>], precision: usize) {
    let n = m.len();
    out!("{title}");
    let cols: String = (0..n)
        .map(|j| format!("{:>10}", format!("GPU{j}")))
        .collect();
    out!("{:>8}{cols}", "from\\to");
    for (i, row) in m.iter().enumerate() {
        let cells: String = row.iter().map(|v| format!("{v:>10.precision$}")).collect();
        out!("{:>8}{cells}", format!("GPU{i}"));
    }
}

pub fn print(r: &P2pReport) {
    out!(
        "# copy bandwidth, {} MiB per copy; GB/s = 1e9 B/s; GPU time between timing events after a warm-up",
        r.bytes >> 20
    );
    for note in &r.notes {
        out!("# {note}");
    }
    out!("{:<44} {:>10}  note", "path", "GB/s");
    for row in &r.rows {
        out!("{:<44} {:>10.1}  {}", row.path, row.gbps, row.note);
        if let Some(flag) = &row.slow {
            out!("{:<44} {:>10}  {flag}", "", "");
        }
    }
    if let Some(m) = &r.matrix {
        out!("");
        print_matrix(
            "# bandwidth matrix, GB/s (row sends, column receives; diagonal: local copy, bytes/s)",
            &m.bw_gbps,
            1,
        );
        out!("");
        print_matrix(
            "# latency matrix, µs per 4-byte copy (back to back on one stream)",
            &m.latency_us,
            2,
        );
        for line in &m.slow {
            out!("{line}");
        }
    }
    let slow = r.slow_count();
    if slow == 0 {
        out!("# no edge flagged SLOW");
    } else {
        out!("# {slow} figure(s) flagged SLOW");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gbps_is_decimal() {
        assert!((gbps(1_000_000_000, 1000.0) - 1.0).abs() < 1e-12);
        assert!(gbps(1, 0.0).is_infinite());
    }
}
