//! The communicator API: built once for a set of ranks, then used for many collectives.
//!
//! A [`Communicator`] owns an executor (host threads now; GPUs through [`crate::exec::cuda`]) and
//! a cache of checked plans, one per shape. Every call validates its arguments for real before
//! anything is enqueued — buffer count, lengths compared across all ranks, placement, overlap —
//! and returns a clear [`Error`] naming the rank. A call that fails inside the executor marks the
//! communicator failed: later calls return that error at once ([`Error::CommunicatorFailed`]);
//! make a new communicator to continue.
//!
//! ```
//! use ringreduce::{Communicator, ReduceOp};
//!
//! let comm = Communicator::host(3)?;
//! let mut bufs = vec![vec![1.0f32, 2.0], vec![10.0, 20.0], vec![100.0, 200.0]];
//! comm.all_reduce_in_place(&mut bufs, ReduceOp::Sum)?;
//! assert!(bufs.iter().all(|b| b == &[111.0, 222.0]));
//!
//! let inputs = vec![vec![4i32, -1], vec![2, 7], vec![9, 0]];
//! let mut outputs = vec![vec![0i32; 2]; 3];
//! comm.all_reduce(&inputs, &mut outputs, ReduceOp::Max)?;
//! assert_eq!(outputs[1], [9, 7]);
//! # Ok::<(), ringreduce::Error>(())
//! ```

use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::host::{HostConfig, HostExecutor};
use std::sync::Mutex;

/// Where a rank's buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Host memory (the host executor's ranks).
    Host,
    /// Device memory of the GPU with this index.
    Device(usize),
}

/// A buffer a collective can read: its placement, length in elements and base address.
pub trait Buffer<T: Element> {
    fn placement(&self) -> Placement;
    /// Length in elements.
    fn count(&self) -> usize;
    /// Base address (a host pointer or a CUDA device address).
    fn address(&self) -> u64;
}

/// A buffer a collective can write.
pub trait BufferMut<T: Element>: Buffer<T> {
    /// Base address, borrowed mutably for the duration of the call.
    fn address_mut(&mut self) -> u64;
}

macro_rules! host_buffer {
    ($($ty:ty),*) => {$(
        impl<T: Element> Buffer<T> for $ty {
            fn placement(&self) -> Placement {
                Placement::Host
            }
            fn count(&self) -> usize {
                self.len()
            }
            fn address(&self) -> u64 {
                self.as_ptr() as u64
            }
        }
    )*};
}
host_buffer!(Vec<T>, Box<[T]>, &[T], &mut [T]);

macro_rules! host_buffer_mut {
    ($($ty:ty),*) => {$(
        impl<T: Element> BufferMut<T> for $ty {
            fn address_mut(&mut self) -> u64 {
                self.as_mut_ptr() as u64
            }
        }
    )*};
}
host_buffer_mut!(Vec<T>, Box<[T]>, &mut [T]);

enum Executor {
    Host(HostExecutor),
}

struct State {
    exec: Option<Executor>,
    failed: Option<Error>,
}

/// A set of ranks that run collectives together.
pub struct Communicator {
    world: usize,
    state: Mutex<State>,
}

impl Communicator {
    /// A communicator of `world` ranks on host threads (one thread per rank, a worker per stream).
    pub fn host(world: usize) -> Result<Communicator> {
        Communicator::host_with(world, HostConfig::default())
    }

    /// A host communicator with explicit chunking, transport, timeout and test options.
    pub fn host_with(world: usize, config: HostConfig) -> Result<Communicator> {
        Ok(Communicator::from_executor(world, Executor::Host(HostExecutor::new(world, config)?)))
    }

    fn from_executor(world: usize, exec: Executor) -> Communicator {
        Communicator {
            world,
            state: Mutex::new(State { exec: Some(exec), failed: None }),
        }
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The first error a collective hit, if any (like `ncclCommGetAsyncError`); never blocks on
    /// a running collective's work.
    pub fn health(&self) -> Result<()> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match (&state.failed, &state.exec) {
            (Some(err), _) => Err(err.clone()),
            (None, None) => Err(Error::Closed),
            (None, Some(_)) => Ok(()),
        }
    }

    /// All-reduce in place: every `bufs[r]` ends holding the reduction over all ranks.
    ///
    /// On error nothing is enqueued when validation fails; when a rank fails mid-call, the
    /// buffers hold partial results (some elements reduced, some not) and the communicator is
    /// marked failed.
    pub fn all_reduce_in_place<T: Element, B: BufferMut<T>>(&self, bufs: &mut [B], op: ReduceOp) -> Result<()> {
        let count = self.validate::<T, B>(bufs, None::<&[B]>)?;
        let outputs: Vec<u64> = bufs.iter_mut().map(|b| b.address_mut()).collect();
        self.run::<T>(None, &outputs, count, op)
    }

