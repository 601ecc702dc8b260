//! The other collectives on GPUs. Today a GPU communicator runs only the all-reduce: the first
//! test checks that every other collective is refused with `NotOnGpu` after validation and
//! leaves the communicator usable. The second runs every collective on the GPUs against the host
//! reference; it is ignored until the CUDA executor routes them (`run_shape_on_main` in
//! `src/exec/cuda/executor/mod.rs` takes any collective's plan; the caller's-stream entry and the
//! communicator's GPU branch do not call it yet). Both print `waived: needs ≥ 2 GPUs` and pass
//! where there are fewer.

use ringreduce::device;
use ringreduce::verify::{compare, expected_value, input_value};
use ringreduce::{Communicator, CudaConfig, Error, GpuBuffer, ReduceOp};

fn two_gpus() -> Option<Vec<usize>> {
    let count = device::driver_available()
        .and_then(|()| device::device_count())
        .unwrap_or(0);
    if count < 2 {
        println!("waived: needs ≥ 2 GPUs (found {count})");
        return None;
    }
    Some(vec![0, 1])
}

fn gpu(device: usize, data: &[f32]) -> GpuBuffer<f32> {
    GpuBuffer::from_host(device, data).expect("a GPU buffer")
}

fn input(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| input_value(ReduceOp::Sum, rank, i))
        .collect()
}

#[test]
fn other_collectives_say_they_are_not_on_gpus_yet() {
    let Some(devices) = two_gpus() else { return };
    let comm = Communicator::with_config(&devices, CudaConfig::default()).unwrap();
    let count = 1000;
    let inputs: Vec<_> = devices.iter().map(|&d| gpu(d, &input(d, count))).collect();
    let mut outs: Vec<_> = devices
        .iter()
        .map(|&d| gpu(d, &vec![0.0; 2 * count]))
        .collect();
    assert_eq!(
        comm.all_gather(&inputs, &mut outs),
        Err(Error::NotOnGpu {
            collective: "all-gather"
        })
    );
    // Validation still comes first.
    assert!(matches!(
        comm.broadcast(&inputs[0], &mut outs, 0),
        Err(Error::BufferLength { .. })
    ));
    // Nothing failed: the all-reduce still runs.
    let mut bufs: Vec<_> = devices.iter().map(|&d| gpu(d, &input(d, count))).collect();
    comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum).unwrap();
    comm.health().unwrap();
    comm.close().unwrap();
}

#[test]
#[ignore = "the CUDA executor does not route the other collectives yet (see the module doc)"]
fn every_collective_on_gpus_matches_the_host_reference() {
    let Some(devices) = two_gpus() else { return };
    let n = devices.len();
    let comm = Communicator::with_config(&devices, CudaConfig::default()).unwrap();
    for count in [0, 1, 1009, (1 << 20) + 7] {
        // Reduce-scatter, out of place.
        let inputs: Vec<_> = (0..n)
            .map(|r| gpu(devices[r], &input(r, n * count)))
            .collect();
        let mut outs: Vec<_> = (0..n)
            .map(|r| gpu(devices[r], &vec![77.0; count]))
            .collect();
        comm.reduce_scatter(&inputs, &mut outs, ReduceOp::Sum)
            .unwrap();
        for (r, out) in outs.iter().enumerate() {
            let want: Vec<f32> = (0..count)
                .map(|k| expected_value(ReduceOp::Sum, n, r * count + k))
                .collect();
            let (wrong, first) = compare(r, &out.to_host().unwrap(), &want, 4);
            assert_eq!(wrong, 0, "reduce-scatter count {count}: {first:?}");
        }
        // All-gather, in place.
        let mut bufs: Vec<_> = (0..n)
            .map(|r| {
                let mut host = vec![77.0; n * count];
                host[r * count..(r + 1) * count].copy_from_slice(&input(r, count));
                gpu(devices[r], &host)
            })
            .collect();
        comm.all_gather_in_place(&mut bufs).unwrap();
        let want: Vec<f32> = (0..n).flat_map(|j| input(j, count)).collect();
        for (r, b) in bufs.iter().enumerate() {
            let (wrong, first) = compare(r, &b.to_host().unwrap(), &want, 4);
            assert_eq!(wrong, 0, "all-gather count {count}: {first:?}");
        }
        // Broadcast from the last rank, reduce (avg) into rank 0, all-to-all.
        let mut outs: Vec<_> = (0..n)
            .map(|r| gpu(devices[r], &vec![77.0; count]))
            .collect();
        comm.broadcast(&gpu(devices[n - 1], &input(n - 1, count)), &mut outs, n - 1)
            .unwrap();
        for (r, b) in outs.iter().enumerate() {
            let (wrong, first) = compare(r, &b.to_host().unwrap(), &input(n - 1, count), 4);
            assert_eq!(wrong, 0, "broadcast count {count}: {first:?}");
        }
        let inputs: Vec<_> = (0..n).map(|r| gpu(devices[r], &input(r, count))).collect();
        let mut out = gpu(devices[0], &vec![77.0; count]);
        comm.reduce(&inputs, &mut out, 0, ReduceOp::Avg).unwrap();
        let want: Vec<f32> = (0..count)
            .map(|k| expected_value(ReduceOp::Avg, n, k))
            .collect();
        let (wrong, first) = compare(0, &out.to_host().unwrap(), &want, 4);
        assert_eq!(wrong, 0, "reduce count {count}: {first:?}");
        let inputs: Vec<_> = (0..n)
            .map(|r| gpu(devices[r], &input(r, n * count)))
            .collect();
        let mut outs: Vec<_> = (0..n)
            .map(|r| gpu(devices[r], &vec![77.0; n * count]))
            .collect();
        comm.all_to_all(&inputs, &mut outs).unwrap();
        for (r, b) in outs.iter().enumerate() {
            let want: Vec<f32> = (0..n)
                .flat_map(|j| (0..count).map(move |k| input_value(ReduceOp::Sum, j, r * count + k)))
                .collect();
            let (wrong, first) = compare(r, &b.to_host().unwrap(), &want, 4);
            assert_eq!(wrong, 0, "all-to-all count {count}: {first:?}");
        }
    }
    comm.close().unwrap();
}
