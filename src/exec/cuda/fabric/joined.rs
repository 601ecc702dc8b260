//! The fabric between processes: one rank per process, joined at a rendezvous ([`Joined`]),
//! sharing its memory by file descriptor or by legacy CUDA IPC handle ([`MemorySharing`]): the
//! records of the memory it exports, and the imports of its peers' memory that it maps.
//!
//! Invariant: another process's allocation is mapped here at most once at a time, and unmapped
//! once its last import is released (or when the imports are closed).

use super::{Exported, Fabric, Fields, Record};
use crate::device::{self, DeviceBuffer, PinnedHost};
use crate::error::{Error, Result};
use crate::exec::cuda::kernels::CallGate;
use crate::exec::fds::FdServer;
use crate::exec::job::{CallShape, CallerRefs, Job};
use crate::exec::rendezvous::{Rendezvous, UniqueId};
use crate::exec::shm::Segment;
use cudarc::driver::CudaContext;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The fabric of one rank that met its peers at a rendezvous ([`Rendezvous`]), each in a
/// process of its own. Records travel through the rendezvous. Memory is shared one of two ways
/// ([`MemorySharing`], chosen per process at creation; a record says which, so ranks may
/// differ): memory the rank made with `cuMemCreate` ([`Fabric::exportable`]) is exported as
/// its allocation's POSIX file descriptor, which each peer fetches from this rank's descriptor
/// server over a Unix-domain socket (`exec::fds`) and maps; other memory as a legacy CUDA IPC
/// handle of its allocation (`device::export_handle`), which a peer opens. Either way the record
/// carries the address's offset in its allocation, and a peer maps each allocation once (undone
/// with the communicator). Pinned host memory (staged edges, counters' mailboxes between GPUs
/// without peer access) is an anonymous file mapped in each process, passed by descriptor the
/// same way. The ranks share the job's control words (`exec::job`): every call is published
/// there and compared with the peers' — on the host, or by this GPU's call gate, which reads
/// every rank's words through the driver's mapping of them ([`Fabric::gate`]) — and a peer that
/// failed its call or whose process is gone is lost.
///
/// Two ranks in one process are refused: this crate's gate (`device::gate`) keeps a process's
/// blocking CUDA calls from overlapping its own spinning peer kernels, which assumes that one
/// communicator launches every local rank's kernels; ranks of one process belong in one
/// [`Communicator`](crate::Communicator).
pub(crate) struct Joined {
    /// Every rank's control words as this GPU reaches them, for the call gate (`None` where the
    /// driver would not register them: every call then meets its peers on the host). First, so
    /// that it is unregistered before the job's segments are unmapped.
    gate_view: Option<GateView>,
    /// A teardown left GPU work running ([`Fabric::keep_mapped`]): the gate's view and the job's
    /// segments are not undone when this is dropped.
    keep_mapped: std::sync::atomic::AtomicBool,
    rank: usize,
    world: usize,
    rendezvous: Mutex<Rendezvous>,
    /// What stops the rendezvous's exchanges, which an abort sets (an exchange holds the lock
    /// while it waits), and the ids of the sub-communicators being joined, whose joins an abort
    /// gives up ([`Fabric::watch_join`]).
    stop: Arc<std::sync::atomic::AtomicBool>,
    joining: Mutex<Vec<UniqueId>>,
    /// The job's control words: call shapes, aborts, every rank's process.
    job: Job,
    /// This rank's context: where imported memory is mapped.
    ctx: Arc<CudaContext>,
    /// Memory of other processes mapped here, each allocation once, with the number of imports
    /// not yet released ([`Fabric::release`]).
    imports: Mutex<HashMap<ImportKey, Import>>,
    /// How this rank's device memory is shared.
    sharing: MemorySharing,
    /// The serials of the memory this rank exported: all its descriptor server serves.
    exported: Arc<Mutex<std::collections::HashSet<u64>>>,
    /// This rank's descriptor server (device memory made by `cuMemCreate`, and pinned host
    /// memory).
    _server: FdServer,
}

