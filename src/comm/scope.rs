//! Overlapping collectives with other work without `unsafe`: [`Communicator::scope`] hands out a
//! [`Scope`] whose calls return once enqueued and waits for all of them before it returns (on
//! unwinding too), so the buffers borrowed into it cannot be touched or freed while a GPU works
//! on them — the idea of `std::thread::scope`, for collectives.

use super::Communicator;
use crate::buffer::{Buffer, BufferMut};
use crate::element::{Element, ReduceOp};
use crate::error::Result;
use crate::plan::Collective;

impl Communicator {
    /// Overlaps collectives with other work, safely: inside `f`, [`Scope`]'s calls return once
    /// enqueued (as the `enqueue_*` calls do), and `scope` waits for every collective enqueued
    /// through it before it returns — also when `f` panics — so the buffers handed to the scope
    /// stay borrowed until their collectives have completed. No `unsafe` needed.
    ///
    /// ```
    /// use ringreduce::{Communicator, ReduceOp};
    ///
    /// let comm = Communicator::host(2)?;
    /// let mut grads = vec![vec![1.0f32, 2.0], vec![3.0, 4.0]];
    /// let other_work = comm.scope(|s| {
    ///     s.all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
    ///     // ... compute something that does not touch `grads` while the GPUs reduce ...
    ///     Ok::<_, ringreduce::Error>(40 + 2)
    /// })??;
    /// assert_eq!(other_work, 42);
    /// assert_eq!(grads, [[4.0, 6.0], [4.0, 6.0]]);
    /// # Ok::<(), ringreduce::Error>(())
    /// ```
    ///
    /// The outer `Result` is the wait's: the first error of a collective enqueued in the scope.
    ///
    /// # Errors
    /// After a timeout, a stuck GPU may still write the buffers once this has returned: read
    /// [`Communicator`]'s "A failed or timed-out call" before freeing or reusing them.
    pub fn scope<'buf, R>(&self, f: impl FnOnce(&Scope<'_, 'buf>) -> R) -> Result<R> {
        /// Waits on drop, so an unwinding `f` cannot leave collectives running on its buffers.
        struct WaitOnDrop<'c>(&'c Communicator, bool);
        impl Drop for WaitOnDrop<'_> {
            fn drop(&mut self) {
                if !self.1 {
                    // The panic is what the caller sees; a failure here marks the communicator.
                    let _ = self.0.synchronize();
                }
            }
        }
        let mut guard = WaitOnDrop(self, false);
        let scope = Scope {
            comm: self,
            buffers: std::marker::PhantomData,
        };
        let out = f(&scope);
        guard.1 = true;
        self.synchronize()?;
        Ok(out)
    }
}

