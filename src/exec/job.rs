//! The control words of a job with one process per rank, whatever executes its plans (host ranks
//! or GPU ranks): each rank's pid, the call it started last with that call's shape, the call it
//! finished last, and an abort word — one small shared-memory segment per rank (module `shm`)
//! that every peer maps.
//!
//! - **Every call publishes** its number, its shape ([`CallShape`]: collective, root or
//!   transfers, count, type, operator, in place) and where its buffers lie in a slot of the
//!   rank's segment, without waiting for anyone (module `calls`). The calls are then compared
//!   across ranks by the host (`Job::meet`: a rank's first call of a shape it does not prepare
//!   alone, calls on registered memory, captures, every call of a host rank) or by the rank's GPU before the call touches
//!   any peer's memory (the call gate, `cuda/gate.cuh`, reading the segments the GPU driver
//!   maps): ranks that make different calls all get [`Error::CallMismatch`] — never a hang or
//!   a wrong result.
//! - **A failure** sets the rank's abort word to the call's number and the rank blamed; every
//!   peer sees it in its next poll and fails naming that rank (so does a peer's next call: a rank
//!   that failed is broken and never starts it).
//! - **A dead peer** — gone, or a zombie, before it finished the call — is seen by its pid
//!   within a few milliseconds of any wait, and named ([`Error::RankFailed`]). A pid means
//!   something only in its PID namespace: a rank in another one (another container) is never
//!   judged by its pid (its pid may even equal one of ours); only its abort word, its sockets'
//!   ends and the deadlines tell of it ([`Process`]).
//!
//! Invariant: each shared word has one writer (its rank's host, or for `GATED` and `FAULT` its
//! GPU); a call's slot is rewritten only once every peer has checked it (module `calls`).

mod call;
mod calls;
mod hosts;

use super::rendezvous::{Rendezvous, UniqueId};
use super::shm::{process_alive, Segment};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) use call::{BufferRef, CallShape, CallerRefs};
pub(crate) use calls::GateLayout;
pub(crate) use hosts::host_layout;

// The words of a rank's control segment.
/// The job call number this rank finished last (its part done, its outputs its own): a peer
/// whose process is gone after finishing the call a rank waits in did not fail it.
const DONE: usize = 0;
/// `(call << 16) | (blamed rank + 1)` of the last call this rank failed; 0: none.
const ABORT: usize = 1;
/// The job call number whose slot this rank published last (module `calls`).
const PUBLISHED: usize = 2;
/// The job call number this rank's host checked last against every peer's (module `calls`).
const MET: usize = 3;
/// The job call number this rank's GPU checked last against every peer's (the call gate).
const GATED: usize = 4;
/// `(call << 16) | (peer + 1)` of the call whose gate found a peer's slot different; 0: none.
const FAULT: usize = 5;
/// [`CALL_SLOTS`] slots of [`SLOT_WORDS`], call k's in slot k mod [`CALL_SLOTS`]: the call's
/// number, its shape, and where the rank's own buffers of it lie in the memory it registered
/// ([`CallerRefs`]).
const SLOTS: usize = 6;
const SHAPE_WORDS: usize = 7;
const REF_WORDS: usize = 4;
const SLOT_WORDS: usize = 1 + SHAPE_WORDS + REF_WORDS;
/// How many calls a rank's host may publish ahead of the slowest peer's check (~22 KiB of slots).
const CALL_SLOTS: usize = 256;
const CONTROL_WORDS: usize = SLOTS + CALL_SLOTS * SLOT_WORDS;
/// A control segment's bytes: whole pages, so that it can be registered with the GPU driver.
const CONTROL_BYTES: usize = (CONTROL_WORDS * 8).div_ceil(4096) * 4096;

/// How often a wait reads its peers' liveness (a `/proc` read per peer).
const LIVENESS_EVERY: Duration = Duration::from_millis(5);

