//! Finding and opening NCCL ([`Library`], module doc of `exec::nccl`): `RINGREDUCE_NCCL_PATH`,
//! a `libnccl.so.2` the process loaded, or the first on the library path that is not this
//! library; its functions looked up by name (called through [`super::Api`]).

use crate::device;
use crate::error::{Error, Result};
use std::ffi::{c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// NCCL, opened (module doc).
pub struct Library {
    handle: *mut c_void,
    /// Where it was found.
    pub path: PathBuf,
}

// SAFETY: a `dlopen` handle is valid on every thread, and `dlsym` is thread-safe.
unsafe impl Send for Library {}
// SAFETY: as above.
unsafe impl Sync for Library {}

impl Library {
    /// NCCL, opened on first use; `None` when there is none (module doc).
    pub fn get() -> Option<&'static Library> {
        static NCCL: OnceLock<Option<Library>> = OnceLock::new();
        NCCL.get_or_init(|| find().and_then(|path| open(&path)))
            .as_ref()
    }

    /// [`Library::get`], or the error that says where NCCL was looked for.
    pub fn require(why: &str) -> Result<&'static Library> {
        Library::get().ok_or_else(|| Error::Resource {
            what: format!(
                "{why} needs NCCL, and no libnccl.so.2 was found: set RINGREDUCE_NCCL_PATH to \
                 the file, or put its folder on LD_LIBRARY_PATH"
            ),
        })
    }

    /// NCCL's function `name`, as the function-pointer type `F`.
    ///
    /// # Safety
    /// `F` is the C signature NCCL documents for `name`.
    pub unsafe fn function<F: Copy>(&self, name: &CStr) -> Option<F> {
        debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
        // SAFETY: a live handle and a NUL-terminated name.
        let symbol = unsafe { libc::dlsym(self.handle, name.as_ptr()) };
        // SAFETY: a non-null symbol of that name has the type our caller names.
        (!symbol.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&symbol) })
    }
}

/// Where NCCL is (module doc).
fn find() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("RINGREDUCE_NCCL_PATH") {
        return Some(PathBuf::from(path));
    }
    let own = ourselves();
    let not_ours = |path: &PathBuf| path.canonicalize().ok() != own;
    loaded_libnccl()
        .into_iter()
        .find(not_ours)
        .or_else(|| device::library_files("libnccl.so.2").find(not_ours))
}

/// The files named `libnccl.so.2` that the process has loaded, in load order.
fn loaded_libnccl() -> Vec<PathBuf> {
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        found: *mut c_void,
    ) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes a valid info and our `found` pointer.
        let (info, found) = unsafe { (&*info, &mut *found.cast::<Vec<PathBuf>>()) };
        if !info.dlpi_name.is_null() {
            // SAFETY: a NUL-terminated file name (empty for the main program).
            let name = unsafe { CStr::from_ptr(info.dlpi_name) }.to_string_lossy();
            let path = PathBuf::from(&*name);
            if path.file_name().is_some_and(|f| f == "libnccl.so.2") {
                found.push(path);
            }
        }
        0
    }
    let mut found: Vec<PathBuf> = Vec::new();
    // SAFETY: `visit` matches the callback type and only reads what the loader passes.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut found as *mut Vec<PathBuf>).cast()) };
    found
}

/// The file this code is linked into (the program, or the library that holds it).
fn ourselves() -> Option<PathBuf> {
    // SAFETY: an all-zero Dl_info is a valid value to be overwritten.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let here = ourselves as *const c_void;
    // SAFETY: `here` is an address of this code; `info` is writable.
    if unsafe { libc::dladdr(here, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr set a NUL-terminated file name.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Path::new(&*name.to_string_lossy()).canonicalize().ok()
}

/// Opens the library at `path` (its symbols kept to itself).
fn open(path: &Path) -> Option<Library> {
    let cpath = CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: a NUL-terminated path and valid flags.
    let handle = unsafe {
        libc::dlopen(
            cpath.as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_DEEPBIND,
        )
    };
    (!handle.is_null()).then(|| Library {
        handle,
        path: path.to_path_buf(),
    })
}
