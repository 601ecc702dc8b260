//! Typed device buffers for users of the GPU communicator.
//!
//! A [`GpuBuffer<T>`] is `count` elements of `T` on one GPU, allocated with plain `cuMemAlloc`
//! (outside the stream-ordered pools, so peer copies into it run at link speed — see the pool trap
//! in [`crate::device`]). It implements [`Buffer`] and [`BufferMut`], so it goes straight into
//! [`crate::Communicator::all_reduce`]. A sub-range is borrowed as a [`GpuView`] (read, shared)
//! or a [`GpuViewMut`] (written, exclusive), the names of cudarc's `CudaView` and `CudaViewMut`.
//! Buffers from elsewhere (a framework's allocator) can be wrapped with [`GpuViewMut::from_raw`],
//! which the communicator checks and, when they come from a pool, grants the peer access to that
//! pool.

use crate::buffer::{Buffer, BufferMut, Placement};
use crate::device::{self, DeviceBuffer};
use crate::element::Element;
use crate::error::{Error, Result};
use std::marker::PhantomData;

/// `count` elements of `T` in one GPU's memory.
///
/// The borrow rules keep the memory alive and unaliased while a collective uses it. Views
/// ([`GpuBuffer::view`], shared) and mutable views ([`GpuBuffer::view_mut`], exclusive) borrow
/// the buffer, so it cannot be freed or dropped under them:
/// ```compile_fail,E0505
/// # use ringreduce::GpuBuffer;
/// let buf = GpuBuffer::<f32>::zeroed(0, 8)?;
/// let view = buf.view(0, 4)?;
/// buf.free()?; // the view still borrows it
/// # let _ = view;
/// # Ok::<(), ringreduce::Error>(())
/// ```
/// ```compile_fail,E0597
/// # use ringreduce::GpuBuffer;
/// let view = {
///     let buf = GpuBuffer::<f32>::zeroed(0, 8)?;
///     buf.view(0, 4)? // would outlive the buffer
/// };
/// # let _ = view;
/// # Ok::<(), ringreduce::Error>(())
/// ```
/// a mutable view (written by collectives) excludes every other use, views and mutable views
/// alike:
/// ```compile_fail,E0502
/// # use ringreduce::GpuBuffer;
/// let mut buf = GpuBuffer::<f32>::zeroed(0, 8)?;
/// let view = buf.view(0, 4)?;
/// let view_mut = buf.view_mut(4, 4)?; // written while `view` may be read
/// # let _ = (view, view_mut);
/// # Ok::<(), ringreduce::Error>(())
/// ```
/// ```compile_fail,E0499
/// # use ringreduce::GpuBuffer;
/// let mut buf = GpuBuffer::<f32>::zeroed(0, 8)?;
/// let low = buf.view_mut(0, 4)?;
/// let high = buf.view_mut(4, 4)?; // two writers of one buffer
/// # let _ = (low, high);
/// # Ok::<(), ringreduce::Error>(())
/// ```
/// and a mutable view cannot be duplicated (it is neither `Clone` nor `Copy`):
/// ```compile_fail,E0599
/// # use ringreduce::GpuBuffer;
/// let mut buf = GpuBuffer::<f32>::zeroed(0, 8)?;
/// let view_mut = buf.view_mut(0, 4)?;
/// let twin = view_mut.clone();
/// # let _ = (view_mut, twin);
/// # Ok::<(), ringreduce::Error>(())
/// ```
/// A call that returns before its collective completes is `unsafe` — its contract is the
/// caller's (the safe overlap is [`crate::Communicator::scope`]):
/// ```compile_fail,E0133
/// # use ringreduce::{Communicator, GpuBuffer, ReduceOp};
/// let comm = Communicator::new(&[0, 1])?;
/// let mut bufs = vec![GpuBuffer::<f32>::zeroed(0, 8)?, GpuBuffer::zeroed(1, 8)?];
/// comm.enqueue_all_reduce_in_place(&mut bufs, ReduceOp::Sum)?;
/// # Ok::<(), ringreduce::Error>(())
/// ```
/// Several views of one buffer at once are fine (inputs only read), as is everything above once
/// each borrow has ended:
/// ```no_run
/// # use ringreduce::{Communicator, GpuBuffer, GpuView, ReduceOp};
/// let comm = Communicator::new(&[0, 1])?;
/// let mut a = GpuBuffer::<f32>::zeroed(0, 8)?;
/// let b = GpuBuffer::<f32>::zeroed(1, 8)?;
/// let mut outs = vec![GpuBuffer::<f32>::zeroed(0, 4)?, GpuBuffer::zeroed(1, 4)?];
/// let views: Vec<GpuView<'_, f32>> = vec![a.view(0, 4)?, b.view(4, 4)?];
/// let also = a.view(2, 4)?;
/// comm.all_reduce(&views, &mut outs, ReduceOp::Sum)?;
/// drop((views, also));
/// let low = a.view_mut(0, 4)?;
/// drop(low);
/// let high = a.view_mut(4, 4)?;
/// drop(high);
/// a.free()?;
/// # Ok::<(), ringreduce::Error>(())
/// ```
#[derive(Debug)]
pub struct GpuBuffer<T: Element> {
    /// `None` for zero elements (CUDA cannot allocate zero bytes).
    mem: Option<DeviceBuffer>,
    device: usize,
    count: usize,
    _type: PhantomData<T>,
}

