//! GPU ranks in processes of their own, one of them late: an eager call returns once enqueued,
//! whatever the late peer's host is doing — a shape's first call too, every kernel form of it
//! (read one-shot, two-shot, the steps kernel's collectives and send/recv, a pair some rank takes
//! no part in), calls too large for the arenas as gated pieces (an all-reduce, strided pieces of
//! the block collectives, long and fanned-in send/recv), and over staged reach (GPUs that do not
//! all reach each other) every collective over arenas of pinned host memory — and a call that
//! differs is named by the GPUs' call gates before any peer's memory is touched. On a one-GPU
//! machine the ranks share GPU 0 (`allow_shared_device`). A machine without a GPU waives them.

use common::launch::{as_rank, expect_success, launch};
use common::ranks::{
    assert_rank_1_mismatch, auto_rank_with_stream, config, enqueued_before_a_late_peer,
    first_call_mismatch_is_named_by_the_gpus, this_gpu, values,
};
use common::two_gpus_or_shared;
use ringreduce::plan::Collective;
use ringreduce::verify::{expected_value, input_value};
use ringreduce::{Algorithm, CudaConfig, GpuBuffer, RankCommunicator, ReduceOp, Transfer};
use std::time::Duration;

mod common;

#[test]
fn an_eager_call_returns_before_a_late_peer_starts_it_and_the_gpu_names_a_mismatch() {
    if let Some(env) = as_rank() {
        let (rank, world, device, mut comm, stream) = auto_rank_with_stream(&env);
        // Both shapes prepared, in step, by a first call each (those meet on the hosts).
        let mut small = GpuBuffer::from_host(device, &[1.0f32; 64]).unwrap();
        let mut large = GpuBuffer::from_host(device, &[1.0f32; 96]).unwrap();
        comm.all_reduce_in_place(&mut small, ReduceOp::Sum).unwrap();
        comm.all_reduce_in_place(&mut large, ReduceOp::Sum).unwrap();
        // Rank 1 is 2 s late for the next call: the others' calls return once enqueued.
        enqueued_before_a_late_peer(rank, || {
            // SAFETY: `small` is untouched until the stream is synchronised below.
            unsafe { comm.enqueue_all_reduce_in_place_on(&mut small, ReduceOp::Sum, &stream) }
                .unwrap();
        });
        stream.synchronize().unwrap();
        comm.synchronize().unwrap();
        let sum = (world * world) as f32;
        assert_eq!(small.to_host().unwrap(), vec![sum; 64], "rank {rank}");
        // Rank 1 calls the other prepared shape: every call is enqueued, and every rank's GPU
        // finds the difference before touching a peer's memory.
        let buf = if rank == 1 { &mut large } else { &mut small };
        let before = buf.to_host().unwrap();
        // SAFETY: `buf` is untouched until the stream is synchronised below.
        unsafe { comm.enqueue_all_reduce_in_place_on(buf, ReduceOp::Sum, &stream) }.unwrap();
        stream.synchronize().unwrap();
        let err = comm.synchronize().unwrap_err();
        assert_rank_1_mismatch(rank, &err, "96", "64");
        assert_eq!(buf.to_host().unwrap(), before, "rank {rank}: untouched");
        let again = comm
            .all_reduce_in_place(&mut small, ReduceOp::Sum)
            .unwrap_err();
        assert!(
            matches!(again, ringreduce::Error::CommunicatorFailed(_)),
            "{again}"
        );
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "an_eager_call_returns_before_a_late_peer_starts_it_and_the_gpu_names_a_mismatch",
        3,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(120));
}

