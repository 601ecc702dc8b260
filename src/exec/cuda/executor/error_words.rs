//! What a rank's error word reports, and the check that turns it into an error: a peer kernel
//! whose peers never arrive, a peer kernel that refuses its launch, a captured ring's counter
//! wait that timed out, a peer lost across processes, or a call gate that found a peer's call
//! different or never published each leave a code (defined once, in
//! `cuda/error_codes.cuh`); [`KernelFailure`] names them, and `CudaExecutor::check_error_words`
//! reads every rank's word after every blocking call, before the next call and in `synchronize`,
//! and returns an error naming the rank, the kernel and where it waited.
//!
//! Invariant: every code of [`ERROR_CODES`](crate::exec::cuda::kernels::ERROR_CODES) decodes to
//! a failure other than [`KernelFailure::Unknown`] (a test holds [`kernel_failure`] to that list).

use super::peer_words::PeerKernel;
use super::CudaExecutor;
use crate::error::{Error, Result};
use crate::exec::cuda::kernels::{
    CH_ERR_MISMATCH_BIT, CH_ERR_WAIT, COUNTER_ERR_BIT, ERR_PEER_LOST, GATE_ERR_MISMATCH,
    GATE_ERR_WAIT, LL_ERR_WAIT, PEER_ERR_END, PEER_ERR_LAUNCH, PEER_ERR_MIDDLE, PEER_ERR_START,
};

impl CudaExecutor {
    /// The first code any rank's kernel left in its error word (the kernel then returned
    /// early, so that call's output is incomplete): an error naming the rank, the kernel and
    /// where it waited — a peer kernel's barrier, or a counter wait's event. Checked after every
    /// blocking call, before the next call, and by `synchronize`. A peer kernel named is the
    /// latest peer call's (the words are checked before every call, so a code is that call's
    /// unless non-blocking calls overlapped), except for the codes only one kernel writes
    /// ([`kernel_failure`]).
    pub(super) fn check_error_words(&self) -> Result<()> {
        for (local, r) in self.ranks.iter().enumerate() {
            let (rank, code) = (r.rank(), r.res.error_code());
            let device = r.res.device;
            match kernel_failure(code) {
                None => {}
                Some(KernelFailure::CounterWait) => return Err(self.counter_timeout(local, code)),
                Some(KernelFailure::PeerLost) => {
                    return Err(self.fabric.lost_peer().unwrap_or(Error::RankFailed {
                        rank,
                        during: "a collective across processes".into(),
                        message: "a peer was lost; this rank gave the call up".into(),
                    }));
                }
                Some(KernelFailure::Mismatch) => {
                    return Err(self.fabric.gate_fault().unwrap_or(Error::CallMismatch {
                        rank,
                        theirs: "another call".into(),
                        this: rank,
                        ours: "a call its GPU found different from a peer's".into(),
                    }));
                }
                Some(KernelFailure::ChannelMismatch { peer }) => {
                    return Err(Error::CallMismatch {
                        rank: peer,
                        theirs: "a send to this rank of another size or type (or none) as its \
                                 next on that direction"
                            .into(),
                        this: rank,
                        ours: "the receive from that rank that the channel matched with it (the \
                               k-th send from a rank fills the k-th receive from it)"
                            .into(),
                    });
                }
                Some(KernelFailure::ChannelWait) => {
                    return Err(self.fabric.lost_peer().unwrap_or(Error::Timeout {
                        rank,
                        waiting_on: format!(
                            "GPU {device}'s point-to-point channel gave up: a peer's matching \
                             send or receive never came, or a rank of the job failed"
                        ),
                        after: self.config.timeout,
                    }));
                }
                Some(KernelFailure::GateWait) => {
                    return Err(self.fabric.lost_peer().unwrap_or(Error::Timeout {
                        rank,
                        waiting_on: format!(
                            "GPU {device}'s call gate gave up: a peer did not start the call"
                        ),
                        after: self.config.timeout,
                    }));
                }
                Some(KernelFailure::GaveUp { kernel, at }) => {
                    let kernel = kernel.unwrap_or(self.last_peer_kernel);
                    let waiting_on = format!(
                        "GPU {device}'s {kernel} kernel gave up {at}: a peer's kernel never arrived"
                    );
                    return Err(self.name_blocked_launch(Error::Timeout {
                        rank,
                        waiting_on,
                        after: self.config.timeout,
                    }));
                }
                Some(KernelFailure::Launch | KernelFailure::Unknown) => {
                    let kernel = self.last_peer_kernel;
                    return Err(Error::RankFailed {
                        rank,
                        during: format!("the {kernel} peer reduce"),
                        message: format!(
                            "GPU {device}'s {kernel} kernel found its launch inconsistent \
                             (code {code})"
                        ),
                    });
                }
            }
        }
        Ok(())
    }
}

