//! Registered memory: a caller's allocation that a rank in a process of its own has made
//! reachable to its peers once (`RankCommunicator::register`), so that calls on buffers inside it
//! run on them directly — no copies into and out of the memory the rank exports for them.
//!
//! Registration is collective: every rank registers one allocation of its own in the same turn,
//! exports it (a file descriptor for memory ringreduce made with `cuMemCreate`, a legacy IPC
//! handle for `cuMemAlloc` memory), and maps every peer's; registration number k is the k-th turn
//! on every rank. At each call every rank publishes, beside the call's shape, where its buffers
//! lie ([`CallerRefs`]: a registration number and an offset, or "unregistered"). Whether a call
//! runs on registered memory is decided without asking the peers at call time, as NCCL's
//! windows are used: a turn registered *symmetric* (`RankCommunicator::register_symmetric`,
//! NCCL's `NCCL_WIN_COLL_SYMMETRIC`: every rank's buffer at the same offset into its allocation,
//! checked at the turn) lets a rank whose buffers of a call all lie in symmetric registrations
//! decide alone that the call runs on them, its peers' buffers at its own registration numbers
//! and offsets ([`Registrations::symmetric_call`]), and publish those refs; the call gate on
//! the GPU compares every rank's refs with the shape, so a rank whose buffers lie elsewhere is a
//! mismatch named before any peer's memory is touched. A call on other registrations runs on
//! them only where it meets the peers' hosts anyway (the copy engines' plans, a capture: every
//! rank reads every rank's refs, and the call runs without copies when every rank's buffers are
//! registered); a gated call on them copies, as on unregistered memory (a strided piece always
//! copies: module `pieces`). Stream-ordered pool memory (`cuMemAllocAsync`, cudarc's default) cannot be shared
//! between processes and is refused by name. Deregistration is collective too: every rank
//! waits for its queued work and unmaps its peers' allocations of that turn before any owner
//! frees its own (CUDA leaves freeing memory another process maps undefined, which is why
//! registering is `unsafe` for the caller).
//!
//! Invariant: a peer's address is formed only from a registration that peer made and this rank
//! mapped, within that registration's size; this rank's own buffer counts as registered only
//! while the allocation it lies in is still the one registered (same base, size and the driver's
//! allocation id — memory freed and allocated again at the same address is not).

use super::CudaExecutor;
use crate::device::{self, Allocation};
use crate::error::{Error, Result};
use crate::exec::cuda::fabric::{Exported, Record};
use crate::exec::job::{BufferRef, CallerRefs};

/// One registration: this rank's allocation, and where every rank's of the same turn is mapped
/// here.
#[derive(Clone, Debug)]
pub(super) struct Registration {
    pub(super) own: Allocation,
    /// Rank q's allocation of this turn, as mapped here (this rank's own base at its rank), and
    /// its size.
    pub(super) mapped: Vec<(u64, usize)>,
    /// What this rank imported for it (exporting rank, record), released at deregistration.
    pub(super) imports: Vec<(usize, Record)>,
    /// Not yet deregistered.
    pub(super) live: bool,
    /// Registered symmetric (`RankCommunicator::register_symmetric`): every call on it passes
    /// the same registration and offsets on every rank, so a rank decides alone that a call
    /// runs on it, and the call gate checks that the peers' agree.
    pub(super) symmetric: bool,
}

/// A rank's registrations, by number.
#[derive(Default)]
pub(super) struct Registrations {
    list: Vec<Registration>,
}

impl Registrations {
    pub(super) fn push(&mut self, registration: Registration) {
        self.list.push(registration);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.list.iter().all(|r| !r.live)
    }

    /// Whether every live registration is symmetric (none is): calls need not meet to learn
    /// where the peers' buffers lie.
    pub(super) fn all_symmetric(&self) -> bool {
        self.list.iter().all(|r| !r.live || r.symmetric)
    }

    /// Whether a call's `refs` (this rank's) run on registered memory by this rank's decision
    /// alone: every buffer it passes lies in a live symmetric registration, and it passes one.
    /// Every rank assumes its peers' buffers lie at the same registrations and offsets; the
    /// call gate compares the refs, so a peer whose buffers lie elsewhere is a mismatch.
    pub(super) fn symmetric_call(&self, refs: &CallerRefs) -> bool {
        let symmetric = |at: BufferRef| match at {
            BufferRef::Absent => None,
            BufferRef::Registered { index, .. } => {
                Some(self.list.get(index).is_some_and(|r| r.live && r.symmetric))
            }
            BufferRef::Unregistered => Some(false),
        };
        match (symmetric(refs.input), symmetric(refs.output)) {
            (None, None) => false,
            (a, b) => a.unwrap_or(true) && b.unwrap_or(true),
        }
    }