#[test]
fn a_small_all_reduces_first_call_returns_before_a_late_peer_and_the_gpu_names_a_first_call_mismatch(
) {
    use ringreduce::Form;
    if let Some(env) = as_rank() {
        let (rank, world) = (env.rank, env.world);
        let device = this_gpu(&env);
        let id = env.unique_id().unwrap();
        // The LL one-shot (up to 64 KiB a rank): each rank prepares its shapes alone, so even a
        // shape's first call meets no peer.
        let cfg = CudaConfig {
            low_latency: true,
            ..config(Algorithm::Auto)
        };
        let mut comm = RankCommunicator::gpu(&id, rank, world, device, cfg).unwrap();
        let stream = ringreduce::device::context(device)
            .unwrap()
            .new_stream()
            .unwrap();
        let ones = GpuBuffer::from_host(device, &[1.0f32; 64]).unwrap();
        let mut small = GpuBuffer::<f32>::zeroed(device, 64).unwrap();
        // Ten shapes in place, 4 to 40 elements: with the out-of-place one, eleven plans
        // against a cache of 8 — three pushed out.
        let mut shapes: Vec<GpuBuffer<f32>> = (1..=10)
            .map(|k| GpuBuffer::from_host(device, &vec![k as f32; 4 * k]).unwrap())
            .collect();
        // Rank 1 is 2 s late for the communicator's first calls: the others' return once
        // enqueued — an out-of-place call, then ten new shapes in place while it waits (their
        // in-place copies in the arenas made at creation; the plans they push out of the cache
        // owning nothing a kernel in flight uses, so dropped without waiting for it).
        enqueued_before_a_late_peer(rank, || {
            // SAFETY: `ones`, `small` and `shapes` are untouched until the stream is
            // synchronised below.
            unsafe { comm.enqueue_all_reduce_on(&ones, &mut small, ReduceOp::Sum, &stream) }
                .unwrap();
            for buf in &mut shapes {
                // SAFETY: as above.
                unsafe { comm.enqueue_all_reduce_in_place_on(buf, ReduceOp::Sum, &stream) }
                    .unwrap();
            }
        });
        assert_eq!(
            comm.last_ran().map(|r| r.form),
            Some(Form::LlKernel),
            "rank {rank}"
        );
        stream.synchronize().unwrap();
        comm.synchronize().unwrap();
        assert_eq!(
            small.to_host().unwrap(),
            vec![world as f32; 64],
            "rank {rank}"
        );
        for (k, buf) in (1..=10).zip(&shapes) {
            let want = vec![(k * world) as f32; 4 * k];
            assert_eq!(
                buf.to_host().unwrap(),
                want,
                "rank {rank}, {} elements",
                4 * k
            );
        }
        // A first call of two new shapes: rank 1 calls 44 elements, the others 24.
        first_call_mismatch_is_named_by_the_gpus(rank, &mut comm, &stream, device, 0);
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "a_small_all_reduces_first_call_returns_before_a_late_peer_and_the_gpu_names_a_first_call_mismatch",
        3,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(120));
}

