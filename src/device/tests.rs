//! Tests of the device layer: the status plumbing and the no-GPU answers run everywhere; the rest
//! needs GPUs and prints its waiver without them, by the rule every GPU test follows
//! (`tests/common/waiver.rs`, included below: `RINGREDUCE_REQUIRE_GPUS` turns a waiver into a
//! failure where the run was meant to have the GPUs).

use super::context::c_buf_to_string;
use super::peer::{pointer_pool, set_pool_access};
use super::*;

/// Rank- and index-dependent bytes, so a chunk landing in the wrong place shows.
fn pattern(device: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 31 + device * 17 + i / 251) % 253) as u8)
        .collect()
}

/// Panics with the first few (index, got, want) mismatches.
fn assert_bytes_eq(what: &str, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let wrong: Vec<_> = (0..got.len())
        .filter(|&i| got[i] != want[i])
        .map(|i| (i, got[i], want[i]))
        .collect();
    assert!(
        wrong.is_empty(),
        "{what}: {} wrong bytes, first (index, got, want): {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
}

fn assert_no_gpu<T: std::fmt::Debug>(what: &str, result: Result<T>) {
    match result {
        Err(Error::NoGpu { reason }) => assert!(!reason.is_empty(), "{what}: empty reason"),
        other => panic!("{what}: expected Err(NoGpu) on a host without a GPU, got {other:?}"),
    }
}

/// The waiver rule of every GPU test, shared with the integration tests.
#[path = "../../tests/common/waiver.rs"]
mod waiver;

/// `Some` of the GPU count where there are at least `needed`; else `None` after the waiver
/// ([`waiver::lacks_gpus`]) naming `property`, what the test checks that needs them.
fn gpus(needed: usize, property: &str) -> Option<usize> {
    let found = device_count().unwrap_or(0);
    (!waiver::lacks_gpus(needed, found, property)).then_some(found)
}

#[test]
fn driver_errors_carry_call_code_and_message() {
    let err = check("cuMemcpyPeerAsync")(DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE));
    match &err {
        Error::Cuda {
            call,
            code,
            message,
        } => {
            assert_eq!(*call, "cuMemcpyPeerAsync");
            assert_eq!(code, "CUDA_ERROR_INVALID_VALUE");
            assert!(!message.is_empty());
        }
        other => panic!("expected Error::Cuda, got {other:?}"),
    }
    let shown = err.to_string();
    assert!(shown.contains("cuMemcpyPeerAsync") && shown.contains("CUDA_ERROR_INVALID_VALUE"));

    let status: std::result::Result<(), DriverError> =
        Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY));
    assert!(matches!(
        status.call("cuEventQuery"),
        Err(Error::Cuda { call: "cuEventQuery", ref code, .. }) if code == "CUDA_ERROR_NOT_READY"
    ));
}

#[test]
fn driver_versions_decode() {
    assert_eq!(decode_driver_version(13000), (13, 0));
    assert_eq!(decode_driver_version(12080), (12, 8));
    assert_eq!(decode_driver_version(11040), (11, 4));
    assert_eq!(decode_driver_version(-1), (0, 0));
}

#[test]
fn c_strings_stop_at_the_first_nul() {
    assert_eq!(c_buf_to_string(b"0000:19:00.0\0\0junk"), "0000:19:00.0");
    assert_eq!(c_buf_to_string(b"no nul"), "no nul");
    assert_eq!(c_buf_to_string(b"\0"), "");
}

#[test]
fn panics_become_no_gpu_errors() {
    // The default hook would print this expected panic; it is one line in the test's output.
    let result: Result<()> = guard("a test call", || panic!("Missing symbol cuFoo"));
    match result {
        Err(Error::NoGpu { reason }) => {
            assert!(reason.contains("a test call") && reason.contains("Missing symbol cuFoo"))
        }
        other => panic!("expected NoGpu, got {other:?}"),
    }
}

