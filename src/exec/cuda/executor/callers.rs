//! A collective on the caller's streams: the entry point of every GPU call, which fences the
//! caller's streams (when given) around the communicator's own Main streams. Main then stands for
//! the caller's stream: the checker's start and completion rules make every access to a caller's
//! buffer follow the work queued before the call and precede the work queued after it.

use super::{capture, registered, CudaExecutor};
use crate::device::{self, CallerStream};
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::cuda::fabric::Exported;
use crate::exec::job::{BufferRef, CallShape, CallerRefs};
use crate::exec::Shape;
use crate::plan::{Collective, StreamKind};
use std::time::Instant;

impl CudaExecutor {
    /// Runs one collective of `shape` over device buffers (addresses laid out as
    /// [`crate::exec::caller_address`] lays them out; `inputs` empty in place).
    ///
    /// # Safety
    /// Every caller's buffer the plan of `shape` declares is a device address on its rank's GPU,
    /// valid for the declared length; written buffers overlap nothing else in the call; nothing
    /// else touches them (or writes the ones read) until the call is complete — when this returns
    /// if `wait_complete`, else once each rank's Main stream has passed the call.
    ///
    /// With `caller` streams (one per rank, enqueue only), the call starts after the work already
    /// queued on each and later work there waits for it: an event recorded on the caller's
    /// stream that Main waits for, and one recorded on Main after the call that the caller's
    /// stream waits for — Main stands for the caller's stream, which the checker's start and
    /// completion rules make exact. Events made once per rank; no host synchronisation. When the
    /// caller's streams are being captured, the collective becomes part of the caller's
    /// graph(s) (module `capture`).
    ///
    /// Over a fabric between processes, the call first meets its peers' (`Fabric::start_call`:
    /// the same shape on every rank, or [`Error::CallMismatch`] before anything is enqueued);
    /// a failure is told to the peers (`Fabric::fail`), and a blocking call's completion too.
    pub(crate) unsafe fn run<T: Element>(
        &mut self,
        shape: Shape,
        inputs: &[u64],
        outputs: &[u64],
        op: ReduceOp,
        wait_complete: bool,
        caller: Option<&[CallerStream]>,
    ) -> Result<()> {
        // Bad streams are this rank's mistake: refused before the peers hear of the call.
        if let Some(streams) = caller {
            self.check_caller_streams(streams)?;
        }
        let timeout = self.config.timeout;
        let refs = self.own_refs(&shape, inputs, outputs)?;
        let started = self.fabric.start_call(
            CallShape::of(&shape, T::DTYPE, op),
            refs,
            Instant::now() + timeout,
            timeout,
        );
        let result = started.and_then(|all| {
            if !registered::runs_registered(&all) {
                // SAFETY: our caller's contract, passed on.
                return unsafe {
                    self.run_fenced::<T>(shape, inputs, outputs, op, wait_complete, caller)
                };
            }
            // Every rank's buffers are registered: the call runs on them, peers' included.
            let (inputs, outputs) = self.registered_addresses(&shape, &all, inputs, outputs)?;
            let shape = Shape {
                registered: true,
                ..shape
            };
            self.registered_call = true;
            // SAFETY: our caller's contract for this rank's buffers; a peer's are its caller's
            // buffers of this same call (it published them for it), in memory it registered and
            // this rank mapped, valid for the plan's lengths (`Registrations::address`), and
            // borrowed by its caller until its part of the call is complete — which waits for
            // every rank's reads and writes of them (the plan's completion rule).
            let result = unsafe {
                self.run_fenced::<T>(shape, &inputs, &outputs, op, wait_complete, caller)
            };
            self.registered_call = false;
            self.registered_calls += u64::from(result.is_ok());
            result
        });
        match &result {
            Err(err) => self.fabric.fail(err),
            Ok(()) if wait_complete => self.fabric.finished(),
            Ok(()) => {}
        }
        result
    }