#[test]
fn every_kernel_forms_first_call_returns_before_a_late_peer_and_the_gpu_names_a_first_call_mismatch(
) {
    use ringreduce::Form;
    if let Some(env) = as_rank() {
        let (rank, world, device, mut comm, stream) = auto_rank_with_stream(&env);
        let op = ReduceOp::Sum;
        // First calls of shapes of every kernel form: the read one-shot in place and out of
        // place (1 MiB), the two-shot in place (8 MiB: from 8 MiB × 2/n in place), the steps
        // kernel's all-gather, ring of sends and all-to-all of sends of mixed counts — each
        // plan's buffers fit the arenas, so each rank prepares it alone.
        let (small, large, per) = ((1 << 18) + 3, (2 << 20) + 5, (1 << 16) + 3);
        let want = |count: usize| -> Vec<f32> {
            (0..count).map(|k| expected_value(op, world, k)).collect()
        };
        let mut in_place = GpuBuffer::from_host(device, &values(op, rank, small)).unwrap();
        let input = GpuBuffer::from_host(device, &values(op, rank, small)).unwrap();
        let mut output = GpuBuffer::<f32>::zeroed(device, small).unwrap();
        let mut two_shot = GpuBuffer::from_host(device, &values(op, rank, large)).unwrap();
        let mine = GpuBuffer::from_host(device, &values(op, rank, per)).unwrap();
        let mut all = GpuBuffer::<f32>::zeroed(device, world * per).unwrap();
        let ring: Vec<Transfer> = (0..world)
            .map(|from| Transfer {
                from,
                to: (from + 1) % world,
                count: per,
            })
            .collect();
        let mut got = GpuBuffer::<f32>::zeroed(device, per).unwrap();
        // Every rank sends to every rank (itself too) `per + 7·from + to` elements.
        let uneven = |from: usize, to: usize| per + 7 * from + to;
        let everyone: Vec<Transfer> = (0..world)
            .flat_map(|from| (0..world).map(move |to| (from, to)))
            .map(|(from, to)| Transfer {
                from,
                to,
                count: uneven(from, to),
            })
            .collect();
        let to_each: Vec<GpuBuffer<f32>> = (0..world)
            .map(|to| GpuBuffer::from_host(device, &values(op, rank, uneven(rank, to))).unwrap())
            .collect();
        let mut from_each: Vec<GpuBuffer<f32>> = (0..world)
            .map(|from| GpuBuffer::<f32>::zeroed(device, uneven(from, rank)).unwrap())
            .collect();
        // A pair the late rank 1 takes no part in: rank 2 sends to rank 0.
        let pair = [Transfer {
            from: 2,
            to: 0,
            count: per + 1,
        }];
        let pair_send = GpuBuffer::from_host(device, &values(op, rank, per + 1)).unwrap();
        let mut pair_recv = GpuBuffer::<f32>::zeroed(device, per + 1).unwrap();
        let form = |comm: &RankCommunicator| comm.last_ran().map(|r| r.form);
        let mut forms = Vec::new();
        // Rank 1 is 2 s late: the others' first calls return once enqueued.
        enqueued_before_a_late_peer(rank, || {
            // SAFETY: every buffer is untouched until the stream is synchronised below.
            unsafe { comm.enqueue_all_reduce_in_place_on(&mut in_place, op, &stream) }.unwrap();
            forms.push(form(&comm));
            // SAFETY: as above.
            unsafe { comm.enqueue_all_reduce_on(&input, &mut output, op, &stream) }.unwrap();
            forms.push(form(&comm));
            // SAFETY: as above.
            unsafe { comm.enqueue_all_reduce_in_place_on(&mut two_shot, op, &stream) }.unwrap();
            forms.push(form(&comm));
            let ag = Collective::AllGather;
            // SAFETY: as above.
            unsafe { comm.enqueue_collective(&ag, Some(&mine), Some(&mut all), op, &stream) }
                .unwrap();
            forms.push(form(&comm));
            let raw = ringreduce::device::CallerStream::of(&stream);
            // SAFETY: as above.
            unsafe { comm.enqueue_send_recv(&ring, &[&mine], &mut [&mut got], raw) }.unwrap();
            forms.push(form(&comm));
            let sends: Vec<&GpuBuffer<f32>> = to_each.iter().collect();
            let mut recvs: Vec<&mut GpuBuffer<f32>> = from_each.iter_mut().collect();
            // SAFETY: as above.
            unsafe { comm.enqueue_send_recv(&everyone, &sends, &mut recvs, raw) }.unwrap();
            forms.push(form(&comm));
            let sends: &[&GpuBuffer<f32>] = if rank == 2 { &[&pair_send] } else { &[] };
            let mut recv = [&mut pair_recv];
            let recvs: &mut [&mut GpuBuffer<f32>] = if rank == 0 { &mut recv } else { &mut [] };
            // SAFETY: as above.
            unsafe { comm.enqueue_send_recv(&pair, sends, recvs, raw) }.unwrap();
            forms.push(form(&comm));
        });
        let kernels = [
            Form::OneShotKernel,
            Form::OneShotKernel,
            Form::TwoShotKernel,
            Form::StepsKernel,
            Form::StepsKernel,
            Form::StepsKernel,
            Form::StepsKernel,
        ];
        assert_eq!(forms, kernels.map(Some), "rank {rank}");
        stream.synchronize().unwrap();
        comm.synchronize().unwrap();
        assert_eq!(
            in_place.to_host().unwrap(),
            want(small),
            "rank {rank} in place"
        );
        assert_eq!(
            output.to_host().unwrap(),
            want(small),
            "rank {rank} out of place"
        );
        assert_eq!(
            two_shot.to_host().unwrap(),
            want(large),
            "rank {rank} two-shot"
        );
        let want_ag: Vec<f32> = (0..world).flat_map(|r| values(op, r, per)).collect();
        assert_eq!(all.to_host().unwrap(), want_ag, "rank {rank} all-gather");
        let before = (rank + world - 1) % world;
        assert_eq!(
            got.to_host().unwrap(),
            values(op, before, per),
            "rank {rank} send/recv"
        );
        for (from, buf) in from_each.iter().enumerate() {
            assert_eq!(
                buf.to_host().unwrap(),
                values(op, from, uneven(from, rank)),
                "rank {rank}'s receive from {from}"
            );
        }
        let untouched = vec![0.0; per + 1];
        let pair_want = if rank == 0 {
            values(op, 2, per + 1)
        } else {
            untouched
        };
        assert_eq!(
            pair_recv.to_host().unwrap(),
            pair_want,
            "rank {rank}'s pair"
        );
        // A first call of two new read one-shot shapes: rank 1 calls 44 elements more than a
        // quarter million, the others 24.
        let ran =
            first_call_mismatch_is_named_by_the_gpus(rank, &mut comm, &stream, device, 1 << 18);
        assert_eq!(ran, Some(Form::OneShotKernel), "rank {rank}");
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "every_kernel_forms_first_call_returns_before_a_late_peer_and_the_gpu_names_a_first_call_mismatch",
        3,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(120));
}