    /// The number the next registration gets.
    pub(super) fn next(&self) -> usize {
        self.list.len()
    }

    /// Where `bytes` from `addr` (this rank's buffer; 0: none) lie, given the allocation
    /// `current` that the driver says `addr` is in now.
    pub(super) fn find(&self, addr: u64, bytes: usize, current: Option<Allocation>) -> BufferRef {
        if addr == 0 {
            return BufferRef::Absent;
        }
        let Some(current) = current else {
            return BufferRef::Unregistered;
        };
        let end = addr.checked_add(bytes as u64);
        self.list
            .iter()
            .position(|r| {
                r.live
                    && r.own == current
                    && addr >= r.own.base
                    && end.is_some_and(|end| end <= r.own.base + r.own.size as u64)
            })
            .map_or(BufferRef::Unregistered, |index| BufferRef::Registered {
                index,
                offset: addr - current.base,
            })
    }

    /// The address here of `bytes` that rank `rank` passes as `at` (its published ref); 0 for
    /// an absent buffer. An error for a ref that names no registration of that rank, or lies
    /// past its end (a peer that broke the protocol).
    pub(super) fn address(&self, rank: usize, at: BufferRef, bytes: usize) -> Result<u64> {
        let (index, offset) = match at {
            BufferRef::Absent => return Ok(0),
            BufferRef::Registered { index, offset } => (index, offset),
            BufferRef::Unregistered => {
                return Err(Error::Internal {
                    what: format!("rank {rank}'s buffer is not registered, yet a call ran on it"),
                })
            }
        };
        let live = self.list.get(index).filter(|r| r.live);
        let Some(&(base, size)) = live.and_then(|r| r.mapped.get(rank)) else {
            return Err(Error::Internal {
                what: format!(
                    "rank {rank} names registration {index}, which it never made or deregistered"
                ),
            });
        };
        match offset.checked_add(bytes as u64) {
            Some(end) if end <= size as u64 => Ok(base + offset),
            _ => Err(Error::Internal {
                what: format!(
                    "rank {rank}'s buffer of {bytes} bytes at offset {offset} runs past its \
                     registration {index} of {size} bytes"
                ),
            }),
        }
    }
}

/// Whether a call whose ranks published `refs` runs on their buffers directly: every rank's
/// buffers registered (or absent), and at least one present.
pub(super) fn runs_registered(refs: &[CallerRefs]) -> bool {
    CallerRefs::all_reachable(refs)
        && refs.iter().any(|r| {
            matches!(r.input, BufferRef::Registered { .. })
                || matches!(r.output, BufferRef::Registered { .. })
        })
}

/// Whether two buffers, each an address and a length in bytes (0, 0: absent), share a byte.
pub(super) fn overlap((a, a_bytes): (u64, usize), (b, b_bytes): (u64, usize)) -> bool {
    a_bytes > 0
        && b_bytes > 0
        && a < b.saturating_add(b_bytes as u64)
        && b < a.saturating_add(a_bytes as u64)
}

/// The allocation a caller's buffer at `addr` lies in, if it can be registered: device memory
/// of this rank's GPU `device`, not from a stream-ordered pool. A clear error otherwise, naming
/// the kind and what to do.
pub(super) fn registrable(addr: u64, device: usize) -> Result<Allocation> {
    if device::pointer_is_pool_memory(addr)? {
        return Err(Error::InvalidArgument(format!(
            "the buffer at {addr:#x} is stream-ordered pool memory (cuMemAllocAsync: cudarc's \
             alloc on a stream, PyTorch with backend:cudaMallocAsync), which CUDA cannot \
             share with another process: register memory from cuMemAlloc (ringreduce's \
             GpuBuffer), or pass the buffer unregistered and the call copies it through memory \
             the rank exports"
        )));
    }
    let (Some(d), Some(allocation)) = (
        device::pointer_device(addr)?,
        device::pointer_allocation(addr)?,
    ) else {
        return Err(Error::InvalidArgument(format!(
            "{addr:#x} is not device memory the CUDA driver knows: only a GPU buffer can be \
             registered"
        )));
    };
    if d != device {
        return Err(Error::WrongDevice {
            rank: 0,
            device: d,
            expected: device,
        });
    }
    // Memory ringreduce made shareable goes by file descriptor; any other must take a legacy
    // IPC handle.
    if device::shareable_fd(addr)?.is_none() && !device::pointer_ipc_capable(addr)? {
        return Err(Error::InvalidArgument(format!(
            "the buffer at {addr:#x} lies in memory mapped by cuMemCreate outside ringreduce \
             (PyTorch's expandable_segments, for one), which has no legacy IPC handle and no \
             descriptor ringreduce can pass: register memory from cuMemAlloc, or pass the \
             buffer unregistered and the call copies it"
        )));
    }
    Ok(allocation)
}