impl<T: Element> GpuBuffer<T> {
    /// Zeroed memory for `count` elements on `device`.
    pub fn zeroed(device: usize, count: usize) -> Result<Self> {
        let bytes = count
            .checked_mul(std::mem::size_of::<T>())
            .ok_or(Error::SizeOverflow {
                count,
                dtype: T::DTYPE,
            })?;
        let mem = if bytes == 0 {
            device::context(device)?;
            None
        } else {
            Some(DeviceBuffer::zeroed(&device::context(device)?, bytes)?)
        };
        Ok(GpuBuffer {
            mem,
            device,
            count,
            _type: PhantomData,
        })
    }

    /// A buffer on `device` holding a copy of `data`.
    pub fn from_host(device: usize, data: &[T]) -> Result<Self> {
        let mut buf = Self::zeroed(device, data.len())?;
        buf.copy_from_host(data)?;
        Ok(buf)
    }

    /// Overwrites the buffer with `data` (same length). Waits for the device's queued work first.
    pub fn copy_from_host(&mut self, data: &[T]) -> Result<()> {
        if data.len() != self.count {
            return Err(Error::LengthMismatch {
                rank: 0,
                expected: self.count,
                got: data.len(),
            });
        }
        match &mut self.mem {
            Some(mem) => mem.copy_from_host(bytemuck::cast_slice(data)),
            None => Ok(()),
        }
    }

    /// Copies the buffer to a new host vector. Waits for the device's queued work first.
    pub fn to_host(&self) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.count];
        if let Some(mem) = &self.mem {
            mem.copy_to_host(bytemuck::cast_slice_mut(&mut out))?;
        }
        Ok(out)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The GPU the buffer lives on.
    pub fn device(&self) -> usize {
        self.device
    }

    /// A writable view of elements `start..start + count` (for sub-slice collectives, e.g.
    /// misaligned outputs).
    pub fn view_mut(&mut self, start: usize, count: usize) -> Result<GpuViewMut<'_, T>> {
        Ok(GpuViewMut {
            address: self.address_of(start, count)?,
            device: self.device,
            count,
            _borrow: PhantomData,
        })
    }

    /// A read-only view of elements `start..start + count`: an input of an out-of-place
    /// collective, borrowed shared, so several views of one buffer can be inputs at once.
    pub fn view(&self, start: usize, count: usize) -> Result<GpuView<'_, T>> {
        Ok(GpuView {
            address: self.address_of(start, count)?,
            device: self.device,
            count,
            _borrow: PhantomData,
        })
    }

    /// The device address of element `start`, once `start..start + count` is checked in bounds.
    fn address_of(&self, start: usize, count: usize) -> Result<u64> {
        if start.checked_add(count).is_none_or(|end| end > self.count) {
            return Err(Error::InvalidArgument(format!(
                "slice {start}..{} of a buffer of {} elements",
                start.saturating_add(count),
                self.count
            )));
        }
        let base = self.mem.as_ref().map_or(0, |m| m.ptr());
        Ok(base + (start * std::mem::size_of::<T>()) as u64)
    }

    /// Frees the memory now, returning the driver's error if any (`Drop` does it silently).
    pub fn free(self) -> Result<()> {
        match self.mem {
            Some(mem) => mem.free(),
            None => Ok(()),
        }
    }
}