/// GPUs that do not reach each other (`Transport::Staged`; ranks sharing GPU 0 stand in, every
/// buffer a peer touches in pinned host memory): every collective's first call is enqueued
/// before a late peer — the all-reduce's staged one-shot at every size (80 MiB as two pieces),
/// the others' steps kernel over the host arenas, a pair some rank takes no part in among them
/// — exact, and a first-call mismatch is named by the GPUs.
#[test]
fn staged_first_calls_of_every_collective_return_before_a_late_peer() {
    use ringreduce::Form;
    if let Some(env) = as_rank() {
        let (rank, world, device) = (env.rank, env.world, this_gpu(&env));
        let config = CudaConfig {
            transport: ringreduce::Transport::Staged,
            ..config(Algorithm::Auto)
        };
        let id = env.unique_id().unwrap();
        let mut comm = RankCommunicator::gpu(&id, rank, world, device, config).unwrap();
        let stream = ringreduce::device::context(device)
            .unwrap()
            .new_stream()
            .unwrap();
        let op = ReduceOp::Sum;
        let (small, mid, large, per) = (1003, (1 << 18) + 5, (20 << 20) + 7, (1 << 16) + 3);
        let from = |len: usize| GpuBuffer::from_host(device, &values(op, rank, len)).unwrap();
        let zeroed = |len: usize| GpuBuffer::<f32>::zeroed(device, len).unwrap();
        let want = |k: std::ops::Range<usize>| -> Vec<f32> {
            k.map(|k| expected_value(op, world, k)).collect()
        };
        let (mut in_place, input, mut output) = (from(small), from(mid), zeroed(mid));
        let mut pieces = from(large);
        let (mine, mut all) = (from(per), zeroed(world * per));
        let (blocks, mut block) = (from(world * per), zeroed(per));
        let ring: Vec<Transfer> = (0..world)
            .map(|from| Transfer {
                from,
                to: (from + 1) % world,
                count: per,
            })
            .collect();
        let mut got = zeroed(per);
        // A pair the late rank 1 takes no part in: rank 2 sends to rank 0.
        let pair = [Transfer {
            from: 2,
            to: 0,
            count: per + 1,
        }];
        let (pair_send, mut pair_recv) = (from(per + 1), zeroed(per + 1));
        let mut ran = Vec::new();
        let last = |comm: &RankCommunicator| comm.last_ran().map(|r| (r.form, r.pieces));
        enqueued_before_a_late_peer(rank, || {
            // SAFETY: every buffer is untouched until the stream is synchronised below.
            unsafe { comm.enqueue_all_reduce_in_place_on(&mut in_place, op, &stream) }.unwrap();
            ran.push(last(&comm));
            // SAFETY: as above.
            unsafe { comm.enqueue_all_reduce_on(&input, &mut output, op, &stream) }.unwrap();
            ran.push(last(&comm));
            // SAFETY: as above.
            unsafe { comm.enqueue_all_reduce_in_place_on(&mut pieces, op, &stream) }.unwrap();
            ran.push(last(&comm));
            for (c, send, recv) in [
                (Collective::AllGather, &mine, &mut all),
                (Collective::ReduceScatter, &blocks, &mut block),
            ] {
                // SAFETY: as above.
                unsafe { comm.enqueue_collective(&c, Some(send), Some(recv), op, &stream) }
                    .unwrap();
                ran.push(last(&comm));
            }
            let raw = ringreduce::device::CallerStream::of(&stream);
            // SAFETY: as above.
            unsafe { comm.enqueue_send_recv(&ring, &[&mine], &mut [&mut got], raw) }.unwrap();
            ran.push(last(&comm));
            let sends: &[&GpuBuffer<f32>] = if rank == 2 { &[&pair_send] } else { &[] };
            let mut recv = [&mut pair_recv];
            let recvs: &mut [&mut GpuBuffer<f32>] = if rank == 0 { &mut recv } else { &mut [] };
            // SAFETY: as above.
            unsafe { comm.enqueue_send_recv(&pair, sends, recvs, raw) }.unwrap();
            ran.push(last(&comm));
        });
        let (staged, steps) = (Some((Form::StagedKernel, 1)), Some((Form::StepsKernel, 1)));
        let two = Some((Form::StagedKernel, 2));
        assert_eq!(
            ran,
            [staged, staged, two, steps, steps, steps, steps],
            "rank {rank}"
        );
        stream.synchronize().unwrap();
        comm.synchronize().unwrap();
        assert_eq!(in_place.to_host().unwrap(), want(0..small), "rank {rank}");
        assert_eq!(output.to_host().unwrap(), want(0..mid), "rank {rank}");
        assert!(
            pieces.to_host().unwrap() == want(0..large),
            "rank {rank}: 80 MiB"
        );
        let want_ag: Vec<f32> = (0..world).flat_map(|r| values(op, r, per)).collect();
        assert_eq!(all.to_host().unwrap(), want_ag, "rank {rank} all-gather");
        let mine_of_sum = want(rank * per..(rank + 1) * per);
        assert_eq!(
            block.to_host().unwrap(),
            mine_of_sum,
            "rank {rank} reduce-scatter"
        );
        let before = (rank + world - 1) % world;
        assert_eq!(
            got.to_host().unwrap(),
            values(op, before, per),
            "rank {rank}"
        );
        let pair_want = match rank {
            0 => values(op, 2, per + 1),
            _ => vec![0.0; per + 1],
        };
        assert_eq!(
            pair_recv.to_host().unwrap(),
            pair_want,
            "rank {rank}'s pair"
        );
        let ran =
            first_call_mismatch_is_named_by_the_gpus(rank, &mut comm, &stream, device, 1 << 18);
        assert_eq!(ran, Some(Form::StagedKernel), "rank {rank}");
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "staged_first_calls_of_every_collective_return_before_a_late_peer",
        3,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(120));
}

