//! cudarc's device memory as collective buffers: [`CudaSlice`], [`CudaView`] and [`CudaViewMut`]
//! go straight into a [`crate::Communicator`] call, each checked against its rank's GPU like a
//! [`super::GpuBuffer`].
//!
//! cudarc tracks every use of a slice with a read and a write event (unless its context's event
//! tracking is off). A collective respects that: before its work on a rank is enqueued, the
//! stream it starts on (the communicator's Main stream, or the caller's) waits for the slice's
//! earlier writes (and, when it writes, earlier reads); after, the use is recorded on that stream —
//! so the caller's other cudarc work on the slice is ordered with the collective, with no host
//! synchronisation. (cudarc records those events only on streams of a context handle in its
//! multi-stream mode; the executor keeps one idle cudarc stream per rank to put its handle there.) The rest of the collective's streams are ordered after and before that
//! stream by the plan (the checker's start and completion rules).
//!
//! cudarc allocates from the device's stream-ordered pool; the communicator opens that pool to
//! the peers that write into it, as for any pool memory (the pool trap, [`crate::device`]).

use crate::buffer::{Buffer, BufferMut, Placement, StreamUse};
use crate::element::Element;
use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice,
};

/// The device address of `slice`, read without ordering anything: the wait cudarc enqueues on the
/// slice's own stream is already satisfied there, and the read it would record is dropped.
fn address_of<T, S: DevicePtr<T>>(slice: &S) -> u64 {
    let (ptr, record) = slice.device_ptr(slice.stream());
    std::mem::forget(record);
    ptr
}

macro_rules! cudarc_buffer {
    ($($ty:ty),*) => {$(
        // SAFETY: a cudarc slice or view owns or borrows `len()` elements of `T` on its stream's
        // device for as long as it lives, and a collective holds a borrow of it for the call.
        unsafe impl<T: Element> Buffer<T> for $ty {
            fn placement(&self) -> Placement {
                Placement::Device(self.stream().context().ordinal())
            }
            fn count(&self) -> usize {
                self.len()
            }
            fn address(&self) -> u64 {
                address_of(self)
            }
            fn on_stream(&self, stream: &CudaStream, when: StreamUse) {
                // Before: cudarc makes `stream` wait for earlier writes; the record is dropped.
                // After: the same wait (already satisfied), and the read recorded on `stream`.
                let (_, record) = self.device_ptr(stream);
                if when == StreamUse::Before {
                    std::mem::forget(record);
                }
            }
        }
    )*};
}
cudarc_buffer!(CudaSlice<T>, CudaView<'_, T>, CudaViewMut<'_, T>);

macro_rules! cudarc_buffer_mut {
    ($($ty:ty),*) => {$(
        // SAFETY: as above, borrowed mutably.
        unsafe impl<T: Element> BufferMut<T> for $ty {
            fn address_mut(&mut self) -> u64 {
                address_of(&*self)
            }
            fn on_stream_mut(&mut self, stream: &CudaStream, when: StreamUse) {
                // Before: `stream` waits for earlier reads and writes. After: the write recorded.
                let (_, record) = self.device_ptr_mut(stream);
                if when == StreamUse::Before {
                    std::mem::forget(record);
                }
            }
        }
    )*};
}
cudarc_buffer_mut!(CudaSlice<T>, CudaViewMut<'_, T>);
