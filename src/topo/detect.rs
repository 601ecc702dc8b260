//! Detection: this host's topology, read the way `nvidia-smi topo -m` reads it. [`detect`] takes
//! bus ids and peer access from the CUDA driver ([`crate::device`]) and links from NVML
//! (libnvidia-ml, loaded at run time); [`Detected::topology`] turns the result into the
//! [`Topology`] that [`choose_ring`](super::choose_ring) takes; [`all_gpus_ring`] is the ring
//! order a communicator over every GPU gets from them.
//!
//! NVML numbers GPUs in PCI order, CUDA fastest first (and after `CUDA_VISIBLE_DEVICES`), so the
//! invariant here is that GPUs are matched between the two by PCI bus id ([`parse_pci_bus_id`]),
//! never by index. A missing or failing NVML is not an error: its links stay unknown and
//! [`Detected::notes`] says why; a topology with an unknown link is refused, never guessed.

use super::{Link, Topology};
use crate::error::{Error, Result};

/// What [`detect`] found about this host's GPUs: the input of
/// [`choose_ring`](super::choose_ring), and what is unknown.
///
/// Links come from NVML (libnvidia-ml, loaded at run time), the way `nvidia-smi topo -m` gets them:
/// for each pair (a, b), the number of *active* NVLinks of `a` whose remote end is `b` (`NV#`);
/// NVLinks that end at something that is not a GPU (an NVSwitch) connect `a` to every other GPU
/// that also has switch links — assuming one switch fabric, as on HGX boards, where `topo -m` also
/// shows `NV#` between every pair; otherwise the deepest common PCIe ancestor
/// (`nvmlDeviceGetTopologyCommonAncestor`: `PIX`, `PXB`, `PHB`, `NODE`, `SYS`). Peer access
/// comes from the CUDA driver (`cuDeviceCanAccessPeer`, per direction).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detected {
    /// Each CUDA device's PCI bus id, in CUDA ordinal order.
    pub bus_ids: Vec<String>,
    /// `links[a][b]`: the link as `nvidia-smi topo -m` labels it; `None` when it could not be
    /// read (no NVML, or a query failed — see `notes`). The diagonal is [`Link::SameDevice`].
    pub links: Vec<Vec<Option<Link>>>,
    /// `peer[from][to]`: `cuDeviceCanAccessPeer(from, to)`; the diagonal is `true`.
    pub peer: Vec<Vec<bool>>,
    /// The driver version string from NVML ("580.159.04"), when NVML loaded.
    pub nvml_driver_version: Option<String>,
    /// One line per thing that could not be read (why links are unknown); empty when all is known.
    pub notes: Vec<String>,
}

impl Detected {
    /// The [`Topology`] for [`choose_ring`](super::choose_ring); `Err` when any link is unknown (a
    /// ring order chosen from guessed links would be a guess presented as a choice).
    pub fn topology(&self) -> Result<Topology> {
        let links = self
            .links
            .iter()
            .enumerate()
            .map(|(a, row)| {
                row.iter()
                    .enumerate()
                    .map(|(b, l)| {
                        l.ok_or_else(|| {
                            Error::InvalidArgument(format!(
                                "the link between GPU {a} and GPU {b} is unknown"
                            ))
                        })
                    })
                    .collect::<Result<Vec<Link>>>()
            })
            .collect::<Result<Vec<Vec<Link>>>>()?;
        Topology::new(links, self.peer.clone())
    }
}

/// Detects this host's topology: bus ids and peer access from the CUDA driver, links from NVML.
/// [`Error::NoGpu`] without a usable driver; a missing or failing NVML is not an error — its links
/// are `None` and [`Detected::notes`] says why. Never panics (NVML calls are guarded).
pub fn detect() -> Result<Detected> {
    use crate::device;
    let devices = device::devices()?;
    let n = devices.len();
    let bus_ids: Vec<String> = devices.iter().map(|d| d.pci_bus_id.clone()).collect();
    let peer = device::peer_matrix(n)?;
    let mut notes = Vec::new();
    let unknown = || {
        (0..n)
            .map(|a| {
                (0..n)
                    .map(|b| (a == b).then_some(Link::SameDevice))
                    .collect()
            })
            .collect()
    };
    let (links, nvml_driver_version) = match std::panic::catch_unwind(|| nvml_links(&bus_ids)) {
        Ok(Ok(found)) => found,
        Ok(Err(why)) => {
            notes.push(why);
            (unknown(), None)
        }
        Err(_) => {
            notes.push("NVML panicked while reading links; links unknown".to_string());
            (unknown(), None)
        }
    };
    if n > 1 && links.iter().flatten().any(Option::is_none) && notes.is_empty() {
        notes.push("NVML could not place some pairs; those links are unknown".to_string());
    }
    Ok(Detected {
        bus_ids,
        links,
        peer,
        nvml_driver_version,
        notes,
    })
}