#[test]
fn large_calls_and_sends_return_before_a_late_peer_and_run_as_kernels() {
    use ringreduce::Form;
    if let Some(env) = as_rank() {
        let (rank, world, device, mut comm, stream) = auto_rank_with_stream(&env);
        let op = ReduceOp::Sum;
        // Above the sizes where Auto ran the ring across processes (the all-reduce's one-shot
        // limit, 32 MiB × 2/n; the other collectives' 4 MiB crossing a rank's links).
        let count = (8 << 20) + 5;
        let per = (2 << 20) + 3;
        let want_ar: Vec<f32> = (0..count).map(|k| expected_value(op, world, k)).collect();
        let want_ag: Vec<f32> = (0..world).flat_map(|r| values(op, r, per)).collect();
        let mut buf = GpuBuffer::from_host(device, &values(op, rank, count)).unwrap();
        let mine = GpuBuffer::from_host(device, &values(op, rank, per)).unwrap();
        let mut all = GpuBuffer::<f32>::zeroed(device, world * per).unwrap();
        // A pipeline's ring of sends: rank r to r + 1, of one count each.
        let ring: Vec<Transfer> = (0..world)
            .map(|from| Transfer {
                from,
                to: (from + 1) % world,
                count: per,
            })
            .collect();
        let before = (rank + world - 1) % world;
        let mut got = GpuBuffer::<f32>::zeroed(device, per).unwrap();
        // Each shape prepared by a first call, in step (those meet on the hosts).
        comm.all_reduce_in_place(&mut buf, op).unwrap();
        comm.collective(&Collective::AllGather, Some(&mine), Some(&mut all), op)
            .unwrap();
        assert_eq!(all.to_host().unwrap(), want_ag, "rank {rank} all-gather");
        let form = |comm: &RankCommunicator| comm.last_ran().map(|r| r.form);
        assert_eq!(form(&comm), Some(Form::StepsKernel), "rank {rank}");
        comm.send_recv(&ring, &[&mine], &mut [&mut got]).unwrap();
        assert_eq!(
            got.to_host().unwrap(),
            values(op, before, per),
            "rank {rank}"
        );
        assert_eq!(
            form(&comm),
            Some(Form::StepsKernel),
            "rank {rank} send/recv"
        );
        buf.copy_from_host(&values(op, rank, count)).unwrap();
        all.copy_from_host(&vec![0.0; world * per]).unwrap();
        got.copy_from_host(&vec![0.0; per]).unwrap();
        // Rank 1 is 2 s late: the others' calls return once enqueued.
        enqueued_before_a_late_peer(rank, || {
            // SAFETY: `buf`, `mine`, `all` and `got` are untouched until the stream is
            // synchronised.
            unsafe { comm.enqueue_all_reduce_in_place_on(&mut buf, op, &stream) }.unwrap();
            assert_eq!(form(&comm), Some(Form::TwoShotKernel), "rank {rank}");
            let ag = Collective::AllGather;
            // SAFETY: as above.
            unsafe { comm.enqueue_collective(&ag, Some(&mine), Some(&mut all), op, &stream) }
                .unwrap();
            let raw = ringreduce::device::CallerStream::of(&stream);
            // SAFETY: as above (`got` too).
            unsafe { comm.enqueue_send_recv(&ring, &[&mine], &mut [&mut got], raw) }.unwrap();
            assert_eq!(
                form(&comm),
                Some(Form::StepsKernel),
                "rank {rank} send/recv"
            );
            // A collective of no elements runs nothing and meets no one (NCCL discards it).
            let mut none = buf.view_mut(0, 0).unwrap();
            // SAFETY: as above.
            unsafe { comm.enqueue_all_reduce_in_place_on(&mut none, op, &stream) }.unwrap();
            assert_eq!(comm.last_ran(), None, "rank {rank}: an empty all-reduce");
        });
        stream.synchronize().unwrap();
        comm.synchronize().unwrap();
        assert_eq!(buf.to_host().unwrap(), want_ar, "rank {rank} all-reduce");
        assert_eq!(all.to_host().unwrap(), want_ag, "rank {rank} all-gather");
        assert_eq!(
            got.to_host().unwrap(),
            values(op, before, per),
            "rank {rank} send/recv"
        );
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "large_calls_and_sends_return_before_a_late_peer_and_run_as_kernels",
        3,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(180));
}

