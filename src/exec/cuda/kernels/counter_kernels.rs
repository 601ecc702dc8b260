//! The counter kernels: a cross-GPU "record here, wait there" made of counters in device memory,
//! for rings captured into CUDA graphs (an event wait cannot cross from one graph's capture to
//! another's, and a stream memory wait cannot time out). The protocol — which words, who writes
//! them, the memory order — is described in `cuda/counters.cuh`, beside the kernels; the words of
//! each plan are laid out by the executor (`executor/capture.rs`).
//!
//! Invariant: both launches are one block of one warp (only thread 0 works), so a cross-GPU wait
//! costs one tiny kernel on the stream that records and one on the stream that waits.

use std::ffi::c_void;

use super::{param, KernelModule, COUNTER_ERR_BIT};
use crate::device::{self, Stream};
use crate::error::{Error, Result};

/// Threads of a counter kernel's launch: one warp, of which thread 0 works.
const COUNTER_THREADS: u32 = 32;

impl KernelModule {
    /// Enqueues one signal on `stream`: `*sent += 1; *mailbox = *sent` (release, system scope),
    /// after everything before it on `stream` has completed.
    ///
    /// # Safety
    /// `sent` is a 4-byte word of this context's device memory and `mailbox` a 4-byte word of
    /// device memory writable from this context (a peer's, with peer access on), both live until
    /// the kernel has completed; only signals enqueued on one stream touch `sent`, and only they
    /// write `mailbox`.
    pub unsafe fn counter_signal(&self, stream: &Stream, sent: u64, mailbox: u64) -> Result<()> {
        self.check_stream(stream)?;
        check_words(&[("sent", sent), ("mailbox", mailbox)])?;
        let (mut sent, mut mailbox) = (sent, mailbox);
        let mut params: [*mut c_void; 2] = [param(&mut sent), param(&mut mailbox)];
        // SAFETY: rr_counter_signal(unsigned*, unsigned*) takes two pointers, passed as u64
        // device addresses that outlive the launch call; the memory is the caller's contract.
        // Launch: the function was loaded into `self.ctx`, the stream's context (`check_stream`).
        unsafe {
            device::launch_kernel(
                &self.ctx,
                &self.counters[0],
                1,
                COUNTER_THREADS,
                stream.raw(),
                &mut params,
            )
        }
    }

    /// Enqueues one wait on `stream`: the stream's later work starts once `*mailbox` has reached
    /// `*seen + 1` (then `*seen += 1`), or once `timeout_ns` have passed since the kernel
    /// started, in which case it stores `COUNTER_ERR_BIT | code` into `*error`.
    ///
    /// # Safety
    /// `mailbox` and `seen` are 4-byte words of this context's device memory, `error` a 4-byte
    /// word writable from it (host-mapped pinned memory), all live until the kernel has
    /// completed; only waits enqueued on one stream touch `seen`.
    pub unsafe fn counter_wait(
        &self,
        stream: &Stream,
        mailbox: u64,
        seen: u64,
        timeout_ns: u64,
        error: u64,
        code: u32,
    ) -> Result<()> {
        self.check_stream(stream)?;
        check_words(&[("mailbox", mailbox), ("seen", seen), ("error", error)])?;
        if code & COUNTER_ERR_BIT != 0 {
            return Err(Error::InvalidArgument(format!(
                "counter wait code {code:#x} uses the error bit"
            )));
        }
        let (mut mailbox, mut seen, mut timeout_ns, mut error, mut code) =
            (mailbox, seen, timeout_ns, error, code);
        let mut params: [*mut c_void; 5] = [
            param(&mut mailbox),
            param(&mut seen),
            param(&mut timeout_ns),
            param(&mut error),
            param(&mut code),
        ];
        // SAFETY: rr_counter_wait(const unsigned*, unsigned*, unsigned long long, unsigned*,
        // unsigned): u64, u64, u64, u64, u32 in parameter order, outliving the launch call; the
        // memory is the caller's contract.
        // Launch: the function was loaded into `self.ctx`, the stream's context (`check_stream`).
        unsafe {
            device::launch_kernel(
                &self.ctx,
                &self.counters[1],
                1,
                COUNTER_THREADS,
                stream.raw(),
                &mut params,
            )
        }
    }
}

/// Every word is a non-null, 4-byte aligned address.
fn check_words(words: &[(&str, u64)]) -> Result<()> {
    match words.iter().find(|(_, a)| *a == 0 || a % 4 != 0) {
        Some((name, address)) => Err(Error::InvalidArgument(format!(
            "counter word {name} = {address:#x} is null or not 4-byte aligned"
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::SOURCE;
    use super::*;

    #[test]
    fn error_bit_matches_the_source() {
        assert!(SOURCE.contains(&format!("#define RR_COUNTER_ERR_BIT {COUNTER_ERR_BIT:#x}u")));
    }

    #[test]
    fn words_must_be_aligned_and_present() {
        assert!(check_words(&[("a", 0x1000), ("b", 0x2004)]).is_ok());
        assert!(check_words(&[("a", 0)]).is_err());
        assert!(check_words(&[("a", 0x1002)]).is_err());
    }
}