/// Without a GPU every entry point returns Err(NoGpu), none panics; with one, the answers are
/// sane.
#[test]
fn probe_and_queries_agree() {
    match driver_available() {
        Err(Error::NoGpu { .. }) => {
            assert_no_gpu("driver_available", driver_available());
            assert_no_gpu("device_count", device_count());
            assert_no_gpu("devices", devices());
            assert_no_gpu("context(0)", context(0));
            assert_no_gpu("can_access_peer", can_access_peer(0, 1));
            assert_no_gpu("peer_matrix", peer_matrix(2));
            assert_no_gpu("p2p_attributes", p2p_attributes(0, 1));
            assert_no_gpu("pointer_device", pointer_device(0x1000));
            assert_no_gpu("pointer_is_pool_memory", pointer_is_pool_memory(0x1000));
            // SAFETY: 0 is the legacy default stream, valid for the call.
            assert_no_gpu("CallerStream::from_raw", unsafe {
                CallerStream::from_raw(std::ptr::null_mut())
            });
            assert_no_gpu(
                "grant_pointer_pool_access",
                grant_pointer_pool_access(0x1000, 0),
            );
            if !libcuda_present() {
                assert_no_gpu("driver_version", driver_version());
            }
        }
        Err(other) => panic!("driver_available must fail only with NoGpu, got {other:?}"),
        Ok(()) => {
            let count = device_count().expect("device_count after driver_available");
            assert!(count >= 1);
            let infos = devices().expect("devices");
            assert_eq!(infos.len(), count);
            for (index, info) in infos.iter().enumerate() {
                eprintln!("{info:?}");
                assert_eq!(info.index, index);
                assert!(!info.name.is_empty());
                assert!(info.total_memory_bytes > 0);
                assert!(info.sm_count > 0);
                assert!(info.compute_capability.0 >= 5, "{info:?}");
                assert!(info.pci_bus_id.contains(':'), "{info:?}");
            }
            let (major, minor) = driver_version().expect("driver_version");
            eprintln!("driver CUDA version {major}.{minor}");
            assert!(major >= 11);
            assert!(matches!(context(count), Err(Error::InvalidArgument(_))));
            assert!(matches!(
                can_access_peer(0, count),
                Err(Error::InvalidArgument(_))
            ));
            let matrix = peer_matrix(count).expect("peer_matrix");
            eprintln!("peer matrix: {matrix:?}");
            assert!((0..count).all(|d| matrix[d][d]));
            assert!(matches!(
                p2p_attributes(0, 0),
                Err(Error::InvalidArgument(_))
            ));
            assert_eq!(pointer_device(0).expect("pointer_device(0)"), None);
            assert!(!pointer_is_pool_memory(0).expect("pointer_is_pool_memory(0)"));
        }
    }
}

#[test]
fn buffers_round_trip_and_know_their_device() -> Result<()> {
    let Some(count) = gpus(1, "device buffers, pinned memory and pointer queries") else {
        return Ok(());
    };
    for device in 0..count {
        let ctx = context(device)?;
        let len = 4096 * 3 + 5; // not a multiple of anything convenient
        let want = pattern(device, len);
        let mut buffer = DeviceBuffer::new(&ctx, len)?;
        buffer.copy_from_host(&want)?;
        let mut got = vec![0u8; len];
        buffer.copy_to_host(&mut got)?;
        assert_bytes_eq("round trip", &got, &want);
        buffer.fill_zero()?;
        buffer.copy_to_host(&mut got)?;
        assert_bytes_eq("fill_zero", &got, &vec![0u8; len]);

        assert_eq!(pointer_device(buffer.ptr())?, Some(device));
        assert_eq!(pointer_device(buffer.ptr() + 100)?, Some(device));
        assert!(
            !pointer_is_pool_memory(buffer.ptr())?,
            "cuMemAlloc is not pool memory"
        );
        assert!(matches!(
            buffer.copy_from_host(&want[1..]),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            DeviceBuffer::new(&ctx, 0),
            Err(Error::InvalidArgument(_))
        ));

        let pinned = PinnedHost::new(&ctx, 1000)?;
        assert!(pinned.as_slice().iter().all(|&b| b == 0));
        assert_eq!(
            pointer_device(pinned.uva_ptr())?,
            None,
            "pinned host memory"
        );
        let pageable = [1u8; 64];
        assert_eq!(pointer_device(pageable.as_ptr() as u64)?, None, "pageable");
        pinned.free()?;
        buffer.free()?;
    }
    Ok(())
}