#[test]
fn large_first_calls_are_gated_before_a_late_peer_an_all_reduce_in_pieces() {
    use ringreduce::Form;
    if let Some(env) = as_rank() {
        let (rank, world, device, mut comm, stream) = auto_rank_with_stream(&env);
        let op = ReduceOp::Sum;
        // First calls beyond a 64 MiB arena: 160 MiB in place (pieces of 64 MiB), 80 MiB out of
        // place (pieces of 32 MiB input and output) — each piece prepared alone and gated.
        let (in_place_count, out_count) = ((40 << 20) + 5, (20 << 20) + 3);
        let want = |count: usize| -> Vec<f32> {
            (0..count).map(|k| expected_value(op, world, k)).collect()
        };
        let mut buf = GpuBuffer::from_host(device, &values(op, rank, in_place_count)).unwrap();
        let input = GpuBuffer::from_host(device, &values(op, rank, out_count)).unwrap();
        let mut output = GpuBuffer::<f32>::zeroed(device, out_count).unwrap();
        // An all-gather of 48 MiB a rank into 144 MiB: only its input is copied into the arena
        // (its peers read nothing else), so it fits whole.
        let per = (12 << 20) + 1;
        let mine = GpuBuffer::from_host(device, &values(op, rank, per)).unwrap();
        let mut all = GpuBuffer::<f32>::zeroed(device, world * per).unwrap();
        // A broadcast from rank 1 out of place and a reduce to rank 2 in place, 80 MiB each: in
        // two pieces of the steps kernel.
        let long = (20 << 20) + 7;
        let source = GpuBuffer::from_host(device, &values(op, rank, long)).unwrap();
        let mut copy = GpuBuffer::<f32>::zeroed(device, long).unwrap();
        let mut summed = GpuBuffer::from_host(device, &values(op, rank, long)).unwrap();
        let mut ran = Vec::new();
        enqueued_before_a_late_peer(rank, || {
            // SAFETY: the buffers are untouched until the stream is synchronised below.
            unsafe { comm.enqueue_all_reduce_in_place_on(&mut buf, op, &stream) }.unwrap();
            ran.push(comm.last_ran().map(|r| (r.form, r.pieces, r.copied)));
            // SAFETY: as above.
            unsafe { comm.enqueue_all_reduce_on(&input, &mut output, op, &stream) }.unwrap();
            ran.push(comm.last_ran().map(|r| (r.form, r.pieces, r.copied)));
            let ag = Collective::AllGather;
            // SAFETY: as above.
            unsafe { comm.enqueue_collective(&ag, Some(&mine), Some(&mut all), op, &stream) }
                .unwrap();
            ran.push(comm.last_ran().map(|r| (r.form, r.pieces, r.copied)));
            let bcast = Collective::Broadcast { root: 1 };
            let from = (rank == 1).then_some(&source);
            // SAFETY: as above.
            unsafe { comm.enqueue_collective(&bcast, from, Some(&mut copy), op, &stream) }.unwrap();
            ran.push(comm.last_ran().map(|r| (r.form, r.pieces, r.copied)));
            let reduce = Collective::Reduce { root: 2 };
            // SAFETY: as above.
            unsafe { comm.enqueue_collective_in_place(&reduce, &mut summed, op, &stream) }.unwrap();
            ran.push(comm.last_ran().map(|r| (r.form, r.pieces, r.copied)));
        });
        assert_eq!(
            ran,
            [
                Some((Form::TwoShotKernel, 3, true)),
                Some((Form::TwoShotKernel, 3, true)),
                Some((Form::StepsKernel, 1, true)),
                Some((Form::StepsKernel, 2, true)),
                Some((Form::StepsKernel, 2, true)),
            ],
            "rank {rank}"
        );
        stream.synchronize().unwrap();
        comm.synchronize().unwrap();
        assert!(
            buf.to_host().unwrap() == want(in_place_count),
            "rank {rank} in place"
        );
        assert!(
            output.to_host().unwrap() == want(out_count),
            "rank {rank} out of place"
        );
        let want_ag: Vec<f32> = (0..world).flat_map(|r| values(op, r, per)).collect();
        assert!(all.to_host().unwrap() == want_ag, "rank {rank} all-gather");
        assert!(
            copy.to_host().unwrap() == values(op, 1, long),
            "rank {rank} broadcast"
        );
        if rank == 2 {
            assert!(
                summed.to_host().unwrap() == want(long),
                "rank {rank} reduce"
            );
        }
        // Whole calls that differ only in their last piece are named at the first, before any
        // piece touches a buffer: by the call itself where a piece's gate failed before the
        // next piece was published, else by the next synchronisation.
        let (rank_1, others) = ((40 << 20) + 44, (40 << 20) + 24);
        let len = if rank == 1 { rank_1 } else { others };
        let mut buf = GpuBuffer::from_host(device, &vec![2.0f32; len]).unwrap();
        // SAFETY: `buf` is untouched until the stream is synchronised below.
        let called = unsafe { comm.enqueue_all_reduce_in_place_on(&mut buf, op, &stream) };
        stream.synchronize().unwrap();
        let err = match called {
            Err(err) => err,
            Ok(()) => comm.synchronize().unwrap_err(),
        };
        assert_rank_1_mismatch(rank, &err, &rank_1.to_string(), &others.to_string());
        assert!(
            buf.to_host().unwrap() == vec![2.0; len],
            "rank {rank}: untouched"
        );
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "large_first_calls_are_gated_before_a_late_peer_an_all_reduce_in_pieces",
        3,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(200));
}

