//! Host memory of Python objects, through the buffer protocol (PEP 3118): what a host rank's
//! calls read and write — NumPy arrays, `array.array`, `bytearray`, `memoryview`, anything that
//! exports its memory.
//!
//! Three layers, as for any FFI (STYLE.md 1): [`ffi`] declares the two C calls and the
//! `Py_buffer` struct; [`Exported`] wraps them — one export held until dropped, its failure a
//! `Result`; [`HostBuffer`] is the checked view a call uses: one element type, C-contiguous,
//! aligned, writable where the call writes it. PyO3 has these calls too, but only where the
//! stable ABI includes them (CPython ≥ 3.11), and this module is built for every CPython
//! ≥ 3.9: the functions and the struct are the same in every CPython 3 (3.11 made them part of
//! the stable ABI unchanged), so one declaration serves every version. CPython only (PyPy's
//! `Py_buffer` is larger; PyPy does not load abi3 modules anyway).
//!
//! Invariant: while an [`Exported`] lives, its exporter keeps the memory where it is and at its
//! size (a `bytearray` refuses to resize, a NumPy array to be resized), so the address a
//! [`HostBuffer`] reports stays valid for as long as the call that holds it.

use crate::dtype;
use crate::errors::{argument, Failure};
use pyo3::prelude::*;
use ringreduce::DType;
use std::ffi::CStr;

/// The C declarations of the buffer protocol (CPython's `Include/pybuffer.h`).
#[allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]
mod ffi {
    use pyo3::ffi::{PyObject, Py_ssize_t};
    use std::ffi::{c_char, c_int, c_void};

    /// `Py_buffer`: one export of an object's memory (fields as CPython 3.0–3.14 declare them).
    #[repr(C)]
    pub struct Py_buffer {
        pub buf: *mut c_void,
        pub obj: *mut PyObject,
        pub len: Py_ssize_t,
        pub itemsize: Py_ssize_t,
        pub readonly: c_int,
        pub ndim: c_int,
        pub format: *mut c_char,
        pub shape: *mut Py_ssize_t,
        pub strides: *mut Py_ssize_t,
        pub suboffsets: *mut Py_ssize_t,
        pub internal: *mut c_void,
    }

    /// The element format is asked for (`format` is then set, or NULL for unsigned bytes).
    pub const PyBUF_FORMAT: c_int = 0x0004;
    /// Shape and strides are asked for: any strided exporter answers, contiguous or not, so
    /// that the contiguity check — and its message — is ours.
    pub const PyBUF_STRIDES: c_int = 0x0010 | 0x0008;

    extern "C" {
        pub fn PyObject_GetBuffer(obj: *mut PyObject, view: *mut Py_buffer, flags: c_int) -> c_int;
        pub fn PyBuffer_Release(view: *mut Py_buffer);
    }
}

/// One export of a Python object's memory (`PyObject_GetBuffer`), released when dropped.
pub struct Exported {
    /// Boxed: exporters may point fields of the struct into the struct itself, so it must not
    /// move while exported.
    view: Box<ffi::Py_buffer>,
}

impl Exported {
    /// Exports `obj`'s memory with its format, shape and strides, or the exporter's refusal
    /// (an object without the protocol, a buffer it cannot describe by strides).
    pub fn of(obj: &Bound<'_, PyAny>) -> PyResult<Exported> {
        let mut view = Box::new(ffi::Py_buffer {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        });
        // SAFETY: `obj` is a live object (borrowed, so the GIL is held); `view` is a struct of
        // the size CPython fills, at an address that stays put (boxed) until `drop` releases it.
        let status = unsafe {
            ffi::PyObject_GetBuffer(
                obj.as_ptr(),
                &mut *view,
                ffi::PyBUF_STRIDES | ffi::PyBUF_FORMAT,
            )
        };
        match status {
            0 => Ok(Exported { view }),
            _ => Err(PyErr::fetch(obj.py())),
        }
    }

    /// The `struct` module's format of one element (`"B"` where the exporter gave none).
    fn format(&self) -> String {
        match self.view.format.is_null() {
            true => "B".into(),
            // SAFETY: a non-NULL `format` of a live export is a NUL-terminated string owned by
            // the export (the protocol's contract).
            false => unsafe { CStr::from_ptr(self.view.format) }
                .to_string_lossy()
                .into_owned(),
        }
    }