/// How a process shares its GPU memory with the other processes of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemorySharing {
    /// Memory made with `cuMemCreate`, its POSIX file descriptor passed over a Unix-domain socket.
    FileDescriptors,
    /// `cuMemAlloc` memory, its legacy CUDA IPC handle passed in the records.
    LegacyIpc,
}

impl MemorySharing {
    /// How GPU `ordinal` of this process shares memory: by descriptors where its driver can,
    /// unless `RINGREDUCE_IPC=legacy` asks for legacy handles.
    pub fn of(ordinal: usize) -> Result<MemorySharing> {
        let legacy = std::env::var("RINGREDUCE_IPC").is_ok_and(|v| v == "legacy");
        Ok(match !legacy && device::fd_sharing_supported(ordinal)? {
            true => MemorySharing::FileDescriptors,
            false => MemorySharing::LegacyIpc,
        })
    }

    /// The mechanism in words, as `ringreduce info` prints it.
    pub fn describe(self) -> &'static str {
        match self {
            MemorySharing::FileDescriptors => {
                "cuMemCreate memory, its POSIX file descriptor passed over a Unix-domain socket"
            }
            MemorySharing::LegacyIpc => "cuMemAlloc memory, legacy CUDA IPC handles",
        }
    }
}

/// A record's first word: how the memory it names is shared — device memory by descriptor or by
/// legacy IPC handle, pinned host memory by descriptor.
const BY_DESCRIPTOR: u64 = 1;
const BY_IPC_HANDLE: u64 = 2;
const BY_HOST_DESCRIPTOR: u64 = 3;

impl Joined {
    /// Lets the peers fetch the allocation numbered `serial` (this rank exports it).
    fn served(&self, serial: u64) {
        let mut exported = self.exported.lock().unwrap_or_else(|p| p.into_inner());
        exported.insert(serial);
    }

    /// The descriptor of the allocation numbered `serial` that rank `from` exported, from its
    /// server.
    fn fetch(&self, from: usize, serial: u64) -> Result<std::os::fd::OwnedFd> {
        let name = server_name(self.job.prefix(), from);
        crate::exec::fds::fetch(&name, self.job.processes()[from], serial)?.ok_or_else(|| {
            Error::Internal {
                what: format!("rank {from} no longer shares the memory it exported as {serial}"),
            }
        })
    }
}

impl Joined {
    /// The fabric of the rank that `rendezvous` joined (the job `id` names), on this process's
    /// GPU `device`: maps the job's control words, which name every rank's process.
    pub(crate) fn new(mut rendezvous: Rendezvous, id: &UniqueId, device: usize) -> Result<Joined> {
        let job = Job::join(&mut rendezvous, id)?;
        let processes = job.processes().clone();
        let rank = rendezvous.rank();
        let one_process = |q: usize| q != rank && processes[q] == processes[rank];
        if let Some(other) = (0..processes.len()).find(|&q| one_process(q)) {
            return Err(Error::InvalidArgument(format!(
                "ranks {rank} and {other} of one job are in one process: GPU ranks with a \
                 communicator each run one per process; ranks of one process belong in one \
                 Communicator"
            )));
        }
        let ctx = device::context(device)?;
        let sharing = MemorySharing::of(device)?;
        // Only this job's processes are served, and only what this rank exported.
        let exported: Arc<Mutex<std::collections::HashSet<u64>>> = Arc::default();
        let served = exported.clone();
        let server = FdServer::start(
            &server_name(job.prefix(), rank),
            processes.to_vec(),
            move |key| {
                let ours = served
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains(&key);
                ours.then(|| device::shareable_by_serial(key)).flatten()
            },
        )?;
        // RINGREDUCE_CALL_GATE=off: every call meets its peers on the host, as a shape's first
        // call does.
        let gated = std::env::var("RINGREDUCE_CALL_GATE").map_or(true, |v| v != "off");
        let gate_view = gated
            .then(|| GateView::new(&ctx, job.control()).ok())
            .flatten();
        Ok(Joined {
            gate_view,
            keep_mapped: Default::default(),
            rank: rendezvous.rank(),
            world: rendezvous.world(),
            stop: rendezvous.stopper(),
            joining: Mutex::default(),
            rendezvous: Mutex::new(rendezvous),
            job,
            ctx,
            imports: Mutex::new(HashMap::new()),
            sharing,
            exported,
            _server: server,
        })
    }
}

