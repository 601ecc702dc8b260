//! Guide chapter 8, topology: NVLink, PCIe, NVSwitch domains, NUMA affinity
//! (`docs/guide/08-topology.md`).
//!
//! Runs `choose_ring` — the ring order that makes the slowest edge as fast as possible — on
//! synthetic topologies written as `nvidia-smi topo -m` labels (no GPU needed), compares it with
//! the index order where that matters, and then, where there are GPUs, detects this host's links
//! (NVML) and peer matrix (CUDA driver), the ring it would pick, and each GPU's NUMA node and CPUs.
//!
//! Run: `cargo run --release --example 08_topology`

use ringreduce::topo::{self, choose_ring, ring_for_order, Link, Topology};
use ringreduce::Result;

fn show(title: &str, topo: &Topology) -> Result<()> {
    let ring = choose_ring(topo);
    println!("## {title}");
    println!("  NVLink domains: {:?}", topo.nvlink_domains());
    println!("  {}", ring.reason);
    let index_order: Vec<usize> = (0..topo.device_count()).collect();
    if ring.order != index_order {
        let naive = ring_for_order(topo, &index_order)?;
        println!("  index order instead: {}", naive.reason);
    }
    Ok(())
}

fn main() -> Result<()> {
    println!("# synthetic topologies (estimates rank links; they do not predict throughput)");
    show(
        "2×H200 joined by NV18 (the test machine)",
        &Topology::uniform(2, Link::NvLink { links: 18 })?,
    )?;
    show(
        "8 GPUs on one NVSwitch fabric (NV18 between every pair)",
        &Topology::uniform(8, Link::NvLink { links: 18 })?,
    )?;
    let two_domains = [
        "X NV12 NV12 NV12 SYS SYS SYS SYS",
        "NV12 X NV12 NV12 SYS SYS SYS SYS",
        "NV12 NV12 X NV12 SYS SYS SYS SYS",
        "NV12 NV12 NV12 X SYS SYS SYS SYS",
        "SYS SYS SYS SYS X NV12 NV12 NV12",
        "SYS SYS SYS SYS NV12 X NV12 NV12",
        "SYS SYS SYS SYS NV12 NV12 X NV12",
        "SYS SYS SYS SYS NV12 NV12 NV12 X",
    ];
    show(
        "two 4-GPU NVLink domains joined across sockets (SYS)",
        &Topology::from_labels(&two_domains)?,
    )?;
    // PCIe only, interleaved: GPUs 0 and 2 share a switch, 1 and 3 another, on two sockets.
    let interleaved = [
        "X SYS PIX SYS",
        "SYS X SYS PIX",
        "PIX SYS X SYS",
        "SYS PIX SYS X",
    ];
    show(
        "4 PCIe GPUs, pairs 0+2 and 1+3 on two sockets",
        &Topology::from_labels(&interleaved)?,
    )?;
    let one_way = Topology::uniform(3, Link::Pix)?.deny_peer(0, 1)?;
    let ring = choose_ring(&one_way);
    println!("## 3 GPUs on one PCIe switch, no peer access 0 → 1 (one direction only)");
    println!("  {}", ring.reason);
    for e in ring.staged_edges() {
        println!(
            "  staged through pinned host memory: {} → {} ({})",
            e.from, e.to, e.est
        );
    }

    println!();
    println!("# this host");
    let detected = match topo::detect() {
        Ok(d) => d,
        Err(why) => {
            println!("no GPU: {why}");
            println!(
                "On a GPU host this part prints the links NVML reports (NV#, PIX, …, SYS), the"
            );
            println!(
                "peer matrix, the ring choose_ring picks for them, and each GPU's NUMA node and"
            );
            println!(
                "CPUs. On the 2×H200 test machine (docs/TOUR.md): NV18 both ways, peer access"
            );
            println!("OK both ways, ring 0→1→0, NUMA node -1 (no information), CPUs 0-31.");
            return Ok(());
        }
    };
    for (i, bus) in detected.bus_ids.iter().enumerate() {
        // The host thread that drives a GPU is best placed on the CPUs nearest to it.
        let dir = std::path::Path::new("/sys/bus/pci/devices").join(bus.to_ascii_lowercase());
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).map(|s| s.trim().to_string());
        let numa = read("numa_node").unwrap_or_else(|_| "?".into());
        let cpus = read("local_cpulist").unwrap_or_else(|_| "?".into());
        let links: Vec<String> = detected.links[i]
            .iter()
            .map(|l| l.map_or("?".to_string(), |l| l.to_string()))
            .collect();
        println!(
            "GPU {i} (PCI {bus}, NUMA node {numa}, CPUs {cpus}): links {}",
            links.join(" ")
        );
    }
    for note in &detected.notes {
        println!("note: {note}");
    }
    match detected.topology() {
        Ok(t) => println!("{}", choose_ring(&t).reason),
        Err(why) => println!("no ring order chosen: {why}"),
    }
    println!("peer access (row reaches column): {:?}", detected.peer);
    Ok(())
}
