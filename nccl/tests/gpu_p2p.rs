//! Point-to-point as NCCL defines it, through NCCL's API, one process per rank: a send meets its
//! receive per direction, in call order, whatever each rank groups with it or calls before it
//! towards other ranks — a group of a large send and a receive against a peer that sends first
//! and receives after, apart (the group's two directions must progress together: the send is
//! larger than the channel buffers); types mixed in a group; two sends in one group against two
//! receives apart; a receive of nothing; with three ranks a pipeline 0 → 1 → 2 and back 2 → 0, in
//! which each rank takes part only in its own transfers. Then a receive whose send is of another
//! size: the receiving rank's communicator fails, its buffer untouched. On the point-to-point
//! channel, the library's default (the per-pair paths without it refuse the first grouping).
//! The ranks share GPU 0 on a one-GPU machine (`RINGREDUCE_NCCL_ALLOW_SHARED_GPU=1`); a machine
//! without a GPU waives the test.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "common/ranks.rs"]
mod ranks;

use common::launch::as_rank;
use ranks::{gpu_of, ok, run_jobs, unique_id};
use ringreduce::{Buffer, GpuBuffer};
use ringreduce_nccl::abi::*;
use ringreduce_nccl::*;
use std::ffi::c_void;

/// Elements of the large send: 12 MiB of f32, more than a direction's channel buffers (8 lanes
/// × 4 slots × 64 KiB).
const LARGE: usize = 3 << 20;

fn large(k: usize) -> f32 {
    (k % 1009) as f32 - 500.0
}

fn small(k: usize) -> i32 {
    k as i32 * 3 - 7
}

fn at<T: ringreduce::Element>(b: &GpuBuffer<T>) -> *mut c_void {
    b.address() as *mut c_void
}

