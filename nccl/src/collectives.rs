//! NCCL's collectives on ringreduce: each call becomes one `Call` (module doc of the crate: every
//! call runs out of place), enqueued on the caller's stream.

use crate::*;

/// ringreduce's element type for NCCL's.
pub(crate) fn dtype_of(datatype: ncclDataType_t) -> Result<DType, Failure> {
    DATA_TYPES
        .iter()
        .find(|(code, _)| *code == datatype)
        .map(|(_, dtype)| *dtype)
        .ok_or_else(|| invalid(format!("unknown data type {datatype}")))
}

/// How a call reduces: one of NCCL's built-in operators, or a PreMulSum made by
/// `ncclRedOpCreatePreMulSum` (module `redop`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Op {
    Builtin(ReduceOp),
    PreMulSum(ringreduce::PreMul),
}

/// ringreduce's operator for NCCL's `op` on `comm`, for elements of `datatype`: a built-in
/// one, or one this library made for that communicator and type.
pub(crate) fn op_of(
    comm: ncclComm_t,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
) -> Result<Op, Failure> {
    match OPS.iter().find(|(code, _)| *code == op) {
        Some(&(_, builtin)) => Ok(Op::Builtin(builtin)),
        None => redop::premul_of(comm, datatype, op).map(Op::PreMulSum),
    }
}

/// One collective call as NCCL passes it: the send and receive buffers with their lengths in
/// elements (a side this rank does not pass is null).
///
/// Every call runs out of place, NCCL's in-place forms included (the same buffer, the
/// all-gather's send buffer inside its receive buffer, the reduce-scatter's receive buffer
/// inside its send buffer): NCCL lets each rank choose in place on its own, and every rank must
/// run the same plan. That is exact, since what a rank's peers read of its buffers is copied
/// into the memory it shares before the collective, and its own kernel reads its input from
/// that copy too, or writes only a copy of its output, copied out after everything was read
/// (`Staged::touched_by_peers` in the library's GPU executor).
pub(crate) struct Call {
    /// NCCL's name of the call.
    name: &'static str,
    collective: Collective,
    send: (*const c_void, usize),
    recv: (*mut c_void, usize),
    dtype: DType,
    op: Op,
}

/// The parts of a call every collective checks alike: its type and operator (none: the call
/// does not reduce).
pub(crate) fn types(
    comm: ncclComm_t,
    datatype: ncclDataType_t,
    op: Option<ncclRedOp_t>,
) -> Result<(DType, Op), Failure> {
    let op = match op {
        Some(op) => op_of(comm, datatype, op)?,
        None => Op::Builtin(ReduceOp::Sum),
    };
    Ok((dtype_of(datatype)?, op))
}

/// Runs `body` to build a call, then enqueues it on `stream` (module doc): checked
/// (`RankCommunicator::checked_collective`, on elements of the call's type), then enqueued. A
/// PreMulSum call takes `RankCommunicator::enqueue_premul_sum`, which scales the input first.
///
/// # Safety
/// NCCL's contract for the collective: the buffers are device memory of the communicator's GPU
/// with the lengths given, untouched until the stream passes the call; `stream` is live.
pub(crate) unsafe fn submit(
    comm: ncclComm_t,
    stream: cudaStream_t,
    body: impl FnOnce() -> Result<Call, Failure>,
) -> ncclResult_t {
    guarded(|| {
        let call = body()?;
        fallback::log(call.name, "ringreduce");
        // SAFETY: our caller's contract.
        let comm = unsafe { comm_ref(comm) }?;
        // SAFETY: our caller's contract: a live stream (or 0, the legacy default stream).
        let stream = unsafe { CallerStream::from_raw(stream.cast()) }?;
        let device = comm.device;
        ringreduce::with_element!(call.dtype, T => comm.with(|c| {
            // SAFETY: our caller's contract: device memory of `device`, of these lengths.
            let memory = |addr: u64, len: usize| unsafe { DeviceMemory::<T>::new(addr, len, device) };
            let input = (!call.send.0.is_null()).then(|| memory(call.send.0 as u64, call.send.1));
            let mut output =
                (!call.recv.0.is_null()).then(|| memory(call.recv.0 as u64, call.recv.1));
            match (call.op, &input) {
                (Op::Builtin(op), _) => c
                    .checked_collective(&call.collective, input.as_ref(), output.as_mut(), op)
                    // SAFETY: our caller's contract, passed on.
                    .and_then(|checked| unsafe { c.enqueue(checked, stream) }),
                // SAFETY: as above.
                (Op::PreMulSum(factor), Some(input)) => unsafe {
                    c.enqueue_premul_sum(&call.collective, input, output.as_mut(), factor, stream)
                },
                (Op::PreMulSum(_), None) => Err(ringreduce::Error::InvalidArgument(format!(
                    "{}: sendbuff is null",
                    call.name
                ))),
            }
            .map_err(Failure::from)
        }))
    })
}

