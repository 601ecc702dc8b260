//! NCCL, loaded at run time: the engine between hosts for GPU ranks of a job on several hosts
//! (`exec::hierarchy::gpu`), and the library the NCCL-compatible `ringreduce-nccl` hands what it
//! does not run.
//!
//! **Finding it.** `RINGREDUCE_NCCL_PATH` (a file), else a `libnccl.so.2` the process has already
//! loaded by its path (PyTorch's wheels load theirs from `site-packages/nvidia/nccl/lib`), else
//! the first `libnccl.so.2` on `LD_LIBRARY_PATH` or in the usual system folders — never the
//! library this code is linked into (`ringreduce-nccl` may be installed under that very name).
//! It is opened with `RTLD_DEEPBIND`, so NCCL's calls of its own functions stay inside NCCL.
//! Nothing is loaded until a job needs it: on one host, never.
//!
//! **Layers** (as cudarc's): the file found and opened ([`Library`]); the C signatures NCCL
//! documents, each looked up by name once and called with its status turned into a `Result` in
//! one function ([`Api`], [`Api::check`], with NCCL's own text: [`Error::Nccl`]); `Comm` on
//! top, one communicator of a group. The CLI's NCCL baseline calls NCCL through [`Api`] too.
//!
//! Invariant: a symbol of NCCL is only ever called with the handles NCCL itself made, on the
//! thread that has the communicator's GPU's context current.

pub mod abi;
mod api;
mod loader;

pub use api::{cudaStream_t, ncclComm_t, ncclWindow_t, Api};
pub use loader::Library;

use crate::device;
use crate::element::{DType, ReduceOp};
use crate::error::{Error, Result};
use crate::plan::{Collective, Transfer};
use abi::*;
use cudarc::driver::CudaContext;
use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

type Stream = cudaStream_t;

/// A new unique id for a group's communicator, made on GPU `device` (NCCL's
/// `ncclGetUniqueId`, by the group's first member).
pub(crate) fn unique_id(device: usize) -> Result<Vec<u8>> {
    let nccl = Api::require("a job on several hosts")?;
    // Held across the call: the context stays retained while NCCL uses it.
    let _ctx = bind(device)?;
    let mut id = ncclUniqueId {
        internal: [0; NCCL_UNIQUE_ID_BYTES],
    };
    // SAFETY: `id` is writable for its 128 bytes.
    unsafe { nccl.get_unique_id(&mut id) }?;
    Ok(id.internal.iter().map(|&b| b as u8).collect())
}

/// Makes GPU `device`'s primary context current on this thread (NCCL works on the current one)
/// and returns it, retained while the caller holds it.
fn bind(device: usize) -> Result<Arc<CudaContext>> {
    let ctx = device::context(device)?;
    device::bind(&ctx)?;
    Ok(ctx)
}

/// One half of a point-to-point transfer in an NCCL group: `count` elements sent from (or
/// received into) a device address, to (or from) member `peer`.
enum P2p {
    Send {
        from: u64,
        count: usize,
        peer: usize,
    },
    Recv {
        into: u64,
        count: usize,
        peer: usize,
    },
}

