//! Pinned host memory on the NUMA node of the GPU that uses it. The pages of `cuMemHostAlloc`
//! (the driver's allocation) and of an anonymous file at `posix_fallocate` (the kernel's) come
//! from wherever the allocating thread's memory policy says, by default the node the thread
//! runs on — which for a rank thread need not be its GPU's. A GPU's DMA to another node's memory
//! crosses the CPUs' interconnect (`topo::pci_numa_node` says where each GPU sits), so the
//! allocations here run under [`prefer_node`]: the thread's policy set to "preferred: the GPU's
//! node" (`set_mempolicy(MPOL_PREFERRED)`, Linux), and its own put back afterwards.
//!
//! Invariant: placement is a preference, never a failure — an unknown node, a kernel that
//! refuses the policy, or a node without free memory leaves the allocation where the kernel puts
//! it (`MPOL_PREFERRED` falls back to other nodes by itself), and the thread's policy is always
//! restored.

use std::ffi::{c_int, c_long, c_ulong};
use std::sync::Mutex;

/// `MPOL_PREFERRED` (linux/mempolicy.h).
const MPOL_PREFERRED: c_int = 1;
/// `get_mempolicy` flags: the node of the page at an address.
#[cfg(test)]
const MPOL_F_NODE: c_ulong = 1;
#[cfg(test)]
const MPOL_F_ADDR: c_ulong = 2;
/// Node masks of up to 1024 nodes.
const MASK_WORDS: usize = 1024 / c_ulong::BITS as usize;
const MAX_NODE: c_ulong = (MASK_WORDS * c_ulong::BITS as usize) as c_ulong;

/// A thread's memory policy: mode (with its flags) and node mask.
type Policy = (c_int, [c_ulong; MASK_WORDS]);

/// While alive, the calling thread prefers one NUMA node for new pages; dropped, the thread's
/// own policy is back. Not `Send`: a policy is per thread.
pub(crate) struct NodePreference {
    saved: Option<Policy>,
    _per_thread: std::marker::PhantomData<*const ()>,
}

/// Makes the calling thread prefer `node` for the pages it allocates until the value returned
/// is dropped; does nothing for `None` or where the policy cannot be read or set.
pub(crate) fn prefer_node(node: Option<u32>) -> NodePreference {
    let unchanged = NodePreference {
        saved: None,
        _per_thread: std::marker::PhantomData,
    };
    let Some(node) = node.filter(|&n| c_ulong::from(n) < MAX_NODE) else {
        return unchanged;
    };
    let Some(saved) = thread_policy() else {
        return unchanged;
    };
    let mut mask = [0 as c_ulong; MASK_WORDS];
    let bits = c_ulong::BITS as usize;
    mask[node as usize / bits] |= 1 << (node as usize % bits);
    if set_policy(MPOL_PREFERRED, &mask) {
        NodePreference {
            saved: Some(saved),
            ..unchanged
        }
    } else {
        unchanged
    }
}

impl Drop for NodePreference {
    fn drop(&mut self) {
        if let Some((mode, mask)) = self.saved {
            // Best effort: a policy the kernel gave this thread, it takes back.
            let _ = set_policy(mode, &mask);
        }
    }
}

/// The calling thread's memory policy, or `None` where the kernel will not say.
pub(crate) fn thread_policy() -> Option<Policy> {
    let mut mode: c_int = 0;
    let mut mask = [0 as c_ulong; MASK_WORDS];
    // SAFETY: `mode` and `mask` are live and as large as `MAX_NODE` says; no address is given.
    let status = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut mode as *mut c_int,
            mask.as_mut_ptr(),
            MAX_NODE,
            std::ptr::null::<u8>(),
            0 as c_ulong,
        )
    };
    (status == 0).then_some((mode, mask))
}

/// The NUMA node of the page at `addr` (which must be mapped and touched), or `None`.
#[cfg(test)]
fn node_of(addr: *const u8) -> Option<u32> {
    let mut node: c_int = -1;
    // SAFETY: `node` is live; with MPOL_F_NODE | MPOL_F_ADDR the kernel only looks `addr` up.
    let status = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut node as *mut c_int,
            std::ptr::null_mut::<c_ulong>(),
            0 as c_ulong,
            addr,
            MPOL_F_NODE | MPOL_F_ADDR,
        )
    };
    (status == 0).then(|| u32::try_from(node).ok()).flatten()
}

/// Sets the calling thread's policy; whether the kernel took it.
fn set_policy(mode: c_int, mask: &[c_ulong; MASK_WORDS]) -> bool {
    // SAFETY: `mask` is live and as large as `MAX_NODE` says.
    let status: c_long =
        unsafe { libc::syscall(libc::SYS_set_mempolicy, mode, mask.as_ptr(), MAX_NODE) };
    status == 0
}

/// The NUMA node of GPU `ordinal` (from its PCI bus id, `topo::pci_numa_node`), looked up once
/// per process and GPU; `None` where unknown.
pub(crate) fn gpu_node(ordinal: usize) -> Option<u32> {
    static NODES: Mutex<Vec<(usize, Option<u32>)>> = Mutex::new(Vec::new());
    let mut nodes = NODES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, node)) = nodes.iter().find(|(o, _)| *o == ordinal) {
        return *node;
    }
    let node = super::device_info(ordinal)
        .ok()
        .and_then(|info| crate::topo::pci_numa_node(&info.pci_bus_id));
    nodes.push((ordinal, node));
    node
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On any Linux host (node 0 always exists): the preference is set while the guard lives —
    /// a page first touched then lies on node 0 — and the thread's own policy is back after it;
    /// a node the host lacks changes nothing and fails nothing.
    #[test]
    fn a_node_preference_places_pages_and_is_undone() {
        let before = thread_policy().expect("get_mempolicy works on Linux");
        {
            let _near = prefer_node(Some(0));
            let (mode, mask) = thread_policy().unwrap();
            assert_eq!((mode, mask[0] & 1), (MPOL_PREFERRED, 1));
            let page = vec![1u8; 1 << 16];
            assert_eq!(node_of(page.as_ptr()), Some(0));
        }
        assert_eq!(thread_policy().unwrap(), before);
        {
            let _nowhere = prefer_node(Some(1000));
            assert_eq!(thread_policy().unwrap(), before);
            let _unknown = prefer_node(None);
            assert_eq!(thread_policy().unwrap(), before);
        }
        assert_eq!(thread_policy().unwrap(), before);
    }
}