    /// The sizes of each dimension and the byte strides between their elements.
    fn shape_and_strides(&self) -> (Vec<isize>, Option<Vec<isize>>) {
        let ndim = usize::try_from(self.view.ndim).unwrap_or(0);
        // SAFETY: with PyBUF_STRIDES asked, `shape` and `strides` of a live export are arrays
        // of `ndim` entries (or NULL: a 0-d buffer's shape, or C order's strides).
        let read = |p: *const isize| unsafe { std::slice::from_raw_parts(p, ndim) }.to_vec();
        let shape = match self.view.shape.is_null() || ndim == 0 {
            true => Vec::new(),
            false => read(self.view.shape),
        };
        let strides = match self.view.strides.is_null() || ndim == 0 {
            true => None,
            false => Some(read(self.view.strides)),
        };
        (shape, strides)
    }

    /// True when the elements lie in C order with no gaps (dimensions of one element may have
    /// any stride; an empty buffer is contiguous).
    fn is_c_contiguous(&self) -> bool {
        if !self.view.suboffsets.is_null() {
            return false;
        }
        let (shape, strides) = self.shape_and_strides();
        let Some(strides) = strides else {
            return true;
        };
        if shape.contains(&0) {
            return true;
        }
        let mut expected = self.view.itemsize;
        for (&len, &stride) in shape.iter().zip(&strides).rev() {
            if len > 1 && stride != expected {
                return false;
            }
            expected *= len;
        }
        true
    }
}

impl Drop for Exported {
    fn drop(&mut self) {
        // Releasing needs the interpreter; every `Exported` is dropped attached (it is not
        // `Send`, so it never enters a `detach` closure), which makes this `attach` free.
        Python::attach(|_| {
            // SAFETY: `view` was filled by a successful `PyObject_GetBuffer` and is released
            // once, here.
            unsafe { ffi::PyBuffer_Release(&mut *self.view) }
        });
    }
}

/// A host buffer checked for a call: one element type, C-contiguous, aligned for it. Holds the
/// export, so its memory stays put while it lives (module doc).
pub struct HostBuffer {
    _exported: Exported,
    /// The element type.
    pub dtype: DType,
    /// The first element's address.
    pub address: usize,
    /// Elements (the whole buffer, every dimension).
    pub count: usize,
    /// False for a read-only export (`bytes`, a NumPy array with `writeable=False`).
    pub writable: bool,
}

impl HostBuffer {
    /// `obj`'s memory as the call's `role` (`"x"`, `"out"`, `"sends[2]"`: named in messages),
    /// of `dtype` where the caller named one (then the buffer's elements must have its size;
    /// the format is not consulted), else of the type its format says.
    pub fn of(
        obj: &Bound<'_, PyAny>,
        role: &str,
        dtype: Option<DType>,
    ) -> Result<HostBuffer, Failure> {
        let exported = Exported::of(obj).map_err(|err| {
            argument(format!(
                "{role}: a {} does not export its memory as a buffer ({err}); host ranks take \
                 NumPy arrays, array.array, bytearray, memoryview or anything with the buffer \
                 protocol",
                obj.get_type()
                    .name()
                    .map_or_else(|_| "?".into(), |n| n.to_string())
            ))
        })?;
        let itemsize = usize::try_from(exported.view.itemsize).unwrap_or(0);
        let dtype = match dtype {
            Some(dtype) if dtype.size_bytes() == itemsize => dtype,
            Some(dtype) => {
                return Err(argument(format!(
                    "{role}: dtype {dtype} has {}-byte elements, the buffer {itemsize}-byte ones \
                     (format {:?})",
                    dtype.size_bytes(),
                    exported.format()
                )))
            }
            None => dtype::from_format(&exported.format(), itemsize)
                .map_err(|why| argument(format!("{role}: {why}")))?,
        };
        if !exported.is_c_contiguous() {
            return Err(argument(format!(
                "{role} is not C-contiguous: pass a contiguous buffer (a copy: numpy.ascontiguousarray)"
            )));
        }
        let count = usize::try_from(exported.view.len).unwrap_or(0) / itemsize.max(1);
        let address = exported.view.buf as usize;
        if count > 0 && address % dtype.size_bytes() != 0 {
            return Err(argument(format!(
                "{role} is not aligned for {dtype} (address {address:#x})"
            )));
        }
        Ok(HostBuffer {
            writable: exported.view.readonly == 0,
            dtype,
            address,
            count,
            _exported: exported,
        })
    }

    /// The buffer as a span of `count` elements at `address`.
    pub fn span(&self) -> crate::layout::Span {
        crate::layout::Span {
            address: self.address as u64,
            count: self.count,
        }
    }
}