    /// [`CudaExecutor::run`] once the call has started across the job.
    ///
    /// # Safety
    /// As for [`CudaExecutor::run`].
    unsafe fn run_fenced<T: Element>(
        &mut self,
        shape: Shape,
        inputs: &[u64],
        outputs: &[u64],
        op: ReduceOp,
        wait_complete: bool,
        caller: Option<&[CallerStream]>,
    ) -> Result<()> {
        let Some(streams) = caller else {
            // SAFETY: our caller's contract, passed on.
            return unsafe {
                self.run_shape_on_main::<T>(shape, inputs, outputs, op, wait_complete, false)
            };
        };
        self.check_caller_streams(streams)?;
        // A capture: the plan (prepared by an earlier call) is refused if it cannot be captured
        // before any stream joins the capture, and pinned, since the graph will hold its memory.
        let captured = capture::capturing(streams)?;
        if captured {
            self.pin_for_capture(shape.clone())?;
        }
        let saved = device::save_current()?;
        for (res, stream) in self.ranks.iter().map(|r| &*r.res).zip(streams) {
            // SAFETY: the stream is live (borrowed) and of the rank's context (checked above).
            unsafe { device::record_on_raw_stream(&res.fence_in, stream.raw()) }?;
            device::wait(&res.streams[StreamKind::Main.index()], &res.fence_in)?;
        }
        // SAFETY: our caller's contract, passed on.
        let result = unsafe {
            self.run_shape_on_main::<T>(shape, inputs, outputs, op, wait_complete, captured)
        };
        // Also after a failure: the caller's stream must not run ahead of what was enqueued.
        let fenced = self
            .ranks
            .iter()
            .map(|r| &*r.res)
            .zip(streams)
            .try_for_each(|(res, stream)| {
                device::record(&res.fence_out, &res.streams[StreamKind::Main.index()])?;
                // SAFETY: as above.
                unsafe { device::wait_on_raw_stream(&res.ctx, stream.raw(), &res.fence_out) }
            });
        result.and(fenced).and(saved.restore())
    }

    /// Registers the allocation each of this process's ranks' `addrs` (one per local rank, in
    /// order) lies in, with every rank in the same turn (module `registered`): each exports its
    /// allocation and maps every peer's. A rank's buffer that cannot be registered fails the
    /// turn on every rank (each learns which rank), and nothing is registered: the inner error,
    /// after which the communicator still works. The outer error is the job's (a lost peer, a
    /// timeout), which breaks it.
    pub(crate) fn register(&mut self, addrs: &[u64]) -> Result<Result<()>> {
        if addrs.len() != self.ranks.len() {
            return Ok(Err(Error::WorldMismatch {
                world: self.ranks.len(),
                got: addrs.len(),
            }));
        }
        let _quiet = device::gate::quiet();
        // Phase 1: each rank's allocation and its export (a failed one: a record of [0]).
        let mut own = Vec::with_capacity(addrs.len());
        let mut records = Vec::with_capacity(addrs.len());
        let mut first_err = None;
        for (r, &addr) in self.ranks.iter().zip(addrs) {
            let exported = device::bind(&r.res.ctx)
                .and_then(|()| registered::registrable(addr, r.res.device))
                .map_err(|err| match err {
                    Error::WrongDevice {
                        device, expected, ..
                    } => Error::WrongDevice {
                        rank: r.rank(),
                        device,
                        expected,
                    },
                    other => other,
                })
                .and_then(|allocation| {
                    let memory = Exported::Device {
                        addr: allocation.base,
                        bytes: allocation.size,
                    };
                    let handle = self.fabric.export(r.rank(), memory)?;
                    Ok((allocation, handle))
                });
            match exported {
                Ok((allocation, handle)) => {
                    let mut record = vec![1, allocation.size as u64];
                    record.extend(handle);
                    own.push(Some(allocation));
                    records.push(record);
                }
                Err(err) => {
                    first_err.get_or_insert(err);
                    own.push(None);
                    records.push(vec![0]);
                }
            }
        }
        let records = self.fabric.all_gather(records)?;
        if let Some(err) = first_err {
            return Ok(Err(err));
        }
        if let Some(q) = records.iter().position(|r| r.first() != Some(&1)) {
            return Ok(Err(Error::InvalidArgument(format!(
                "rank {q}'s buffer could not be registered (its own error says why); no rank \
                 registered this turn"
            ))));
        }
        // Phase 2: every rank maps every peer's allocation; the turn counts only if every rank
        // of the job mapped all of them.
        let mut mapped_here = Vec::with_capacity(self.ranks.len());
        let mut imported = Vec::new();
        let mut ok = true;
        for r in &self.ranks {
            let mut mapped = Vec::with_capacity(records.len());
            for (from, record) in records.iter().enumerate() {
                let size = record[1] as usize;
                match self.fabric.import(r.rank(), from, &record[2..]) {
                    Ok(base) => {
                        imported.push((from, record[2..].to_vec()));
                        mapped.push((base, size));
                    }
                    Err(err) => {
                        ok = false;
                        first_err.get_or_insert(err);
                        break;
                    }
                }
            }
            mapped_here.push(mapped);
        }
        let flags = self
            .fabric
            .all_gather(vec![vec![u64::from(ok)]; self.ranks.len()])?;
        if let Some(q) = flags.iter().position(|f| f.first() != Some(&1)) {
            for (from, handle) in imported {
                // Nothing ran on these mappings: they go at once.
                let _ = self.fabric.release(from, &handle);
            }
            return Ok(Err(first_err.unwrap_or(Error::InvalidArgument(format!(
                "rank {q} could not map a peer's registered memory; no rank registered this turn"
            )))));
        }
        for (allocation, mapped) in own.into_iter().zip(mapped_here) {
            if let Some(own) = allocation {
                self.registrations
                    .push(registered::Registration { own, mapped });
            }
        }
        Ok(Ok(()))
    }