impl CudaExecutor {
    /// Registers the allocation this process's one rank's buffer lies in (`own`: its address,
    /// or why the rank refuses it), with every rank in the same turn (module doc): each exports
    /// its allocation and maps every peer's. Returns the registration's number. A rank that
    /// refuses fails the turn on every rank (each learns which rank) and nothing is registered:
    /// the inner error, after which the communicator still works. The outer error is the job's
    /// (a lost peer, a timeout), which breaks it.
    pub(crate) fn register(&mut self, own: Result<u64>, symmetric: bool) -> Result<Result<usize>> {
        let [r] = &self.ranks[..] else {
            return Ok(Err(Error::InvalidArgument(
                "registration serves a rank in a process of its own".into(),
            )));
        };
        let rank = r.rank();
        let _quiet = device::gate::quiet();
        let at = *own.as_ref().unwrap_or(&0);
        // Phase 1: the rank's allocation and its export (refused: a record of [0]).
        let exported = own
            .and_then(|addr| {
                device::bind(&r.res.ctx)?;
                registrable(addr, r.res.device).map_err(|err| match err {
                    Error::WrongDevice {
                        device, expected, ..
                    } => Error::WrongDevice {
                        rank,
                        device,
                        expected,
                    },
                    other => other,
                })
            })
            .and_then(|allocation| {
                let memory = Exported::Device {
                    addr: allocation.base,
                    bytes: allocation.size,
                };
                Ok((allocation, self.fabric.export(rank, memory)?))
            });
        let record = match &exported {
            Ok((allocation, handle)) => [&[1, allocation.size as u64][..], handle].concat(),
            Err(_) => vec![0],
        };
        let records = self.fabric.all_gather(vec![record])?;
        let allocation = match exported {
            Ok((allocation, _)) => allocation,
            Err(err) => return Ok(Err(err)),
        };
        if let Some(q) = records.iter().position(|r| r.first() != Some(&1)) {
            return Ok(Err(Error::InvalidArgument(format!(
                "rank {q}'s buffer could not be registered (its own error says why); no rank \
                 registered this turn"
            ))));
        }
        // Phase 2: every peer's allocation mapped here; the turn counts only if every rank
        // mapped all of them.
        let mut mapped = Vec::with_capacity(records.len());
        let mut imports = Vec::with_capacity(records.len());
        let mut failed = None;
        for (from, record) in records.iter().enumerate() {
            match self.fabric.import(rank, from, &record[2..]) {
                Ok(base) => {
                    imports.push((from, record[2..].to_vec()));
                    mapped.push((base, record[1] as usize));
                }
                Err(err) => {
                    failed = Some(err);
                    break;
                }
            }
        }
        // The turn's use (symmetric or not) must be every rank's, and it is symmetric in
        // effect only where every rank's buffer lies at the same offset into its allocation
        // (NCCL's symmetric windows promise offsets into the window).
        let flags = self.fabric.all_gather(vec![vec![
            u64::from(failed.is_none()),
            u64::from(symmetric),
            at - allocation.base,
        ]])?;
        let aligned = flags
            .iter()
            .all(|f| f.get(2) == Some(&(at - allocation.base)));
        let unlike = flags
            .iter()
            .position(|f| f.get(1) != Some(&u64::from(symmetric)));
        if let (Some(q), true) = (unlike, failed.is_none()) {
            failed = Some(Error::InvalidArgument(format!(
                "rank {q} registered this turn {} where rank {rank} did not (every rank registers \
                 alike); no rank registered this turn",
                if symmetric { "asymmetric" } else { "symmetric" }
            )));
        }
        let failing = flags.iter().position(|f| f.first() != Some(&1));
        if let Some(q) = failing.or(unlike) {
            for (from, handle) in imports {
                // Nothing ran on these mappings: they go at once.
                let _ = self.fabric.release(from, &handle);
            }
            return Ok(Err(failed.unwrap_or(Error::InvalidArgument(format!(
                "rank {q} could not map a peer's registered memory; no rank registered this turn"
            )))));
        }
        let index = self.registrations.next();
        self.registrations.push(Registration {
            own: allocation,
            mapped,
            imports,
            live: true,
            symmetric: symmetric && aligned,
        });
        Ok(Ok(index))
    }