impl Fabric for Joined {
    fn world(&self) -> usize {
        self.world
    }

    fn local_ranks(&self) -> Range<usize> {
        self.rank..self.rank + 1
    }

    fn all_gather(&self, local: Vec<Record>) -> Result<Vec<Record>> {
        let [record] = &local[..] else {
            return Err(Error::Internal {
                what: format!("a rank's all-gather with {} records", local.len()),
            });
        };
        let mut rendezvous = self.rendezvous.lock().unwrap_or_else(|p| p.into_inner());
        rendezvous.all_gather(record)
    }

    fn export(&self, rank: usize, memory: Exported) -> Result<Record> {
        let addr = match memory {
            Exported::Device { addr, .. } => addr,
            Exported::Host { addr, .. } => {
                let Some(shared) = device::shareable_fd(addr)? else {
                    return Err(Error::Internal {
                        what: format!(
                            "rank {rank} exports pinned host memory at {addr:#x} that it did not \
                             make shareable"
                        ),
                    });
                };
                let offset = addr - shared.base;
                let (serial, size) = (shared.serial, shared.size as u64);
                self.served(serial);
                return Ok(vec![BY_HOST_DESCRIPTOR, addr, offset, serial, size]);
            }
        };
        if let Some(shared) = device::shareable_fd(addr)? {
            let (offset, serial, size) = (addr - shared.base, shared.serial, shared.size as u64);
            self.served(serial);
            return Ok(vec![BY_DESCRIPTOR, addr, offset, serial, size]);
        }
        let (handle, offset) = device::export_handle(&self.ctx, addr)?;
        let mut record = vec![BY_IPC_HANDLE, addr, offset];
        record.extend(
            handle
                .chunks(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("64 bytes are 8 words"))),
        );
        Ok(record)
    }

    fn import(&self, _rank: usize, from: usize, handle: &[u64]) -> Result<u64> {
        let (key, offset, size) = match parse_import(from, from == self.rank, handle)? {
            Parsed::Own(addr) => return Ok(addr),
            Parsed::Peer { key, offset, size } => (key, offset, size),
        };
        let mut imports = self.imports.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(import) = imports.get_mut(&key) {
            import.refs += 1;
            return Ok(import.base + offset);
        }
        let import = match key {
            ImportKey::Device { serial, .. } => {
                let memory = device::import_fd(&self.ctx, &self.fetch(from, serial)?, size)?;
                Import {
                    base: memory.base,
                    refs: 1,
                    mapping: Mapping::Device(memory),
                }
            }
            ImportKey::Host { serial, .. } => {
                let here = device::map_shared_host(&self.ctx, &self.fetch(from, serial)?, size)?;
                Import {
                    base: here as u64,
                    refs: 1,
                    mapping: Mapping::Host(size),
                }
            }
            ImportKey::Ipc(bytes) => Import {
                base: device::open_handle(&self.ctx, &bytes)?,
                refs: 1,
                mapping: Mapping::Ipc,
            },
        };
        let at = import.base + offset;
        imports.insert(key, import);
        Ok(at)
    }

    fn release(&self, from: usize, handle: &[u64]) -> Result<()> {
        let Parsed::Peer { key, .. } = parse_import(from, from == self.rank, handle)? else {
            return Ok(());
        };
        let mut imports = self.imports.lock().unwrap_or_else(|p| p.into_inner());
        let Some(import) = imports.get_mut(&key) else {
            return Ok(());
        };
        import.refs -= 1;
        if import.refs > 0 {
            return Ok(());
        }
        let import = imports.remove(&key).expect("just found");
        // SAFETY: mapped here once, taken out of the map so never undone again; the caller of
        // `release` promises that nothing queued uses it any more.
        unsafe { self.undo(import) }
    }

    fn lost_peer(&self) -> Option<Error> {
        self.job.failed_peer()
    }

    fn publish_call(
        &self,
        shape: CallShape,
        refs: CallerRefs,
        gated: bool,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<u64> {
        let seq = self.job.publish(shape, refs, deadline, timeout)?;
        if gated {
            self.job.gating(seq);
        }
        Ok(seq)
    }

    fn meet_call(
        &self,
        seq: u64,
        shape: CallShape,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Vec<CallerRefs>> {
        self.job.meet(seq, shape, deadline, timeout)
    }

    fn gate(&self) -> Option<CallGate> {
        self.gate_view.as_ref().map(|view| CallGate {
            controls: view.table.ptr(),
            seq: 0,
            layout: Job::gate_layout(),
        })
    }

    fn mismatch_of_next(&self, next: CallShape) -> Option<Error> {
        self.job.named_mismatch(Some(next))
    }

    fn gate_fault(&self) -> Option<Error> {
        self.job.gate_fault()
    }

    fn finished(&self) {
        self.job.finished(self.job.seq());
    }

    fn channel_launched(&self) {
        self.job.channel_launched();
    }

    fn fail(&self, err: &Error) {
        self.job.abort_peers(err);
    }

    fn farewell(&self) -> Result<()> {
        if self.job.aborted() {
            // Peers that are hung would hold an aborting rank at the barrier.
            return Ok(());
        }
        self.all_gather(vec![Vec::new()]).map(drop)
    }

    fn abort(&self) {
        self.job.abort();
        // An exchange over the rendezvous (a registration's, a split's) ends too, and the join
        // of a sub-communicator.
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        for id in self
            .joining
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            id.give_up();
        }
    }

    fn watch_join(&self, id: &UniqueId) {
        self.joining
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(*id);
        if self.job.aborted() {
            id.give_up();
        }
    }

    fn unwatch_join(&self, id: &UniqueId) {
        self.joining
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|j| j != id);
    }

    fn keep_mapped(&self) {
        self.keep_mapped
            .store(true, std::sync::atomic::Ordering::Release);
    }

    fn exportable_host(&self, ctx: &Arc<CudaContext>, bytes: usize) -> Result<PinnedHost> {
        PinnedHost::shareable(ctx, bytes)
    }

    fn exportable(&self, ctx: &Arc<CudaContext>, bytes: usize) -> Result<DeviceBuffer> {
        match self.sharing {
            MemorySharing::FileDescriptors => DeviceBuffer::shareable(ctx, bytes),
            MemorySharing::LegacyIpc => DeviceBuffer::new(ctx, bytes),
        }
    }

    fn close_imports(&self) -> Result<()> {
        let imports = std::mem::take(&mut *self.imports.lock().unwrap_or_else(|p| p.into_inner()));
        let mut first = Ok(());
        for import in imports.into_values() {
            // SAFETY: mapped here once, taken out of the map so never undone again; the caller
            // promises every local stream is idle.
            let undone = unsafe { self.undo(import) };
            if first.is_ok() {
                first = undone;
            }
        }
        first
    }
}

