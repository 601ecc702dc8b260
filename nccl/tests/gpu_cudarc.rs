//! cudarc's `nccl` module running collectives on this library, as candle's multi-process
//! example runs them: one process per rank, each finding the library by its loader path alone (a
//! link `libnccl.so` on `LD_LIBRARY_PATH`, the name cudarc looks for), rank 0's `Id::new()` handed
//! to the others (through a file here), `Comm::from_rank` on a stream of cudarc's own, then an
//! all-reduce, a broadcast and an all-gather through cudarc's safe API — exact against the
//! host's arithmetic. The ranks share GPU 0 on a one-GPU machine
//! (`RINGREDUCE_NCCL_ALLOW_SHARED_GPU=1`); a machine without a GPU waives the test. A rank uses
//! nothing of ringreduce's own: only cudarc, over the library it loaded.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "common/mod.rs"]
#[allow(dead_code)]
mod nccl_common;

use common::launch::{as_rank, expect_success, launch};
use cudarc::driver::CudaContext;
use cudarc::nccl::safe::{Comm, Id, ReduceOp};
use nccl_common::linked_as;
use std::time::{Duration, Instant};

/// Rank `rank`'s element `k`: small integers, exact in f32.
fn input(rank: usize, k: usize) -> f32 {
    ((rank * 5 + k * 3) % 13) as f32 - 6.0
}

/// The job's id: rank 0 makes it through cudarc and writes it to `path`; the others read it.
fn job_id(rank: usize, path: &std::path::Path) -> Id {
    if rank == 0 {
        let id = Id::new().expect("ncclGetUniqueId through cudarc");
        let bytes: Vec<u8> = id.internal().iter().map(|&b| b as u8).collect();
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, bytes).unwrap();
        std::fs::rename(&tmp, path).unwrap();
        return id;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(bytes) = std::fs::read(path) {
            let mut internal = [0 as std::ffi::c_char; 128];
            for (dst, src) in internal.iter_mut().zip(bytes) {
                *dst = src as std::ffi::c_char;
            }
            return Id::uninit(internal);
        }
        assert!(Instant::now() < deadline, "rank 0 never wrote the id");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One rank's part (module doc).
fn rank_part(rank: usize, world: usize, path: &std::path::Path) {
    let gpus = CudaContext::device_count().unwrap() as usize;
    let ctx = CudaContext::new(if gpus >= world { rank } else { 0 }).unwrap();
    let stream = ctx.new_stream().unwrap();
    let comm = Comm::from_rank(stream.clone(), rank, world, job_id(rank, path))
        .expect("ncclCommInitRank through cudarc");
    let count = 4099;
    let mine: Vec<f32> = (0..count).map(|k| input(rank, k)).collect();
    let every = |k: usize| (0..world).map(move |r| input(r, k));

    let send = stream.clone_htod(&mine).unwrap();
    let mut sum = stream.alloc_zeros::<f32>(count).unwrap();
    comm.all_reduce(&send, &mut sum, &ReduceOp::Sum)
        .expect("all-reduce");
    let want: Vec<f32> = (0..count).map(|k| every(k).sum()).collect();
    assert_eq!(stream.clone_dtoh(&sum).unwrap(), want, "rank {rank} sum");

    let mut root = stream.alloc_zeros::<f32>(count).unwrap();
    comm.broadcast(Some(&send), &mut root, 0)
        .expect("broadcast");
    let want: Vec<f32> = (0..count).map(|k| input(0, k)).collect();
    assert_eq!(
        stream.clone_dtoh(&root).unwrap(),
        want,
        "rank {rank} broadcast"
    );

    let mut all = stream.alloc_zeros::<f32>(count * world).unwrap();
    comm.all_gather(&send, &mut all).expect("all-gather");
    let want: Vec<f32> = (0..world)
        .flat_map(|r| (0..count).map(move |k| input(r, k)))
        .collect();
    assert_eq!(
        stream.clone_dtoh(&all).unwrap(),
        want,
        "rank {rank} all-gather"
    );
    // (cudarc's Drop calls ncclCommAbort, after the collectives' results were read.)
    drop(comm);
    println!("rank {rank}: cudarc ran every collective on ringreduce-nccl");
}

#[test]
fn cudarc_communicators_run_collectives_across_processes_on_the_library() {
    if let Some(env) = as_rank() {
        let path = std::path::PathBuf::from(std::env::var("RINGREDUCE_TEST_ID_FILE").unwrap());
        rank_part(env.rank, env.world, &path);
        return;
    }
    if common::two_gpus_or_shared().is_none() {
        return;
    }
    // The name cudarc tries first, linked to this library, on the ranks' loader path.
    let (dir, path) = linked_as("cudarc-gpu", "libnccl.so");
    let path = path.to_string_lossy().into_owned();
    for world in [2, 3] {
        let id_path = dir.join(format!("id-{world}"));
        let ranks = launch(
            "cudarc_communicators_run_collectives_across_processes_on_the_library",
            world,
            |_| {
                vec![
                    (
                        "RINGREDUCE_TEST_ID_FILE".into(),
                        id_path.display().to_string(),
                    ),
                    ("LD_LIBRARY_PATH".into(), path.clone()),
                    ("RINGREDUCE_NCCL_ALLOW_SHARED_GPU".into(), "1".into()),
                    // No real NCCL to hand calls to, whatever the machine has.
                    (
                        "RINGREDUCE_NCCL_PATH".into(),
                        dir.join("no-such-libnccl.so").display().to_string(),
                    ),
                ]
            },
        );
        expect_success(ranks, Duration::from_secs(180));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
