//! Every collective on four host ranks (one thread per rank, the same checked plans a GPU
//! communicator would run): what each one computes, shown on tiny buffers, then each proved by
//! the checker at 1 Mi elements in both of its forms — the ring's (copy-engine pushes) and the
//! one-shot's (direct reads between two barriers; send/recv has none) — and run at a prime count
//! against the host reference.
//!
//! Runs without a GPU: `cargo run --release --example 11_collectives`.

use ringreduce::check::check;
use ringreduce::plan::{Collective, CollectiveSpec, EdgeTransport, OneShotSpec, Op, Transfer};
use ringreduce::verify::{compare, expected_value, input_value};
use ringreduce::{Communicator, ReduceOp};

fn main() -> ringreduce::Result<()> {
    let world = 4;
    let comm = Communicator::host(world)?;

    // Rank r's input: r·10 + index, so every value says where it came from.
    let input =
        |r: usize, len: usize| -> Vec<i32> { (0..len).map(|i| (r * 10 + i) as i32).collect() };

    let inputs: Vec<Vec<i32>> = (0..world).map(|r| input(r, 2 * world)).collect();
    let mut outs = vec![vec![0; 2]; world];
    comm.reduce_scatter(&inputs, &mut outs, ReduceOp::Sum)?;
    println!("reduce-scatter (rank r gets block r of the sum): {outs:?}");

    let inputs: Vec<Vec<i32>> = (0..world).map(|r| input(r, 2)).collect();
    let mut outs = vec![vec![0; 2 * world]; world];
    comm.all_gather(&inputs, &mut outs)?;
    println!("all-gather (every rank gets every block): {:?}", outs[0]);

    let mut bufs: Vec<Vec<i32>> = (0..world).map(|r| input(r, 3)).collect();
    comm.broadcast_in_place(&mut bufs, 2)?;
    println!("broadcast from rank 2, in place: {bufs:?}");

    let inputs: Vec<Vec<i32>> = (0..world).map(|r| input(r, 3)).collect();
    let mut root_out = vec![0; 3];
    comm.reduce(&inputs, &mut root_out, 1, ReduceOp::Max)?;
    println!("reduce (max) into rank 1: {root_out:?}");

    let inputs: Vec<Vec<i32>> = (0..world).map(|r| input(r, world)).collect();
    let mut outs = vec![vec![0; world]; world];
    comm.all_to_all(&inputs, &mut outs)?;
    println!("all-to-all (rank r's block j = rank j's block r): {outs:?}");

    let pairs: Vec<(usize, usize)> = (0..world).map(|r| (r, (r + 1) % world)).collect();
    let sends: Vec<Vec<i32>> = (0..world).map(|r| input(r, 2)).collect();
    let mut recvs = vec![vec![0; 2]; world];
    comm.send_recv(&pairs, &sends, &mut recvs)?;
    println!("send/recv, a pipeline r → r+1 in one call: {recvs:?}");

    // Every collective's plan proved at 1 Mi elements (shape, enqueue, races over two calls,
    // the symbolic result).
    let transfers = (0..world)
        .map(|r| Transfer {
            from: r,
            to: (r + 1) % world,
            count: 1 << 20,
        })
        .collect();
    for c in [
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast { root: 0 },
        Collective::Reduce { root: 3 },
        Collective::AllToAll,
        Collective::SendRecv { transfers },
    ] {
        let spec = CollectiveSpec::new(c.clone(), world, 1 << 20, 1 << 16, 3, EdgeTransport::Peer);
        let plan = spec.build()?;
        match check(&plan) {
            Ok(()) => println!(
                "{:>14}: ring form {} instructions, {} events, proved",
                c.name(),
                plan.len(),
                plan.events.len()
            ),
            Err(e) => println!("{:>14}: ring form REJECTED: {e}", c.name()),
        }
        if matches!(c, Collective::SendRecv { .. }) {
            continue; // no one-shot form: its ranks do not all take part
        }
        let oneshot = OneShotSpec {
            world,
            count: 1 << 20,
            in_place: false,
            op: ReduceOp::Sum,
        }
        .build_collective(&c)?;
        let meetings = oneshot.ranks[0]
            .iter()
            .filter(|i| matches!(i.op, Op::PeerReduce { .. }))
            .count();
        match check(&oneshot) {
            Ok(()) => println!(
                "{:>14}: one-shot form, {meetings} meeting(s) per rank, proved",
                c.name()
            ),
            Err(e) => println!("{:>14}: one-shot form REJECTED: {e}", c.name()),
        }
    }

    // A prime count, every rank checked against the host reference.
    let count = 1009;
    let inputs: Vec<Vec<f32>> = (0..world)
        .map(|r| {
            (0..world * count)
                .map(|i| input_value(ReduceOp::Avg, r, i))
                .collect()
        })
        .collect();
    let mut outs = vec![vec![0f32; count]; world];
    comm.reduce_scatter(&inputs, &mut outs, ReduceOp::Avg)?;
    let mut wrong = 0;
    for (r, out) in outs.iter().enumerate() {
        let want: Vec<f32> = (0..count)
            .map(|k| expected_value(ReduceOp::Avg, world, r * count + k))
            .collect();
        wrong += compare(r, out, &want, 4).0;
    }
    println!("reduce-scatter (avg) of {count} f32 per rank: {wrong} wrong");
    comm.close()
}