/// A word of a mapped segment.
///
/// # Safety
/// `base` is a live mapping of at least `(i + 1) * 8` bytes, 8-aligned, that outlives `'a`.
pub(crate) unsafe fn word<'a>(base: *mut u8, i: usize) -> &'a AtomicU64 {
    // SAFETY: the caller's contract; `AtomicU64` has the size and alignment of a u64, and every
    // process accesses these words only atomically.
    unsafe { &*base.cast::<AtomicU64>().add(i) }
}

/// A rank's process as this process can name it: its pid in its own PID namespace, and whether
/// that namespace is this process's (`here`) — only then does the pid name the same process
/// here. Ranks in containers of their own are elsewhere: there pids are numbered apart, every
/// container's first process is pid 1, and the kernel shows their socket peers' pids as 0 or as
/// another number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Process {
    pub(crate) pid: u32,
    pub(crate) here: bool,
}

impl Process {
    /// The pid, where it names the same process here.
    pub(crate) fn pid_here(self) -> Option<u32> {
        self.here.then_some(self.pid)
    }

    /// The processes of ranks whose (pid, PID namespace) records are `records`, as seen by the
    /// rank whose record is `records[me]` (a namespace of 0: unknown, taken for the same).
    pub(crate) fn of(records: &[(u32, u64)], me: usize) -> Vec<Process> {
        let mine = records[me].1;
        records
            .iter()
            .map(|&(pid, space)| Process {
                pid,
                here: space == mine,
            })
            .collect()
    }
}

/// This process's PID namespace (the inode of `/proc/self/ns/pid`), or 0 where it cannot be read.
fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// The control words of one rank's job, mapped (module doc).
pub(crate) struct Job {
    rank: usize,
    /// Names of this job's segments start with this.
    prefix: String,
    /// Every rank's control segment, by rank.
    control: Arc<Vec<Segment>>,
    /// Every rank's process, by rank.
    processes: Arc<Vec<Process>>,
    /// The job call number this rank published last, from 1 (its own `PUBLISHED` word).
    seq: AtomicU64,
    /// The last call this rank left to its GPU's gate (module `calls`).
    last_gated: AtomicU64,
    /// This rank gives up (`abort`, from any thread): its waits end at once.
    aborted: std::sync::atomic::AtomicBool,
    /// This rank has launched point-to-point channel kernels not yet seen complete: they may
    /// wait for any peer, so any peer's death is a loss (not only one before its part of the
    /// latest call was done). Seen complete only by [`Job::finished`] (a blocking call,
    /// `synchronize`, an idle health poll): a peer that exits without destroying or aborting its
    /// communicator after this rank's channel work completed, but before this rank's host saw
    /// it complete, is reported lost.
    channel: std::sync::atomic::AtomicBool,
}