#[test]
fn large_block_first_calls_run_in_strided_pieces_before_a_late_peer() {
    use ringreduce::Form;
    if let Some(env) = as_rank() {
        let (rank, world, device, mut comm, stream) = auto_rank_with_stream(&env);
        let op = ReduceOp::Sum;
        // Reduce-scatters, all-gathers and an all-to-all whose copied buffers exceed a 64 MiB
        // arena (16 M f32): each runs as pieces of its blocks, every caller's buffer copied in
        // and out block by block — prepared alone and gated, so enqueued before rank 1 arrives.
        let (rs, rs_in_place) = ((6 << 20) + 5, (6 << 20) + 3);
        let (ag, ag_in_place, a2a) = ((17 << 20) + 1, (6 << 20) + 1, (6 << 20) + 9);
        let rs_input = GpuBuffer::from_host(device, &values(op, rank, world * rs)).unwrap();
        let mut rs_output = GpuBuffer::<f32>::zeroed(device, rs).unwrap();
        let mut rs_buf =
            GpuBuffer::from_host(device, &values(op, rank, world * rs_in_place)).unwrap();
        let ag_input = GpuBuffer::from_host(device, &values(op, rank, ag)).unwrap();
        let mut ag_output = GpuBuffer::<f32>::zeroed(device, world * ag).unwrap();
        let mut own_block = vec![0.0f32; world * ag_in_place];
        own_block[rank * ag_in_place..(rank + 1) * ag_in_place].copy_from_slice(&values(
            op,
            rank,
            ag_in_place,
        ));
        let mut ag_buf = GpuBuffer::from_host(device, &own_block).unwrap();
        let a2a_input = GpuBuffer::from_host(device, &values(op, rank, world * a2a)).unwrap();
        let mut a2a_output = GpuBuffer::<f32>::zeroed(device, world * a2a).unwrap();
        let mut ran = Vec::new();
        enqueued_before_a_late_peer(rank, || {
            let (reduce_scatter, all_gather) = (Collective::ReduceScatter, Collective::AllGather);
            // SAFETY: the buffers are untouched until the stream is synchronised below.
            unsafe {
                comm.enqueue_collective(
                    &reduce_scatter,
                    Some(&rs_input),
                    Some(&mut rs_output),
                    op,
                    &stream,
                )
            }
            .unwrap();
            ran.push(comm.last_ran().map(|r| (r.form, r.pieces, r.copied)));
            // SAFETY: as above.
            unsafe { comm.enqueue_collective_in_place(&reduce_scatter, &mut rs_buf, op, &stream) }
                .unwrap();
            ran.push(comm.last_ran().map(|r| (r.form, r.pieces, r.copied)));
            // SAFETY: as above.
            unsafe {
                comm.enqueue_collective(
                    &all_gather,
                    Some(&ag_input),
                    Some(&mut ag_output),
                    op,
                    &stream,
                )
            }
            .unwrap();
            ran.push(comm.last_ran().map(|r| (r.form, r.pieces, r.copied)));
            // SAFETY: as above.
            unsafe { comm.enqueue_collective_in_place(&all_gather, &mut ag_buf, op, &stream) }
                .unwrap();
            ran.push(comm.last_ran().map(|r| (r.form, r.pieces, r.copied)));
            let all_to_all = Collective::AllToAll;
            // SAFETY: as above.
            unsafe {
                comm.enqueue_collective(
                    &all_to_all,
                    Some(&a2a_input),
                    Some(&mut a2a_output),
                    op,
                    &stream,
                )
            }
            .unwrap();
            ran.push(comm.last_ran().map(|r| (r.form, r.pieces, r.copied)));
        });
        let steps = |pieces| Some((Form::StepsKernel, pieces, true));
        assert_eq!(
            ran,
            [steps(2), steps(2), steps(5), steps(2), steps(3)],
            "rank {rank}"
        );
        stream.synchronize().unwrap();
        comm.synchronize().unwrap();
        let block_of_sum = |count: usize| -> Vec<f32> {
            (0..count)
                .map(|k| expected_value(op, world, rank * count + k))
                .collect()
        };
        assert!(
            rs_output.to_host().unwrap() == block_of_sum(rs),
            "rank {rank} reduce-scatter"
        );
        let in_place = rs_buf.to_host().unwrap();
        let mine = &in_place[rank * rs_in_place..(rank + 1) * rs_in_place];
        assert!(
            mine == block_of_sum(rs_in_place),
            "rank {rank} reduce-scatter in place"
        );
        let gathered =
            |per: usize| -> Vec<f32> { (0..world).flat_map(|r| values(op, r, per)).collect() };
        assert!(
            ag_output.to_host().unwrap() == gathered(ag),
            "rank {rank} all-gather"
        );
        assert!(
            ag_buf.to_host().unwrap() == gathered(ag_in_place),
            "rank {rank} all-gather in place"
        );
        let exchanged: Vec<f32> = (0..world)
            .flat_map(|from| (0..a2a).map(move |k| input_value(op, from, rank * a2a + k)))
            .collect();
        assert!(
            a2a_output.to_host().unwrap() == exchanged,
            "rank {rank} all-to-all"
        );
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "large_block_first_calls_run_in_strided_pieces_before_a_late_peer",
        3,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(200));
}

