//! The stages of one call of a GPU rank of a job on several hosts (the parent module's doc), as
//! its `Parts` enqueue them on their stream: where each stage's spans lie ([`Areas`]), the work
//! buffer grown to a plan's need, send/recv on NCCL's communicator of the job, and every stage
//! in order — intra-host through the executor, inter-host as NCCL calls, copies, `Avg`'s scale.

use super::Parts;
use crate::device::{self, CallerStream, DeviceBuffer};
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::hierarchy::{job_error, level_error};
use crate::exec::Shape;
use crate::plan::hierarchy::{Area, Hosts, Level, Span, Stage};
use crate::plan::Transfer;
/// Where a stage's spans lie on this rank.
pub(super) struct Areas {
    pub(super) input: Option<u64>,
    pub(super) output: Option<u64>,
    pub(super) work: u64,
    pub(super) hosts: Hosts,
    pub(super) rank: usize,
    pub(super) eb: usize,
}

impl Areas {
    /// The device address of `span` on this rank.
    fn at(&self, span: &Span) -> Result<u64> {
        let base = match span.area {
            Area::Input => self.input,
            Area::Output => self.output,
            Area::Work => Some(self.work),
        };
        let base = base.ok_or_else(|| Error::Internal {
            what: format!(
                "a hierarchical stage names the rank's {:?}, which it lacks",
                span.area
            ),
        })?;
        Ok(base + (span.offset(self.hosts, self.rank) * self.eb) as u64)
    }
}

impl Parts {
    /// The current work buffer's address, grown first where it is smaller than `bytes` — to
    /// twice its size at least, so that slowly growing shapes leave few buffers behind.
    pub(super) fn work(&mut self, device: usize, bytes: usize) -> Result<u64> {
        let have = self.works.last().map_or(0, DeviceBuffer::len_bytes);
        if have < bytes {
            let ctx = device::context(device)?;
            let grown = bytes.max(2 * have).max(256);
            self.works.push(DeviceBuffer::new(&ctx, grown)?);
        }
        Ok(self.works.last().map_or(0, DeviceBuffer::ptr))
    }

    /// Enqueues a send/recv on the stream: this rank's transfers to itself as copies, the rest on
    /// the job's NCCL communicator (its addresses as [`GpuHierarchy::run`] takes them).
    ///
    /// # Safety
    /// As for [`Parts::enqueue`], for every address this rank passes.
    pub(super) unsafe fn send_recv<T: Element>(
        &mut self,
        transfers: &[Transfer],
        sends: &[u64],
        recvs: &[u64],
        rank: usize,
    ) -> Result<()> {
        let eb = std::mem::size_of::<T>();
        for (i, t) in transfers.iter().enumerate() {
            if t.from == rank && t.to == rank {
                // SAFETY: this rank's own two buffers of transfer i; ordered on the stream.
                unsafe { device::memcpy_async(recvs[i], sends[i], t.count * eb, &self.stream)? };
            }
        }
        let job = self.job.as_mut().ok_or_else(|| Error::Internal {
            what: "a send/recv across hosts without the job's NCCL communicator".into(),
        })?;
        // SAFETY: as above, on this GPU's stream.
        unsafe { job.send_recv(transfers, T::DTYPE, sends, recvs, self.stream.raw().cast()) }
            .map_err(|e| job_error(rank, e))
    }

    /// Enqueues the stages this rank takes part in, in order, on the stream.
    ///
    /// # Safety
    /// The areas' addresses are valid for the plan's spans and untouched by anything not
    /// ordered after the call on the stream until it completes.
    pub(super) unsafe fn enqueue<T: Element>(
        &mut self,
        stages: &[Stage],
        areas: &Areas,
        op: ReduceOp,
    ) -> Result<()> {
        let (hosts, rank, eb) = (areas.hosts, areas.rank, areas.eb);
        let on_stream = CallerStream::of(self.stream.cudarc());
        for stage in stages {
            match stage {
                Stage::Copy { who, src, dst } if who.includes(hosts, rank) => {
                    // SAFETY: both ranges lie in this rank's buffers (the plan was proven
                    // against their lengths) and are disjoint; ordered on the stream.
                    unsafe {
                        device::memcpy_async(
                            areas.at(dst)?,
                            areas.at(src)?,
                            src.count * eb,
                            &self.stream,
                        )?
                    };
                }
                Stage::Scale { who, span } if who.includes(hosts, rank) => {
                    // SAFETY: as above; the kernel runs on the stream, after what wrote it.
                    unsafe {
                        self.kernels.scale(
                            &self.stream,
                            T::DTYPE,
                            areas.at(span)?,
                            span.count,
                            hosts.world(),
                            0, // (no error word: a hierarchical call is checked before it runs)
                        )?
                    };
                }
                Stage::Collective {
                    level,
                    who,
                    collective,
                    count,
                    src,
                    span,
                } if who.includes(hosts, rank) => {
                    let dst = areas.at(span)?;
                    let from = src.as_ref().map(|s| areas.at(s)).transpose()?;
                    let ran = match level {
                        Level::Intra => {
                            let l = hosts.local_of(rank);
                            let shape = Shape::collective::<T>(
                                collective.clone(),
                                *count,
                                from.is_none(),
                                op,
                            );
                            let (mut ins, mut outs) =
                                (vec![0u64; hosts.local], vec![0u64; hosts.local]);
                            outs[l] = dst;
                            if let Some(f) = from {
                                ins[l] = f;
                            }
                            let streams = [on_stream];
                            // SAFETY: this rank's ranges, ordered on the stream (the executor
                            // waits on it before and makes it wait after).
                            self.intra
                                .check_caller_streams(&streams)
                                .and_then(|streams| unsafe {
                                    self.intra.run::<T>(
                                        shape,
                                        &ins,
                                        &outs,
                                        op,
                                        false,
                                        Some(streams),
                                    )
                                })
                        }
                        // SAFETY: as above, on this GPU's stream.
                        Level::Inter => unsafe {
                            self.inter.collective(
                                collective,
                                *count,
                                T::DTYPE,
                                op,
                                from,
                                dst,
                                self.stream.raw().cast(),
                            )
                        },
                    };
                    ran.map_err(|e| level_error(*level, hosts, rank, e))?;
                }
                _ => {}
            }
        }
        Ok(())
    }
}