/// An allocation of another process, as [`Joined`] keys what it mapped: device memory or
/// pinned host memory by (rank, the allocation's serial there — addresses are reused, serials
/// never), legacy IPC memory by its handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum ImportKey {
    Device { from: usize, serial: u64 },
    Host { from: usize, serial: u64 },
    Ipc([u8; 64]),
}

/// One allocation of another process mapped here.
struct Import {
    /// Its first address here.
    base: u64,
    /// Imports not yet released.
    refs: usize,
    mapping: Mapping,
}

/// How an [`Import`] was mapped, for undoing it.
enum Mapping {
    Device(device::Mapped),
    /// Pinned host memory of this many bytes.
    Host(usize),
    Ipc,
}

/// A record of exported memory ([`Fabric::export`]), read.
enum Parsed {
    /// Memory of this process (its address).
    Own(u64),
    /// Another process's allocation, the offset of the exported address in it, its length.
    Peer {
        key: ImportKey,
        offset: u64,
        size: usize,
    },
}

/// Reads rank `from`'s record of exported memory (`own`: `from` is this rank, whose memory is
/// used where it is — pids cannot tell, since a rank in another PID namespace may have ours).
fn parse_import(from: usize, own: bool, handle: &[u64]) -> Result<Parsed> {
    let mut fields = Fields::new(from, handle);
    let (how, addr, offset) = (fields.word()?, fields.word()?, fields.word()?);
    if own {
        return Ok(Parsed::Own(addr));
    }
    let (key, size) = match how {
        BY_DESCRIPTOR | BY_HOST_DESCRIPTOR => {
            let (serial, size) = (fields.word()?, fields.word()? as usize);
            let key = match how {
                BY_DESCRIPTOR => ImportKey::Device { from, serial },
                _ => ImportKey::Host { from, serial },
            };
            (key, size)
        }
        _ => {
            let mut bytes = [0u8; 64];
            for (chunk, word) in bytes.chunks_mut(8).zip(fields.take(8)?) {
                chunk.copy_from_slice(&word.to_le_bytes());
            }
            (ImportKey::Ipc(bytes), 0)
        }
    };
    fields.finish()?;
    Ok(Parsed::Peer { key, offset, size })
}