/// Collectives that return once enqueued, inside [`Communicator::scope`], which waits for them.
///
/// `'buf` is a lifetime of the caller's, longer than the whole `scope` call, and invariant (like
/// `std::thread::Scope`'s `'env`), so the compiler cannot shorten it to the closure: every buffer
/// passed in stays borrowed — alive, and out of the caller's reach — until `scope` has waited
/// for its collective. Each misuse below is refused at compile time.
///
/// A buffer made inside the scope cannot be handed to it (it would be freed before the wait):
/// ```compile_fail,E0597
/// # use ringreduce::{Communicator, ReduceOp};
/// let comm = Communicator::host(2)?;
/// comm.scope(|s| {
///     let mut local = vec![vec![1.0f32; 4]; 2];
///     s.all_reduce_in_place(&mut local, ReduceOp::Sum)
/// })??;
/// # Ok::<(), ringreduce::Error>(())
/// ```
/// nor dropped, moved or touched while its collective may run:
/// ```compile_fail,E0505,E0597
/// # use ringreduce::{Communicator, ReduceOp};
/// let comm = Communicator::host(2)?;
/// let mut grads = vec![vec![1.0f32; 4]; 2];
/// comm.scope(|s| {
///     s.all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
///     drop(grads);
///     Ok::<_, ringreduce::Error>(())
/// })??;
/// # Ok::<(), ringreduce::Error>(())
/// ```
/// ```compile_fail,E0505,E0597
/// # use ringreduce::{Communicator, ReduceOp};
/// let comm = Communicator::host(2)?;
/// let mut grads = vec![vec![1.0f32; 4]; 2];
/// comm.scope(|s| {
///     s.all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
///     let moved = grads;
///     Ok::<_, ringreduce::Error>(moved)
/// })??;
/// # Ok::<(), ringreduce::Error>(())
/// ```
/// ```compile_fail,E0499
/// # use ringreduce::{Communicator, ReduceOp};
/// let comm = Communicator::host(2)?;
/// let mut grads = vec![vec![1.0f32; 4]; 2];
/// comm.scope(|s| {
///     s.all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
///     grads[0][0] = 7.0;
///     Ok::<_, ringreduce::Error>(())
/// })??;
/// # Ok::<(), ringreduce::Error>(())
/// ```
/// ```compile_fail,E0502
/// # use ringreduce::{Communicator, ReduceOp};
/// let comm = Communicator::host(2)?;
/// let mut grads = vec![vec![1.0f32; 4]; 2];
/// comm.scope(|s| {
///     s.all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
///     Ok::<_, ringreduce::Error>(grads[1][0])
/// })??;
/// # Ok::<(), ringreduce::Error>(())
/// ```
/// The same holds for [`Scope::all_reduce`]'s outputs (and its inputs cannot be written, or
/// dropped):
/// ```compile_fail,E0597
/// # use ringreduce::{Communicator, ReduceOp};
/// let comm = Communicator::host(2)?;
/// let inputs = vec![vec![1i32; 4]; 2];
/// comm.scope(|s| {
///     let mut outputs = vec![vec![0i32; 4]; 2];
///     s.all_reduce(&inputs, &mut outputs, ReduceOp::Sum)
/// })??;
/// # Ok::<(), ringreduce::Error>(())
/// ```
/// ```compile_fail,E0499
/// # use ringreduce::{Communicator, ReduceOp};
/// let comm = Communicator::host(2)?;
/// let inputs = vec![vec![1i32; 4]; 2];
/// let mut outputs = vec![vec![0i32; 4]; 2];
/// comm.scope(|s| {
///     s.all_reduce(&inputs, &mut outputs, ReduceOp::Sum)?;
///     outputs[0][0] = 3;
///     Ok::<_, ringreduce::Error>(())
/// })??;
/// # Ok::<(), ringreduce::Error>(())
/// ```
/// ```compile_fail,E0502
/// # use ringreduce::{Communicator, ReduceOp};
/// let comm = Communicator::host(2)?;
/// let mut inputs = vec![vec![1i32; 4]; 2];
/// let mut outputs = vec![vec![0i32; 4]; 2];
/// comm.scope(|s| {
///     s.all_reduce(&inputs, &mut outputs, ReduceOp::Sum)?;
///     inputs[0][0] = 3;
///     Ok::<_, ringreduce::Error>(())
/// })??;
/// # Ok::<(), ringreduce::Error>(())
/// ```
/// ```compile_fail,E0505,E0597
/// # use ringreduce::{Communicator, ReduceOp};
/// let comm = Communicator::host(2)?;
/// let inputs = vec![vec![1i32; 4]; 2];
/// let mut outputs = vec![vec![0i32; 4]; 2];
/// comm.scope(|s| {
///     s.all_reduce(&inputs, &mut outputs, ReduceOp::Sum)?;
///     drop(inputs);
///     Ok::<_, ringreduce::Error>(())
/// })??;
/// # Ok::<(), ringreduce::Error>(())
/// ```
/// and for [`Scope::collective`]'s buffers:
/// ```compile_fail,E0499
/// # use ringreduce::{Communicator, ReduceOp};
/// # use ringreduce::plan::Collective;
/// let comm = Communicator::host(2)?;
/// let mut bufs = vec![vec![1u8; 4]; 2];
/// comm.scope(|s| {
///     s.collective(&Collective::Broadcast { root: 0 }, None::<&[Vec<u8>]>, &mut bufs, ReduceOp::Sum)?;
///     bufs[1][0] = 9;
///     Ok::<_, ringreduce::Error>(())
/// })??;
/// # Ok::<(), ringreduce::Error>(())
/// ```
/// ```compile_fail,E0597
/// # use ringreduce::{Communicator, ReduceOp};
/// # use ringreduce::plan::Collective;
/// let comm = Communicator::host(2)?;
/// let inputs = vec![vec![1u8; 4]; 2];
/// comm.scope(|s| {
///     let mut outputs = vec![vec![0u8; 8]; 2];
///     s.collective(&Collective::AllGather, Some(&inputs), &mut outputs, ReduceOp::Sum)
/// })??;
/// # Ok::<(), ringreduce::Error>(())
/// ```
/// The scope itself cannot leave the closure (its calls would then outlive the wait):
/// ```compile_fail
/// # use ringreduce::Communicator;
/// let comm = Communicator::host(2)?;
/// let escaped = comm.scope(|s| s)?; // error: lifetime may not live long enough
/// # Ok::<(), ringreduce::Error>(())
/// ```
/// Each of those is the misuse alone: the same calls with the buffers used after the scope
/// compile and run.
/// ```
/// # use ringreduce::{Communicator, ReduceOp};
/// # use ringreduce::plan::Collective;
/// let comm = Communicator::host(2)?;
/// let mut grads = vec![vec![1.0f32; 4]; 2];
/// let mut inputs = vec![vec![1i32; 4]; 2];
/// let mut outputs = vec![vec![0i32; 4]; 2];
/// let mut bytes = vec![vec![1u8; 4], vec![2u8; 4]];
/// let mut gathered = vec![vec![0u8; 8]; 2];
/// comm.scope(|s| {
///     s.all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
///     s.all_reduce(&inputs, &mut outputs, ReduceOp::Sum)?;
///     s.collective(&Collective::AllGather, Some(&bytes), &mut gathered, ReduceOp::Sum)?;
///     Ok::<_, ringreduce::Error>(inputs[0][0]) // reading an input is fine
/// })??;
/// grads[0][0] = 7.0;
/// inputs[0][0] = 3;
/// outputs[0][0] = 3;
/// bytes[1][0] = 9;
/// assert_eq!(gathered[1], [1, 1, 1, 1, 2, 2, 2, 2]);
/// drop((grads, inputs, outputs, bytes, gathered));
/// # Ok::<(), ringreduce::Error>(())
/// ```
pub struct Scope<'comm, 'buf> {
    comm: &'comm Communicator,
    /// Invariant in `'buf`: `&'buf mut &'buf ()` (`std::thread::Scope`'s marker).
    buffers: std::marker::PhantomData<&'buf mut &'buf ()>,
}