/// One rank's part (module doc).
fn rank_part(rank: usize, world: usize, id_path: &std::path::Path) {
    let (device, stream) = gpu_of(rank, world);
    let raw = stream.cu_stream() as *mut c_void;
    let id = unique_id(rank, id_path);
    let mut comm: ncclComm_t = std::ptr::null_mut();
    // SAFETY: a writable handle.
    ok("init", unsafe {
        ncclCommInitRank(&mut comm, world as i32, id, rank as i32)
    });
    let sync = || stream.synchronize().unwrap();
    let f32s = |n: usize| GpuBuffer::<f32>::zeroed(device, n).unwrap();
    let i32s = |n: usize| GpuBuffer::<i32>::zeroed(device, n).unwrap();
    let big: Vec<f32> = (0..LARGE).map(large).collect();
    let few: Vec<i32> = (0..5000).map(small).collect();

    // Rank 0: one group {send big to 1, receive few from 1}. Rank 1: send few, then receive
    // big, apart. The group's send cannot complete before rank 1's second call, which follows
    // its first, which needs the group's receive.
    if rank == 0 {
        let src = GpuBuffer::from_host(device, &big).unwrap();
        let got = i32s(few.len());
        ok("group start", ncclGroupStart());
        // SAFETY: device buffers of this GPU of these lengths, kept until the stream is synced.
        ok("send big", unsafe {
            ncclSend(at(&src), LARGE, ncclFloat32, 1, comm, raw)
        });
        // SAFETY: as above.
        ok("recv few", unsafe {
            ncclRecv(at(&got), few.len(), ncclInt32, 1, comm, raw)
        });
        ok("group end", ncclGroupEnd());
        sync();
        assert_eq!(got.to_host().unwrap(), few, "rank 0: few from 1");
    } else if rank == 1 {
        let src = GpuBuffer::from_host(device, &few).unwrap();
        let got = f32s(LARGE);
        // SAFETY: as above.
        ok("send few", unsafe {
            ncclSend(at(&src), few.len(), ncclInt32, 0, comm, raw)
        });
        // SAFETY: as above.
        ok("recv big", unsafe {
            ncclRecv(at(&got), LARGE, ncclFloat32, 0, comm, raw)
        });
        sync();
        assert!(got.to_host().unwrap() == big, "rank 1: big from 0");
    }

    // Two sends in one group on rank 1, received apart on rank 0 (the first of them empty).
    if rank == 1 {
        let a = GpuBuffer::from_host(device, &few[..1000]).unwrap();
        let b = GpuBuffer::from_host(device, &few[1000..]).unwrap();
        ok("group start", ncclGroupStart());
        // SAFETY: as above (a send of nothing reads nothing).
        ok("send none", unsafe {
            ncclSend(at(&a), 0, ncclInt32, 0, comm, raw)
        });
        // SAFETY: as above.
        ok("send a", unsafe {
            ncclSend(at(&a), 1000, ncclInt32, 0, comm, raw)
        });
        // SAFETY: as above.
        ok("send b", unsafe {
            ncclSend(at(&b), 4000, ncclInt32, 0, comm, raw)
        });
        ok("group end", ncclGroupEnd());
        sync();
    } else if rank == 0 {
        let (none, a, b) = (i32s(1), i32s(1000), i32s(4000));
        // SAFETY: as above.
        ok("recv none", unsafe {
            ncclRecv(at(&none), 0, ncclInt32, 1, comm, raw)
        });
        // SAFETY: as above.
        ok("recv a", unsafe {
            ncclRecv(at(&a), 1000, ncclInt32, 1, comm, raw)
        });
        // SAFETY: as above.
        ok("recv b", unsafe {
            ncclRecv(at(&b), 4000, ncclInt32, 1, comm, raw)
        });
        sync();
        assert_eq!(none.to_host().unwrap(), vec![0], "rank 0: nothing written");
        assert_eq!(a.to_host().unwrap(), few[..1000], "rank 0: a");
        assert_eq!(b.to_host().unwrap(), few[1000..], "rank 0: b");
    }

    // Three ranks: a pipeline 0 → 1 → 2, then 2 → 0; each rank makes only its own calls.
    if world >= 3 {
        let stage = |r: usize| -> Vec<f32> { (0..70_000).map(|k| large(k + r)).collect() };
        match rank {
            0 => {
                let src = GpuBuffer::from_host(device, &stage(0)).unwrap();
                let back = f32s(70_000);
                // SAFETY: as above.
                ok("send 0→1", unsafe {
                    ncclSend(at(&src), 70_000, ncclFloat32, 1, comm, raw)
                });
                // SAFETY: as above.
                ok("recv 2→0", unsafe {
                    ncclRecv(at(&back), 70_000, ncclFloat32, 2, comm, raw)
                });
                sync();
                assert!(back.to_host().unwrap() == stage(2), "rank 0: back from 2");
            }
            1 => {
                let got = f32s(70_000);
                // SAFETY: as above.
                ok("recv 0→1", unsafe {
                    ncclRecv(at(&got), 70_000, ncclFloat32, 0, comm, raw)
                });
                sync();
                assert!(got.to_host().unwrap() == stage(0), "rank 1: from 0");
                let next = GpuBuffer::from_host(device, &stage(1)).unwrap();
                // SAFETY: as above.
                ok("send 1→2", unsafe {
                    ncclSend(at(&next), 70_000, ncclFloat32, 2, comm, raw)
                });
                sync();
            }
            _ => {
                let got = f32s(70_000);
                // SAFETY: as above.
                ok("recv 1→2", unsafe {
                    ncclRecv(at(&got), 70_000, ncclFloat32, 1, comm, raw)
                });
                sync();
                assert!(got.to_host().unwrap() == stage(1), "rank 2: from 1");
                let src = GpuBuffer::from_host(device, &stage(2)).unwrap();
                // SAFETY: as above.
                ok("send 2→0", unsafe {
                    ncclSend(at(&src), 70_000, ncclFloat32, 0, comm, raw)
                });
                sync();
            }
        }
    }
    let async_error = |comm| {
        let mut error = ncclSuccess;
        // SAFETY: a live communicator and a writable result.
        ok("async error", unsafe {
            ncclCommGetAsyncError(comm, &mut error)
        });
        error
    };
    assert_eq!(
        async_error(comm),
        ncclSuccess,
        "rank {rank}: nothing failed"
    );

    // A receive of 101 elements against a send of 100: the receiving rank's communicator fails,
    // its buffer untouched.
    if rank == 0 {
        let src = GpuBuffer::from_host(device, &big[..100]).unwrap();
        // SAFETY: as above.
        ok("send 100", unsafe {
            ncclSend(at(&src), 100, ncclFloat32, 1, comm, raw)
        });
        sync();
    } else if rank == 1 {
        let got = GpuBuffer::from_host(device, &vec![7.0f32; 101]).unwrap();
        // SAFETY: as above. (Only enqueued: it returns success.)
        let _ = unsafe { ncclRecv(at(&got), 101, ncclFloat32, 0, comm, raw) };
        sync();
        assert_eq!(
            got.to_host().unwrap(),
            vec![7.0f32; 101],
            "rank 1: untouched"
        );
        assert_ne!(
            async_error(comm),
            ncclSuccess,
            "rank 1: the mismatch is named"
        );
    }
    // SAFETY: a live communicator, destroyed once. (Its result is not asked: rank 1's failure
    // was told to every rank, whose shutdown may report it.)
    let _ = unsafe { ncclCommDestroy(comm) };
    println!("rank {rank}: point-to-point per direction through NCCL's API");
}

#[test]
fn sends_meet_receives_per_direction_whatever_the_grouping() {
    if let Some(env) = as_rank() {
        let path = std::path::PathBuf::from(std::env::var("RINGREDUCE_TEST_ID_FILE").unwrap());
        rank_part(env.rank, env.world, &path);
        return;
    }
    if common::two_gpus_or_shared().is_none() {
        return;
    }
    run_jobs(
        "sends_meet_receives_per_direction_whatever_the_grouping",
        &[("RINGREDUCE_NCCL_LOG", "1")],
    );
}