/// `ncclAllReduce`.
#[no_mangle]
pub unsafe extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclAllReduce",
        fn(
            *const c_void,
            *mut c_void,
            usize,
            ncclDataType_t,
            ncclRedOp_t,
            *mut c_void,
            cudaStream_t,
        ),
        |real| (sendbuff, recvbuff, count, datatype, op, real, stream)
    );
    // SAFETY: NCCL's contract for the call, passed on.
    unsafe {
        submit(comm, stream, || {
            let (dtype, op) = types(comm, datatype, Some(op))?;
            Ok(Call {
                name: "ncclAllReduce",
                collective: Collective::AllReduce,
                send: (sendbuff, count),
                recv: (recvbuff, count),
                dtype,
                op,
            })
        })
    }
}

/// The rank and world of a communicator, for the calls whose buffers depend on them.
pub(crate) unsafe fn place(comm: ncclComm_t) -> Result<(usize, usize), Failure> {
    // SAFETY: our caller's contract.
    let comm = unsafe { comm_ref(comm) }?;
    Ok((comm.rank, comm.world))
}

/// A root as NCCL passes it, checked against the world.
pub(crate) fn root_of(root: c_int, world: usize) -> Result<usize, Failure> {
    match usize::try_from(root) {
        Ok(r) if r < world => Ok(r),
        _ => Err(invalid(format!("root {root} is not a rank of {world}"))),
    }
}

/// `ncclBroadcast`: the root's `sendbuff` into every rank's `recvbuff`.
#[no_mangle]
pub unsafe extern "C" fn ncclBroadcast(
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
        c"ncclBroadcast",
        fn(*const c_void, *mut c_void, usize, ncclDataType_t, c_int, *mut c_void, cudaStream_t),
        |real| (sendbuff, recvbuff, count, datatype, root, real, stream)
    );
    // SAFETY: NCCL's contract for the call, passed on.
    unsafe {
        submit(comm, stream, || {
            let (rank, world) = place(comm)?;
            let root = root_of(root, world)?;
            let (dtype, op) = types(comm, datatype, None)?;
            let mine = rank == root;
            Ok(Call {
                name: "ncclBroadcast",
                collective: Collective::Broadcast { root },
                send: (if mine { sendbuff } else { std::ptr::null() }, count),
                recv: (recvbuff, count),
                dtype,
                op,
            })
        })
    }
}

/// `ncclBcast`: NCCL's in-place broadcast, `ncclBroadcast(buff, buff, …)` (PyTorch's
/// `broadcast` calls this one).
#[no_mangle]
pub unsafe extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclBcast",
        fn(*mut c_void, usize, ncclDataType_t, c_int, *mut c_void, cudaStream_t),
        |real| (buff, count, datatype, root, real, stream)
    );
    // SAFETY: NCCL's contract for the call, passed on.
    unsafe { ncclBroadcast(buff, buff, count, datatype, root, comm, stream) }
}

