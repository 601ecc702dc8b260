//! The call gate (`cuda/gate.cuh`): one tiny kernel at the start of a call across processes
//! that compares the call with every peer's of the same number, on the GPU, before the call
//! touches any peer's memory — so that no host waits for its peers' hosts (module
//! `exec::job::calls` publishes the calls it compares).

use std::ffi::c_void;

use super::{param, KernelModule};
use crate::device::Stream;
use crate::error::{Error, Result};
use crate::exec::job::GateLayout;

/// Threads of the gate's launch: one warp, of which thread 0 works.
const GATE_THREADS: u32 = 32;

impl KernelModule {
    /// Enqueues the gate of call `seq` of rank `rank` (of `world`) on `stream`: later work on
    /// `stream` starts once every peer has published call `seq` alike, or once the gate has left
    /// a code in `*error` (then the call's peer kernels touch nothing of the peers').
    ///
    /// # Safety
    /// `controls` is device memory of this context holding `world` addresses, rank q's control
    /// segment as this GPU reaches it (host memory registered with the driver, laid out as
    /// `layout` says), all live until the kernel has completed; this rank's slot of `seq` is
    /// written; `error` is a 4-byte word writable from this context (host-mapped pinned memory).
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn call_gate(
        &self,
        stream: &Stream,
        controls: u64,
        world: u32,
        rank: u32,
        seq: u64,
        layout: GateLayout,
        timeout_ns: u64,
        error: u64,
    ) -> Result<()> {
        self.check_stream(stream)?;
        if controls == 0 || error == 0 || rank >= world {
            return Err(Error::InvalidArgument(format!(
                "call gate of rank {rank} of {world}: controls {controls:#x}, error {error:#x}"
            )));
        }
        let (mut controls, mut world, mut rank, mut seq, mut layout, mut timeout_ns, mut error) =
            (controls, world, rank, seq, layout, timeout_ns, error);
        let mut params: [*mut c_void; 7] = [
            param(&mut controls),
            param(&mut world),
            param(&mut rank),
            param(&mut seq),
            param(&mut layout),
            param(&mut timeout_ns),
            param(&mut error),
        ];
        // SAFETY: rr_call_gate(const rr_ull* const*, unsigned, unsigned, rr_ull, rr_gate_layout,
        // unsigned long long, unsigned*): u64, u32, u32, u64, a #[repr(C)] struct of eight u32
        // (rr_gate_layout, field for field), u64, u64 in parameter order, outliving the launch
        // call; the memory is the caller's contract.
        unsafe { self.launch_grid(stream, &self.gate, 1, GATE_THREADS, &mut params) }
    }
}

#[cfg(test)]
mod tests {
    use super::super::SOURCE;

    #[test]
    fn the_layout_struct_matches_the_source_field_for_field() {
        // GateLayout's fields, in order, are the kernel's rr_gate_layout's.
        let start = SOURCE
            .find("struct rr_gate_layout {")
            .expect("rr_gate_layout");
        let body = &SOURCE[start..start + SOURCE[start..].find("};").unwrap()];
        let fields: Vec<&str> = body
            .lines()
            .filter_map(|l| l.trim().strip_prefix("unsigned "))
            .map(|l| l.split(';').next().unwrap())
            .collect();
        assert_eq!(
            fields,
            [
                "published",
                "abort",
                "gated",
                "fault",
                "slots",
                "slot_words",
                "call_slots",
                "compared"
            ]
        );
        assert_eq!(std::mem::size_of::<crate::exec::job::GateLayout>(), 8 * 4);
    }
}
