//! How a rank joins its job ([`RankCommunicator::host`], [`RankCommunicator::gpu`] and their
//! `from_env_*` and `host_across` forms): the configuration is checked (`comm::config_checks`),
//! the rank meets every other at the [`UniqueId`]'s address, learns how the ranks lie on hosts,
//! and makes the executor of its kind — on one host, or a hierarchy across several.

use super::{Inner, RankCommunicator};
use crate::comm::{check_cuda_config, check_deterministic_if, check_host_config};
use crate::error::{Error, Result};
use crate::exec::cuda::executor::{CudaConfig, CudaExecutor};
use crate::exec::hierarchy::gpu::GpuHierarchy;
use crate::exec::hierarchy::host::HostHierarchy;
use crate::exec::hierarchy::InterHostFactory;
use crate::exec::host::process::ProcessRank;
use crate::exec::host::HostConfig;
use crate::exec::job;
use crate::exec::rendezvous::{LaunchEnv, Rendezvous, UniqueId};

impl RankCommunicator {
    /// Joins the job of `id` as host rank `rank` of `world`: meets every other rank at `id`'s
    /// address within `config.timeout` (every rank gets the same named error when they
    /// disagree: [`crate::exec::rendezvous`]), then maps their shared memory.
    pub fn host(
        id: &UniqueId,
        rank: usize,
        world: usize,
        config: HostConfig,
    ) -> Result<RankCommunicator> {
        check_host_config(world, &config)?;
        let mut rendezvous = ProcessRank::meet(id, rank, world, &config)?;
        let hosts = job::host_layout(&mut rendezvous)?;
        if hosts.hosts > 1 {
            return Err(Error::NoInterHost {
                hosts: hosts.hosts,
                why: "host ranks have no engine between hosts: make them with \
                      RankCommunicator::host_across and an InterHostFactory"
                    .into(),
            });
        }
        Ok(RankCommunicator {
            rank,
            world,
            inner: Inner::Host(ProcessRank::on(rendezvous, id, config)?),
            broken: None,
        })
    }

    /// [`RankCommunicator::host`] for a job that may span several hosts: each rank reports its
    /// host (its host name, or `RINGREDUCE_HOST_ID`), and where there are several, every call
    /// runs as a hierarchical collective ([`crate::plan::hierarchy`]): within each host on
    /// ringreduce's plans, across hosts on the engines `factory` makes, one per local index.
    /// Each host's ranks must be consecutive and every host must run as many
    /// ([`Error::HostLayout`]); the limits of `config` apply to one host's ranks. On one host
    /// this is [`RankCommunicator::host`] and `factory` is not used.
    pub fn host_across(
        id: &UniqueId,
        rank: usize,
        world: usize,
        config: HostConfig,
        factory: &dyn InterHostFactory,
    ) -> Result<RankCommunicator> {
        check_host_config(1, &config)?;
        let mut rendezvous = ProcessRank::meet(id, rank, world, &config)?;
        let hosts = job::host_layout(&mut rendezvous)?;
        check_host_config(hosts.local, &config)?;
        let inner = match hosts.hosts {
            1 => Inner::Host(ProcessRank::on(rendezvous, id, config)?),
            _ => Inner::Hosts(Box::new(HostHierarchy::join(
                rendezvous, hosts, config, factory,
            )?)),
        };
        Ok(RankCommunicator {
            rank,
            world,
            inner,
            broken: None,
        })
    }

    /// [`RankCommunicator::host`] with the rank, world and id from the launcher's variables
    /// ([`LaunchEnv::from_env`]: torchrun's, or `ringreduce launch`'s).
    pub fn from_env_host(config: HostConfig) -> Result<RankCommunicator> {
        let env = LaunchEnv::from_env()?;
        RankCommunicator::host(&env.unique_id()?, env.rank, env.world, config)
    }

    /// Joins the job of `id` as rank `rank` of `world` on this process's GPU `device`. The ranks
    /// may share GPUs only with `config.allow_shared_device`. GPUs without peer access between
    /// them (or `Transport::Staged`) move data through pinned host memory shared between the
    /// processes. Ranks on several hosts (each reports its host name, or `RINGREDUCE_HOST_ID`)
    /// run every call as a hierarchical collective ([`crate::plan::hierarchy`]): within each
    /// host on this executor, across hosts on NCCL, loaded at run time ([`crate::exec::nccl`];
    /// [`Error::NoInterHost`] on every rank where a rank finds none); the limits of `config`
    /// apply to one host's ranks.
    pub fn gpu(
        id: &UniqueId,
        rank: usize,
        world: usize,
        device: usize,
        config: CudaConfig,
    ) -> Result<RankCommunicator> {
        check_cuda_config(1, &config)?;
        let (algorithm, deterministic) = (config.algorithm, config.deterministic);
        let mut rendezvous =
            Rendezvous::join(id, rank, world, gpu_fingerprint(&config), config.timeout)?;
        let hosts = job::host_layout(&mut rendezvous)?;
        if hosts.hosts > 1 {
            check_cuda_config(hosts.local, &config)?;
            let fingerprint = gpu_fingerprint(&config);
            let inner = GpuHierarchy::join(rendezvous, hosts, device, config, fingerprint)?;
            return Ok(RankCommunicator {
                rank,
                world,
                inner: Inner::GpuHosts(Box::new(inner)),
                broken: None,
            });
        }
        check_cuda_config(world, &config)?;
        let exec = CudaExecutor::for_rank(rendezvous, id, device, config)?;
        check_deterministic_if(deterministic, algorithm, world, exec.peers_ok())?;
        Ok(RankCommunicator {
            rank,
            world,
            inner: Inner::Gpu { exec, device },
            broken: None,
        })
    }

    /// [`RankCommunicator::gpu`] with the rank, world and id from the launcher's variables, on
    /// GPU `LOCAL_RANK` — or GPU 0 where the process sees one GPU (a launcher that sets
    /// `CUDA_VISIBLE_DEVICES` per rank).
    pub fn from_env_gpu(config: CudaConfig) -> Result<RankCommunicator> {
        let env = LaunchEnv::from_env()?;
        let device = match crate::device::device_count()? {
            1 => 0,
            _ => env.local_rank,
        };
        RankCommunicator::gpu(&env.unique_id()?, env.rank, env.world, device, config)
    }
}

/// What every GPU rank's configuration must share, as one number.
fn gpu_fingerprint(config: &CudaConfig) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    format!(
        "{:?} {} {:?} {:?} {} {} {} {}",
        config.transport,
        config.slots,
        config.chunk_bytes,
        config.algorithm,
        config.deterministic,
        config.low_latency,
        config.allow_shared_device,
        config.peer_groups
    )
    .hash(&mut h);
    h.finish()
}
