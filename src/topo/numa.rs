//! Where a GPU sits among the host's NUMA nodes: its node and the CPUs closest to it, as Linux
//! reports them for its PCI device (`/sys/bus/pci/devices/<bus id>/numa_node`, `local_cpulist`).
//! Pinned host memory a GPU reads and writes (staged edges, host copies) belongs on its node: the
//! GPU's DMA to another node's memory crosses the CPUs' interconnect (`SYS` in `nvidia-smi topo`).
//!
//! Invariant: unreadable means unknown (`None`), never an error — a VM or a container may hide
//! sysfs, and placement is a preference, not a requirement.

use std::path::Path;

/// The NUMA node and local CPU list of the PCI device `bus_id` ("0000:19:00.0"), as sysfs
/// writes them (`"0"`, `"0-15,32-47"`); `None` for each that is missing or unreadable. The node
/// is `"-1"` where the kernel has no NUMA information.
pub fn pci_affinity(bus_id: &str) -> (Option<String>, Option<String>) {
    let dir = Path::new("/sys/bus/pci/devices").join(bus_id.to_ascii_lowercase());
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    (read("numa_node"), read("local_cpulist"))
}

/// The NUMA node of the PCI device `bus_id`, where the kernel knows one (`-1` and unreadable
/// are `None`).
pub fn pci_numa_node(bus_id: &str) -> Option<u32> {
    pci_affinity(bus_id).0.and_then(|node| node.parse().ok())
}