impl Job {
    /// The job of the ranks `rendezvous` met (`id` names it): every rank's pid and PID
    /// namespace, then every rank's control segment mapped here. The ranks are on one host
    /// ([`host_layout`] said so).
    pub(crate) fn join(rendezvous: &mut Rendezvous, id: &UniqueId) -> Result<Job> {
        let rank = rendezvous.rank();
        let record = vec![u64::from(std::process::id()), pid_namespace()];
        let records = rendezvous.all_gather(&record)?;
        let ids: Vec<(u32, u64)> = records
            .iter()
            .map(|r| match r.as_slice() {
                [pid, space, ..] => (*pid as u32, *space),
                _ => (0, 0),
            })
            .collect();
        let processes = Process::of(&ids, rank);
        // The names of the job's segments carry the id and rank 0's pid.
        let prefix = format!("/ringreduce-{}-{}", id.tag(), processes[0].pid);
        let control_name = |q: usize| format!("{prefix}-r{q}-ctl");
        let own = Segment::create(&control_name(rank), CONTROL_BYTES);
        let control = share_segments(rendezvous, rank, own.is_ok(), |q| {
            Segment::open(&control_name(q), CONTROL_BYTES)
        });
        let mut own = own?;
        let control = control?;
        own.unlink();
        Ok(Job {
            rank,
            prefix,
            control: Arc::new(with_own(control, rank, own)),
            processes: Arc::new(processes),
            seq: AtomicU64::new(0),
            last_gated: AtomicU64::new(0),
            aborted: std::sync::atomic::AtomicBool::new(false),
            channel: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Every rank's process, by rank.
    pub(crate) fn processes(&self) -> &Arc<Vec<Process>> {
        &self.processes
    }

    /// Every rank's control segment, by rank (for a call's waits: [`peer_failure`]).
    pub(crate) fn control(&self) -> &Arc<Vec<Segment>> {
        &self.control
    }

    /// The prefix of every name of this job's shared memory.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The job call number this rank started last (0 before its first).
    pub(crate) fn seq(&self) -> u64 {
        self.seq.load(Ordering::Relaxed)
    }

    fn control_word(&self, rank: usize, i: usize) -> &AtomicU64 {
        // SAFETY: every control segment is CONTROL_WORDS words, mapped while `self` lives.
        unsafe { word(self.control[rank].base(), i) }
    }

    /// This rank's part of call `seq` is done: its process may end now without failing slower
    /// peers.
    pub(crate) fn finished(&self, seq: u64) {
        self.control_word(self.rank, DONE)
            .fetch_max(seq, Ordering::Release);
        self.channel.store(false, Ordering::Release);
    }

    /// This rank launched a point-to-point channel kernel: until its work is seen complete
    /// ([`Job::finished`]), a peer whose process is gone is lost whatever it had finished.
    pub(crate) fn channel_launched(&self) {
        self.channel.store(true, Ordering::Release);
    }

    /// Tells every peer that this rank's latest call failed with `err`, blaming the rank `err`
    /// names if it is a peer's failure seen here, else this rank.
    pub(crate) fn abort_peers(&self, err: &Error) {
        abort_peers(&self.control, self.rank, self.seq(), err);
    }

    /// A peer's failure that dooms this rank's latest call ([`peer_failure`]), looked at now —
    /// or this rank's own abort.
    pub(crate) fn failed_peer(&self) -> Option<Error> {
        if let Some(aborted) = self.aborted_error() {
            return Some(aborted);
        }
        let mut now = Instant::now();
        // (A call number no peer has finished: any dead peer is lost.)
        let seq = match self.channel.load(Ordering::Acquire) {
            true => u64::MAX,
            false => self.seq(),
        };
        peer_failure(&self.control, &self.processes, self.rank, seq, &mut now)
            .err()
            .map(|err| self.named_mismatch(None).unwrap_or(err))
    }

    /// Gives this rank up, from any thread: its own waits end at once (the start of a call, its
    /// kernels' waits through the watch), and its peers' fail naming it.
    pub(crate) fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        let err = Error::RankFailed {
            rank: self.rank,
            during: "a collective".into(),
            message: "it aborted its communicator".into(),
        };
        abort_peers(&self.control, self.rank, self.seq().max(1), &err);
    }

    /// Whether [`Job::abort`] was called.
    pub(crate) fn aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// The error of this rank's own abort, once aborted.
    fn aborted_error(&self) -> Option<Error> {
        self.aborted().then(|| Error::RankFailed {
            rank: self.rank,
            during: "a collective".into(),
            message: "this rank aborted its communicator".into(),
        })
    }
}

/// Sets `rank`'s abort word for job call `seq` (module doc), blaming the rank `err` names if it
/// is a peer's failure, else `rank`.
pub(crate) fn abort_peers(control: &[Segment], rank: usize, seq: u64, err: &Error) {
    let blamed = match err {
        Error::RankFailed { rank: q, .. } if *q != rank => *q,
        _ => rank,
    };
    // SAFETY: control segments of CONTROL_WORDS words, mapped while `control` lives.
    unsafe { word(control[rank].base(), ABORT) }
        .store((seq << 16) | (blamed as u64 + 1), Ordering::Release);
}

/// A peer's failure that dooms job call `seq`, as the error this rank reports: its abort word
/// is set (a rank that failed a call is broken and never finishes a later one; a rank's host
/// may publish calls ahead of its peers, so the failed call may be an earlier one), or its process is gone before it finished this call (asked of processes
/// whose pid names them here). Liveness is looked at every few milliseconds, when
/// `next_liveness` has passed.
pub(crate) fn peer_failure(
    control: &[Segment],
    processes: &[Process],
    rank: usize,
    seq: u64,
    next_liveness: &mut Instant,
) -> Result<()> {
    // SAFETY: control segments of CONTROL_WORDS words, mapped while `control` lives.
    let read = |q: usize, i: usize| unsafe { word(control[q].base(), i) }.load(Ordering::Acquire);
    for q in (0..control.len()).filter(|&q| q != rank) {
        let abort = read(q, ABORT);
        if abort != 0 {
            let blamed = ((abort & 0xffff) as usize).saturating_sub(1);
            return Err(Error::RankFailed {
                rank: blamed,
                during: "a collective across processes".into(),
                message: format!("rank {q} aborted call {}", abort >> 16),
            });
        }
    }
    let now = Instant::now();
    if now >= *next_liveness {
        *next_liveness = now + LIVENESS_EVERY;
        let gone = |q: usize| match processes[q].pid_here() {
            Some(pid) => q != rank && read(q, DONE) < seq && !process_alive(pid),
            None => false,
        };
        if let Some(q) = (0..processes.len()).find(|&q| gone(q)) {
            return Err(Error::RankFailed {
                rank: q,
                during: "a collective across processes".into(),
                message: format!("its process (pid {}) is gone", processes[q].pid),
            });
        }
    }
    Ok(())
}

/// Every rank's segment, mapped here, with this rank's slot empty for its own: this rank made
/// its own (`made` says whether that succeeded); the ranks tell each other whether they did,
/// then map every peer's with `open`, and tell each other again — so a rank that failed is
/// named on every rank, and no rank unlinks its name before every peer has mapped it.
pub(crate) fn share_segments(
    rendezvous: &mut Rendezvous,
    rank: usize,
    made: bool,
    open: impl Fn(usize) -> Result<Segment>,
) -> Result<Vec<Option<Segment>>> {
    let verdict = |records: Vec<Vec<u64>>, during: &str| -> Result<()> {
        match records.iter().position(|r| r.first() != Some(&0)) {
            Some(q) => Err(Error::RankFailed {
                rank: q,
                during: during.into(),
                message: "it could not make or map its shared memory (its own error says why)"
                    .into(),
            }),
            None => Ok(()),
        }
    };
    verdict(
        rendezvous.all_gather(&[u64::from(!made)])?,
        "making shared memory",
    )?;
    let mut mapped = Vec::with_capacity(rendezvous.world());
    let mut failed = None;
    for q in 0..rendezvous.world() {
        if q == rank {
            mapped.push(None);
            continue;
        }
        match open(q) {
            Ok(s) => mapped.push(Some(s)),
            Err(e) => {
                mapped.push(None);
                failed.get_or_insert(e);
            }
        }
    }
    let told = rendezvous.all_gather(&[u64::from(failed.is_some())]);
    // This rank's own failure says most; then a peer's, by name.
    if let Some(e) = failed {
        return Err(e);
    }
    verdict(told?, "mapping shared memory")?;
    Ok(mapped)
}

/// The segments with this rank's own in its slot.
pub(crate) fn with_own(
    mut segments: Vec<Option<Segment>>,
    rank: usize,
    own: Segment,
) -> Vec<Segment> {
    segments[rank] = Some(own);
    segments.into_iter().flatten().collect()
}
