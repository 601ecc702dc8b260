//! The checks of a configuration, before anything is made — of a
//! [`Communicator`](super::Communicator)'s and of a [`RankCommunicator`](super::RankCommunicator)'s
//! alike: the world, slots, chunk size and timeout within `exec::config`'s limits, and
//! deterministic mode where the algorithm and the ranks can give it.

use crate::error::{Error, Result};
use crate::exec::cuda::executor::CudaConfig;
use crate::exec::host::HostConfig;
use crate::exec::{config, Algorithm};

/// A host configuration for `world` ranks within `exec::config`'s limits (and deterministic
/// mode where host ranks can give it), before anything is made.
pub(crate) fn check_host_config(world: usize, config: &HostConfig) -> Result<()> {
    config::check_world(world)?;
    config::check_slots(config.slots)?;
    config::check_chunk(
        "chunk_elems",
        config.chunk_elems,
        std::mem::size_of::<u64>(),
    )?;
    config::check_timeout(config.timeout)?;
    if config.transport == crate::Transport::Staged && config.algorithm == Algorithm::TwoShot {
        return Err(Error::InvalidArgument(
            "the two-shot reads its peers' buffers, which staged edges cannot: use the ring, the \
             one-shot (staged, through host copies) or Auto"
                .into(),
        ));
    }
    check_deterministic_if(config.deterministic, config.algorithm, world, true)
}

/// A GPU configuration for `world` ranks within `exec::config`'s limits, before anything is
/// made (deterministic mode is checked once the executor says whether peer kernels can run).
pub(crate) fn check_cuda_config(world: usize, config: &CudaConfig) -> Result<()> {
    config::check_world(world)?;
    config::check_slots(config.slots)?;
    if let Some(chunk_bytes) = config.chunk_bytes {
        config::check_chunk("chunk_bytes", chunk_bytes, 1)?;
    }
    config::check_timeout(config.timeout)
}

pub(crate) fn check_deterministic_if(
    deterministic: bool,
    algorithm: Algorithm,
    world: usize,
    peers_ok: bool,
) -> Result<()> {
    if deterministic {
        crate::exec::algorithm::check_deterministic(algorithm, world, peers_ok)?;
    }
    Ok(())
}