/// Shareable memory (`cuMemCreate`): its registered descriptor is found by any address inside
/// it, and mapping that descriptor again (as a peer process does) shows the same bytes at
/// another address; freeing the buffer forgets the descriptor.
#[test]
fn shareable_memory_maps_again_from_its_descriptor() -> Result<()> {
    let Some(_) = gpus(1, "cuMemCreate memory exported as a file descriptor") else {
        return Ok(());
    };
    let ctx = context(0)?;
    if !fd_sharing_supported(0)? {
        println!("waived: GPU 0's driver lacks POSIX file-descriptor handles");
        return Ok(());
    }
    let len = 3 * 4096 + 7;
    let want = pattern(0, len);
    let mut buffer = DeviceBuffer::shareable(&ctx, len)?;
    buffer.copy_from_host(&want)?;
    let shared = shareable_fd(buffer.ptr() + 100)?.expect("registered");
    let (base, size, serial, fd) = (shared.base, shared.size, shared.serial, shared.fd);
    assert!(shareable_by_serial(serial).is_some(), "found by its serial");
    assert_eq!(base, buffer.ptr());
    assert!(size >= len, "{size} < {len}");
    assert!(shareable_fd(base + size as u64)?.is_none(), "past the end");
    let again = import_fd(&ctx, &fd, size)?;
    assert_ne!(again.base, buffer.ptr(), "a second mapping");
    let mut got = vec![0u8; len];
    // SAFETY: `again` maps `size` ≥ `len` bytes; the copy is complete when it returns.
    unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut got, again.base) }
        .call("cuMemcpyDtoH")?;
    assert_bytes_eq("the same memory through its descriptor", &got, &want);
    // SAFETY: nothing uses the second mapping any more.
    unsafe { unmap(&ctx, again) }?;
    buffer.free()?;
    assert!(shareable_fd(base)?.is_none(), "forgotten once freed");
    assert!(shareable_by_serial(serial).is_none(), "its serial too");
    // A new allocation may take the freed one's addresses, never its serial.
    let next = DeviceBuffer::shareable(&ctx, len)?;
    assert_ne!(
        shareable_fd(next.ptr())?.expect("registered").serial,
        serial
    );
    next.free()?;
    Ok(())
}

/// Shared pinned host memory: mapped again from its descriptor (as a peer process does), the
/// same bytes; the GPU reads it at the host's address.
#[test]
fn shared_pinned_memory_maps_again_from_its_descriptor() -> Result<()> {
    let Some(_) = gpus(1, "pinned host memory shared by a file descriptor") else {
        return Ok(());
    };
    let ctx = context(0)?;
    let len = 2 * 4096 + 3;
    let want = pattern(1, len);
    let mut pinned = PinnedHost::shareable(&ctx, len)?;
    assert!(pinned.as_slice().iter().all(|&b| b == 0), "zeroed");
    pinned.as_mut_slice().copy_from_slice(&want);
    let shared = shareable_fd(pinned.uva_ptr() + 7)?.expect("registered");
    let (base, size, fd) = (shared.base, shared.size, shared.fd);
    assert_eq!((base, size), (pinned.uva_ptr(), len));
    let again = map_shared_host(&ctx, &fd, len)?;
    assert_ne!(again as u64, base, "a second mapping");
    // The GPU copies from the second mapping into device memory: the same bytes.
    let device = DeviceBuffer::new(&ctx, len)?;
    // SAFETY: both hold `len` bytes; the copy is complete when it returns.
    unsafe { cudarc::driver::result::memcpy_dtod_sync(device.ptr(), again as u64, len) }
        .call("cuMemcpyDtoD")?;
    let mut got = vec![0u8; len];
    device.copy_to_host(&mut got)?;
    assert_bytes_eq("the same memory through its descriptor", &got, &want);
    // SAFETY: nothing uses the second mapping any more.
    unsafe { unmap_shared_host(&ctx, again, len) }?;
    pinned.free()?;
    assert!(shareable_fd(base)?.is_none(), "forgotten once freed");
    Ok(())
}

