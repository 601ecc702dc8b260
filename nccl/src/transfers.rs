//! Groups of sends and receives as lists of transfers, on a communicator without the
//! point-to-point channel (module `p2p` runs groups there): every transfer of a group is one
//! entry of a job-wide list (`ringreduce::Transfer`), which every rank of the communicator runs
//! as one call — on two ranks of one host (a pair's communicator, module `pairs`, or one of two)
//! each rank builds the list from its own calls alone ([`flush_two`]); across hosts the ranks
//! exchange what each sends and receives, and every rank builds the same list from it
//! ([`matched_transfers`]).

use crate::p2p::{give_up, PointToPoint};
use crate::*;

/// [`flush`] for one communicator's `ops`.
///
/// # Safety
/// As for [`flush`].
pub(crate) unsafe fn flush_one(handle: ncclComm_t, ops: &[&PointToPoint]) -> Result<(), Failure> {
    fallback::log("ncclSend/ncclRecv", "ringreduce");
    // SAFETY: our caller's contract.
    let comm = unsafe { comm_ref(handle) }?;
    if comm.world == 2 && comm.with(|c| Ok(c.hosts().hosts == 1))? {
        // SAFETY: our caller's contract, passed on.
        return unsafe { flush_two(comm, ops) };
    }
    let (stream, datatype) = (ops[0].stream, ops[0].datatype);
    // A group this rank cannot run is still exchanged (flagged), so that its peers fail at once
    // with it instead of waiting for it at the timeout.
    let uniform = ops
        .iter()
        .all(|op| op.stream == stream && op.datatype == datatype);
    let mut words = vec![u64::from(uniform), datatype as u64];
    words.extend(
        ops.iter()
            .flat_map(|op| [u64::from(op.send), op.peer as u64, op.count as u64]),
    );
    let mut records = comm.with(|c| c.exchange(&words).map_err(Failure::from))?;
    if let Some(q) = records.iter().position(|r| r.first() != Some(&1)) {
        return Err(unsupported(format!(
            "rank {q}'s group of sends and receives mixes streams or data types on one \
             communicator, which ringreduce-nccl does not run"
        )));
    }
    if let Some(q) = records
        .iter()
        .position(|r| r.get(1) != Some(&(datatype as u64)))
    {
        return Err(unsupported(format!(
            "rank {q} sends or receives another data type in this group"
        )));
    }
    for record in &mut records {
        record.drain(..2);
    }
    let transfers = matched_transfers(&records)?;
    // SAFETY: our caller's contract: a live stream.
    let stream = unsafe { CallerStream::from_raw(stream.cast()) }?;
    let me = comm.rank;
    // This rank's sends in the list's order are its sends in call order; its receives in the
    // list's order: the k-th transfer from rank p to this rank is its k-th receive from p.
    let sends: Vec<(u64, usize)> = ops
        .iter()
        .filter(|op| op.send)
        .map(|op| (op.address, op.count))
        .collect();
    let mut taken = vec![0usize; comm.world];
    let mut recvs = Vec::new();
    for t in transfers.iter().filter(|t| t.to == me) {
        let from_p: Vec<&&PointToPoint> = ops
            .iter()
            .filter(|op| !op.send && op.peer == t.from)
            .collect();
        recvs.push((from_p[taken[t.from]].address, t.count));
        taken[t.from] += 1;
    }
    // SAFETY: our caller's contract, passed on.
    ringreduce::with_element!(dtype_of(datatype)?, T => unsafe {
        send_recv::<T>(comm, &transfers, &sends, &recvs, stream)
    })
}

