//! The creation of a [`CudaExecutor`]: over the in-process fabric ([`CudaExecutor::new`]) or
//! as one rank of a job with a process per rank ([`CudaExecutor::for_rank`]), both through
//! `build` — each rank executor binds its GPU, the ranks all-gather their GPUs' identities,
//! decide and probe their edges (module `edges`), make and exchange their peer words (module
//! `peer_words`), and start their rank threads and launchers.
//!
//! Invariant: creation refuses before any thread starts what the GPUs cannot run — a repeated
//! GPU without `allow_shared_device`, a device that does not exist, or a forced peer algorithm
//! on GPUs that do not all reach each other.

use super::edges::{self, apply_probes, edges_from_records, probe_own, probe_target, reach_peers};
use super::enqueue::gpu_rank_thread;
use super::peer_words::{
    allocate_peer_words, arena_memory, connect_peer_words, peer_kernels_fit, PeerKernel,
};
use super::rank::RankExecutor;
use super::{launch, registered, CudaConfig, CudaExecutor, CACHED_PLANS};
use crate::device;
use crate::error::{Error, Result};
use crate::exec::cuda::fabric::{Fabric, Identity, InProcess, Joined};
use crate::exec::cuda::kernels::PEER_MAX_RANKS;
use crate::exec::rendezvous::{Rendezvous, UniqueId};
use crate::exec::{Algorithm, PlanCache};
use std::collections::HashSet;
use std::sync::Arc;

impl CudaExecutor {
    /// Sets up rank `r` on GPU `devices[r]`; the ring follows the order given. The world and the
    /// options were checked against `exec::config`'s limits by the caller.
    pub(crate) fn new(devices: &[usize], config: CudaConfig) -> Result<CudaExecutor> {
        debug_assert!(!devices.is_empty());
        device::driver_available()?;
        check_devices(devices)?;
        let fabric = InProcess::new(devices.len());
        CudaExecutor::build(Arc::new(fabric), devices, config)
    }

    /// Sets up this process's one rank of a job whose ranks met at `rendezvous`, each in a
    /// process of its own, on its GPU `device`: the same executor over
    /// the [`Joined`] fabric. The caller's buffers a peer touches are staged through memory this
    /// rank exports (`stages_callers`, `rank::Staged`), since no peer can reach them (but the LL
    /// one-shot's, which reach none).
    pub(crate) fn for_rank(
        rendezvous: Rendezvous,
        id: &UniqueId,
        device: usize,
        config: CudaConfig,
    ) -> Result<CudaExecutor> {
        device::driver_available()?;
        check_devices(&[device])?;
        let fabric = Joined::new(rendezvous, id, device)?;
        CudaExecutor::build(Arc::new(fabric), &[device], config)
    }