/// The ring order of a communicator over every visible GPU ([`crate::Communicator::all_gpus`]),
/// and a one-line reason: [`detect`] this host, then
/// [`ring_or_index_order`](super::ring_or_index_order) — [`choose_ring`](super::choose_ring)'s
/// order, or index order where the topology cannot be read (no NVML: links unknown), the reason
/// then saying why. Without a usable GPU, the error of [`crate::device::device_count`].
pub fn all_gpus_ring() -> Result<(Vec<usize>, String)> {
    let devices = crate::device::device_count()?;
    let topology = match detect() {
        Ok(found) => found.topology().map_err(|e| match found.notes.is_empty() {
            true => e.to_string(),
            false => format!("{e} ({})", found.notes.join("; ")),
        }),
        Err(e) => Err(e.to_string()),
    };
    Ok(super::ring_or_index_order(devices, topology))
}

/// A PCI bus id as (domain, bus, device, function), from either spelling: CUDA's
/// `"0000:19:00.0"` or NVML's `"00000000:19:00.0"`, any case. `None` if it is neither.
pub fn parse_pci_bus_id(text: &str) -> Option<(u32, u32, u32, u32)> {
    let mut parts = text.trim().split(':');
    let (domain, bus, rest) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let (device, function) = rest.split_once('.')?;
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    Some((hex(domain)?, hex(bus)?, hex(device)?, hex(function)?))
}

/// The `topo -m` label for NVML's common-ancestor level.
#[cfg(target_os = "linux")]
fn link_from_level(level: nvml_wrapper::enum_wrappers::device::TopologyLevel) -> Link {
    use nvml_wrapper::enum_wrappers::device::TopologyLevel;
    match level {
        // Two GPUs on one board (K80): nvidia-smi prints PIX for them.
        TopologyLevel::Internal | TopologyLevel::Single => Link::Pix,
        TopologyLevel::Multiple => Link::Pxb,
        TopologyLevel::HostBridge => Link::Phb,
        TopologyLevel::Node => Link::Node,
        TopologyLevel::System => Link::Sys,
    }
}

/// Combines per-pair NVLink counts and PCIe levels into `topo -m` links. `direct[a][b]`: active
/// NVLinks of `a` whose remote end is GPU `b`; `to_switch[a]`: active NVLinks of `a` that end at
/// something else (an NVSwitch); `pcie[a][b]`: the PCIe link, when known.
fn combine_links(
    direct: &[Vec<u32>],
    to_switch: &[u32],
    pcie: &[Vec<Option<Link>>],
) -> Vec<Vec<Option<Link>>> {
    let n = direct.len();
    (0..n)
        .map(|a| {
            (0..n)
                .map(|b| {
                    if a == b {
                        return Some(Link::SameDevice);
                    }
                    // Both ends see a direct link; take the larger count should they disagree.
                    let mut links = direct[a][b].max(direct[b][a]);
                    if to_switch[a] > 0 && to_switch[b] > 0 {
                        links += to_switch[a].min(to_switch[b]);
                    }
                    if links > 0 {
                        Some(Link::NvLink { links })
                    } else {
                        pcie[a][b].or(pcie[b][a])
                    }
                })
                .collect()
        })
        .collect()
}

/// `NVML_NVLINK_MAX_LINKS` of NVML 12/13 (nvml.h): link numbers run below it (18 on Hopper).
#[cfg(target_os = "linux")]
const NVML_NVLINK_MAX_LINKS: u32 = 18;

/// Links between the CUDA devices with these bus ids, and the driver version, from NVML.
/// `Err` (one line) when NVML cannot be loaded or a GPU cannot be found in it.
#[cfg(target_os = "linux")]
#[allow(clippy::type_complexity)]
fn nvml_links(
    bus_ids: &[String],
) -> std::result::Result<(Vec<Vec<Option<Link>>>, Option<String>), String> {
    use nvml_wrapper::Nvml;
    let nvml = Nvml::init()
        .map_err(|e| format!("NVML (libnvidia-ml) not available ({e}): links unknown"))?;
    let driver = nvml.sys_driver_version().ok();
    // Every GPU NVML sees (also those hidden from CUDA), so that an NVLink to a hidden GPU is not
    // mistaken for a switch link.
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML device count failed ({e}): links unknown"))?;
    let mut all_gpus = Vec::new();
    for index in 0..count {
        if let Ok(info) = nvml.device_by_index(index).and_then(|d| d.pci_info()) {
            if let Some(id) = parse_pci_bus_id(&info.bus_id) {
                all_gpus.push(id);
            }
        }
    }
    // NVML numbers GPUs in PCI order, CUDA fastest first (and after CUDA_VISIBLE_DEVICES): match
    // them by bus id, never by index.
    let mut handles = Vec::with_capacity(bus_ids.len());
    let mut nvml_index = Vec::with_capacity(bus_ids.len());
    for bus_id in bus_ids {
        let wanted = parse_pci_bus_id(bus_id);
        let found = (0..count).find_map(|index| {
            let device = nvml.device_by_index(index).ok()?;
            let id = parse_pci_bus_id(&device.pci_info().ok()?.bus_id);
            (id.is_some() && id == wanted).then_some((index, device))
        });
        let Some((index, device)) = found else {
            return Err(format!(
                "NVML does not list the GPU at {bus_id}: links unknown"
            ));
        };
        handles.push(device);
        nvml_index.push(index);
    }
    let n = handles.len();
    let mut direct = vec![vec![0u32; n]; n];
    let mut to_switch = vec![0u32; n];
    for (a, device) in handles.iter().enumerate() {
        for link in 0..NVML_NVLINK_MAX_LINKS {
            let wrapper = device.link_wrapper_for(link);
            // Errors (NotSupported: a GPU without NVLink, or a link number it does not have) mean
            // "not an active link".
            if !wrapper.is_active().unwrap_or(false) {
                continue;
            }
            let remote = wrapper
                .remote_pci_info()
                .ok()
                .and_then(|info| parse_pci_bus_id(&info.bus_id));
            let target = remote.and_then(|r| {
                bus_ids
                    .iter()
                    .position(|id| parse_pci_bus_id(id) == Some(r))
            });
            match target {
                Some(b) if b != a => direct[a][b] += 1,
                Some(_) => {}
                None if remote.is_some_and(|r| all_gpus.contains(&r)) => {} // a GPU hidden from CUDA
                None => to_switch[a] += 1,
            }
        }
    }
    let mut pcie = vec![vec![None; n]; n];
    for a in 0..n {
        for b in (a + 1)..n {
            // The call takes the other device by value; `Device` is a plain handle, so ask again.
            let Ok(other) = nvml.device_by_index(nvml_index[b]) else {
                continue;
            };
            pcie[a][b] = handles[a]
                .topology_common_ancestor(other)
                .ok()
                .map(link_from_level);
        }
    }
    Ok((combine_links(&direct, &to_switch, &pcie), driver))
}