/// `ncclReduce`: every rank's `sendbuff` reduced into the root's `recvbuff`.
#[no_mangle]
pub unsafe extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclReduce",
        fn(
            *const c_void,
            *mut c_void,
            usize,
            ncclDataType_t,
            ncclRedOp_t,
            c_int,
            *mut c_void,
            cudaStream_t,
        ),
        |real| (sendbuff, recvbuff, count, datatype, op, root, real, stream)
    );
    // SAFETY: NCCL's contract for the call, passed on.
    unsafe {
        submit(comm, stream, || {
            let (rank, world) = place(comm)?;
            let root = root_of(root, world)?;
            let (dtype, op) = types(comm, datatype, Some(op))?;
            let mine = rank == root;
            Ok(Call {
                name: "ncclReduce",
                collective: Collective::Reduce { root },
                send: (sendbuff, count),
                recv: (if mine { recvbuff } else { std::ptr::null_mut() }, count),
                dtype,
                op,
            })
        })
    }
}

/// `ncclAllGather` (in place when `sendbuff` is this rank's block of `recvbuff`: `Call`).
#[no_mangle]
pub unsafe extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclAllGather",
        fn(*const c_void, *mut c_void, usize, ncclDataType_t, *mut c_void, cudaStream_t),
        |real| (sendbuff, recvbuff, sendcount, datatype, real, stream)
    );
    // SAFETY: NCCL's contract for the call, passed on.
    unsafe {
        submit(comm, stream, || {
            let (_, world) = place(comm)?;
            let (dtype, op) = types(comm, datatype, None)?;
            Ok(Call {
                name: "ncclAllGather",
                collective: Collective::AllGather,
                send: (sendbuff, sendcount),
                recv: (recvbuff, sendcount * world),
                dtype,
                op,
            })
        })
    }
}

/// `ncclReduceScatter` (in place when `recvbuff` is this rank's block of `sendbuff`: `Call`).
#[no_mangle]
pub unsafe extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclReduceScatter",
        fn(
            *const c_void,
            *mut c_void,
            usize,
            ncclDataType_t,
            ncclRedOp_t,
            *mut c_void,
            cudaStream_t,
        ),
        |real| (sendbuff, recvbuff, recvcount, datatype, op, real, stream)
    );
    // SAFETY: NCCL's contract for the call, passed on.
    unsafe {
        submit(comm, stream, || {
            let (_, world) = place(comm)?;
            let (dtype, op) = types(comm, datatype, Some(op))?;
            Ok(Call {
                name: "ncclReduceScatter",
                collective: Collective::ReduceScatter,
                send: (sendbuff, recvcount * world),
                recv: (recvbuff, recvcount),
                dtype,
                op,
            })
        })
    }
}

/// `ncclAlltoAll`: block j of this rank's `sendbuff` to rank j, block i of `recvbuff` from rank
/// i (out of place).
#[no_mangle]
pub unsafe extern "C" fn ncclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    to_nccl!(
        comm,
        c"ncclAlltoAll",
        fn(*const c_void, *mut c_void, usize, ncclDataType_t, *mut c_void, cudaStream_t),
        |real| (sendbuff, recvbuff, count, datatype, real, stream)
    );
    // SAFETY: NCCL's contract for the call, passed on.
    unsafe {
        submit(comm, stream, || {
            let (_, world) = place(comm)?;
            let (dtype, op) = types(comm, datatype, None)?;
            // In place (the same buffer) too, as NCCL runs it: every call runs out of place
            // (`Call`), so the blocks are all read before any is written.
            Ok(Call {
                name: "ncclAlltoAll",
                collective: Collective::AllToAll,
                send: (sendbuff, count * world),
                recv: (recvbuff, count * world),
                dtype,
                op,
            })
        })
    }
}
