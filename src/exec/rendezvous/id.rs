//! How a job is named and launched: the [`UniqueId`] its ranks meet under (its 128 bytes and its
//! printable form), and the launcher's variables ([`LaunchEnv`]) from which every process of the
//! job derives the same id. How the ranks meet under it is the parent module's
//! (`exec::rendezvous`).
//!
//! Invariant: an id survives its bytes and its printable form; processes given the same
//! launcher variables derive the same id.

use super::{Rendezvous, VERSION};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// The size of [`UniqueId::to_bytes`], NCCL's `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// Where and under which nonce the ranks of one communicator meet (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UniqueId {
    pub(super) addr: SocketAddr,
    pub(super) nonce: u128,
}

/// Listeners bound by [`UniqueId::new`] in this process, by nonce: rank 0, when it joins in the
/// same process, takes its listener from here (the port stays bound from the id's creation on,
/// so no other program takes it meanwhile).
pub(super) fn listeners() -> &'static Mutex<HashMap<u128, TcpListener>> {
    static LISTENERS: OnceLock<Mutex<HashMap<u128, TcpListener>>> = OnceLock::new();
    LISTENERS.get_or_init(|| Mutex::new(HashMap::new()))
}

impl UniqueId {
    /// A new id at `addr` (an IP address and a port; port 0 picks a free one): binds the port
    /// now, in this process, for rank 0 to listen on — so make the id in rank 0's process (or
    /// name a port rank 0's process can bind).
    pub fn new(addr: impl ToSocketAddrs) -> Result<UniqueId> {
        let listener = TcpListener::bind(addr).map_err(|e| Error::Resource {
            what: format!("cannot bind the rendezvous port: {e}"),
        })?;
        let addr = listener.local_addr().map_err(|e| Error::Resource {
            what: format!("the rendezvous port has no address: {e}"),
        })?;
        let nonce = random_nonce();
        listeners()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(nonce, listener);
        Ok(UniqueId { addr, nonce })
    }

    /// The id as 128 bytes (NCCL's unique-id size): "rrid", the version, the address (16 bytes
    /// of IPv6 or IPv4-mapped, then the port), the nonce, zeros.
    pub fn to_bytes(&self) -> [u8; UNIQUE_ID_BYTES] {
        let mut bytes = [0u8; UNIQUE_ID_BYTES];
        bytes[..4].copy_from_slice(b"rrid");
        bytes[4] = VERSION as u8;
        let ip = match self.addr {
            SocketAddr::V4(a) => a.ip().to_ipv6_mapped(),
            SocketAddr::V6(a) => *a.ip(),
        };
        bytes[8..24].copy_from_slice(&ip.octets());
        bytes[24..26].copy_from_slice(&self.addr.port().to_le_bytes());
        bytes[32..48].copy_from_slice(&self.nonce.to_le_bytes());
        bytes
    }

    /// The id from [`UniqueId::to_bytes`]'s form; anything else is [`Error::InvalidArgument`].
    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId> {
        let bad = || Error::InvalidArgument("not a ringreduce unique id".into());
        if bytes.len() != UNIQUE_ID_BYTES
            || &bytes[..4] != b"rrid"
            || u64::from(bytes[4]) != VERSION
        {
            return Err(bad());
        }
        let octets: [u8; 16] = bytes[8..24].try_into().map_err(|_| bad())?;
        let ip = std::net::Ipv6Addr::from(octets);
        let port = u16::from_le_bytes([bytes[24], bytes[25]]);
        let nonce = u128::from_le_bytes(bytes[32..48].try_into().map_err(|_| bad())?);
        let addr = match ip.to_ipv4_mapped() {
            Some(v4) => SocketAddr::from((v4, port)),
            None => SocketAddr::from((ip, port)),
        };
        Ok(UniqueId { addr, nonce })
    }

    /// A short name of this id (its nonce in hex), for names the ranks derive alike — the
    /// shared-memory segments of host ranks in separate processes.
    pub(crate) fn tag(&self) -> String {
        format!("{:016x}", self.nonce as u64 ^ (self.nonce >> 64) as u64)
    }

    /// The address the ranks meet at.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl std::fmt::Display for UniqueId {
    /// The printable form: `rr1-` and the 128 bytes' first 48 in hex (the rest are zeros).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("rr1-")?;
        for b in &self.to_bytes()[..48] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for UniqueId {
    type Err = Error;

    fn from_str(text: &str) -> Result<UniqueId> {
        let bad = || Error::InvalidArgument(format!("{text:?} is not a ringreduce unique id"));
        let hex = text.strip_prefix("rr1-").ok_or_else(bad)?;
        if hex.len() != 96 || !hex.is_ascii() {
            return Err(bad());
        }
        let mut bytes = [0u8; UNIQUE_ID_BYTES];
        for (i, byte) in bytes.iter_mut().take(48).enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        UniqueId::from_bytes(&bytes)
    }
}

/// What a launcher tells each process (torchrun's variables, which `torch.distributed.run`,
/// DeepSpeed and most launchers set alike): this process's rank and the world, its place on its
/// host, and where rank 0's host listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    /// `RANK`.
    pub rank: usize,
    /// `WORLD_SIZE`.
    pub world: usize,
    /// `LOCAL_RANK`: which of its host's processes this is (its GPU, usually).
    pub local_rank: usize,
    /// `LOCAL_WORLD_SIZE`: the processes on this host.
    pub local_world: usize,
    /// `MASTER_ADDR`: rank 0's host.
    pub master_addr: String,
    /// `MASTER_PORT`: the port torch's own store listens on at rank 0's host.
    pub master_port: u16,
    /// `TORCHELASTIC_RUN_ID`, when set: tells one job's rendezvous from another's on the same
    /// address.
    pub run_id: Option<String>,
    /// `RINGREDUCE_PORT`: the port ringreduce's rendezvous listens on at rank 0's host; by
    /// default `MASTER_PORT + 1` (torch's store keeps `MASTER_PORT`).
    pub port: u16,
}

