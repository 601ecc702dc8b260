//! NCCL's point-to-point calls and groups: `ncclSend`/`ncclRecv` (and `ncclGather`/`ncclScatter`,
//! built of them) are kept until their group ends, then run.

use crate::*;

/// One `ncclSend` or `ncclRecv`, kept until its group ends.
pub(crate) struct PointToPoint {
    pub(crate) comm: ncclComm_t,
    pub(crate) send: bool,
    pub(crate) address: u64,
    pub(crate) count: usize,
    pub(crate) datatype: ncclDataType_t,
    pub(crate) peer: usize,
    pub(crate) stream: cudaStream_t,
}

thread_local! {
    /// How deep this thread is in `ncclGroupStart`/`ncclGroupEnd` pairs.
    static GROUP_DEPTH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// The sends and receives of this thread's open group, in call order.
    static PENDING: std::cell::RefCell<Vec<PointToPoint>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Keeps a send or receive for its group's end (runs it at once outside a group).
///
/// # Safety
/// NCCL's contract for the call.
pub(crate) unsafe fn point_to_point(op: PointToPoint) -> ncclResult_t {
    guarded(|| {
        // SAFETY: our caller's contract.
        let comm = unsafe { comm_ref(op.comm) }?;
        if op.peer >= comm.world {
            return Err(invalid(format!(
                "peer {} is not a rank of {}",
                op.peer, comm.world
            )));
        }
        dtype_of(op.datatype)?;
        PENDING.with(|p| p.borrow_mut().push(op));
        match GROUP_DEPTH.with(|d| d.get()) {
            // SAFETY: the kept calls' contracts, passed on.
            0 => unsafe { flush() },
            _ => Ok(()),
        }
    })
}

/// `ncclGather`: every rank's `count` elements into block `rank` of the root's `recvbuff`, as
/// one group of sends and receives.
#[no_mangle]
pub unsafe extern "C" fn ncclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclGather",
        fn(*const c_void, *mut c_void, usize, ncclDataType_t, c_int, *mut c_void, cudaStream_t),
        |real| (sendbuff, recvbuff, count, datatype, root, real, stream)
    );
    // SAFETY: NCCL's contract for the call, passed on.
    unsafe {
        rooted(
            true, sendbuff, recvbuff, count, datatype, root, comm, stream,
        )
    }
}

/// `ncclScatter`: block `rank` of the root's `sendbuff` (`count` elements) into every rank's
/// `recvbuff`, as one group of sends and receives.
#[no_mangle]
pub unsafe extern "C" fn ncclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclScatter",
        fn(*const c_void, *mut c_void, usize, ncclDataType_t, c_int, *mut c_void, cudaStream_t),
        |real| (sendbuff, recvbuff, count, datatype, root, real, stream)
    );
    // SAFETY: NCCL's contract for the call, passed on.
    unsafe {
        rooted(
            false, sendbuff, recvbuff, count, datatype, root, comm, stream,
        )
    }
}