    /// How many calls ran on registered buffers, without copies.
    pub(crate) fn registered_calls(&self) -> u64 {
        self.registered_calls
    }

    /// Where this process's rank's buffers of a call of `shape` lie ([`CallerRefs`]); with
    /// every rank in this process, nothing to publish.
    fn own_refs(&self, shape: &Shape, inputs: &[u64], outputs: &[u64]) -> Result<CallerRefs> {
        if self.in_one_process() {
            return Ok(CallerRefs::default());
        }
        if matches!(shape.collective, Collective::SendRecv { .. }) {
            // A buffer per transfer: copied (registration covers the collectives).
            let unregistered = CallerRefs {
                input: BufferRef::Unregistered,
                output: BufferRef::Unregistered,
            };
            return Ok(unregistered);
        }
        let rank = self.ranks[0].rank();
        let (input_bytes, output_bytes) = self.buffer_bytes(shape, rank);
        let at = |list: &[u64]| list.get(rank).copied().unwrap_or(0);
        let (input, output) = (at(inputs), at(outputs));
        let find = |addr: u64, bytes: usize| -> Result<BufferRef> {
            if addr == 0 {
                return Ok(BufferRef::Absent);
            }
            if self.registrations.is_empty() {
                return Ok(BufferRef::Unregistered);
            }
            let current = device::pointer_allocation(addr)?;
            Ok(self.registrations.find(addr, bytes, current))
        };
        Ok(CallerRefs {
            input: find(input, input_bytes)?,
            output: find(output, output_bytes)?,
        })
    }

    /// The bytes of rank `rank`'s input and output (the in-place buffer) in a call of `shape`.
    fn buffer_bytes(&self, shape: &Shape, rank: usize) -> (usize, usize) {
        let c = &shape.collective;
        let bytes = |blocks: Option<usize>| blocks.unwrap_or(0) * shape.elem_bytes;
        match shape.in_place {
            true => (0, bytes(Some(c.in_place_len(self.world, shape.count)))),
            false => (
                bytes(c.input_len(rank, self.world, shape.count)),
                bytes(c.output_len(rank, self.world, shape.count)),
            ),
        }
    }

    /// Every rank's buffers of a registered call as this rank reaches them: its own as given,
    /// every peer's from the refs it published (`all`, by rank).
    fn registered_addresses(
        &self,
        shape: &Shape,
        all: &[CallerRefs],
        inputs: &[u64],
        outputs: &[u64],
    ) -> Result<(Vec<u64>, Vec<u64>)> {
        let own = self.ranks[0].rank();
        let (mut ins, mut outs) = (inputs.to_vec(), outputs.to_vec());
        ins.resize(self.world, 0);
        outs.resize(self.world, 0);
        for (q, refs) in all.iter().enumerate().filter(|&(q, _)| q != own) {
            let (input_bytes, output_bytes) = self.buffer_bytes(shape, q);
            ins[q] = self.registrations.address(q, refs.input, input_bytes)?;
            outs[q] = self.registrations.address(q, refs.output, output_bytes)?;
        }
        Ok((ins, outs))
    }

    /// Each caller's stream belongs to its rank's GPU, in the context ringreduce uses there (the
    /// device's primary context, as cudarc's `CudaContext::new` gives).
    pub(crate) fn check_caller_streams(&self, streams: &[CallerStream]) -> Result<()> {
        if streams.len() != self.ranks.len() {
            return Err(Error::WorldMismatch {
                world: self.ranks.len(),
                got: streams.len(),
            });
        }
        for (rank, (res, stream)) in self.ranks.iter().map(|r| &r.res).zip(streams).enumerate() {
            if stream.device() != res.device {
                return Err(Error::WrongDevice {
                    rank,
                    device: stream.device(),
                    expected: res.device,
                });
            }
            if stream.context() != res.ctx.cu_ctx() {
                return Err(Error::InvalidArgument(format!(
                    "rank {rank}'s stream is in another context of device {}: use the device's primary context (cudarc's CudaContext::new)",
                    res.device
                )));
            }
        }
        Ok(())
    }
}