/// Pointer queries on a thread with no current context, and handles made on one thread used
/// and dropped on another (the executor creates everything up front, then hands it to one
/// thread per GPU).
#[test]
fn handles_work_from_a_thread_with_no_current_context() -> Result<()> {
    if gpus(1, "handles used from a thread with no current context").is_none() {
        return Ok(());
    }
    let ctx = context(0)?;
    let len = 4096;
    let mut buffer = DeviceBuffer::new(&ctx, len)?;
    let want = pattern(5, len);
    buffer.copy_from_host(&want)?;
    let stream = Stream::new(&ctx)?;
    let event = Event::new(&ctx)?;
    let pinned = PinnedHost::new(&ctx, len)?;
    std::thread::spawn(move || -> Result<()> {
        let current = result::ctx::get_current().call("cuCtxGetCurrent")?;
        assert_eq!(current, None, "a fresh thread has no current context");
        assert_eq!(pointer_device(buffer.ptr())?, Some(0));
        assert!(!pointer_is_pool_memory(buffer.ptr())?);
        assert_eq!(pointer_device(pinned.uva_ptr())?, None);
        // SAFETY: both are len-byte allocations owned by this closure and alive until the
        // event_synchronize below; nothing else touches them meanwhile.
        unsafe { memcpy_async(pinned.uva_ptr(), buffer.ptr(), len, &stream)? };
        record(&event, &stream)?;
        event_synchronize(&event)?;
        assert_bytes_eq("D2H on another thread", pinned.as_slice(), &want);
        drop((buffer, stream, event, pinned));
        Ok(())
    })
    .join()
    .expect("the worker thread panicked")
}

#[test]
fn streams_events_and_async_copies_on_one_gpu() -> Result<()> {
    if gpus(1, "streams, events and asynchronous copies on one GPU").is_none() {
        return Ok(());
    }
    let ctx = context(0)?;
    let len = 1 << 20;
    let stream = Stream::new(&ctx)?;
    let done = Event::new(&ctx)?;
    let (start, end) = (Event::with_timing(&ctx)?, Event::with_timing(&ctx)?);
    let a = DeviceBuffer::new(&ctx, len)?;
    let b = DeviceBuffer::new(&ctx, len)?;
    let mut host_in = PinnedHost::new(&ctx, len)?;
    let host_out = PinnedHost::new(&ctx, len)?;
    let want = pattern(3, len);
    host_in.as_mut_slice().copy_from_slice(&want);

    assert!(event_query(&done)?, "an event never recorded is complete");
    record(&start, &stream)?;
    // SAFETY: all four ranges are len-byte allocations owned by this test and alive until the
    // event_synchronize below; nothing else touches them meanwhile, and no slice of host_out
    // or &mut of host_in is used before then.
    unsafe {
        memcpy_async(a.ptr(), host_in.uva_ptr(), len, &stream)?;
        memcpy_async(b.ptr(), a.ptr(), len, &stream)?;
        memcpy_async(host_out.uva_ptr(), b.ptr(), len, &stream)?;
    }
    record(&end, &stream)?;
    record(&done, &stream)?;
    event_synchronize(&done)?;
    assert!(event_query(&done)?);
    assert_bytes_eq("H2D, D2D, D2H", host_out.as_slice(), &want);
    let ms = event_elapsed_ms(&start, &end)?;
    assert!(ms >= 0.0, "elapsed {ms} ms");
    assert!(matches!(
        event_elapsed_ms(&done, &end),
        Err(Error::InvalidArgument(_))
    ));
    stream_synchronize(&stream)?;
    assert_eq!(stream.cudarc().cu_stream(), stream.raw());
    assert_eq!(stream.cudarc().context().cu_ctx(), ctx.cu_ctx());
    stream.cudarc().synchronize().call("cuStreamSynchronize")?;
    stream.close()?;
    done.close()?;
    Ok(())
}