/// What a rank's error word reports: one arm per code of
/// [`ERROR_CODES`](crate::exec::cuda::kernels::ERROR_CODES) (a test holds it to that list).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum KernelFailure {
    /// A peer kernel gave up waiting, `at` where ("at the start barrier"); `kernel` is the one
    /// kernel that writes the code, `None` where several do (the latest peer call's is meant).
    GaveUp {
        kernel: Option<PeerKernel>,
        at: &'static str,
    },
    /// A peer kernel refused its launch ([`PEER_ERR_LAUNCH`]).
    Launch,
    /// A captured ring's counter wait timed out ([`COUNTER_ERR_BIT`]; the other bits name the
    /// wait: `CudaExecutor::counter_timeout`).
    CounterWait,
    /// The host gave the call up: a peer is lost ([`ERR_PEER_LOST`]).
    PeerLost,
    /// The call gate found a peer's call different ([`GATE_ERR_MISMATCH`]).
    Mismatch,
    /// The call gate gave up waiting for a peer's call ([`GATE_ERR_WAIT`]).
    GateWait,
    /// A channel receive found its send different ([`CH_ERR_MISMATCH_BIT`]; the low bits name
    /// the peer).
    ChannelMismatch { peer: usize },
    /// The channel gave up waiting ([`CH_ERR_WAIT`]).
    ChannelWait,
    /// A nonzero code no kernel writes.
    Unknown,
}

/// What error word `code` reports; `None` for 0, no failure.
pub(super) fn kernel_failure(code: u32) -> Option<KernelFailure> {
    let gave_up = |kernel, at| Some(KernelFailure::GaveUp { kernel, at });
    match code {
        0 => None,
        _ if code & COUNTER_ERR_BIT != 0 => Some(KernelFailure::CounterWait),
        _ if code & CH_ERR_MISMATCH_BIT != 0 => Some(KernelFailure::ChannelMismatch {
            peer: (code & 0xffff) as usize,
        }),
        CH_ERR_WAIT => Some(KernelFailure::ChannelWait),
        PEER_ERR_START => gave_up(None, "at the start barrier"),
        PEER_ERR_END => gave_up(None, "at the end barrier"),
        PEER_ERR_MIDDLE => gave_up(Some(PeerKernel::TwoShot), "at the middle barrier"),
        LL_ERR_WAIT => gave_up(
            Some(PeerKernel::OneShotLl),
            "waiting for a peer's pushed data",
        ),
        PEER_ERR_LAUNCH => Some(KernelFailure::Launch),
        ERR_PEER_LOST => Some(KernelFailure::PeerLost),
        GATE_ERR_MISMATCH => Some(KernelFailure::Mismatch),
        GATE_ERR_WAIT => Some(KernelFailure::GateWait),
        _ => Some(KernelFailure::Unknown),
    }
}

#[cfg(test)]
mod tests {
    use super::{kernel_failure, KernelFailure, PeerKernel, LL_ERR_WAIT};
    use crate::exec::cuda::kernels::{COUNTER_ERR_BIT, ERROR_CODES};

    #[test]
    fn every_error_code_has_a_message() {
        for (name, code) in ERROR_CODES {
            let said = kernel_failure(code);
            assert!(
                said.is_some_and(|f| f != KernelFailure::Unknown),
                "{name} = {code:#x} is decoded as {said:?}"
            );
        }
    }

    #[test]
    fn every_peer_code_is_named() {
        let gave_up = |code| match kernel_failure(code) {
            Some(KernelFailure::GaveUp { kernel, at }) => (kernel, Some(at)),
            _ => (None, None),
        };
        assert_eq!(gave_up(1), (None, Some("at the start barrier")));
        assert_eq!(gave_up(2), (None, Some("at the end barrier")));
        assert_eq!(gave_up(4).0, Some(PeerKernel::TwoShot));
        let (kernel, at) = gave_up(LL_ERR_WAIT);
        assert_eq!(kernel, Some(PeerKernel::OneShotLl));
        assert_eq!(kernel.unwrap().to_string(), "LL one-shot");
        assert!(at.unwrap().contains("pushed data"));
        assert_eq!(kernel_failure(3), Some(KernelFailure::Launch));
        assert_eq!(kernel_failure(99), Some(KernelFailure::Unknown));
        assert_eq!(kernel_failure(0), None);
        assert_eq!(
            kernel_failure(super::CH_ERR_MISMATCH_BIT | 5),
            Some(KernelFailure::ChannelMismatch { peer: 5 })
        );
        assert_eq!(
            kernel_failure(COUNTER_ERR_BIT | 0x0001_0002),
            Some(KernelFailure::CounterWait)
        );
    }
}
