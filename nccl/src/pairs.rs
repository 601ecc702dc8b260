//! Point-to-point on a communicator of three ranks or more that has no point-to-point channel
//! (module `p2p` uses the channel wherever the communicator has one, the default): a send meets
//! its receive per (sender, receiver) pair, in call order, and ranks not party to a transfer
//! take no part — what a pipeline of stages needs (rank 0 sends
//! to 1 while rank 2 computes).
//!
//! Each pair of ranks that exchanges anything gets a communicator of its own, of two ranks, made
//! at its first transfer: the lower rank makes its [`UniqueId`] and hands it to the higher one
//! through the higher one's *mailbox* (a socket each rank listens on from its communicator's
//! creation, whose ports the ranks all-gather then); both then join it. A group's transfers run
//! pair by pair, each pair's as one grouped send/recv on the pair's communicator (module
//! `transfers`), in an order every rank shares — by (lower rank, higher rank) — so that no two ranks wait for each
//! other in opposite orders. A transfer to the rank itself is a copy on the caller's stream.
//!
//! The mailbox also carries `ncclCommShrink`'s id ([`shrink`]): only the kept ranks call it, so
//! the first of them posts the new communicator's id to each of the others. Each id says what
//! it is for ([`Use`]), so a pair's id waiting unread is never taken for a shrink's.
//!
//! Invariant: a pair's communicator sees exactly the pair's transfers, in each rank's call
//! order; a mailbox wait ends when the id comes, when the parent is aborted, or — a pair's — when
//! the parent communicator learns that a peer is gone (`RankCommunicator::async_error`).

use crate::*;
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// A rank's mailbox and the pair communicators made so far.
pub(crate) struct Pairs {
    mailbox: TcpListener,
    /// Every rank's mailbox port, by rank.
    ports: Vec<u16>,
    /// Ids handed to this rank and not yet used, by the rank that sent them and their use.
    inbox: Mutex<HashMap<(usize, Use), Vec<u8>>>,
    /// The pair communicators, by peer, in ascending order: dropped in that order, so that every
    /// rank parts from its pairs in one global order, (low, high) — a pair's teardown waits for
    /// its other rank, and any other order can close a cycle (0 waits for 2, 2 for 1, 1 for 0).
    made: Mutex<BTreeMap<usize, Box<Comm>>>,
    /// Set by the parent's abort: a mailbox wait ends at once.
    aborted: std::sync::atomic::AtomicBool,
    /// The id of the pair communicator being joined, which the parent's abort gives up (its
    /// join waits for the peer's process).
    joining: Mutex<Option<UniqueId>>,
}

/// What an id posted to a mailbox is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Use {
    /// The communicator of the sender's pair with the receiver.
    Pair = 0,
    /// The communicator `ncclCommShrink` makes of the ranks it keeps.
    Shrink = 1,
}

/// How long a mailbox wait sleeps between looks.
const POLL: Duration = Duration::from_millis(1);

impl Pairs {
    /// Opens this rank's mailbox and all-gathers the ports over `inner` (a collective step of
    /// its creation). `None` for one rank (nothing to hand to anyone) and for ranks on several
    /// hosts (their transfers stay job-wide; shrink is refused there).
    pub(crate) fn open(inner: &mut RankCommunicator) -> Result<Option<Pairs>, Failure> {
        if inner.world() < 2 || inner.hosts().hosts > 1 {
            return Ok(None);
        }
        let mailbox = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| Failure::Nccl(ncclSystemError, format!("cannot open a mailbox: {e}")))?;
        let port = mailbox
            .local_addr()
            .map_err(|e| Failure::Nccl(ncclSystemError, format!("mailbox address: {e}")))?
            .port();
        let ports = inner
            .exchange(&[u64::from(port)])?
            .iter()
            .map(|w| w.first().copied().unwrap_or(0) as u16)
            .collect();
        Ok(Some(Pairs {
            mailbox,
            ports,
            inbox: Mutex::new(HashMap::new()),
            made: Mutex::new(BTreeMap::new()),
            aborted: Default::default(),
            joining: Mutex::new(None),
        }))
    }

    /// Aborts every pair communicator (the parent's abort), and ends a mailbox wait first (it
    /// holds the pairs while it waits).
    pub(crate) fn abort(&self) {
        self.aborted
            .store(true, std::sync::atomic::Ordering::Release);
        self.abort_comms();
    }

    /// Aborts every pair communicator made so far, and ends the join of one being made (it
    /// holds `made` while it waits), leaving the mailbox open (`ncclCommShrink` with
    /// `NCCL_SHRINK_ABORT` still hands out the new communicator's id through it).
    pub(crate) fn abort_comms(&self) {
        if let Some(id) = self
            .joining
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            id.give_up();
        }
        for pair in self.made.lock().unwrap_or_else(|p| p.into_inner()).values() {
            if let Backend::Ring(_, abort) = &pair.backend {
                abort.abort();
            }
        }
    }
}