/// Gather (`gather`) or scatter as a group of sends and receives: every rank's block to or from
/// the root, the root's own block a transfer to itself (a local copy). Inside the caller's group
/// it joins that group, as NCCL's do.
///
/// # Safety
/// NCCL's contract for `ncclGather` / `ncclScatter`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rooted(
    gather: bool,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    // SAFETY: our caller's contract.
    let placed = unsafe { place(comm) }.and_then(|(rank, world)| {
        Ok((
            rank,
            world,
            root_of(root, world)?,
            dtype_of(datatype)?.size_bytes(),
        ))
    });
    let (rank, world, root, bytes) = match placed {
        Ok(placed) => placed,
        Err(failure) => return guarded(|| Err(failure)),
    };
    if count.checked_mul(world * bytes).is_none() {
        return guarded(|| {
            Err(invalid(format!(
                "{world} blocks of {count} elements overflow"
            )))
        });
    }
    let block = |base: u64, r: usize| base + (r * count * bytes) as u64;
    let mut ops = Vec::new();
    let end = |send: bool, address: u64, peer: usize| PointToPoint {
        comm,
        send,
        address,
        count,
        datatype,
        peer,
        stream,
    };
    if rank == root {
        for r in 0..world {
            ops.push(match gather {
                true => end(false, block(recvbuff as u64, r), r),
                false => end(true, block(sendbuff as u64, r), r),
            });
        }
    }
    ops.push(match gather {
        true => end(true, sendbuff as u64, root),
        false => end(false, recvbuff as u64, root),
    });
    let started = ncclGroupStart();
    if started != ncclSuccess {
        return started;
    }
    let mut result = ncclSuccess;
    for op in ops {
        // SAFETY: NCCL's contract for the blocks of the caller's buffers, passed on.
        let r = unsafe { point_to_point(op) };
        if result == ncclSuccess {
            result = r;
        }
    }
    // The group closes whatever the calls said; the first failure is returned.
    match (result, ncclGroupEnd()) {
        (ncclSuccess, ended) => ended,
        (failed, _) => failed,
    }
}

/// `ncclSend`: `count` elements to `peer`, matched by its `ncclRecv` from this rank of the same
/// turn, in call order (when its group ends).
#[no_mangle]
pub unsafe extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclSend",
        fn(*const c_void, usize, ncclDataType_t, c_int, *mut c_void, cudaStream_t),
        |real| (sendbuff, count, datatype, peer, real, stream)
    );
    // SAFETY: NCCL's contract for the call, passed on.
    unsafe {
        point_to_point(PointToPoint {
            comm,
            send: true,
            address: sendbuff as u64,
            count,
            datatype,
            peer: usize::try_from(peer).unwrap_or(usize::MAX),
            stream,
        })
    }
}

/// `ncclRecv`: `count` elements from `peer`, matched by its `ncclSend`.
#[no_mangle]
pub unsafe extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclRecv",
        fn(*mut c_void, usize, ncclDataType_t, c_int, *mut c_void, cudaStream_t),
        |real| (recvbuff, count, datatype, peer, real, stream)
    );
    // SAFETY: NCCL's contract for the call, passed on.
    unsafe {
        point_to_point(PointToPoint {
            comm,
            send: false,
            address: recvbuff as u64,
            count,
            datatype,
            peer: usize::try_from(peer).unwrap_or(usize::MAX),
            stream,
        })
    }
}

/// Runs the kept sends and receives, one group per communicator, enqueued on the group's stream:
/// on the point-to-point channel where the communicator has one ([`flush_channel`]); else one
/// grouped send/recv per communicator (per pair of ranks on a communicator of more than two:
/// module `pairs`, then module `transfers`).
///
/// # Safety
/// The kept calls' contracts: live communicators, device buffers of their lengths, live streams.
pub(crate) unsafe fn flush() -> Result<(), Failure> {
    let pending = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    let mut comms: Vec<ncclComm_t> = Vec::new();
    for op in &pending {
        if !comms.contains(&op.comm) {
            comms.push(op.comm);
        }
    }
    // In an order every rank shares (each exchange waits for every rank of its communicator).
    // SAFETY: our caller's contract: live handles (checked for null when kept).
    comms.sort_by_key(|&c| unsafe { c.as_ref() }.map_or(0, |c| c.job));
    for handle in comms {
        let ops: Vec<&PointToPoint> = pending.iter().filter(|op| op.comm == handle).collect();
        // SAFETY: our caller's contract: a live handle (checked for null when kept).
        let comm = unsafe { comm_ref(handle) }?;
        if comm.with(|c| Ok(c.has_peer_groups())).unwrap_or(false) {
            // SAFETY: our caller's contract, passed on.
            unsafe { flush_channel(comm, &ops) }?;
            continue;
        }
        match &comm.pairs {
            // SAFETY: our caller's contract, passed on.
            Some(pairs) if comm.world > 2 => unsafe { pairs::flush_pairs(comm, pairs, &ops) }?,
            // Two ranks (the communicator is the pair), or ranks across hosts.
            // SAFETY: as above.
            _ => unsafe { transfers::flush_one(handle, &ops) }?,
        }
    }
    Ok(())
}