// SAFETY: a GpuBuffer owns its cuMemAlloc allocation of `count` elements on `device` and frees
// it only when dropped, which a collective's borrow of it precludes.
unsafe impl<T: Element> Buffer<T> for GpuBuffer<T> {
    fn placement(&self) -> Placement {
        Placement::Device(self.device)
    }
    fn count(&self) -> usize {
        self.count
    }
    fn address(&self) -> u64 {
        self.mem.as_ref().map_or(0, |m| m.ptr())
    }
}

// SAFETY: as above; `&mut self` makes the borrow exclusive.
unsafe impl<T: Element> BufferMut<T> for GpuBuffer<T> {
    fn address_mut(&mut self) -> u64 {
        self.address()
    }
}

/// A writable, exclusively borrowed range of device memory, from [`GpuBuffer::view_mut`] (a
/// sub-slice of a [`GpuBuffer`]) or [`GpuViewMut::from_raw`] (memory from another allocator): a
/// collective's output, or its buffer in place.
#[derive(Debug)]
pub struct GpuViewMut<'a, T: Element> {
    address: u64,
    device: usize,
    count: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

impl<T: Element> GpuViewMut<'_, T> {
    /// Wraps device memory the caller owns.
    ///
    /// # Safety
    /// `address` is a device address on `device` valid for `count` elements of `T`, aligned to
    /// `T`, and nothing else uses it while the view is used in a collective.
    pub unsafe fn from_raw(address: u64, device: usize, count: usize) -> Self {
        GpuViewMut {
            address,
            device,
            count,
            _borrow: PhantomData,
        }
    }
}

/// A read-only view into a [`GpuBuffer`], from [`GpuBuffer::view`]: a collective's input.
#[derive(Clone, Copy, Debug)]
pub struct GpuView<'a, T> {
    address: u64,
    device: usize,
    count: usize,
    _borrow: PhantomData<&'a [T]>,
}

// SAFETY: a bounds-checked view into a GpuBuffer it borrows (shared) for 'a: the memory stays
// allocated, and no `&mut` access to the buffer can write it meanwhile.
unsafe impl<T: Element> Buffer<T> for GpuView<'_, T> {
    fn placement(&self) -> Placement {
        Placement::Device(self.device)
    }
    fn count(&self) -> usize {
        self.count
    }
    fn address(&self) -> u64 {
        self.address
    }
}

// SAFETY: a mutable view is either a bounds-checked view into a GpuBuffer it borrows mutably for
// 'a, or made by `from_raw`, whose contract is exactly this trait's.
unsafe impl<T: Element> Buffer<T> for GpuViewMut<'_, T> {
    fn placement(&self) -> Placement {
        Placement::Device(self.device)
    }
    fn count(&self) -> usize {
        self.count
    }
    fn address(&self) -> u64 {
        self.address
    }
}

// SAFETY: as above.
unsafe impl<T: Element> BufferMut<T> for GpuViewMut<'_, T> {
    fn address_mut(&mut self) -> u64 {
        self.address
    }
}