    /// All-reduce out of place: every `outputs[r]` ends holding the reduction of all `inputs`.
    /// Inputs are never modified, on error too. Outputs may be longer than inputs; only the
    /// first `inputs[r].count()` elements are written.
    pub fn all_reduce<T: Element, I: Buffer<T>, O: BufferMut<T>>(&self, inputs: &[I], outputs: &mut [O], op: ReduceOp) -> Result<()> {
        let count = self.validate::<T, O>(outputs, Some(inputs))?;
        let ins: Vec<u64> = inputs.iter().map(|b| b.address()).collect();
        let outs: Vec<u64> = outputs.iter_mut().map(|b| b.address_mut()).collect();
        self.run::<T>(Some(&ins), &outs, count, op)
    }

    /// Checks the arguments against each other and the communicator; returns the element count.
    fn validate<T: Element, O: Buffer<T>>(&self, outputs: &[O], inputs: Option<&[impl Buffer<T>]>) -> Result<usize> {
        if outputs.is_empty() || inputs.is_some_and(|i| i.is_empty()) {
            return Err(Error::NoBuffers);
        }
        let sizes = |n: usize| if n == self.world { Ok(()) } else { Err(Error::WorldMismatch { world: self.world, got: n }) };
        sizes(outputs.len())?;
        if let Some(inputs) = inputs {
            sizes(inputs.len())?;
        }
        let source_len = |r: usize| inputs.map_or(outputs[r].count(), |i| i[r].count());
        let count = source_len(0);
        for r in 1..self.world {
            if source_len(r) != count {
                return Err(Error::LengthMismatch { rank: r, expected: count, got: source_len(r) });
            }
        }
        count.checked_mul(std::mem::size_of::<T>()).ok_or(Error::SizeOverflow { count, dtype: T::DTYPE })?;
        let placement = |p: Placement, rank: usize| match p {
            Placement::Host => Ok(()),
            Placement::Device(_) => Err(Error::WrongPlacement { rank, got: p, expected: "host memory (this is a host communicator)" }),
        };
        let bytes = |b: &dyn Buffer<T>, len: usize| (b.address(), b.address() + (len * std::mem::size_of::<T>()) as u64);
        for (rank, out) in outputs.iter().enumerate() {
            placement(out.placement(), rank)?;
            if let Some(inputs) = inputs {
                placement(inputs[rank].placement(), rank)?;
                if out.count() < count {
                    return Err(Error::OutputTooShort { rank, input: count, output: out.count() });
                }
                let (o0, o1) = bytes(out, count);
                for (q, input) in inputs.iter().enumerate() {
                    let (i0, i1) = bytes(input, count);
                    if count > 0 && o0 < i1 && i0 < o1 {
                        let _ = q;
                        return Err(Error::Overlap { rank });
                    }
                }
            }
        }
        Ok(count)
    }

    fn run<T: Element>(&self, inputs: Option<&[u64]>, outputs: &[u64], count: usize, op: ReduceOp) -> Result<()> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(err) = &state.failed {
            return Err(Error::CommunicatorFailed(Box::new(err.clone())));
        }
        let result = match state.exec.as_mut() {
            None => return Err(Error::Closed),
            Some(Executor::Host(exec)) => {
                let ins: Option<Vec<*const T>> = inputs.map(|i| i.iter().map(|&a| a as *const T).collect());
                let outs: Vec<*mut T> = outputs.iter().map(|&a| a as *mut T).collect();
                // SAFETY: `validate` checked every buffer is host memory of at least `count`
                // elements, outputs don't overlap inputs; each output is a distinct `&mut`
                // borrow held by our caller until this returns, and `run` returns only once
                // every thread is done with the buffers.
                unsafe { exec.run::<T>(ins.as_deref(), &outs, count, op) }
            }
        };
        if let Err(err) = &result {
            if !matches!(err, Error::PlanRejected(_)) {
                state.failed = Some(err.clone());
            }
        }
        result
    }

    /// Releases the communicator's threads and memory at once, whatever state it is in. Later
    /// calls return [`Error::Closed`].
    pub fn abort(&self) {
        let exec = self.state.lock().unwrap_or_else(|p| p.into_inner()).exec.take();
        drop(exec);
    }

    /// Shuts down cleanly and returns the first error the communicator met, if any.
    pub fn close(self) -> Result<()> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        drop(state.exec.take());
        match state.failed.take() {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }
}

/// All-reduce (sum) in place over one buffer per rank: the common case in one call.
///
/// Host buffers run on host threads, one per buffer.
///
/// ```
/// let mut bufs = vec![vec![1u64, 2, 3], vec![10, 20, 30]];
/// ringreduce::ring_allreduce(&mut bufs)?;
/// assert_eq!(bufs[0], [11, 22, 33]);
/// assert_eq!(bufs[1], [11, 22, 33]);
/// # Ok::<(), ringreduce::Error>(())
/// ```
pub fn ring_allreduce<T: Element, B: BufferMut<T>>(bufs: &mut [B]) -> Result<()> {
    if bufs.is_empty() {
        return Err(Error::NoBuffers);
    }
    let comm = Communicator::host(bufs.len())?;
    comm.all_reduce_in_place(bufs, ReduceOp::Sum)?;
    comm.close()
}