/// [`flush`] for one communicator's `ops` on ringreduce's point-to-point channel
/// (`RankCommunicator::enqueue_peer_group`): one process per GPU on one host, any number of
/// ranks. Each send meets its receive per direction, in call order, on the GPUs, whatever the
/// peer grouped with it — NCCL's contract — and the call returns once enqueued. Sends to the
/// rank itself are copies on its stream. A group this library cannot run (streams mixed, more
/// than the channel's 64 sends and receives, sends to itself that its receives do not match) is
/// refused before anything is enqueued and gives the communicator up, so that its peers, which
/// do not know, are not left waiting for it. A group over several communicators runs one
/// communicator's kernel after another on the caller's stream (NCCL progresses them as one
/// launch): a peer that makes those transfers in the other communicators' order may wait for
/// ever; PyTorch's groups are of one process group.
///
/// # Safety
/// As for [`flush`].
unsafe fn flush_channel(comm: &Comm, ops: &[&PointToPoint]) -> Result<(), Failure> {
    fallback::log("ncclSend/ncclRecv", "ringreduce (channel)");
    let me = comm.rank;
    let (own, cross): (Vec<&PointToPoint>, Vec<&PointToPoint>) =
        ops.iter().copied().partition(|op| op.peer == me);
    let stream = ops[0].stream;
    let refused = if cross.iter().any(|op| op.stream != stream) {
        Some("mixes streams on one communicator".to_string())
    } else if cross.len() > ringreduce::internal::kernels::CHANNEL_MAX_OPS {
        Some(format!(
            "holds {} sends and receives on one communicator, more than the {} ringreduce-nccl \
             runs in one group",
            cross.len(),
            ringreduce::internal::kernels::CHANNEL_MAX_OPS
        ))
    } else {
        None
    };
    let give_up = |failure| give_up(comm, failure);
    if let Some(why) = refused {
        return Err(give_up(unsupported(format!(
            "rank {me}'s group of sends and receives {why}, which ringreduce-nccl does not run; \
             the communicator is given up so that its peers do not wait for the group"
        ))));
    }
    if !own.is_empty() {
        // SAFETY: our caller's contract, passed on.
        unsafe { pairs::copy_to_self(comm, &own) }.map_err(give_up)?;
    }
    if cross.is_empty() {
        return Ok(());
    }
    let mut peer_ops = Vec::with_capacity(cross.len());
    for op in &cross {
        let dtype = dtype_of(op.datatype)?;
        // SAFETY: NCCL's contract for the call: device memory of this rank's GPU of `count`
        // elements, untouched until the stream passes the group.
        peer_ops.push(unsafe {
            ringreduce::PeerOp::from_raw(op.peer, op.send, op.address, op.count, dtype, comm.device)
        });
    }
    // SAFETY: our caller's contract: a live stream.
    let stream = unsafe { CallerStream::from_raw(stream.cast()) }?;
    comm.with(|c| {
        // SAFETY: NCCL's contract for the calls, passed on.
        unsafe { c.enqueue_peer_group(&peer_ops, stream) }.map_err(Failure::from)
    })
}

/// Gives `comm` up (aborts it) and returns `failure`: for a group refused or failed after its
/// peers may have started theirs, so that they fail at once instead of waiting for it.
pub(crate) fn give_up(comm: &Comm, failure: Failure) -> Failure {
    if let Backend::Ring(_, abort) = &comm.backend {
        abort.abort();
    }
    failure
}

