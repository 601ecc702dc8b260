//! The rendezvous: how the processes of one communicator find each other, agree on who is who,
//! and exchange small records — what an inter-process fabric (one process per GPU) is built on.
//!
//! The model is NCCL's and the article's: one process makes a [`UniqueId`] (an address to meet
//! at and a random nonce), hands it to every rank by any channel (its printable form, or its
//! 128 bytes), and every rank joins with (id, rank, world, a fingerprint of its
//! configuration): [`Rendezvous::join`]. Rank 0 listens at the id's address; every other rank
//! connects (retrying until rank 0 listens) and says hello. Rank 0 admits each rank at once,
//! telling it how long rank 0 will still wait (so a rank that came early waits for the verdict
//! as long as rank 0 does), waits for every rank, checks them against each other, and answers
//! every rank with one verdict, so that a mismatch is the same named error on every rank,
//! within the timeout:
//! - ranks that never arrive: [`Error::RanksMissing`] naming them (on every rank that came);
//! - a rank whose world differs from rank 0's: [`Error::WorldSizeMismatch`];
//! - two processes claiming one rank: [`Error::DuplicateRank`];
//! - a rank whose configuration fingerprint differs from rank 0's: [`Error::ConfigMismatch`];
//! - a connection without the id's nonce (a stranger on the port, or a stale job) is closed and
//!   ignored; the rendezvous goes on.
//!
//! After the verdict the connections stay open, a star around rank 0: [`Rendezvous::all_gather`]
//! sends each rank's record to rank 0, which sends every rank the records of all. A peer whose
//! connection closes is a lost peer, named ([`Error::RankFailed`]); no exchange waits past its
//! deadline.
//!
//! Wire format: little-endian 64-bit words; a message is its length in words, then the words.
//! Invariant: every rank sees the same verdict and, for each all-gather, the same records in
//! rank order.

mod id;
mod stop;

use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use id::listeners;
pub use id::{LaunchEnv, UniqueId, UNIQUE_ID_BYTES};
use stop::Stop;

/// The first word of every hello: "ringredu" in ASCII, so a stranger is told apart at once.
const MAGIC: u64 = u64::from_le_bytes(*b"ringredu");
/// The wire format's version; a rank with another is a stranger.
const VERSION: u64 = 2;

/// One rank's end of a rendezvous (module doc): rank 0 holds a connection to every other rank,
/// every other rank one to rank 0.
#[derive(Debug)]
pub struct Rendezvous {
    rank: usize,
    world: usize,
    timeout: Duration,
    /// Set by [`Rendezvous::stopper`]'s holder: every exchange's wait ends with
    /// [`Error::Closed`] (an abort of the communicator built on this rendezvous).
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Rank 0: the connection to rank r at index r (none for itself). Other ranks: the one to
    /// rank 0, at index 0.
    peers: Vec<Option<TcpStream>>,
}

/// What rank 0 answers a hello with at once: `[ADMITTED, milliseconds it will still wait]`.
const ADMITTED: u64 = 0xad;
/// Verdict codes rank 0 sends every rank.
const OK: u64 = 0;
const WORLD_MISMATCH: u64 = 1;
const DUPLICATE_RANK: u64 = 2;
const CONFIG_MISMATCH: u64 = 3;
const MISSING: u64 = 4;

