//! What the NCCL-API tests of several processes share: a call's result checked, the job's id
//! handed out through a file, each rank's GPU and stream, and the jobs launched. Included beside
//! `tests/common` (as `common`) by each test that uses it.

use crate::common::launch::{expect_success, launch};
use ringreduce_nccl::abi::*;
use ringreduce_nccl::*;
use std::ffi::CStr;
use std::time::{Duration, Instant};

/// Panics with the call's code and `ncclGetLastError` unless it succeeded.
pub fn ok(what: &str, result: ncclResult_t) {
    if result != ncclSuccess {
        // SAFETY: a NUL-terminated text of this thread's.
        let last = unsafe { CStr::from_ptr(ncclGetLastError(std::ptr::null_mut())) };
        panic!("{what}: result {result}: {}", last.to_string_lossy());
    }
}

/// The job's unique id: rank 0 makes it and writes it to `path`; the others read it there.
pub fn unique_id(rank: usize, path: &std::path::Path) -> ncclUniqueId {
    let mut id = ncclUniqueId { internal: [0; 128] };
    if rank == 0 {
        // SAFETY: a writable id.
        ok("ncclGetUniqueId", unsafe { ncclGetUniqueId(&mut id) });
        let bytes: Vec<u8> = id.internal.iter().map(|&b| b as u8).collect();
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, bytes).unwrap();
        std::fs::rename(&tmp, path).unwrap();
        return id;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(bytes) = std::fs::read(path) {
            for (dst, src) in id.internal.iter_mut().zip(bytes) {
                *dst = src as std::ffi::c_char;
            }
            return id;
        }
        assert!(Instant::now() < deadline, "rank 0 never wrote the id");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// This rank's GPU (its own where there are as many as ranks, else GPU 0) and a new stream of
/// it, its context bound to this thread.
pub fn gpu_of(rank: usize, world: usize) -> (usize, std::sync::Arc<cudarc::driver::CudaStream>) {
    let device = if ringreduce::device_count().unwrap() >= world {
        rank
    } else {
        0
    };
    let ctx = ringreduce::device::context(device).unwrap();
    ctx.bind_to_thread().unwrap();
    (device, ctx.new_stream().unwrap())
}

/// The `world` processes of `test` (this executable, its test function again, which finds itself
/// a rank), told where rank 0 writes the job's id and that ranks may share a GPU, with `env`.
pub fn launch_job(
    test: &str,
    world: usize,
    id_path: &std::path::Path,
    env: &[(&str, &str)],
) -> Vec<std::process::Child> {
    launch(test, world, |_| {
        let mut vars: Vec<(String, String)> = vec![
            (
                "RINGREDUCE_TEST_ID_FILE".into(),
                id_path.display().to_string(),
            ),
            ("RINGREDUCE_NCCL_ALLOW_SHARED_GPU".into(), "1".into()),
        ];
        vars.extend(env.iter().map(|&(k, v)| (k.to_string(), v.to_string())));
        vars
    })
}

/// `test` as a job of two processes, then of three ([`launch_job`]), each expected to succeed
/// within 180 s.
pub fn run_jobs(test: &str, env: &[(&str, &str)]) {
    for world in [2, 3] {
        let path = std::env::temp_dir().join(format!(
            "ringreduce-nccl-{test}-{}-{world}",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        expect_success(
            launch_job(test, world, &path, env),
            Duration::from_secs(180),
        );
        let _ = std::fs::remove_file(&path);
    }
}