/// `ncclGroupStart`: collectives inside a group are enqueued as they are called (one rank per
/// process: nothing waits for the group's end); sends and receives wait for it.
#[no_mangle]
pub extern "C" fn ncclGroupStart() -> ncclResult_t {
    let started = group_of_nccl(c"ncclGroupStart");
    if started == ncclSuccess {
        GROUP_DEPTH.with(|d| d.set(d.get() + 1));
    }
    started
}

/// NCCL's own group call, when NCCL runs communicators of this process (its grouped calls on
/// them need it); success otherwise.
pub(crate) fn group_of_nccl(name: &CStr) -> ncclResult_t {
    if !fallback::made_any() {
        return ncclSuccess;
    }
    type F = unsafe extern "C" fn() -> ncclResult_t;
    // SAFETY: NCCL's documented signature for both group calls.
    match unsafe { real::<F>(name) } {
        // SAFETY: as above.
        Ok(f) => unsafe { f() },
        Err(code) => code,
    }
}

/// `ncclGroupEnd`.
#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> ncclResult_t {
    // The group closes here whatever NCCL's own end says; the first failure is returned.
    let nccl = group_of_nccl(c"ncclGroupEnd");
    let ours = guarded(|| {
        GROUP_DEPTH.with(|d| match d.get() {
            0 => Err(Failure::Nccl(
                ncclInvalidUsage,
                "ncclGroupEnd without ncclGroupStart".into(),
            )),
            1 => {
                d.set(0);
                // SAFETY: the kept calls' contracts (NCCL's for each send and receive).
                unsafe { flush() }
            }
            n => {
                d.set(n - 1);
                Ok(())
            }
        })
    });
    match nccl {
        ncclSuccess => ours,
        failed => failed,
    }
}

/// `ncclGroupSimulateEnd`: ends the group like `ncclGroupEnd` but launches nothing, and fills
/// in NCCL's estimate of its time — in NCCL's order: the group level closes first, whatever
/// follows; at the outermost level a null `simInfo` makes it a plain `ncclGroupEnd`. The estimate
/// is NCCL's to make: with NCCL's communicators only, NCCL answers. With ringreduce's, whose
/// collectives run when called (a simulated group's collectives have run, and written their
/// buffers, by the time it ends), the group's kept sends and receives are dropped — a simulation
/// launches nothing — and the call says it cannot estimate (`ncclInvalidUsage`).
#[no_mangle]
pub unsafe extern "C" fn ncclGroupSimulateEnd(sim_info: *mut ncclSimInfo_t) -> ncclResult_t {
    if sim_info.is_null() {
        return ncclGroupEnd();
    }
    let nccl = if fallback::made_any() {
        type F = unsafe extern "C" fn(*mut ncclSimInfo_t) -> ncclResult_t;
        // SAFETY: NCCL's documented signature; the caller's struct.
        match unsafe { real::<F>(c"ncclGroupSimulateEnd") } {
            // SAFETY: as above.
            Ok(f) => unsafe { f(sim_info) },
            Err(code) => code,
        }
    } else {
        ncclSuccess
    };
    let ours = guarded(|| {
        let outermost = GROUP_DEPTH.with(|d| match d.get() {
            0 => Err(Failure::Nccl(
                ncclInvalidUsage,
                "ncclGroupSimulateEnd without ncclGroupStart".into(),
            )),
            n => {
                d.set(n - 1);
                Ok(n == 1)
            }
        })?;
        if !outermost {
            return Ok(());
        }
        let kept = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut())).len();
        // SAFETY: checked non-null above; NCCL's contract: an initialized ncclSimInfo_t.
        if unsafe { (*sim_info).magic } != NCCL_SIM_INFO_MAGIC {
            return Err(invalid(
                "simInfo was not initialized with NCCL_SIM_INFO_INITIALIZER",
            ));
        }
        if kept > 0 || !fallback::made_any() {
            return Err(unsupported(
                "ringreduce-nccl cannot estimate a group's time (ncclGroupSimulateEnd): its collectives run when called",
            ));
        }
        Ok(())
    });
    match nccl {
        ncclSuccess => ours,
        failed => failed,
    }
}