impl<'buf> Scope<'_, 'buf> {
    /// [`Communicator::all_reduce_in_place`], returning once enqueued.
    pub fn all_reduce_in_place<T: Element, B: BufferMut<T>>(
        &self,
        bufs: &'buf mut [B],
        op: ReduceOp,
    ) -> Result<()> {
        // SAFETY: `bufs` is borrowed for 'buf, which outlives the scope, and the scope waits for
        // every collective enqueued through it before it ends (on unwinding too).
        unsafe { self.comm.enqueue_all_reduce_in_place(bufs, op) }
    }

    /// [`Communicator::all_reduce`], returning once enqueued.
    pub fn all_reduce<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        inputs: &'buf [I],
        outputs: &'buf mut [O],
        op: ReduceOp,
    ) -> Result<()> {
        // SAFETY: as above; shared borrows of the inputs for 'buf keep them unwritten.
        unsafe { self.comm.enqueue_all_reduce(inputs, outputs, op) }
    }

    /// [`Communicator::collective`] (any collective, see [`Communicator::enqueue_collective`]),
    /// returning once enqueued.
    pub fn collective<T: Element, I: Buffer<T>, O: BufferMut<T>>(
        &self,
        collective: &Collective,
        inputs: Option<&'buf [I]>,
        outputs: &'buf mut [O],
        op: ReduceOp,
    ) -> Result<()> {
        // SAFETY: as above: every buffer is borrowed for 'buf, which outlives the scope.
        unsafe {
            self.comm
                .enqueue_collective(collective, inputs, outputs, op, None)
        }
    }
}