    /// The executor of the fabric's local ranks, on `devices` (one per local rank, in order).
    fn build(
        fabric: Arc<dyn Fabric>,
        devices: &[usize],
        config: CudaConfig,
    ) -> Result<CudaExecutor> {
        debug_assert!(config.slots >= 1 && config.chunk_bytes != Some(0));
        // Loading kernels, creating streams, enabling peer access and probing edges may wait for
        // the GPUs: none of it overlaps another communicator's peer kernels (`device::gate`).
        let _quiet = device::gate::quiet();
        let world = fabric.world();
        let mut ranks = fabric
            .local_ranks()
            .zip(devices)
            .map(|(rank, &device)| RankExecutor::new(rank, device))
            .collect::<Result<Vec<_>>>()?;
        // Every rank learns every rank's GPU by identity; two ranks on one GPU are refused
        // unless shared GPUs are allowed.
        let records = fabric.all_gather(ranks.iter().map(|r| r.identity.record()).collect())?;
        let identities = records
            .iter()
            .enumerate()
            .map(|(from, r)| Identity::from_record(from, r))
            .collect::<Result<Vec<_>>>()?;
        for (second, id) in identities.iter().enumerate() {
            match identities[..second].iter().position(|o| o.uuid == id.uuid) {
                Some(first) if !config.allow_shared_device => {
                    return Err(Error::DuplicateDevice {
                        device: identities[second].ordinal,
                        first,
                        second,
                    })
                }
                _ => {}
            }
        }
        let shared_gpu = identities
            .iter()
            .enumerate()
            .any(|(i, id)| identities[..i].iter().any(|o| o.uuid == id.uuid));
        // Every rank decides its own edge from how its context reaches its peers' GPUs (the
        // fabric's reach, asked by identity), and whether it reaches all of them directly; the
        // records tell every rank every edge.
        let all_pairs = peer_kernels_fit(world, config.transport);
        let records = ranks
            .iter()
            .map(|r| reach_peers(&r.res, &*fabric, &identities, config.transport, all_pairs))
            .collect::<Result<Vec<_>>>()?;
        let (mut edges, all_direct) =
            edges_from_records(&fabric.all_gather(records)?, &identities)?;
        let peers_ok = all_pairs && all_direct;
        if config.probe_edges && !edges.is_empty() {
            // Each rank times its own halves of its two edges (a push into a target its
            // receiver exported, or its half of a staged edge); the targets live until every
            // figure is in.
            let links = edges::links(&edges, &identities);
            let mut targets = Vec::with_capacity(ranks.len());
            let mut records = Vec::with_capacity(ranks.len());
            for r in &ranks {
                let (target, record) = probe_target(&r.res, &*fabric, &edges, &identities)?;
                targets.push(target);
                records.push(record);
            }
            let records = fabric.all_gather(records)?;
            let figures = ranks
                .iter()
                .map(|r| probe_own(&r.res, &*fabric, &edges, &identities, &links, &records))
                .collect::<Result<Vec<_>>>()?;
            let figures = fabric.all_gather(figures)?;
            drop(targets);
            apply_probes(&mut edges, &identities, &links, &figures)?;
        }
        // Ranks whose GPUs do not all reach each other run the staged one-shot: its barrier
        // words in pinned host memory, as its host copies are.
        let staged_oneshot = !peers_ok && (2..=PEER_MAX_RANKS).contains(&world);
        if peers_ok || staged_oneshot {
            // Ranks in other processes (one a process) whose calls are gated each prepare a
            // kernel plan alone when it fits their arenas (module `prepare`): the arenas are
            // made and exchanged now, before any kernel runs (an allocation waits for this
            // rank's kernels in flight, which may wait for a late peer).
            // Where the GPUs do not reach each other the arenas are pinned host memory, which
            // every GPU maps: the plans prepared alone run there too.
            let alone = ranks.len() == 1 && world > 1 && fabric.gate().is_some();
            let arena = alone.then_some(arena_memory(peers_ok));
            let mut own = Vec::with_capacity(ranks.len());
            let mut records = Vec::with_capacity(ranks.len());
            for r in &ranks {
                let low_latency = config.low_latency && peers_ok;
                // The point-to-point channel's region, where asked, the ranks' GPUs reach each
                // other and the kernel serves their number.
                let channel = config.peer_groups && alone && peers_ok && world <= PEER_MAX_RANKS;
                let (words, record) = allocate_peer_words(
                    &r.res,
                    &*fabric,
                    low_latency,
                    staged_oneshot,
                    arena,
                    channel,
                )?;
                own.push(words);
                records.push(record);
            }
            let records = fabric.all_gather(records)?;
            for (r, words) in ranks.iter_mut().zip(own) {
                let connected = connect_peer_words(
                    &r.res,
                    &*fabric,
                    words,
                    &records,
                    &identities,
                    config.timeout,
                )?;
                r.peer = Some(connected);
            }
        }
        // The one-shot has a staged form (host copies); the two-shot reads its peers' GPUs.
        let runs_staged = staged_oneshot && config.algorithm == Algorithm::OneShot;
        if config.algorithm.reads_peers() && !peers_ok && !runs_staged {
            return Err(Error::InvalidArgument(format!(
                "Algorithm::{:?} needs 2 to {PEER_MAX_RANKS} ranks on GPUs that all reach each \
                 other over peer access, and a transport other than Staged (the one-shot runs \
                 staged, through host copies, from 2 to {PEER_MAX_RANKS} ranks)",
                config.algorithm
            )));
        }
        let threads = ranks
            .iter()
            .map(|r| {
                let (res, peer) = (r.res.clone(), r.peer.clone());
                let (tx, rx) = crossbeam_channel::unbounded();
                let handle = std::thread::Builder::new()
                    .name(format!("ringreduce-gpu-{}", res.device))
                    .spawn(move || gpu_rank_thread(res, peer, rx))
                    .map_err(|e| Error::Resource {
                        what: format!("cannot start a rank thread: {e}"),
                    })?;
                Ok((tx, handle))
            })
            .collect::<Result<Vec<_>>>()?;
        // Launcher threads launch the other local ranks' peer kernels beside the caller's.
        let launchers = match peers_ok && config.launch_threads && ranks.len() > 1 {
            true => {
                let parts: Vec<_> = ranks
                    .iter()
                    .map(|r| (r.res.clone(), r.peer.clone()))
                    .collect();
                Some(Box::new(launch::Launchers::start(&parts)?))
            }
            false => None,
        };
        // Peers in other processes: a thread stops this process's kernels once one is lost.
        let watcher = match ranks.len() < world {
            true => {
                let own = ranks.iter().map(|r| r.res.clone()).collect();
                Some(super::watch::Watcher::start(fabric.clone(), own)?)
            }
            false => None,
        };
        Ok(CudaExecutor {
            fabric,
            world,
            ranks,
            threads,
            edges,
            config,
            cache: PlanCache::new(CACHED_PLANS),
            pool_granted: HashSet::new(),
            prepared_plans: 0,
            peers_ok,
            staged_oneshot,
            shared_gpu,
            pinned: Vec::new(),
            last_peer_kernel: PeerKernel::OneShot,
            launch_blocked: std::sync::Mutex::new(None),
            launchers,
            registrations: registered::Registrations::default(),
            last_ran: None,
            watcher,
        })
    }
}

/// Every ordinal names a device of this process.
fn check_devices(devices: &[usize]) -> Result<()> {
    let count = device::device_count()?;
    match devices.iter().find(|&&d| d >= count) {
        Some(&bad) => Err(Error::InvalidArgument(format!(
            "device {bad} does not exist ({count} visible)"
        ))),
        None => Ok(()),
    }
}