/// The communicator of `parent`'s rank with `peer`, made at the first call (module doc).
fn pair_of<'a>(parent: &'a Comm, pairs: &'a Pairs, peer: usize) -> Result<&'a Comm, Failure> {
    let mut made = pairs.made.lock().unwrap_or_else(|p| p.into_inner());
    let pair: *const Comm = match made.entry(peer) {
        std::collections::btree_map::Entry::Occupied(e) => &**e.get(),
        std::collections::btree_map::Entry::Vacant(e) => {
            &**e.insert(make_pair(parent, pairs, peer)?)
        }
    };
    // SAFETY: the box lives in `made` as long as `parent` (boxes are never removed or moved
    // out while the parent lives), and `'a` is bounded by `parent`.
    Ok(unsafe { &*pair })
}

/// Makes the communicator of `parent`'s rank with `peer`: the lower rank makes the id and posts
/// it, the higher one fetches it; both join.
fn make_pair(parent: &Comm, pairs: &Pairs, peer: usize) -> Result<Box<Comm>, Failure> {
    let me = parent.rank;
    let bytes = match me < peer {
        true => {
            let id = UniqueId::new("127.0.0.1:0")?;
            let bytes = id.to_bytes().to_vec();
            post(pairs.ports[peer], me, Use::Pair, &bytes)?;
            bytes
        }
        false => fetch(parent, pairs, peer, Use::Pair)?,
    };
    let id = UniqueId::from_bytes(&bytes)?;
    // No point-to-point channel: pair communicators serve parents that have none, and their
    // groups run as lists of transfers (module `transfers`).
    let config = CudaConfig {
        peer_groups: false,
        ..config_from_env()?
    };
    // The parent's abort ends the join: it gives up the id it finds here (made by
    // `UniqueId::new`, never joined again), or, if it came first, this rank sees it and gives
    // the id up itself.
    *pairs.joining.lock().unwrap_or_else(|p| p.into_inner()) = Some(id);
    if pairs.aborted.load(std::sync::atomic::Ordering::Acquire) {
        id.give_up();
    }
    let inner = RankCommunicator::gpu(&id, usize::from(me > peer), 2, parent.device, config);
    pairs
        .joining
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    let inner = inner?;
    let (low, high) = (me.min(peer) as u64, me.max(peer) as u64);
    let job = job_of(&[parent.job, low, high].map(u64::to_le_bytes).concat());
    Comm::ours(inner, parent.device, job)
}

/// Hands `id`, for `what`, to the rank whose mailbox listens at `port`, as from rank `me`.
fn post(port: u16, me: usize, what: Use, id: &[u8]) -> Result<(), Failure> {
    let mut message = (me as u64).to_le_bytes().to_vec();
    message.extend_from_slice(&(what as u64).to_le_bytes());
    message.extend_from_slice(id);
    TcpStream::connect(("127.0.0.1", port))
        .and_then(|mut s| s.write_all(&message))
        .map_err(|e| {
            Failure::Nccl(
                ncclSystemError,
                format!("cannot reach a peer's mailbox: {e}"),
            )
        })
}

/// Waits for the id `peer` hands this rank for `what`, keeping any other that comes
/// meanwhile. A pair's wait ends when the parent communicator learns of a failure (a peer
/// gone); a shrink's does not (its parent has lost ranks by design), only the parent's abort.
fn fetch(parent: &Comm, pairs: &Pairs, peer: usize, what: Use) -> Result<Vec<u8>, Failure> {
    loop {
        let kept = pairs
            .inbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(peer, what));
        if let Some(id) = kept {
            return Ok(id);
        }
        match pairs.mailbox.accept() {
            Ok((mut stream, _)) => {
                let mut message = vec![0u8; 16 + ringreduce::exec::rendezvous::UNIQUE_ID_BYTES];
                // A peer writes its whole message at once; a connection that sends nothing
                // (a stranger on the port) is dropped after a second, not waited on.
                let read = stream
                    .set_nonblocking(false)
                    .and_then(|()| stream.set_read_timeout(Some(Duration::from_secs(1))))
                    .and_then(|()| stream.read_exact(&mut message));
                if read.is_err() {
                    continue;
                }
                let word = |i: usize| u64::from_le_bytes(message[i..i + 8].try_into().expect("8"));
                let from = word(0) as usize;
                let kind = match word(8) {
                    0 => Use::Pair,
                    _ => Use::Shrink,
                };
                pairs
                    .inbox
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert((from, kind), message.split_off(16));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if pairs.aborted.load(std::sync::atomic::Ordering::Acquire) {
                    return Err(unsupported("the communicator was aborted"));
                }
                if what == Use::Pair {
                    if let Some(err) = parent.with(|c| Ok(c.async_error()))? {
                        return Err(err.into());
                    }
                }
                std::thread::sleep(POLL);
            }
            Err(e) => return Err(Failure::Nccl(ncclSystemError, format!("mailbox: {e}"))),
        }
    }
}