#[test]
fn peer_copies_between_two_gpus() -> Result<()> {
    if gpus(2, "peer copies between two distinct GPUs").is_none() {
        return Ok(());
    }
    let (ctx0, ctx1) = (context(0)?, context(1)?);
    eprintln!("p2p 0→1 {:?}", p2p_attributes(0, 1)?);
    eprintln!("p2p 1→0 {:?}", p2p_attributes(1, 0)?);
    if !(can_access_peer(0, 1)? && can_access_peer(1, 0)?) {
        waiver::waive(
            "needs 2 GPUs with peer access (GPUs 0 and 1 have none): peer copies between two \
             distinct GPUs",
        );
        return Ok(());
    }
    for _ in 0..2 {
        // The second round checks that "already enabled" is success.
        enable_peer_access(&ctx0, &ctx1)?;
        enable_peer_access(&ctx1, &ctx0)?;
    }
    enable_peer_access(&ctx0, &ctx0)?;

    let len = 3 << 20;
    let mut src = DeviceBuffer::new(&ctx0, len)?;
    let mut dst = DeviceBuffer::zeroed(&ctx1, len)?;
    let want = pattern(0, len);
    src.copy_from_host(&want)?;
    let (stream0, stream1) = (Stream::new(&ctx0)?, Stream::new(&ctx1)?);
    let (sent, landed) = (Event::new(&ctx0)?, Event::new(&ctx1)?);
    let mut host = PinnedHost::new(&ctx1, len)?;
    assert!(matches!(
        record(&sent, &stream1),
        Err(Error::InvalidArgument(_))
    ));
    // SAFETY: src and dst are len-byte buffers on devices 0 and 1 alive until the
    // event_synchronize below; the copies are ordered by `sent` (cross-GPU wait) and nothing
    // else touches the buffers or `host` meanwhile.
    unsafe {
        // Push: the sender's stream writes into the receiver.
        memcpy_peer_async(dst.ptr(), &ctx1, src.ptr(), &ctx0, len, &stream0)?;
        record(&sent, &stream0)?;
        wait(&stream1, &sent)?;
        memcpy_async(host.uva_ptr(), dst.ptr(), len, &stream1)?;
        record(&landed, &stream1)?;
    }
    event_synchronize(&landed)?;
    assert_bytes_eq("push 0→1 then D2H", host.as_slice(), &want);

    // Pool memory is detected, and access to it can be granted.
    let cudarc_stream = ctx1.default_stream();
    let pool_slice = cudarc_stream
        .alloc_zeros::<u8>(1 << 20)
        .call("cuMemAllocAsync")?;
    let (pool_ptr, _record) = cudarc::driver::DevicePtr::device_ptr(&pool_slice, &cudarc_stream);
    if ctx1.has_async_alloc() {
        assert!(
            pointer_is_pool_memory(pool_ptr)?,
            "cudarc's alloc comes from the pool"
        );
        assert!(grant_pointer_pool_access(pool_ptr, 0)?);
    }
    grant_pool_access(&ctx1, 0)?;
    grant_pool_access(&ctx1, 1)?;
    assert!(!grant_pointer_pool_access(src.ptr(), 1)?);
    host.as_mut_slice()[0] = 0;
    dst.fill_zero()?;
    Ok(())
}