/// One NCCL communicator of a group (module doc), on one GPU.
pub(crate) struct Comm {
    nccl: &'static Api,
    comm: ncclComm_t,
    /// The GPU's primary context, retained for the communicator's life and made current
    /// before every call.
    ctx: Arc<CudaContext>,
    rank: usize,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time (`&mut self`).
unsafe impl std::marker::Send for Comm {}

impl Comm {
    /// Joins the group of `id` (from [`unique_id`]) as `rank` of `size`, on GPU `device`; blocks
    /// until every member has joined (NCCL's `ncclCommInitRank`).
    pub(crate) fn join(id: &[u8], rank: usize, size: usize, device: usize) -> Result<Comm> {
        let nccl = Api::require("a job on several hosts")?;
        let mut raw = ncclUniqueId {
            internal: [0; NCCL_UNIQUE_ID_BYTES],
        };
        if id.len() != NCCL_UNIQUE_ID_BYTES {
            return Err(Error::Internal {
                what: format!("an NCCL unique id of {} bytes", id.len()),
            });
        }
        for (to, from) in raw.internal.iter_mut().zip(id) {
            *to = *from as c_char;
        }
        let ctx = bind(device)?;
        let mut comm: ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` is writable, the id is passed by value.
        unsafe { nccl.comm_init_rank(&mut comm, size as c_int, raw, rank as c_int) }?;
        Ok(Comm {
            nccl,
            comm,
            ctx,
            rank,
        })
    }

    /// [`Comm::join`], then one all-reduce of one element among the members, waited for at most
    /// `timeout`: NCCL's creation blocks until every member has joined, and NCCL (from 2.22)
    /// connects its members at a communicator's first collective, which blocks the calling
    /// thread until they answer — both run on a thread of its own, which a member that never
    /// comes leaves behind (blocked in NCCL, holding nothing of the caller's) while this
    /// returns [`Error::Timeout`]. (Send/recv's connections, one per pair, are still made at
    /// their first use.)
    pub(crate) fn join_within(
        id: &[u8],
        rank: usize,
        size: usize,
        device: usize,
        timeout: std::time::Duration,
    ) -> Result<Comm> {
        let id = id.to_vec();
        awaited(
            "init",
            rank,
            timeout,
            "NCCL's communicator across hosts (ncclCommInitRank): a member of the group never \
             joined",
            move || Comm::join(&id, rank, size, device).and_then(Comm::warmed),
        )
    }

    /// The communicator after one all-reduce of one element, complete: its members connected.
    fn warmed(mut self) -> Result<Comm> {
        let one = device::DeviceBuffer::zeroed(&self.ctx, 4)?;
        let stream = device::Stream::new(&self.ctx)?;
        // SAFETY: `one` is 4 bytes of this GPU's memory that nothing else touches, and the
        // stream is this GPU's; both outlive the synchronisation below.
        unsafe {
            self.collective(
                &Collective::AllReduce,
                1,
                DType::F32,
                ReduceOp::Sum,
                None,
                one.ptr(),
                stream.raw().cast(),
            )?
        };
        device::stream_synchronize(&stream)?;
        self.async_error()?;
        Ok(self)
    }

    /// Enqueues `collective` (roots are group ranks) of `count` elements of `dtype` on `stream`,
    /// in place on `buf` (laid out as the collective's in-place table says for the group's
    /// size), or from `input` for all-to-all (a group of sends and receives).
    ///
    /// # Safety
    /// `buf` (and `input`) are device memory of this communicator's GPU, valid for the
    /// collective's lengths, that nothing else touches until `stream` has passed the call;
    /// `stream` is a live stream of that GPU's primary context.
    #[allow(clippy::too_many_arguments)] // NCCL's own calls take seven.
    pub(crate) unsafe fn collective(
        &mut self,
        collective: &Collective,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        input: Option<u64>,
        buf: u64,
        stream: Stream,
    ) -> Result<()> {
        device::bind(&self.ctx)?;
        let (nccl, comm) = (self.nccl, self.comm);
        let (t, o) = (nccl_type(dtype), nccl_op(op));
        let eb = dtype.size_bytes() as u64;
        let ptr = |a: u64| a as *mut c_void;
        let mine = buf + (self.rank * count) as u64 * eb;
        // SAFETY: the buffers and the stream are our caller's contract; the in-place forms are
        // NCCL's (the same buffer, or the rank's block of the receive buffer as the
        // all-gather's send buffer and the reduce-scatter's receive buffer).
        unsafe {
            match *collective {
                Collective::AllReduce => {
                    nccl.all_reduce(ptr(buf), ptr(buf), count, t, o, comm, stream)
                }
                Collective::ReduceScatter => {
                    nccl.reduce_scatter(ptr(buf), ptr(mine), count, t, o, comm, stream)
                }
                Collective::AllGather => {
                    nccl.all_gather(ptr(mine), ptr(buf), count, t, comm, stream)
                }
                Collective::Broadcast { root } => {
                    nccl.broadcast(ptr(buf), ptr(buf), count, t, root as c_int, comm, stream)
                }
                Collective::Reduce { root } => {
                    nccl.reduce(ptr(buf), ptr(buf), count, t, o, root as c_int, comm, stream)
                }
                Collective::AllToAll => {
                    let input = input.ok_or_else(|| Error::Internal {
                        what: "an all-to-all across hosts without its input".into(),
                    })?;
                    // Member p's block of the input goes to p; p's block of `buf` comes from p.
                    let at = |p: usize| (p * count) as u64 * eb;
                    let ops: Vec<P2p> = (0..self.size()?)
                        .flat_map(|p| {
                            [
                                P2p::Send {
                                    from: input + at(p),
                                    count,
                                    peer: p,
                                },
                                P2p::Recv {
                                    into: buf + at(p),
                                    count,
                                    peer: p,
                                },
                            ]
                        })
                        .collect();
                    self.p2p_group(&ops, t, stream)
                }
                Collective::SendRecv { .. } => Err(Error::Internal {
                    what: "send/recv is not a stage across hosts".into(),
                }),
            }
        }
    }

    /// Grouped send/recv among the members (`ncclSend` and `ncclRecv` in one group) on
    /// `stream`: transfer i moves `count` elements of `dtype` from `sends[i]` on member `from`
    /// to `recvs[i]` on member `to` (the addresses this member passes; 0 where it has no end).
    /// A member's transfers to itself are not NCCL's: the caller copies them.
    ///
    /// # Safety
    /// As for [`Comm::collective`], for every address this member passes.
    pub(crate) unsafe fn send_recv(
        &mut self,
        transfers: &[Transfer],
        dtype: DType,
        sends: &[u64],
        recvs: &[u64],
        stream: Stream,
    ) -> Result<()> {
        device::bind(&self.ctx)?;
        let me = self.rank;
        let ops: Vec<P2p> = transfers
            .iter()
            .enumerate()
            .filter(|(_, x)| x.from != x.to)
            .filter_map(|(i, x)| match (x.from == me, x.to == me) {
                (true, _) => Some(P2p::Send {
                    from: sends[i],
                    count: x.count,
                    peer: x.to,
                }),
                (_, true) => Some(P2p::Recv {
                    into: recvs[i],
                    count: x.count,
                    peer: x.from,
                }),
                _ => None,
            })
            .collect();
        // SAFETY: our caller's contract, passed on.
        unsafe { self.p2p_group(&ops, nccl_type(dtype), stream) }
    }

    /// Point-to-point halves as one NCCL group (`ncclGroupStart`, an `ncclSend` or `ncclRecv`
    /// each, `ncclGroupEnd`) on `stream`: what all-to-all and send/recv across hosts both are.
    ///
    /// # Safety
    /// As for [`Comm::collective`], for every address in `ops`.
    unsafe fn p2p_group(&mut self, ops: &[P2p], t: ncclDataType_t, stream: Stream) -> Result<()> {
        let (nccl, comm) = (self.nccl, self.comm);
        nccl.group_start()?;
        // SAFETY: the addresses and the stream are our caller's contract.
        let queued = ops.iter().try_for_each(|op| unsafe {
            match *op {
                P2p::Send { from, count, peer } => {
                    nccl.send(from as *const c_void, count, t, peer as c_int, comm, stream)
                }
                P2p::Recv { into, count, peer } => {
                    nccl.recv(into as *mut c_void, count, t, peer as c_int, comm, stream)
                }
            }
        });
        // The group is ended whatever happened in it; the first error stays.
        let ended = nccl.group_end();
        queued.and(ended)
    }

    /// The number of members (NCCL's `ncclCommCount`).
    fn size(&self) -> Result<usize> {
        let mut n: c_int = 0;
        // SAFETY: NCCL's live communicator; `n` is writable.
        unsafe { self.nccl.comm_count(self.comm, &mut n) }?;
        Ok(n as usize)
    }

    /// An error NCCL met without a call returning it (a lost peer, a network failure), as
    /// `ncclCommGetAsyncError` reports it. Never waits.
    pub(crate) fn async_error(&self) -> Result<()> {
        let mut state: ncclResult_t = ncclSuccess;
        // SAFETY: NCCL's live communicator; `state` is writable.
        unsafe { self.nccl.comm_get_async_error(self.comm, &mut state) }?;
        match state == ncclSuccess || state == ncclInProgress {
            true => Ok(()),
            false => self.nccl.check("ncclCommGetAsyncError", state),
        }
    }

    /// Gives the communicator up at once (`ncclCommAbort`): the group's waits for it fail, its
    /// pending work is dropped. Never waits for the peers.
    pub(crate) fn abort(&mut self) {
        let comm = std::mem::replace(&mut self.comm, std::ptr::null_mut());
        if comm.is_null() {
            return;
        }
        let _ = device::bind(&self.ctx);
        // SAFETY: `comm` is NCCL's and released exactly once.
        let _ = unsafe { self.nccl.comm_abort(comm) };
    }

    /// Releases the communicator once its work is done (`ncclCommDestroy`), with NCCL's error.
    pub(crate) fn close(mut self) -> Result<()> {
        let comm = std::mem::replace(&mut self.comm, std::ptr::null_mut());
        if comm.is_null() {
            return Ok(());
        }
        device::bind(&self.ctx)?;
        // SAFETY: `comm` is NCCL's and released exactly once.
        unsafe { self.nccl.comm_destroy(comm) }
    }

    /// [`Comm::close`] awaited at most `timeout` on a thread of its own: NCCL's release flushes
    /// the communicator's work first, and a network that stopped answering must not hold the
    /// caller. Past the timeout the release goes on on its thread, left behind, and the caller
    /// gets `Timeout`.
    pub(crate) fn close_within(self, rank: usize, timeout: std::time::Duration) -> Result<()> {
        awaited(
            "close",
            rank,
            timeout,
            "NCCL's release of its communicator (ncclCommDestroy)",
            move || self.close(),
        )
    }
}

/// `work`'s result, run on a thread of its own (named `ringreduce-nccl-{what}`) and awaited at
/// most `timeout`: past it the thread is left behind, still in NCCL, and the caller gets
/// [`Error::Timeout`] saying what `rank` was `waiting_on`.
fn awaited<T: Send + 'static>(
    what: &str,
    rank: usize,
    timeout: std::time::Duration,
    waiting_on: &str,
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(format!("ringreduce-nccl-{what}"))
        .spawn(move || {
            let _ = tx.send(work());
        })
        .map_err(|e| Error::Resource {
            what: format!("cannot start a thread for NCCL ({what}): {e}"),
        })?;
    rx.recv_timeout(timeout).unwrap_or_else(|_| {
        Err(Error::Timeout {
            rank,
            waiting_on: waiting_on.into(),
            after: timeout,
        })
    })
}

impl Drop for Comm {
    /// Aborts what [`Comm::close`] did not release: dropping never waits for the peers.
    fn drop(&mut self) {
        self.abort();
    }
}