#[cfg(not(target_os = "linux"))]
#[allow(clippy::type_complexity)]
fn nvml_links(
    _bus_ids: &[String],
) -> std::result::Result<(Vec<Vec<Option<Link>>>, Option<String>), String> {
    Err("NVML topology queries are Linux-only here: links unknown".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topo::choose_ring;

    #[test]
    fn pci_bus_ids_parse_in_both_spellings() {
        assert_eq!(parse_pci_bus_id("0000:19:00.0"), Some((0, 0x19, 0, 0)));
        assert_eq!(parse_pci_bus_id("00000000:19:00.0"), Some((0, 0x19, 0, 0)));
        assert_eq!(parse_pci_bus_id("0001:AB:1f.7"), Some((1, 0xab, 0x1f, 7)));
        assert_eq!(parse_pci_bus_id("19:00.0"), None);
        assert_eq!(parse_pci_bus_id("0000:19:00"), None);
        assert_eq!(parse_pci_bus_id("0000:zz:00.0"), None);
        assert_eq!(parse_pci_bus_id("0:0:0:0.0"), None);
    }

    #[test]
    fn nvlink_counts_and_pcie_levels_combine_like_topo_m() {
        // 2×H200 with 18 direct links each way: NV18.
        let links = combine_links(
            &[vec![0, 18], vec![18, 0]],
            &[0, 0],
            &[vec![None, Some(Link::Sys)], vec![None, None]],
        );
        assert_eq!(links[0][1], Some(Link::NvLink { links: 18 }));
        assert_eq!(links[1][0], Some(Link::NvLink { links: 18 }));
        assert_eq!(links[0][0], Some(Link::SameDevice));
        // Through an NVSwitch: no direct links, 18 switch links each → NV18 between every pair.
        let none = vec![vec![0; 3]; 3];
        let links = combine_links(
            &none,
            &[18, 18, 0],
            &[
                vec![None, None, Some(Link::Pix)],
                vec![None; 3],
                vec![None; 3],
            ],
        );
        assert_eq!(links[0][1], Some(Link::NvLink { links: 18 }));
        // GPU 2 has no NVLink: PCIe from either half of the matrix; unknown stays unknown.
        assert_eq!(links[0][2], Some(Link::Pix));
        assert_eq!(links[2][0], Some(Link::Pix));
        assert_eq!(links[1][2], None);
    }

    #[test]
    fn detected_topology_needs_every_link() {
        let mut d = Detected {
            bus_ids: vec!["0000:19:00.0".into(), "0000:3b:00.0".into()],
            links: vec![
                vec![Some(Link::SameDevice), None],
                vec![None, Some(Link::SameDevice)],
            ],
            peer: vec![vec![true; 2]; 2],
            nvml_driver_version: None,
            notes: vec![],
        };
        assert!(d.topology().is_err());
        d.links[0][1] = Some(Link::NvLink { links: 18 });
        d.links[1][0] = Some(Link::NvLink { links: 18 });
        let ring = choose_ring(&d.topology().expect("all links known"));
        assert_eq!(ring.order, vec![0, 1]);
    }

    #[test]
    fn detect_without_a_gpu_is_no_gpu() {
        if crate::device::driver_available().is_ok() {
            eprintln!("detect_without_a_gpu_is_no_gpu: waived: this host has a GPU");
            return;
        }
        assert!(matches!(detect(), Err(Error::NoGpu { .. })));
    }
}