impl Rendezvous {
    /// Joins the communicator of `id` as `rank` of `world`, with `fingerprint` (a hash of every
    /// setting all ranks must share); gives up after `timeout` with the named error of the
    /// module doc, or once this process gives `id` up ([`UniqueId::give_up`]: [`Error::Closed`]).
    pub fn join(
        id: &UniqueId,
        rank: usize,
        world: usize,
        fingerprint: u64,
        timeout: Duration,
    ) -> Result<Rendezvous> {
        if world == 0 || rank >= world {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} of a world of {world}: a rank is below the world size"
            )));
        }
        let deadline = Instant::now() + timeout;
        match rank {
            0 => Rendezvous::host(id, world, fingerprint, timeout, deadline),
            _ => Rendezvous::guest(id, rank, world, fingerprint, timeout, deadline),
        }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// What stops this rendezvous's exchanges once set (from any thread): each wait ends
    /// within 100 ms with [`Error::Closed`], and this rank's connections close, so that its
    /// peers' exchanges fail naming it.
    pub(crate) fn stopper(&self) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
        self.stop.clone()
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Rank 0: listen, admit every rank's hello, send the verdict.
    fn host(
        id: &UniqueId,
        world: usize,
        fingerprint: u64,
        timeout: Duration,
        deadline: Instant,
    ) -> Result<Rendezvous> {
        let taken = listeners()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id.nonce);
        let listener = match taken {
            Some(l) => l,
            None => TcpListener::bind(id.addr).map_err(|e| Error::Resource {
                what: format!("rank 0 cannot listen at {}: {e}", id.addr),
            })?,
        };
        listener.set_nonblocking(true).map_err(io("rendezvous"))?;
        let mut peers: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
        let mut verdict: Option<Vec<u64>> = None;
        let mut extra = Vec::new();
        while peers.iter().skip(1).any(Option::is_none) && Instant::now() < deadline {
            Stop::Join(id.nonce).check()?;
            let stream = match listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                }
                Err(e) => return Err(io("accepting a rank")(e)),
            };
            stream.set_nonblocking(false).map_err(io("rendezvous"))?;
            let mut stream = stream;
            // A stranger (no hello, a wrong magic, version or nonce) is dropped: the job goes on.
            let Ok(hello) = read_words(&mut stream, Stop::Join(id.nonce), deadline, timeout) else {
                continue;
            };
            let [magic, version, lo, hi, rank, their_world, theirs] = hello[..] else {
                continue;
            };
            if magic != MAGIC
                || version != VERSION
                || (u128::from(hi) << 64 | u128::from(lo)) != id.nonce
            {
                continue;
            }
            let rank = rank as usize;
            // Admitted: the rank hears how long rank 0 will wait for the others, and waits for
            // the verdict that long (however late rank 0 came after it).
            let left = deadline.saturating_duration_since(Instant::now());
            let _ = write_words(&mut stream, &[ADMITTED, left.as_millis() as u64]);
            let problem = if their_world as usize != world {
                Some(vec![WORLD_MISMATCH, rank as u64, their_world, world as u64])
            } else if rank == 0 || peers.get(rank).is_some_and(Option::is_some) {
                Some(vec![DUPLICATE_RANK, rank as u64])
            } else if theirs != fingerprint {
                Some(vec![CONFIG_MISMATCH, rank as u64])
            } else {
                None
            };
            if let Some(p) = problem {
                verdict.get_or_insert(p);
            }
            // Every rank that came hears the verdict; the wait ends when every slot is taken,
            // so a mismatch is reported as soon as the last rank has arrived.
            match peers.get_mut(rank) {
                Some(slot @ None) if rank != 0 => *slot = Some(stream),
                _ => extra.push(stream),
            }
        }
        let missing: Vec<usize> = (1..world).filter(|&r| peers[r].is_none()).collect();
        let verdict = verdict.unwrap_or_else(|| match missing.is_empty() {
            true => vec![OK],
            false => {
                let mut v = vec![MISSING];
                v.extend(missing.iter().map(|&r| r as u64));
                v
            }
        });
        for stream in peers.iter_mut().flatten().chain(extra.iter_mut()) {
            // A rank that cannot be told learns it from its own timeout.
            let _ = write_words(stream, &verdict);
        }
        decode_verdict(&verdict, timeout)?;
        Ok(Rendezvous {
            rank: 0,
            world,
            timeout,
            stop: Default::default(),
            peers,
        })
    }

    /// A rank other than 0: connect (retrying until rank 0 listens), say hello, hear the
    /// verdict.
    fn guest(
        id: &UniqueId,
        rank: usize,
        world: usize,
        fingerprint: u64,
        timeout: Duration,
        deadline: Instant,
    ) -> Result<Rendezvous> {
        let mut stream = loop {
            Stop::Join(id.nonce).check()?;
            match TcpStream::connect_timeout(&id.addr, Duration::from_millis(200)) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Err(_) => {
                    return Err(Error::RanksMissing {
                        missing: vec![0],
                        after: timeout,
                    })
                }
            }
        };
        stream.set_nodelay(true).map_err(io("rendezvous"))?;
        let nonce = id.nonce;
        let hello = [
            MAGIC,
            VERSION,
            nonce as u64,
            (nonce >> 64) as u64,
            rank as u64,
            world as u64,
            fingerprint,
        ];
        write_words(&mut stream, &hello).map_err(|_| lost(0))?;
        let missing_rank0 = |e| match e {
            Error::Timeout { .. } => Error::RanksMissing {
                missing: vec![0],
                after: timeout,
            },
            other => other,
        };
        // Rank 0 admits this rank at once when it is there, saying how long it will wait for
        // the others; the verdict comes within that.
        let admitted = read_words(&mut stream, Stop::Join(id.nonce), deadline, timeout)
            .map_err(missing_rank0)?;
        let rank0_waits = match admitted[..] {
            [ADMITTED, ms] => Duration::from_millis(ms),
            _ => {
                return Err(Error::Internal {
                    what: format!("rank 0 answered a hello with {admitted:?}"),
                })
            }
        };
        let verdict_by = Instant::now() + rank0_waits + Duration::from_millis(500);
        let verdict = read_words(&mut stream, Stop::Join(id.nonce), verdict_by, timeout)
            .map_err(missing_rank0)?;
        decode_verdict(&verdict, timeout)?;
        let mut peers: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
        peers[0] = Some(stream);
        Ok(Rendezvous {
            rank,
            world,
            timeout,
            stop: Default::default(),
            peers,
        })
    }

    /// Every rank's `record`, by rank (module doc): through rank 0, within the timeout; a rank
    /// whose connection closes is named — on every rank, as rank 0 tells the others which rank
    /// it lost before it gives up.
    pub fn all_gather(&mut self, record: &[u64]) -> Result<Vec<Vec<u64>>> {
        let stop = self.stop.clone();
        let gathered = Stop::Exchange(&stop)
            .check()
            .and_then(|()| self.gather(record, Stop::Exchange(&stop)));
        if let Err(Error::Closed) = gathered {
            // Stopped (this rank gave up): its peers learn it as its connections close.
            self.abandon();
        }
        gathered
    }

    /// [`Rendezvous::all_gather`], its waits ended by `stop`.
    fn gather(&mut self, record: &[u64], stop: Stop<'_>) -> Result<Vec<Vec<u64>>> {
        let deadline = Instant::now() + self.timeout;
        if self.rank != 0 {
            let stream = self.peers[0].as_mut().ok_or_else(|| lost(0))?;
            write_words(stream, record).map_err(|_| lost(0))?;
            let all = read_words(stream, stop, deadline, self.timeout).map_err(|e| named(e, 0))?;
            if let [LOST_RANK, rank, timed_out, ..] = all[..] {
                return Err(match timed_out {
                    0 => lost_by_rank0(rank as usize),
                    _ => Error::Timeout {
                        rank: rank as usize,
                        waiting_on: "its record of an exchange (rank 0 waited for it)".into(),
                        after: self.timeout,
                    },
                });
            }
            return split_records(&all, self.world);
        }
        let mut records = vec![record.to_vec()];
        for r in 1..self.world {
            let read = match self.peers[r].as_mut() {
                Some(stream) => {
                    read_words(stream, stop, deadline, self.timeout).map_err(|e| named(e, r))
                }
                None => Err(lost(r)),
            };
            let read = read.and_then(|words| match words[..] {
                [LOST_RANK, NOTICE, lost, _] => Err(told_lost(lost as usize, r)),
                _ => Ok(words),
            });
            match read {
                Ok(words) => records.push(words),
                // Stopped: `all_gather` closes the connections.
                Err(Error::Closed) => return Err(Error::Closed),
                Err(err) => {
                    let (named, timed_out) = match &err {
                        Error::Timeout { rank, .. } => (*rank, 1),
                        Error::RankFailed { rank, .. } => (*rank, 0),
                        _ => (r, 0),
                    };
                    for (q, peer) in self.peers.iter_mut().enumerate().skip(1) {
                        if let (true, Some(stream)) = (q != r, peer.as_mut()) {
                            let _ = write_words(stream, &[LOST_RANK, named as u64, timed_out]);
                        }
                    }
                    return Err(err);
                }
            }
        }
        let mut all = Vec::new();
        for r in &records {
            all.push(r.len() as u64);
            all.extend(r);
        }
        for (r, peer) in self.peers.iter_mut().enumerate().skip(1) {
            let stream = peer.as_mut().ok_or_else(|| lost(r))?;
            write_words(stream, &all).map_err(|_| lost(r))?;
        }
        Ok(records)
    }

    /// Closes this rank's connections, so that every rank waiting in an exchange with it fails
    /// at once, naming it (a rank that gave up does this).
    pub(crate) fn abandon(&mut self) {
        for peer in self.peers.iter_mut() {
            if let Some(stream) = peer.take() {
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    /// [`Rendezvous::abandon`], after telling the ranks this one reaches that it gives up
    /// because it lost rank `lost`: an exchange then names `lost` on every rank, not this rank,
    /// which is alive (rank 0 tells every other rank; another rank tells rank 0, which passes
    /// it on).
    pub(crate) fn abandon_naming(&mut self, lost: usize) {
        let notice = match self.rank {
            0 => vec![LOST_RANK, lost as u64, 0],
            _ => vec![LOST_RANK, NOTICE, lost as u64, 0],
        };
        for stream in self.peers.iter_mut().flatten() {
            let _ = write_words(stream, &notice);
        }
        self.abandon();
    }

    /// Returns once every rank has called it (an all-gather of nothing).
    pub fn barrier(&mut self) -> Result<()> {
        self.all_gather(&[]).map(drop)
    }
}

/// The verdict's error, if any.
fn decode_verdict(verdict: &[u64], timeout: Duration) -> Result<()> {
    let at = |i: usize| verdict.get(i).copied().unwrap_or(0) as usize;
    match verdict.first().copied() {
        Some(OK) => Ok(()),
        Some(WORLD_MISMATCH) => Err(Error::WorldSizeMismatch {
            rank: at(1),
            said: at(2),
            expected: at(3),
        }),
        Some(DUPLICATE_RANK) => Err(Error::DuplicateRank { rank: at(1) }),
        Some(CONFIG_MISMATCH) => Err(Error::ConfigMismatch { rank: at(1) }),
        Some(MISSING) => Err(Error::RanksMissing {
            missing: verdict[1..].iter().map(|&r| r as usize).collect(),
            after: timeout,
        }),
        _ => Err(Error::Internal {
            what: format!("rank 0 sent an unknown verdict {verdict:?}"),
        }),
    }
}

/// Appends `text` to a record: its length in bytes, then its bytes, eight to a word.
pub(crate) fn push_text(record: &mut Vec<u64>, text: &str) {
    record.push(text.len() as u64);
    for chunk in text.as_bytes().chunks(8) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        record.push(u64::from_le_bytes(word));
    }
}

/// The text of `len` bytes that [`push_text`] put in `words` (lossy where they are not one).
pub(crate) fn text_of(len: usize, words: &[u64]) -> String {
    let bytes: Vec<u8> = words
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .take(len)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Every rank's record from rank 0's concatenation (each: its length, then its words).
fn split_records(all: &[u64], world: usize) -> Result<Vec<Vec<u64>>> {
    let mut records = Vec::with_capacity(world);
    let mut rest = all;
    for _ in 0..world {
        let (&len, tail) = rest.split_first().ok_or_else(short)?;
        let len = usize::try_from(len).map_err(|_| short())?;
        if tail.len() < len {
            return Err(short());
        }
        records.push(tail[..len].to_vec());
        rest = &tail[len..];
    }
    match rest.is_empty() {
        true => Ok(records),
        false => Err(short()),
    }
}

fn short() -> Error {
    Error::Internal {
        what: "rank 0's all-gather message does not hold every rank's record".into(),
    }
}

/// Rank 0's word for "the exchange failed: I lost this rank" (never a record's length).
const LOST_RANK: u64 = u64::MAX;

/// After [`LOST_RANK`], the second word of a rank's notice to rank 0 that it gives up because
/// it lost another rank ([`Rendezvous::abandon_naming`]): a record no exchange sends.
const NOTICE: u64 = 0x6c6f_7374_5f72_616e; // "lost_ran"

/// The rank a rank that gave up says it lost, as every rank names it.
fn told_lost(rank: usize, by: usize) -> Error {
    Error::RankFailed {
        rank,
        during: "an exchange between processes".into(),
        message: format!("rank {by} lost it and gave up"),
    }
}

/// The rank rank 0 lost in an exchange, as the other ranks name it.
fn lost_by_rank0(rank: usize) -> Error {
    Error::RankFailed {
        rank,
        during: "an exchange between processes".into(),
        message: "rank 0 lost its connection: the process is gone".into(),
    }
}

/// Rank `rank`'s connection closed: the peer is gone.
fn lost(rank: usize) -> Error {
    Error::RankFailed {
        rank,
        during: "an exchange between processes".into(),
        message: "its connection closed: the process is gone".into(),
    }
}

/// A read error of rank `rank`'s connection, by name: a timeout stays one (naming the rank),
/// anything else is the lost peer.
fn named(err: Error, rank: usize) -> Error {
    match err {
        Error::Timeout {
            waiting_on, after, ..
        } => Error::Timeout {
            rank,
            waiting_on,
            after,
        },
        Error::Closed => Error::Closed,
        _ => lost(rank),
    }
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |e| Error::Resource {
        what: format!("{what}: {e}"),
    }
}

/// Writes one message: its length in words, then the words.
fn write_words(stream: &mut TcpStream, words: &[u64]) -> std::io::Result<()> {
    let mut bytes = Vec::with_capacity(8 * (words.len() + 1));
    bytes.extend((words.len() as u64).to_le_bytes());
    for w in words {
        bytes.extend(w.to_le_bytes());
    }
    stream.write_all(&bytes)
}

/// Longest message accepted, in words: a record is a few handles, never megabytes.
const MAX_WORDS: u64 = 1 << 20;

/// Reads one message, giving up at `deadline` ([`Error::Timeout`], after `timeout`) or when the
/// connection closes or sends something that is not a message.
fn read_words(
    stream: &mut TcpStream,
    stop: Stop<'_>,
    deadline: Instant,
    timeout: Duration,
) -> Result<Vec<u64>> {
    let mut read_exact = |buf: &mut [u8]| -> Result<()> {
        let mut done = 0;
        while done < buf.len() {
            stop.check()?;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout {
                    rank: 0,
                    waiting_on: "waited for a message from another process".into(),
                    after: timeout,
                });
            }
            stream
                .set_read_timeout(Some(left.min(Duration::from_millis(100))))
                .map_err(io("rendezvous"))?;
            match stream.read(&mut buf[done..]) {
                Ok(0) => return Err(lost(0)),
                Ok(n) => done += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Err(lost(0)),
            }
        }
        Ok(())
    };
    let mut len = [0u8; 8];
    read_exact(&mut len)?;
    let len = u64::from_le_bytes(len);
    if len > MAX_WORDS {
        return Err(lost(0));
    }
    let mut bytes = vec![0u8; len as usize * 8];
    read_exact(&mut bytes)?;
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect())
}

#[cfg(test)]
mod tests;