/// `ncclCommShrink` of `parent` (module doc of `init`): the ranks it keeps, in their order, get
/// a new communicator; the first of them makes its id and posts it to each other's mailbox.
/// Only the kept ranks call it (the excluded ones may be gone).
pub(crate) fn shrink(parent: &Comm, pairs: &Pairs, kept: &[usize]) -> Result<Box<Comm>, Failure> {
    let me = parent.rank;
    let rank = kept.iter().position(|&r| r == me).ok_or_else(|| {
        invalid(format!(
            "rank {me} is excluded: it does not call ncclCommShrink"
        ))
    })?;
    let bytes = match rank {
        0 => {
            let id = UniqueId::new("127.0.0.1:0")?;
            let bytes = id.to_bytes().to_vec();
            for &r in &kept[1..] {
                post(pairs.ports[r], me, Use::Shrink, &bytes)?;
            }
            bytes
        }
        _ => fetch(parent, pairs, kept[0], Use::Shrink)?,
    };
    let id = UniqueId::from_bytes(&bytes)?;
    let inner = RankCommunicator::gpu(&id, rank, kept.len(), parent.device, config_from_env()?)?;
    Comm::ours(inner, parent.device, job_of(&bytes))
}

/// Runs one communicator's kept sends and receives pair by pair (module doc).
///
/// # Safety
/// As for `p2p::flush`.
pub(crate) unsafe fn flush_pairs(
    parent: &Comm,
    pairs: &Pairs,
    ops: &[&PointToPoint],
) -> Result<(), Failure> {
    let me = parent.rank;
    let mut peers: Vec<usize> = ops.iter().map(|op| op.peer).collect();
    peers.sort_by_key(|&p| (p.min(me), p.max(me)));
    peers.dedup();
    for peer in peers {
        let mine: Vec<&PointToPoint> = ops.iter().copied().filter(|op| op.peer == peer).collect();
        if peer == me {
            // SAFETY: our caller's contract, passed on.
            unsafe { copy_to_self(parent, &mine) }?;
            continue;
        }
        let pair = pair_of(parent, pairs, peer)?;
        let handle = pair as *const Comm as ncclComm_t;
        let remapped: Vec<PointToPoint> = mine
            .iter()
            .map(|op| PointToPoint {
                comm: handle,
                peer: usize::from(peer > me),
                ..**op
            })
            .collect();
        let refs: Vec<&PointToPoint> = remapped.iter().collect();
        // SAFETY: our caller's contract, passed on; the pair's handle lives as long as `parent`.
        unsafe { transfers::flush_one(handle, &refs) }?;
    }
    Ok(())
}

/// A rank's sends to itself, each copied into its receive from itself in call order.
///
/// # Safety
/// As for `p2p::flush`.
pub(crate) unsafe fn copy_to_self(parent: &Comm, ops: &[&PointToPoint]) -> Result<(), Failure> {
    let sends: Vec<&&PointToPoint> = ops.iter().filter(|op| op.send).collect();
    let recvs: Vec<&&PointToPoint> = ops.iter().filter(|op| !op.send).collect();
    let counts = |v: &[&&PointToPoint]| v.iter().map(|op| op.count).collect::<Vec<_>>();
    if counts(&sends) != counts(&recvs)
        || sends
            .iter()
            .zip(&recvs)
            .any(|(s, r)| s.datatype != r.datatype)
    {
        return Err(invalid(format!(
            "rank {} sends {:?} elements to itself and receives {:?}: every send needs its \
             receive, in order, of its count and type",
            parent.rank,
            counts(&sends),
            counts(&recvs)
        )));
    }
    for (send, recv) in sends.iter().zip(&recvs) {
        let bytes = send.count * dtype_of(send.datatype)?.size_bytes();
        // SAFETY: our caller's contract: a live stream (or 0).
        let stream = unsafe { CallerStream::from_raw(recv.stream.cast()) }?;
        // SAFETY: NCCL's contract for the calls: device buffers of these lengths, untouched
        // until the stream passes the call.
        unsafe { ringreduce::device::memcpy_on(recv.address, send.address, bytes, &stream) }?;
    }
    Ok(())
}