impl Joined {
    /// Unmaps (or closes) an import.
    ///
    /// # Safety
    /// `import` was mapped here and is undone once; nothing queued uses it any more.
    unsafe fn undo(&self, import: Import) -> Result<()> {
        // SAFETY: the caller's contract, for each kind of mapping.
        unsafe {
            match import.mapping {
                Mapping::Device(memory) => device::unmap(&self.ctx, memory),
                Mapping::Host(len) => {
                    device::unmap_shared_host(&self.ctx, import.base as *mut u8, len)
                }
                Mapping::Ipc => device::close_handle(&self.ctx, import.base),
            }
        }
    }
}

/// The abstract socket of rank `rank`'s descriptor server in the job whose names start with
/// `prefix`.
fn server_name(prefix: &str, rank: usize) -> String {
    format!("{prefix}-r{rank}-fds")
}

impl Drop for Joined {
    fn drop(&mut self) {
        if self.keep_mapped.load(std::sync::atomic::Ordering::Acquire) {
            // A stuck gate may still read these: leaked, never unregistered or unmapped.
            std::mem::forget(self.gate_view.take());
            std::mem::forget(self.job.control().clone());
        }
    }
}

/// Every rank's control segment registered with the driver in this process, and a table of
/// their addresses in device memory: what the call gate reads (`kernels::CallGate`).
struct GateView {
    ctx: Arc<CudaContext>,
    /// The registered mappings (this process's own mapping of each rank's segment).
    registered: Vec<*mut u8>,
    table: DeviceBuffer,
}

// SAFETY: the pointers are addresses of mappings that live as long as the job; they are only
// passed back to the driver (unregistered) when the view is dropped.
unsafe impl Send for GateView {}
// SAFETY: as above; nothing reads through them here.
unsafe impl Sync for GateView {}

impl GateView {
    /// Registers every rank's control segment (`control`, by rank) with `ctx`'s driver.
    fn new(ctx: &Arc<CudaContext>, control: &[Segment]) -> Result<GateView> {
        let mut view = GateView {
            ctx: ctx.clone(),
            registered: Vec::with_capacity(control.len()),
            table: DeviceBuffer::new(ctx, control.len() * 8)?,
        };
        for segment in control {
            // SAFETY: the job's mapping of the segment, page-aligned, whole pages long, mapped
            // while the job lives — longer than this view (`Joined` drops it first).
            unsafe { device::register_host(ctx, segment.base(), segment.len()) }?;
            view.registered.push(segment.base());
        }
        let bytes: Vec<u8> = control
            .iter()
            .flat_map(|s| (s.base() as u64).to_le_bytes())
            .collect();
        view.table.copy_from_host(&bytes)?;
        Ok(view)
    }
}

impl Drop for GateView {
    fn drop(&mut self) {
        for &ptr in &self.registered {
            // SAFETY: registered by `new`, once; the executor's streams are idle or abandoned
            // by the time the fabric goes (a stuck gate kernel reading it then is the driver's
            // to fault, as for any memory of a communicator torn down under a stuck GPU).
            let _ = unsafe { device::unregister_host(&self.ctx, ptr) };
        }
    }
}