#[test]
fn long_and_fanned_in_send_recvs_run_in_pieces_before_a_late_peer() {
    use ringreduce::Form;
    if let Some(env) = as_rank() {
        let (rank, _, device, mut comm, stream) = auto_rank_with_stream(&env);
        let t = |from, to, count| Transfer { from, to, count };
        // A pipeline's sends, the first longer than a 64 MiB arena (16 M f32): two pieces, the
        // first rank 0 → 1 alone (rank 2 takes no part), the second the rest of it and 1 → 2.
        let pipeline = [t(0, 1, (20 << 20) + 3), t(1, 2, 2 << 20)];
        // A fan-in of ten sends to rank 1, from ranks 0 and 2 in turn: more receives than the
        // steps kernel runs (eight), so two pieces.
        let fan_in: Vec<Transfer> = (0..10).map(|i| t(2 * (i % 2), 1, 1000 + i)).collect();
        // Transfer i's payload: distinct per transfer, exact in f32.
        let payload = |i: usize, count: usize| -> Vec<f32> {
            (0..count).map(|k| (i * 1000 + k % 997) as f32).collect()
        };
        let ends = |list: &[Transfer]| {
            let sends: Vec<GpuBuffer<f32>> = (list.iter().enumerate())
                .filter(|(_, x)| x.from == rank)
                .map(|(i, x)| GpuBuffer::from_host(device, &payload(i, x.count)).unwrap())
                .collect();
            let recvs: Vec<GpuBuffer<f32>> = (list.iter())
                .filter(|x| x.to == rank)
                .map(|x| GpuBuffer::<f32>::zeroed(device, x.count).unwrap())
                .collect();
            (sends, recvs)
        };
        let (mut lists, mut ran) = (Vec::new(), Vec::new());
        for list in [&pipeline[..], &fan_in[..]] {
            lists.push((list, ends(list)));
        }
        enqueued_before_a_late_peer(rank, || {
            let raw = ringreduce::device::CallerStream::of(&stream);
            for (list, (sends, recvs)) in &mut lists {
                let sends: Vec<&GpuBuffer<f32>> = sends.iter().collect();
                let mut recvs: Vec<&mut GpuBuffer<f32>> = recvs.iter_mut().collect();
                // SAFETY: every buffer is untouched until the stream is synchronised below.
                unsafe { comm.enqueue_send_recv(list, &sends, &mut recvs, raw) }.unwrap();
                ran.push(comm.last_ran().map(|r| (r.form, r.pieces)));
            }
        });
        let pieces = Some((Form::StepsKernel, 2));
        assert_eq!(ran, [pieces, pieces], "rank {rank}");
        stream.synchronize().unwrap();
        comm.synchronize().unwrap();
        for (list, (_, recvs)) in &lists {
            let mine = (list.iter().enumerate()).filter(|(_, x)| x.to == rank);
            for ((i, x), got) in mine.zip(recvs) {
                let want = payload(i, x.count);
                assert!(got.to_host().unwrap() == want, "rank {rank}'s receive {i}");
            }
        }
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "long_and_fanned_in_send_recvs_run_in_pieces_before_a_late_peer",
        3,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(120));
}

/// NCCL's 0-byte send/recv (what an all-to-all with empty pairs makes): a group of empty
/// transfers alone is enqueued before a late peer as the steps kernel's barriers alone, and
/// synchronises on the GPUs — a rank's stream is done only once the late peer's kernel ran.
#[test]
fn empty_send_recvs_return_before_a_late_peer_and_meet_on_the_gpus() {
    use ringreduce::Form;
    if let Some(env) = as_rank() {
        let (rank, _, device, mut comm, stream) = auto_rank_with_stream(&env);
        let t = |from, to, count| Transfer { from, to, count };
        // Ranks 0 and 1 exchange nothing; rank 2 takes no part.
        let list = [t(0, 1, 0), t(1, 0, 0)];
        let party = usize::from(rank < 2);
        let sends: Vec<GpuBuffer<f32>> = (0..party)
            .map(|_| GpuBuffer::zeroed(device, 0).unwrap())
            .collect();
        let mut recvs: Vec<GpuBuffer<f32>> = (0..party)
            .map(|_| GpuBuffer::zeroed(device, 0).unwrap())
            .collect();
        let mut ran = None;
        enqueued_before_a_late_peer(rank, || {
            let raw = ringreduce::device::CallerStream::of(&stream);
            let sends: Vec<&GpuBuffer<f32>> = sends.iter().collect();
            let mut recvs: Vec<&mut GpuBuffer<f32>> = recvs.iter_mut().collect();
            // SAFETY: no buffer holds an element; the stream is synchronised below.
            unsafe { comm.enqueue_send_recv(&list, &sends, &mut recvs, raw) }.unwrap();
            ran = comm.last_ran().map(|r| r.form);
        });
        assert_eq!(ran, Some(Form::StepsKernel), "rank {rank}");
        // Rank 1 enqueued 2 s after the others: their streams wait at the kernel's barriers
        // for its kernel.
        let started = std::time::Instant::now();
        stream.synchronize().unwrap();
        let waited = started.elapsed();
        assert!(
            rank == 1 || waited > Duration::from_secs(1),
            "rank {rank}'s stream finished {waited:?} after the call, before the late peer's"
        );
        comm.synchronize().unwrap();
        return;
    }
    if two_gpus_or_shared().is_none() {
        return;
    }
    let ranks = launch(
        "empty_send_recvs_return_before_a_late_peer_and_meet_on_the_gpus",
        3,
        |_| vec![],
    );
    expect_success(ranks, Duration::from_secs(120));
}