    /// Deregisters registration `index` with every rank in the same turn: each waits until its
    /// own queued work is done, unmaps its peers' allocations of that turn, and meets the others
    /// — so that, when this returns, no rank maps this rank's allocation any more and its owner
    /// may free it. Ranks naming different registrations get the inner error and nothing
    /// changes; the outer error is the job's.
    pub(crate) fn deregister(&mut self, index: usize) -> Result<Result<()>> {
        let live = self.registrations.list.get(index).is_some_and(|r| r.live);
        let named = if live { index as u64 + 1 } else { 0 };
        let names = self.fabric.all_gather(vec![vec![named]])?;
        if let Some(q) = names
            .iter()
            .position(|n| n.first() != Some(&(index as u64 + 1)))
        {
            return Ok(Err(Error::InvalidArgument(format!(
                "rank {q} did not deregister registration {index} in this turn (every rank \
                 deregisters the same registration, once); nothing was deregistered"
            ))));
        }
        // Queued calls may still use the peers' mappings.
        self.synchronize()?;
        let registration = &mut self.registrations.list[index];
        registration.live = false;
        let imports = std::mem::take(&mut registration.imports);
        let _quiet = device::gate::quiet();
        let mut first = Ok(());
        for (from, handle) in imports {
            let released = self.fabric.release(from, &handle);
            if first.is_ok() {
                first = released;
            }
        }
        // Every rank has unmapped this one's allocation once every rank is past this.
        self.fabric.all_gather(vec![Vec::new()])?;
        first.map(Ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocation(base: u64, size: usize, id: u64) -> Allocation {
        Allocation { base, size, id }
    }

    /// Two turns: rank 0 (this one) registered allocations A (symmetric) then B; rank 1 its own
    /// two.
    fn two_turns() -> Registrations {
        let mut r = Registrations::default();
        let a = allocation(0x1000_0000, 1 << 20, 7);
        let b = allocation(0x2000_0000, 4096, 9);
        r.push(Registration {
            own: a,
            mapped: vec![(a.base, a.size), (0x7000_0000, 1 << 20)],
            imports: Vec::new(),
            live: true,
            symmetric: true,
        });
        r.push(Registration {
            own: b,
            mapped: vec![(b.base, b.size), (0x7100_0000, 8192)],
            imports: Vec::new(),
            live: true,
            symmetric: false,
        });
        r
    }

    #[test]
    fn a_call_is_decided_alone_only_on_symmetric_registrations() {
        let mut r = two_turns();
        let at = |index| BufferRef::Registered { index, offset: 64 };
        let refs = |input, output| CallerRefs { input, output };
        let (absent, unregistered) = (BufferRef::Absent, BufferRef::Unregistered);
        assert!(!r.all_symmetric());
        assert!(r.symmetric_call(&refs(absent, at(0))));
        assert!(r.symmetric_call(&refs(at(0), at(0))));
        assert!(
            !r.symmetric_call(&refs(at(0), at(1))),
            "turn 1 is not symmetric"
        );
        assert!(!r.symmetric_call(&refs(at(0), unregistered)));
        assert!(!r.symmetric_call(&refs(absent, absent)), "nothing passed");
        assert!(!r.symmetric_call(&refs(absent, at(2))), "no such turn");
        r.list[1].live = false;
        assert!(r.all_symmetric());
        r.list[0].live = false;
        assert!(!r.symmetric_call(&refs(absent, at(0))), "deregistered");
    }

    #[test]
    fn a_buffer_counts_as_registered_only_inside_the_allocation_it_was_registered_in() {
        let r = two_turns();
        let a = allocation(0x1000_0000, 1 << 20, 7);
        let b = allocation(0x2000_0000, 4096, 9);
        assert_eq!(r.find(0, 64, Some(a)), BufferRef::Absent);
        assert_eq!(
            r.find(a.base + 256, 1024, Some(a)),
            BufferRef::Registered {
                index: 0,
                offset: 256
            }
        );
        assert_eq!(
            r.find(b.base, 4096, Some(b)),
            BufferRef::Registered {
                index: 1,
                offset: 0
            }
        );
        // Past the allocation's end, another allocation, or none the driver knows.
        assert_eq!(r.find(b.base + 1, 4096, Some(b)), BufferRef::Unregistered);
        assert_eq!(
            r.find(0x3000_0000, 8, Some(allocation(0x3000_0000, 64, 11))),
            BufferRef::Unregistered
        );
        assert_eq!(r.find(a.base, 8, None), BufferRef::Unregistered);
        // Freed and allocated again at the same place: a new id, not the registration.
        assert_eq!(
            r.find(a.base, 8, Some(allocation(a.base, a.size, 8))),
            BufferRef::Unregistered
        );
    }

    #[test]
    fn a_peers_address_comes_from_its_registration_within_its_size() {
        let r = two_turns();
        let at = |index, offset| BufferRef::Registered { index, offset };
        assert_eq!(r.address(1, at(0, 64), 128).unwrap(), 0x7000_0040);
        assert_eq!(r.address(1, at(1, 4096), 4096).unwrap(), 0x7100_1000);
        assert_eq!(r.address(1, BufferRef::Absent, 8).unwrap(), 0);
        for (bad, why) in [
            (at(1, 4097), "runs past"),
            (at(2, 0), "never made"),
            (BufferRef::Unregistered, "not registered"),
        ] {
            let err = r.address(1, bad, 4096).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        }
        assert!(r.address(5, at(0, 0), 8).is_err(), "no such rank");
    }

    #[test]
    fn a_deregistered_turn_matches_nothing_and_keeps_the_numbering() {
        let mut r = two_turns();
        let a = allocation(0x1000_0000, 1 << 20, 7);
        let b = allocation(0x2000_0000, 4096, 9);
        r.list[0].live = false;
        assert_eq!(r.find(a.base, 8, Some(a)), BufferRef::Unregistered);
        assert_eq!(
            r.find(b.base, 8, Some(b)),
            BufferRef::Registered {
                index: 1,
                offset: 0
            }
        );
        let err = r
            .address(
                1,
                BufferRef::Registered {
                    index: 0,
                    offset: 0,
                },
                8,
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("deregistered"), "{err}");
        assert_eq!(r.next(), 2);
        assert!(!r.is_empty());
        r.list[1].live = false;
        assert!(r.is_empty());
    }

    #[test]
    fn buffers_overlap_when_they_share_a_byte() {
        // The same buffer (NCCL's in-place all-reduce), one inside the other (its in-place
        // all-gather and reduce-scatter), touching ends, apart, and absent buffers.
        assert!(overlap((0x1000, 64), (0x1000, 64)));
        assert!(overlap((0x1000, 256), (0x1040, 64)));
        assert!(overlap((0x1040, 64), (0x1000, 256)));
        assert!(!overlap((0x1000, 64), (0x1040, 64)));
        assert!(!overlap((0x1040, 64), (0x1000, 64)));
        assert!(!overlap((0x1000, 64), (0x2000, 64)));
        assert!(!overlap((0, 0), (0x1000, 64)));
        assert!(!overlap((0x1000, 64), (0x1000, 0)));
    }

    #[test]
    fn a_call_runs_registered_only_when_every_rank_is() {
        let reg = BufferRef::Registered {
            index: 0,
            offset: 0,
        };
        let both = CallerRefs {
            input: reg,
            output: reg,
        };
        let root_only = CallerRefs {
            input: BufferRef::Absent,
            output: reg,
        };
        let copied = CallerRefs {
            input: reg,
            output: BufferRef::Unregistered,
        };
        assert!(runs_registered(&[both, both, root_only]));
        assert!(!runs_registered(&[both, copied]));
        assert!(!runs_registered(&[CallerRefs::default(); 2]));
        assert!(!runs_registered(&[]));
    }
}