/// Prints peer-copy bandwidth for `cuMemAlloc` and pool buffers, before and after granting pool
/// access: the pool trap, measured. Run on a 2-GPU host with `--ignored --nocapture`.
#[test]
#[ignore = "benchmark: run by hand on a GPU host with ≥ 2 GPUs"]
fn peer_copy_bandwidth_report() -> Result<()> {
    if gpus(2, "peer-copy bandwidth between two GPUs").is_none() {
        return Ok(());
    }
    let (ctx0, ctx1) = (context(0)?, context(1)?);
    enable_peer_access(&ctx0, &ctx1)?;
    enable_peer_access(&ctx1, &ctx0)?;
    let len = 256 << 20;
    let stream = Stream::new(&ctx0)?;
    let (start, end) = (Event::with_timing(&ctx0)?, Event::with_timing(&ctx0)?);
    let gbps = |dst: u64, src: u64| -> Result<f64> {
        // SAFETY: dst and src are live len-byte allocations on devices 1 and 0 that outlive
        // this closure's synchronous use; nothing else touches them.
        unsafe {
            memcpy_peer_async(dst, &ctx1, src, &ctx0, len, &stream)?; // warm-up
            record(&start, &stream)?;
            for _ in 0..5 {
                memcpy_peer_async(dst, &ctx1, src, &ctx0, len, &stream)?;
            }
            record(&end, &stream)?;
        }
        let ms = f64::from(event_elapsed_ms(&start, &end)?);
        Ok(5.0 * len as f64 / (ms * 1e-3) / 1e9)
    };
    let (a, b) = (
        DeviceBuffer::new(&ctx0, len)?,
        DeviceBuffer::new(&ctx1, len)?,
    );
    eprintln!(
        "cuMemAlloc → cuMemAlloc: {:.1} GB/s",
        gbps(b.ptr(), a.ptr())?
    );

    let (s0, s1) = (ctx0.default_stream(), ctx1.default_stream());
    let pa = s0.alloc_zeros::<u8>(len).call("cuMemAllocAsync")?;
    let pb = s1.alloc_zeros::<u8>(len).call("cuMemAllocAsync")?;
    s0.synchronize().call("cuStreamSynchronize")?;
    s1.synchronize().call("cuStreamSynchronize")?;
    let (pa_ptr, _ra) = cudarc::driver::DevicePtr::device_ptr(&pa, &s0);
    let (pb_ptr, _rb) = cudarc::driver::DevicePtr::device_ptr(&pb, &s1);
    eprintln!(
        "pool memory: {} {}",
        pointer_is_pool_memory(pa_ptr)?,
        pointer_is_pool_memory(pb_ptr)?
    );
    // Revoke first, so the "before" figure holds even if another test granted access already.
    for (ptr, peer) in [(pa_ptr, 1), (pb_ptr, 0)] {
        if let Some(pool) = pointer_pool(ptr)? {
            set_pool_access(
                pool,
                peer,
                sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE,
            )?;
        }
    }
    eprintln!(
        "pool → pool, no pool access: {:.1} GB/s",
        gbps(pb_ptr, pa_ptr)?
    );
    grant_pointer_pool_access(pa_ptr, 1)?;
    grant_pointer_pool_access(pb_ptr, 0)?;
    eprintln!(
        "pool → pool, pool access granted: {:.1} GB/s",
        gbps(pb_ptr, pa_ptr)?
    );
    stream_synchronize(&stream)?;
    Ok(())
}

#[test]
fn memset_d32_fills_words_and_checks_alignment() -> Result<()> {
    if gpus(1, "cuMemsetD32 on device memory").is_none() {
        return Ok(());
    }
    let ctx = context(0)?;
    let stream = Stream::new(&ctx)?;
    let buffer = DeviceBuffer::zeroed(&ctx, 64)?;
    // SAFETY: words 4..12 lie inside the 64-byte buffer (16 words), which outlives the
    // synchronize below; nothing else touches it meanwhile.
    unsafe { memset_d32_async(buffer.ptr() + 16, 0xA1B2_C3D4, 8, &stream)? };
    // SAFETY: as above; the call is refused before anything is queued.
    let misaligned = unsafe { memset_d32_async(buffer.ptr() + 2, 1, 1, &stream) };
    assert!(matches!(misaligned, Err(Error::InvalidArgument(_))));
    stream_synchronize(&stream)?;
    let mut got = vec![0u8; 64];
    buffer.copy_to_host(&mut got)?;
    let words: Vec<u32> = got
        .chunks_exact(4)
        .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    let want: Vec<u32> = (0..16)
        .map(|i| if (4..12).contains(&i) { 0xA1B2_C3D4 } else { 0 })
        .collect();
    assert_eq!(words, want);
    Ok(())
}