/// [`flush_one`] on a communicator of two ranks on one host (a pair's, or one of two), without
/// asking the peer: each rank knows the whole list — its own sends, and its receives, which name
/// the counts of its peer's sends to it (NCCL's contract) — so both build the same list, by
/// sender and in each sender's call order, and the call returns once enqueued. The list is the
/// call's shape: a peer whose sends or receives differ is named by the call gate on the GPU
/// (`CallMismatch`), before either touches the other's memory. Sends to the rank itself are
/// copies on its stream. A group this library cannot run (streams or data types mixed) is
/// refused and gives the communicator up, so that the peer, which does not know, is not left
/// waiting for it.
///
/// # Safety
/// As for [`flush`].
unsafe fn flush_two(comm: &Comm, ops: &[&PointToPoint]) -> Result<(), Failure> {
    let me = comm.rank;
    let (own, cross): (Vec<&PointToPoint>, Vec<&PointToPoint>) =
        ops.iter().copied().partition(|op| op.peer == me);
    if !own.is_empty() {
        // SAFETY: our caller's contract, passed on.
        unsafe { pairs::copy_to_self(comm, &own) }?;
    }
    let Some(first) = cross.first() else {
        return Ok(());
    };
    let (stream, datatype) = (first.stream, first.datatype);
    if !cross
        .iter()
        .all(|op| op.stream == stream && op.datatype == datatype)
    {
        return Err(give_up(
            comm,
            unsupported(format!(
                "rank {me}'s group of sends and receives mixes streams or data types on one \
             communicator, which ringreduce-nccl does not run; the communicator is given up so \
             that its peer does not wait for the group"
            )),
        ));
    }
    let own: Vec<(bool, usize)> = cross.iter().map(|op| (op.send, op.count)).collect();
    let transfers = transfers_of_two(me, &own);
    let ends = |send: bool| -> Vec<(u64, usize)> {
        cross
            .iter()
            .filter(|op| op.send == send)
            .map(|op| (op.address, op.count))
            .collect()
    };
    // SAFETY: our caller's contract: a live stream.
    let stream = unsafe { CallerStream::from_raw(stream.cast()) }?;
    // SAFETY: our caller's contract, passed on.
    ringreduce::with_element!(dtype_of(datatype)?, T => unsafe {
        send_recv::<T>(comm, &transfers, &ends(true), &ends(false), stream)
    })
}

/// The transfers of a group between the two ranks of a communicator of two, as rank `me` builds
/// them from its own calls alone (`ops`: (is a send, count) in call order, none to itself): every
/// send, by sender (rank 0's first) and in the sender's call order — its own sends, and its
/// receives as its peer's sends to it. Two ranks whose calls match build the same list;
/// otherwise the lists differ, and so do their calls' shapes.
pub(crate) fn transfers_of_two(me: usize, ops: &[(bool, usize)]) -> Vec<ringreduce::Transfer> {
    let mut transfers = Vec::new();
    for from in [0, 1] {
        for &(_, count) in ops.iter().filter(|&&(send, _)| send == (from == me)) {
            transfers.push(ringreduce::Transfer {
                from,
                to: 1 - from,
                count,
            });
        }
    }
    transfers
}

/// Enqueues this rank's ends of `transfers`: `sends` and `recvs` as (address, count), in the
/// list's order.
///
/// # Safety
/// As for [`flush`].
pub(crate) unsafe fn send_recv<T: Element>(
    comm: &Comm,
    transfers: &[ringreduce::Transfer],
    sends: &[(u64, usize)],
    recvs: &[(u64, usize)],
    stream: CallerStream,
) -> Result<(), Failure> {
    // SAFETY: the kept calls' contracts: device memory of these lengths on this GPU.
    let mem =
        |&(addr, len): &(u64, usize)| unsafe { DeviceMemory::<T>::new(addr, len, comm.device) };
    let send_mem: Vec<DeviceMemory<T>> = sends.iter().map(mem).collect();
    let mut recv_mem: Vec<DeviceMemory<T>> = recvs.iter().map(mem).collect();
    let send_refs: Vec<&DeviceMemory<T>> = send_mem.iter().collect();
    let mut recv_refs: Vec<&mut DeviceMemory<T>> = recv_mem.iter_mut().collect();
    comm.with(|c| {
        // SAFETY: our caller's contract, passed on.
        unsafe { c.enqueue_send_recv(transfers, &send_refs, &mut recv_refs, stream) }
            .map_err(Failure::from)
    })
}

/// The transfers of a group of sends and receives, from every rank's record (by rank: triples
/// of (is a send, peer, count) in call order): every send, by sender and in its call order;
/// each receive must match the send aimed at it from its peer, in order and by count.
pub(crate) fn matched_transfers(
    records: &[Vec<u64>],
) -> Result<Vec<ringreduce::Transfer>, Failure> {
    let ops = |rank: usize| {
        records[rank]
            .chunks(3)
            .map(|w| (w[0] == 1, w[1] as usize, w[2] as usize))
    };
    let mut transfers = Vec::new();
    for from in 0..records.len() {
        for (send, to, count) in ops(from) {
            if send {
                transfers.push(ringreduce::Transfer { from, to, count });
            }
        }
    }
    for to in 0..records.len() {
        for from in 0..records.len() {
            let sent: Vec<usize> = transfers
                .iter()
                .filter(|t| t.from == from && t.to == to)
                .map(|t| t.count)
                .collect();
            let received: Vec<usize> = ops(to)
                .filter(|&(send, peer, _)| !send && peer == from)
                .map(|(_, _, count)| count)
                .collect();
            if sent != received {
                return Err(unsupported(format!(
                    "rank {from} sends {sent:?} elements to rank {to}, which receives \
                     {received:?} from it: every send needs its receive, in order and of its \
                     count"
                )));
            }
        }
    }
    Ok(transfers)
}
