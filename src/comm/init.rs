//! Making a [`Communicator`]: of host ranks, on threads ([`Communicator::host`],
//! [`Communicator::host_with`]), or of GPUs ([`Communicator::new`], [`Communicator::all_gpus`],
//! [`Communicator::with_config`]). The configuration is checked (`config_checks.rs`) before
//! anything is made, and what the communicator is, its [`Facts`], is fixed here.

use super::{check_cuda_config, check_deterministic_if, check_host_config};
use super::{Communicator, Executor, Facts, State};
use crate::error::Result;
use crate::exec::algorithm::Reach;
use crate::exec::cuda::executor::{CudaConfig, CudaExecutor};
use crate::exec::host::{HostConfig, HostExecutor};
use std::sync::{Mutex, OnceLock};

impl Communicator {
    /// A communicator of `world` ranks on host threads (one thread per rank, which runs its Main
    /// stream, and a worker per other stream; blocking calls of the one- and two-shot run on at
    /// most one thread per core instead).
    pub fn host(world: usize) -> Result<Communicator> {
        Communicator::host_with(world, HostConfig::default())
    }

    /// A host communicator with explicit chunking, transport, timeout and test options.
    pub fn host_with(world: usize, config: HostConfig) -> Result<Communicator> {
        check_host_config(world, &config)?;
        let facts = Facts {
            devices: Vec::new(),
            edges: Vec::new(),
            algorithm: config.algorithm,
            reach: match config.transport {
                crate::Transport::Staged => Reach::HostStaged,
                _ => Reach::Host,
            },
            deterministic: config.deterministic,
            ll_grid: None,
        };
        Ok(Communicator::from_executor(
            world,
            facts,
            Executor::Host(Box::new(HostExecutor::new(world, config)?)),
        ))
    }

    /// A communicator over GPUs: rank `r` is GPU `devices[r]`, and the ring follows this order.
    /// Enables peer access between ring neighbours where the hardware allows and stages through
    /// pinned host memory elsewhere ([`Communicator::edges`] says which and why).
    pub fn new(devices: &[usize]) -> Result<Communicator> {
        Communicator::with_config(devices, CudaConfig::default())
    }

    /// A GPU communicator over every visible GPU, in the ring order the topology picks: rank `r`
    /// is GPU `order[r]` for the order [`crate::topo::choose_ring`] finds on the links NVML
    /// reports and the peer matrix the driver reports (the slowest edge as fast as possible), or
    /// index order where the links cannot be read (no NVML). [`crate::topo::all_gpus_ring`]
    /// gives that order and says why; [`Communicator::devices`] says which GPU each rank got.
    /// Without a usable GPU, the error of [`crate::device_count`].
    pub fn all_gpus() -> Result<Communicator> {
        let (order, _reason) = crate::topo::all_gpus_ring()?;
        Communicator::new(&order)
    }

    /// A GPU communicator with explicit transport, chunking, slots and timeout.
    pub fn with_config(devices: &[usize], config: CudaConfig) -> Result<Communicator> {
        check_cuda_config(devices.len(), &config)?;
        let (algorithm, deterministic) = (config.algorithm, config.deterministic);
        let profile = config.profile_host;
        let exec = CudaExecutor::new(devices, config)?;
        check_deterministic_if(deterministic, algorithm, devices.len(), exec.peers_ok())?;
        let facts = Facts {
            devices: exec.devices(),
            edges: exec.edges().to_vec(),
            algorithm,
            reach: exec.reach(),
            deterministic,
            ll_grid: exec.ll_grid(),
        };
        let mut comm =
            Communicator::from_executor(devices.len(), facts, Executor::Cuda(Box::new(exec)));
        comm.profile = profile.then(|| Mutex::new(Vec::new()));
        Ok(comm)
    }

    fn from_executor(world: usize, facts: Facts, exec: Executor) -> Communicator {
        Communicator {
            world,
            facts,
            state: Mutex::new(State { exec: Some(exec) }),
            failed: OnceLock::new(),
            profile: None,
        }
    }
}
