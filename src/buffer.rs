//! What a collective reads and writes: [`Buffer`] and [`BufferMut`], implemented for host slices
//! and vectors here and for GPU memory in [`crate::exec::cuda::gpu_buffer`], and the [`Placement`]
//! each one names (host, or the GPU it lives on). Below every module that moves data, so the
//! plan, the executors and the communicator all speak of buffers the same way.

use crate::element::Element;
use cudarc::driver::CudaStream;

/// Where a rank's buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Host memory (the host executor's ranks).
    Host,
    /// Device memory of the GPU with this index.
    Device(usize),
}

/// When a collective's work on a buffer is enqueued on a stream, told to buffers that track
/// their own uses on streams (cudarc's slices record read and write events).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamUse {
    /// Before the work is enqueued: make the stream wait for the buffer's earlier uses.
    Before,
    /// After the work is enqueued: record the use, so the buffer's later uses wait for it.
    After,
}

/// A buffer a collective can read: its placement, length in elements and base address.
///
/// # Safety
/// The executors read (and, through [`BufferMut`], write) `count()` elements of `T` at
/// `address()` in the memory `placement()` names, on other threads and on GPU streams, while the
/// buffer is borrowed by a collective. An implementation promises that this memory is valid,
/// aligned for `T`, stays allocated and is not used by anything else for that borrow, and that
/// the three methods return the same values throughout it.
pub unsafe trait Buffer<T: Element> {
    /// Where the memory lives: host, or the GPU it was allocated on.
    fn placement(&self) -> Placement;
    /// Length in elements.
    fn count(&self) -> usize;
    /// Base address (a host pointer or a CUDA device address).
    fn address(&self) -> u64;
    /// A GPU collective's reads of this buffer are enqueued on `stream` ([`StreamUse`] says
    /// whether before or after). For buffers that track their own uses; the default does nothing.
    fn on_stream(&self, _stream: &CudaStream, _when: StreamUse) {}
}

/// A buffer a collective can write.
///
/// # Safety
/// As for [`Buffer`], and the memory may be written while mutably borrowed by a collective.
pub unsafe trait BufferMut<T: Element>: Buffer<T> {
    /// Base address, borrowed mutably for the duration of the call.
    fn address_mut(&mut self) -> u64;
    /// As [`Buffer::on_stream`], for work that writes the buffer. The default does nothing.
    fn on_stream_mut(&mut self, _stream: &CudaStream, _when: StreamUse) {}
}

/// GPU memory named by its address, as C callers pass it (NCCL's `sendbuff`/`recvbuff`): `count`
/// elements of `T` at `address` on GPU `device`. Nothing tracks it; its lifetime is the caller's
/// promise ([`DeviceMemory::new`]).
#[derive(Clone, Copy, Debug)]
pub struct DeviceMemory<T> {
    address: u64,
    count: usize,
    device: usize,
    _element: std::marker::PhantomData<T>,
}

impl<T: Element> DeviceMemory<T> {
    /// The memory at `address`.
    ///
    /// # Safety
    /// `count` elements of `T` at `address` are device memory of GPU `device` (any allocation
    /// its primary context can reach), aligned for `T`, valid and untouched by anything else for
    /// as long as a collective borrows this value — and, enqueued, until its stream passes the
    /// collective.
    pub unsafe fn new(address: u64, count: usize, device: usize) -> DeviceMemory<T> {
        DeviceMemory {
            address,
            count,
            device,
            _element: std::marker::PhantomData,
        }
    }
}

// SAFETY: `new`'s contract is the trait's.
unsafe impl<T: Element> Buffer<T> for DeviceMemory<T> {
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

// SAFETY: as above; the memory may be written (`new`'s contract).
unsafe impl<T: Element> BufferMut<T> for DeviceMemory<T> {
    fn address_mut(&mut self) -> u64 {
        self.address
    }
}

macro_rules! host_buffer {
    ($($ty:ty),*) => {$(
        // SAFETY: a slice's pointer and length describe memory it borrows for its lifetime.
        unsafe impl<T: Element> Buffer<T> for $ty {
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
host_buffer!(
    Vec<T>,
    Box<[T]>,
    &[T],
    &mut [T],
    &Vec<T>,
    &mut Vec<T>,
    &Box<[T]>,
    &mut Box<[T]>
);

macro_rules! host_buffer_mut {
    ($($ty:ty),*) => {$(
        // SAFETY: as above, borrowed mutably.
        unsafe impl<T: Element> BufferMut<T> for $ty {
            fn address_mut(&mut self) -> u64 {
                self.as_mut_ptr() as u64
            }
        }
    )*};
}
host_buffer_mut!(Vec<T>, Box<[T]>, &mut [T], &mut Vec<T>, &mut Box<[T]>);