impl LaunchEnv {
    /// The launcher's variables of this process ([`LaunchEnv::from_vars`] over its
    /// environment).
    pub fn from_env() -> Result<LaunchEnv> {
        LaunchEnv::from_vars(|name| std::env::var(name).ok())
    }

    /// The launcher's variables as `get` gives them; a variable that is missing or not a
    /// number is [`Error::InvalidArgument`] naming it, and so is a rank outside the world.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<LaunchEnv> {
        let text = |name: &str| {
            get(name).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{name} is not set: start the processes with torchrun (or set RANK, \
                     WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT)"
                ))
            })
        };
        let number = |name: &str| -> Result<usize> {
            let value = text(name)?;
            value.trim().parse().map_err(|_| {
                Error::InvalidArgument(format!("{name}={value:?} is not a non-negative integer"))
            })
        };
        let port = |name: &str, value: usize| -> Result<u16> {
            u16::try_from(value)
                .map_err(|_| Error::InvalidArgument(format!("{name}={value} is not a TCP port")))
        };
        let (rank, world) = (number("RANK")?, number("WORLD_SIZE")?);
        let (local_rank, local_world) = (number("LOCAL_RANK")?, number("LOCAL_WORLD_SIZE")?);
        if rank >= world || local_rank >= local_world || local_world > world {
            return Err(Error::InvalidArgument(format!(
                "RANK={rank} of WORLD_SIZE={world}, LOCAL_RANK={local_rank} of \
                 LOCAL_WORLD_SIZE={local_world}: a rank is below its world size, and a host \
                 holds at most the world"
            )));
        }
        let master_port = port("MASTER_PORT", number("MASTER_PORT")?)?;
        let own_port = match get("RINGREDUCE_PORT") {
            Some(_) => port("RINGREDUCE_PORT", number("RINGREDUCE_PORT")?)?,
            None => master_port.checked_add(1).ok_or_else(|| {
                Error::InvalidArgument(
                    "MASTER_PORT=65535 leaves no port after it: set RINGREDUCE_PORT".into(),
                )
            })?,
        };
        Ok(LaunchEnv {
            rank,
            world,
            local_rank,
            local_world,
            master_addr: text("MASTER_ADDR")?,
            master_port,
            run_id: get("TORCHELASTIC_RUN_ID"),
            port: own_port,
        })
    }

    /// The id every process of the job derives alike from the same variables: rank 0's host at
    /// [`LaunchEnv::port`], and a nonce hashed from the master's address and port and the run
    /// id (so two jobs on one address, or a stale process of an earlier run, do not meet).
    pub fn unique_id(&self) -> Result<UniqueId> {
        let addr = (self.master_addr.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| {
                Error::InvalidArgument(format!(
                    "MASTER_ADDR={:?} does not resolve: {e}",
                    self.master_addr
                ))
            })?
            .next()
            .ok_or_else(|| {
                Error::InvalidArgument(format!("MASTER_ADDR={:?} has no address", self.master_addr))
            })?;
        let key = format!(
            "{}:{}:{}",
            self.master_addr,
            self.master_port,
            self.run_id.as_deref().unwrap_or("")
        );
        Ok(UniqueId {
            addr,
            nonce: stable_hash128(key.as_bytes()),
        })
    }

    /// Joins the job's rendezvous as this process's rank ([`Rendezvous::join`] with
    /// [`LaunchEnv::unique_id`]).
    pub fn join(&self, fingerprint: u64, timeout: Duration) -> Result<Rendezvous> {
        Rendezvous::join(
            &self.unique_id()?,
            self.rank,
            self.world,
            fingerprint,
            timeout,
        )
    }
}

/// A 128-bit hash every process computes alike (FNV-1a, twice with different offsets): not a
/// secret, a name.
fn stable_hash128(bytes: &[u8]) -> u128 {
    let fnv = |offset: u64| {
        bytes.iter().fold(offset, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    u128::from(fnv(0xcbf2_9ce4_8422_2325)) << 64 | u128::from(fnv(0x8422_2325_cbf2_9ce4))
}

/// 128 random bits from the OS's hasher seeds and the clock: enough to tell two jobs' ids apart
/// (not a secret: the rendezvous is not an authentication).
fn random_nonce() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let mut words = [0u64; 2];
    for (i, word) in words.iter_mut().enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_usize(i);
        h.write_u32(std::process::id());
        *word = h.finish();
    }
    u128::from(words[0]) << 64 | u128::from(words[1])
}
